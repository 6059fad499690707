//! The JSON documents of the legacy system, and their lossless conversion
//! to and from the protobuf messages.
//!
//! A report is `{"node_id", "slot_number", "consumption", "rejection"}` where
//! the two usage maps are `service -> user -> resource -> integer amount`; a
//! quota is `service -> slot -> user -> resource -> float amount`, with slot
//! numbers as JSON strings. Old tooling and the legacy WebSocket endpoint
//! speak this form.
//!
//! `Quota::report_slot` is transport metadata of the stream, not part of the
//! original document: it is not written to JSON and reads back as unset.
//!
//! Parsing never panics: malformed input gives a [`LegacyError`] naming the
//! path of the offending value, e.g. `consumption.front.user_foo.traffic_up`.
//!
//! # Examples
//!
//! ```
//! use throttle_proto::legacy;
//!
//! let json = r#"{"node_id": "00163e0069ec", "slot_number": 1515118666,
//!   "consumption": {"front": {"user_foo": {"traffic_up": 11534593, "database_read": 3}}},
//!   "rejection": {"front": {"user_bar": {"traffic_up": 10}}}}"#;
//! let report = legacy::report_from_json(json)?;
//! assert_eq!(report.consumption["front"].users["user_foo"].resources["database_read"], 3);
//!
//! let err = legacy::report_from_json(r#"{"node_id": "n", "slot_number": 1.5}"#).unwrap_err();
//! assert_eq!(err.path(), "slot_number");
//! # Ok::<(), legacy::LegacyError>(())
//! ```

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::v1;

/// `service -> user -> resource -> amount`, as in a JSON report.
pub type JsonUsage = BTreeMap<String, BTreeMap<String, BTreeMap<String, i64>>>;

/// `service -> slot (decimal string) -> user -> resource -> amount`, a JSON quota.
pub type JsonQuota = BTreeMap<String, BTreeMap<String, BTreeMap<String, BTreeMap<String, f64>>>>;

/// A report in its JSON form.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct JsonReport {
    /// The reporting node.
    pub node_id: String,
    /// The slot at whose start the report was sent; data is of the slot before.
    pub slot_number: i64,
    /// What was consumed.
    #[serde(default)]
    pub consumption: JsonUsage,
    /// How many requests were refused, per exhausted resource.
    #[serde(default)]
    pub rejection: JsonUsage,
}

/// Why a legacy JSON document could not be converted.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum LegacyError {
    /// The document is not valid JSON of the expected shape.
    #[error("invalid legacy JSON at `{path}`: {message}")]
    Json {
        /// Dotted path of the offending value (`.` for the document itself).
        path: String,
        /// What serde found wrong.
        message: String,
    },
    /// A quota slot key is not the decimal form of an integer.
    #[error("invalid slot number at `{path}`: {key:?} is not a decimal integer")]
    SlotKey {
        /// Dotted path of the slot entry.
        path: String,
        /// The key as found.
        key: String,
    },
    /// A quota amount is NaN or infinite, which JSON cannot carry.
    #[error("quota at `{path}` is not a finite number")]
    NonFinite {
        /// Dotted path of the amount.
        path: String,
    },
    /// A quota that refers to tables sent before ([`v1::QuotaRef`]), which
    /// the JSON cannot say: only a node that accepts them
    /// ([`QUOTA_REFS`](crate::QUOTA_REFS)) is sent any.
    #[error("quota refers to the tables of `{service}` sent before")]
    Refs {
        /// The first ref's service.
        service: String,
    },
    /// A [`v1::PackedQuota`] or [`v1::PackedUsage`] whose bits and amounts
    /// do not match.
    #[error("packed table of `{service}`: {error}")]
    Packed {
        /// The table's service.
        service: String,
        /// What is wrong with it.
        error: crate::PackedError,
    },
}

