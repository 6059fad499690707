//! The response future of [`Throttle`](super::Throttle).

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll, ready};

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
        Passed { #[pin] future: F, meter: Option<Meter> },
        Rejected { response: Option<(http::response::Parts, &'static [u8])> },
    }
}

impl<F> ResponseFuture<F> {
    pub(crate) fn passed(future: F, meter: Option<Meter>) -> Self {
        Self {
            kind: Kind::Passed { future, meter },
        }
    }

    pub(crate) fn rejected(parts: http::response::Parts, body: &'static [u8]) -> Self {
        Self {
            kind: Kind::Rejected {
                response: Some((parts, body)),
            },
        }
    }
}

impl<F, B, E> Future for ResponseFuture<F>
where
    F: Future<Output = Result<http::Response<B>, E>>,
{
    type Output = Result<http::Response<ResponseBody<B>>, E>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        match self.project().kind.project() {
            KindProj::Passed { future, meter } => {
                let response = ready!(future.poll(cx))?;
                let meter = meter.take();
                Poll::Ready(Ok(response.map(|b| ResponseBody::inner(b, meter))))
            }
            KindProj::Rejected { response } => {
                // Polled again after completion: a contract violation by the
                // caller. Answer with an empty 500 rather than panic.
                let (parts, body) = response.take().unwrap_or_else(|| {
                    let mut p = http::Response::new(()).into_parts().0;
                    p.status = http::StatusCode::INTERNAL_SERVER_ERROR;
                    (p, b"")
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
        Passed { #[pin] future: F },
        Rejected { response: Option<http::Response<B>> },
    }
}

impl<F, B> PlainFuture<F, B> {
    pub(crate) fn passed(future: F) -> Self {
        Self {
            kind: PlainKind::Passed { future },
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

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        match self.project().kind.project() {
            PlainProj::Passed { future } => future.poll(cx),
            PlainProj::Rejected { response } => {
                // Polled again after completion: as above, an empty 500.
                Poll::Ready(Ok(response.take().unwrap_or_else(|| {
                    let mut r = http::Response::new(B::refusal(b""));
                    *r.status_mut() = http::StatusCode::INTERNAL_SERVER_ERROR;
                    r
                })))
            }
        }
    }
}
