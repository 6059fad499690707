//! [`RlqsStream`]: one Envoy proxy's RLQS stream without its IO: the
//! reports it files, the assignments it tells, on a clock it is given.
//!
//! The gRPC session (`session`) runs it against the ledger's task;
//! the simulator runs it against an `Assigner` in virtual time.

use std::collections::BTreeMap;
use std::ops::RangeInclusive;
use std::time::Duration;

use envoy_types::pb::envoy::service::rate_limit_quota::v3::rate_limit_quota_response::BucketAction;
use envoy_types::pb::envoy::service::rate_limit_quota::v3::rate_limit_quota_response::bucket_action::{
    self, AbandonAction, QuotaAssignmentAction,
};
use envoy_types::pb::envoy::service::rate_limit_quota::v3::rate_limit_quota_usage_reports::BucketQuotaUsage;
use envoy_types::pb::envoy::service::rate_limit_quota::v3::RateLimitQuotaResponse;
use metrics::counter;
use throttle_clock::SlotLength;
use throttle_proto::MAX_NAME_LEN;
use throttle_proto::v1;

use super::backfill::{Backfill, MAX_SLOTS, SlotUsage};
use super::bucket_rule::duration;
use super::buckets::{Action, Buckets, FirstTold, Timing};
use super::settings::USER_KEY;
use super::shares::{REQUESTS, Shares};

/// Envoy's report interval, whatever its configuration says.
pub const REPORT_EVERY_S: i64 = 5;

/// A bucket unused for 12 report intervals is abandoned.
const IDLE_S: i64 = 12 * REPORT_EVERY_S;

/// A message or bucket refused: the metric's reason and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refused {
    /// The `reason` label of `throttle_central_invalid_messages_total`.
    pub reason: &'static str,
    /// What was wrong, for the log and the gRPC status.
    pub why: String,
}

/// What one usage report asks of the stream's IO.
#[derive(Debug, Default)]
pub struct Taken {
    /// Node reports to file, oldest first.
    pub reports: Vec<v1::Report>,
    /// Whether new buckets came, to be told their assignment at once.
    pub new_buckets: bool,
    /// The first bucket refused, if any (each is counted).
    pub refused: Option<Refused>,
}

/// One user's first share, as the ledger is told it.
#[derive(Debug, Clone, PartialEq)]
pub struct FirstShareTold {
    /// The user.
    pub user: String,
    /// The slots the share covers.
    pub slots: RangeInclusive<i64>,
    /// Requests a slot.
    pub per_slot: f64,
}

/// What is due to the proxy and the ledger now.
#[derive(Debug, Default)]
pub struct Told {
    /// Assignments to send the proxy, if any.
    pub response: Option<RateLimitQuotaResponse>,
    /// First shares the ledger does not know yet.
    pub first_shares: Vec<FirstShareTold>,
}

/// One proxy's stream: its service, buckets, filing and shares.
#[derive(Debug)]
pub struct RlqsStream {
    node_id: String,
    slot: SlotLength,
    max_amount: i64,
    ttl_s: i64,
    /// The report's domain: the service.
    service: Option<String>,
    backfill: Backfill,
    buckets: Buckets,
    shares: Shares,
    /// The first shares the ledger was told, per user.
    first_told: FirstTold,
}

impl RlqsStream {
    /// The stream of proxy `node_id`, on slots of `slot`, refusing counts
    /// above `max_amount` and telling assignments that live `ttl_s`.
    pub fn new(node_id: String, slot: SlotLength, max_amount: i64, ttl_s: i64) -> Self {
        Self {
            node_id,
            slot,
            max_amount,
            ttl_s,
            service: None,
            backfill: Backfill::default(),
            buckets: Buckets::new(USER_KEY),
            shares: Shares::new(slot.as_ms()),
            first_told: FirstTold::new(),
        }
    }

    /// The proxy's node id.
    pub fn node_id(&self) -> &str {
        &self.node_id
    }

    /// The service, once the stream is open.
    pub fn service(&self) -> Option<&str> {
        self.service.as_deref()
    }

