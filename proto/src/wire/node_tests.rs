use proptest::prelude::*;

use super::answer::*;
use super::quota_encoder::*;
use super::raw_quota::*;
use super::report_encoder::*;
use crate::v1;
use prost::Message;

use crate::v1::central_message::Kind;

/// (service, slot, users with their (resource, quota bits)).
type Table = (String, i64, Vec<(String, Vec<(String, u64)>)>);

fn raw_tables(q: &RawQuota) -> Vec<Table> {
    q.tables()
        .map(|(service, slot, users)| {
            let users = users
                .map(|(u, r)| {
                    (
                        u.to_owned(),
                        r.map(|(r, q)| (r.to_owned(), q.to_bits())).collect(),
                    )
                })
                .collect();
            (service.to_owned(), slot, users)
        })
        .collect()
}

fn prost_tables(q: &v1::Quota) -> Vec<Table> {
    let mut out = Vec::new();
    for (service, sq) in &q.services {
        for (slot, users) in &sq.slots {
            let users = users
                .users
                .iter()
                .map(|(u, rq)| {
                    let r = rq
                        .resources
                        .iter()
                        .map(|(r, q)| (r.clone(), q.to_bits()))
                        .collect();
                    (u.clone(), r)
                })
                .collect();
            out.push((service.clone(), *slot, users));
        }
    }
    out
}

fn name() -> impl Strategy<Value = String> {
    // Long enough names need two-byte lengths.
    prop_oneof![".{0,12}", ".{120,300}"]
}

fn quota_value() -> impl Strategy<Value = f64> {
    prop_oneof![0.0..1e6f64, any::<f64>()]
}

fn quota() -> impl Strategy<Value = v1::Quota> {
    let resources = proptest::collection::btree_map(name(), quota_value(), 0..4)
        .prop_map(|resources| v1::ResourceQuotas { resources });
    let users = proptest::collection::btree_map(name(), resources, 0..6)
        .prop_map(|users| v1::UserQuotas { users });
    let slots = proptest::collection::btree_map(any::<i64>(), users, 0..3)
        .prop_map(|slots| v1::ServiceQuota { slots });
    let refs = proptest::collection::vec(
        (name(), any::<i64>(), any::<i64>()).prop_map(|(service, slot, from_slot)| v1::QuotaRef {
            service,
            slot,
            from_slot,
        }),
        0..3,
    );
    (
        proptest::collection::btree_map(name(), slots, 0..3),
        any::<Option<i64>>(),
        refs,
    )
        .prop_map(|(services, report_slot, refs)| v1::Quota {
            services,
            report_slot,
            packed: Vec::new(),
            refs,
        })
}

/// A quota's refs as (service, slot, from slot).
fn prost_refs(q: &v1::Quota) -> Vec<(String, i64, i64)> {
    q.refs
        .iter()
        .map(|r| (r.service.clone(), r.slot, r.from_slot))
        .collect()
}

fn raw_refs(q: &RawQuota) -> Vec<(String, i64, i64)> {
    q.refs().map(|(s, a, b)| (s.to_owned(), a, b)).collect()
}

