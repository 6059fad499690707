//! One Envoy proxy's RLQS stream: its usage reports filed, a slot at a
//! time, as a node's reports are; its buckets told their share.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::time::Duration;

use envoy_types::pb::envoy::service::rate_limit_quota::v3::rate_limit_quota_response::BucketAction;
use envoy_types::pb::envoy::service::rate_limit_quota::v3::rate_limit_quota_response::bucket_action::{
    self, AbandonAction, QuotaAssignmentAction,
};
use envoy_types::pb::envoy::service::rate_limit_quota::v3::rate_limit_quota_usage_reports::BucketQuotaUsage;
use envoy_types::pb::envoy::service::rate_limit_quota::v3::{
    RateLimitQuotaResponse, RateLimitQuotaUsageReports,
};
use futures_util::StreamExt;
use metrics::counter;
use throttle_proto::v1;
use throttle_proto::MAX_NAME_LEN;
use tokio::sync::mpsc;
use tonic::{Status, Streaming};

use super::backfill::{Backfill, MAX_SLOTS};
use super::bucket_rule::duration;
use super::buckets::{Action, Buckets, FirstTold, Timing};
use super::settings::{StreamSettings, USER_KEY};
use super::shares::{REQUESTS, Shares};
use crate::log::{Throttled, peer};
use crate::server::{Heard, Link, NotFiled, restored};

/// Envoy's report interval, whatever its configuration says.
const REPORT_EVERY_S: i64 = 5;

/// A bucket unused for 12 report intervals is abandoned.
const IDLE_S: i64 = 12 * REPORT_EVERY_S;

/// Lines about refused reports and buckets, at most once a second.
static REFUSED: Throttled = Throttled::new();

