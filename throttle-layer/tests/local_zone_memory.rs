//! A local limit's zone stays at its size under a flood of new keys, and
//! what each key costs in memory.
//!
//! A test binary of its own, for its counting allocator.

use std::alloc::System;
use std::task::{Context, Poll, Waker};

use http::{Request, Response};
use http_body_util::Full;
use stats_alloc::{INSTRUMENTED_SYSTEM, Region, StatsAlloc};
use throttle_layer::local::LocalLimit;
use throttle_layer::{SlotStore, ThrottleLayer, UserKey};
use tower::{Layer, Service};

#[global_allocator]
static GLOBAL: &StatsAlloc<System> = &INSTRUMENTED_SYSTEM;

type Body = Full<bytes::Bytes>;

/// Bytes held after `keys` distinct clients each sent one request through
/// a layer whose local limit, keyed by client, holds at most `size` keys
/// (the layer built inside the measured region: the zone's memory is all
/// counted). The requests name no user, so the slot store holds nothing
/// of theirs: what is held is the zone's.
fn held_after(keys: usize, size: usize) -> isize {
    let region = Region::new(GLOBAL);
    let layer = ThrottleLayer::builder(&SlotStore::default(), "front")
        .user(UserKey::header("x-user"))
        .count_requests(false)
        .local_limit(
            LocalLimit::per_second(10)
                .zone_size(size)
                .key(UserKey::header("x-client")),
        )
        .build()
        .unwrap();
    let mut svc = layer.layer(tower::service_fn(|_req: Request<Body>| async {
        Ok::<_, std::convert::Infallible>(Response::new(Body::default()))
    }));
    let mut cx = Context::from_waker(Waker::noop());
    for k in 0..keys {
        let req = Request::builder()
            .header("x-client", format!("flood-{k:09}"))
            .body(Body::default())
            .unwrap();
        let mut call = std::pin::pin!(svc.call(req));
        assert!(matches!(call.as_mut().poll(&mut cx), Poll::Ready(Ok(_))));
    }
    let stats = region.change();
    let held = stats.bytes_allocated as isize - stats.bytes_deallocated as isize;
    drop(svc);
    held
}

#[test]
fn a_flood_of_new_keys_keeps_the_zone_at_its_size() {
    // 1,000,000 keys through a zone of 10,000, and 100,000 through the
    // same size: the memory held is the zone's, not the flood's. (Each
    // shard's table grows once as evictions leave tombstones, within the
    // first 100,000.)
    let size = 10_000;
    let small = held_after(100_000, size);
    let flood = held_after(1_000_000, size);
    let per_key = flood as f64 / size as f64;
    println!(
        "zone of {size} keys: {small} bytes after 100,000 keys, {flood} after 1,000,000 ({per_key:.0} B a key)"
    );
    assert!(
        flood <= small + small / 10,
        "the flood grew the zone: {small} -> {flood}"
    );
    assert!(per_key < 300.0, "{per_key} B a key");
}
