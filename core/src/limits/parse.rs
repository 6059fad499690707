//! The TOML form of limits (see the [module docs](super)).

use std::collections::BTreeMap;
use std::str::FromStr;

use serde::Deserialize;
use throttle_proto::MAX_NAME_LEN;

use super::amount::{Amounts, number, rate, valid_name};
use super::block::{Block, unix_ms};
use super::hierarchy::{HIERARCHICAL, Hierarchy};
use super::parse_hierarchy::{AppEntry, add_app, app_error, capacity};
use super::period::{Allowance, Period};
use super::{
    DEFAULT_BURST_SECONDS, EVERY_USER, Limit, LimitSet, LimitsError, MAX_BURST_SECONDS,
    POLICY_NAMES,
};
use crate::toml_text::{line_of, parse_toml};

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct File {
    #[serde(default)]
    limit: Vec<toml::Spanned<Entry>>,
    #[serde(default)]
    service: BTreeMap<String, toml::Spanned<Settings>>,
    #[serde(default)]
    block: Vec<toml::Spanned<BlockEntry>>,
    #[serde(default)]
    app: Vec<toml::Spanned<AppEntry>>,
}

/// One `[[block]]` as written.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct BlockEntry {
    service: String,
    user: Option<String>,
    users: Option<Vec<String>>,
    until: Option<toml::Value>,
    reason: Option<String>,
}

/// A `[service.NAME]` table.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Settings {
    policy: Option<String>,
    capacity: Option<Amounts>,
    envoy_user_key: Option<String>,
}

/// One `[[limit]]` as written.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Entry {
    service: String,
    user: Option<String>,
    users: Option<Vec<String>>,
    per_second: Option<Amounts>,
    per_minute: Option<Amounts>,
    per_hour: Option<Amounts>,
    per_day: Option<Amounts>,
    burst_seconds: Option<toml::Value>,
    max_debt_seconds: Option<toml::Value>,
}

impl FromStr for LimitSet {
    type Err = LimitsError;

    /// The TOML form: [`LimitSet::from_toml`].
    fn from_str(text: &str) -> Result<Self, LimitsError> {
        let file: File =
            parse_toml(text).map_err(|(line, message)| LimitsError::Syntax { line, message })?;
        let mut set = Self::new();
        for (service, spanned) in file.service {
            let line = line_of(text, spanned.span().start);
            settings(&mut set, service, spanned.into_inner())
                .map_err(|message| LimitsError::Syntax { line, message })?;
        }
        for spanned in file.app {
            let line = line_of(text, spanned.span().start);
            let e = spanned.into_inner();
            let (service, name) = (e.service().to_owned(), e.name());
            let bad = |m| app_error(line, &service, &name, m);
            let Some(hierarchy) = set.hierarchies.get_mut(&service) else {
                return Err(bad(format!(
                    "[service.{service}] sets no capacity for its applications to share"
                )));
            };
            let app = e.app(&hierarchy.capacity).map_err(bad)?;
            add_app(hierarchy, app).map_err(bad)?;
        }
        // Who set each (resource, period) of a user named by several
        // rules: a rule of the user alone outranks a list.
        let mut ranks: Ranks = BTreeMap::new();
        for spanned in file.limit {
            let line = line_of(text, spanned.span().start);
            let e = spanned.into_inner();
            let bad = entry_error(line, &e.service);
            let who = who(&e.user, &e.users);
            let users = users(&e.service, &e.user, &e.users).map_err(|m| bad(&who, m))?;
            let rule = e.rule().map_err(|m| bad(&who, m))?;
            let rank = if e.user.is_some() { ALONE } else { LISTED };
            for user in users {
                let key = (e.service.clone(), user.clone());
                let limit = Limit {
                    user,
                    ..rule.clone()
                };
                let merged = match set.get(&e.service, &limit.user) {
                    Some(held) => merge(held, &limit, rank, ranks.entry(key).or_default()),
                    None => {
                        ranks.insert(key, rank_all(&limit, rank));
                        limit
                    }
                };
                set.insert(e.service.clone(), merged);
            }
        }
        for spanned in file.block {
            let line = line_of(text, spanned.span().start);
            let e = spanned.into_inner();
            let bad = entry_error(line, &e.service);
            let who = who(&e.user, &e.users);
            let users = users(&e.service, &e.user, &e.users).map_err(|m| bad(&who, m))?;
            if users.iter().any(|u| u == EVERY_USER) {
                return Err(bad(&who, "a block names users, not \"*\"".into()));
            }
            let until_ms = e
                .until
                .as_ref()
                .map(unix_ms)
                .transpose()
                .map_err(|m| bad(&who, m))?;
            let block = Block {
                until_ms,
                reason: e.reason.clone().unwrap_or_default(),
            };
            for user in users {
                set.block(e.service.clone(), user, block.clone());
            }
        }
        Ok(set)
    }
}