/// One proxy's stream: what it holds while it runs.
pub(super) struct RlqsSession {
    settings: StreamSettings,
    node_id: String,
    addr: Option<SocketAddr>,
    /// The report's domain: the service.
    service: Option<String>,
    link: Link,
    backfill: Backfill,
    buckets: Buckets,
    shares: Shares,
    /// The first shares the ledger was told, per user.
    first_told: FirstTold,
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
        let slot_ms = settings.slot.as_ms();
        Self {
            buckets: Buckets::new(USER_KEY),
            link: Link::new(settings.commands.clone()),
            settings,
            node_id,
            addr,
            service: None,
            backfill: Backfill::default(),
            shares: Shares::new(slot_ms),
            first_told: FirstTold::new(),
            out,
        }
    }

    /// Serves the stream until it ends.
    pub(super) async fn run(mut self, mut inbound: Streaming<RateLimitQuotaUsageReports>) {
        let mut deposed = self.settings.leadership.deposed();
        let end = loop {
            let wait = self.until_next_slot();
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
                        self.shares.absorb(self.service.as_deref(), m);
                        self.tell().await;
                    }
                    Heard::Closed => break Some(Status::unavailable("the central stopped")),
                },
                () = tokio::time::sleep(wait) => {
                    if let Err(status) = self.file_carried().await {
                        break Some(status);
                    }
                    self.tell().await;
                }
                () = &mut deposed => break Some(Status::unavailable("no longer the leader")),
            }
        };
        self.close(end).await;
    }

    fn slot_now(&self) -> i64 {
        self.settings.slot.slot_at(self.settings.clock.now_ms())
    }

    /// How far into the current slot now is, from 0 to 1.
    fn share_of_slot_passed(&self) -> f64 {
        let slot = self.settings.slot;
        let into = slot.offset_in_slot(self.settings.clock.now_ms());
        into.as_secs_f64() / slot.as_duration().as_secs_f64()
    }

    /// Time until 20 ms into the next slot, when the shares are told again.
    fn until_next_slot(&self) -> Duration {
        let now = self.settings.clock.now_ms();
        let next = self
            .settings
            .slot
            .start_ms(self.settings.slot.slot_at(now) + 1)
            + 20;
        Duration::from_millis(u64::try_from(next - now).unwrap_or(0))
    }

    /// Takes one usage report: the domain, each bucket's usage to file,
    /// and an answer at once for buckets new to the stream.
    async fn take(&mut self, reports: RateLimitQuotaUsageReports) -> Result<(), Status> {
        let domain = reports.domain;
        match &self.service {
            Some(service) if *service != domain => {
                return Err(self.refuse("domain", format!("the domain changed from {service:?}")));
            }
            Some(_) => {}
            None => {
                self.open(domain).await?;
                // The service's limits and blocks, queued as it opened.
                self.drain()?;
            }
        }
        let slot = self.slot_now();
        let before = self.buckets.len();
        // Per user: a user may have several buckets.
        let mut users: BTreeMap<String, (u64, u64, usize)> = BTreeMap::new();
        for usage in reports.bucket_quota_usages {
            if let Some((user, a, d, covered)) = self.take_usage(usage, slot) {
                let sum = users.entry(user).or_default();
                *sum = (
                    sum.0.saturating_add(a),
                    sum.1.saturating_add(d),
                    sum.2.max(covered),
                );
            }
        }
        let into = self.share_of_slot_passed();
        for (data_slot, due) in self.backfill.split(users, slot, into) {
            self.file(data_slot + 1, due).await?;
        }
        if self.buckets.len() > before {
            self.tell().await;
        }
        Ok(())
    }

    /// One bucket's usage: its user, what it admitted and denied, and the
    /// slots it covers; `None` for a bucket not filed (no user, past the
    /// cap, an absurd count), counted.
    fn take_usage(
        &mut self,
        usage: BucketQuotaUsage,
        slot: i64,
    ) -> Option<(String, u64, u64, usize)> {
        let Some(id) = usage.bucket_id else {
            counter!("throttle_central_invalid_messages_total", "reason" => "rlqs_bucket")
                .increment(1);
            return None;
        };
        let max = u64::try_from(self.settings.max_amount).unwrap_or(u64::MAX);
        let (allowed, denied) = (usage.num_requests_allowed, usage.num_requests_denied);
        if allowed > max || denied > max {
            let why = format!("{allowed} allowed, {denied} denied: above the largest amount {max}");
            self.refuse("rlqs_amount", why);
            return None;
        }
        let used = allowed + denied > 0;
        // The slots the report covers.
        let slot_ms = i64::from(self.settings.slot.as_ms()).max(1);
        let elapsed_ms = usage
            .time_elapsed
            .map_or(0, |d| d.seconds.clamp(0, 3_600) * 1_000);
        let covered = (elapsed_ms / slot_ms).clamp(0, MAX_SLOTS as i64) as usize;
        match self.buckets.seen(&id, used, slot) {
            Ok(Some(user)) if user.len() <= MAX_NAME_LEN => {
                Some((user.to_owned(), allowed, denied, covered))
            }
            Ok(_) => {
                counter!("throttle_central_rlqs_buckets_without_user_total").increment(1);
                None
            }
            Err(()) => {
                counter!("throttle_central_rlqs_buckets_at_cap_total").increment(1);
                None
            }
        }
    }

    /// Registers the proxy with the ledger's task, for the service
    /// `domain`, as a node stream's Hello does.
    async fn open(&mut self, domain: String) -> Result<(), Status> {
        if domain.is_empty() || domain.len() > MAX_NAME_LEN {
            return Err(self.refuse(
                "domain",
                format!("the domain must be 1 to {MAX_NAME_LEN} bytes"),
            ));
        }
        if !restored(
            self.settings.restored.as_ref(),
            self.settings.leadership.epoch(),
        )
        .await
        {
            return Err(Status::unavailable("restoring the checkpoint; try again"));
        }
        let hello = v1::Hello {
            node_id: self.node_id.clone(),
            slot_ms: self.settings.slot.as_ms(),
            services: vec![domain.clone()],
            version: "envoy-rlqs".to_owned(),
            accepts: Vec::new(),
            resumes: false,
            report_every_ms: (REPORT_EVERY_S * 1_000) as u32,
        };
        let linked = self.link.connect(hello, self.addr).await;
        linked.map_err(|_| Status::unavailable("the central stopped"))?;
        let user_key = self.settings.limits.envoy_user_key(&domain);
        self.buckets = Buckets::new(user_key.as_deref().unwrap_or(USER_KEY));
        self.service = Some(domain);
        Ok(())
    }

    /// Files what came while no slot was left for it, in the slot that
    /// just ended, if it is not filed yet.
    async fn file_carried(&mut self) -> Result<(), Status> {
        match self.backfill.rest(self.slot_now() - 1) {
            Some((data_slot, due)) => self.file(data_slot + 1, due).await,
            None => Ok(()),
        }
    }

    /// Files `due` as the proxy's report of slot `slot` (data of the slot
    /// before), and takes the ledger's answer.
    async fn file(&mut self, slot: i64, due: Vec<(String, u64, u64)>) -> Result<(), Status> {
        let Some(service) = &self.service else {
            return Ok(());
        };
        let usage = |pick: fn(&(String, u64, u64)) -> u64| {
            let users = due
                .iter()
                .filter(|d| pick(d) > 0)
                .map(|d| {
                    let amount = i64::try_from(pick(d)).unwrap_or(i64::MAX);
                    let resources = [(REQUESTS.to_owned(), amount)].into();
                    (d.0.clone(), v1::Amounts { resources })
                })
                .collect();
            BTreeMap::from([(service.clone(), v1::Usage { users })])
        };
        let report = v1::Report {
            node_id: self.node_id.clone(),
            slot_number: slot,
            consumption: usage(|d| d.1),
            rejection: usage(|d| d.2),
            packed: Vec::new(),
            answered: false,
        };
        match self.link.file(report).await {
            Ok(()) => self.drain(),
            Err(NotFiled::Refused(status)) => Err(status),
            Err(NotFiled::Stopped) => Err(Status::unavailable("the central stopped")),
        }
    }

    /// Takes every message the ledger has queued.
    fn drain(&mut self) -> Result<(), Status> {
        let (shares, service) = (&mut self.shares, self.service.as_deref());
        match self.link.drain(|m| shares.absorb(service, m)) {
            true => Ok(()),
            false => Err(Status::unavailable("the central stopped")),
        }
    }

    /// Sends the proxy the assignments due now.
    async fn tell(&mut self) {
        let slot_s = i64::from(self.settings.slot.as_ms()).max(1);
        let slots = |s: i64| (s * 1_000 / slot_s).max(1);
        let timing = Timing {
            // Sent again before half its life has passed.
            refresh: slots(self.settings.ttl_s / 2),
            idle: slots(IDLE_S),
            fresh: slots(REPORT_EVERY_S + 1),
        };
        let actions = self.buckets.due(&self.shares, self.slot_now(), timing);
        if actions.is_empty() {
            return;
        }
        tracing::debug!(node_id = %self.node_id, ?actions, "RLQS assignments");
        self.tell_first_shares(timing.fresh).await;
        let ttl_s = u64::try_from(self.settings.ttl_s).unwrap_or(u64::MAX);
        let ttl = Some(duration(Duration::from_secs(ttl_s)));
        let bucket_action = actions
            .into_iter()
            .map(|action| match action {
                Action::Assign(id, assignment) => BucketAction {
                    bucket_id: Some(id),
                    bucket_action: Some(bucket_action::BucketAction::QuotaAssignmentAction(
                        QuotaAssignmentAction {
                            assignment_time_to_live: ttl,
                            rate_limit_strategy: Some(assignment.strategy()),
                        },
                    )),
                },
                Action::Abandon(id) => BucketAction {
                    bucket_id: Some(id),
                    bucket_action: Some(bucket_action::BucketAction::AbandonAction(
                        AbandonAction {},
                    )),
                },
            })
            .collect();
        let _ = self
            .out
            .send(Ok(RateLimitQuotaResponse { bucket_action }))
            .await;
    }

    /// Tells the ledger the first shares its buckets were told that it
    /// does not know yet, for the quota policy to count until the proxy
    /// reports their slots.
    async fn tell_first_shares(&mut self, fresh: i64) {
        let Some(service) = &self.service else { return };
        let told = self.buckets.first_shares(self.slot_now(), fresh);
        let slot_s = f64::from(self.settings.slot.as_ms()) / 1_000.0;
        for (user, (slots, tokens)) in &told {
            if self.first_told.get(user) != Some(&(slots.clone(), *tokens)) {
                let per_slot = f64::from(*tokens) * slot_s;
                let _ = self
                    .link
                    .first_share(service, user, slots.clone(), per_slot)
                    .await;
            }
        }
        self.first_told = told;
    }

    /// Files what is left and leaves the ledger; ends the stream with
    /// `status`, if any.
    async fn close(mut self, status: Option<Status>) {
        if let Some((data_slot, rest)) = self.backfill.last_rest(self.slot_now()) {
            let _ = self.file(data_slot + 1, rest).await;
        }
        self.link.disconnect().await;
        if let Some(status) = status {
            let _ = self.out.send(Err(status)).await;
        }
    }

    fn refuse(&self, reason: &'static str, why: String) -> Status {
        counter!("throttle_central_invalid_messages_total", "reason" => reason).increment(1);
        if let Some(skipped) = REFUSED.allow_now() {
            let (node_id, addr) = (&self.node_id, peer(self.addr));
            tracing::warn!(reason, %node_id, %addr, skipped, "RLQS report refused: {why}");
        }
        Status::invalid_argument(why)
    }
}
