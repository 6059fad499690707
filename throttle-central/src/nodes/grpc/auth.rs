//! A stream's credentials checked before anything it sends is read (see
//! [`throttle_proto::auth`]).

use std::net::SocketAddr;

use metrics::counter;
use throttle_proto::MAX_NAME_LEN;
use throttle_proto::auth::{
    ACCESS_KEY, AuthError, MAX_ACCESS_KEY_LEN, NODE_ID, SIGNATURE, Signed, TIMESTAMP,
};
use tonic::Status;
use tonic::metadata::MetadataMap;

use crate::keys::NodeKeys;
use crate::log::{Throttled, peer};

static REFUSED: Throttled = Throttled::new();

/// The signed node id of a stream whose metadata proves one of `keys`.
///
/// # Errors
///
/// `UNAUTHENTICATED`, counted in `throttle_central_unauthenticated_total`
/// by reason and logged at most once a second.
pub(crate) fn authenticate(
    keys: &NodeKeys,
    metadata: &MetadataMap,
    now_ms: i64,
    addr: Option<SocketAddr>,
) -> Result<String, Status> {
    let result = signed_of(metadata).and_then(|signed| {
        keys.authenticate(&signed, now_ms)?;
        Ok(signed.node_id)
    });
    result.map_err(|e| refused(e, addr, now_ms))
}

/// The stream's Hello names another node id than the one it signed.
pub(crate) fn other_node_id(addr: Option<SocketAddr>, now_ms: i64) -> Status {
    refused(AuthError::NodeNotAllowed, addr, now_ms)
}

fn refused(e: AuthError, addr: Option<SocketAddr>, now_ms: i64) -> Status {
    counter!("throttle_central_unauthenticated_total", "reason" => e.as_str()).increment(1);
    if let Some(skipped) = REFUSED.allow(now_ms) {
        tracing::warn!(reason = e.as_str(), addr = %peer(addr), skipped, "node stream refused: {e}");
    }
    Status::unauthenticated(e.to_string())
}

/// The four credential entries of `metadata`, each present and of a
/// sensible size.
fn signed_of(metadata: &MetadataMap) -> Result<Signed, AuthError> {
    let text = |key: &str, max: usize| {
        let value = metadata.get(key)?.to_str().ok()?;
        (!value.is_empty() && value.len() <= max).then(|| value.to_owned())
    };
    let signed = (|| {
        Some(Signed {
            access_key: text(ACCESS_KEY, MAX_ACCESS_KEY_LEN)?,
            node_id: text(NODE_ID, MAX_NAME_LEN)?,
            timestamp_ms: text(TIMESTAMP, 20)?.parse().ok()?,
            signature: text(SIGNATURE, 128)?,
        })
    })();
    signed.ok_or(AuthError::Malformed)
}
