//! [`EtcdLimits`]: the limits document kept in etcd, under one key, so
//! that every central of a fleet reads the same limits.
//!
//! The value of the key is the TOML of a limits file (see the
//! [module docs](super)); `etcdctl put /throttle/limits "$(cat limits.toml)"`
//! writes it. Each central reads it at start and then follows it with an
//! etcd watch: a new value is applied as soon as etcd reports it, a broken
//! one keeps the limits in force and is reported by the monitor API, as a
//! broken file is. A key that is missing at start means no limits (with a
//! warning); one deleted later keeps the limits last read, as a deleted
//! file does.
//!
//! The admin API edits the document with a compare-and-swap on the key's
//! revision, so two centrals editing at once never lose one another's
//! change: the one that lost reads the key again and edits that.

use std::sync::Arc;
use std::time::Duration;

use crate::etcd_api::compare::{CompareResult, CompareTarget, TargetUnion};
use crate::etcd_api::event::EventType;
use crate::etcd_api::kv_client::KvClient;
use crate::etcd_api::request_op::Request as Op;
use crate::etcd_api::watch_client::WatchClient;
use crate::etcd_api::watch_request::RequestUnion;
use crate::etcd_api::{
    Compare, PutRequest, RangeRequest, RequestOp, TxnRequest, WatchCreateRequest, WatchRequest,
};
use futures_util::StreamExt;
use throttle_proto::causes;
use tokio::sync::watch;
use tonic::transport::Channel;

use super::{EditError, LimitSet, LimitsError, Snapshots};
use crate::ha::election::connect;
use crate::log::Throttled;
use crate::watched::Published;

/// The largest document written: etcd refuses requests over 1.5 MiB
/// unless started with a larger `--max-request-bytes`.
pub const MAX_DOCUMENT_BYTES: usize = 1024 * 1024 + 512 * 1024 - 4096;

/// Tries of an edit that keeps losing its compare-and-swap.
const EDIT_TRIES: usize = 10;

/// Lines about a watch that failed, at most once a second.
static WATCH_FAILED: Throttled = Throttled::new();

/// The key's value and its revision, as read.
#[derive(Debug, Clone, PartialEq)]
struct Value {
    /// `None`: no such key.
    text: Option<Vec<u8>>,
    /// The key's last modification (0: missing).
    mod_revision: i64,
}

/// Limits kept in etcd under one key; see the module docs.
#[derive(Debug)]
pub struct EtcdLimits {
    endpoints: Vec<String>,
    key: String,
    published: Published<LimitSet>,
    /// The revision last applied or refused: a value is parsed once.
    /// -1 before the first read.
    seen: parking_lot::Mutex<i64>,
    /// The channel of the last request that went through.
    channel: parking_lot::Mutex<Option<Channel>>,
}

impl EtcdLimits {
    /// Reads `key` on the first of `endpoints` that answers.
    ///
    /// # Errors
    ///
    /// [`LimitsError::Etcd`] when no endpoint answers, or the
    /// [`LimitsError`] of a broken document: a central should not start
    /// without knowing its limits.
    pub async fn open(endpoints: Vec<String>, key: &str) -> Result<Self, LimitsError> {
        let this = Self {
            endpoints,
            key: key.to_owned(),
            published: Published::new(LimitSet::new()),
            seen: parking_lot::Mutex::new(-1),
            channel: parking_lot::Mutex::new(None),
        };
        let value = this
            .read()
            .await
            .map_err(|message| this.etcd_error(message))?;
        if value.text.is_none() {
            tracing::warn!(key = %this.key, "no limits in etcd yet: nobody is limited");
            *this.seen.lock() = 0;
            return Ok(this);
        }
        this.apply(&value)?;
        Ok(this)
    }

    /// The key this reads.
    pub fn key(&self) -> &str {
        &self.key
    }

    /// The limits in force.
    pub fn current(&self) -> Arc<LimitSet> {
        self.published.current()
    }

    fn etcd_error(&self, message: String) -> LimitsError {
        LimitsError::Etcd {
            key: self.key.clone(),
            message,
        }
    }

    /// A channel to the first endpoint that answers, or the one that
    /// worked last.
    async fn channel(&self) -> Result<Channel, String> {
        if let Some(channel) = self.channel.lock().clone() {
            return Ok(channel);
        }
        let mut last = "no etcd endpoint".to_owned();
        for endpoint in &self.endpoints {
            match connect(endpoint).await {
                Ok(channel) => {
                    *self.channel.lock() = Some(channel.clone());
                    return Ok(channel);
                }
                Err(e) => last = causes(&e),
            }
        }
        Err(last)
    }