    /// Whether a report of `domain` must first open the stream (its
    /// first), or why it is refused: a domain that changed or is no name.
    pub fn opens(&self, domain: &str) -> Result<bool, Refused> {
        let refused = |why: String| Refused {
            reason: "domain",
            why,
        };
        match &self.service {
            Some(service) if service != domain => {
                Err(refused(format!("the domain changed from {service:?}")))
            }
            Some(_) => Ok(false),
            None if domain.is_empty() || domain.len() > MAX_NAME_LEN => Err(refused(format!(
                "the domain must be 1 to {MAX_NAME_LEN} bytes"
            ))),
            None => Ok(true),
        }
    }

    /// The Hello that registers the proxy with the ledger for `domain`.
    pub fn hello(&self, domain: &str) -> v1::Hello {
        v1::Hello {
            node_id: self.node_id.clone(),
            slot_ms: self.slot.as_ms(),
            services: vec![domain.to_owned()],
            version: "envoy-rlqs".to_owned(),
            accepts: Vec::new(),
            resumes: false,
            report_every_ms: (REPORT_EVERY_S * 1_000) as u32,
        }
    }

    /// The ledger took the Hello: the stream is of `domain`, whose bucket
    /// ids name the user with `user_key` (`None`: `user`).
    pub fn opened(&mut self, domain: String, user_key: Option<&str>) {
        self.buckets = Buckets::new(user_key.unwrap_or(USER_KEY));
        self.service = Some(domain);
    }

    /// Takes one report's bucket usages at `now_ms`: what to file over
    /// the slots they cover.
    pub fn take(&mut self, usages: Vec<BucketQuotaUsage>, now_ms: i64) -> Taken {
        let slot = self.slot.slot_at(now_ms);
        let before = self.buckets.len();
        let mut taken = Taken::default();
        // Per user: a user may have several buckets.
        let mut users: BTreeMap<String, (u64, u64, usize)> = BTreeMap::new();
        for usage in usages {
            match self.take_usage(usage, slot) {
                Ok(Some((user, a, d, covered))) => {
                    let sum = users.entry(user).or_default();
                    *sum = (
                        sum.0.saturating_add(a),
                        sum.1.saturating_add(d),
                        sum.2.max(covered),
                    );
                }
                Ok(None) => {}
                Err(refused) => {
                    counter!("throttle_central_invalid_messages_total", "reason" => refused.reason)
                        .increment(1);
                    taken.refused.get_or_insert(refused);
                }
            }
        }
        let into = self.share_of_slot_passed(now_ms);
        taken.reports = (self.backfill.split(users, slot, into).into_iter())
            .filter_map(|due| self.report(due))
            .collect();
        taken.new_buckets = self.buckets.len() > before;
        taken
    }

    /// One bucket's usage: its user, what it admitted and denied, and the
    /// slots it covers; `None` for a bucket not filed (no user, past the
    /// cap), counted; `Err` for an absurd count.
    fn take_usage(
        &mut self,
        usage: BucketQuotaUsage,
        slot: i64,
    ) -> Result<Option<(String, u64, u64, usize)>, Refused> {
        let Some(id) = usage.bucket_id else {
            return Err(Refused {
                reason: "rlqs_bucket",
                why: "a bucket usage without a bucket id".to_owned(),
            });
        };
        let max = u64::try_from(self.max_amount).unwrap_or(u64::MAX);
        let (allowed, denied) = (usage.num_requests_allowed, usage.num_requests_denied);
        if allowed > max || denied > max {
            let why = format!("{allowed} allowed, {denied} denied: above the largest amount {max}");
            return Err(Refused {
                reason: "rlqs_amount",
                why,
            });
        }
        let used = allowed + denied > 0;
        // The slots the report covers.
        let slot_ms = i64::from(self.slot.as_ms()).max(1);
        let elapsed_ms = usage
            .time_elapsed
            .map_or(0, |d| d.seconds.clamp(0, 3_600) * 1_000);
        let covered = (elapsed_ms / slot_ms).clamp(0, MAX_SLOTS as i64) as usize;
        match self.buckets.seen(&id, used, slot) {
            Ok(Some(user)) if user.len() <= MAX_NAME_LEN => {
                Ok(Some((user.to_owned(), allowed, denied, covered)))
            }
            Ok(_) => {
                counter!("throttle_central_rlqs_buckets_without_user_total").increment(1);
                Ok(None)
            }
            Err(()) => {
                counter!("throttle_central_rlqs_buckets_at_cap_total").increment(1);
                Ok(None)
            }
        }
    }

