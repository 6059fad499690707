//! Filing reports: buckets, sums, distribution, and what is refused.

use super::*;

/// A report's packed usages are filed as the map entries they stand
/// for; one whose bits and amounts disagree is refused whole.
#[test]
fn packed_usages_are_ingested_as_the_maps_they_stand_for() {
    let mut l = keeping(3);
    let table = |rejection, amounts: Vec<i64>| v1::PackedUsage {
        service: "front".into(),
        rejection,
        resources: vec!["requests".into()],
        users: vec![v1::PackedUser {
            user: "alice".into(),
            resources: vec![1],
        }],
        amounts,
    };
    let packed = |amounts: Vec<i64>| v1::Report {
        node_id: "n1".into(),
        slot_number: 100,
        packed: vec![table(false, amounts), table(true, vec![2])],
        ..v1::Report::default()
    };
    assert!(matches!(
        l.ingest(&packed(vec![]), T),
        Err(ReportError::Packed(_))
    ));
    l.ingest(&packed(vec![5]), T).unwrap();
    assert_eq!(l.slot_sum("front", "alice", "requests", 99, false), 5);
    assert_eq!(l.slot_sum("front", "alice", "requests", 99, true), 2);
}

#[test]
fn ingest_charges_buckets_and_sums_by_data_slot() {
    let mut l = Ledger::new(LedgerConfig::default());
    l.apply_limits("front", &[limit("alice", "requests", 10.0)], T);
    l.ingest(
        &report(
            "n1",
            100,
            r#"{"alice": {"requests": 4}, "bob": {"requests": 7}}"#,
            "{}",
        ),
        T,
    )
    .unwrap();
    l.ingest(
        &report(
            "n2",
            100,
            r#"{"alice": {"requests": 3}}"#,
            r#"{"alice": {"requests": 2}}"#,
        ),
        T,
    )
    .unwrap();
    assert_eq!(l.bucket_level("front", "alice", "requests", T), Some(3.0));
    assert_eq!(
        l.bucket_level("front", "bob", "requests", T),
        None,
        "no limit, no bucket"
    );
    assert_eq!(l.slot_sum("front", "alice", "requests", 99, false), 7);
    assert_eq!(l.slot_sum("front", "alice", "requests", 99, true), 2);
    assert_eq!(
        l.slot_sum("front", "bob", "requests", 99, false),
        7,
        "accounting without limit"
    );
}

