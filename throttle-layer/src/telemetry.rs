//! The metrics a node exports through the [`metrics`] facade, each with
//! its help text: [`describe`] gives them to the recorder, so a Prometheus
//! scrape carries `# HELP` lines. Counts per service and resource are
//! added once per slot, when the slot's report is collected, never on the
//! request path.

use metrics::{Unit, describe_counter, describe_gauge, describe_histogram};

/// What a metric is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// Only grows.
    Counter,
    /// Goes up and down.
    Gauge,
    /// A distribution (a summary in Prometheus unless buckets are set).
    Histogram,
}

/// Every metric of a node: name, kind, help.
pub const METRICS: &[(&str, Kind, &str)] = &[
    (
        "throttle_consumed_total",
        Kind::Counter,
        "Amount admitted, per service and resource (requests, bytes...), added when each slot's report is collected.",
    ),
    (
        "throttle_rejected_total",
        Kind::Counter,
        "Requests refused, per service and resource that refused them, added when each slot's report is collected.",
    ),
    (
        "throttle_decisions_total",
        Kind::Counter,
        "Decisions of note per service: decision=fallback (no quota for the slot), shadow_rejected, blocked, no_user, user_too_long.",
    ),
    (
        "throttle_quota_tables_installed_total",
        Kind::Counter,
        "Quota tables installed from the central, per service (one per slot and service, refs included).",
    ),
    (
        "throttle_quota_ignored_total",
        Kind::Counter,
        "Quota tables ignored: for a slot too far from now, or past 65,535 tables for one slot.",
    ),
    (
        "throttle_quota_refs_missing_total",
        Kind::Counter,
        "Quota refs to a table this node does not hold; the slot goes to the fallback.",
    ),
    (
        "throttle_quotas_malformed_total",
        Kind::Counter,
        "Answers from the central that were not a quota; nothing of them installed.",
    ),
    (
        "throttle_blocked_users",
        Kind::Gauge,
        "Users blocked now, per service, as the central last said.",
    ),
    (
        "throttle_keys_at_cap_total",
        Kind::Counter,
        "Users not tracked because the service holds its most users; decided by the fallback.",
    ),
    (
        "throttle_resources_over_limit_total",
        Kind::Counter,
        "Resources not counted because the service counts its most resources.",
    ),
    (
        "throttle_report_rtt_seconds",
        Kind::Histogram,
        "Time from sending a slot's report to the central's answer to it.",
    ),
    (
        "throttle_reports_buffered",
        Kind::Gauge,
        "Reports sent and not yet answered, kept to send again after a reconnect.",
    ),
    (
        "throttle_reports_dropped_total",
        Kind::Counter,
        "Reports dropped: refused by the central as too large, or not encodable.",
    ),
    (
        "throttle_reporter_connected",
        Kind::Gauge,
        "1 while the reporter has a stream to a central, else 0.",
    ),
    (
        "throttle_reporter_connect_failures_total",
        Kind::Counter,
        "Failed attempts to open a stream to a central.",
    ),
    (
        "throttle_reporter_stale_leader_total",
        Kind::Counter,
        "Centrals not followed because an earlier epoch's leader spoke after a later one.",
    ),
    (
        "throttle_local_decisions_total",
        Kind::Counter,
        "Decisions of the local (nginx limit_req) limits, per service, limit and decision.",
    ),
    (
        "throttle_local_evicted_busy_total",
        Kind::Counter,
        "Local-limit keys evicted while still limited, because the zone was full.",
    ),
    (
        "throttle_shared_decisions_total",
        Kind::Counter,
        "Decisions of the shared (memory or Redis) buckets, per service, limit and decision.",
    ),
    (
        "throttle_bucket_unavailable_total",
        Kind::Counter,
        "Shared-bucket calls that failed or timed out, per store and the decision taken instead.",
    ),
];

/// Gives every metric of [`METRICS`] its help text and unit. Call it
/// after installing the recorder (a Prometheus exporter, say); before,
/// there is nobody to tell.
pub fn describe() {
    for &(name, kind, help) in METRICS {
        match kind {
            Kind::Counter => describe_counter!(name, help),
            Kind::Gauge => describe_gauge!(name, help),
            Kind::Histogram => describe_histogram!(name, Unit::Seconds, help),
        }
    }
}