impl LegacyError {
    /// Dotted path of the offending value.
    pub fn path(&self) -> &str {
        match self {
            Self::Json { path, .. } | Self::SlotKey { path, .. } | Self::NonFinite { path } => path,
            Self::Packed { service, .. } | Self::Refs { service } => service,
        }
    }
}

fn parse<T: serde::de::DeserializeOwned>(json: &str) -> Result<T, LegacyError> {
    let de = &mut serde_json::Deserializer::from_str(json);
    serde_path_to_error::deserialize(de).map_err(|e| LegacyError::Json {
        path: e.path().to_string(),
        message: e.into_inner().to_string(),
    })
}

/// Parses a JSON report into the protobuf [`v1::Report`].
///
/// # Errors
///
/// [`LegacyError::Json`] for wrong types, missing `node_id`/`slot_number`,
/// fractional or out-of-range amounts.
pub fn report_from_json(json: &str) -> Result<v1::Report, LegacyError> {
    parse::<JsonReport>(json).map(v1::Report::from)
}

/// Writes a [`v1::Report`] as legacy JSON. [`v1::Report::packed`] tables
/// are written as the map entries they stand for ([`v1::Report::unpack`]).
///
/// # Errors
///
/// [`LegacyError::Packed`] for a packed table that does not decode.
pub fn report_to_json(report: &v1::Report) -> Result<String, LegacyError> {
    let json = unpacked(
        report,
        |r| r.packed.first().map(|t| t.service.as_str()),
        v1::Report::unpack,
    )?;
    let json = JsonReport::from(&*json);
    // Maps of strings and integers always serialize.
    Ok(serde_json::to_string(&json).unwrap_or_default())
}

/// Parses a JSON quota into the protobuf [`v1::Quota`].
///
/// # Errors
///
/// [`LegacyError::Json`] for wrong types, [`LegacyError::SlotKey`] for a slot
/// key that is not a canonical decimal integer.
pub fn quota_from_json(json: &str) -> Result<v1::Quota, LegacyError> {
    v1::Quota::try_from(parse::<JsonQuota>(json)?)
}

/// Writes a [`v1::Quota`] as legacy JSON.
///
/// [`v1::Quota::packed`] tables are written as the `services` entries they
/// stand for ([`v1::Quota::unpack`]), since the JSON has only that form.
///
/// # Errors
///
/// [`LegacyError::NonFinite`] when an amount is NaN or infinite,
/// [`LegacyError::Packed`] for a packed table that does not decode,
/// [`LegacyError::Refs`] for a quota with [`v1::Quota::refs`].
pub fn quota_to_json(quota: &v1::Quota) -> Result<String, LegacyError> {
    if let Some(r) = quota.refs.first() {
        return Err(LegacyError::Refs {
            service: r.service.clone(),
        });
    }
    let json = unpacked(
        quota,
        |q| q.packed.first().map(|t| t.service.as_str()),
        v1::Quota::unpack,
    )?;
    let json = JsonQuota::try_from(&*json)?;
    Ok(serde_json::to_string(&json).unwrap_or_default())
}

/// `message` in the only form the JSON has: as it is, or, if it carries
/// packed tables (`first_packed` names the service of its first), a copy
/// with them unpacked.
fn unpacked<'m, T: Clone>(
    message: &'m T,
    first_packed: fn(&T) -> Option<&str>,
    unpack: impl FnOnce(&mut T) -> Result<(), crate::PackedError>,
) -> Result<std::borrow::Cow<'m, T>, LegacyError> {
    if first_packed(message).is_none() {
        return Ok(std::borrow::Cow::Borrowed(message));
    }
    let mut copy = message.clone();
    match unpack(&mut copy) {
        Ok(()) => Ok(std::borrow::Cow::Owned(copy)),
        Err(error) => Err(LegacyError::Packed {
            service: first_packed(&copy).unwrap_or_default().to_owned(),
            error,
        }),
    }
}