proptest! {
    /// A quota prost wrote reads in place as prost reads it.
    #[test]
    fn reads_as_prost_decodes(q in quota()) {
        let bytes = q.encode_to_vec();
        let raw = RawQuota::parse(&bytes).expect("valid");
        // As prost reads it back: a quota of -0.0 is not written, and
        // reads as 0.0.
        let decoded = v1::Quota::decode(&bytes[..]).expect("valid");
        prop_assert_eq!(raw.report_slot(), decoded.report_slot);
        prop_assert_eq!(raw_tables(&raw), prost_tables(&decoded));
        prop_assert_eq!(raw_refs(&raw), prost_refs(&decoded));
    }

    /// A quota as the central writes it ([`QuotaEncoder`]) reads in
    /// place as prost reads it.
    #[test]
    fn reads_the_centrals_encoding_as_prost_decodes_it(q in quota()) {
        let bytes = encode_tables(&q, |_| false);
        let Ok(Answer::Quota(quota)) = Answer::decode(&bytes[..]) else {
            panic!("not a quota");
        };
        let raw = RawQuota::parse(&quota);
        let decoded = v1::Quota::decode(&quota[..]).expect("valid");
        match raw {
            Ok(raw) => {
                prop_assert_eq!(raw.report_slot(), decoded.report_slot);
                prop_assert_eq!(raw_tables(&raw), prost_tables(&decoded));
                prop_assert_eq!(raw_refs(&raw), prost_refs(&decoded));
                prop_assert_eq!(prost_refs(&decoded), prost_refs(&q));
            }
            // The encoder writes a service once per slot begun.
            Err(e) => prop_assert!(
                e == RawQuotaError::Repeated && q.services.values().any(|s| s.slots.len() > 1),
                "{e}"
            ),
        }
    }

    /// A quota the central writes with packed tables (some or all)
    /// reads in place as the quota it stands for, amounts as the
    /// `f32`s it keeps, and as prost reads it once unpacked.
    #[test]
    fn packed_tables_read_as_the_quota_they_stand_for(
        q in quota(),
        packed in proptest::collection::vec(any::<bool>(), 3),
    ) {
        let bytes = encode_tables(&q, |i| packed[i]);
        // The content, with the amounts of packed tables as the f32s
        // they keep.
        let mut kept = q.clone();
        for (sq, &pack) in kept.services.values_mut().zip(&packed) {
            let amounts = sq.slots.values_mut().flat_map(|u| u.users.values_mut());
            for a in amounts.flat_map(|rq| rq.resources.values_mut()).filter(|_| pack) {
                *a = f64::from(crate::f32_at_most(*a));
            }
        }
        let expected = prost_tables(&kept);
        let Ok(Answer::Quota(quota)) = Answer::decode(&bytes[..]) else {
            panic!("not a quota");
        };
        let mut decoded = v1::Quota::decode(&quota[..]).expect("valid");
        prop_assert_eq!(decoded.unpack(), Ok(()));
        match RawQuota::parse(&quota) {
            Ok(raw) => {
                prop_assert_eq!(raw.report_slot(), q.report_slot);
                let mut tables = raw_tables(&raw);
                tables.sort_by(|a, b| (&a.0, a.1).cmp(&(&b.0, b.1)));
                prop_assert_eq!(&tables, &expected);
                prop_assert_eq!(prost_tables(&decoded), expected);
            }
            Err(e) => prop_assert!(
                e == RawQuotaError::Repeated && q.services.values().any(|s| s.slots.len() > 1),
                "{e}"
            ),
        }
    }

    /// Whatever the bytes of a packed quota: read in place only where
    /// prost decodes and unpacks them too, and then to the same tables;
    /// refused as malformed only where one of those fails.
    #[test]
    fn any_packed_bytes_read_as_prost_reads_them_or_not_at_all(
        q in quota(),
        cut in any::<prop::sample::Index>(),
        flip in any::<prop::sample::Index>(),
        byte in any::<u8>(),
    ) {
        let bytes = encode_tables(&q, |_| true);
        let Ok(Answer::Quota(quota)) = Answer::decode(&bytes[..]) else {
            panic!("not a quota");
        };
        let mut bytes = quota.to_vec();
        if !bytes.is_empty() {
            let at = flip.index(bytes.len());
            bytes[at] = byte;
            bytes.truncate(cut.index(bytes.len() + 1).max(at));
        }
        let decoded = v1::Quota::decode(&bytes[..]).map_err(|_| ()).and_then(|mut d| {
            d.unpack().map_err(|_| ())?;
            Ok(d)
        });
        match RawQuota::parse(&bytes) {
            Ok(raw) => {
                let decoded = decoded.expect("read in place, so prost reads it");
                prop_assert_eq!(raw.report_slot(), decoded.report_slot);
                let mut tables = raw_tables(&raw);
                tables.sort_by(|a, b| (&a.0, a.1).cmp(&(&b.0, b.1)));
                prop_assert_eq!(tables, prost_tables(&decoded));
            }
            Err(RawQuotaError::Malformed(_)) => prop_assert!(decoded.is_err()),
            Err(RawQuotaError::Repeated) => {
                prop_assert!(v1::Quota::decode(&bytes[..]).is_ok());
            }
        }
    }

    /// Whatever the bytes: read in place only where prost decodes them
    /// too, and then to the same tables; refused as malformed only
    /// where prost fails.
    #[test]
    fn any_bytes_read_as_prost_reads_them_or_not_at_all(
        q in quota(),
        cut in any::<prop::sample::Index>(),
        flip in any::<prop::sample::Index>(),
        byte in any::<u8>(),
    ) {
        let mut bytes = q.encode_to_vec();
        if !bytes.is_empty() {
            let at = flip.index(bytes.len());
            bytes[at] = byte;
            bytes.truncate(cut.index(bytes.len() + 1).max(at));
        }
        let decoded = v1::Quota::decode(&bytes[..]);
        match RawQuota::parse(&bytes) {
            Ok(raw) => {
                let decoded = decoded.expect("read in place, so prost decodes it");
                prop_assert_eq!(raw.report_slot(), decoded.report_slot);
                prop_assert_eq!(raw_tables(&raw), prost_tables(&decoded));
            }
            Err(RawQuotaError::Malformed(_)) => prop_assert!(decoded.is_err()),
            Err(RawQuotaError::Repeated) => prop_assert!(decoded.is_ok()),
        }
    }

    /// The message kinds a node receives decode as prost decodes them,
    /// the quota kept as its bytes.
    #[test]
    fn answers_decode_as_central_messages(q in quota(), epoch in any::<u64>(), leader in name()) {
        for kind in [
            Kind::Quota(q.clone()),
            Kind::Welcome(v1::Welcome { slot_ms: 1000, epoch, accepts: vec![crate::PACKED_REPORTS.into()], incarnation: epoch }),
            Kind::NotLeader(v1::NotLeader { leader: leader.clone() }),
            Kind::Blocks(v1::Blocks { service: leader.clone(), users: vec![leader.clone(), "b".into()] }),
            Kind::Limits(v1::Limits {
                service: leader.clone(),
                default_quota: [(leader.clone(), 33.5)].into(),
                every: vec![v1::Allowance { resource: "requests".into(), window_seconds: 60, amount: 6000.0 }],
                users: vec![v1::UserLimits { user: leader.clone(), allowances: Vec::new(), default_quota: [("requests".into(), 3.0)].into() }],
                users_truncated: false,
                newcomers: [("requests".into(), 40.0)].into(),
            }),
            Kind::Bound(v1::Bound {
                service: leader.clone(),
                keys: vec![v1::BoundKey { user: leader.clone(), resource: "requests".into(), window_seconds: 60 }],
                budgets: vec![v1::Budget { user: leader.clone(), resource: "requests".into(), window_seconds: 3600, remaining: 200.5, nodes: 2, refill: 0.5 }],
            }),
        ] {
            let bytes = v1::CentralMessage { kind: Some(kind.clone()) }.encode_to_vec();
            let answer = Answer::decode(&bytes[..]).expect("valid");
            match (kind, &answer) {
                (Kind::Quota(q), Answer::Quota(b)) => prop_assert_eq!(&b[..], &q.encode_to_vec()[..]),
                (Kind::Welcome(w), Answer::Welcome(a)) => prop_assert_eq!(&w, a),
                (Kind::NotLeader(n), Answer::NotLeader(a)) => prop_assert_eq!(&n, a),
                (Kind::Blocks(b), Answer::Blocks(a)) => prop_assert_eq!(&b, a),
                (Kind::Limits(l), Answer::Limits(a)) => prop_assert_eq!(&l, a),
                (Kind::Bound(b), Answer::Bound(a)) => prop_assert_eq!(&b, a),
                (kind, answer) => prop_assert!(false, "{kind:?} read as {answer:?}"),
            }
            prop_assert_eq!(answer.encode_to_vec(), bytes);
        }
    }
}