    /// How far into its slot `now_ms` is, from 0 to 1.
    fn share_of_slot_passed(&self, now_ms: i64) -> f64 {
        let into = self.slot.offset_in_slot(now_ms);
        into.as_secs_f64() / self.slot.as_duration().as_secs_f64()
    }

    /// Time from `now_ms` until 20 ms into the next slot, when the shares
    /// are told again and what waited is filed.
    pub fn until_next_slot(&self, now_ms: i64) -> Duration {
        let next = self.slot.start_ms(self.slot.slot_at(now_ms) + 1) + 20;
        Duration::from_millis(u64::try_from(next - now_ms).unwrap_or(0))
    }

    /// What came while no slot was left for it, filed in the slot that
    /// just ended, if it is not filed yet.
    pub fn carried(&mut self, now_ms: i64) -> Option<v1::Report> {
        let due = self.backfill.rest(self.slot.slot_at(now_ms) - 1)?;
        self.report(due)
    }

    /// What is left to file as the stream ends at `now_ms`.
    pub fn last(&mut self, now_ms: i64) -> Option<v1::Report> {
        let due = self.backfill.last_rest(self.slot.slot_at(now_ms))?;
        self.report(due)
    }

    /// The node report of one data slot's usage (`None` before the stream
    /// opens).
    fn report(&self, (data_slot, due): SlotUsage) -> Option<v1::Report> {
        let service = self.service.as_ref()?;
        // A user with nothing, its stop, is filed as consumption.
        let usage = |pick: fn(&(String, u64, u64)) -> u64, stops: bool| {
            let users = due
                .iter()
                .filter(|d| pick(d) > 0 || (stops && d.1 == 0 && d.2 == 0))
                .map(|d| {
                    let amount = i64::try_from(pick(d)).unwrap_or(i64::MAX);
                    let resources = [(REQUESTS.to_owned(), amount)].into();
                    (d.0.clone(), v1::Amounts { resources })
                })
                .collect();
            BTreeMap::from([(service.clone(), v1::Usage { users })])
        };
        Some(v1::Report {
            node_id: self.node_id.clone(),
            slot_number: data_slot + 1,
            consumption: usage(|d| d.1, true),
            rejection: usage(|d| d.2, false),
            packed: Vec::new(),
            answered: false,
        })
    }

    /// Takes a message the ledger queued for the proxy: its quotas,
    /// limits and block lists.
    pub fn absorb(&mut self, message: v1::CentralMessage) {
        self.shares.absorb(self.service.as_deref(), message);
    }

    /// The assignments due at `now_ms`, and the first shares they give
    /// that the ledger does not know yet.
    pub fn due(&mut self, now_ms: i64) -> Told {
        let slot_ms = i64::from(self.slot.as_ms()).max(1);
        let slots = |s: i64| (s * 1_000 / slot_ms).max(1);
        let timing = Timing {
            // Sent again before half its life has passed.
            refresh: slots(self.ttl_s / 2),
            idle: slots(IDLE_S),
            fresh: slots(REPORT_EVERY_S + 1),
        };
        let slot = self.slot.slot_at(now_ms);
        let actions = self.buckets.due(&self.shares, slot, timing);
        if actions.is_empty() {
            return Told::default();
        }
        tracing::debug!(node_id = %self.node_id, ?actions, "RLQS assignments");
        Told {
            first_shares: self.first_shares(slot, timing.fresh),
            response: Some(self.response(actions)),
        }
    }

    /// The first shares of `slot` that differ from those the ledger was
    /// told.
    fn first_shares(&mut self, slot: i64, fresh: i64) -> Vec<FirstShareTold> {
        let told = self.buckets.first_shares(slot, fresh);
        let slot_s = f64::from(self.slot.as_ms()) / 1_000.0;
        let new = told
            .iter()
            .filter(|(user, share)| self.first_told.get(*user) != Some(share))
            .map(|(user, (slots, tokens))| FirstShareTold {
                user: user.clone(),
                slots: slots.clone(),
                per_slot: f64::from(*tokens) * slot_s,
            })
            .collect();
        self.first_told = told;
        new
    }

    /// Envoy's message for `actions`.
    fn response(&self, actions: Vec<Action>) -> RateLimitQuotaResponse {
        let ttl_s = u64::try_from(self.ttl_s).unwrap_or(u64::MAX);
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
        RateLimitQuotaResponse { bucket_action }
    }
}
