//! The scenarios of the accuracy benchmark.

use throttle_layer::store::Fallback;

use super::{Comeback, Outage, Scenario, User};

fn always(_: i64, _: usize) -> bool {
    true
}

/// A user offering `total` requests per second split by `shares`.
pub(crate) fn spread(name: &str, limit: f64, total: f64, shares: Vec<f64>) -> User {
    User {
        name: name.into(),
        limit,
        demand: Box::new(move |_, n| total * shares.get(n).copied().unwrap_or(0.0)),
    }
}

pub(crate) fn base(name: &'static str, seed: u64, users: Vec<User>, nodes: usize) -> Scenario {
    Scenario {
        name,
        seed,
        seconds: 60,
        nodes,
        proxies: 0,
        users,
        burst_seconds: 10.0,
        resource: ("requests", 1),
        delay_ms: (0, 2),
        loss: 0.0,
        report_spread_ms: 0,
        alive: always,
        warm_up: 10,
        shifts: Vec::new(),
        every_user: None,
        limits: None,
        fallback: Fallback::default(),
        outage: None,
        node_faults: Vec::new(),
        default_quota: true,
    }
}

/// The scenarios of the accuracy benchmark, in order.
pub fn scenarios() -> Vec<Scenario> {
    let mut out = vec![
        base(
            "1 steady 3x, even",
            1,
            vec![spread("heavy", LIMIT, 3.0 * LIMIT, vec![1.0 / 3.0; 3])],
            3,
        ),
        base(
            "2 steady 3x, 70/20/10",
            2,
            vec![spread("heavy", LIMIT, 3.0 * LIMIT, vec![0.7, 0.2, 0.1])],
            3,
        ),
    ];
    out.push(hot_node_moves("3 hot node moves every 10 s", 3));
    let mut burst = base(
        "4 burst after 30 s idle",
        4,
        vec![User {
            name: "heavy".into(),
            limit: LIMIT,
            demand: Box::new(|t, _| if t < 30_000 { 0.0 } else { 5.0 * LIMIT / 3.0 }),
        }],
        3,
    );
    burst.warm_up = 30;
    out.push(burst);
    let mut many = vec![spread("heavy", LIMIT, 3.0 * LIMIT, vec![0.1; 10])];
    for u in 0..1000 {
        let home = u % 10;
        many.push(User {
            name: format!("light-{u:04}"),
            limit: 20.0,
            demand: Box::new(move |_, n| if n == home { 10.0 } else { 0.0 }),
        });
    }
    out.push(base("5 1000 light users + 1 heavy", 5, many, 10));
    let mut churn = base(
        "6 nodes join and leave",
        6,
        vec![User {
            name: "heavy".into(),
            limit: LIMIT,
            demand: Box::new(|_, _| 300.0),
        }],
        12,
    );
    // Node k is down during the k-th 5-second period (mod 12).
    churn.alive = |t, n| (t / 5_000) as usize % 12 != n;
    out.push(churn);
    let mut debt = base(
        "7 traffic_down charged after 1 MiB responses",
        7,
        vec![spread(
            "heavy",
            10.0 * 1_048_576.0,
            30.0,
            vec![1.0 / 3.0; 3],
        )],
        3,
    );
    debt.resource = ("traffic_down", 1_048_576);
    out.push(debt);
    let mut lossy = base(
        "8 0-300 ms delay, 5% reports lost",
        8,
        vec![spread("heavy", LIMIT, 3.0 * LIMIT, vec![0.7, 0.2, 0.1])],
        3,
    );
    lossy.delay_ms = (0, 300);
    lossy.loss = 0.05;
    out.push(lossy);
    out.push(two_hundred_nodes("9 200 nodes, one user 3x", 9));
    // 100 light users at a fifth of their limit, each on one node at
    // first, then spread over one more node every 4 s (from 12 s on, the
    // same 20 requests/s in all): traffic arriving at nodes that had none
    // of it, as when a load balancer moves users about.
    let mut spreading = vec![spread("heavy", LIMIT, 3.0 * LIMIT, vec![0.1; 10])];
    for u in 0..100usize {
        spreading.push(User {
            name: format!("light-{u:03}"),
            limit: 100.0,
            demand: Box::new(move |t, n| {
                let on =
                    (1 + (t - 12_000 + (u as i64 % 4) * 1_000).max(0) as usize / 4_000).min(10);
                if (n + 10 - u % 10) % 10 < on {
                    20.0 / on as f64
                } else {
                    0.0
                }
            }),
        });
    }
    out.push(base(
        "10 light users arrive at new nodes",
        10,
        spreading,
        10,
    ));
    // Scenarios 3 and 9 with the nodes' reports spread over the 400 ms
    // after the report delay (`ReporterBuilder::report_spread`).
    for mut s in [
        hot_node_moves("11 hot node moves, reports spread 400 ms", 11),
        two_hundred_nodes("12 200 nodes, reports spread 400 ms", 12),
    ] {
        s.report_spread_ms = 400;
        out.push(s);
    }
    out.push(every_user(
        "13 10 heavy + 100,000 light users under *",
        100_000,
    ));
    out.extend(beside_proxies());
    out
}

