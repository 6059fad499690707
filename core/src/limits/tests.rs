//! Parsing, reloading and matching of limits.

use super::*;

const GOOD: &str = r#"
# demo
[[limit]]
service = "front"
user = "alice"
per_second = { requests = 100, traffic_down = 1048576 }

[[limit]]
service = "front"
user = "bob"
per_second = { requests = 2.5 }
burst_seconds = 3
"#;

#[test]
fn parses_entries_with_defaults() {
    let set = LimitSet::from_toml(GOOD).unwrap();
    assert_eq!(set.len(), 2);
    let alice = set.get("front", "alice").unwrap();
    assert_eq!(alice.per_second["traffic_down"], 1_048_576.0);
    assert_eq!(alice.burst_seconds, DEFAULT_BURST_SECONDS);
    assert_eq!(set.get("front", "bob").unwrap().burst_seconds, 3.0);
    assert!(LimitSet::from_toml("").unwrap().is_empty());
}

fn entry_error(body: &str) -> LimitsError {
    LimitSet::from_toml(&format!(
        "\n\n[[limit]]\nservice = \"front\"\nuser = \"u\"\n{body}\n"
    ))
    .unwrap_err()
}

#[test]
fn negative_nan_and_non_numeric_rates_name_the_line() {
    for body in [
        "per_second = { requests = -1 }",
        "per_second = { requests = nan }",
        "per_second = { requests = \"ten\" }",
        "per_second = { requests = 1 }\nburst_seconds = 0",
    ] {
        match entry_error(body) {
            LimitsError::Entry { line, .. } => assert_eq!(line, 3, "{body}"),
            e => panic!("{body}: {e}"),
        }
    }
}

/// A user named by several rules has them all: per resource and period a
/// rule naming the user alone outranks a list, and between lists the
/// lower rate wins.
#[test]
fn a_user_named_by_several_rules_has_them_all() {
    let text = r#"
[[limit]]
service = "front"
users = ["ann", "ben"]
per_second = { requests = 100, bytes = 1000 }
per_minute = { requests = 3000 }

[[limit]]
service = "front"
user = "ann"
per_second = { requests = 500 }
per_day = { requests = 100000 }
burst_seconds = 2

[[limit]]
service = "front"
users = ["ann"]
per_second = { requests = 50 }
per_minute = { requests = 2000 }
"#;
    let set = LimitSet::from_toml(text).unwrap();
    let of = |user: &str, resource: &str| {
        let limit = set.get("front", user).unwrap();
        Period::ALL
            .iter()
            .filter_map(|&p| {
                limit
                    .allowance(resource, p)
                    .map(|a| (p, a.amount().round()))
            })
            .collect::<Vec<_>>()
    };
    assert_eq!(
        of("ann", "requests"),
        [
            (Period::Second, 500.0),
            (Period::Minute, 2000.0),
            (Period::Day, 100_000.0)
        ],
        "her own second, the lower of the lists' minutes, her own day"
    );
    assert_eq!(of("ann", "bytes"), [(Period::Second, 1000.0)]);
    assert_eq!(set.get("front", "ann").unwrap().burst_seconds, 2.0);
    assert_eq!(
        of("ben", "requests"),
        [(Period::Second, 100.0), (Period::Minute, 3000.0)]
    );
}

#[test]
fn bad_names_are_refused() {
    let e = LimitSet::from_toml("[[limit]]\nservice = \"\"\nuser = \"u\"\nper_second = {}\n")
        .unwrap_err();
    assert!(matches!(e, LimitsError::Entry { line: 1, .. }), "{e}");
}

#[test]
fn bad_toml_names_the_line() {
    let e = LimitSet::from_toml("[[limit]]\nservice = \"front\"\nuser = \n").unwrap_err();
    assert!(matches!(e, LimitsError::Syntax { line: 3, .. }), "{e}");
    let e = LimitSet::from_toml(
        "[[limit]]\nservice = \"f\"\nuser = \"u\"\nper_second = {}\ncolour = 1\n",
    )
    .unwrap_err();
    assert!(e.to_string().contains("colour"), "{e}");
}

#[test]
fn absurd_rates_and_bursts_are_refused() {
    for body in [
        "per_second = { requests = 1e300 }",
        "per_second = { requests = 1.1e15 }",
        "per_second = { requests = inf }",
        "per_second = { requests = 1 }\nburst_seconds = 1e300",
        "per_second = { requests = 1 }\nburst_seconds = inf",
    ] {
        match entry_error(body) {
            LimitsError::Entry { line, .. } => assert_eq!(line, 3, "{body}"),
            e => panic!("{body}: {e}"),
        }
    }
    let most = "[[limit]]\nservice = \"s\"\nuser = \"u\"\nper_second = { r = 1e15 }\nburst_seconds = 1e9\n";
    assert!(LimitSet::from_toml(most).is_ok());
}

