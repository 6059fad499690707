//! `GET /v1/monitor/top?service=&resource=&slots=&n=&by=`: the heaviest
//! users of each resource over the last slots, each with what it was
//! admitted and refused slot by slot and its bucket. The ledger's task
//! reads them at most once per half slot (`ledger_task::Actor::top`); each
//! question takes its part of that reading.

use axum::extract::{Query, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde::Deserialize;
use serde_json::{Map, Value, json};

use throttle_core::ledger::json::bucket as bucket_json;

use super::{HttpState, error};
use crate::ledger::{RankBy, TopUsers, UserSeries};
use crate::ledger_task::{TOP_KEPT, ask_top};

/// Users answered per resource unless `n` says otherwise.
const DEFAULT_N: usize = 10;

#[derive(Debug, Deserialize)]
pub(super) struct TopQuery {
    service: Option<String>,
    resource: Option<String>,
    slots: Option<usize>,
    n: Option<usize>,
    by: Option<String>,
}

/// What a question asks of a reading, checked.
struct Asked {
    service: Option<String>,
    resource: Option<String>,
    slots: usize,
    n: usize,
    by: RankBy,
}

impl TopQuery {
    /// The question, or why it cannot be answered from `top`.
    fn check(self, top: &TopUsers) -> Result<Asked, String> {
        let slots = self.slots.unwrap_or(top.slots);
        if !(1..=top.slots).contains(&slots) {
            return Err(format!("slots must be 1 to {}, not {slots}", top.slots));
        }
        let n = self.n.unwrap_or(DEFAULT_N);
        if !(1..=TOP_KEPT).contains(&n) {
            return Err(format!("n must be 1 to {TOP_KEPT}, not {n}"));
        }
        let by = match self.by.as_deref() {
            None | Some("admitted") => RankBy::Admitted,
            Some("refused") => RankBy::Refused,
            Some(other) => return Err(format!("by must be admitted or refused, not {other:?}")),
        };
        Ok(Asked {
            service: self.service,
            resource: self.resource,
            slots,
            n,
            by,
        })
    }
}

pub(super) async fn top(
    State(state): State<HttpState>,
    query: Result<Query<TopQuery>, axum::extract::rejection::QueryRejection>,
) -> Response {
    let query = match query {
        Ok(Query(q)) => q,
        Err(e) => return error(StatusCode::BAD_REQUEST, e.body_text()),
    };
    let Some(top) = ask_top(&state.commands).await else {
        return error(
            StatusCode::SERVICE_UNAVAILABLE,
            "ledger is not running".into(),
        );
    };
    match query.check(&top) {
        Ok(asked) => axum::Json(answer(&top, &asked)).into_response(),
        Err(e) => error(StatusCode::BAD_REQUEST, e),
    }
}

/// Service -> resource -> the `n` heaviest users over the last `slots`
/// slots, the heaviest first.
fn answer(top: &TopUsers, asked: &Asked) -> Value {
    let wanted = |name: &str, filter: &Option<String>| filter.as_deref().is_none_or(|f| f == name);
    let mut services = Map::new();
    for (service, resources) in &top.services {
        if !wanted(service, &asked.service) {
            continue;
        }
        let mut out = Map::new();
        for (resource, users) in resources {
            if wanted(resource, &asked.resource) {
                out.insert(resource.clone(), Value::Array(ranked(users, asked)));
            }
        }
        services.insert(service.clone(), Value::Object(out));
    }
    json!({
        "to_slot": top.to_slot,
        "slots": asked.slots,
        "by": match asked.by { RankBy::Admitted => "admitted", RankBy::Refused => "refused" },
        "services": services,
    })
}

/// The `n` users of `users` with the largest total over the last `slots`
/// slots, by what `by` names, each as JSON.
fn ranked(users: &[UserSeries], asked: &Asked) -> Vec<Value> {
    let mut order: Vec<(&UserSeries, i64)> = users
        .iter()
        .map(|u| (u, u.total(asked.by, asked.slots)))
        .filter(|(_, total)| *total > 0)
        .collect();
    order.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.user.cmp(&b.0.user)));
    let last = |series: &[i64]| series[series.len().saturating_sub(asked.slots)..].to_vec();
    order
        .into_iter()
        .take(asked.n)
        .map(|(u, _)| {
            json!({
                "user": u.user,
                "admitted": u.total(RankBy::Admitted, asked.slots),
                "refused": u.total(RankBy::Refused, asked.slots),
                "consumption": last(&u.admitted),
                "rejection": last(&u.refused),
                "bucket": u.bucket.as_ref().map(bucket_json),
            })
        })
        .collect()
}
