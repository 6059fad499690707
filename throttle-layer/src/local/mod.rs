//! Limits decided on each node alone, as nginx's `limit_req` decides
//! them: [`LocalLimit`], added to a layer with
//! [`ThrottleLayerBuilder::local_limit`](crate::ThrottleLayerBuilder::local_limit).
//!
//! Each limit keeps a zone of keys (the layer's user key, or its own such
//! as the peer's IP), each key a leaky bucket of "excess" requests as in
//! nginx: a request adds one, the rate drains them; past `burst` a request
//! is refused, past `delay` it is held until it fits the rate. Several
//! limits on one layer must all pass, and the longest hold wins. They
//! compose with the central quota: a request passes only if both pass,
//! and a local refusal carries `throttle-refused-by: local; limit="..."`
//! where the quota's names its resource in `RateLimit-Policy`.
//!
//! - `excess`: the arithmetic, sans IO ([`Verdict`]);
//! - `keys`: one shard of a zone's keys, bounded, CLOCK-evicted;
//! - `zone`: the keys' states, sharded, and the clock they are read by;
//! - `limit`: [`LocalLimit`] and its nginx syntax;
//! - `limiter`: [`Limiter`], one limit's decisions without the layer.

mod excess;
mod keys;
mod limit;
mod limiter;
mod zone;

pub use excess::{Excess, Pace, Verdict};
pub use limit::{DEFAULT_ZONE_SIZE, LocalLimit, LocalLimitError};
pub use limiter::Limiter;
pub(crate) use zone::Zone;