proptest::proptest! {
    /// Text from outside, whatever it is, parses or is refused with a
    /// message: never a panic.
    #[test]
    fn arbitrary_text_is_parsed_or_refused(text in "\\PC{0,300}") {
        if let Err(e) = LimitSet::from_toml(&text) {
            proptest::prop_assert!(!e.to_string().is_empty());
        }
    }

    /// The same for a real limits file cut short and carried on with
    /// arbitrary text, which gets past the first lines.
    #[test]
    fn damaged_files_are_parsed_or_refused(cut in 0usize..200, tail in "\\PC{0,80}") {
        let mut cut = cut.min(GOOD.len());
        while !GOOD.is_char_boundary(cut) {
            cut -= 1;
        }
        let text = format!("{}{tail}", &GOOD[..cut]);
        if let Err(e) = LimitSet::from_toml(&text) {
            proptest::prop_assert!(!e.to_string().is_empty());
        }
    }
}

const RULES: &str = r#"
[[limit]]
service = "front"
user = "*"
per_second = { requests = 100, traffic_down = "50MiB" }

[[limit]]
service = "front"
users = ["alice", "bob"]
per_minute = { requests = 6000 }
per_day = { requests = 1000000 }

[[limit]]
service = "front"
user = "carol"
per_second = { requests = 1000 }
burst_seconds = 2
per_hour = { requests = 36000 }
"#;

#[test]
fn rules_name_every_user_several_users_and_periods() {
    let set = LimitSet::from_toml(RULES).unwrap();
    assert_eq!(set.len(), 4, "*, alice, bob, carol");
    let every = set.get("front", EVERY_USER).unwrap();
    assert!(every.is_every_user());
    assert_eq!(every.per_second["traffic_down"], 50.0 * 1_048_576.0);
    let alice = set.get("front", "alice").unwrap();
    assert_eq!(
        set.get("front", "bob").unwrap().per_period,
        alice.per_period
    );
    let minute = alice.allowance("requests", Period::Minute).unwrap();
    assert_eq!(
        (minute.rate, minute.burst_seconds),
        (100.0, 60.0),
        "the whole minute at once"
    );
    let day = alice.allowance("requests", Period::Day).unwrap();
    assert_eq!(day.amount(), 1e6);
    assert_eq!(day.burst_seconds, 86_400.0);
    assert_eq!(alice.allowance("requests", Period::Second), None);
    // burst_seconds is the per-second period's: carol's hour may still be
    // spent at any pace.
    let carol = set.get("front", "carol").unwrap();
    assert_eq!(carol.burst_seconds, 2.0);
    assert_eq!(
        carol
            .allowance("requests", Period::Hour)
            .unwrap()
            .burst_seconds,
        3_600.0
    );
    let resources: Vec<&str> = carol.resources().collect();
    assert_eq!(resources, ["requests"]);
}

#[test]
fn a_users_own_rule_and_the_every_user_rule_apply_period_by_period() {
    let set = LimitSet::from_toml(RULES).unwrap();
    let every = set.get("front", EVERY_USER);
    let periods = |user: &str, resource: &str| {
        let r = resolve(set.get("front", user), every, resource);
        r.allowances
            .iter()
            .map(|a| (a.period, a.amount()))
            .collect::<Vec<_>>()
    };
    // alice: the * rule's second, her own minute and day.
    assert_eq!(
        periods("alice", "requests"),
        [
            (Period::Second, 100.0),
            (Period::Minute, 6000.0),
            (Period::Day, 1e6)
        ]
    );
    // carol's own second wins over *'s.
    assert_eq!(
        periods("carol", "requests"),
        [(Period::Second, 1000.0), (Period::Hour, 36000.0)]
    );
    // Someone never named: the * rule alone; a resource nobody limits:
    // nothing.
    assert_eq!(
        periods("dave", "traffic_down"),
        [(Period::Second, 50.0 * 1_048_576.0)]
    );
    assert!(periods("dave", "database_read").is_empty());
    let none = resolve(None, None, "requests");
    assert!(none.allowances.is_empty());
}

