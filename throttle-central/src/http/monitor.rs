//! The monitor's answers as JSON, in the shapes of the legacy central
//! node's monitor: nested objects keyed by service, slot, user, resource
//! and node.

use serde_json::{Value, json};
use throttle_core::ledger::json::{apps, distribution, quota, reported, sums};

use crate::ledger_task::{Connections, MonitorView};

/// `view` as the JSON the monitor API answers.
pub(crate) fn to_json(view: &MonitorView) -> Value {
    match view {
        MonitorView::Connections(c) => connections(c),
        MonitorView::Reported(slots) => reported(slots),
        MonitorView::Sums(page) => sums(&page.rows),
        MonitorView::Distribution(page) => distribution(&page.rows),
        MonitorView::Quota(page) => quota(&page.rows),
        MonitorView::Apps(services) => apps(services),
    }
}

fn connections(c: &Connections) -> Value {
    let streams: Vec<Value> = c
        .streams
        .iter()
        .map(|s| {
            json!({
                "node_id": s.node_id,
                "addr": s.addr.map(|a| a.to_string()),
                "services": s.services,
                "connected_seconds": s.connected_seconds,
                "reports": s.reports,
                "last_slot": s.last_slot,
                "last_report_seconds": s.last_report_seconds,
                "answered_ahead": s.answered_ahead,
                // The form its quotas are written in.
                "quotas": if s.packed { "packed" } else { "classic" },
                "refs": s.refs,
            })
        })
        .collect();
    json!({"connections": streams, "uptime_seconds": c.uptime_seconds})
}