fn usage() -> impl Strategy<Value = v1::Usage> {
    let amount = prop_oneof![0i64..300, any::<i64>()];
    let amounts = proptest::collection::btree_map(name(), amount, 0..4)
        .prop_map(|resources| v1::Amounts { resources });
    proptest::collection::btree_map(name(), amounts, 0..5).prop_map(|users| v1::Usage { users })
}

proptest! {
    /// The encoders write a report byte for byte as prost writes it.
    #[test]
    fn reports_encode_as_prost_encodes_them(
        node_id in name(),
        slot_number in prop_oneof![Just(0i64), any::<i64>()],
        services in proptest::collection::btree_map(name(), (usage(), usage()), 0..3),
    ) {
        let mut report = ReportEncoder::new();
        for (service, (consumption, rejection)) in &services {
            let encode = |usage: &v1::Usage| {
                let mut e = UsageEncoder::new();
                for (user, amounts) in &usage.users {
                    e.user(user, amounts.resources.iter().map(|(r, a)| (r.as_str(), *a)));
                }
                e
            };
            report.service(service, &encode(consumption), &encode(rejection));
        }
        let built = v1::Report {
            node_id: node_id.clone(),
            slot_number,
            consumption: services.iter().map(|(s, (c, _))| (s.clone(), c.clone())).collect(),
            rejection: services.iter().map(|(s, (_, r))| (s.clone(), r.clone())).collect(),
            packed: Vec::new(),
            answered: false,
        };
        prop_assert_eq!(&report.finish(&node_id, slot_number)[..], &built.encode_to_vec()[..]);
    }
}

