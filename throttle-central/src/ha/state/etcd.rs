//! [`EtcdState`]: the checkpoint in etcd, fenced by the leader's key.
//!
//! A checkpoint is written in pieces of at most [`PIECE`] bytes (etcd
//! refuses requests over 1.5 MiB by default) under a generation of its own,
//! `/throttle/state/NAME/GEN/NNNNNN`, then named current by
//! `/throttle/state/NAME/head` (`GEN COUNT`) in the transaction that
//! deletes the older generations. A reader follows the head, so it never
//! sees half a checkpoint. Every write compares the creation revision of
//! this central's campaign key with its epoch: a deposed leader's write
//! fails instead of overwriting its successor's.
//!
//! etcd keeps every revision until it is compacted: run it with
//! `--auto-compaction-retention` (as Kubernetes does), since the leader
//! writes once a second.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use crate::etcd_api::compare::{CompareResult, CompareTarget, TargetUnion};
use crate::etcd_api::kv_client::KvClient;
use crate::etcd_api::range_request::{SortOrder, SortTarget};
use crate::etcd_api::request_op::Request as Op;
use crate::etcd_api::{
    Compare, DeleteRangeRequest, PutRequest, RangeRequest, RequestOp, TxnRequest,
};
use bytes::Bytes;
use futures_util::future::BoxFuture;
use throttle_clock::{Clock, SystemClock};
use tonic::transport::Channel;

use super::{StateError, StateStore};
use crate::ha::election::{Elected, connect, prefix_end};
use crate::ha::leadership::Leadership;

/// The largest piece of a checkpoint in one etcd request.
const PIECE: usize = 1024 * 1024;

/// The checkpoint of election `name` in etcd; see the module docs.
#[derive(Debug)]
pub struct EtcdState {
    endpoints: Vec<String>,
    name: String,
    elected: Arc<Elected>,
    /// The generation of the next write: it only grows, across leaders
    /// too (it starts from the wall clock).
    generation: AtomicU64,
    /// The client of the last write or read that went through.
    client: parking_lot::Mutex<Option<KvClient<Channel>>>,
}

fn etcd(e: impl std::fmt::Display) -> StateError {
    StateError::Etcd(e.to_string())
}

impl EtcdState {
    /// The checkpoint of the election `name` on `endpoints`, written only
    /// while `elected` leads.
    pub fn new(endpoints: Vec<String>, name: &str, elected: Arc<Elected>) -> Self {
        // A thousand generations a millisecond before it meets the next
        // millisecond's start.
        let start = u64::try_from(SystemClock.now_ms())
            .unwrap_or(0)
            .saturating_mul(1000);
        Self {
            endpoints,
            name: name.to_owned(),
            elected,
            generation: AtomicU64::new(start),
            client: parking_lot::Mutex::new(None),
        }
    }

    fn key(&self, tail: &str) -> Vec<u8> {
        format!("/throttle/state/{}/{tail}", self.name).into_bytes()
    }

    /// The client that worked last, or one on the first endpoint that
    /// answers.
    async fn client(&self) -> Result<KvClient<Channel>, StateError> {
        if let Some(kv) = self.client.lock().clone() {
            return Ok(kv);
        }
        let mut last = StateError::Etcd("no endpoint".into());
        for endpoint in &self.endpoints {
            match connect(endpoint).await {
                Ok(channel) => {
                    let kv = KvClient::new(channel);
                    *self.client.lock() = Some(kv.clone());
                    return Ok(kv);
                }
                Err(e) => last = etcd(e),
            }
        }
        Err(last)
    }

    /// The check every write makes: this central's key is the one that
    /// made it leader.
    fn fence(&self) -> Result<Compare, StateError> {
        let epoch = self.elected.epoch();
        if !self.elected.is_leader() || epoch == 0 {
            return Err(StateError::Deposed);
        }
        Ok(Compare {
            result: CompareResult::Equal as i32,
            target: CompareTarget::Create as i32,
            key: self.elected.key(),
            target_union: Some(TargetUnion::CreateRevision(
                i64::try_from(epoch).unwrap_or(i64::MAX),
            )),
        })
    }

