//! The keys bound by a longer period than their shortest ([`v1::Bound`]):
//! a user who spent a per-minute or daily quota is refused by that
//! bucket, and the nodes' refusals name it. Read from the keys of several
//! periods after each assign binds them; unchanged, it is the very same
//! `Arc`, so a stream compares pointers to know it has it.

use std::sync::Arc;

use throttle_proto::v1;

use super::ledger::Ledger;
use crate::limits::Period;

/// Most keys one [`v1::Bound`] lists.
pub const MAX_BOUND_KEYS: usize = 100_000;

impl Ledger {
    /// The keys of `service` bound now by a longer period than their
    /// shortest; `None` for a service the ledger does not know.
    pub fn bound(&mut self, service: &str) -> Option<Arc<v1::Bound>> {
        let svc = self.services.get_mut(service)?;
        let state = &svc.state;
        let mut keys: Vec<v1::BoundKey> = (state.several.iter())
            .map(|&id| state.key(id))
            .filter(|key| {
                let shortest = key.buckets().map(|(p, _)| p).min();
                shortest.is_some_and(|p| p != key.period())
            })
            .map(|key| v1::BoundKey {
                user: key.user().to_owned(),
                resource: key.resource().to_owned(),
                window_seconds: window_seconds(key.period()),
            })
            .take(MAX_BOUND_KEYS)
            .collect();
        keys.sort_unstable_by(|a, b| (&a.user, &a.resource).cmp(&(&b.user, &b.resource)));
        match &svc.bound {
            Some(old) if old.keys == keys => {}
            _ => {
                let service = service.to_owned();
                svc.bound = Some(Arc::new(v1::Bound { service, keys }));
            }
        }
        svc.bound.clone()
    }
}

/// A period's length in whole seconds, as the protocol writes it.
pub(super) fn window_seconds(period: Period) -> u32 {
    period.seconds() as u32
}