/// A node of the library and two Envoy proxies, which report every 5 s:
/// the measured user at 3x over the three, one under its limit on each
/// (never to be refused), with the default burst and with a burst of one
/// second; the measured user's load moving whole from one proxy to the
/// other; and the measured user idle on both proxies, then busy.
fn beside_proxies() -> Vec<Scenario> {
    // As the end-to-end tests: alice 100/s, bob 50/s offering 30/s.
    const LIMIT: f64 = 100.0;
    let mixed = |name, seed, burst_seconds| {
        let users = vec![
            spread("heavy", LIMIT, 3.0 * LIMIT, vec![1.0 / 3.0; 3]),
            spread("light", 50.0, 30.0, vec![1.0 / 3.0; 3]),
        ];
        Scenario {
            proxies: 2,
            burst_seconds,
            ..base(name, seed, users, 3)
        }
    };
    // Alone on two proxies (as the end-to-end test), between two of
    // their reports.
    let moving = User {
        name: "heavy".into(),
        limit: LIMIT,
        demand: Box::new(move |t, n| match (n, t < 32_500) {
            (0, true) | (1, false) => 2.0 * LIMIT,
            _ => 0.0,
        }),
    };
    let moves = Scenario {
        proxies: 2,
        shifts: vec![32_500],
        ..base(
            "25 load moves from one Envoy proxy to the other",
            25,
            vec![moving, spread("light", 50.0, 30.0, vec![0.5; 2])],
            2,
        )
    };
    // Idle on both proxies for 20 s, then 3x on both, with a burst of one
    // second: their buckets admit what they are granted for 5 s before
    // their reports tell the central.
    let returning = User {
        name: "heavy".into(),
        limit: LIMIT,
        demand: Box::new(|t, _| match t {
            10_000..30_500 => 0.0,
            _ => 1.5 * LIMIT,
        }),
    };
    let returns = Scenario {
        proxies: 2,
        burst_seconds: 1.0,
        ..base(
            "27 idle on two Envoy proxies, then 3x, burst 1 s",
            27,
            vec![returning, spread("light", 50.0, 30.0, vec![0.5; 2])],
            2,
        )
    };
    // The central killed with two proxies at 2x, restarted on its
    // checkpoint 20 s later: the proxies keep their shares for the TTL
    // (15 s), then admit all, and drop their reports until they are back
    // at their next one.
    let restarted = Scenario {
        proxies: 2,
        outage: Some(Outage {
            from_ms: 15_400,
            to_ms: 35_400,
            comeback: Comeback::Checkpoint { every_ms: 1_000 },
            spread_ms: 0,
            checkpoints_until_ms: None,
        }),
        ..base(
            "28 two Envoy proxies, central restarted after 20 s",
            28,
            vec![spread("heavy", LIMIT, 2.0 * LIMIT, vec![0.5; 2])],
            2,
        )
    };
    vec![
        mixed("24 a node and two Envoy proxies, 3x", 24, 10.0),
        moves,
        mixed("26 as 24, a burst of one second", 26, 1.0),
        returns,
        restarted,
    ]
}