#[test]
fn bad_rules_name_their_line_and_what_is_wrong() {
    let cases = [
        (
            "user = \"a\"\nusers = [\"b\"]\nper_second = { r = 1 }",
            "either user or users",
        ),
        ("per_second = { r = 1 }", "either user or users"),
        ("users = []\nper_second = { r = 1 }", "nobody"),
        (
            "users = [\"a\", \"*\"]\nper_second = { r = 1 }",
            "rule of its own",
        ),
        ("user = \"a\"", "per_second, per_minute"),
        (
            "user = \"a\"\nper_minute = { r = \"5 parsecs\" }",
            "unknown unit",
        ),
        ("user = \"a\"\nper_day = { r = -1 }", "per_day \"r\""),
        ("user = \"a\"\nper_hour = { r = 1e300 }", "from 0 to"),
    ];
    for (body, says) in cases {
        let text = format!("# limits\n\n[[limit]]\nservice = \"front\"\n{body}\n");
        match LimitSet::from_toml(&text) {
            Err(e @ LimitsError::Entry { line: 3, .. }) => {
                assert!(e.to_string().contains(says), "{body}: {e}");
            }
            other => panic!("{body}: {other:?}"),
        }
    }
}

#[test]
fn limits_show_as_json_per_period() {
    let set = LimitSet::from_toml(RULES).unwrap();
    let alice = serde_json::to_value(set.get("front", "alice").unwrap()).unwrap();
    assert_eq!(alice["per_minute"]["requests"], 6000.0);
    assert_eq!(alice["per_day"]["requests"], 1e6);
    assert!(alice.get("per_hour").is_none());
}

#[test]
fn the_example_file_parses() {
    let text = include_str!("../../../examples/limits.toml");
    let set = LimitSet::from_toml(text).unwrap();
    assert!(set.get("front", EVERY_USER).is_some());
    // Each user as the file's comments say: (period, amount, burst
    // seconds) per resource, the "*" rule's where theirs is silent.
    let effective = |user: &str, resource: &str| effective(&set, user, resource);
    const MIB: f64 = 1_048_576.0;
    let stranger = effective("stranger", "requests");
    assert_eq!(stranger, [(Period::Second, 100.0, 10.0)]);
    assert_eq!(
        effective("alice", "requests"),
        [(Period::Second, 200.0, 2.0), (Period::Day, 1e7, 86_400.0)]
    );
    assert_eq!(
        effective("alice", "traffic_down"),
        [(Period::Second, 100.0 * MIB, 2.0)],
        "more than a stranger's 50 MiB"
    );
    assert_eq!(
        effective("bob", "requests"),
        [
            (Period::Second, 1000.0, 10.0),
            (Period::Minute, 12_000.0, 60.0)
        ],
        "12,000 a minute, at up to 1,000 a second"
    );
    assert_eq!(
        effective("dave", "traffic_down"),
        [(Period::Second, 50.0 * MIB, 10.0)]
    );
    assert_eq!(
        effective("dave", "traffic_up"),
        [(Period::Second, MIB, 10.0)]
    );
    let media = set.hierarchy("media").unwrap();
    assert_eq!(media.apps.len(), 2);
    assert_eq!(media.app_of("reindex"), Some(1));
}

#[test]
fn a_service_may_name_its_policy() {
    let text = "[service.front]\npolicy = \"classic\"\n\n[[limit]]\nservice = \"front\"\nuser = \"a\"\nper_second = { r = 1 }\n";
    let set = LimitSet::from_toml(text).unwrap();
    assert_eq!(set.policy("front").as_deref(), Some("classic"));
    assert_eq!(set.policy("back"), None);
    let only = LimitSet::from_toml("[service.back]\npolicy = \"static-split\"\n").unwrap();
    assert_eq!(
        only.services(),
        ["back"],
        "a service with settings only is listed"
    );
    let e = LimitSet::from_toml("# x\n[service.front]\npolicy = \"fastest\"\n").unwrap_err();
    assert!(matches!(e, LimitsError::Syntax { line: 2, .. }), "{e}");
    assert!(
        e.to_string().contains("projected, classic, static-split"),
        "{e}"
    );
}

