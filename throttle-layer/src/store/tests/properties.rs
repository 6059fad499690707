//! Property tests of names, rows, counts and reports against plain models.

use super::*;

proptest::proptest! {
    /// Names compare as their bytes do, at every length around the
    /// 8-byte steps.
    #[test]
    fn names_compare_as_their_bytes(
        a in proptest::collection::vec(0..3u8, 0..40),
        b in proptest::collection::vec(0..3u8, 0..40),
    ) {
        proptest::prop_assert_eq!(same_bytes(&a, &b), a == b);
        proptest::prop_assert!(same_bytes(&a, &a));
        let mut c = a.clone();
        if let Some(last) = c.last_mut() {
            *last ^= 1;
            proptest::prop_assert!(!same_bytes(&a, &c));
        }
    }
}

proptest::proptest! {
    /// A row's 32-bit tag reads back as its slot from any slot within
    /// 2^31 of it, across the sign and the 32-bit boundaries.
    #[test]
    fn row_tags_read_back_near_their_slot(
        slot in proptest::prop_oneof![
            -1_000i64..1_000,
            proptest::strategy::Strategy::prop_map(proptest::prelude::any::<i64>(), |s| s / 4),
            (1i64 << 32) - 3..(1i64 << 32) + 3,
        ],
        off in -(1i64 << 31) + 1..(1i64 << 31),
    ) {
        let now = slot - off;
        proptest::prop_assert_eq!(RowTag::of(slot).near(now), slot);
    }

    /// A quota kept in whole `f32` units decides as the `f64` does up to
    /// 2^24 units, and never more permissively above.
    #[test]
    fn whole_units_decide_as_the_full_quota(
        q in proptest::prop_oneof![-4.0f64..20.0, -1e9f64..1e9, 0.0f64..1e18],
        used in proptest::prop_oneof![-4i64..40, 0i64..(1 << 40)],
    ) {
        let w = f64::from(whole_units(q));
        let refuses = |quota: f64| quota < 1.0 || used as f64 > quota;
        if q.abs() <= f64::from(1u32 << 24) {
            proptest::prop_assert_eq!(refuses(w), refuses(q), "q {} kept as {}", q, w);
        } else {
            proptest::prop_assert!(w <= q.floor());
            proptest::prop_assert!(q.floor() - w <= q.abs() / f64::from(1u32 << 23));
            proptest::prop_assert!(refuses(w) || !refuses(q));
        }
    }
}

proptest::proptest! {
    /// The fixed rows keep what a sorted list of rows would: the current
    /// row or else the newest past one, then the nearest coming slots,
    /// each with its own quotas and version, for any order of arrival;
    /// the quotas of resources past the inline cell move to the spill.
    #[test]
    fn rows_keep_the_current_or_newest_past_and_the_nearest_slots(
        inserts in proptest::collection::vec((90i64..110, 0usize..3, 0.0f64..1e9), 1..40),
        now in 95i64..105,
    ) {
        let mut st = UserState::<[Cell; 1]>::new(now);
        let st: &mut UserState = &mut st;
        // Model: (slot, version, quota per resource), sorted by slot.
        let mut model: Vec<(i64, u16, Vec<f32>)> = Vec::new();
        for (v, &(slot, resources, q)) in inserts.iter().enumerate() {
            let version = v as u16 + 1;
            let quotas: Vec<f32> = (0..=resources).map(|i| whole_units(q + i as f64)).collect();
            st.insert_row(slot, version, &quotas, now);
            model.retain(|r| r.0 != slot);
            model.push((slot, version, quotas));
            model.sort_by_key(|r| r.0);
            let due = model.iter().filter(|r| r.0 <= now).count();
            if due > 1 {
                model.drain(..due - 1);
            }
            model.truncate(ROWS_PER_USER);
        }
        for (slot, version, quotas) in &model {
            let k = st.row(*slot, *version);
            proptest::prop_assert!(k.is_some(), "row for slot {} lost", slot);
            let k = k.unwrap_or_default();
            for (i, cell) in st.cells().iter().enumerate() {
                let quota = cell.quota[k];
                match quotas.get(i) {
                    Some(q) => proptest::prop_assert_eq!(quota, *q),
                    None => proptest::prop_assert!(quota.is_nan()),
                }
            }
        }
        let kept = (0..ROWS_PER_USER).filter(|&k| st.row_version[k] != 0).count();
        proptest::prop_assert_eq!(kept, model.len());
    }
}

/// One step of [`every_count_is_reported_once`].
#[derive(Debug, Clone)]
enum Step {
    /// Time moves on by this many milliseconds.
    Wait(i64),
    /// A request of this user that read the clock this many slots ago
    /// (0: now) and was admitted only now.
    Admit { user: u8, late: i64 },
    /// A byte count for this user, added without a decision.
    Consume { user: u8, amount: u64 },
    /// The reporter collects the slots that ended, as it does at every
    /// slot boundary (or late, after several).
    Collect,
}

fn step() -> impl proptest::strategy::Strategy<Value = Step> {
    use proptest::prelude::*;
    prop_oneof![
        (1..2_500i64).prop_map(Step::Wait),
        (0..3u8, prop_oneof![4 => Just(0i64), 1 => 1..3i64])
            .prop_map(|(user, late)| Step::Admit { user, late }),
        (0..3u8, 1..1_000u64).prop_map(|(user, amount)| Step::Consume { user, amount }),
        Just(Step::Collect),
    ]
}