    /// Runs `ops` if the fence holds.
    async fn fenced(&self, kv: &mut KvClient<Channel>, ops: Vec<Op>) -> Result<(), StateError> {
        let txn = TxnRequest {
            compare: vec![self.fence()?],
            success: ops
                .into_iter()
                .map(|request| RequestOp {
                    request: Some(request),
                })
                .collect(),
            failure: Vec::new(),
        };
        let answer = kv.txn(txn).await.map_err(etcd)?.into_inner();
        if answer.succeeded {
            Ok(())
        } else {
            Err(StateError::Deposed)
        }
    }

    async fn write(&self, checkpoint: Bytes) -> Result<(), StateError> {
        let mut kv = self.client().await?;
        let generation = self.generation.fetch_add(1, Ordering::Relaxed);
        let gen_key = |tail: &str| self.key(&format!("{generation:020}/{tail}"));
        let mut count = 0;
        for (i, piece) in checkpoint.chunks(PIECE).enumerate() {
            let put = Op::RequestPut(PutRequest {
                key: gen_key(&format!("{i:06}")),
                value: piece.to_vec(),
                ..PutRequest::default()
            });
            self.fenced(&mut kv, vec![put]).await?;
            count += 1;
        }
        let head = Op::RequestPut(PutRequest {
            key: self.key("head"),
            value: format!("{generation:020} {count}").into_bytes(),
            ..PutRequest::default()
        });
        // Older generations sort before this one (and "head" after all).
        let older = Op::RequestDeleteRange(DeleteRangeRequest {
            key: self.key("0"),
            range_end: gen_key(""),
        });
        self.fenced(&mut kv, vec![head, older]).await
    }

    async fn read(&self) -> Result<Option<Bytes>, StateError> {
        let mut kv = self.client().await?;
        let head = RangeRequest {
            key: self.key("head"),
            ..RangeRequest::default()
        };
        let head = kv.range(head).await.map_err(etcd)?.into_inner();
        let Some(head) = head.kvs.first() else {
            return Ok(None);
        };
        let text = String::from_utf8_lossy(&head.value).into_owned();
        let parsed = text
            .split_once(' ')
            .and_then(|(g, n)| Some((g.to_owned(), n.parse::<usize>().ok()?)));
        let Some((generation, count)) = parsed else {
            return Err(StateError::Corrupt(format!("head {text:?}")));
        };
        let prefix = self.key(&format!("{generation}/"));
        let pieces = RangeRequest {
            range_end: prefix_end(&prefix),
            key: prefix,
            sort_order: SortOrder::Ascend as i32,
            sort_target: SortTarget::Key as i32,
            ..RangeRequest::default()
        };
        let pieces = kv.range(pieces).await.map_err(etcd)?.into_inner();
        if pieces.kvs.len() != count {
            let found = pieces.kvs.len();
            return Err(StateError::Corrupt(format!(
                "generation {generation}: {found} of {count} pieces"
            )));
        }
        let whole: Vec<u8> = pieces.kvs.into_iter().flat_map(|kv| kv.value).collect();
        Ok(Some(Bytes::from(whole)))
    }
}

impl EtcdState {
    /// Forgets the client after a failure that may be its connection's.
    fn forget_client<T>(&self, result: Result<T, StateError>) -> Result<T, StateError> {
        if matches!(result, Err(StateError::Etcd(_))) {
            *self.client.lock() = None;
        }
        result
    }
}

impl StateStore for EtcdState {
    fn load(&self) -> BoxFuture<'_, Result<Option<Bytes>, StateError>> {
        Box::pin(async move { self.forget_client(self.read().await) })
    }

    fn save(&self, checkpoint: Bytes) -> BoxFuture<'_, Result<(), StateError>> {
        Box::pin(async move { self.forget_client(self.write(checkpoint).await) })
    }

    fn describe(&self) -> String {
        format!(
            "etcd {} /throttle/state/{}",
            self.endpoints.join(","),
            self.name
        )
    }
}
