//! [`Case`]: a limits file, a timeline of load and faults, and the seed
//! that made them; written out as a reproduction.

use std::fmt::{self, Write as _};

use crate::sim::{Comeback, NodeFaultKind, Outage};

/// The one service of every case.
pub const SERVICE: &str = "front";

/// A rule's period, as the limits file names it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Span {
    /// `per_second`.
    Second,
    /// `per_minute`.
    Minute,
    /// `per_hour`.
    Hour,
    /// `per_day`.
    Day,
}

impl Span {
    /// Every span, shortest first.
    pub const ALL: [Span; 4] = [Self::Second, Self::Minute, Self::Hour, Self::Day];

    /// Its length in seconds.
    pub fn seconds(self) -> f64 {
        match self {
            Self::Second => 1.0,
            Self::Minute => 60.0,
            Self::Hour => 3_600.0,
            Self::Day => 86_400.0,
        }
    }

    /// The key of the limits file.
    pub fn key(self) -> &'static str {
        match self {
            Self::Second => "per_second",
            Self::Minute => "per_minute",
            Self::Hour => "per_hour",
            Self::Day => "per_day",
        }
    }
}

/// Whom a rule names.
#[derive(Debug, Clone, PartialEq)]
pub enum Who {
    /// `user = "name"`.
    One(String),
    /// `users = [...]`.
    Many(Vec<String>),
    /// `user = "*"`.
    Every,
}

/// One `[[limit]]` of the case's one resource.
#[derive(Debug, Clone, PartialEq)]
pub struct Rule {
    /// Whom it names.
    pub who: Who,
    /// Amount per span, in the resource's units; at most one per span.
    pub amounts: Vec<(Span, f64)>,
    /// `burst_seconds`, when the rule sets it.
    pub burst_seconds: Option<f64>,
}

/// The resource every request is charged, and what one costs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Resource {
    /// Its name.
    pub name: &'static str,
    /// Units a request costs (bytes for `traffic_down`).
    pub cost: i64,
}

/// Load a user offers for a while.
#[derive(Debug, Clone, PartialEq)]
pub struct Load {
    /// Who.
    pub user: String,
    /// From when, ms since the nodes started.
    pub from_ms: i64,
    /// Until when.
    pub to_ms: i64,
    /// Requests per second over all nodes.
    pub rate: f64,
    /// Its split over the nodes (summing to 1).
    pub shares: Vec<f64>,
    /// When and where the load moves, if it does.
    pub moved: Option<(i64, Vec<f64>)>,
}

impl Load {
    /// Requests per second at node `node` at `t` (ms since the start).
    pub fn at(&self, t: i64, node: usize) -> f64 {
        if !(self.from_ms..self.to_ms).contains(&t) {
            return 0.0;
        }
        let shares = match &self.moved {
            Some((at, shares)) if t >= *at => shares,
            _ => &self.shares,
        };
        self.rate * shares.get(node).copied().unwrap_or(0.0)
    }
}

/// A fault of a case.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Fault {
    /// No central answers from `from_ms` to `to_ms`; then `comeback`
    /// does (the same process cut off, a restart or a standby on the
    /// checkpoint, or a restart without `--state`).
    Central {
        /// From when.
        from_ms: i64,
        /// Until when.
        to_ms: i64,
        /// Who answers after.
        comeback: Comeback,
    },
    /// etcd stopped (`SIGSTOP`) or killed from `from_ms` to `to_ms`,
    /// under two centrals with `--etcd --state etcd` (the operations
    /// guide's setup): the leader leads on until its lease could end
    /// ([`ETCD_LEAD_ON_MS`]), then none does until etcd is back and one
    /// is elected ([`Fault::etcd_back_ms`]), restoring the checkpoint
    /// written before etcd went away (none is written while it is).
    Etcd {
        /// From when.
        from_ms: i64,
        /// Until when.
        to_ms: i64,
        /// Killed and started again on its data, not stopped.
        killed: bool,
    },
    /// Node `node` restarted or cut off from `from_ms` to `to_ms`.
    Node {
        /// Which node.
        node: usize,
        /// From when.
        from_ms: i64,
        /// Until when.
        to_ms: i64,
        /// Restarted or cut off.
        kind: NodeFaultKind,
    },
}

/// How long a leader leads on after etcd stops answering: a fifth of the
/// default 2 s TTL before its lease could end, counted from its last
/// renewal sent, one beat (100 ms) at most before.
pub const ETCD_LEAD_ON_MS: i64 = 1_550;

impl Fault {
    /// The ms it is applied over: what a live run does when.
    pub fn applied_ms(&self) -> (i64, i64) {
        match *self {
            Self::Central { from_ms, to_ms, .. }
            | Self::Etcd { from_ms, to_ms, .. }
            | Self::Node { from_ms, to_ms, .. } => (from_ms, to_ms),
        }
    }

    /// The ms it covers: as applied, and for etcd until a central leads
    /// again.
    pub fn span_ms(&self) -> (i64, i64) {
        let (from_ms, to_ms) = self.applied_ms();
        (from_ms, to_ms + self.etcd_back_ms())
    }

    /// For etcd, how long after it is back a central leads (as the
    /// operations guide measured it: 0.16-0.27 s after a `SIGCONT`,
    /// 1.24-1.92 s after a restart); 0 for any other fault.
    pub fn etcd_back_ms(&self) -> i64 {
        match *self {
            Self::Etcd { killed: false, .. } => 300,
            Self::Etcd { killed: true, .. } => 1_900,
            _ => 0,
        }
    }