#[test]
fn blocks_name_users_and_may_end() {
    let text = r#"
[[block]]
service = "front"
users = ["mallory", "trudy"]
until = 2026-12-01T00:00:00Z
reason = "scraping"

[[block]]
service = "front"
user = "eve"
"#;
    let set = LimitSet::from_toml(text).unwrap();
    assert!(!set.is_empty(), "blocks only is not an empty file");
    let blocks = set.blocks();
    let front = &blocks["front"];
    assert_eq!(front["mallory"].until_ms, Some(1_796_083_200_000));
    assert_eq!(front["trudy"].reason, "scraping");
    assert_eq!(front["eve"].until_ms, None);
    let now = blocked_at(&blocks, 1_796_083_200_000);
    assert_eq!(now["front"], ["eve"], "the others' blocks ended");
    for (body, says) in [
        ("user = \"*\"", "not \"*\""),
        (
            "user = \"a\"\nuntil = 2026-12-01",
            "needs a date, a time and an offset",
        ),
        ("user = \"a\"\nuntil = 5", "date and time"),
        ("users = []", "nobody"),
    ] {
        let text = format!("# x\n[[block]]\nservice = \"front\"\n{body}\n");
        match LimitSet::from_toml(&text) {
            Err(e @ LimitsError::Entry { line: 2, .. }) => {
                assert!(e.to_string().contains(says), "{body}: {e}");
            }
            other => panic!("{body}: {other:?}"),
        }
    }
}

const APPS: &str = r#"
[service.front]
capacity = { requests = 10000, traffic_down = "1GiB" }

[[app]]
service = "front"
name = "video"
users = ["video-*", "vlc"]
priority = 0
guaranteed = { requests = 2000 }
burst = { requests = 8000 }
burst_seconds = 60

[[app]]
service = "front"
name = "video-live"
users = ["video-live-*"]
priority = 1
guaranteed = { requests = 1000 }
"#;

#[test]
fn applications_share_a_capacity_and_take_the_hierarchical_policy() {
    let set = LimitSet::from_toml(APPS).unwrap();
    let h = set.hierarchy("front").unwrap();
    assert_eq!(h.capacity["traffic_down"], 1_073_741_824.0);
    assert_eq!(set.policy("front").as_deref(), Some(HIERARCHICAL));
    assert_eq!(set.services(), vec!["front".to_string()]);
    let video = &h.apps[0];
    assert_eq!(
        (video.guaranteed("requests"), video.ceiling("requests")),
        (2000.0, 8000.0)
    );
    let live = &h.apps[1];
    assert_eq!(live.ceiling("requests"), 1000.0, "no burst: the guarantee");
    assert_eq!(live.burst_seconds, DEFAULT_APP_BURST_SECONDS);
    assert_eq!(h.app_of("vlc"), Some(0));
    assert_eq!(h.app_of("video-1"), Some(0));
    assert_eq!(h.app_of("video-live-9"), Some(1), "the longest prefix");
    assert_eq!(h.app_of("carol"), None);
}

#[test]
fn bad_applications_are_refused_with_their_line() {
    let app = |body: &str| format!("{APPS}\n[[app]]\nservice = \"front\"\nname = \"x\"\n{body}\n");
    for (body, says) in [
        (
            "users = [\"a\"]\nguaranteed = { bytes = 1 }",
            "does not name",
        ),
        (
            "users = [\"a\"]\nguaranteed = { requests = 5 }\nburst = { requests = 4 }",
            "below",
        ),
        ("users = [\"vlc\"]", "another application"),
        ("users = []", "nobody"),
        ("users = [\"a*b\"]", "may only end"),
        ("users = [\"a\"]\npriority = -1", "priority"),
        ("users = [\"a\"]\nburst_seconds = 0", "burst_seconds"),
    ] {
        let e = LimitSet::from_toml(&app(body)).unwrap_err();
        assert!(e.to_string().contains(says), "{body}: {e}");
        assert!(e.to_string().contains("line 21"), "{body}: {e}");
    }
    let orphan = "[[app]]\nservice = \"back\"\nname = \"x\"\nusers = [\"a\"]\n";
    let e = LimitSet::from_toml(orphan).unwrap_err();
    assert!(e.to_string().contains("no capacity"), "{e}");
    let classic = "[service.front]\npolicy = \"classic\"\ncapacity = { requests = 1 }\n";
    let e = LimitSet::from_toml(classic).unwrap_err();
    assert!(e.to_string().contains("hierarchical"), "{e}");
}

