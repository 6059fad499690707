//! [`LocalLimit`]: one nginx-style limit, as code or as nginx writes it.

use std::fmt;
use std::str::FromStr;
use std::sync::{Arc, OnceLock};

use http::StatusCode;
use throttle_clock::Clock;

use super::excess::Pace;
use super::zone::{Zone, ZoneClock};
use crate::user::UserKey;

/// Keys a zone holds unless [`LocalLimit::zone_size`] says otherwise:
/// nginx's 10 MB zone holds about 160,000 states.
pub const DEFAULT_ZONE_SIZE: usize = 100_000;

/// A limit decided on this node alone, as nginx's `limit_req`: a rate per
/// second or minute, a `burst` of requests past it, and what becomes of
/// the burst: passed at once ([`LocalLimit::nodelay`]), held so they leave
/// at the rate ([`LocalLimit::delay`] of 0, the default), or passed up to
/// a point and held past it (`delay(n)`). Requests past the burst are
/// refused.
///
/// ```
/// use throttle_layer::local::LocalLimit;
///
/// let written: LocalLimit = "10r/s burst=20 nodelay".parse().unwrap();
/// assert_eq!(written, LocalLimit::per_second(10).burst(20).nodelay());
/// let held: LocalLimit = "30r/m burst=5 delay=2".parse().unwrap();
/// assert_eq!(held.to_string(), "30r/m burst=5 delay=2");
/// ```
#[derive(Debug, Clone)]
pub struct LocalLimit {
    /// Requests per 1,000 seconds.
    rate: u64,
    per_minute: bool,
    burst: u64,
    /// Requests of the burst passed at once; `None`: all (`nodelay`).
    delay: Option<u64>,
    pub(crate) key: Option<UserKey>,
    pub(crate) zone_size: usize,
    pub(crate) status: StatusCode,
    pub(crate) log_level: tracing::Level,
    clock: ZoneClock,
    /// The zone, made by the first layer built with this limit (or a
    /// clone of it).
    zone: Arc<OnceLock<Arc<Zone>>>,
}

impl PartialEq for LocalLimit {
    /// The same shape, zone size, status and log level (keys are not
    /// compared).
    fn eq(&self, other: &Self) -> bool {
        (self.rate, self.per_minute, self.burst, self.delay)
            == (other.rate, other.per_minute, other.burst, other.delay)
            && (self.zone_size, self.status, self.log_level)
                == (other.zone_size, other.status, other.log_level)
    }
}

impl LocalLimit {
    fn of(rate: u64, per_minute: bool) -> Self {
        Self {
            rate,
            per_minute,
            burst: 0,
            delay: Some(0),
            key: None,
            zone_size: DEFAULT_ZONE_SIZE,
            status: StatusCode::TOO_MANY_REQUESTS,
            log_level: tracing::Level::WARN,
            clock: ZoneClock::default(),
            zone: Arc::default(),
        }
    }

    /// This limit's zone, shared with its clones; made on first use.
    pub(crate) fn zone(&self) -> Arc<Zone> {
        let make = || {
            let evicted =
                metrics::counter!("throttle_local_evicted_busy_total", "limit" => self.to_string());
            let clock = self.clock.clone();
            Arc::new(Zone::new(self.shape(), self.zone_size, clock, evicted))
        };
        self.zone.get_or_init(make).clone()
    }

    /// The limit, no longer sharing a zone with its clones.
    fn own(mut self) -> Self {
        self.zone = Arc::default();
        self
    }

    /// `n` requests a second.
    pub fn per_second(n: u64) -> Self {
        Self::of(n.saturating_mul(1000), false)
    }

    /// `n` requests a minute.
    pub fn per_minute(n: u64) -> Self {
        Self::of(n.saturating_mul(1000) / 60, true)
    }

    /// Up to `n` requests past the rate are passed or held rather than
    /// refused (nginx's `burst`; default 0).
    pub fn burst(mut self, n: u64) -> Self {
        self = self.own();
        self.burst = n;
        self
    }

    /// The whole burst passes at once (nginx's `nodelay`).
    pub fn nodelay(mut self) -> Self {
        self = self.own();
        self.delay = None;
        self
    }

    /// The first `n` requests of the burst pass at once, the rest are held
    /// until they fit the rate (nginx's `delay=`; 0 by default: every
    /// request past the rate is held).
    pub fn delay(mut self, n: u64) -> Self {
        self = self.own();
        self.delay = Some(n);
        self
    }

