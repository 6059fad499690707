//! [`Campaign`]: runs for leadership on etcd, as etcd's own
//! `concurrency.Election` does, and keeps [`Elected`] up to date.
//!
//! Each central holds a lease and, under it, a key `PREFIX/LEASE` whose
//! value is its advertised address. The key created first (the lowest
//! creation revision) leads; its creation revision is the epoch. Every
//! beat (an eighth of the TTL, at most 100 ms: two small requests, so a
//! standby learns within a beat that the leader's key is gone) renews the
//! lease and reads which key is first. A leader whose lease goes (killed, stopped, cut
//! off from etcd) loses its key with it, and the next key leads.

use std::sync::Arc;
use std::sync::atomic::{AtomicI64, Ordering};
use std::time::Duration;

use crate::etcd_api::compare::{CompareResult, CompareTarget, TargetUnion};
use crate::etcd_api::kv_client::KvClient;
use crate::etcd_api::lease_client::LeaseClient;
use crate::etcd_api::range_request::{SortOrder, SortTarget};
use crate::etcd_api::request_op::Request as Op;
use crate::etcd_api::response_op::Response as OpResponse;
use crate::etcd_api::{
    Compare, LeaseGrantRequest, LeaseKeepAliveRequest, LeaseKeepAliveResponse, LeaseRevokeRequest,
    PutRequest, RangeRequest, RequestOp, TxnRequest,
};
use throttle_clock::Clock;
use tokio::sync::{mpsc, watch};
use tokio_stream::wrappers::ReceiverStream;
use tonic::transport::{Channel, Endpoint};

use super::role::{Elected, lead_until};
use crate::log::Throttled;

/// What the campaign needs.
#[derive(Debug, Clone)]
pub struct ElectionConfig {
    /// etcd's client URLs (`http://127.0.0.1:2379`); tried in turn.
    pub endpoints: Vec<String>,
    /// The election's name: centrals of one name elect one leader.
    pub name: String,
    /// The lease's time to live (etcd raises it to its minimum, 2 s on a
    /// default single-member etcd).
    pub ttl: Duration,
}