proptest::proptest! {
    /// Whatever the order of requests, late requests, byte counts,
    /// collections and evictions, every count is in exactly one report:
    /// none lost, none reported twice.
    #[test]
    fn every_count_is_reported_once(steps in proptest::collection::vec(step(), 1..80)) {
        let f = fixture();
        let mut now = T;
        let mut collected = f.store.current_slot() - 1;
        let (mut want_requests, mut want_bytes) = (0i64, 0i64);
        // Requests and bytes in the reports.
        let mut got = (0i64, 0i64);
        let take = |r: &v1::Report, got: &mut (i64, i64)| {
            for user in ["u0", "u1", "u2"] {
                got.0 += amount(&r.consumption, user, "requests");
                got.1 += amount(&r.consumption, user, "traffic_down");
            }
        };
        for s in steps {
            match s {
                Step::Wait(ms) => now += ms,
                Step::Admit { user, late } => {
                    f.clock.set(now - late * 1_000);
                    f.admit(&format!("u{user}"), Fallback::Allow);
                    f.clock.set(now);
                    want_requests += 1;
                }
                Step::Consume { user, amount } => {
                    f.clock.set(now);
                    f.front.consume(&format!("u{user}"), f.down, amount);
                    want_bytes += i64::try_from(amount).unwrap();
                }
                Step::Collect => {
                    f.clock.set(now);
                    let finished = f.store.current_slot() - 1;
                    if finished > collected {
                        collected = finished;
                        let r = f.store.collect(finished);
                        take(&r, &mut got);
                    }
                }
            }
        }
        // Everything ends: two more reports collect what is left.
        for _ in 0..2 {
            now += 1_000;
            f.clock.set(now);
            let r = f.store.collect(f.store.current_slot() - 1);
            take(&r, &mut got);
        }
        proptest::prop_assert_eq!(got, (want_requests, want_bytes));
    }
}

/// One step of [`reports_encoded_as_prost_encodes_the_collected_one`].
#[derive(Debug, Clone)]
enum ReportStep {
    /// A user admitted (quota 0 or none) with a cost, in a service.
    Admit(u8, u8, bool),
    /// A user's handle counts an amount of a resource.
    Consume(u8, u8, u8, u64),
    /// The clock moves on this many slots.
    Advance(u8),
    /// The last slot is collected.
    Collect,
}

fn report_step() -> impl proptest::strategy::Strategy<Value = ReportStep> {
    use proptest::prelude::*;
    prop_oneof![
        4 => (0..2u8, 0..12u8, any::<bool>()).prop_map(|(s, u, q)| ReportStep::Admit(s, u, q)),
        4 => (0..2u8, 0..12u8, 0..5u8, prop_oneof![1u64..1000, any::<u64>()])
            .prop_map(|(s, u, r, a)| ReportStep::Consume(s, u, r, a)),
        1 => (0..3u8).prop_map(ReportStep::Advance),
        1 => Just(ReportStep::Collect),
    ]
}

proptest::proptest! {
    /// The report the reporter sends, written straight from the store,
    /// is byte for byte what prost writes for the same report (that of
    /// a second store fed the same steps, read back by `collect`):
    /// each user once, users and resources in name order, over any mix
    /// of users, services, resources (some registered late, past the
    /// inline cells), refusals, rolls and late counts. What the report
    /// holds is checked by the other tests here, which read it through
    /// `collect`.
    #[test]
    fn reports_encoded_as_prost_encodes_the_collected_one(
        steps in proptest::collection::vec(report_step(), 1..60),
    ) {
        use prost::Message;
        let stores: Vec<(Arc<ManualClock>, SlotStore)> = (0..2)
            .map(|_| {
                let clock = Arc::new(ManualClock::new(T));
                let store = SlotStore::builder().clock(clock.clone()).build();
                (clock, store)
            })
            .collect();
        let service = |s: u8| ["front", "back"][usize::from(s)];
        let resource = |r: u8| ["requests", "zeta", "alpha", "traffic_down", "b"][usize::from(r)];
        for step in steps {
            let mut reports = Vec::new();
            for (clock, store) in &stores {
                match &step {
                    ReportStep::Admit(s, u, quota) => {
                        let svc = store.service(service(*s));
                        let requests = svc.resource("requests").unwrap();
                        let slot = store.current_slot();
                        if *quota {
                            store.apply_quota(&quota_from_json(&format!(
                                r#"{{"{}": {{"{slot}": {{"user-{u}": {{"requests": 0}}}}}}}}"#,
                                service(*s)
                            )).unwrap());
                        }
                        svc.admit(&format!("user-{u}"), &[(requests, 1)], Fallback::Allow);
                    }
                    ReportStep::Consume(s, u, r, amount) => {
                        let svc = store.service(service(*s));
                        let r = svc.resource(resource(*r)).unwrap();
                        svc.consume(&format!("user-{u}"), r, *amount);
                    }
                    ReportStep::Advance(n) => clock.advance(Duration::from_secs(u64::from(*n))),
                    ReportStep::Collect => {}
                }
                if matches!(step, ReportStep::Collect) {
                    let slot = store.current_slot() - 1;
                    reports.push((store.clone(), slot));
                }
            }
            if let [(a, slot), (b, _)] = &reports[..] {
                let encoded = a.collect_encoded(*slot, "node-1");
                let mut built = b.collect(*slot);
                built.node_id = "node-1".into();
                proptest::prop_assert_eq!(&encoded[..], &built.encode_to_vec()[..]);
            }
        }
    }
}
