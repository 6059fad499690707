//! The usage store's backends against the same suite: a real SQLite file,
//! and a real PostgreSQL started for the test (skipped, saying why, when
//! its binaries are missing, unless `THROTTLE_REQUIRE_SERVERS=1`).

use std::time::Duration;

use throttle_central::usage::{
    FiledUsage, Retention, RowsQuery, SqliteUsage, Step, TopQuery, UsageEntry, UsageStore, Written,
};
use throttle_test_servers::{Postgres, TempDir};

fn entry(user: &str, resource: &str, admitted: i64, refused: i64) -> UsageEntry {
    UsageEntry {
        service: "front".into(),
        user: user.into(),
        resource: resource.into(),
        admitted,
        refused,
    }
}

fn filed(node: &str, slot: i64, entries: Vec<UsageEntry>) -> FiledUsage {
    FiledUsage {
        node: node.into(),
        slot,
        start_s: slot,
        entries,
    }
}

/// A minute that starts an hour and a day.
const DAY: i64 = 1_795_737_600;

fn rows(
    store: &dyn UsageStore,
    step: Step,
    user: Option<&str>,
) -> Vec<(i64, String, String, i64, i64)> {
    let q = RowsQuery {
        step,
        service: "front".into(),
        user: user.map(str::to_owned),
        resource: None,
        from_s: DAY - 86_400,
        to_s: DAY + 86_400,
        after: None,
        limit: 100,
    };
    let rows = store.rows(&q).expect("rows read");
    rows.into_iter()
        .map(|r| (r.start_s - DAY, r.user, r.resource, r.admitted, r.refused))
        .collect()
}

fn suite(store: &dyn UsageStore) {
    let batch = [
        filed(
            "n1",
            DAY + 1,
            vec![
                entry("alice", "requests", 3, 1),
                entry("bob", "requests", 2, 0),
            ],
        ),
        filed(
            "n2",
            DAY + 1,
            vec![
                entry("alice", "requests", 4, 0),
                entry("alice", "bytes", 900, 0),
            ],
        ),
        filed("n1", DAY + 61, vec![entry("alice", "requests", 5, 2)]),
    ];
    let w = store.write(&batch).expect("written");
    assert_eq!(
        w,
        Written {
            reports: 3,
            repeated: 0,
            rows: 10
        }
    );
    // The same reports again (a replay after a failover), and a new one
    // among them: only the new one counts.
    let again = [
        batch[0].clone(),
        filed("n2", DAY + 62, vec![entry("bob", "requests", 1, 0)]),
        batch[2].clone(),
        filed("n2", DAY + 62, vec![entry("bob", "requests", 1, 0)]),
    ];
    let w = store.write(&again).expect("written");
    assert_eq!((w.reports, w.repeated), (1, 3));
    let minutes = rows(store, Step::Minute, None);
    let expected: Vec<(i64, String, String, i64, i64)> = [
        (0, "alice", "bytes", 900, 0),
        (0, "alice", "requests", 7, 1),
        (0, "bob", "requests", 2, 0),
        (60, "alice", "requests", 5, 2),
        (60, "bob", "requests", 1, 0),
    ]
    .into_iter()
    .map(|(s, u, r, a, f)| (s, u.to_owned(), r.to_owned(), a, f))
    .collect();
    assert_eq!(minutes, expected);
    let hours = rows(store, Step::Hour, Some("alice"));
    assert_eq!(
        hours,
        [
            (0, "alice".into(), "bytes".into(), 900, 0),
            (0, "alice".into(), "requests".into(), 12, 3)
        ]
    );
    assert_eq!(rows(store, Step::Day, Some("bob"))[0].3, 3);

    // Pages follow one another without a gap or a repeat.
    let mut q = RowsQuery {
        step: Step::Minute,
        service: "front".into(),
        user: None,
        resource: None,
        from_s: DAY,
        to_s: DAY + 120,
        after: None,
        limit: 2,
    };
    let mut paged = Vec::new();
    loop {
        let page = store.rows(&q).expect("a page");
        paged.extend(
            page.iter()
                .map(|r| (r.start_s - DAY, r.user.clone(), r.resource.clone())),
        );
        if page.len() < q.limit {
            break;
        }
        q.after = page.last().map(|r| r.cursor());
    }
    let all: Vec<_> = expected
        .iter()
        .map(|(s, u, r, ..)| (*s, u.clone(), r.clone()))
        .collect();
    assert_eq!(paged, all);

    let top = TopQuery {
        step: Step::Minute,
        service: "front".into(),
        resource: "requests".into(),
        from_s: DAY,
        to_s: DAY + 120,
        n: 1,
    };
    let heaviest = store.top(&top).expect("top");
    assert_eq!(heaviest.len(), 1);
    assert_eq!(
        (
            heaviest[0].user.as_str(),
            heaviest[0].admitted,
            heaviest[0].refused
        ),
        ("alice", 12, 3)
    );
    assert_eq!(
        store.resources(&top).expect("resources"),
        ["bytes", "requests"]
    );

    // Retention: minutes kept 1 minute, at DAY + 150 the first minute goes.
    let short = Retention {
        minutes: Duration::from_secs(60),
        ..Retention::default()
    };
    let deleted = store.prune(&short, DAY + 150).expect("pruned");
    assert_eq!(deleted, 3);
    assert_eq!(rows(store, Step::Minute, None).len(), 2);
    assert_eq!(rows(store, Step::Hour, None).len(), 3);
}

