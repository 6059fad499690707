//! What the hierarchical policy keeps of one group (an application, or
//! the users in none) for one resource, and what the group asks of a slot.

use super::burst_allowance::BurstAllowance;
use super::overshoot::Overshoot;
use super::split::{Ask, Share};
use crate::limits::{App, NO_APP_PRIORITY};

/// One group's state for one resource.
#[derive(Debug, Clone)]
pub(super) struct Group {
    allowance: BurstAllowance,
    pub(super) overshoot: Overshoot,
    /// Burst seconds left as the slot asked for started (infinite for
    /// the users in no application).
    pub(super) left: f64,
}

impl Group {
    /// A group that has not burst yet.
    pub(super) fn new(app: Option<&App>) -> Self {
        Self {
            allowance: BurstAllowance::full(app.map_or(0.0, |a| a.burst_seconds)),
            overshoot: Overshoot::default(),
            left: f64::INFINITY,
        }
    }

    /// What the group asks of `slot` (of `per_slot` seconds), wanting
    /// `demand`: `app`'s guarantee and its ceiling while its allowance
    /// lasts; the users in no application (`None`) ask with no guarantee,
    /// after every application, up to the whole `capacity`.
    pub(super) fn ask(
        &mut self,
        app: Option<&App>,
        resource: &str,
        (slot, per_slot): (i64, f64),
        capacity: f64,
        demand: f64,
    ) -> Ask {
        let Some(app) = app else {
            return Ask {
                priority: NO_APP_PRIORITY,
                guaranteed: 0.0,
                ceiling: capacity * per_slot,
                demand,
            };
        };
        self.left = self.allowance.at(slot, app.burst_seconds);
        let ceiling = if self.left > 0.0 {
            app.ceiling(resource)
        } else {
            app.guaranteed(resource)
        };
        Ask {
            priority: app.priority,
            guaranteed: app.guaranteed(resource) * per_slot,
            ceiling: ceiling * per_slot,
            demand,
        }
    }

    /// Counts `share`, given for `ask`, against the allowance, and cuts
    /// from it what the group owes for taking more than its grants and
    /// the `reserved` part of the capacity set aside for its users
    /// without grants.
    pub(super) fn settle(
        &mut self,
        app: Option<&App>,
        ask: &Ask,
        share: &mut Share,
        (slot, per_slot): (i64, f64),
        reserved: f64,
    ) {
        if let Some(app) = app {
            let above = share.served > ask.guaranteed * (1.0 + 1e-9) + 1e-9;
            let below = ask.demand < ask.guaranteed;
            self.allowance
                .count(slot, per_slot, above, below, app.burst_seconds);
        }
        self.overshoot.granted(slot, share.granted + reserved);
        share.granted = (share.granted - self.overshoot.cut()).max(0.0);
        share.served = share.served.min(share.granted);
    }
}