/// Why a term of the campaign ended.
#[derive(Debug, thiserror::Error)]
pub(crate) enum TermError {
    #[error("etcd endpoint {0:?}: {1}")]
    Endpoint(String, tonic::transport::Error),
    #[error("etcd: {0}")]
    Status(#[from] tonic::Status),
    #[error("etcd answered no {0}")]
    Missing(&'static str),
    #[error("the lease ended")]
    LeaseLost,
}

/// Lines about etcd failures, at most once a second.
static FAILED: Throttled = Throttled::new();

/// Runs for leadership until stopped; see the module's documentation.
#[derive(Debug)]
pub struct Campaign {
    config: ElectionConfig,
    elected: Arc<Elected>,
    clock: Arc<dyn Clock>,
    /// The lease of the term under way (0: none), given back on stop.
    lease: AtomicI64,
}

/// One lease and its key.
struct Term {
    kv: KvClient<Channel>,
    lease: LeaseClient<Channel>,
    id: i64,
    key: Vec<u8>,
    epoch: u64,
    /// The keep-alive stream: requests in, answers out.
    alive: Option<(
        mpsc::Sender<LeaseKeepAliveRequest>,
        tonic::Streaming<LeaseKeepAliveResponse>,
    )>,
}

impl Campaign {
    /// A campaign writing `elected`, reading the monotonic `clock`.
    pub fn new(config: ElectionConfig, elected: Arc<Elected>, clock: Arc<dyn Clock>) -> Self {
        Self {
            config,
            elected,
            clock,
            lease: AtomicI64::new(0),
        }
    }

    fn now_ms(&self) -> u64 {
        u64::try_from(self.clock.now_ms()).unwrap_or(0)
    }

    fn beat(&self) -> Duration {
        (self.config.ttl / 8).min(Duration::from_millis(100))
    }

    /// The keys of this election: `/throttle/election/NAME/`.
    fn prefix(&self) -> Vec<u8> {
        format!("/throttle/election/{}/", self.config.name).into_bytes()
    }

    /// Campaigns until `stop` turns true; then resigns.
    pub async fn run(self, mut stop: watch::Receiver<bool>) {
        let mut at = 0;
        loop {
            let endpoint = &self.config.endpoints[at % self.config.endpoints.len()];
            let ended = tokio::select! {
                ended = self.term(endpoint) => ended,
                () = stopped(&mut stop) => return self.resign().await,
            };
            if let Err(e) = ended {
                // The term has stood this central by already.
                failed("term ended", &e);
                at += 1;
            }
            tokio::select! {
                () = tokio::time::sleep(self.beat()) => {}
                () = stopped(&mut stop) => return self.resign().await,
            }
        }
    }

    /// Stands by and gives the lease of the term under way back (the key
    /// goes with it), so a standby need not wait for its TTL.
    async fn resign(&self) {
        self.elected.follow(None);
        let id = self.lease.swap(0, Ordering::Relaxed);
        if id == 0 {
            return;
        }
        for endpoint in &self.config.endpoints {
            if let Ok(channel) = connect(endpoint).await
                && revoke(&mut LeaseClient::new(channel), id).await
            {
                tracing::info!("resigned leadership");
                return;
            }
        }
    }

    /// One lease: campaign under it and beat until it ends.
    async fn term(&self, endpoint: &str) -> Result<(), TermError> {
        let mut term = self.campaign(endpoint).await?;
        let ended = self.hold(&mut term).await;
        // Whatever ended the term, its lease goes now rather than at its
        // TTL: the key it holds would keep every other central waiting.
        self.elected.follow(None);
        revoke(&mut term.lease, term.id).await;
        self.lease.store(0, Ordering::Relaxed);
        ended
    }

    /// Grants a lease and creates this central's key under it.
    async fn campaign(&self, endpoint: &str) -> Result<Term, TermError> {
        let channel = connect(endpoint).await?;
        let (mut kv, mut lease) = (KvClient::new(channel.clone()), LeaseClient::new(channel));
        let ttl = i64::try_from(self.config.ttl.as_secs().max(1)).unwrap_or(i64::MAX);
        let grant = lease
            .lease_grant(LeaseGrantRequest { ttl, id: 0 })
            .await?
            .into_inner();
        self.lease.store(grant.id, Ordering::Relaxed);
        let mut key = self.prefix();
        key.extend_from_slice(format!("{:016x}", grant.id).as_bytes());
        let created = Compare {
            result: CompareResult::Equal as i32,
            target: CompareTarget::Create as i32,
            key: key.clone(),
            target_union: Some(TargetUnion::CreateRevision(0)),
        };
        let put = Op::RequestPut(PutRequest {
            key: key.clone(),
            value: self.elected.advertise().as_bytes().to_vec(),
            lease: grant.id,
            prev_kv: false,
        });
        let get = Op::RequestRange(RangeRequest {
            key: key.clone(),
            ..RangeRequest::default()
        });
        let txn = TxnRequest {
            compare: vec![created],
            success: vec![RequestOp { request: Some(put) }],
            failure: vec![RequestOp { request: Some(get) }],
        };
        let answer = kv.txn(txn).await?.into_inner();
        let revision = match (answer.succeeded, answer.responses.first()) {
            (true, _) => answer.header.map(|h| h.revision),
            (false, Some(r)) => match &r.response {
                Some(OpResponse::ResponseRange(range)) => {
                    range.kvs.first().map(|k| k.create_revision)
                }
                _ => None,
            },
            (false, None) => None,
        };
        let epoch = revision.ok_or(TermError::Missing("creation revision"))?;
        tracing::info!(epoch, lease = grant.id, "campaigning for leadership");
        self.elected.hold_key(&key);
        Ok(Term {
            kv,
            lease,
            id: grant.id,
            key,
            epoch: u64::try_from(epoch).unwrap_or(0),
            alive: None,
        })
    }

    /// Beats until the lease is lost (or etcd fails past the deadline).
    async fn hold(&self, term: &mut Term) -> Result<(), TermError> {
        loop {
            // A leader whose deadline passed (stopped, or etcd slow)
            // stands by before anything else.
            self.elected.expire();
            if let Err(e) = self.renew_and_look(term).await {
                if matches!(e, TermError::LeaseLost) {
                    return Err(e);
                }
                term.alive = None;
                failed("beat failed", &e);
            }
            tokio::time::sleep(self.beat()).await;
        }
    }

    /// Renews the lease, then reads who leads.
    async fn renew_and_look(&self, term: &mut Term) -> Result<(), TermError> {
        let mut sent = self.now_ms();
        let mut ttl_ms = self.renew(term).await?;
        // A renewal that took half the TTL or more (etcd coming back, a
        // keep-alive call opened again) leaves a lead too short to use:
        // it would lead for a moment and stand by again, dropping every
        // stream. Renewed again at once, on the open call, it is whole.
        if lead_until(sent, ttl_ms) < self.now_ms().saturating_add(ttl_ms / 2) {
            sent = self.now_ms();
            ttl_ms = self.renew(term).await?;
        }
        let prefix = self.prefix();
        let first = term
            .kv
            .range(RangeRequest {
                range_end: prefix_end(&prefix),
                key: prefix,
                limit: 1,
                sort_order: SortOrder::Ascend as i32,
                sort_target: SortTarget::Create as i32,
                ..RangeRequest::default()
            })
            .await?
            .into_inner();
        match first.kvs.first() {
            Some(kv) if kv.key == term.key => {
                self.elected.lead(term.epoch, lead_until(sent, ttl_ms))
            }
            Some(kv) => self
                .elected
                .follow(Some(String::from_utf8_lossy(&kv.value).into_owned())),
            None => return Err(TermError::LeaseLost),
        }
        Ok(())
    }

    /// One keep-alive; the TTL granted, in ms.
    async fn renew(&self, term: &mut Term) -> Result<u64, TermError> {
        let request = LeaseKeepAliveRequest { id: term.id };
        match &term.alive {
            Some((tx, _)) => tx
                .send(request)
                .await
                .map_err(|_| TermError::Missing("keep-alive stream"))?,
            None => {
                // The first request goes in before the call: etcd answers
                // the call's headers with its first renewal.
                let (tx, rx) = mpsc::channel(1);
                let _ = tx.try_send(request);
                let answers = term
                    .lease
                    .lease_keep_alive(ReceiverStream::new(rx))
                    .await?
                    .into_inner();
                term.alive = Some((tx, answers));
            }
        }
        let Some((_, answers)) = &mut term.alive else {
            return Err(TermError::Missing("keep-alive stream"));
        };
        let answer = tokio::time::timeout(self.beat() * 2, answers.message())
            .await
            .map_err(|_| TermError::Missing("keep-alive answer in time"))??
            .ok_or(TermError::Missing("keep-alive answer"))?;
        match u64::try_from(answer.ttl) {
            Ok(ttl) if ttl > 0 => Ok(ttl * 1000),
            _ => Err(TermError::LeaseLost),
        }
    }
}

/// Counts a failure of the election and logs it (at most once a second).
fn failed(what: &'static str, error: &TermError) {
    metrics::counter!("throttle_central_election_errors_total").increment(1);
    if let Some(skipped) = FAILED.allow_now() {
        tracing::warn!(%error, skipped, "leader election: {what}");
    }
}

/// Gives lease `id` back, waiting at most 500 ms; whether etcd took it.
async fn revoke(lease: &mut LeaseClient<Channel>, id: i64) -> bool {
    let revoked = lease.lease_revoke(LeaseRevokeRequest { id });
    matches!(
        tokio::time::timeout(Duration::from_millis(500), revoked).await,
        Ok(Ok(_))
    )
}

/// Resolves once `stop` turns true (or its sender is gone).
async fn stopped(stop: &mut watch::Receiver<bool>) {
    let _ = stop.wait_for(|s| *s).await;
}

/// A channel to `endpoint`, connected.
pub(crate) async fn connect(endpoint: &str) -> Result<Channel, TermError> {
    let bad = |e| TermError::Endpoint(endpoint.to_owned(), e);
    Endpoint::from_shared(endpoint.to_owned())
        .map_err(bad)?
        .connect_timeout(Duration::from_secs(1))
        .timeout(Duration::from_secs(2))
        .connect()
        .await
        .map_err(bad)
}

/// The end of the range of keys starting with `prefix`: the prefix with
/// its last byte below 0xFF incremented (etcd's `GetPrefixRangeEnd`).
pub(crate) fn prefix_end(prefix: &[u8]) -> Vec<u8> {
    let mut end = prefix.to_vec();
    while let Some(last) = end.pop() {
        if last < 0xFF {
            end.push(last + 1);
            return end;
        }
    }
    // Every byte 0xFF: every key after the prefix.
    vec![0]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_prefix_range_ends_after_its_last_key() {
        assert_eq!(prefix_end(b"/a/"), b"/a0");
        assert_eq!(prefix_end(b"a\xFF"), b"b");
        assert_eq!(prefix_end(b"\xFF"), b"\0");
    }
}