    /// Keys the limit by `key` (e.g. [`UserKey::peer_ip`]) instead of the
    /// layer's user key.
    pub fn key(mut self, key: UserKey) -> Self {
        self = self.own();
        self.key = Some(key);
        self
    }

    /// Holds at most about `n` keys; past it the least recently used is
    /// forgotten (default [`DEFAULT_ZONE_SIZE`]).
    pub fn zone_size(mut self, n: usize) -> Self {
        self = self.own();
        self.zone_size = n.max(1);
        self
    }

    /// Reads `clock` instead of the kernel's coarse monotonic clock (of a
    /// tick's resolution, 1 to 10 ms, as nginx's cached time): for tests
    /// that drive time themselves, such as
    /// [`TokioClock`](crate::TokioClock) under `tokio::time::pause()`.
    /// Only differences of its readings count.
    pub fn clock(mut self, clock: Arc<dyn Clock>) -> Self {
        self = self.own();
        self.clock = ZoneClock::Given(clock);
        self
    }

    /// The status of a refusal (default 429; nginx's default is 503).
    pub fn status(mut self, status: StatusCode) -> Self {
        self.status = status;
        self
    }

    /// The level refusals are logged at (default WARN; nginx's
    /// `limit_req_log_level` is `error`), at most once a second per limit.
    pub fn log_level(mut self, level: tracing::Level) -> Self {
        self.log_level = level;
        self
    }

    /// The limit as a token bucket, for a shared limit: the rate, and
    /// room for the burst and the request within the rate (`10r/s
    /// burst=5` passes 6 at once, as nginx's `nodelay` would).
    pub(crate) fn bucket_shape(&self) -> crate::bucket::Shape {
        crate::bucket::Shape::per(self.rate, 1_000_000_000).capacity(self.burst.saturating_add(1))
    }

    /// The limit in `limit_req`'s units.
    pub(crate) fn shape(&self) -> Pace {
        let burst = self.burst.saturating_mul(1000);
        Pace {
            rate: self.rate,
            burst,
            delay: self
                .delay
                .map_or(burst, |d| d.saturating_mul(1000).min(burst)),
        }
    }
}

impl fmt::Display for LocalLimit {
    /// nginx's syntax: `10r/s burst=20 nodelay`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.per_minute {
            true => write!(f, "{}r/m", (self.rate * 60).div_ceil(1000))?,
            false => write!(f, "{}r/s", self.rate / 1000)?,
        }
        if self.burst > 0 {
            write!(f, " burst={}", self.burst)?;
        }
        match self.delay {
            None => write!(f, " nodelay"),
            Some(0) => Ok(()),
            Some(d) => write!(f, " delay={d}"),
        }
    }
}

/// Why a limit in nginx's syntax was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid local limit {text:?}: {why} (write e.g. \"10r/s burst=20 nodelay\")")]
pub struct LocalLimitError {
    text: String,
    why: String,
}

impl FromStr for LocalLimit {
    type Err = LocalLimitError;

    /// `RATE [burst=N] [nodelay | delay=N] [size=N]`, where `RATE` is
    /// `Nr/s` or `Nr/m` (`size` is the zone's keys, which nginx gives in
    /// bytes instead).
    fn from_str(text: &str) -> Result<Self, Self::Err> {
        let bad = |why: String| LocalLimitError {
            text: text.chars().take(100).collect(),
            why,
        };
        let number = |s: &str, what: &str| {
            s.parse::<u64>()
                .map_err(|_| bad(format!("{what} must be a whole number, not {s:?}")))
        };
        let mut words = text.split_whitespace();
        let rate = words.next().ok_or_else(|| bad("no rate".into()))?;
        let mut limit = if let Some(n) = rate.strip_suffix("r/s") {
            Self::per_second(number(n, "the rate")?)
        } else if let Some(n) = rate.strip_suffix("r/m") {
            Self::per_minute(number(n, "the rate")?)
        } else {
            return Err(bad(format!(
                "{rate:?} is not a rate such as 10r/s or 30r/m"
            )));
        };
        if limit.rate == 0 {
            return Err(bad("the rate must be above 0".into()));
        }
        for word in words {
            limit = match word.split_once('=') {
                None if word == "nodelay" => limit.nodelay(),
                Some(("burst", n)) => limit.burst(number(n, "burst")?),
                Some(("delay", n)) => limit.delay(number(n, "delay")?),
                Some(("size", n)) => limit.zone_size(number(n, "size")? as usize),
                _ => return Err(bad(format!("unknown parameter {word:?}"))),
            };
        }
        Ok(limit)
    }
}
