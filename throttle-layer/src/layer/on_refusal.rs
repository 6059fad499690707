//! A hook that builds the refusal response yourself
//! ([`ThrottleLayerBuilder::on_refusal`](super::ThrottleLayerBuilder::on_refusal)),
//! as tower_governor's `error_handler`: it gets what refused and the
//! response the layer made, and returns the response to send.

use std::fmt;
use std::sync::Arc;

use bytes::Bytes;
use http::Response;

use super::future::Refusal;

/// What refused a request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum RefusedBy {
    /// The user's quota of a resource from the central.
    Quota,
    /// The central blocked the user.
    Blocked,
    /// A [`LocalLimit`](crate::local::LocalLimit) of this node.
    LocalLimit,
    /// A limit shared through a bucket store.
    SharedLimit,
    /// The user key is longer than a name may be.
    UserKeyTooLong,
}

/// A refusal, as [`ThrottleLayerBuilder::on_refusal`](super::ThrottleLayerBuilder::on_refusal)'s
/// hook sees it.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct Refused<'a> {
    /// What refused.
    pub by: RefusedBy,
    /// The layer's service.
    pub service: &'a str,
    /// The user, when the request had one.
    pub user: Option<&'a str>,
    /// For [`RefusedBy::Quota`]: the exhausted resource, when the quota
    /// named one (a user with a quota of none of them is refused too).
    pub resource: Option<&'a str>,
    /// For [`RefusedBy::Quota`]: the user's configured limit of the
    /// resource, else this node's share of it for the slot.
    pub limit: Option<u64>,
    /// The window of `limit`, in seconds, when it is the configured one.
    pub window_seconds: Option<u32>,
    /// For a local or shared limit: the limit, in nginx's form.
    pub rule: Option<&'a str>,
    /// Seconds until a retry may pass.
    pub retry_after_seconds: u64,
    /// Whether the request was a gRPC call (the response is then a
    /// trailers-only gRPC status).
    pub grpc: bool,
    /// Whether the request accepts JSON (the body is then JSON).
    pub accepts_json: bool,
}

/// The hook's function.
type Hook = dyn Fn(&Refused<'_>, Response<Bytes>) -> Response<Bytes> + Send + Sync;

/// The hook, shared by a layer's services.
#[derive(Clone)]
pub(crate) struct OnRefusal(Arc<Hook>);

impl fmt::Debug for OnRefusal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("OnRefusal(..)")
    }
}

impl OnRefusal {
    pub(crate) fn new<F>(f: F) -> Self
    where
        F: Fn(&Refused<'_>, Response<Bytes>) -> Response<Bytes> + Send + Sync + 'static,
    {
        Self(Arc::new(f))
    }

    /// The response the hook makes of `refusal`.
    #[cold]
    #[inline(never)]
    pub(crate) fn apply(&self, refusal: Refusal, why: &Refused<'_>) -> Refusal {
        let (head, body) = refusal;
        (self.0)(why, Response::from_parts(head, body)).into_parts()
    }
}
