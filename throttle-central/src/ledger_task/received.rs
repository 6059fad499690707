//! A report as it reaches the ledger's task: read in place, or decoded.

use metrics::counter;
use prost::Message as _;
use throttle_proto::v1;
use throttle_proto::wire::{RawReport, RawReportError};
use tonic::Status;

use crate::ledger::{FromNode, LedgerConfig, ReportError};

/// A report as it reaches the ledger task.
#[derive(Debug)]
pub(crate) enum Received {
    /// Read in place (the reports of throttle's own nodes).
    Raw(RawReport),
    /// Decoded by prost: encoded otherwise than prost encodes (see
    /// [`RawReportError::Unordered`]).
    Decoded(v1::Report),
}

impl Received {
    /// Reads a report's bytes in place, or decodes them with prost where
    /// reading in place would not say the same; on the stream's task.
    /// A report of more than `max_users` users is refused as soon as it is
    /// measured: at the first user past it when read in place, before
    /// prost decodes anything otherwise.
    pub(crate) fn read(bytes: bytes::Bytes, max_users: usize) -> Result<Self, Status> {
        let too_many = || {
            counter!("throttle_central_invalid_messages_total", "reason" => "too_many_users")
                .increment(1);
            let why = format!("report carries more users than the limit of {max_users}");
            Err(Status::invalid_argument(why))
        };
        match RawReport::parse_within(bytes.clone(), max_users) {
            Ok(raw) => Ok(Self::Raw(raw)),
            Err(RawReportError::TooManyUsers { .. }) => too_many(),
            Err(why) => match RawReport::count_users(&bytes) {
                Ok(users) if users > max_users => too_many(),
                _ => Self::decode(bytes, &why),
            },
        }
    }

    /// Decodes with prost a report not read in place (`why`).
    fn decode(bytes: bytes::Bytes, why: &RawReportError) -> Result<Self, Status> {
        let mut report = v1::Report::decode(bytes).map_err(|e| {
            counter!("throttle_central_invalid_messages_total", "reason" => "decode").increment(1);
            Status::invalid_argument(format!("unreadable report: {e}"))
        })?;
        if *why == RawReportError::Unordered {
            counter!("throttle_central_reports_decoded_total").increment(1);
        }
        // Packed usages as the maps the ledger reads.
        if let Err(e) = report.unpack() {
            counter!("throttle_central_invalid_messages_total", "reason" => "packed").increment(1);
            return Err(Status::invalid_argument(format!("unreadable report: {e}")));
        }
        Ok(Self::Decoded(report))
    }

    pub(crate) fn node_id(&self) -> &str {
        match self {
            Self::Raw(r) => r.node_id(),
            Self::Decoded(r) => &r.node_id,
        }
    }

    pub(crate) fn slot_number(&self) -> i64 {
        match self {
            Self::Raw(r) => r.slot_number(),
            Self::Decoded(r) => r.slot_number,
        }
    }

    /// The ledger's own check ([`LedgerConfig::check`]), for `node_id`.
    pub(crate) fn check(
        &self,
        config: &LedgerConfig,
        node_id: &str,
        now_ms: i64,
    ) -> Result<(), ReportError> {
        match self {
            Self::Raw(r) => config.check(&FromNode(node_id, r), now_ms),
            Self::Decoded(r) => config.check(&FromNode(node_id, r), now_ms),
        }
    }

    /// Whether every service the report names is one of `services`.
    pub(crate) fn services_within(&self, services: &[String]) -> bool {
        let known = |name: &str| services.iter().any(|s| s == name);
        match self {
            Self::Raw(r) => r.usages().all(|(name, ..)| known(name)),
            Self::Decoded(r) => r
                .consumption
                .keys()
                .chain(r.rejection.keys())
                .all(|name| known(name)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn report(amount: i64) -> v1::Report {
        throttle_proto::legacy::report_from_json(&format!(
            r#"{{"node_id": "n1", "slot_number": 9, "consumption": {{"front": {{"alice": {{"requests": {amount}}}}}}}, "rejection": {{}}}}"#
        ))
        .unwrap()
    }

    #[test]
    fn reports_are_read_in_place_or_by_prost_or_refused() {
        let ordered = report(1).encode_to_vec();
        assert!(matches!(
            Received::read(ordered.clone().into(), 10),
            Ok(Received::Raw(r)) if r.node_id() == "n1" && r.slot_number() == 9
        ));
        // Two entries for one user, as another encoder may send them:
        // prost's reading (the last one counts) is used.
        let mut repeated = report(1).encode_to_vec();
        repeated.extend(report(2).encode_to_vec());
        match Received::read(repeated.clone().into(), 10) {
            Ok(Received::Decoded(r)) => assert_eq!(r, report(2)),
            other => panic!("{other:?}"),
        }
        let garbage = bytes::Bytes::from_static(&[0x0a, 0x05, b'a']);
        let refused = Received::read(garbage, 10).err().map(|s| s.code());
        assert_eq!(refused, Some(tonic::Code::InvalidArgument));
        // Measured before read, in place or by prost.
        for bytes in [ordered, repeated] {
            let refused = Received::read(bytes.into(), 0).err().map(|s| s.code());
            assert_eq!(refused, Some(tonic::Code::InvalidArgument));
        }
    }
}
