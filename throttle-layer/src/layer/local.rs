//! The layer's local limits ([`LocalLimit`]): every zone asked for one
//! request, the longest hold kept, a refusal built.

use std::sync::Arc;

use super::config::Config;
use super::future::Refusal;
use super::refusal::{LimitRefusal, OwnLimit, is_grpc, refuse_limit};
use super::refusal_body::accepts_json;
use crate::every_second::EverySecond;
use crate::local::{LocalLimit, Verdict, Zone};
use crate::user::RequestHead;
use throttle_proto::MAX_NAME_LEN;

/// One limit and its zone.
#[derive(Debug)]
struct LocalZone {
    limit: LocalLimit,
    /// Shared with the layers built with clones of `limit`.
    zone: Arc<Zone>,
    /// nginx's form of the limit, for refusals and logs.
    text: String,
    refused: metrics::Counter,
    delayed: metrics::Counter,
    /// Refusals are logged at most once a second.
    logged: EverySecond,
}

/// What the local limits decided for a request.
pub(crate) enum Local {
    /// Pass, after this many ms.
    Pass(u64),
    /// Refused by a limit: the response.
    Refuse(Refusal),
}

/// Every local limit of a layer.
#[derive(Debug)]
pub(crate) struct LocalZones {
    zones: Box<[LocalZone]>,
}

impl LocalZones {
    /// The zones of `limits`, for service `service`'s metrics.
    pub(crate) fn new(limits: Vec<LocalLimit>, service: &str) -> Option<Self> {
        if limits.is_empty() {
            return None;
        }
        let zones = limits
            .into_iter()
            .map(|limit| {
                let text = limit.to_string();
                let counter = |decision: &'static str| {
                    metrics::counter!("throttle_local_decisions_total", "service" => service.to_owned(), "limit" => text.clone(), "decision" => decision)
                };
                let zone = limit.zone();
                LocalZone {
                    zone,
                    refused: counter("refused"),
                    delayed: counter("delayed"),
                    logged: EverySecond::default(),
                    text,
                    limit,
                }
            })
            .collect();
        Some(Self { zones })
    }

    /// Accounts the request of `user` (none: only limits with keys of
    /// their own apply) in every zone. Refused by one, it is taken back
    /// from those before; in shadow mode nothing is refused nor held.
    pub(crate) fn check(&self, cfg: &Config, head: RequestHead<'_>, user: Option<&str>) -> Local {
        let shadow = cfg.shadow;
        let mut delay = 0;
        for (i, z) in self.zones.iter().enumerate() {
            match with_key(z, head, user, |key| z.zone.account(key)) {
                Some(Verdict::Pass) | None => {}
                Some(Verdict::Delay(ms)) => {
                    z.delayed.increment(1);
                    delay = delay.max(ms);
                }
                Some(Verdict::Reject) => {
                    z.refused.increment(1);
                    z.log_refusal();
                    if shadow {
                        continue;
                    }
                    self.refund_first(i, head, user);
                    return Local::Refuse(refuse_limit(
                        cfg,
                        LimitRefusal {
                            status: z.limit.status,
                            grpc: is_grpc(head),
                            json: accepts_json(head),
                            retry_seconds: z.retry_seconds(),
                            by: OwnLimit::Local,
                            limit: &z.text,
                            user,
                        },
                    ));
                }
            }
        }
        Local::Pass(if shadow { 0 } else { delay })
    }

    /// Takes the request back from every zone (the central quota refused
    /// it).
    pub(crate) fn refund(&self, head: RequestHead<'_>, user: Option<&str>) {
        self.refund_first(self.zones.len(), head, user);
    }

    /// The key each zone counts the request under, owned, for a refund
    /// after the request's decision ([`LocalZones::refund_keys`]).
    pub(crate) fn owned_keys(
        &self,
        head: RequestHead<'_>,
        user: Option<&str>,
    ) -> Vec<Option<Box<str>>> {
        self.zones
            .iter()
            .map(|z| with_key(z, head, user, |k: &str| Box::from(k)))
            .collect()
    }

    /// Takes a request back from every zone, under the keys
    /// [`LocalZones::owned_keys`] gave.
    pub(crate) fn refund_keys(&self, keys: &[Option<Box<str>>]) {
        for (z, key) in self.zones.iter().zip(keys) {
            if let Some(key) = key {
                z.zone.refund(key);
            }
        }
    }

    fn refund_first(&self, n: usize, head: RequestHead<'_>, user: Option<&str>) {
        for z in &self.zones[..n] {
            with_key(z, head, user, |key| z.zone.refund(key));
        }
    }
}

/// Runs `f` on the key zone `z` limits the request by.
fn with_key<R>(
    z: &LocalZone,
    head: RequestHead<'_>,
    user: Option<&str>,
    f: impl FnOnce(&str) -> R,
) -> Option<R> {
    with_limit_key(&z.limit, head, user, f)
}

/// Runs `f` on the key `limit` counts the request under: its own key's,
/// else the user's; `None` when the request has none. Keys are cut at
/// [`MAX_NAME_LEN`] bytes, so a huge header costs a zone no more than a
/// name.
pub(super) fn with_limit_key<R>(
    limit: &LocalLimit,
    head: RequestHead<'_>,
    user: Option<&str>,
    f: impl FnOnce(&str) -> R,
) -> Option<R> {
    let cut = |key: &str| {
        let mut end = key.len().min(MAX_NAME_LEN);
        while !key.is_char_boundary(end) {
            end -= 1;
        }
        f(&key[..end])
    };
    match &limit.key {
        Some(own) => own.with_user(head, |key| key.map(cut)),
        None => user.map(cut),
    }
}

/// Logs that `limit` (a local or a shared one) refused a request, at
/// `level`.
pub(super) fn log_refusal(level: tracing::Level, by: OwnLimit, limit: &str) {
    let by = by.name();
    match level {
        tracing::Level::ERROR => tracing::error!(by, limit, "rate limit refused a request"),
        tracing::Level::WARN => tracing::warn!(by, limit, "rate limit refused a request"),
        tracing::Level::INFO => tracing::info!(by, limit, "rate limit refused a request"),
        tracing::Level::DEBUG => tracing::debug!(by, limit, "rate limit refused a request"),
        tracing::Level::TRACE => tracing::trace!(by, limit, "rate limit refused a request"),
    }
}

impl LocalZone {
    /// Seconds until one more request fits the rate.
    fn retry_seconds(&self) -> u64 {
        let rate = self.zone.shape.rate.max(1);
        (1_000_000u64).div_ceil(rate).div_ceil(1000).max(1)
    }

    /// Logs a refusal at the limit's level, at most once a second.
    fn log_refusal(&self) {
        if self.logged.due() {
            log_refusal(self.limit.log_level, OwnLimit::Local, &self.text);
        }
    }
}
