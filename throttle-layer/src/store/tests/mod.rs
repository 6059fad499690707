//! Tests of the slot store, by concern; the fixture they share is here.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use compact_str::CompactString;
use parking_lot::Mutex;
use prost::Message;
use throttle_clock::ManualClock;
use throttle_proto::legacy::quota_from_json;
use throttle_proto::v1;
use throttle_proto::wire::RawQuota;

use super::decision::*;
use super::service::*;
use super::slot::*;
use super::user::*;
use super::users::*;
use super::*;

mod collect;
mod decision;
mod properties;

const T: i64 = 100_000; // slot 100

struct Fixture {
    clock: Arc<ManualClock>,
    store: SlotStore,
    front: Arc<ServiceStore>,
    requests: ResourceId,
    down: ResourceId,
}

fn fixture() -> Fixture {
    let clock = Arc::new(ManualClock::new(T));
    let store = SlotStore::builder().clock(clock.clone()).build();
    let front = store.service("front");
    let requests = front.resource("requests").unwrap();
    let down = front.resource("traffic_down").unwrap();
    Fixture {
        clock,
        store,
        front,
        requests,
        down,
    }
}

impl Fixture {
    fn quota(&self, json: &str) {
        self.store.apply_quota(&quota_from_json(json).unwrap());
    }

    fn admit(&self, user: &str, fallback: Fallback) -> Decision {
        self.front
            .admit(user, &[(self.requests, 1)], fallback)
            .decision
    }
}

fn amount(usage: &BTreeMap<String, v1::Usage>, user: &str, resource: &str) -> i64 {
    usage["front"]
        .users
        .get(user)
        .and_then(|a| a.resources.get(resource))
        .copied()
        .unwrap_or(0)
}