#[test]
fn the_sqlite_store_passes_the_suite() {
    let dir = TempDir::new("usage-sqlite");
    let store = SqliteUsage::open(&dir.path().join("usage.db")).expect("opened");
    suite(&store);
    drop(store);
    // Opened again, the rows are there.
    let store = SqliteUsage::open(&dir.path().join("usage.db")).expect("opened again");
    assert_eq!(rows(&store, Step::Hour, None).len(), 3);
}

#[test]
fn the_postgres_store_passes_the_suite() {
    let Some(pg) = Postgres::start("the_postgres_store_passes_the_suite") else {
        return;
    };
    let store = throttle_central::usage::PostgresUsage::open(&pg.url()).expect("connected");
    suite(&store);
}

/// Centrals of an election open the same database at once, and one may
/// start while the database is down: each writes once it is up.
#[test]
fn postgres_stores_open_together_and_before_the_database() {
    let test = "postgres_stores_open_together_and_before_the_database";
    let Some(mut pg) = Postgres::start(test) else {
        return;
    };
    pg.stop();
    let early = throttle_central::usage::PostgresUsage::open(&pg.url())
        .expect("opens while the database is down");
    let batch = [filed("n1", DAY + 1, vec![entry("alice", "requests", 3, 0)])];
    assert!(
        early.write(&batch).is_err(),
        "written to a stopped database"
    );
    pg.restart();
    let opening: Vec<_> = (0..4)
        .map(|i| {
            let url = pg.url();
            std::thread::spawn(move || {
                let store = throttle_central::usage::PostgresUsage::open(&url).expect("opened");
                let mine = [filed(
                    &format!("m{i}"),
                    DAY + 1,
                    vec![entry("bob", "requests", 1, 0)],
                )];
                store.write(&mine).expect("written").reports
            })
        })
        .collect();
    for t in opening {
        assert_eq!(t.join().expect("no panic"), 1);
    }
    assert_eq!(early.write(&batch).expect("written once up").reports, 1);
    let bob = rows(&early, Step::Minute, Some("bob"));
    assert_eq!(bob[0].3, 4);
}

/// `sslmode=require` connects over TLS, the server's certificate checked
/// against `sslrootcert`; the server refuses connections without TLS, and
/// a certificate from another root is refused.
#[test]
fn the_postgres_store_connects_over_tls() {
    let test = "the_postgres_store_connects_over_tls";
    let cert = rcgen::generate_simple_self_signed(vec!["127.0.0.1".into()]).expect("certificate");
    let (cert_pem, key_pem) = (cert.cert.pem(), cert.signing_key.serialize_pem());
    let Some(pg) = Postgres::start_tls(test, &cert_pem, &key_pem) else {
        return;
    };
    let dir = TempDir::new("usage-tls");
    let root = dir.path().join("root.pem");
    std::fs::write(&root, &cert_pem).expect("root written");
    let url = format!(
        "{}?sslmode=require&sslrootcert={}",
        pg.url(),
        root.display()
    );
    let store = throttle_central::usage::PostgresUsage::open(&url).expect("opened");
    let batch = [filed("n1", DAY + 1, vec![entry("alice", "requests", 3, 0)])];
    assert_eq!(store.write(&batch).expect("written over TLS").reports, 1);
    // Without TLS the server says no.
    let plain = throttle_central::usage::PostgresUsage::open(&pg.url()).expect("opened");
    assert!(plain.write(&batch).is_err(), "written without TLS");
    // Another root does not vouch for this server.
    let other = rcgen::generate_simple_self_signed(vec!["127.0.0.1".into()]).expect("certificate");
    let other_root = dir.path().join("other.pem");
    std::fs::write(&other_root, other.cert.pem()).expect("root written");
    let url = format!(
        "{}?sslmode=require&sslrootcert={}",
        pg.url(),
        other_root.display()
    );
    let stranger = throttle_central::usage::PostgresUsage::open(&url).expect("opened");
    assert!(
        stranger.write(&batch).is_err(),
        "trusted a certificate of another root"
    );
    // A root file that holds no certificate is refused at once.
    std::fs::write(dir.path().join("empty.pem"), "").expect("written");
    let url = format!(
        "{}?sslmode=require&sslrootcert={}",
        pg.url(),
        dir.path().join("empty.pem").display()
    );
    assert!(throttle_central::usage::PostgresUsage::open(&url).is_err());
}
