//! The legacy system's assign algorithm, kept exactly.

use super::assignment::{Assignment, Grant};
use super::granted::Granted;
use super::policy::Policy;
use crate::arena::{NodeUsage, ServiceState};

/// Slots in the weighting window.
const WINDOW: i64 = 5;
/// Share of the stored tokens set aside for idle nodes, times idle/all.
const IDLE_RESERVE: f64 = 0.1;
/// Weight of the consumption share against the rejection share.
const CONSUMPTION_WEIGHT: f64 = 0.6;

/// The original central node's policy.
///
/// At mid-slot `S` it computes the quota of slot `S + 2`: the bucket's
/// positive content is split between the nodes that reported the (user,
/// resource) in the five data slots ending at `S - 1`, weighting an entry `k`
/// slots older than `S - 1` by `5 - k`. A busy node gets
/// `0.6 c/C + 0.4 r/R` of what idle nodes leave; idle nodes share a reserve of
/// `0.1 x idle/all`. A (user, resource) no node reported gets no quota.
#[derive(Debug, Default, Clone)]
pub struct Classic;

impl Classic {
    /// The policy.
    pub fn new() -> Self {
        Self
    }
}

/// Each node's share of the stored tokens, computed from the distribution
/// for quota slot `slot` (so the window is data slots `slot-7 ..= slot-3`).
pub(crate) fn shares(nodes: &[NodeUsage], slot: i64) -> Vec<(usize, f64)> {
    let last = slot - 3;
    let weighted: Vec<(usize, f64, f64)> = nodes
        .iter()
        .enumerate()
        .filter(|(_, n)| n.slot <= last && n.slot > last - WINDOW)
        .map(|(i, n)| {
            let w = (WINDOW - (last - n.slot)) as f64;
            (i, n.consumption as f64 * w, n.rejection as f64 * w)
        })
        .collect();
    let all = weighted.len();
    if all == 0 {
        return Vec::new();
    }
    let idle = weighted
        .iter()
        .filter(|(_, c, r)| *c == 0.0 && *r == 0.0)
        .count();
    if idle == all {
        return weighted
            .iter()
            .map(|(i, ..)| (*i, 1.0 / all as f64))
            .collect();
    }
    let reserve = IDLE_RESERVE * idle as f64 / all as f64;
    let total_c: f64 = weighted.iter().map(|w| w.1).sum();
    let total_r: f64 = weighted.iter().map(|w| w.2).sum();
    weighted
        .iter()
        .map(|&(i, c, r)| {
            let share = if c == 0.0 && r == 0.0 {
                reserve / idle as f64
            } else {
                let busy = if total_r == 0.0 {
                    c / total_c
                } else if total_c == 0.0 {
                    r / total_r
                } else {
                    CONSUMPTION_WEIGHT * c / total_c + (1.0 - CONSUMPTION_WEIGHT) * r / total_r
                };
                (1.0 - reserve) * busy
            };
            (i, share)
        })
        .collect()
}