fn entry(key: &[u8], value: &[u8]) -> Vec<u8> {
    [key, value].concat()
}

fn delimited(field: u32, body: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    prost::encoding::bytes::encode(field, &body.to_vec(), &mut out);
    out
}

#[test]
fn a_service_given_twice_is_left_to_prost() {
    let one = |slot: i64| v1::Quota {
        services: [(
            "front".to_string(),
            v1::ServiceQuota {
                slots: [(slot, v1::UserQuotas::default())].into(),
            },
        )]
        .into(),
        report_slot: None,
        packed: Vec::new(),
        refs: Vec::new(),
    };
    let bytes = [one(1).encode_to_vec(), one(2).encode_to_vec()].concat();
    assert_eq!(
        RawQuota::parse(&bytes).unwrap_err(),
        RawQuotaError::Repeated
    );
    // prost keeps the last table only.
    let decoded = v1::Quota::decode(&bytes[..]).unwrap();
    assert_eq!(
        decoded.services["front"].slots.keys().collect::<Vec<_>>(),
        [&2]
    );
}

#[test]
fn one_service_packed_for_two_slots_reads_in_place_and_one_table_twice_does_not() {
    let packed = |slots: &[i64]| {
        let mut q = super::QuotaEncoder::new();
        for &slot in slots {
            q.begin_packed("front", slot);
            q.user("bob", [("requests", 3.0)]);
        }
        match Answer::decode(&q.finish(None)[..]) {
            Ok(Answer::Quota(b)) => b,
            other => panic!("{other:?}"),
        }
    };
    let raw = RawQuota::parse(&packed(&[7, 8])).unwrap();
    let slots: Vec<i64> = raw.tables().map(|(_, slot, _)| slot).collect();
    assert_eq!(slots, [7, 8]);
    assert_eq!(
        RawQuota::parse(&packed(&[7, 7])).unwrap_err(),
        RawQuotaError::Repeated
    );
    // And a service in both forms.
    let mut q = super::QuotaEncoder::new();
    q.begin("front", 6);
    let Ok(Answer::Quota(classic)) = Answer::decode(&q.finish(None)[..]) else {
        panic!("not a quota");
    };
    let both = [&classic[..], &packed(&[7])[..]].concat();
    assert_eq!(RawQuota::parse(&both).unwrap_err(), RawQuotaError::Repeated);
}

#[test]
fn entries_in_any_layout_read_as_prost_reads_them() {
    // A resource's quota before its name, and a user with no name.
    let resource = entry(
        &[0x11, 0, 0, 0, 0, 0, 0, 0x24, 0x40],
        &delimited(1, b"requests"),
    );
    let resources = delimited(1, &resource);
    let user = delimited(2, &resources);
    let users = delimited(1, &user);
    let slot = entry(&delimited(2, &users), &[0x08, 7]);
    let service = entry(&delimited(1, b"front"), &delimited(2, &delimited(1, &slot)));
    let bytes = delimited(1, &service);
    let raw = RawQuota::parse(&bytes).unwrap();
    let decoded = v1::Quota::decode(&bytes[..]).unwrap();
    assert_eq!(raw_tables(&raw), prost_tables(&decoded));
    assert_eq!(
        raw_tables(&raw),
        [(
            "front".to_string(),
            7,
            vec![(
                String::new(),
                vec![("requests".to_string(), 10f64.to_bits())]
            )]
        )]
    );
}