/// The central away from 30.4 s on while one user offers 3x its limit
/// over 3 nodes; the accuracy program runs each under every fallback.
pub fn outages() -> Vec<Scenario> {
    let away = |name, seed, ms: i64, comeback, spread_ms| {
        let even = vec![1.0 / 3.0; 3];
        let mut s = base(
            name,
            seed,
            vec![spread("heavy", LIMIT, 3.0 * LIMIT, even)],
            3,
        );
        // Less burst than the outage is long: its refill exceeds the
        // bucket.
        s.burst_seconds = 2.0;
        s.outage = Some(Outage {
            from_ms: 30_400,
            to_ms: 30_400 + ms,
            comeback,
            spread_ms,
            checkpoints_until_ms: None,
        });
        s
    };
    let checkpoint = Comeback::Checkpoint { every_ms: 1_000 };
    vec![
        away(
            "14 central killed, back 5 s later",
            14,
            5_000,
            checkpoint,
            0,
        ),
        away(
            "15 leader killed, standby leads 2.3 s later",
            15,
            2_300,
            checkpoint,
            0,
        ),
        away(
            "16 nodes cut off from the central 5 s",
            16,
            5_000,
            Comeback::Same,
            0,
        ),
        away(
            "17 central killed, back 5 s later, no state",
            17,
            5_000,
            Comeback::Fresh,
            0,
        ),
        away(
            "21 as 15, nodes back in random order over 1 s",
            21,
            2_300,
            checkpoint,
            1_000,
        ),
        away(
            "22 as 16, nodes back in random order over 1 s",
            22,
            5_000,
            Comeback::Same,
            1_000,
        ),
        away(
            "23 as 17, nodes back in random order over 1 s",
            23,
            5_000,
            Comeback::Fresh,
            1_000,
        ),
    ]
}

/// Ten heavy users at 3x the `*` rate (200/s) over 10 nodes, beside `light` light
/// ones each on one node at one request every 10 s: every user is limited
/// by the `*` rule alone, and the central holds the users of the last
/// minute, not a rule per user. (The test suite runs it with fewer light
/// users: in a debug build 100,000 take minutes.)
pub fn every_user(name: &'static str, light: usize) -> Scenario {
    let seed = 13;
    let nodes = 10;
    let rate = LIMIT / 5.0;
    let mut users: Vec<User> = (0..10)
        .map(|h| spread(&format!("heavy-{h}"), rate, 3.0 * rate, vec![0.1; nodes]))
        .collect();
    for u in 0..light {
        let home = u % nodes;
        users.push(User {
            name: format!("light-{u:06}"),
            limit: rate,
            demand: Box::new(move |_, n| if n == home { 0.1 } else { 0.0 }),
        });
    }
    let mut s = base(name, seed, users, nodes);
    s.every_user = Some(rate);
    s
}

/// The limit of the scenarios' measured user, requests per second.
const LIMIT: f64 = 1000.0;

/// Three nodes; the one that gets most of the user's traffic changes every
/// 10 s.
fn hot_node_moves(name: &'static str, seed: u64) -> Scenario {
    let mut moving = base(
        name,
        seed,
        vec![User {
            name: "heavy".into(),
            limit: LIMIT,
            demand: Box::new(|t, n| {
                if (t / 10_000) as usize % 3 == n {
                    2700.0
                } else {
                    150.0
                }
            }),
        }],
        3,
    );
    moving.shifts = (1..6).map(|k| k * 10_000).collect();
    moving
}

/// One user at three times its limit, spread evenly over 200 nodes.
fn two_hundred_nodes(name: &'static str, seed: u64) -> Scenario {
    base(
        name,
        seed,
        vec![spread("heavy", LIMIT, 3.0 * LIMIT, vec![1.0 / 200.0; 200])],
        200,
    )
}

/// The scenario named `prefix...`.
///
/// # Panics
///
/// When there is none: a typo in a test.
pub fn scenario(prefix: &str) -> Scenario {
    scenarios()
        .into_iter()
        .chain(outages())
        .find(|s| s.name.starts_with(prefix))
        .unwrap_or_else(|| panic!("no scenario {prefix:?}"))
}