    /// The time no central answers, for a fault of the central or etcd.
    pub fn outage(&self) -> Option<Outage> {
        let (from_ms, to_ms, comeback, checkpoints_until_ms) = match *self {
            Self::Central {
                from_ms,
                to_ms,
                comeback,
            } => (from_ms, to_ms, comeback, None),
            Self::Etcd { from_ms, .. } => {
                let (_, back) = self.span_ms();
                let every_ms = 1_000;
                let until = Some(from_ms);
                (
                    from_ms + ETCD_LEAD_ON_MS,
                    back,
                    Comeback::Checkpoint { every_ms },
                    until,
                )
            }
            Self::Node { .. } => return None,
        };
        (to_ms > from_ms).then_some(Outage {
            from_ms,
            to_ms,
            comeback,
            spread_ms: 0,
            checkpoints_until_ms,
        })
    }

    /// The name of its kind, as `docs/accuracy.md` writes it.
    pub fn kind(&self) -> &'static str {
        match self {
            Self::Central {
                comeback: Comeback::Same,
                ..
            } => "central cut off",
            Self::Central {
                comeback: Comeback::Checkpoint { every_ms },
                from_ms,
                to_ms,
            } if to_ms - from_ms <= 3_000 && *every_ms <= 1_000 => "leader failover",
            Self::Central {
                comeback: Comeback::Checkpoint { .. },
                ..
            } => "central restarted with --state",
            Self::Central {
                comeback: Comeback::Fresh,
                ..
            } => "central restarted without state",
            Self::Etcd { killed: false, .. } => "etcd stopped",
            Self::Etcd { killed: true, .. } => "etcd killed",
            Self::Node {
                kind: NodeFaultKind::Restart,
                ..
            } => "node restarted",
            Self::Node {
                kind: NodeFaultKind::Cut,
                ..
            } => "node cut off",
        }
    }
}

/// One generated case: limits, load and faults.
#[derive(Debug, Clone, PartialEq)]
pub struct Case {
    /// The seed it was made from ([`Case::generate`](super::generate)).
    pub seed: u64,
    /// Seconds it runs.
    pub seconds: i64,
    /// App nodes.
    pub nodes: usize,
    /// The resource its rules limit.
    pub resource: Resource,
    /// The limits file's rules.
    pub rules: Vec<Rule>,
    /// The load, user by user.
    pub loads: Vec<Load>,
    /// At most one central fault, and node faults.
    pub faults: Vec<Fault>,
}

impl Case {
    /// Every user that offers load, in order of first appearance.
    pub fn users(&self) -> Vec<String> {
        let mut out: Vec<String> = Vec::new();
        for l in &self.loads {
            if !out.contains(&l.user) {
                out.push(l.user.clone());
            }
        }
        out
    }

    /// The case's rules as a limits file.
    pub fn limits_toml(&self) -> String {
        let mut out = String::new();
        for rule in &self.rules {
            let _ = writeln!(out, "[[limit]]\nservice = \"{SERVICE}\"");
            match &rule.who {
                Who::One(u) => {
                    let _ = writeln!(out, "user = \"{u}\"");
                }
                Who::Every => out.push_str("user = \"*\"\n"),
                Who::Many(us) => {
                    let names: Vec<String> = us.iter().map(|u| format!("\"{u}\"")).collect();
                    let _ = writeln!(out, "users = [{}]", names.join(", "));
                }
            }
            for (span, amount) in &rule.amounts {
                let _ = writeln!(
                    out,
                    "{} = {{ {} = {} }}",
                    span.key(),
                    self.resource.name,
                    amount_toml(*amount, self.resource.cost > 1)
                );
            }
            if let Some(b) = rule.burst_seconds {
                let _ = writeln!(out, "burst_seconds = {b}");
            }
            out.push('\n');
        }
        out
    }

    /// The load and faults, a line each.
    pub fn timeline(&self) -> String {
        let mut out = String::new();
        let _ = writeln!(
            out,
            "{} nodes, {} s, {} at {} a request",
            self.nodes, self.seconds, self.resource.name, self.resource.cost
        );
        for l in &self.loads {
            let _ = write!(
                out,
                "{} offers {:.1}/s from {} ms to {} ms over {:?}",
                l.user, l.rate, l.from_ms, l.to_ms, l.shares
            );
            if let Some((at, shares)) = &l.moved {
                let _ = write!(out, ", moving at {at} ms to {shares:?}");
            }
            out.push('\n');
        }
        for f in &self.faults {
            let _ = writeln!(out, "{}: {f:?}", f.kind());
        }
        out
    }
}

impl fmt::Display for Case {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "THROTTLE_PROMISE_SEED={}", self.seed)?;
        writeln!(f, "--- limits.toml\n{}", self.limits_toml())?;
        write!(f, "--- timeline\n{}", self.timeline())
    }
}

/// `amount` as the limits file writes it: bytes in KiB where they are
/// whole KiB.
fn amount_toml(amount: f64, bytes: bool) -> String {
    let whole = amount.round() as i64;
    if bytes && whole % 1024 == 0 && whole > 0 && (amount - whole as f64).abs() < 1e-9 {
        return format!("\"{}KiB\"", whole / 1024);
    }
    if (amount - whole as f64).abs() < 1e-9 {
        return whole.to_string();
    }
    format!("{amount}")
}
