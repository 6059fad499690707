//! One Envoy proxy's RLQS stream: its [`RlqsStream`] run against the
//! ledger's task and the proxy's gRPC stream.

use std::net::SocketAddr;

use envoy_types::pb::envoy::service::rate_limit_quota::v3::{
    RateLimitQuotaResponse, RateLimitQuotaUsageReports,
};
use futures_util::StreamExt;
use throttle_proto::v1;
use tokio::sync::mpsc;
use tonic::{Status, Streaming};

use super::settings::StreamSettings;
use super::stream::{Refused, RlqsStream};
use crate::ledger_task::{Heard, Link, NotFiled, restored};
use crate::log::{Throttled, peer};

/// Lines about refused reports and buckets, at most once a second.
static REFUSED: Throttled = Throttled::new();

/// One proxy's stream: what it holds while it runs.
pub(super) struct RlqsSession {
    settings: StreamSettings,
    addr: Option<SocketAddr>,
    link: Link,
    stream: RlqsStream,
    out: mpsc::Sender<Result<RateLimitQuotaResponse, Status>>,
}

impl RlqsSession {
    /// A session of proxy `node_id`, whose messages go to `out`.
    pub(super) fn new(
        settings: StreamSettings,
        node_id: String,
        addr: Option<SocketAddr>,
        out: mpsc::Sender<Result<RateLimitQuotaResponse, Status>>,
    ) -> Self {
        let (slot, max, ttl) = (settings.slot, settings.max_amount, settings.ttl_s);
        Self {
            link: Link::new(settings.commands.clone()),
            stream: RlqsStream::new(node_id, slot, max, ttl),
            settings,
            addr,
            out,
        }
    }

    /// Serves the stream until it ends.
    pub(super) async fn run(mut self, mut inbound: Streaming<RateLimitQuotaUsageReports>) {
        let mut deposed = self.settings.leadership.deposed();
        let end = loop {
            let wait = self.stream.until_next_slot(self.now_ms());
            tokio::select! {
                next = inbound.next() => match next {
                    Some(Ok(reports)) => {
                        if let Err(status) = self.take(reports).await {
                            break Some(status);
                        }
                    }
                    Some(Err(_)) | None => break None,
                },
                heard = self.link.heard() => match heard {
                    Heard::Message(m) => {
                        self.stream.absorb(m);
                        self.tell().await;
                    }
                    Heard::Closed => break Some(Status::unavailable("the central stopped")),
                },
                () = tokio::time::sleep(wait) => {
                    if let Some(report) = self.stream.carried(self.now_ms())
                        && let Err(status) = self.file(report).await
                    {
                        break Some(status);
                    }
                    self.tell().await;
                }
                () = &mut deposed => break Some(Status::unavailable("no longer the leader")),
            }
        };
        self.close(end).await;
    }

    fn now_ms(&self) -> i64 {
        self.settings.clock.now_ms()
    }

    /// Takes one usage report: the domain, each bucket's usage to file,
    /// and an answer at once for buckets new to the stream.
    async fn take(&mut self, reports: RateLimitQuotaUsageReports) -> Result<(), Status> {
        let domain = reports.domain;
        if self.stream.opens(&domain).map_err(|r| self.refuse(r))? {
            self.open(domain).await?;
            // The service's limits and blocks, queued as it opened.
            self.drain()?;
        }
        let taken = self.stream.take(reports.bucket_quota_usages, self.now_ms());
        if let Some(refused) = taken.refused {
            self.log_refused(&refused);
        }
        for report in taken.reports {
            self.file(report).await?;
        }
        if taken.new_buckets {
            self.tell().await;
        }
        Ok(())
    }

    /// Registers the proxy with the ledger's task, for the service
    /// `domain`, as a node stream's Hello does.
    async fn open(&mut self, domain: String) -> Result<(), Status> {
        if !restored(
            self.settings.restored.as_ref(),
            self.settings.leadership.epoch(),
        )
        .await
        {
            return Err(Status::unavailable("restoring the checkpoint; try again"));
        }
        let linked = self
            .link
            .connect(self.stream.hello(&domain), self.addr)
            .await;
        linked.map_err(|_| Status::unavailable("the central stopped"))?;
        let user_key = self.settings.limits.envoy_user_key(&domain);
        self.stream.opened(domain, user_key.as_deref());
        Ok(())
    }

    /// Files `report` and takes the ledger's answer.
    async fn file(&mut self, report: v1::Report) -> Result<(), Status> {
        match self.link.file(report).await {
            Ok(()) => self.drain(),
            Err(NotFiled::Refused(status)) => Err(status),
            Err(NotFiled::Stopped) => Err(Status::unavailable("the central stopped")),
        }
    }

    /// Takes every message the ledger has queued.
    fn drain(&mut self) -> Result<(), Status> {
        let stream = &mut self.stream;
        match self.link.drain(|m| stream.absorb(m)) {
            true => Ok(()),
            false => Err(Status::unavailable("the central stopped")),
        }
    }

    /// Sends the proxy the assignments due now, after telling the ledger
    /// the first shares they give, for the quota policy to count until
    /// the proxy reports their slots.
    async fn tell(&mut self) {
        let told = self.stream.due(self.now_ms());
        let Some(response) = told.response else {
            return;
        };
        if let Some(service) = self.stream.service() {
            for share in told.first_shares {
                let _ = (self.link)
                    .first_share(service, &share.user, share.slots, share.per_slot)
                    .await;
            }
        }
        let _ = self.out.send(Ok(response)).await;
    }

    /// Files what is left and leaves the ledger; ends the stream with
    /// `status`, if any.
    async fn close(mut self, status: Option<Status>) {
        if let Some(report) = self.stream.last(self.now_ms()) {
            let _ = self.file(report).await;
        }
        self.link.disconnect().await;
        if let Some(status) = status {
            let _ = self.out.send(Err(status)).await;
        }
    }

    /// The status of a refused report, logged and counted.
    fn refuse(&self, refused: Refused) -> Status {
        let reason = refused.reason;
        metrics::counter!("throttle_central_invalid_messages_total", "reason" => reason)
            .increment(1);
        self.log_refused(&refused);
        Status::invalid_argument(refused.why)
    }

    /// Logs `refused`, at most once a second.
    fn log_refused(&self, refused: &Refused) {
        if let Some(skipped) = REFUSED.allow_now() {
            let (node_id, addr) = (self.stream.node_id(), peer(self.addr));
            let (reason, why) = (refused.reason, &refused.why);
            tracing::warn!(reason, %node_id, %addr, skipped, "RLQS report refused: {why}");
        }
    }
}
