//! The suite every bucket [`Store`] passes, memory and Redis alike: its
//! decisions are [`Level`]'s arithmetic (itself checked against a model
//! stepped one fill at a time, in the layer's unit tests), its waits are
//! enough, its block list holds. Time is a [`ManualClock`] the store was
//! built on.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use proptest::prelude::*;
use proptest::test_runner::{Config, TestCaseError, TestRunner};
use throttle_clock::ManualClock;
use throttle_layer::bucket::{Level, Shape, Store, Wait};

/// A key no other case of the process used.
fn fresh_key(what: &str) -> String {
    static N: AtomicU64 = AtomicU64::new(0);
    format!("{what}-{}", N.fetch_add(1, Ordering::Relaxed))
}

fn shapes() -> impl Strategy<Value = Shape> {
    (1u64..50, 1u64..10, 1u64..50)
        .prop_map(|(c, q, ms)| Shape::new(c, q, Duration::from_millis(ms)).expect("valid shape"))
}

/// Runs every check of the suite on `store`.
pub fn run<S: Store>(rt: &tokio::runtime::Runtime, store: &S, clock: &ManualClock, cases: u32) {
    decisions_are_the_arithmetic(rt, store, clock, cases);
    rt.block_on(block_list(store, clock));
    rt.block_on(more_than_the_capacity_never_fits(store));
}

/// Random shapes and requests: every answer is `Level`'s, the level never
/// passes the capacity, and after a stated wait the request fits.
pub fn decisions_are_the_arithmetic<S: Store>(
    rt: &tokio::runtime::Runtime,
    store: &S,
    clock: &ManualClock,
    cases: u32,
) {
    let ops = prop::collection::vec((0u64..300, 0u64..60), 1..40);
    let mut runner = TestRunner::new(Config::with_cases(cases));
    let strategy = (shapes(), 1_000_000_000i64..2_000_000_000_000, ops);
    let result = runner.run(&strategy, |(shape, start, ops)| {
        rt.block_on(async {
            let key = fresh_key("arithmetic");
            clock.set(start);
            let us = |ms: i64| u64::try_from(ms).expect("positive") * 1000;
            let mut level = Level::full(&shape, us(start));
            let mut now = start;
            for (dt, n) in ops {
                now += i64::try_from(dt).expect("small");
                clock.set(now);
                let expected = level.take(&shape, us(now), n);
                let got = store.try_acquire("suite", &key, &shape, n).await;
                prop_assert_eq!(got, expected, "take {} at {}", n, now);
                let left = store.available("suite", &key, &shape).await;
                let left = left.map_err(|e| TestCaseError::fail(e.to_string()))?;
                prop_assert_eq!(left, level.available(&shape, us(now)));
                prop_assert!(left <= shape.capacity_tokens());
                if let Err(Wait::For(wait)) = got {
                    let ready =
                        now + i64::try_from(wait.as_micros().div_ceil(1000)).expect("short");
                    let mut after = level;
                    prop_assert_eq!(after.take(&shape, us(ready), n), Ok(()));
                }
            }
            Ok(())
        })
    });
    if let Err(e) = result {
        panic!("{e}");
    }
}

/// Blocked keys answer `Blocked` and keep their bucket; unblocked, they
/// take again from where they were.
pub async fn block_list<S: Store>(store: &S, clock: &ManualClock) {
    clock.set(1_700_000_000_000);
    let shape = Shape::per_second(10);
    let key = fresh_key("blocked");
    let (service, other) = ("suite", "suite-other");
    store
        .try_acquire(service, &key, &shape, 7)
        .await
        .expect("full bucket");
    assert!(!store.is_blocked(service, &key).await.expect("asked"));
    store.block(service, &key).await.expect("blocked");
    assert!(store.is_blocked(service, &key).await.expect("asked"));
    assert_eq!(
        store.try_acquire(service, &key, &shape, 1).await,
        Err(Wait::Blocked)
    );
    // The list is the service's: the same key elsewhere is not blocked.
    assert!(!store.is_blocked(other, &key).await.expect("asked"));
    assert_eq!(store.try_acquire(other, &key, &shape, 10).await, Ok(()));
    // Blocked before first use.
    let never = fresh_key("never-used");
    store.block(service, &never).await.expect("blocked");
    assert_eq!(
        store.try_acquire(service, &never, &shape, 1).await,
        Err(Wait::Blocked)
    );
    store.unblock(service, &key).await.expect("unblocked");
    assert!(!store.is_blocked(service, &key).await.expect("asked"));
    assert_eq!(
        store.available(service, &key, &shape).await.expect("asked"),
        3
    );
    assert_eq!(store.try_acquire(service, &key, &shape, 3).await, Ok(()));
    store.unblock(service, &never).await.expect("unblocked");
    assert_eq!(store.try_acquire(service, &never, &shape, 10).await, Ok(()));
}

/// More than the capacity is `TooMany`, whatever the level.
pub async fn more_than_the_capacity_never_fits<S: Store>(store: &S) {
    let shape = Shape::per_second(5);
    let key = fresh_key("too-many");
    assert_eq!(
        store.try_acquire("suite", &key, &shape, 6).await,
        Err(Wait::TooMany)
    );
    assert_eq!(store.try_acquire("suite", &key, &shape, 5).await, Ok(()));
}
