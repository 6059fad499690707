//! The monitor's pages as JSON, in the shapes of the legacy central
//! node's monitor: nested objects keyed by service, slot, user, resource
//! and node.

use std::collections::BTreeMap;

use serde_json::{Map, Value, json};

use super::{BucketView, KeyView, QuotaSlot, ServiceRows, SumRow};
use crate::policy::AppsStatus;

/// Data slot -> nodes that reported it.
pub fn reported(slots: &[(i64, Vec<String>)]) -> Value {
    let map: Map<String, Value> = slots
        .iter()
        .map(|(slot, nodes)| (slot.to_string(), json!(nodes)))
        .collect();
    Value::Object(map)
}

/// Service -> slot -> user -> resource -> summed consumption (or
/// rejection).
pub fn sums(rows: &ServiceRows<SumRow>) -> Value {
    type Users<'a> = BTreeMap<&'a str, BTreeMap<&'a str, i64>>;
    let mut out: BTreeMap<&str, BTreeMap<String, Users<'_>>> = BTreeMap::new();
    for (service, rows) in rows {
        let slots = out.entry(service).or_default();
        for row in rows {
            *slots
                .entry(row.slot.to_string())
                .or_default()
                .entry(&row.user)
                .or_default()
                .entry(&row.resource)
                .or_default() += row.amount;
        }
    }
    json!(out)
}

/// Service -> user -> resource -> {nodes: node -> latest entry, bucket}.
pub fn distribution(rows: &ServiceRows<KeyView>) -> Value {
    let mut out = Map::new();
    for (service, keys) in rows {
        let mut users: BTreeMap<&str, Map<String, Value>> = BTreeMap::new();
        for key in keys {
            let nodes: Map<String, Value> = key
                .nodes
                .iter()
                .map(|n| {
                    let u = &n.usage;
                    let entry = json!({"slot": u.slot, "consumption": u.consumption, "rejection": u.rejection});
                    (n.node.clone(), entry)
                })
                .collect();
            let mut entry = json!({"nodes": nodes, "bucket": key.bucket.as_ref().map(bucket)});
            if !key.others.is_empty() {
                entry["others"] = key.others.iter().map(bucket).collect();
            }
            users
                .entry(&key.user)
                .or_default()
                .insert(key.resource.clone(), entry);
        }
        out.insert(service.clone(), json!(users));
    }
    Value::Object(out)
}

/// Service -> slot -> node -> user -> resource -> quota.
pub fn quota(rows: &ServiceRows<QuotaSlot>) -> Value {
    let mut out = Map::new();
    for (service, slots) in rows {
        let mut by_slot = Map::new();
        for slot in slots {
            let mut nodes: BTreeMap<&str, BTreeMap<&str, BTreeMap<&str, f64>>> = BTreeMap::new();
            for g in &slot.grants {
                nodes
                    .entry(&g.node)
                    .or_default()
                    .entry(&g.user)
                    .or_default()
                    .insert(&g.resource, g.amount);
            }
            by_slot.insert(slot.slot.to_string(), json!(nodes));
        }
        out.insert(service.clone(), Value::Object(by_slot));
    }
    Value::Object(out)
}

/// Service -> its capacity's split ([`AppsStatus`]).
pub fn apps(services: &[(String, AppsStatus)]) -> Value {
    let map: Map<String, Value> = services
        .iter()
        .map(|(service, status)| (service.clone(), json!(status)))
        .collect();
    Value::Object(map)
}

/// A bucket as the monitor shows it.
pub fn bucket(b: &BucketView) -> Value {
    json!({"level": b.level, "rate": b.rate, "capacity": b.capacity, "period": b.period.as_str()})
}
