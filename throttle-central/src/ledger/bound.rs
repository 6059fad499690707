//! The keys bound by a longer period than their shortest ([`v1::Bound`]):
//! a user who spent a per-minute or daily quota is refused by that
//! bucket, and the nodes' refusals name it. Read from the keys of several
//! periods after each assign binds them; unchanged, it is the very same
//! `Arc`, so a stream compares pointers to know it has it.

use std::sync::Arc;

use throttle_proto::v1;

use super::ids::KeyId;
use super::state::ServiceState;
use crate::limits::Period;

/// Most keys one [`v1::Bound`] lists.
pub const MAX_BOUND_KEYS: usize = 100_000;

/// A service's bound keys as last read: each key's id, generation and
/// binding window, and the message built from them.
#[derive(Debug, Default)]
pub(crate) struct Bound {
    keys: Vec<(KeyId, u32, u32)>,
    message: Option<Arc<v1::Bound>>,
}

impl Bound {
    /// The keys of `service` (its keys: `state`) bound now by a longer
    /// period than their shortest. Asked every tick: the keys are compared
    /// by id first, and the message is built (names copied) only when
    /// they changed.
    pub(crate) fn read(&mut self, service: &str, state: &ServiceState) -> Option<Arc<v1::Bound>> {
        let keys: Vec<(KeyId, u32, u32)> = (state.several.iter())
            .map(|&id| (id, state.key(id)))
            .filter(|(_, key)| {
                let shortest = key.buckets().map(|(p, _)| p).min();
                shortest.is_some_and(|p| p != key.period())
            })
            .map(|(id, key)| (id, key.generation(), window_seconds(key.period())))
            .take(MAX_BOUND_KEYS)
            .collect();
        let bound = self;
        if bound.message.is_none() || bound.keys != keys {
            let mut listed: Vec<v1::BoundKey> = (keys.iter())
                .map(|&(id, _, window_seconds)| v1::BoundKey {
                    user: state.key(id).user().to_owned(),
                    resource: state.key(id).resource().to_owned(),
                    window_seconds,
                })
                .collect();
            listed.sort_unstable_by(|a, b| (&a.user, &a.resource).cmp(&(&b.user, &b.resource)));
            let service = service.to_owned();
            bound.message = Some(Arc::new(v1::Bound {
                service,
                keys: listed,
            }));
            bound.keys = keys;
        }
        bound.message.clone()
    }
}

/// A period's length in whole seconds, as the protocol writes it.
pub(super) fn window_seconds(period: Period) -> u32 {
    period.seconds() as u32
}
