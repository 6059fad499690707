//! Cases made from a seed: random rule sets, loads and faults of the
//! kinds the promise covers. The same seed makes the same case, so a
//! failing case is replayed from its seed alone.

use super::case::{Case, Fault, Load, Resource, Rule, Span, Who};
use crate::sim::{Comeback, NodeFaultKind};

/// SplitMix64: small, fast, and the same everywhere.
#[derive(Debug, Clone)]
pub struct Draw(u64);

impl Draw {
    /// Draws from `seed`.
    pub fn new(seed: u64) -> Self {
        Self(seed ^ 0x005e_ed0f_7e57_ca5e)
    }

    /// The next 64 bits.
    pub fn bits(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// Uniform in `[0, 1)`.
    pub fn unit(&mut self) -> f64 {
        (self.bits() >> 11) as f64 / (1u64 << 53) as f64
    }

    /// Whether an event of probability `p` happens.
    pub fn chance(&mut self, p: f64) -> bool {
        self.unit() < p
    }

    /// Uniform in `lo..hi` (integers).
    pub fn int(&mut self, lo: i64, hi: i64) -> i64 {
        lo + (self.bits() % (hi - lo).max(1) as u64) as i64
    }

    /// Log-uniform in `[lo, hi)`.
    pub fn log(&mut self, lo: f64, hi: f64) -> f64 {
        (lo.ln() + self.unit() * (hi.ln() - lo.ln())).exp()
    }

    /// One of `items`.
    pub fn pick<T: Copy>(&mut self, items: &[T]) -> T {
        items[self.bits() as usize % items.len()]
    }
}

/// Named users of a case (besides rotated keys).
const NAMED: [&str; 4] = ["ann", "ben", "cat", "dan"];

/// A rule of `who` whose binding rate is within a factor of two of `base`
/// units a second: one to four periods, a longer one holding 5 to 60 s of
/// that rate, so that it is spent within the run.
fn rule(d: &mut Draw, who: Who, base: f64, cost: i64) -> Rule {
    let rate = base * d.log(0.5, 2.0);
    let mut amounts = Vec::new();
    while amounts.is_empty() {
        for span in Span::ALL {
            if d.chance(if span == Span::Second { 0.6 } else { 0.35 }) {
                let amount = match span {
                    Span::Second => rate * d.log(0.5, 2.0),
                    _ => rate * d.log(5.0, 60.0),
                };
                let units = (amount / cost as f64).round().max(1.0) as i64 * cost;
                amounts.push((span, units as f64));
            }
        }
    }
    let has_second = amounts.iter().any(|(s, _)| *s == Span::Second);
    let burst_seconds = (has_second && d.chance(0.7)).then(|| {
        let b = d.log(0.1, 60.0);
        (b * 10.0).round().max(1.0) / 10.0
    });
    Rule {
        who,
        amounts,
        burst_seconds,
    }
}

/// A split of a load over `nodes`: one to all of them, shares drawn.
fn shares(d: &mut Draw, nodes: usize) -> Vec<f64> {
    let on = d.int(1, nodes as i64 + 1) as usize;
    let mut weights: Vec<f64> = (0..nodes)
        .map(|i| if i < on { 0.2 + d.unit() } else { 0.0 })
        .collect();
    // Which nodes: rotate by a draw.
    weights.rotate_right(d.int(0, nodes as i64) as usize);
    let total: f64 = weights.iter().sum();
    weights.iter().map(|w| w / total).collect()
}

/// The case of `seed`.
pub fn generate(seed: u64) -> Case {
    let mut d = Draw::new(seed);
    let nodes = d.int(1, 6) as usize;
    let seconds = d.int(40, 71);
    let resource = if d.chance(0.2) {
        Resource {
            name: "traffic_down",
            cost: 1024,
        }
    } else {
        Resource {
            name: "requests",
            cost: 1,
        }
    };
    let cost = resource.cost;
    // Units a second of a typical rule.
    let base = d.log(10.0, 400.0) * cost as f64;
    let mut rules = Vec::new();
    let every = d.chance(0.6);
    if every {
        rules.push(rule(&mut d, Who::Every, base, cost));
    }
    let named = d.int(1, NAMED.len() as i64 + 1) as usize;
    let users: Vec<String> = NAMED[..named].iter().map(|u| u.to_string()).collect();
    if d.chance(0.4) {
        let list: Vec<String> = users.iter().filter(|_| d.chance(0.6)).cloned().collect();
        if !list.is_empty() {
            rules.push(rule(&mut d, Who::Many(list), base, cost));
        }
    }
    for u in &users {
        if d.chance(0.5) {
            rules.push(rule(&mut d, Who::One(u.clone()), base, cost));
        }
    }
    let mut loads = Vec::new();
    for u in &users {
        loads.push(load(&mut d, u, nodes, seconds, base / cost as f64));
    }
    if every && d.chance(0.3) {
        rotate_keys(&mut d, &mut loads, nodes, seconds, base / cost as f64);
    }
    let faults = faults(&mut d, seed, nodes, seconds);
    Case {
        seed,
        seconds,
        nodes,
        resource,
        rules,
        loads,
        faults,
    }
}

/// A named user's load: idle, under, at or ten times over `rate`
/// requests a second, from the start (the nodes just connected) or
/// later, perhaps moving between nodes.
fn load(d: &mut Draw, user: &str, nodes: usize, seconds: i64, rate: f64) -> Load {
    let times = d.pick(&[0.0, 0.5, 1.0, 2.0, 10.0]);
    let from_ms = if d.chance(0.3) { 0 } else { d.int(0, 20_000) };
    let to_ms = if d.chance(0.5) {
        seconds * 1000
    } else {
        d.int(from_ms + 5_000, seconds * 1000 + 1)
    };
    let moved = d
        .chance(0.3)
        .then(|| (d.int(from_ms, to_ms.max(from_ms + 1)), shares(d, nodes)));
    Load {
        user: user.to_owned(),
        from_ms,
        to_ms,
        rate: rate * times,
        shares: shares(d, nodes),
        moved,
    }
}

/// New keys arriving, one or more a second, each offering the `*` rate
/// several times over for one to three seconds: a client rotating its key.
fn rotate_keys(d: &mut Draw, loads: &mut Vec<Load>, nodes: usize, seconds: i64, rate: f64) {
    let from = d.int(0, 20) * 1000;
    let every_ms = d.pick(&[250, 500, 1000]);
    let stay_ms = d.int(1, 4) * 1000;
    let times = d.pick(&[2.0, 6.0, 10.0]);
    let mut at = from;
    let mut k = 0;
    while at + stay_ms <= seconds * 1000 && k < 60 {
        loads.push(Load {
            user: format!("key-{k:02}"),
            from_ms: at,
            to_ms: at + stay_ms,
            rate: rate * times,
            shares: shares(d, nodes),
            moved: None,
        });
        at += every_ms;
        k += 1;
    }
}

/// Where etcd's faults are drawn from: a draw of their own, so that the
/// cases of every other seed are as they were before etcd's were added
/// (and the seeds of the named tests keep their faults).
const ETCD_DRAW: u64 = 0x00E7_CD14;

/// At most one central or etcd fault and one node fault.
fn faults(d: &mut Draw, seed: u64, nodes: usize, seconds: i64) -> Vec<Fault> {
    let mut out = Vec::new();
    if d.chance(0.5) {
        let from_ms = d.int(5_000, 25_000) + d.int(0, 1000);
        let failover = d.chance(0.25);
        let comeback = match (failover, d.int(0, 3)) {
            (true, _) => Comeback::Checkpoint { every_ms: 1_000 },
            (false, 0) => Comeback::Same,
            (false, 1) => Comeback::Checkpoint { every_ms: 1_000 },
            _ => Comeback::Fresh,
        };
        let length = if failover {
            d.int(1_000, 3_001)
        } else {
            d.int(1_000, 40_001)
        };
        let to_ms = (from_ms + length)
            .min(seconds * 1000 - 5_000)
            .max(from_ms + 1_000);
        let mut e = Draw::new(seed ^ ETCD_DRAW);
        let fault = if e.chance(0.2) {
            let away = e.int(2_500, 20_001);
            Fault::Etcd {
                from_ms,
                to_ms: (from_ms + away)
                    .min(seconds * 1000 - 8_000)
                    .max(from_ms + 2_500),
                killed: e.chance(0.5),
            }
        } else {
            Fault::Central {
                from_ms,
                to_ms,
                comeback,
            }
        };
        out.push(fault);
    }
    if d.chance(0.3) {
        let from_ms = d.int(5_000, 30_000);
        let to_ms = from_ms + d.int(1_000, 15_001);
        let kind = d.pick(&[NodeFaultKind::Restart, NodeFaultKind::Cut]);
        // A node that starts while no central answers has heard no limits:
        // it admits as its fallback says, outside the promise.
        let restarts_alone = kind == NodeFaultKind::Restart
            && out.iter().any(|f: &Fault| {
                let (a, b) = f.span_ms();
                to_ms + 2_000 >= a && from_ms <= b + 2_000
            });
        if !restarts_alone {
            out.push(Fault::Node {
                node: d.int(0, nodes as i64) as usize,
                from_ms,
                to_ms,
                kind,
            });
        }
    }
    out
}
