//! Body wrappers that count bytes as they stream.

use std::pin::Pin;
use std::task::{Context, Poll, ready};

use bytes::{Buf, Bytes};
use http_body::{Body, Frame, SizeHint};
use pin_project_lite::pin_project;

use crate::store::{ResourceId, UserHandle};

/// Where counted bytes go.
#[derive(Debug, Clone)]
pub(crate) struct Meter {
    pub(crate) handle: UserHandle,
    pub(crate) resource: ResourceId,
}

/// Counts a polled frame's data bytes, if there is a meter.
fn observe<D: Buf, E>(meter: Option<&Meter>, frame: &Option<Result<Frame<D>, E>>) {
    if let (Some(Ok(f)), Some(m)) = (frame, meter) {
        m.count(f);
    }
}

impl Meter {
    fn count<D: Buf>(&self, frame: &Frame<D>) {
        if let Some(data) = frame.data_ref() {
            let n = data.remaining();
            if n > 0 {
                self.handle
                    .consume(self.resource, u64::try_from(n).unwrap_or(u64::MAX));
            }
        }
    }
}

pin_project! {
    /// The request body handed to the inner service; counts `traffic_up`
    /// as the inner service reads it, when the layer counts it.
    #[derive(Debug)]
    pub struct RequestBody<B> {
        #[pin]
        inner: B,
        meter: Option<Meter>,
    }
}

impl<B> RequestBody<B> {
    pub(crate) fn new(inner: B, meter: Option<Meter>) -> Self {
        Self { inner, meter }
    }

    /// The wrapped body.
    pub fn into_inner(self) -> B {
        self.inner
    }
}

impl<B: Body> Body for RequestBody<B> {
    type Data = B::Data;
    type Error = B::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Self::Data>, Self::Error>>> {
        let this = self.project();
        let frame = ready!(this.inner.poll_frame(cx));
        observe(this.meter.as_ref(), &frame);
        Poll::Ready(frame)
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

pin_project! {
    /// The response body of [`Throttle`](super::Throttle): the inner body,
    /// counting `traffic_down` frame by frame as it is sent (so a client
    /// that goes away early is charged for what it was sent), or the short
    /// fixed body of a refusal.
    #[derive(Debug)]
    pub struct ResponseBody<B> {
        #[pin]
        kind: Kind<B>,
    }
}

pin_project! {
    #[project = KindProj]
    #[derive(Debug)]
    enum Kind<B> {
        Inner { #[pin] body: B, meter: Option<Meter> },
        Fixed { data: Option<Bytes> },
    }
}

impl<B> ResponseBody<B> {
    pub(crate) fn inner(body: B, meter: Option<Meter>) -> Self {
        Self {
            kind: Kind::Inner { body, meter },
        }
    }

    pub(crate) fn fixed(data: Bytes) -> Self {
        Self {
            kind: Kind::Fixed {
                data: (!data.is_empty()).then_some(data),
            },
        }
    }
}

impl<B> Body for ResponseBody<B>
where
    B: Body,
    B::Data: From<Bytes>,
{
    type Data = B::Data;
    type Error = B::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Self::Data>, Self::Error>>> {
        match self.project().kind.project() {
            KindProj::Inner { body, meter } => {
                let frame = ready!(body.poll_frame(cx));
                observe(meter.as_ref(), &frame);
                Poll::Ready(frame)
            }
            KindProj::Fixed { data } => Poll::Ready(data.take().map(|d| Ok(Frame::data(d.into())))),
        }
    }

    fn is_end_stream(&self) -> bool {
        match &self.kind {
            Kind::Inner { body, .. } => body.is_end_stream(),
            Kind::Fixed { data } => data.is_none(),
        }
    }

    fn size_hint(&self) -> SizeHint {
        match &self.kind {
            Kind::Inner { body, .. } => body.size_hint(),
            Kind::Fixed { data } => {
                SizeHint::with_exact(data.as_ref().map_or(0, |d| d.len() as u64))
            }
        }
    }
}

/// A response body type a [`Plain`](super::Plain) layer can answer a refusal
/// in: the short text or JSON of an HTTP refusal, or empty for gRPC's
/// trailers-only refusal. Implemented for axum's and tonic's bodies,
/// `Full<Bytes>` and `String`; implement it for another body type to use
/// that type behind a plain layer.
pub trait RefusalBody: Sized {
    /// A body holding `body` (UTF-8, possibly empty).
    fn refusal(body: Bytes) -> Self;
}

impl RefusalBody for String {
    fn refusal(body: Bytes) -> Self {
        String::from_utf8_lossy(&body).into_owned()
    }
}

impl RefusalBody for http_body_util::Full<Bytes> {
    fn refusal(body: Bytes) -> Self {
        Self::new(body)
    }
}

#[cfg(feature = "axum")]
impl RefusalBody for axum::body::Body {
    fn refusal(body: Bytes) -> Self {
        Self::from(body)
    }
}

#[cfg(feature = "tonic")]
impl RefusalBody for tonic::body::Body {
    fn refusal(body: Bytes) -> Self {
        if body.is_empty() {
            Self::default()
        } else {
            Self::new(http_body_util::Full::new(body))
        }
    }
}