/// `burst_seconds` as a table sets each period's capacity; left out, a
/// longer period's is its whole amount; as a number, it is the second's.
#[test]
fn each_period_has_its_own_burst() {
    let rule = |extra: &str| {
        let toml = format!(
            "[[limit]]\nservice = \"s\"\nuser = \"u\"\nper_second = {{ r = 200 }}\nper_minute = {{ r = 6000 }}\nper_day = {{ r = 10000000 }}\n{extra}"
        );
        LimitSet::from_toml(&toml).map(|set| set.get("s", "u").cloned().unwrap())
    };
    let u = rule("burst_seconds = { second = 2, minute = 30 }").unwrap();
    assert_eq!(u.burst_seconds, 2.0);
    assert_eq!(
        u.allowance("r", Period::Minute).unwrap().burst_seconds,
        30.0
    );
    assert_eq!(
        u.allowance("r", Period::Day).unwrap().burst_seconds,
        86_400.0
    );
    let u = rule("burst_seconds = 2").unwrap();
    assert_eq!(
        u.allowance("r", Period::Minute).unwrap().burst_seconds,
        60.0
    );
    let unknown = rule("burst_seconds = { week = 3 }").unwrap_err();
    assert!(unknown.to_string().contains("week"), "{unknown}");
    let zero = rule("burst_seconds = { minute = 0 }").unwrap_err();
    assert!(zero.to_string().contains("> 0"), "{zero}");
}

/// The limits examples of the central guide parse, and its first one does
/// what the text beside it says: alice's and bob's minute and day may be
/// spent at any pace, their second is the `*` rule's.
#[test]
fn the_guides_limits_examples_are_true() {
    let guide = include_str!("../../../docs/guides/central.md");
    let blocks: Vec<&str> = guide
        .split("```toml\n")
        .skip(1)
        .filter_map(|b| b.split("```").next())
        .collect();
    assert_eq!(blocks.len(), 2, "the guide's toml blocks");
    for block in &blocks {
        if let Err(e) = LimitSet::from_toml(block) {
            panic!("{e}\n{block}");
        }
    }
    let set = LimitSet::from_toml(blocks[0]).unwrap();
    let periods = |user: &str| effective(&set, user, "requests");
    let whole = [
        (Period::Second, 100.0, 10.0),
        (Period::Minute, 6000.0, 60.0),
        (Period::Day, 1e6, 86_400.0),
    ];
    assert_eq!(periods("alice"), whole);
    assert_eq!(periods("bob"), whole);
    assert!(
        set.hierarchy("media").is_none(),
        "the first block has no app"
    );
    let media = LimitSet::from_toml(blocks[1]).unwrap();
    assert_eq!(media.hierarchy("media").unwrap().apps.len(), 1);
}

proptest::proptest! {
    /// However many rules name a user, in whatever order: a rule of the
    /// user alone sets the rate, else the lowest of the lists'.
    #[test]
    fn the_rule_alone_then_the_lowest_list_sets_the_rate(
        lists in proptest::collection::vec(1u32..1000, 0..4),
        alone in proptest::option::of(1u32..1000),
        alone_at in 0usize..4,
    ) {
        proptest::prop_assume!(!lists.is_empty() || alone.is_some());
        let list_rule = |rate: u32| {
            format!("[[limit]]\nservice = \"s\"\nusers = [\"u\", \"v\"]\nper_second = {{ r = {rate} }}\n\n")
        };
        let mut rules: Vec<String> = lists.iter().map(|&r| list_rule(r)).collect();
        if let Some(rate) = alone {
            let rule = format!("[[limit]]\nservice = \"s\"\nuser = \"u\"\nper_second = {{ r = {rate} }}\n\n");
            rules.insert(alone_at.min(rules.len()), rule);
        }
        let set = LimitSet::from_toml(&rules.concat()).unwrap();
        let want = alone.or_else(|| lists.iter().copied().min()).unwrap();
        proptest::prop_assert_eq!(set.get("s", "u").unwrap().per_second["r"], f64::from(want));
        if let Some(lowest) = lists.iter().copied().min() {
            proptest::prop_assert_eq!(set.get("s", "v").unwrap().per_second["r"], f64::from(lowest));
        }
    }
}

/// What limits `user`'s `resource` in service `front` of `set`, the `*`
/// rule's where theirs is silent: (period, amount, burst seconds).
fn effective(set: &LimitSet, user: &str, resource: &str) -> Vec<(Period, f64, f64)> {
    let every = set.get("front", EVERY_USER);
    let r = resolve(set.get("front", user), every, resource);
    (r.allowances.iter())
        .map(|a| (a.period, a.amount(), a.burst_seconds))
        .collect()
}

#[test]
fn a_service_names_its_envoy_user_key() {
    let set = LimitSet::from_toml("[service.front]\nenvoy_user_key = \"api_key\"\n").unwrap();
    assert_eq!(set.envoy_user_key("front").as_deref(), Some("api_key"));
    assert_eq!(set.envoy_user_key("other"), None);
    let empty = LimitSet::from_toml("[service.front]\nenvoy_user_key = \"\"\n").unwrap_err();
    assert!(empty.to_string().contains("envoy_user_key"), "{empty}");
}