impl Policy for Classic {
    fn name(&self) -> &'static str {
        "classic"
    }

    fn assign(
        &mut self,
        state: &ServiceState,
        _granted: Granted<'_>,
        slot: i64,
        now_ms: i64,
        mut out: Assignment,
    ) -> Assignment {
        for (id, key) in state.keys() {
            let Some(bucket) = key.bucket() else {
                continue;
            };
            let stored = bucket.level_at(now_ms).max(0.0);
            for (i, share) in shares(key.nodes(), slot) {
                out.push(key.nodes()[i].node, Grant::new(id, stored * share));
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::assigner::render::quota_for;
    use crate::ledger::{Ledger, LedgerConfig, NodeId};
    use crate::limits::Limit;
    use proptest::prelude::*;
    use throttle_proto::legacy::report_from_json;

    fn usage(node: u32, slot: i64, consumption: i64, rejection: u32) -> NodeUsage {
        NodeUsage {
            node: NodeId::test(node),
            slot,
            consumption,
            rejection,
        }
    }

    fn classic_ledger() -> Ledger {
        Ledger::with_policies(
            LedgerConfig::default(),
            Box::new(|_| Box::new(Classic::new())),
        )
    }

    fn close(a: f64, b: f64) -> bool {
        (a - b).abs() < 1e-12
    }

    // Quota slot 12 is assigned at mid-slot 10 from data slots 5..=9.
    const SLOT: i64 = 12;

    #[test]
    fn consumption_and_rejection_shares() {
        // Weighted consumption 3:1 and rejection 1:1 -> 0.6*0.75+0.4*0.5 = 0.65.
        let s = shares(&[usage(0, 9, 3, 5), usage(1, 9, 1, 5)], SLOT);
        assert!(close(s[0].1, 0.65) && close(s[1].1, 0.35), "{s:?}");
    }

    #[test]
    fn one_idle_node_among_four_gets_the_reserve() {
        let s = shares(
            &[
                usage(0, 9, 5, 0),
                usage(1, 9, 5, 0),
                usage(2, 9, 10, 0),
                usage(3, 9, 0, 0),
            ],
            SLOT,
        );
        assert!(close(s[3].1, 0.025), "{s:?}");
        assert!(close(s[2].1, 0.975 * 0.5), "{s:?}");
        assert!(close(s.iter().map(|x| x.1).sum::<f64>(), 1.0));
    }

    #[test]
    fn all_idle_share_equally_and_old_entries_weigh_less() {
        let s = shares(&[usage(0, 9, 0, 0), usage(1, 8, 0, 0)], SLOT);
        assert!(close(s[0].1, 0.5) && close(s[1].1, 0.5));
        // Same consumption, one slot older: weights 5 and 4.
        let s = shares(&[usage(0, 9, 10, 0), usage(1, 8, 10, 0)], SLOT);
        assert!(close(s[0].1, 5.0 / 9.0), "{s:?}");
        // Only rejections: r/R.
        let s = shares(&[usage(0, 9, 0, 1), usage(1, 9, 0, 3)], SLOT);
        assert!(close(s[1].1, 0.75), "{s:?}");
    }

    #[test]
    fn outside_the_window_gets_nothing() {
        assert!(
            shares(&[usage(0, 4, 10, 0)], SLOT).is_empty(),
            "5 slots before 9"
        );
        assert!(
            shares(&[usage(0, 10, 10, 0)], SLOT).is_empty(),
            "after the window"
        );
        let s = shares(&[usage(0, 5, 10, 0)], SLOT);
        assert_eq!(s.len(), 1, "oldest slot of the window");
    }

    #[test]
    fn assign_splits_the_positive_bucket_content() {
        let mut l = classic_ledger();
        let limit = Limit {
            user: "alice".into(),
            per_second: [("requests".into(), 100.0)].into(),
            burst_seconds: 10.0,
            max_debt_seconds: None,
            per_period: Default::default(),
        };
        l.apply_limits("front", &[limit], 9_000);
        for (node, n) in [("a", 30), ("b", 10)] {
            let r = report_from_json(&format!(
                r#"{{"node_id": "{node}", "slot_number": 10, "consumption": {{"front": {{"alice": {{"requests": {n}}}}}}}, "rejection": {{"front": {{}}}}}}"#
            ))
            .unwrap();
            l.ingest(&r, 10_050).unwrap();
        }
        // Bucket: 100 at 9 s, +150 by 10.5 s, -40 charged = 210.
        assert_eq!(l.assign(10_500)["front"], 12);
        let a = l.node_id("a");
        let b = l.node_id("b");
        let qa = quota_for(&l, a, [("front", 12)]);
        let qb = quota_for(&l, b, [("front", 12)]);
        let get = |q: &throttle_proto::v1::Quota| {
            q.services["front"].slots[&12].users["alice"].resources["requests"]
        };
        assert!(close(get(&qa), 210.0 * 0.75), "{qa:?}");
        assert!(close(get(&qb), 210.0 * 0.25), "{qb:?}");
        assert_eq!(
            quota_for(&l, a, [("front", 13)]).services["front"].slots[&13]
                .users
                .len(),
            0
        );
    }

    #[test]
    fn negative_bucket_offers_nothing() {
        let mut l = classic_ledger();
        let limit = Limit {
            user: "u".into(),
            per_second: [("r".into(), 1.0)].into(),
            burst_seconds: 10.0,
            max_debt_seconds: None,
            per_period: Default::default(),
        };
        l.apply_limits("s", &[limit], 9_000);
        let r = report_from_json(
            r#"{"node_id": "a", "slot_number": 10, "consumption": {"s": {"u": {"r": 50}}}, "rejection": {"s": {}}}"#,
        )
        .unwrap();
        l.ingest(&r, 10_000).unwrap();
        l.assign(10_500);
        let a = l.node_id("a");
        let q = quota_for(&l, a, [("s", 12)]);
        assert_eq!(q.services["s"].slots[&12].users["u"].resources["r"], 0.0);
    }

    fn entries() -> impl Strategy<Value = Vec<NodeUsage>> {
        prop::collection::vec((0i64..12, 0i64..1_000, 0u32..1_000), 0..12).prop_map(|v| {
            v.into_iter()
                .enumerate()
                .map(|(i, (slot, c, r))| NodeUsage {
                    node: NodeId::test(i as u32),
                    slot,
                    consumption: c,
                    rejection: r,
                })
                .collect()
        })
    }

    proptest! {
        #[test]
        fn shares_are_non_negative_and_sum_to_at_most_one(nodes in entries()) {
            let s = shares(&nodes, SLOT);
            let sum: f64 = s.iter().map(|x| x.1).sum();
            prop_assert!(s.iter().all(|x| x.1 >= 0.0));
            prop_assert!(sum <= 1.0 + 1e-9);
            if !s.is_empty() {
                prop_assert!(sum >= 1.0 - 1e-9, "everything is handed out: {}", sum);
            }
        }
    }
}
