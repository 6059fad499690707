//! Opening a stream to a central node: Hello, credentials, Welcome.

use std::time::Duration;

use throttle_proto::auth::Signed;
use throttle_proto::causes;
use throttle_proto::wire::client::central_client::CentralClient;
use throttle_proto::wire::{Answer, Inbound};
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::transport::Endpoint;

use super::error::ReporterError;

pub(super) enum Opened {
    /// A stream, and what its Welcome said.
    Stream(
        mpsc::Sender<Inbound>,
        Box<tonic::Streaming<Answer>>,
        Welcomed,
    ),
    Redirect(String),
}

/// What a central's Welcome says that the reporter acts on.
#[derive(Debug, Clone, Copy)]
pub(super) struct Welcomed {
    /// It reads packed reports.
    pub(super) packed: bool,
    /// Its leadership's epoch (0: no election).
    pub(super) epoch: u64,
    /// Its ledger's incarnation (0: it takes no answered reports).
    pub(super) incarnation: u64,
}

#[derive(Debug, thiserror::Error)]
pub(super) enum OpenError {
    #[error(transparent)]
    Endpoint(#[from] ReporterError),
    #[error("connect: {}", causes(.0))]
    Connect(#[from] tonic::transport::Error),
    #[error("central refused the stream: {0}")]
    Status(#[from] tonic::Status),
    #[error("no Welcome from the central node")]
    NoWelcome,
    #[error("credentials cannot go in gRPC metadata (not visible ASCII)")]
    Credentials,
}

/// Puts `signed` in a stream's request metadata.
pub(super) fn sign(
    metadata: &mut tonic::metadata::MetadataMap,
    signed: &Signed,
) -> Result<(), OpenError> {
    for (key, value) in signed.entries() {
        let value = value.parse().map_err(|_| OpenError::Credentials)?;
        metadata.insert(key, value);
    }
    Ok(())
}

pub(super) async fn open(
    endpoint: Result<Endpoint, ReporterError>,
    queue: usize,
    max_message_bytes: usize,
    hello: Inbound,
    signed: Option<Signed>,
    unreachable: Vec<String>,
) -> Result<Opened, OpenError> {
    let channel = endpoint?.connect().await?;
    let mut client = CentralClient::new(channel).max_decoding_message_size(max_message_bytes);
    let (tx, rx) = mpsc::channel(queue);
    let _ = tx.try_send(hello);

    let mut request = tonic::Request::new(ReceiverStream::new(rx));
    if let Some(signed) = signed {
        sign(request.metadata_mut(), &signed)?;
    }
    if !unreachable.is_empty() {
        // An address that is not visible ASCII cannot be dialled either.
        if let Ok(value) = unreachable.join(",").parse() {
            let name = throttle_proto::UNREACHABLE_METADATA;
            request.metadata_mut().insert(name, value);
        }
    }
    let mut inbound = client.exchange(request).await?.into_inner();
    let first = tokio::time::timeout(Duration::from_secs(5), inbound.message())
        .await
        .map_err(|_| OpenError::NoWelcome)??;
    match first {
        Some(Answer::Welcome(w)) => {
            let packed = w
                .accepts
                .iter()
                .any(|a| a == throttle_proto::PACKED_REPORTS);
            let welcomed = Welcomed {
                packed,
                epoch: w.epoch,
                incarnation: w.incarnation,
            };
            Ok(Opened::Stream(tx, Box::new(inbound), welcomed))
        }
        Some(Answer::NotLeader(nl)) => Ok(Opened::Redirect(nl.leader)),
        _ => Err(OpenError::NoWelcome),
    }
}
