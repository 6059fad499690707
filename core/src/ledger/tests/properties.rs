//! Property tests of the arena, the filing, the sums and the encoding against plain models.

use super::*;

proptest::proptest! {
    /// Whatever the order of reports and forgetting, the arena holds
    /// exactly the keys reported within the last `nr_slot` slots, each
    /// found under its own names.
    #[test]
    fn the_arena_holds_exactly_the_recent_keys(
        ops in proptest::collection::vec((0..6usize, 0..3usize, 0..4i64), 1..120)
    ) {
        const RESOURCES: [&str; 3] = ["requests", "traffic_up", "db"];
        let nr_slot = 5;
        let mut l = keeping(nr_slot);
        let mut model: BTreeMap<(usize, usize), i64> = BTreeMap::new();
        let mut now = T;
        for (i, (user, resource, advance)) in ops.into_iter().enumerate() {
            now += advance * 1_000;
            let slot = l.config().slot.slot_at(now);
            let usage = format!(r#"{{"u{user}": {{"{}": 1}}}}"#, RESOURCES[resource]);
            l.ingest(&report(&format!("n{i}"), slot, &usage, "{}"), now).unwrap();
            model.insert((user, resource), slot - 1);
            l.forget(now);
            let cutoff = slot - i64::from(nr_slot);
            model.retain(|_, s| *s >= cutoff);
            let state = &l.services["front"].state;
            proptest::prop_assert_eq!(state.key_count(), model.len());
            proptest::prop_assert_eq!(state.keys().count(), model.len());
            for &(u, r) in model.keys() {
                let id = state.find(&format!("u{u}"), RESOURCES[r]);
                proptest::prop_assert!(id.is_some());
                let key = state.key(id.unwrap_or(KeyId(u32::MAX)));
                proptest::prop_assert_eq!(key.user(), format!("u{u}"));
                proptest::prop_assert_eq!(key.resource(), RESOURCES[r]);
            }
        }
    }
}

proptest::proptest! {
    /// Whatever the same few nodes report from slot to slot (users
    /// coming and going, resources changing, keys freed and their ids
    /// reused), each amount is filed under its own user and resource,
    /// whether its keys were found by name or from the node's last
    /// report.
    #[test]
    fn amounts_land_on_their_own_keys(
        reports in proptest::collection::vec(
            (
                0..3usize,
                0..3i64,
                proptest::collection::btree_map(
                    (0..8usize, 0..4usize),
                    1..100i64,
                    1..20,
                ),
            ),
            1..40,
        ),
    ) {
        const RESOURCES: [&str; 4] = ["requests", "up", "down", "db"];
        let mut l = keeping(2);
        let mut now = T;
        for (node, advance, entries) in reports {
            now += advance * 1_000;
            let slot = l.config().slot.slot_at(now);
            let mut users: BTreeMap<String, BTreeMap<&str, i64>> = BTreeMap::new();
            for (&(u, r), &amount) in &entries {
                users.entry(format!("u{u}")).or_default().insert(RESOURCES[r], amount);
            }
            let name = format!("n{node}");
            let filed = l.ingest(&report(&name, slot, &json!(users).to_string(), "{}"), now);
            l.forget(now);
            if filed.as_ref().is_ok_and(|f| f.duplicate) {
                continue;
            }
            proptest::prop_assert!(filed.is_ok());
            let n = l.node_id(&name);
            let state = &l.services["front"].state;
            for (&(u, r), &amount) in &entries {
                let id = state.find(&format!("u{u}"), RESOURCES[r]);
                proptest::prop_assert!(id.is_some(), "u{} {} not found", u, RESOURCES[r]);
                let key = state.key(id.unwrap_or(KeyId(u32::MAX)));
                proptest::prop_assert_eq!(key.user(), format!("u{u}"));
                proptest::prop_assert_eq!(key.resource(), RESOURCES[r]);
                let mine = key.nodes().iter().find(|e| e.node == n).copied();
                proptest::prop_assert_eq!(mine.map(|e| (e.slot, e.consumption)), Some((slot - 1, amount)));
                proptest::prop_assert_eq!(
                    l.slot_sum("front", &format!("u{u}"), RESOURCES[r], slot - 1, false) >= amount,
                    true
                );
            }
            proptest::prop_assert_eq!(state.keys().count(), state.key_count());
        }
    }
}

proptest::proptest! {
    /// The per-slot sums read back as a plain model's, as columns turn
    /// dense, widen past `u32`, slots pass the retention and key ids
    /// are reused.
    #[test]
    fn sums_read_back_as_the_model_says(
        reports in proptest::collection::vec(
            (
                0..3usize,
                0..3i64,
                proptest::bool::ANY,
                proptest::collection::vec(
                    (
                        0..10usize,
                        0..4usize,
                        proptest::prop_oneof![
                            8 => 0..50i64,
                            1 => (1i64 << 31)..(1i64 << 33),
                        ],
                    ),
                    1..30,
                ),
            ),
            1..25,
        ),
    ) {
        const RESOURCES: [&str; 4] = ["requests", "up", "down", "db"];
        let nr_slot = 3;
        let mut l = keeping(nr_slot);
        // (data slot, user, resource) -> [consumption, rejection]
        let mut model: BTreeMap<(i64, usize, usize), [i64; 2]> = BTreeMap::new();
        let mut now = T;
        for (i, (node, advance, late, entries)) in reports.into_iter().enumerate() {
            now += advance * 1_000;
            // A late report carries the slot before the current one.
            let slot = l.config().slot.slot_at(now) - i64::from(late);
            let mut users: [BTreeMap<String, BTreeMap<&str, i64>>; 2] = Default::default();
            for (j, &(u, r, amount)) in entries.iter().enumerate() {
                users[j % 2].entry(format!("u{u}")).or_default().insert(RESOURCES[r], amount);
            }
            let [consumption, rejection] = [&users[0], &users[1]].map(|u| json!(u).to_string());
            let node = format!("n{node}-{i}");
            l.ingest(&report(&node, slot, &consumption, &rejection), now).unwrap();
            for (which, usage) in users.iter().enumerate() {
                for (user, amounts) in usage {
                    let u: usize = user[1..].parse().unwrap_or_default();
                    // A rejection count above u32::MAX is dropped; the
                    // sums of several still outgrow it.
                    for (resource, amount) in amounts.iter().filter(|(_, a)| which == 0 || **a <= i64::from(u32::MAX)) {
                        let r = RESOURCES.iter().position(|x| x == resource).unwrap_or(0);
                        model.entry((slot - 1, u, r)).or_default()[which] += amount;
                    }
                }
            }
            l.forget(now);
            let cutoff = l.config().slot.slot_at(now) - i64::from(nr_slot);
            model.retain(|(s, ..), _| *s >= cutoff);
            for (&(s, u, r), sums) in &model {
                for (which, want) in sums.iter().enumerate() {
                    let got = l.slot_sum("front", &format!("u{u}"), RESOURCES[r], s, which == 1);
                    proptest::prop_assert_eq!(got, *want);
                }
            }
            let monitored = monitor_sums(&l, SlotRange::default(), false);
            let total: i64 = model.values().map(|s| s[0]).sum();
            let monitored_total: i64 = monitored["front"]
                .as_object()
                .into_iter()
                .flat_map(|slots| slots.values())
                .flat_map(|users| users.as_object().into_iter().flat_map(|u| u.values()))
                .flat_map(|res| res.as_object().into_iter().flat_map(|r| r.values()))
                .filter_map(Value::as_i64)
                .sum();
            proptest::prop_assert_eq!(monitored_total, total);
        }
    }
}

proptest::proptest! {
    /// The encoded answer says exactly what the built one says, also
    /// when a user's keys are far apart in the arena (a resource that
    /// first appears in a later report).
    #[test]
    fn encoded_quotas_decode_as_the_built_ones(
        reports in proptest::collection::vec(
            (0..3usize, proptest::collection::vec((0..8usize, 0..4usize, 0..50i64), 1..12)),
            2..8,
        ),
        limited in proptest::collection::btree_set((0..8usize, 0..4usize), 0..20),
        policy in 0..3usize,
    ) {
        use prost::Message;
        const RESOURCES: [&str; 4] = ["requests", "up", "down", "db"];
        let factory: PolicyFactory = match policy {
            0 => Box::new(|_| Box::new(Projected::new())),
            1 => Box::new(|_| Box::new(crate::policy::Classic::new())),
            _ => Box::new(|_| Box::new(crate::policy::StaticSplit::new())),
        };
        // Short retention: keys are freed and their ids reused.
        let config = LedgerConfig { nr_slot: 3, ..LedgerConfig::default() };
        let mut l = Ledger::with_policies(config, factory);
        let limits: Vec<Limit> = limited
            .iter()
            .map(|&(u, r)| limit(&format!("user-{u}"), RESOURCES[r], 10.0 + r as f64))
            .collect();
        // Every node's quotas around `slot`, encoded (from a node's
        // last encoding when its keys are the same) and built.
        let skeletons = Skeletons::default();
        let check = |l: &Ledger, slot: i64| -> Result<(), proptest::test_runner::TestCaseError> {
            for node in 0..3 {
                let n = l.find_node(&format!("n{node}"));
                let Some(n) = n else { continue };
                for s in [slot, slot + 1, slot + 2] {
                    let built = quota_for(l, n, [("front", s), ("other", s)]);
                    let to = Rendering { ledger: l, skeletons: &skeletons, node: n, packed: false };
                    let encoded = to.encode([("front", s), ("other", s)], &[], Some(s - 1));
                    let decoded = v1::CentralMessage::decode(&encoded[..]);
                    let want = v1::CentralMessage {
                        kind: Some(v1::central_message::Kind::Quota(v1::Quota {
                            report_slot: Some(s - 1),
                            ..built
                        })),
                    };
                    proptest::prop_assert_eq!(decoded, Ok(want));
                }
            }
            Ok(())
        };
        for (i, (node, entries)) in reports.iter().enumerate() {
            if i == 1 {
                // Keys the first report created come before the
                // limited ones in the arena.
                l.apply_limits("front", &limits, T);
            }
            let mut users: BTreeMap<String, BTreeMap<&str, i64>> = BTreeMap::new();
            for &(u, r, amount) in entries {
                users.entry(format!("user-{u}")).or_default().insert(RESOURCES[r], amount);
            }
            let now = T + i as i64 * 1_000;
            let slot = l.config().slot.slot_at(now);
            l.ingest(&report(&format!("n{node}"), slot, &json!(users).to_string(), "{}"), now)
                .unwrap();
            l.assign(now + 500);
            check(&l, slot)?;
            l.forget(now + 500);
        }
        let now = T + reports.len() as i64 * 1_000;
        check(&l, l.config().slot.slot_at(now))?;
    }
}
