//! The TOML form of hierarchical quotas: `capacity` in a `[service.NAME]`
//! table and `[[app]]` entries (see [`Hierarchy`]).

use std::collections::{BTreeMap, HashSet};

use serde::Deserialize;
use throttle_proto::MAX_NAME_LEN;

use super::amount::{Amounts, number, rate, valid_name};
use super::hierarchy::{App, DEFAULT_APP_BURST_SECONDS, Hierarchy, MAX_PRIORITY};
use super::period::Period;
use super::{LimitsError, MAX_BURST_SECONDS};

/// One `[[app]]` as written.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct AppEntry {
    service: String,
    name: String,
    users: Vec<String>,
    priority: Option<toml::Value>,
    guaranteed: Option<Amounts>,
    burst: Option<Amounts>,
    burst_seconds: Option<toml::Value>,
}

/// Per second rates of `amounts`, each of a resource the capacity names.
fn rates(
    amounts: Option<&Amounts>,
    capacity: &BTreeMap<String, f64>,
    what: &str,
) -> Result<BTreeMap<String, f64>, String> {
    let mut out = BTreeMap::new();
    for (resource, v) in amounts.into_iter().flatten() {
        if !capacity.contains_key(resource) {
            return Err(format!(
                "{what} {resource:?}: the service's capacity does not name this resource"
            ));
        }
        out.insert(resource.clone(), rate(resource, v, Period::Second)?);
    }
    Ok(out)
}

/// The capacity of a `[service.NAME]` table: resource -> per second.
pub(super) fn capacity(amounts: &Amounts) -> Result<BTreeMap<String, f64>, String> {
    if amounts.is_empty() {
        return Err("capacity names no resource".into());
    }
    amounts
        .iter()
        .map(|(resource, v)| Ok((resource.clone(), rate(resource, v, Period::Second)?)))
        .collect()
}

impl AppEntry {
    /// The service the entry is of.
    pub(super) fn service(&self) -> &str {
        &self.service
    }

    /// The entry's name, for an error message.
    pub(super) fn name(&self) -> String {
        self.name.chars().take(80).collect()
    }

    /// The application, checked against its service's `capacity`.
    pub(super) fn app(self, capacity: &BTreeMap<String, f64>) -> Result<App, String> {
        if !valid_name(&self.name) {
            return Err(format!(
                "an application's name must be 1 to {MAX_NAME_LEN} bytes"
            ));
        }
        if self.users.is_empty() {
            return Err("users lists nobody".into());
        }
        if let Some(u) = self.users.iter().find(|u| !valid_name(u)) {
            return Err(format!("user {u:?} must be 1 to {MAX_NAME_LEN} bytes"));
        }
        if let Some(u) = self
            .users
            .iter()
            .find(|u| u.strip_suffix('*').unwrap_or(u).contains('*'))
        {
            return Err(format!("user {u:?}: '*' may only end a prefix"));
        }
        let priority = match &self.priority {
            None => 0,
            Some(toml::Value::Integer(p)) if (0..=i64::from(MAX_PRIORITY)).contains(p) => *p as u32,
            Some(v) => return Err(format!("priority must be 0 to {MAX_PRIORITY}, not {v}")),
        };
        let guaranteed = rates(self.guaranteed.as_ref(), capacity, "guaranteed")?;
        let burst = rates(self.burst.as_ref(), capacity, "burst")?;
        if let Some((r, b)) = burst
            .iter()
            .find(|(r, b)| **b < guaranteed_of(&guaranteed, r))
        {
            return Err(format!("burst {r:?} ({b}) is below its guarantee"));
        }
        let burst_seconds = match &self.burst_seconds {
            None => DEFAULT_APP_BURST_SECONDS,
            Some(v) => match number(v) {
                Some(x) if x > 0.0 && x <= MAX_BURST_SECONDS => x,
                _ => {
                    return Err(format!(
                        "burst_seconds must be a number > 0 and at most {MAX_BURST_SECONDS:e}, not {v}"
                    ));
                }
            },
        };
        Ok(App {
            name: self.name,
            users: self.users,
            priority,
            guaranteed,
            burst,
            burst_seconds,
        })
    }
}

fn guaranteed_of(guaranteed: &BTreeMap<String, f64>, resource: &str) -> f64 {
    guaranteed.get(resource).copied().unwrap_or(0.0)
}

/// Adds `app` to `hierarchy`, refusing a second application of the same
/// name or a user (or prefix) another application names already.
pub(super) fn add_app(hierarchy: &mut Hierarchy, app: App) -> Result<(), String> {
    if hierarchy.apps.iter().any(|a| a.name == app.name) {
        return Err("duplicate application: this service has one of this name".into());
    }
    let named: HashSet<&str> = hierarchy
        .apps
        .iter()
        .flat_map(|a| a.users.iter().map(String::as_str))
        .collect();
    if let Some(u) = app.users.iter().find(|u| named.contains(u.as_str())) {
        return Err(format!("user {u:?} is in another application already"));
    }
    hierarchy.apps.push(app);
    Ok(())
}

/// The error of an `[[app]]` entry at `line`, of `service` and named
/// `name`.
pub(super) fn app_error(line: usize, service: &str, name: &str, message: String) -> LimitsError {
    LimitsError::Entry {
        line,
        service: service.to_owned(),
        user: format!("app {name}"),
        message,
    }
}