fn usage_from_json(usage: JsonUsage) -> BTreeMap<String, v1::Usage> {
    usage
        .into_iter()
        .map(|(service, users)| {
            let users = users
                .into_iter()
                .map(|(user, resources)| (user, v1::Amounts { resources }))
                .collect();
            (service, v1::Usage { users })
        })
        .collect()
}

fn usage_to_json(usage: &BTreeMap<String, v1::Usage>) -> JsonUsage {
    usage
        .iter()
        .map(|(service, u)| {
            let users = u
                .users
                .iter()
                .map(|(user, a)| (user.clone(), a.resources.clone()))
                .collect();
            (service.clone(), users)
        })
        .collect()
}

impl From<JsonReport> for v1::Report {
    fn from(r: JsonReport) -> Self {
        Self {
            node_id: r.node_id,
            slot_number: r.slot_number,
            consumption: usage_from_json(r.consumption),
            rejection: usage_from_json(r.rejection),
            packed: Vec::new(),
            answered: false,
        }
    }
}

impl From<&v1::Report> for JsonReport {
    fn from(r: &v1::Report) -> Self {
        Self {
            node_id: r.node_id.clone(),
            slot_number: r.slot_number,
            consumption: usage_to_json(&r.consumption),
            rejection: usage_to_json(&r.rejection),
        }
    }
}

impl TryFrom<JsonQuota> for v1::Quota {
    type Error = LegacyError;

    fn try_from(json: JsonQuota) -> Result<Self, LegacyError> {
        let mut services = BTreeMap::new();
        for (service, slots_json) in json {
            let mut slots = BTreeMap::new();
            for (key, users) in slots_json {
                let slot = key
                    .parse::<i64>()
                    .ok()
                    // Only the canonical form converts back to the same key.
                    .filter(|s| s.to_string() == key)
                    .ok_or_else(|| LegacyError::SlotKey {
                        path: format!("{service}.{key}"),
                        key: key.clone(),
                    })?;
                let users = users
                    .into_iter()
                    .map(|(user, resources)| (user, v1::ResourceQuotas { resources }))
                    .collect();
                slots.insert(slot, v1::UserQuotas { users });
            }
            services.insert(service, v1::ServiceQuota { slots });
        }
        Ok(Self {
            services,
            report_slot: None,
            packed: Vec::new(),
            refs: Vec::new(),
        })
    }
}

impl TryFrom<&v1::Quota> for JsonQuota {
    type Error = LegacyError;

    fn try_from(quota: &v1::Quota) -> Result<Self, LegacyError> {
        let mut json = JsonQuota::new();
        for (service, sq) in &quota.services {
            let slots = json.entry(service.clone()).or_default();
            for (slot, uq) in &sq.slots {
                let users = slots.entry(slot.to_string()).or_default();
                for (user, rq) in &uq.users {
                    if let Some((resource, _)) = rq.resources.iter().find(|(_, v)| !v.is_finite()) {
                        return Err(LegacyError::NonFinite {
                            path: format!("{service}.{slot}.{user}.{resource}"),
                        });
                    }
                    users.insert(user.clone(), rq.resources.clone());
                }
            }
        }
        Ok(json)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use prost::Message;
    use serde_json::Value;

    const REPORT: &str = r#"{"node_id": "00163e0069ec", "slot_number": 1515118666,
 "consumption": {"front": {"user_foo": {"traffic_up": 11534593, "database_read": 3}}},
 "rejection":   {"front": {"user_bar": {"traffic_up": 10}}}}"#;

    const QUOTA: &str = r#"{"front": {"1515120413": {"user_foo": {"traffic_down": 20971520.0, "database_read": 51200.0}}}}"#;

    fn json(s: &str) -> Value {
        serde_json::from_str(s).unwrap()
    }

