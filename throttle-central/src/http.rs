//! The monitor API: `GET /v1/monitor/{subject}`, `/v1/limits` (`limits`),
//! `/v1/monitor/top` (`top`), `/v1/usage` and `/v1/usage/top` (`usage`), `/metrics`, `/healthz` (and `/healthz/leader`); the page that draws it, `/dashboard`
//! (`dashboard`); and the admin API on one user's rule, `GET`,
//! `PUT`, `DELETE /v1/limits/{service}/{user}` (`admin`). It asks the ledger's task ([`crate::ledger_task`])
//! and renders the typed answers as JSON ([`monitor`]).

mod admin;
mod dashboard;
mod limits;
pub(crate) mod monitor;
mod token;
mod top;
mod usage;

use std::sync::Arc;

use axum::Router;
use axum::extract::{Path, Query, State};
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use serde::Deserialize;
use serde_json::json;
use tokio::sync::{Semaphore, mpsc};

use crate::ha::leadership::Leadership;
use crate::ledger::{Cursor, Page, SlotRange};
use crate::ledger_task::{Command, Subject, ask};
use crate::limits::LimitSource;

/// What the HTTP handlers share.
#[derive(Clone)]
pub(crate) struct HttpState {
    pub(crate) commands: mpsc::Sender<Command>,
    pub(crate) limits: Arc<dyn LimitSource>,
    pub(crate) leadership: Arc<dyn Leadership>,
    pub(crate) metrics: Option<metrics_exporter_prometheus::PrometheusHandle>,
    /// The bearer token every route but `/healthz` requires, if any.
    pub(crate) token: Option<Arc<str>>,
    /// The limits the admin API edits, if they are read from a file or
    /// etcd.
    pub(crate) editable: Option<crate::limits::Editable>,
    /// The slot length, for the dashboard.
    pub(crate) slot_ms: u32,
    /// Places for monitor questions being answered.
    pub(crate) monitor_places: Arc<Semaphore>,
    /// The usage store the usage API reads, if any.
    pub(crate) usage: Option<crate::usage::UsageConfig>,
    /// The central's clock: "now" in the usage API.
    pub(crate) clock: Arc<dyn throttle_clock::Clock>,
}

impl HttpState {
    /// The permits of [`HttpState::monitor_places`].
    pub(crate) fn monitor_places() -> Arc<Semaphore> {
        Arc::new(Semaphore::new(MONITOR_AT_ONCE))
    }
}

/// Rows a monitor page holds unless `?limit=` says otherwise.
pub(crate) const DEFAULT_PAGE_ROWS: usize = 1_000;
/// Most rows a monitor page may hold: a page of 10,000 keys takes the
/// ledger's task about 10 ms to copy out at 400,000 keys.
pub(crate) const MAX_PAGE_ROWS: usize = 10_000;
/// Monitor questions answered at once; others wait their turn, so at most
/// this many pages are in memory.
const MONITOR_AT_ONCE: usize = 4;

#[derive(Debug, Deserialize)]
struct MonitorQuery {
    start_slot: Option<i64>,
    end_slot: Option<i64>,
    limit: Option<usize>,
    after: Option<String>,
    user: Option<String>,
    service: Option<String>,
}

impl MonitorQuery {
    /// The page asked for, or why it cannot be given.
    fn page(self) -> Result<Page, String> {
        let limit = self.limit.unwrap_or(DEFAULT_PAGE_ROWS);
        if !(1..=MAX_PAGE_ROWS).contains(&limit) {
            return Err(format!("limit must be 1 to {MAX_PAGE_ROWS}, not {limit}"));
        }
        let after = match self.after.as_deref() {
            Some(text) => Some(Cursor::decode(text).ok_or("after is not a cursor this API gave")?),
            None => None,
        };
        Ok(Page {
            limit,
            after,
            user: self.user,
            service: self.service,
        })
    }
}

