//! What the monitor API can ask the ledger's task, and the typed answers.

use std::net::SocketAddr;

use crate::ledger::{Cursor, KeyView, Paged, QuotaSlot, SumRow};
use crate::policy::AppsStatus;

/// What the monitor API can be asked about.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Subject {
    /// Connected node streams.
    Connections,
    /// Which nodes reported each slot.
    Reported,
    /// Summed consumption per slot.
    ConsumptionSum,
    /// Summed rejections per slot.
    RejectionSum,
    /// Latest entry per node and the bucket, per key.
    Distribution,
    /// Assigned quotas per slot and node.
    Quota,
    /// How each shared capacity was split between applications.
    Apps,
}

impl Subject {
    /// The subject's name in the API's paths.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Connections => "connections",
            Self::Reported => "reported",
            Self::ConsumptionSum => "consumption_sum",
            Self::RejectionSum => "rejection_sum",
            Self::Distribution => "distribution",
            Self::Quota => "quota",
            Self::Apps => "apps",
        }
    }
}

impl std::str::FromStr for Subject {
    type Err = ();

    fn from_str(s: &str) -> Result<Self, ()> {
        Ok(match s {
            "connections" => Self::Connections,
            "reported" => Self::Reported,
            "consumption_sum" => Self::ConsumptionSum,
            "rejection_sum" => Self::RejectionSum,
            "distribution" => Self::Distribution,
            "quota" => Self::Quota,
            "apps" => Self::Apps,
            _ => return Err(()),
        })
    }
}

/// An answer to a monitor question ([`Subject`]), as the ledger's task
/// read it: rendered by the HTTP layer, away from that task.
#[derive(Debug, Clone, PartialEq)]
pub enum MonitorView {
    /// [`Subject::Connections`].
    Connections(Connections),
    /// [`Subject::Reported`]: data slot -> the nodes that reported it.
    Reported(Vec<(i64, Vec<String>)>),
    /// [`Subject::ConsumptionSum`] or [`Subject::RejectionSum`].
    Sums(Paged<SumRow>),
    /// [`Subject::Distribution`].
    Distribution(Paged<KeyView>),
    /// [`Subject::Quota`].
    Quota(Paged<QuotaSlot>),
    /// [`Subject::Apps`]: per service, its capacity's split.
    Apps(Vec<(String, AppsStatus)>),
}

impl MonitorView {
    /// Where the next page starts, if the answer is paged and there is
    /// more.
    pub fn next(&self) -> Option<&Cursor> {
        match self {
            Self::Connections(_) | Self::Reported(_) | Self::Apps(_) => None,
            Self::Sums(p) => p.next.as_ref(),
            Self::Distribution(p) => p.next.as_ref(),
            Self::Quota(p) => p.next.as_ref(),
        }
    }
}

/// The node streams open, and how long the central has run.
#[derive(Debug, Clone, PartialEq)]
pub struct Connections {
    /// One per open stream.
    pub streams: Vec<Connection>,
    /// Seconds since the central started.
    pub uptime_seconds: f64,
}

/// One open node stream.
#[derive(Debug, Clone, PartialEq)]
pub struct Connection {
    /// The node's id.
    pub node_id: String,
    /// Where it connected from.
    pub addr: Option<SocketAddr>,
    /// The services it declared or reported.
    pub services: Vec<String>,
    /// Seconds since the stream opened.
    pub connected_seconds: f64,
    /// Reports received on it.
    pub reports: u64,
    /// The data slot of the last report received on it, if any.
    pub last_slot: Option<i64>,
    /// Seconds since that report came.
    pub last_report_seconds: Option<f64>,
    /// Reports it answered ahead of filing.
    pub answered_ahead: u64,
    /// Whether its node's quotas are written packed (while every stream
    /// of the node accepts it).
    pub packed: bool,
    /// Whether its answers may name the push before them.
    pub refs: bool,
}