    #[test]
    fn spec_report_round_trips_through_protobuf() {
        let report = report_from_json(REPORT).unwrap();
        assert_eq!(report.node_id, "00163e0069ec");
        assert_eq!(report.slot_number, 1_515_118_666);
        assert_eq!(
            report.consumption["front"].users["user_foo"].resources["traffic_up"],
            11_534_593
        );
        assert_eq!(
            report.rejection["front"].users["user_bar"].resources["traffic_up"],
            10
        );
        let wire = v1::Report::decode(report.encode_to_vec().as_slice()).unwrap();
        assert_eq!(json(&report_to_json(&wire).unwrap()), json(REPORT));
    }

    #[test]
    fn spec_quota_round_trips_through_protobuf() {
        let quota = quota_from_json(QUOTA).unwrap();
        let users = &quota.services["front"].slots[&1_515_120_413].users;
        assert_eq!(users["user_foo"].resources["traffic_down"], 20_971_520.0);
        let wire = v1::Quota::decode(quota.encode_to_vec().as_slice()).unwrap();
        assert_eq!(json(&quota_to_json(&wire).unwrap()), json(QUOTA));
    }

    #[test]
    fn empty_services_are_kept() {
        let r = report_from_json(
            r#"{"node_id": "n", "slot_number": 7, "consumption": {"front": {}}, "rejection": {"front": {}}}"#,
        )
        .unwrap();
        assert!(r.consumption["front"].users.is_empty());
        assert!(r.rejection.contains_key("front"));
        assert_eq!(
            json(&report_to_json(&r).unwrap()),
            json(
                r#"{"node_id": "n", "slot_number": 7, "consumption": {"front": {}}, "rejection": {"front": {}}}"#
            )
        );
    }

    fn report_err(s: &str) -> LegacyError {
        report_from_json(s).unwrap_err()
    }

