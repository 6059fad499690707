//! The metrics a central exports (on `GET /metrics`), each with its help
//! text: [`describe`] gives them to the recorder, so the scrape carries
//! `# HELP` lines.

use metrics::{Unit, describe_counter, describe_gauge, describe_histogram};

/// What a metric is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// Only grows.
    Counter,
    /// Goes up and down.
    Gauge,
    /// A distribution of seconds (a summary in Prometheus).
    Histogram,
    /// A gauge of bytes.
    Bytes,
}

/// Every metric of the central: name, kind, help.
pub const METRICS: &[(&str, Kind, &str)] = &[
    (
        "throttle_central_consumed_total",
        Kind::Counter,
        "Amount the nodes admitted, per service and resource, as filed from their reports.",
    ),
    (
        "throttle_central_rejected_total",
        Kind::Counter,
        "Requests the nodes refused, per service and resource, as filed from their reports.",
    ),
    (
        "throttle_central_reports_total",
        Kind::Counter,
        "Reports filed (duplicates included).",
    ),
    (
        "throttle_central_reports_decoded_total",
        Kind::Counter,
        "Reports decoded whole by prost rather than read in place.",
    ),
    (
        "throttle_central_report_entries_total",
        Kind::Counter,
        "(user, resource) entries filed from reports.",
    ),
    (
        "throttle_central_duplicate_reports_total",
        Kind::Counter,
        "Reports of a slot a node had reported already; ignored.",
    ),
    (
        "throttle_central_dropped_entries_total",
        Kind::Counter,
        "Report entries left out, per reason (bad name, negative or absurd amount, too many keys...).",
    ),
    (
        "throttle_central_invalid_messages_total",
        Kind::Counter,
        "Messages from nodes refused, per reason; the stream goes on.",
    ),
    (
        "throttle_central_answers_ahead_total",
        Kind::Counter,
        "Reports answered with quotas before being filed (the slot's quotas were ready).",
    ),
    (
        "throttle_central_reassigns_total",
        Kind::Counter,
        "Re-assigns of a slot after a late report or a change of limits.",
    ),
    (
        "throttle_central_reassigns_skipped_total",
        Kind::Counter,
        "Re-assigns skipped because one ran within the last few milliseconds.",
    ),
    (
        "throttle_central_assign_seconds",
        Kind::Histogram,
        "Time to assign one slot's quotas over every service.",
    ),
    (
        "throttle_central_pushes_dropped_total",
        Kind::Counter,
        "Quota, block or limits pushes not sent to a node (its queue full or its stream gone).",
    ),
    (
        "throttle_central_connections",
        Kind::Gauge,
        "Node streams connected.",
    ),
    (
        "throttle_central_node_connections",
        Kind::Gauge,
        "Node (gRPC) connections open, streams or not.",
    ),
    (
        "throttle_central_connections_closed_total",
        Kind::Counter,
        "Node connections closed by the central, per reason.",
    ),
    (
        "throttle_central_streams_replaced_total",
        Kind::Counter,
        "Node streams closed because the same node opened a new one.",
    ),
    (
        "throttle_central_streams_held",
        Kind::Gauge,
        "New node streams a standby keeps until a leader the node can reach is known.",
    ),
    (
        "throttle_central_streams_not_held_total",
        Kind::Counter,
        "New node streams sent on at once because too many were kept.",
    ),
    (
        "throttle_central_node_connections_at_cap_total",
        Kind::Counter,
        "Node connections left waiting because the most were open.",
    ),
    (
        "throttle_central_http_connections_at_cap_total",
        Kind::Counter,
        "HTTP connections left waiting because the most were open.",
    ),
    (
        "throttle_central_http_unauthorized_total",
        Kind::Counter,
        "HTTP requests refused for lack of the bearer token.",
    ),
    (
        "throttle_central_unauthenticated_total",
        Kind::Counter,
        "Node streams, legacy handshakes and reports, and RLQS streams refused for lack of a valid node key or token.",
    ),
    (
        "throttle_central_legacy_users_left_out_total",
        Kind::Counter,
        "Users left out of a legacy node's answer to fit its 65,535-byte frame.",
    ),
    (
        "throttle_central_rlqs_buckets_without_user_total",
        Kind::Counter,
        "RLQS bucket reports without a user entry: not filed.",
    ),
    (
        "throttle_central_rlqs_buckets_at_cap_total",
        Kind::Counter,
        "RLQS bucket reports past a stream's most buckets: not filed, not assigned.",
    ),
    (
        "throttle_central_keys_at_cap_total",
        Kind::Counter,
        "(service, user, resource) keys not created because the ledger holds its most.",
    ),
    (
        "throttle_central_services_at_cap_total",
        Kind::Counter,
        "Services not assigned because the most are held.",
    ),
    (
        "throttle_central_first_shares_dropped_total",
        Kind::Counter,
        "First shares of Envoy buckets not kept, past a service's most users: their proxies' slots count as idle.",
    ),
    (
        "throttle_central_told_users_truncated_total",
        Kind::Counter,
        "Limits messages cut at their most users.",
    ),
    (
        "throttle_central_limits_reload_ok",
        Kind::Gauge,
        "1 if the limits last read (file or etcd) were applied, 0 if refused.",
    ),
    (
        "throttle_central_limits_reload_errors_total",
        Kind::Counter,
        "Limits refused (broken file or etcd value) or an etcd watch that failed.",
    ),
    (
        "throttle_central_node_keys_reload_ok",
        Kind::Gauge,
        "1 if the node keys file last read was applied, 0 if refused.",
    ),
    (
        "throttle_central_node_keys_reload_errors_total",
        Kind::Counter,
        "Node keys files refused.",
    ),
    (
        "throttle_central_leader",
        Kind::Gauge,
        "1 while this central leads (or runs alone), else 0.",
    ),
    (
        "throttle_central_election_errors_total",
        Kind::Counter,
        "Campaign terms on etcd that ended in an error.",
    ),
    (
        "throttle_central_checkpoint_seconds",
        Kind::Histogram,
        "Time to write one checkpoint.",
    ),
    (
        "throttle_central_checkpoint_bytes",
        Kind::Bytes,
        "Size of the last checkpoint written.",
    ),
    (
        "throttle_central_restore_seconds",
        Kind::Histogram,
        "Time to read and restore a checkpoint at start or takeover.",
    ),
    (
        "throttle_central_state_errors_total",
        Kind::Counter,
        "Checkpoint operations that failed, per op (load, restore, save).",
    ),
    (
        "throttle_central_usage_reports_written_total",
        Kind::Counter,
        "Reports written to the usage store.",
    ),
    (
        "throttle_central_usage_reports_repeated_total",
        Kind::Counter,
        "Reports the usage store had already written (sent again), left out.",
    ),
    (
        "throttle_central_usage_rows_written_total",
        Kind::Counter,
        "Minute, hour and day rows added to in the usage store.",
    ),
    (
        "throttle_central_usage_write_errors_total",
        Kind::Counter,
        "Usage store writes that failed; their reports wait and are written again.",
    ),
    (
        "throttle_central_usage_pending_entries",
        Kind::Gauge,
        "Usage entries filed and waiting to be written.",
    ),
    (
        "throttle_central_usage_lost_reports_total",
        Kind::Counter,
        "Reports whose usage could not be kept, per reason (queue_full, buffer_full, stopped).",
    ),
];

/// Gives every metric of [`METRICS`] its help text and unit. Call it
/// after installing the recorder ([`Central::builder`](crate::Central::builder)'s
/// `metrics` does).
pub fn describe() {
    for &(name, kind, help) in METRICS {
        match kind {
            Kind::Counter => describe_counter!(name, help),
            Kind::Gauge => describe_gauge!(name, help),
            Kind::Bytes => describe_gauge!(name, Unit::Bytes, help),
            Kind::Histogram => describe_histogram!(name, Unit::Seconds, help),
        }
    }
}
