//! [`Counted`]: an HTTP service whose requests are counted in the
//! connection's [`Activity`] from their head to the end of their
//! response's body.

use std::convert::Infallible;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use axum::Router;
use axum::body::Body;
use axum::response::Response;
use axum::routing::future::RouteFuture;
use http::Request;
use http_body::{Frame, SizeHint};
use pin_project_lite::pin_project;

use super::activity::Activity;

/// `router`, counting each request in `activity`.
#[derive(Clone)]
pub(super) struct Counted {
    pub(super) router: Router,
    pub(super) activity: Arc<Activity>,
}

/// One request under way: counted done when dropped, with its response's
/// body or with its future, whichever goes last.
pub(super) struct Served(Arc<Activity>);

impl Drop for Served {
    fn drop(&mut self) {
        self.0.done();
    }
}

impl<B> tower_service::Service<Request<B>> for Counted
where
    B: http_body::Body<Data = bytes::Bytes> + Send + 'static,
    B::Error: Into<axum::BoxError>,
{
    type Response = Response<CountedBody>;
    type Error = Infallible;
    type Future = CountedFuture;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        tower_service::Service::<Request<B>>::poll_ready(&mut self.router, cx)
    }

    fn call(&mut self, request: Request<B>) -> Self::Future {
        self.activity
            .request(request.version() == http::Version::HTTP_2);
        CountedFuture {
            served: Some(Served(self.activity.clone())),
            inner: tower_service::Service::call(&mut self.router, request),
        }
    }
}

pin_project! {
    /// The router's answer, its body counted.
    pub(super) struct CountedFuture {
        #[pin]
        inner: RouteFuture<Infallible>,
        served: Option<Served>,
    }
}

impl Future for CountedFuture {
    type Output = Result<Response<CountedBody>, Infallible>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.project();
        let response = std::task::ready!(this.inner.poll(cx));
        let served = this.served.take();
        Poll::Ready(response.map(|r| {
            r.map(|inner| CountedBody {
                inner,
                _served: served,
            })
        }))
    }
}

/// A response body that keeps its request counted until it is dropped.
pub(super) struct CountedBody {
    inner: Body,
    _served: Option<Served>,
}

impl http_body::Body for CountedBody {
    type Data = bytes::Bytes;
    type Error = axum::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Self::Data>, Self::Error>>> {
        Pin::new(&mut self.inner).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}