    #[test]
    fn missing_node_id_is_named() {
        let e = report_err(r#"{"slot_number": 1}"#);
        assert!(e.to_string().contains("node_id"), "{e}");
    }

    #[test]
    fn missing_slot_number_is_named() {
        let e = report_err(r#"{"node_id": "n"}"#);
        assert!(e.to_string().contains("slot_number"), "{e}");
    }

    #[test]
    fn wrong_type_names_the_path() {
        let e = report_err(
            r#"{"node_id": "n", "slot_number": 1, "consumption": {"front": {"u": {"requests": "3"}}}}"#,
        );
        assert_eq!(e.path(), "consumption.front.u.requests");
        let e = report_err(r#"{"node_id": 5, "slot_number": 1}"#);
        assert_eq!(e.path(), "node_id");
        let e = report_err(r#"{"node_id": "n", "slot_number": 1, "rejection": []}"#);
        assert_eq!(e.path(), "rejection");
    }

    #[test]
    fn fractional_amount_is_refused() {
        let e = report_err(
            r#"{"node_id": "n", "slot_number": 1, "consumption": {"front": {"u": {"requests": 1.5}}}}"#,
        );
        assert_eq!(e.path(), "consumption.front.u.requests");
        assert!(matches!(e, LegacyError::Json { .. }));
    }

    #[test]
    fn out_of_range_amount_is_refused() {
        let e = report_err(
            r#"{"node_id": "n", "slot_number": 1, "consumption": {"front": {"u": {"requests": 9223372036854775808}}}}"#,
        );
        assert_eq!(e.path(), "consumption.front.u.requests");
        let e = report_err(r#"{"node_id": "n", "slot_number": 1e300}"#);
        assert_eq!(e.path(), "slot_number");
    }

    #[test]
    fn non_numeric_slot_key_is_refused() {
        let e = quota_from_json(r#"{"front": {"soon": {"u": {"requests": 1.0}}}}"#).unwrap_err();
        assert_eq!(
            e,
            LegacyError::SlotKey {
                path: "front.soon".into(),
                key: "soon".into()
            }
        );
        // Non-canonical forms would not convert back to the same key.
        assert!(quota_from_json(r#"{"front": {"007": {}}}"#).is_err());
        assert!(quota_from_json(r#"{"front": {"+7": {}}}"#).is_err());
    }

    #[test]
    fn wrong_quota_amount_type_names_the_path() {
        let e = quota_from_json(r#"{"front": {"1": {"u": {"requests": "lots"}}}}"#).unwrap_err();
        assert_eq!(e.path(), "front.1.u.requests");
        let e = quota_from_json("[1, 2]").unwrap_err();
        assert!(matches!(e, LegacyError::Json { .. }));
        let e = quota_from_json("{").unwrap_err();
        assert!(matches!(e, LegacyError::Json { .. }));
    }

    #[test]
    fn non_finite_quota_cannot_be_written() {
        let mut q = quota_from_json(QUOTA).unwrap();
        let slot = q
            .services
            .get_mut("front")
            .unwrap()
            .slots
            .get_mut(&1_515_120_413)
            .unwrap();
        slot.users
            .get_mut("user_foo")
            .unwrap()
            .resources
            .insert("requests".into(), f64::NAN);
        let e = quota_to_json(&q).unwrap_err();
        assert_eq!(e.path(), "front.1515120413.user_foo.requests");
    }

    /// The JSON has no way to say "the quotas sent before": such a quota
    /// is refused, not written without them.
    #[test]
    fn a_quota_with_refs_cannot_be_written() {
        let mut q = quota_from_json(QUOTA).unwrap();
        q.refs.push(v1::QuotaRef {
            service: "front".into(),
            slot: 8,
            from_slot: 7,
        });
        let e = quota_to_json(&q).unwrap_err();
        assert!(matches!(e, LegacyError::Refs { .. }), "{e}");
        assert_eq!(e.path(), "front");
    }

    fn name() -> impl Strategy<Value = String> {
        // Any Unicode, including the characters JSON must escape.
        ".{0,12}"
    }

    fn usage() -> impl Strategy<Value = BTreeMap<String, v1::Usage>> {
        let amounts = prop::collection::btree_map(name(), any::<i64>(), 0..4)
            .prop_map(|resources| v1::Amounts { resources });
        let users = prop::collection::btree_map(name(), amounts, 0..4)
            .prop_map(|users| v1::Usage { users });
        prop::collection::btree_map(name(), users, 0..3)
    }

    fn report() -> impl Strategy<Value = v1::Report> {
        (name(), any::<i64>(), usage(), usage()).prop_map(
            |(node_id, slot_number, consumption, rejection)| v1::Report {
                node_id,
                slot_number,
                consumption,
                rejection,
                packed: Vec::new(),
                answered: false,
            },
        )
    }

    fn quota() -> impl Strategy<Value = v1::Quota> {
        let amount = prop::num::f64::NORMAL | prop::num::f64::ZERO | prop::num::f64::SUBNORMAL;
        let resources = prop::collection::btree_map(name(), amount, 0..4)
            .prop_map(|resources| v1::ResourceQuotas { resources });
        let users = prop::collection::btree_map(name(), resources, 0..4)
            .prop_map(|users| v1::UserQuotas { users });
        let slots = prop::collection::btree_map(any::<i64>(), users, 0..3)
            .prop_map(|slots| v1::ServiceQuota { slots });
        prop::collection::btree_map(name(), slots, 0..3).prop_map(|services| v1::Quota {
            services,
            report_slot: None,
            packed: Vec::new(),
            refs: Vec::new(),
        })
    }

    proptest! {
        #[test]
        fn reports_round_trip(r in report()) {
            let wire = v1::Report::decode(r.encode_to_vec().as_slice()).unwrap();
            prop_assert_eq!(&wire, &r);
            let back = report_from_json(&report_to_json(&wire).unwrap()).unwrap();
            prop_assert_eq!(back, r);
        }

        #[test]
        fn quotas_round_trip(q in quota()) {
            let wire = v1::Quota::decode(q.encode_to_vec().as_slice()).unwrap();
            prop_assert_eq!(&wire, &q);
            let back = quota_from_json(&quota_to_json(&wire).unwrap()).unwrap();
            prop_assert_eq!(back, q);
        }

        /// A report whose usages are packed is written as the report they
        /// stand for.
        #[test]
        fn packed_reports_are_written_as_what_they_stand_for(r in report()) {
            let mut packed = r.clone();
            for (rejection, usages) in [(false, std::mem::take(&mut packed.consumption)), (true, std::mem::take(&mut packed.rejection))] {
                for (service, usage) in usages {
                    let resources: Vec<String> = usage
                        .users
                        .values()
                        .flat_map(|a| a.resources.keys().cloned())
                        .collect::<std::collections::BTreeSet<_>>()
                        .into_iter()
                        .collect();
                    let mut table = v1::PackedUsage { service, rejection, resources, ..Default::default() };
                    for (user, amounts) in usage.users {
                        let mut bits = Vec::new();
                        for (name, amount) in amounts.resources {
                            let bit = table.resources.iter().position(|r| *r == name).unwrap_or(0);
                            bits.resize(bits.len().max(bit / 8 + 1), 0u8);
                            bits[bit / 8] |= 1 << (bit % 8);
                            table.amounts.push(amount);
                        }
                        table.users.push(v1::PackedUser { user, resources: bits });
                    }
                    packed.packed.push(table);
                }
            }
            prop_assert_eq!(report_to_json(&packed).unwrap(), report_to_json(&r).unwrap());
        }

        /// A quota whose tables are packed is written as the quota they
        /// stand for.
        #[test]
        fn packed_quotas_are_written_as_what_they_stand_for(q in quota()) {
            let bytes = crate::wire::quota_encoder::encode_tables(&q, |_| true);
            let message = v1::CentralMessage::decode(&bytes[..]).unwrap();
            let Some(v1::central_message::Kind::Quota(packed)) = message.kind else {
                panic!("not a quota");
            };
            prop_assert!(packed.services.is_empty());
            // The amounts, as the f32s packed tables keep; a service with
            // no slot has no table.
            let mut kept = q.clone();
            kept.services.retain(|_, sq| !sq.slots.is_empty());
            for sq in kept.services.values_mut() {
                for users in sq.slots.values_mut() {
                    for rq in users.users.values_mut() {
                        for a in rq.resources.values_mut() {
                            *a = f64::from(crate::f32_at_most(*a));
                        }
                    }
                }
            }
            prop_assert_eq!(quota_to_json(&packed), quota_to_json(&kept));
        }
    }

    proptest! {
        /// A legacy document from outside, whatever it holds, converts or
        /// is refused: never a panic.
        #[test]
        fn arbitrary_text_never_panics_the_json_readers(text in "\\PC{0,300}") {
            let _ = report_from_json(&text);
            let _ = quota_from_json(&text);
        }

        /// JSON of the right shape with arbitrary names and numbers.
        #[test]
        fn odd_names_and_numbers_never_panic_the_json_readers(
            name in "\\PC{0,20}",
            number in "-?[0-9]{0,25}(\\.[0-9]{0,5})?(e[+-]?[0-9]{1,4})?",
        ) {
            let name = serde_json::to_string(&name).unwrap_or_default();
            let report = format!(
                r#"{{"node_id": {name}, "slot_number": {number}, "consumption": {{{name}: {{{name}: {{{name}: {number}}}}}}}, "rejection": {{}}}}"#
            );
            if let Ok(r) = report_from_json(&report) {
                let _ = report_to_json(&r);
            }
            let quota = format!(r#"{{{name}: {{"{number}": {{{name}: {{{name}: {number}}}}}}}}}"#);
            if let Ok(q) = quota_from_json(&quota) {
                let _ = quota_to_json(&q);
            }
        }
    }
}
