//! `GET /v1/limits`: the rules in force, the services' policies named by
//! the limits, their capacities and applications, and the last reload's
//! error; with
//! `?user=U` (and optionally `?service=S`), what limits that user instead:
//! per service, which rule (their own, `*`, or none) and the buckets that
//! result, resource by resource.

use axum::extract::{Query, State};
use axum::response::{IntoResponse, Response};
use serde::Deserialize;
use serde_json::{Map, Value, json};

use super::HttpState;
use crate::limits::{EVERY_USER, Limit, limited_resources, resolve};

#[derive(Debug, Deserialize)]
pub(super) struct LimitsQuery {
    user: Option<String>,
    service: Option<String>,
}

pub(super) async fn limits(
    State(state): State<HttpState>,
    Query(query): Query<LimitsQuery>,
) -> Response {
    let source = &*state.limits;
    let services: Vec<String> = match &query.service {
        Some(s) => vec![s.clone()],
        None => source.services(),
    };
    let mut out = Map::new();
    let mut policies = Map::new();
    let mut capacities = Map::new();
    for service in services {
        if let Some(policy) = source.policy(&service) {
            policies.insert(service.clone(), policy.into());
        }
        if let Some(hierarchy) = source.hierarchy(&service) {
            capacities.insert(service.clone(), json!(*hierarchy));
        }
        let rules = source.list_limits(&service);
        let value = match &query.user {
            Some(user) => applies(&rules, user),
            None => json!(rules),
        };
        out.insert(service, value);
    }
    let body = json!({
        "limits": out,
        "policies": policies,
        "capacities": capacities,
        "last_error": source.last_error(),
    });
    axum::Json(body).into_response()
}

/// What limits `user` among a service's `rules`.
fn applies(rules: &[Limit], user: &str) -> Value {
    let own = rules.iter().find(|l| l.user == user);
    let every = rules.iter().find(|l| l.is_every_user());
    let rule = match (own, every) {
        (Some(_), _) => Some(user),
        (None, Some(_)) => Some(EVERY_USER),
        (None, None) => None,
    };
    let buckets: Map<String, Value> = limited_resources(own, every)
        .into_iter()
        .map(|r| {
            let resolved = resolve(own, every, r);
            let list: Vec<Value> = resolved
                .allowances
                .iter()
                .map(|a| {
                    json!({
                        "period": a.period.as_str(),
                        "amount": a.amount(),
                        "rate": a.rate,
                        "capacity": a.rate * a.burst_seconds,
                    })
                })
                .collect();
            (r.to_owned(), Value::Array(list))
        })
        .collect();
    json!({"rule": rule, "resources": buckets})
}
