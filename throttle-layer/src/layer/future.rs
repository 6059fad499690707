//! The response future of [`Throttle`](super::Throttle).

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll, ready};

use bytes::Bytes;
use http::HeaderMap;
use pin_project_lite::pin_project;

use super::body::{Meter, RefusalBody, ResponseBody};

pin_project! {
    /// Either the inner service's future, whose response body will be
    /// counted, or a refusal that is ready at once.
    #[derive(Debug)]
    pub struct ResponseFuture<F> {
        #[pin]
        kind: Kind<F>,
    }
}

pin_project! {
    #[project = KindProj]
    #[derive(Debug)]
    enum Kind<F> {
        Passed { #[pin] future: F, meter: Option<Meter>, hold: Option<Hold>, headers: Headers },
        Rejected { response: Option<Refusal> },
    }
}

/// What a request waits for before the inner service's future is first
/// polled (where an axum handler or a tonic method starts its work): a
/// local limit's hold, or a shared limit's answer, which may refuse it.
/// Boxed: a held request is rare, and a timer in place would grow every
/// request's future by its size.
pub(crate) struct Hold {
    gate: Pin<Box<dyn Future<Output = Option<Refusal>> + Send>>,
}

/// A refusal's head and short body.
pub(crate) type Refusal = (http::response::Parts, Bytes);

/// The rate-limit headers of an allowed response, when the layer adds
/// them ([`headers_on_success`](super::ThrottleLayerBuilder::headers_on_success)).
/// Boxed: a pointer in every request's future, the map only where asked.
pub(crate) type Headers = Option<Box<HeaderMap>>;

/// Adds `headers`, if any, to `response`.
#[inline]
fn add<B>(response: &mut http::Response<B>, headers: &mut Headers) {
    if let Some(h) = headers.take() {
        response.headers_mut().extend(*h);
    }
}

impl fmt::Debug for Hold {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Hold").finish_non_exhaustive()
    }
}

impl Hold {
    /// Out of line: the timer's code stays off the path of the requests
    /// that are not held.
    #[cold]
    #[inline(never)]
    pub(crate) fn ms(ms: u64) -> Self {
        Self::gate(async move {
            tokio::time::sleep(std::time::Duration::from_millis(ms)).await;
            None
        })
    }

    /// Waits for `gate`: `Some` refuses the request.
    pub(crate) fn gate(gate: impl Future<Output = Option<Refusal>> + Send + 'static) -> Self {
        Self {
            gate: Box::pin(gate),
        }
    }

    #[cold]
    #[inline(never)]
    fn poll(&mut self, cx: &mut Context<'_>) -> Poll<Option<Refusal>> {
        self.gate.as_mut().poll(cx)
    }
}

impl<F> ResponseFuture<F> {
    pub(crate) fn passed(
        future: F,
        meter: Option<Meter>,
        hold: Option<Hold>,
        headers: Headers,
    ) -> Self {
        Self {
            kind: Kind::Passed {
                future,
                meter,
                hold,
                headers,
            },
        }
    }

    pub(crate) fn rejected(refusal: Refusal) -> Self {
        Self {
            kind: Kind::Rejected {
                response: Some(refusal),
            },
        }
    }
}

impl<F, B, E> Future for ResponseFuture<F>
where
    F: Future<Output = Result<http::Response<B>, E>>,
{
    type Output = Result<http::Response<ResponseBody<B>>, E>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        match self.as_mut().project().kind.project() {
            KindProj::Passed {
                future,
                meter,
                hold,
                headers,
            } => {
                if let Some(h) = hold {
                    let refused = ready!(h.poll(cx));
                    *hold = None;
                    if let Some(refusal) = refused {
                        let done = Kind::Rejected { response: None };
                        self.project().kind.set(done);
                        let (parts, body) = refusal;
                        let body = ResponseBody::fixed(body);
                        return Poll::Ready(Ok(http::Response::from_parts(parts, body)));
                    }
                }
                let mut response = ready!(future.poll(cx))?;
                add(&mut response, headers);
                let meter = meter.take();
                Poll::Ready(Ok(response.map(|b| ResponseBody::inner(b, meter))))
            }
            KindProj::Rejected { response } => {
                // Polled again after completion: a contract violation by the
                // caller. Answer with an empty 500 rather than panic.
                let (parts, body) = response.take().unwrap_or_else(|| {
                    let mut p = http::Response::new(()).into_parts().0;
                    p.status = http::StatusCode::INTERNAL_SERVER_ERROR;
                    (p, Bytes::new())
                });
                Poll::Ready(Ok(http::Response::from_parts(
                    parts,
                    ResponseBody::fixed(body),
                )))
            }
        }
    }
}

pin_project! {
    /// The future of a [`Plain`](super::Plain) layer: the inner service's
    /// future, untouched, or a refusal that is ready at once.
    #[derive(Debug)]
    pub struct PlainFuture<F, B> {
        #[pin]
        kind: PlainKind<F, B>,
    }
}

pin_project! {
    #[project = PlainProj]
    #[derive(Debug)]
    enum PlainKind<F, B> {
        Passed { #[pin] future: F, hold: Option<Hold>, headers: Headers },
        Rejected { response: Option<http::Response<B>> },
    }
}

impl<F, B> PlainFuture<F, B> {
    pub(crate) fn passed(future: F, hold: Option<Hold>, headers: Headers) -> Self {
        Self {
            kind: PlainKind::Passed {
                future,
                hold,
                headers,
            },
        }
    }

    pub(crate) fn rejected(response: http::Response<B>) -> Self {
        Self {
            kind: PlainKind::Rejected {
                response: Some(response),
            },
        }
    }
}

impl<F, B, E> Future for PlainFuture<F, B>
where
    F: Future<Output = Result<http::Response<B>, E>>,
    B: RefusalBody,
{
    type Output = Result<http::Response<B>, E>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        match self.as_mut().project().kind.project() {
            PlainProj::Passed {
                future,
                hold,
                headers,
            } => {
                if let Some(h) = hold {
                    let refused = ready!(h.poll(cx));
                    *hold = None;
                    if let Some((parts, body)) = refused {
                        self.project()
                            .kind
                            .set(PlainKind::Rejected { response: None });
                        let refusal = http::Response::from_parts(parts, B::refusal(body));
                        return Poll::Ready(Ok(refusal));
                    }
                }
                if headers.is_none() {
                    // The response as it comes, not moved once more.
                    return future.poll(cx);
                }
                let mut response = ready!(future.poll(cx))?;
                add(&mut response, headers);
                Poll::Ready(Ok(response))
            }
            PlainProj::Rejected { response } => {
                // Polled again after completion: as above, an empty 500.
                Poll::Ready(Ok(response.take().unwrap_or_else(|| {
                    let mut r = http::Response::new(B::refusal(Bytes::new()));
                    *r.status_mut() = http::StatusCode::INTERNAL_SERVER_ERROR;
                    r
                })))
            }
        }
    }
}