/// Applies the `[service.NAME]` table `settings` of `service` to `set`.
fn settings(set: &mut LimitSet, service: String, settings: Settings) -> Result<(), String> {
    if !valid_name(&service) {
        return Err(format!("service names must be 1 to {MAX_NAME_LEN} bytes"));
    }
    if let Some(policy) = &settings.policy
        && !POLICY_NAMES.contains(&policy.as_str())
    {
        let known = POLICY_NAMES.join(", ");
        return Err(format!(
            "[service.{service}] policy {policy:?} is not one of {known}"
        ));
    }
    if let Some(amounts) = &settings.capacity {
        if settings
            .policy
            .as_deref()
            .is_some_and(|p| p != HIERARCHICAL)
        {
            return Err(format!(
                "[service.{service}] a capacity is shared by the {HIERARCHICAL:?} policy only"
            ));
        }
        let capacity = capacity(amounts).map_err(|m| format!("[service.{service}] {m}"))?;
        let hierarchy = Hierarchy {
            capacity,
            apps: Vec::new(),
        };
        set.set_hierarchy(service.clone(), hierarchy);
    }
    if let Some(key) = settings.envoy_user_key {
        if !valid_name(&key) {
            return Err(format!(
                "[service.{service}] envoy_user_key must be 1 to {MAX_NAME_LEN} bytes"
            ));
        }
        set.set_envoy_user_key(service.clone(), key);
    }
    if let Some(policy) = settings.policy {
        set.set_policy(service, policy);
    }
    Ok(())
}

/// The error of the entry of `service` at `line`, for a user and a message.
fn entry_error(line: usize, service: &str) -> impl Fn(&str, String) -> LimitsError + '_ {
    move |user, message| LimitsError::Entry {
        line,
        service: service.to_owned(),
        user: user.to_owned(),
        message,
    }
}

/// Who an entry is for, for an error message.
fn who(user: &Option<String>, users: &Option<Vec<String>>) -> String {
    match (user, users) {
        (Some(u), _) => u.chars().take(80).collect(),
        (None, Some(list)) => list
            .first()
            .map_or_else(String::new, |u| format!("{u}, ...")),
        (None, None) => String::new(),
    }
}

/// The users an entry of `service` names, checked.
fn users(
    service: &str,
    user: &Option<String>,
    users: &Option<Vec<String>>,
) -> Result<Vec<String>, String> {
    if !valid_name(service) {
        return Err(format!("service names must be 1 to {MAX_NAME_LEN} bytes"));
    }
    let users = match (user, users) {
        (Some(user), None) => vec![user.clone()],
        (None, Some(users)) if !users.is_empty() => users.clone(),
        (None, Some(_)) => return Err("users lists nobody".into()),
        _ => return Err("an entry names either user or users".into()),
    };
    if let Some(u) = users.iter().find(|u| !valid_name(u)) {
        return Err(format!("user {u:?} must be 1 to {MAX_NAME_LEN} bytes"));
    }
    if users.len() > 1 && users.iter().any(|u| u == EVERY_USER) {
        return Err(format!("{EVERY_USER:?} is a rule of its own: user = \"*\""));
    }
    Ok(users)
}

impl Entry {
    /// The rule, for no user yet.
    fn rule(&self) -> Result<Limit, String> {
        let burst = self.burst_of(Period::Second)?;
        let mut rule = Limit {
            burst_seconds: burst.unwrap_or(DEFAULT_BURST_SECONDS),
            max_debt_seconds: self.max_debt_seconds()?,
            ..Limit::default()
        };
        let tables = [
            (Period::Second, &self.per_second),
            (Period::Minute, &self.per_minute),
            (Period::Hour, &self.per_hour),
            (Period::Day, &self.per_day),
        ];
        if tables.iter().all(|(_, t)| t.is_none()) {
            return Err("a rule sets per_second, per_minute, per_hour or per_day".into());
        }
        for (period, table) in tables {
            for (resource, v) in table.iter().flatten() {
                let rate = rate(resource, v, period)?;
                if period == Period::Second {
                    rule.per_second.insert(resource.clone(), rate);
                    continue;
                }
                // A minute's, an hour's or a day's quota may be spent at
                // any pace, unless the rule's `burst` says how much at once.
                let burst_seconds = self.burst_of(period)?.unwrap_or_else(|| period.seconds());
                let allowance = Allowance {
                    period,
                    rate,
                    burst_seconds,
                };
                rule.per_period
                    .entry(resource.clone())
                    .or_default()
                    .push(allowance);
            }
        }
        Ok(rule)
    }