#[test]
fn duplicate_report_is_not_charged_twice() {
    let mut l = Ledger::new(LedgerConfig::default());
    l.apply_limits("front", &[limit("alice", "requests", 10.0)], T);
    let r = report("n1", 100, r#"{"alice": {"requests": 4}}"#, "{}");
    assert!(!l.ingest(&r, T).unwrap().duplicate);
    assert!(l.ingest(&r, T).unwrap().duplicate);
    assert_eq!(l.bucket_level("front", "alice", "requests", T), Some(6.0));
    assert_eq!(l.slot_sum("front", "alice", "requests", 99, false), 4);
}

#[test]
fn late_report_is_charged_under_its_own_slot() {
    let mut l = Ledger::new(LedgerConfig::default());
    // Its first report is of data slot 96: it charges from there on.
    l.ingest(&report("n2", 97, "{}", "{}"), T - 3_000).unwrap();
    l.apply_limits("front", &[limit("alice", "requests", 10.0)], T);
    l.ingest(&report("n1", 100, r#"{"alice": {"requests": 4}}"#, "{}"), T)
        .unwrap();
    l.ingest(&report("n1", 98, r#"{"alice": {"requests": 5}}"#, "{}"), T)
        .unwrap();
    assert_eq!(l.slot_sum("front", "alice", "requests", 97, false), 5);
    assert_eq!(l.slot_sum("front", "alice", "requests", 99, false), 4);
    assert_eq!(l.bucket_level("front", "alice", "requests", T), Some(1.0));
    let dist = monitor_distribution(&l, SlotRange::default(), T);
    assert_eq!(
        dist["front"]["alice"]["requests"]["nodes"]["n1"]["slot"], 99,
        "latest stays"
    );
}

/// A report of a gap, sent again after a reconnection, is charged first
/// to the refill the bucket's capacity turned away meanwhile: the gap
/// costs what was admitted in it less its refill.
#[test]
fn a_late_report_is_charged_to_the_refill_the_gap_spilled() {
    let mut l = Ledger::new(LedgerConfig::default());
    l.apply_limits("front", &[limit("alice", "requests", 10.0)], T);
    l.ingest(&report("n1", 100, "{}", "{}"), T).unwrap();
    // 20 s without a report: 200 of refill, 90 of it to the capacity.
    let now = T + 20_000;
    let gap = report("n1", 115, r#"{"alice": {"requests": 50}}"#, "{}");
    l.ingest(&gap, now).unwrap();
    assert_eq!(
        l.bucket_level("front", "alice", "requests", now),
        Some(100.0)
    );
    let on_time = report("n1", 120, r#"{"alice": {"requests": 30}}"#, "{}");
    l.ingest(&on_time, now).unwrap();
    assert_eq!(
        l.bucket_level("front", "alice", "requests", now),
        Some(70.0)
    );
}

/// A ledger without a checkpoint takes a report of a slot before its
/// first one only out of what its buckets start with, never into debt:
/// those were admitted on the refill of a ledger it has no record of (a
/// restart without `--state`). They are summed all the same.
#[test]
fn a_fresh_ledger_takes_the_reports_from_before_it_only_out_of_what_it_starts_with() {
    let mut l = Ledger::new(LedgerConfig::default());
    l.apply_limits("front", &[limit("alice", "requests", 10.0)], T);
    l.ingest(&report("n1", 100, r#"{"alice": {"requests": 4}}"#, "{}"), T)
        .unwrap();
    l.ingest(&report("n1", 97, r#"{"alice": {"requests": 9}}"#, "{}"), T)
        .unwrap();
    assert_eq!(l.bucket_level("front", "alice", "requests", T), Some(0.0));
    assert_eq!(l.slot_sum("front", "alice", "requests", 96, false), 9);
}

#[test]
fn whole_report_errors() {
    let mut l = Ledger::new(LedgerConfig {
        max_users_per_report: 1,
        ..LedgerConfig::default()
    });
    let far = report("n1", 100 + 61, "{}", "{}");
    assert!(matches!(
        l.ingest(&far, T),
        Err(ReportError::SlotOutOfRange { .. })
    ));
    let old = report("n1", 100 - 61, "{}", "{}");
    assert!(matches!(
        l.ingest(&old, T),
        Err(ReportError::SlotOutOfRange { .. })
    ));
    let anon = report("", 100, "{}", "{}");
    assert_eq!(l.ingest(&anon, T), Err(ReportError::BadNodeId));
    let long = report(&"n".repeat(MAX_NAME_LEN + 1), 100, "{}", "{}");
    assert_eq!(l.ingest(&long, T), Err(ReportError::BadNodeId));
    let many = report("n1", 100, r#"{"a": {"r": 1}, "b": {"r": 1}}"#, "{}");
    assert_eq!(
        l.ingest(&many, T),
        Err(ReportError::TooManyUsers { users: 2, max: 1 })
    );
}

#[test]
fn bad_entries_are_dropped_and_the_rest_kept() {
    let mut l = Ledger::new(LedgerConfig::default());
    let long = "u".repeat(MAX_NAME_LEN + 1);
    let r = report(
        "n1",
        100,
        &format!(
            r#"{{"ok": {{"requests": 2}}, "neg": {{"requests": -5}}, "{long}": {{"r": 1}}, "e": {{"": 1}}}}"#
        ),
        r#"{"ok": {"requests": 4294967295}, "absurd": {"requests": 4294967296}}"#,
    );
    let out = l.ingest(&r, T).unwrap();
    assert_eq!(out.entries, 2);
    let reasons: Vec<_> = out.dropped.examples().iter().map(|d| d.0).collect();
    assert_eq!(
        reasons
            .iter()
            .filter(|r| **r == DropReason::BadName)
            .count(),
        2
    );
    assert_eq!(
        reasons
            .iter()
            .filter(|r| **r == DropReason::NegativeAmount)
            .count(),
        1
    );
    assert_eq!(
        out.dropped
            .examples()
            .iter()
            .filter(|r| r.0 == DropReason::TooManyRejections)
            .map(|r| r.1.as_str())
            .collect::<Vec<_>>(),
        ["front/absurd/requests"]
    );
    assert_eq!(l.slot_sum("front", "ok", "requests", 99, false), 2);
    assert_eq!(
        l.slot_sum("front", "ok", "requests", 99, true),
        i64::from(u32::MAX),
        "the largest count kept"
    );
    assert_eq!(l.slot_sum("front", "absurd", "requests", 99, true), 0);
}

#[test]
fn absurd_amounts_and_slots_not_begun_are_refused() {
    let mut l = Ledger::new(LedgerConfig {
        max_amount: 1_000,
        ..LedgerConfig::default()
    });
    l.apply_limits("front", &[limit("alice", "requests", 100.0)], T);
    let huge = format!(
        r#"{{"alice": {{"requests": {}, "bytes": 1000}}}}"#,
        i64::MAX
    );
    let out = l.ingest(&report("n1", 100, &huge, "{}"), T).unwrap();
    assert_eq!(out.entries, 1, "the entry within the ceiling is filed");
    assert_eq!(
        out.dropped.examples(),
        [(
            DropReason::AmountTooLarge,
            "front/alice/requests".to_string()
        )]
    );
    let level = l.bucket_level("front", "alice", "requests", T).unwrap();
    assert!(level > 0.0, "nothing charged: {level}");
    // Data of the current slot (a report of the next) is filed; data of a
    // slot not yet begun is not.
    let next = report("n1", 101, r#"{"alice": {"requests": 1}}"#, "{}");
    assert!(l.ingest(&next, T).is_ok());
    let later = report("n1", 102, r#"{"alice": {"requests": 1}}"#, "{}");
    assert!(matches!(
        l.ingest(&later, T),
        Err(ReportError::SlotOutOfRange {
            slot: 102,
            current: 100,
            ..
        })
    ));
}

#[test]
fn debt_is_bounded_by_the_burst_unless_the_limit_says_otherwise() {
    let mut l = Ledger::new(LedgerConfig::default());
    let mut unbounded = limit("bob", "requests", 100.0);
    unbounded.max_debt_seconds = Some(f64::INFINITY);
    let mut short = limit("carol", "requests", 100.0);
    short.max_debt_seconds = Some(2.0);
    let mut none = limit("dave", "requests", 100.0);
    none.max_debt_seconds = Some(0.0);
    let limits = [limit("alice", "requests", 100.0), unbounded, short, none];
    l.apply_limits("front", &limits, T);
    let flood = r#"{"alice": {"requests": 1000000}, "bob": {"requests": 1000000}, "carol": {"requests": 1000000}, "dave": {"requests": 1000000}}"#;
    l.ingest(&report("n1", 100, flood, "{}"), T).unwrap();
    let level = |l: &mut Ledger, user| l.bucket_level("front", user, "requests", T).unwrap();
    assert_eq!(level(&mut l, "alice"), -1_000.0, "as deep as the capacity");
    assert_eq!(
        level(&mut l, "bob"),
        100.0 - 1_000_000.0,
        "the legacy system's"
    );
    assert_eq!(level(&mut l, "carol"), -200.0, "two seconds of rate");
    assert_eq!(level(&mut l, "dave"), 0.0, "no debt at all");
}

#[test]
fn new_services_past_the_cap_are_refused_and_the_rest_filed() {
    let mut l = Ledger::new(LedgerConfig {
        max_services: 2,
        ..LedgerConfig::default()
    });
    let n = l.node_id("n1");
    l.connect(n, ["a", "b", "c"], T);
    assert_eq!(l.services().collect::<Vec<_>>(), ["a", "b"]);
    let r = report_from_json(
        r#"{"node_id": "n1", "slot_number": 100, "consumption": {"a": {"u": {"r": 1}}, "d": {"u": {"r": 1}}}, "rejection": {"d": {"u": {"r": 1}}}}"#,
    )
    .unwrap();
    let out = l.ingest(&r, T).unwrap();
    assert_eq!(out.entries, 1);
    assert_eq!(
        out.dropped.examples(),
        [(DropReason::TooManyServices, "d".to_string())]
    );
    assert_eq!(l.services().count(), 2);
}

#[test]
fn new_keys_past_the_cap_are_refused_until_idle_ones_are_forgotten() {
    let mut l = Ledger::new(LedgerConfig {
        max_keys: 3,
        nr_slot: 5,
        ..LedgerConfig::default()
    });
    let flood = r#"{"a": {"requests": 1, "bytes": 1}, "b": {"requests": 1, "bytes": 1}}"#;
    let out = l.ingest(&report("n1", 100, flood, "{}"), T).unwrap();
    assert_eq!(out.entries, 3, "three keys fit");
    assert_eq!(out.dropped.count(DropReason::TooManyKeys), 1);
    assert_eq!(l.key_count(), 3);
    // Known keys are still filed at the cap.
    let again = l
        .ingest(&report("n1", 101, flood, "{}"), T + 1_000)
        .unwrap();
    assert_eq!((again.entries, again.dropped.total()), (3, 1));
    assert_eq!(l.slot_sum("front", "a", "bytes", 100, false), 1);
    // Once the history has passed, the idle keys go and new ones fit.
    l.forget(T + 10_000);
    let later = r#"{"c": {"requests": 1}}"#;
    let out = l
        .ingest(&report("n1", 110, later, "{}"), T + 10_000)
        .unwrap();
    assert_eq!((out.entries, out.dropped.total()), (1, 0));
}

#[test]
fn a_report_adds_up_per_service_and_resource_what_it_filed() {
    let mut l = Ledger::new(LedgerConfig::default());
    let r = report(
        "n1",
        100,
        r#"{"alice": {"requests": 3, "traffic_down": 700}, "bob": {"requests": 4}, "neg": {"requests": -1}}"#,
        r#"{"alice": {"requests": 9}}"#,
    );
    let out = l.ingest(&r, T).unwrap();
    let mut totals = out.totals.clone();
    totals.sort();
    let row = |r: &str, c, j| ("front".to_owned(), r.to_owned(), c, j);
    assert_eq!(
        totals,
        vec![row("requests", 7, 9), row("traffic_down", 700, 0)]
    );
    // A duplicate adds nothing.
    assert!(l.ingest(&r, T).unwrap().totals.is_empty());
}

/// A proxy lost with its central, on the restarted one: the seconds it
/// admitted while no stream took its reports are charged at the rate of
/// its first report back, out of the refill the buckets kept meanwhile,
/// never into debt; a proxy idle when it was lost has no such gap.
#[test]
fn a_proxy_back_on_a_restored_ledger_is_charged_for_the_slots_it_lost() {
    let used = |n: i64| format!(r#"{{"alice": {{"requests": {n}}}}}"#);
    let level_back = |p_filed: std::ops::Range<i64>| {
        let mut old = Ledger::new(LedgerConfig::default());
        old.apply_limits("front", &[limit("alice", "requests", 100.0)], T);
        let (n, p) = (old.node_id("n"), old.node_id("p"));
        old.connect(n, ["front"], T);
        old.connect(p, ["front"], T);
        old.reports_every(p, ["front"], 5_000);
        for slot in 100..110 {
            old.ingest(&report("n", slot + 1, "{}", "{}"), 110_050)
                .unwrap();
        }
        for slot in p_filed {
            let r = report("p", slot + 1, &used(20), "{}");
            old.ingest(&r, 110_050).unwrap();
        }
        let checkpoint = old.checkpoint(110_500);
        // 25 s later, on a new central: p is back 4 s after it started,
        // with its report of 134..=138 (200 a slot).
        let mut new = Ledger::new(LedgerConfig::default());
        new.apply_limits("front", &[limit("alice", "requests", 100.0)], 135_000);
        new.restore(&checkpoint, 135_000).unwrap();
        let p = new.node_id("p");
        new.connect(p, ["front"], 139_000);
        new.reports_every(p, ["front"], 5_000);
        for slot in 134..139 {
            let r = report("p", slot + 1, &used(200), "{}");
            new.ingest(&r, 139_050).unwrap();
        }
        new.bucket_level("front", "alice", "requests", 139_050)
            .unwrap()
    };
    // Filing up to slot 109 when lost: 110..=133 went unreported, charged
    // at 200 a slot (4,800) with the report's own 1,000 (admitted before
    // p was back): more than the refill kept over the outage and the full
    // bucket, which it empties, and no more.
    assert_eq!(level_back(100..110), 0.0);
    // Idle since slot 94: nothing is taken to be lost, and the refill kept
    // pays for the report.
    assert_eq!(level_back(90..95), 1_000.0);
}

/// A checkpoint lists only the buckets below their capacity: one it
/// leaves out was full when it was taken, and comes back full with the
/// refill of the time away kept for the nodes' late reports, as a listed
/// one does. Read as a bucket new at the restore, it started with a
/// second's worth and the late reports emptied it.
#[test]
fn a_bucket_left_out_of_a_checkpoint_comes_back_full_with_its_refill_kept() {
    let rules = [limit("alice", "requests", 100.0)];
    let mut old = Ledger::new(LedgerConfig::default());
    old.apply_limits("front", &rules, T);
    old.ingest(&report("n", 101, "{}", "{}"), T + 1_050)
        .unwrap();
    // 20 s on, alice's bucket (10 s of 100 a second) is full.
    let checkpoint = old.checkpoint(T + 20_000);
    assert!(checkpoint.services.iter().all(|s| s.buckets.is_empty()));
    let mut new = Ledger::new(LedgerConfig::default());
    new.apply_limits("front", &rules, T + 40_000);
    new.restore(&checkpoint, T + 40_000).unwrap();
    // n, back, sends what it admitted 15 s ago on its last quota.
    let late = report("n", 126, r#"{"alice": {"requests": 500}}"#, "{}");
    new.ingest(&late, T + 40_050).unwrap();
    let level = new.bucket_level("front", "alice", "requests", T + 40_050);
    assert_eq!(level, Some(1_000.0));
}

/// A user first heard of in a late report (a slot admitted while the
/// node's stream was down, sent again) was met in that slot: their
/// bucket starts there, and its refill since pays for what they were
/// admitted, as if the report had come on time. Met at its filing, the
/// bucket started with a second's worth and the report emptied it.
#[test]
fn a_user_first_heard_of_in_a_late_report_is_met_in_its_slot() {
    let mut l = Ledger::new(LedgerConfig::default());
    l.apply_limits("front", &[limit("*", "requests", 100.0)], T);
    l.ingest(&report("n", 100, "{}", "{}"), T + 50).unwrap();
    // 30 s on, n sends slot 110 again: bob's first 500.
    let late = report("n", 111, r#"{"bob": {"requests": 500}}"#, "{}");
    l.ingest(&late, T + 30_050).unwrap();
    let level = l.bucket_level("front", "bob", "requests", T + 30_050);
    assert_eq!(level, Some(1_000.0));
}

/// A central back without a checkpoint makes the keys of the users a rule
/// names at its start. A node's first report there of a slot before that
/// start (admitted while the central was away) is charged first to the
/// refill since that slot, which the nodes admitted on: the key's new
/// bucket keeps its start. Charged to the level, it emptied the bucket
/// (seed 2143: a minute's worth that never came back).
#[test]
fn slots_before_a_fresh_ledger_began_are_paid_by_their_refill() {
    let mut l = Ledger::new(LedgerConfig::default());
    l.apply_limits("front", &[limit("alice", "requests", 100.0)], T + 10_000);
    // n sends slot 105 (5 s before the ledger began): alice's 300.
    let kept = report("n", 106, r#"{"alice": {"requests": 300}}"#, "{}");
    l.ingest(&kept, T + 10_050).unwrap();
    let level = l.bucket_level("front", "alice", "requests", T + 10_050);
    assert!(level.is_some_and(|l| l >= 104.0), "{level:?}");
}
