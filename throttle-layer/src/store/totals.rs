//! [`Totals`]: what a collection took per resource, for the metrics.

use std::sync::Arc;

use metrics::counter;

use super::resource::MAX_RESOURCES;
use super::user::Counters;

/// What a collection took per resource, for the `throttle_consumed_total`
/// and `throttle_rejected_total` metrics.
#[derive(Default)]
pub(super) struct Totals {
    pub(super) consumed: [i64; MAX_RESOURCES],
    pub(super) rejected: [i64; MAX_RESOURCES],
}

impl Totals {
    pub(super) fn add(&mut self, c: &Counters, resources: std::ops::Range<usize>) {
        for i in resources.take(MAX_RESOURCES) {
            self.consumed[i] = self.consumed[i].saturating_add(c.consumption[i]);
            self.rejected[i] = self.rejected[i].saturating_add(i64::from(c.rejection[i]));
        }
    }

    pub(super) fn count(&self, service: &str, names: &[Arc<str>]) {
        for (totals, metric) in [
            (&self.consumed, "throttle_consumed_total"),
            (&self.rejected, "throttle_rejected_total"),
        ] {
            for (name, &total) in names.iter().zip(totals).filter(|(_, t)| **t > 0) {
                counter!(metric, "service" => service.to_string(), "resource" => name.to_string())
                    .increment(total as u64);
            }
        }
    }
}