    /// The capacity the rule sets for `period`, in seconds of its rate:
    /// `burst_seconds = N` sets the per-second period's only, `burst_seconds
    /// = { second = .., minute = .., hour = .., day = .. }` each one named.
    fn burst_of(&self, period: Period) -> Result<Option<f64>, String> {
        let v = match &self.burst_seconds {
            None => return Ok(None),
            Some(toml::Value::Table(table)) => {
                if let Some(unknown) = table.keys().find(|k| period_named(k).is_none()) {
                    return Err(format!(
                        "burst_seconds names second, minute, hour or day, not {unknown:?}"
                    ));
                }
                let named = table.iter().find(|(k, _)| period_named(k) == Some(period));
                match named {
                    Some((_, v)) => v,
                    None => return Ok(None),
                }
            }
            Some(v) if period == Period::Second => v,
            Some(_) => return Ok(None),
        };
        match number(v) {
            Some(x) if x > 0.0 && x <= MAX_BURST_SECONDS => Ok(Some(x)),
            _ => Err(format!(
                "burst_seconds must be a number > 0 and at most {MAX_BURST_SECONDS:e}, not {v}"
            )),
        }
    }

    fn max_debt_seconds(&self) -> Result<Option<f64>, String> {
        match &self.max_debt_seconds {
            None => Ok(None),
            Some(toml::Value::String(s)) if s == "unbounded" => Ok(Some(f64::INFINITY)),
            Some(v) => match number(v) {
                Some(x) if (0.0..=MAX_BURST_SECONDS).contains(&x) => Ok(Some(x)),
                _ => Err(format!(
                    "max_debt_seconds must be a number from 0 to {MAX_BURST_SECONDS:e} or \"unbounded\", not {v}"
                )),
            },
        }
    }
}

/// The period a `burst` key names.
fn period_named(key: &str) -> Option<Period> {
    match key {
        "second" => Some(Period::Second),
        "minute" => Some(Period::Minute),
        "hour" => Some(Period::Hour),
        "day" => Some(Period::Day),
        _ => None,
    }
}

/// A rule that names its user alone.
const ALONE: u8 = 2;
/// A rule that names its user in a list.
const LISTED: u8 = 1;

/// Per (service, user): who set each (resource, period) of its rule.
type Ranks = BTreeMap<(String, String), BTreeMap<(String, Period), u8>>;

/// Every (resource, period) of `limit`, set by a rule of `rank`.
fn rank_all(limit: &Limit, rank: u8) -> BTreeMap<(String, Period), u8> {
    let seconds = limit.per_second.keys().map(|r| (r.clone(), Period::Second));
    let longer = (limit.per_period.iter())
        .flat_map(|(r, list)| list.iter().map(move |a| (r.clone(), a.period)));
    seconds.chain(longer).map(|k| (k, rank)).collect()
}

/// `held` with another rule of its user, `next` (of `rank`), applied:
/// per (resource, period) the higher rank wins, and between equal ranks
/// the lower rate; the per-second burst and the debt bound are the
/// smaller of the two.
fn merge(
    held: &Limit,
    next: &Limit,
    rank: u8,
    ranks: &mut BTreeMap<(String, Period), u8>,
) -> Limit {
    let mut out = held.clone();
    let wins = |ranks: &BTreeMap<(String, Period), u8>,
                key: &(String, Period),
                held: Option<f64>,
                rate: f64| {
        match (ranks.get(key), held) {
            (Some(&r), Some(h)) => rank > r || (rank == r && rate < h),
            _ => true,
        }
    };
    for (resource, &rate) in &next.per_second {
        let key = (resource.clone(), Period::Second);
        if wins(ranks, &key, out.per_second.get(resource).copied(), rate) {
            out.per_second.insert(resource.clone(), rate);
            ranks.insert(key, rank);
        }
    }
    for (resource, list) in &next.per_period {
        for a in list {
            let key = (resource.clone(), a.period);
            let mine = out.per_period.entry(resource.clone()).or_default();
            let at = mine.iter().position(|m| m.period == a.period);
            if wins(ranks, &key, at.map(|i| mine[i].rate), a.rate) {
                match at {
                    Some(i) => mine[i] = *a,
                    None => mine.push(*a),
                }
                mine.sort_by_key(|m| m.period);
                ranks.insert(key, rank);
            }
        }
    }
    if !next.per_second.is_empty() {
        out.burst_seconds = if held.per_second.is_empty() {
            next.burst_seconds
        } else {
            held.burst_seconds.min(next.burst_seconds)
        };
    }
    out.max_debt_seconds = match (held.max_debt_seconds, next.max_debt_seconds) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    };
    out
}
