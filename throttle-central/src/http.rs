//! The monitor API: `GET /v1/monitor/{subject}`, `/v1/limits`, `/metrics`,
//! `/healthz`. It asks the ledger's task ([`crate::server`]) and renders
//! the typed answers as JSON ([`monitor`]).

pub(crate) mod monitor;
mod token;

use std::sync::Arc;

use axum::Router;
use axum::extract::{Path, Query, State};
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use serde::Deserialize;
use serde_json::json;
use tokio::sync::mpsc;

use crate::leadership::Leadership;
use crate::ledger::SlotRange;
use crate::limits::LimitSource;
use crate::server::{Command, Subject, ask};

/// What the HTTP handlers share.
#[derive(Clone)]
pub(crate) struct HttpState {
    pub(crate) commands: mpsc::Sender<Command>,
    pub(crate) limits: Arc<dyn LimitSource>,
    pub(crate) leadership: Arc<dyn Leadership>,
    pub(crate) metrics: Option<metrics_exporter_prometheus::PrometheusHandle>,
    /// The bearer token every route but `/healthz` requires, if any.
    pub(crate) token: Option<Arc<str>>,
}

#[derive(Debug, Deserialize)]
struct RangeQuery {
    start_slot: Option<i64>,
    end_slot: Option<i64>,
}

/// The monitor API's routes.
pub(crate) fn router(state: HttpState) -> Router {
    let mut guarded = Router::new()
        .route("/v1/monitor/{subject}", get(monitor_subject))
        .route("/v1/limits", get(limits))
        .route("/metrics", get(metrics));
    if let Some(token) = state.token.clone() {
        guarded = guarded.route_layer(axum::middleware::from_fn_with_state(token, token::require));
    }
    guarded.route("/healthz", get(healthz)).with_state(state)
}

fn error(status: StatusCode, message: String) -> Response {
    (status, axum::Json(json!({"error": message}))).into_response()
}

async fn monitor_subject(
    State(state): State<HttpState>,
    Path(subject): Path<String>,
    query: Result<Query<RangeQuery>, axum::extract::rejection::QueryRejection>,
) -> Response {
    let Ok(subject) = subject.parse::<Subject>() else {
        return error(
            StatusCode::NOT_FOUND,
            format!(
                "unknown subject {subject:?}; one of connections, reported, consumption_sum, rejection_sum, distribution, quota"
            ),
        );
    };
    let range = match query {
        Ok(Query(q)) => SlotRange {
            start: q.start_slot,
            end: q.end_slot,
        },
        Err(e) => return error(StatusCode::BAD_REQUEST, e.body_text()),
    };
    match ask(&state.commands, subject, range).await {
        Some(view) => axum::Json(monitor::to_json(&view)).into_response(),
        None => error(
            StatusCode::SERVICE_UNAVAILABLE,
            "ledger is not running".into(),
        ),
    }
}

async fn limits(State(state): State<HttpState>) -> Response {
    let limits: serde_json::Map<String, serde_json::Value> = state
        .limits
        .services()
        .into_iter()
        .map(|s| {
            let list = state.limits.list_limits(&s);
            (s, json!(list))
        })
        .collect();
    axum::Json(json!({"limits": limits, "last_error": state.limits.last_error()})).into_response()
}

async fn metrics(State(state): State<HttpState>) -> Response {
    match &state.metrics {
        Some(handle) => (
            [(header::CONTENT_TYPE, "text/plain; version=0.0.4")],
            handle.render(),
        )
            .into_response(),
        None => error(
            StatusCode::NOT_FOUND,
            "no metrics recorder installed".into(),
        ),
    }
}

async fn healthz(State(state): State<HttpState>) -> Response {
    axum::Json(json!({"status": "ok", "leader": state.leadership.is_leader()})).into_response()
}