    /// Forgets the channel after a failure that may be its connection's.
    fn failed(&self, e: &dyn std::error::Error) -> String {
        *self.channel.lock() = None;
        causes(e)
    }

    /// The key's value now, and the store's revision it was read at.
    async fn read_at(&self) -> Result<(Value, i64), String> {
        let mut kv = KvClient::new(self.channel().await?);
        let range = RangeRequest {
            key: self.key.as_bytes().to_vec(),
            ..RangeRequest::default()
        };
        let answer = kv.range(range).await.map_err(|e| self.failed(&e))?;
        let answer = answer.into_inner();
        let revision = answer.header.map_or(0, |h| h.revision);
        let value = match answer.kvs.into_iter().next() {
            Some(kv) => Value {
                text: Some(kv.value),
                mod_revision: kv.mod_revision,
            },
            None => Value {
                text: None,
                mod_revision: 0,
            },
        };
        Ok((value, revision))
    }

    async fn read(&self) -> Result<Value, String> {
        Ok(self.read_at().await?.0)
    }

    /// Installs `value` unless its revision was seen already; returns
    /// whether the limits changed.
    ///
    /// # Errors
    ///
    /// Why the value is not limits (the key deleted, not UTF-8, empty, not
    /// a limits document); the limits in force stay.
    fn apply(&self, value: &Value) -> Result<bool, LimitsError> {
        let mut seen = self.seen.lock();
        // Revisions only grow: an older one (a watch behind an edit this
        // central made) is skipped too.
        if value.mod_revision <= *seen {
            return Ok(false);
        }
        *seen = value.mod_revision;
        drop(seen);
        let parsed = self.parse(value.text.as_deref());
        match parsed {
            Ok(set) => {
                if set.is_empty() {
                    tracing::warn!(key = %self.key, "the limits in etcd list none: nobody is limited");
                }
                self.published.publish(set);
                Ok(true)
            }
            Err(e) => {
                self.published.fail(e.to_string());
                Err(e)
            }
        }
    }

    fn parse(&self, text: Option<&[u8]>) -> Result<LimitSet, LimitsError> {
        let bad = |m: &str| self.etcd_error(m.to_owned());
        let text = text.ok_or_else(|| bad("the key was deleted; the limits last read stay"))?;
        let text = std::str::from_utf8(text).map_err(|_| bad("the value is not UTF-8"))?;
        if text.is_empty() {
            return Err(bad(
                "the value is empty; write at least a comment to mean no limits",
            ));
        }
        LimitSet::from_toml(text)
    }

    /// Follows the key until `stop`: every new value is applied, and
    /// `changed` called when the limits change. A failed watch is logged
    /// (at most once a second), counted in
    /// `throttle_central_limits_reload_errors_total`, and started again
    /// from a fresh read after `retry`.
    pub async fn follow(
        &self,
        changed: impl Fn() + Send,
        retry: Duration,
        mut stop: watch::Receiver<bool>,
    ) {
        loop {
            let ended = tokio::select! {
                ended = self.watch(&changed) => ended,
                _ = stop.changed() => return,
            };
            metrics::counter!("throttle_central_limits_reload_errors_total").increment(1);
            if let Some(skipped) = WATCH_FAILED.allow_now() {
                tracing::warn!(key = %self.key, error = %ended, skipped, "watching the limits in etcd failed; reading them again");
            }
            tokio::select! {
                _ = tokio::time::sleep(retry) => {}
                _ = stop.changed() => return,
            }
        }
    }

    /// Reads the key, then applies each change etcd reports; returns why
    /// the watch ended.
    async fn watch(&self, changed: &impl Fn()) -> String {
        let (value, revision) = match self.read_at().await {
            Ok(read) => read,
            Err(e) => return e,
        };
        self.take(&value, changed);
        let channel = match self.channel().await {
            Ok(channel) => channel,
            Err(e) => return e,
        };
        let create = WatchRequest {
            request_union: Some(RequestUnion::CreateRequest(WatchCreateRequest {
                key: self.key.as_bytes().to_vec(),
                start_revision: revision + 1,
                ..WatchCreateRequest::default()
            })),
        };
        // The request stream stays open: etcd ends a watch whose client
        // closed its side.
        let requests = futures_util::stream::iter([create]).chain(futures_util::stream::pending());
        let mut responses = match WatchClient::new(channel).watch(requests).await {
            Ok(r) => r.into_inner(),
            Err(e) => return self.failed(&e),
        };
        loop {
            let response = match responses.message().await {
                Ok(Some(response)) => response,
                Ok(None) => return "etcd ended the watch".into(),
                Err(e) => return self.failed(&e),
            };
            if response.canceled || response.compact_revision != 0 {
                return format!("etcd cancelled the watch: {}", response.cancel_reason);
            }
            let Some(last) = response.events.last() else {
                continue;
            };
            let kv = last.kv.clone().unwrap_or_default();
            let deleted = last.r#type == EventType::Delete as i32;
            let value = Value {
                text: (!deleted).then_some(kv.value),
                mod_revision: kv.mod_revision,
            };
            self.take(&value, changed);
        }
    }

