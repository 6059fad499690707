//! Tests of the ledger, by concern; the helpers they share are here.

use std::collections::BTreeMap;
use std::sync::Arc;

use serde_json::{Value, json};
use throttle_proto::MAX_NAME_LEN;
use throttle_proto::legacy::report_from_json;
use throttle_proto::v1;

use super::json;
use super::*;
use crate::assigner::render::{Rendering, Skeletons, quota_for};
use crate::limits::Limit;
use crate::policy::{Grant, Granted, Projected};

mod apps;
mod assign;
mod filing;
mod pages;
mod properties;
mod retention;
mod rules;

fn monitor_quota(l: &Ledger, range: SlotRange) -> Value {
    json::quota(&Monitor::of(l).quota(range, &Page::ALL).rows)
}

fn monitor_sums(l: &Ledger, range: SlotRange, rejection: bool) -> Value {
    json::sums(&Monitor::of(l).sums(range, rejection, &Page::ALL).rows)
}

fn monitor_distribution(l: &Ledger, range: SlotRange, now_ms: i64) -> Value {
    let page = Monitor::of(l).distribution(range, now_ms, &Page::ALL);
    json::distribution(&page.rows)
}

fn monitor_reported(l: &Ledger, range: SlotRange) -> Value {
    json::reported(&Monitor::of(l).reported(range))
}

fn limit(user: &str, resource: &str, rate: f64) -> Limit {
    Limit {
        user: user.into(),
        per_second: [(resource.into(), rate)].into(),
        burst_seconds: 10.0,
        max_debt_seconds: None,
        per_period: Default::default(),
    }
}

/// A report of service `front` from its legacy JSON maps of users.
pub(crate) fn report(node: &str, slot: i64, consumption: &str, rejection: &str) -> v1::Report {
    report_from_json(&format!(
        r#"{{"node_id": "{node}", "slot_number": {slot}, "consumption": {{"front": {consumption}}}, "rejection": {{"front": {rejection}}}}}"#
    ))
    .unwrap()
}

const T: i64 = 100_000; // slot 100 at 1 s slots

/// A ledger keeping `nr_slot` slots of history.
fn keeping(nr_slot: u32) -> Ledger {
    Ledger::new(LedgerConfig {
        nr_slot,
        ..LedgerConfig::default()
    })
}

/// A ledger keeping 10 slots, where alice may make 100 requests a
/// second and carol 40.
fn alice_and_carol_limited() -> Ledger {
    let mut l = keeping(10);
    let limits = [
        limit("alice", "requests", 100.0),
        limit("carol", "requests", 40.0),
    ];
    l.apply_limits("front", &limits, T);
    l
}