/// The monitor API's routes.
pub(crate) fn router(state: HttpState) -> Router {
    let mut guarded = Router::new()
        .route("/v1/monitor/top", get(top::top))
        .route("/v1/usage", get(usage::rows))
        .route("/v1/usage/top", get(usage::top))
        .route("/v1/monitor/{subject}", get(monitor_subject))
        .route("/v1/limits", get(limits::limits))
        .route(
            "/v1/limits/{service}/{user}",
            get(admin::get_rule)
                .put(admin::put_rule)
                .delete(admin::delete_rule),
        )
        .route("/v1/blocks", get(admin::get_blocks))
        .route(
            "/v1/blocks/{service}/{user}",
            axum::routing::put(admin::put_block).delete(admin::delete_block),
        )
        .route("/metrics", get(metrics));
    if let Some(token) = state.token.clone() {
        guarded = guarded.route_layer(axum::middleware::from_fn_with_state(token, token::require));
    }
    guarded
        .route("/healthz", get(healthz))
        .route("/healthz/leader", get(healthz_leader))
        .merge(dashboard::routes())
        .with_state(state)
}

fn error(status: StatusCode, message: String) -> Response {
    (status, axum::Json(json!({"error": message}))).into_response()
}

async fn monitor_subject(
    State(state): State<HttpState>,
    Path(subject): Path<String>,
    query: Result<Query<MonitorQuery>, axum::extract::rejection::QueryRejection>,
) -> Response {
    let Ok(subject) = subject.parse::<Subject>() else {
        return error(
            StatusCode::NOT_FOUND,
            format!(
                "unknown subject {subject:?}; one of connections, reported, consumption_sum, rejection_sum, distribution, quota, apps"
            ),
        );
    };
    let query = match query {
        Ok(Query(q)) => q,
        Err(e) => return error(StatusCode::BAD_REQUEST, e.body_text()),
    };
    let range = SlotRange {
        start: query.start_slot,
        end: query.end_slot,
    };
    let page = match query.page() {
        Ok(page) => page,
        Err(e) => return error(StatusCode::BAD_REQUEST, e),
    };
    let Ok(_place) = state.monitor_places.acquire().await else {
        return error(StatusCode::SERVICE_UNAVAILABLE, "shutting down".into());
    };
    let Some(view) = ask(&state.commands, subject, range, page.clone()).await else {
        return error(
            StatusCode::SERVICE_UNAVAILABLE,
            "ledger is not running".into(),
        );
    };
    let mut response = axum::Json(monitor::to_json(&view)).into_response();
    if let Some(next) = view.next() {
        let link = next_link(subject, range, &page, next);
        if let Ok(value) = header::HeaderValue::from_str(&link) {
            response.headers_mut().insert(header::LINK, value);
        }
    }
    response
}

/// The `Link` header (RFC 8288) to the page after `page`.
fn next_link(subject: Subject, range: SlotRange, page: &Page, next: &Cursor) -> String {
    let mut query = form_urlencoded::Serializer::new(String::new());
    if let Some(start) = range.start {
        query.append_pair("start_slot", &start.to_string());
    }
    if let Some(end) = range.end {
        query.append_pair("end_slot", &end.to_string());
    }
    if let Some(user) = &page.user {
        query.append_pair("user", user);
    }
    if let Some(service) = &page.service {
        query.append_pair("service", service);
    }
    query.append_pair("limit", &page.limit.to_string());
    query.append_pair("after", &next.encode());
    format!(
        "</v1/monitor/{}?{}>; rel=\"next\"",
        subject.as_str(),
        query.finish()
    )
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

/// 200 on the leader (or a lone central), 503 elsewhere: the health check
/// an Envoy cluster of every central uses to send its RLQS stream to the
/// leader.
async fn healthz_leader(State(state): State<HttpState>) -> Response {
    let role = state.leadership.role();
    match state.leadership.is_leader() {
        true => (StatusCode::OK, format!("{role}\n")).into_response(),
        false => (StatusCode::SERVICE_UNAVAILABLE, format!("{role}\n")).into_response(),
    }
}

async fn healthz(State(state): State<HttpState>) -> Response {
    let l = &state.leadership;
    axum::Json(json!({
        "status": "ok",
        "leader": l.is_leader(),
        "role": l.role(),
        "leader_address": l.leader(),
        "epoch": l.epoch(),
        "slot_ms": state.slot_ms,
    }))
    .into_response()
}