    /// Applies `value`, logging the outcome.
    fn take(&self, value: &Value, changed: &impl Fn()) {
        match self.apply(value) {
            Ok(true) => {
                tracing::info!(key = %self.key, revision = value.mod_revision, "limits read from etcd");
                metrics::gauge!("throttle_central_limits_reload_ok").set(1.0);
                changed();
            }
            Ok(false) => {}
            Err(e) => {
                metrics::counter!("throttle_central_limits_reload_errors_total").increment(1);
                metrics::gauge!("throttle_central_limits_reload_ok").set(0.0);
                tracing::error!(key = %self.key, error = %e, "limits in etcd refused; keeping the previous ones");
            }
        }
    }

    /// Edits the document: `change` gets its text (empty if the key is
    /// missing) and returns the new one, written only if the key has not
    /// changed since it was read (else read again and edited again), then
    /// applied at once.
    ///
    /// # Errors
    ///
    /// [`EditError`] from `change` or the new document, or
    /// [`EditError::Etcd`] when etcd cannot be reached, the document would
    /// be over [`MAX_DOCUMENT_BYTES`] or the key kept changing.
    pub async fn edit(
        &self,
        change: impl Fn(&str) -> Result<String, EditError>,
    ) -> Result<(), EditError> {
        for _ in 0..EDIT_TRIES {
            let read = self.read().await.map_err(EditError::Etcd)?;
            let text = match &read.text {
                Some(bytes) => std::str::from_utf8(bytes)
                    .map_err(|_| EditError::File("the value in etcd is not UTF-8".into()))?,
                None => "",
            };
            let new = change(text)?;
            if new.len() > MAX_DOCUMENT_BYTES {
                return Err(EditError::Etcd(format!(
                    "the limits would be {} bytes, over the {MAX_DOCUMENT_BYTES} etcd takes in one request",
                    new.len()
                )));
            }
            if let Some(revision) = self.swap(read.mod_revision, new.as_bytes()).await? {
                let value = Value {
                    text: Some(new.into_bytes()),
                    mod_revision: revision,
                };
                self.apply(&value)?;
                return Ok(());
            }
        }
        Err(EditError::Etcd(format!(
            "the key changed under each of {EDIT_TRIES} edits"
        )))
    }

    /// Puts `value` if the key's last modification is still `was` (0:
    /// missing); the put's revision, or `None` if the key had changed.
    async fn swap(&self, was: i64, value: &[u8]) -> Result<Option<i64>, EditError> {
        let channel = self.channel().await.map_err(EditError::Etcd)?;
        let key = self.key.as_bytes().to_vec();
        let txn = TxnRequest {
            compare: vec![Compare {
                result: CompareResult::Equal as i32,
                target: CompareTarget::Mod as i32,
                key: key.clone(),
                target_union: Some(TargetUnion::ModRevision(was)),
            }],
            success: vec![RequestOp {
                request: Some(Op::RequestPut(PutRequest {
                    key,
                    value: value.to_vec(),
                    ..PutRequest::default()
                })),
            }],
            failure: Vec::new(),
        };
        let answer = KvClient::new(channel).txn(txn).await;
        let answer = answer.map_err(|e| EditError::Etcd(self.failed(&e)))?;
        let answer = answer.into_inner();
        Ok(answer
            .succeeded
            .then(|| answer.header.map_or(0, |h| h.revision)))
    }
}

impl Snapshots for EtcdLimits {
    fn snapshot(&self) -> Arc<LimitSet> {
        self.published.current()
    }

    fn snapshot_version(&self) -> u64 {
        self.published.version()
    }

    fn snapshot_error(&self) -> Option<String> {
        self.published.last_error()
    }
}
