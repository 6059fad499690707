//! The admin API: `GET`, `PUT` and `DELETE /v1/limits/{service}/{user}`.
//! A change is written to the limits file (atomically, keeping the rest of
//! it as it was) and applied at once, so the file stays the one source of
//! the limits and a change survives a restart. Behind the bearer token
//! when one is set.

use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde_json::{Value, json};

use super::{HttpState, error};
use crate::limits::{EditError, FileLimits, LimitSource, edit_rule};

/// Why a request was refused: its status and message.
type Refusal = (StatusCode, String);

fn refused((status, why): Refusal) -> Response {
    error(status, why)
}

/// The file to edit, or why there is none.
fn file(state: &HttpState) -> Result<Arc<FileLimits>, Refusal> {
    state.limits_file.clone().ok_or_else(|| {
        let why = "the limits are not read from a file (--limits): there is nothing to edit";
        (StatusCode::CONFLICT, why.into())
    })
}

/// `user`'s own rule of `service` in force, as JSON.
fn rule_of(source: &dyn LimitSource, service: &str, user: &str) -> Option<Value> {
    let rules = source.list_limits(service);
    let rule = rules.into_iter().find(|l| l.user == user)?;
    Some(json!(rule))
}

pub(super) async fn get_rule(
    State(state): State<HttpState>,
    Path((service, user)): Path<(String, String)>,
) -> Response {
    match rule_of(&*state.limits, &service, &user) {
        Some(rule) => axum::Json(rule).into_response(),
        None => error(
            StatusCode::NOT_FOUND,
            format!("{user:?} has no rule of their own in {service:?}"),
        ),
    }
}

pub(super) async fn put_rule(
    State(state): State<HttpState>,
    Path((service, user)): Path<(String, String)>,
    body: Bytes,
) -> Response {
    let file = match file(&state) {
        Ok(f) => f,
        Err(r) => return refused(r),
    };
    let rule: Value = match serde_json::from_slice(&body) {
        Ok(v) => v,
        Err(e) => {
            return error(
                StatusCode::BAD_REQUEST,
                format!("the body is not JSON: {e}"),
            );
        }
    };
    let (s, u) = (service.clone(), user.clone());
    let edited = edit(file, move |text| edit_rule(text, &s, &u, Some(&rule))).await;
    if let Err(r) = edited {
        return refused(r);
    }
    let rule = rule_of(&*state.limits, &service, &user).unwrap_or(Value::Null);
    tracing::info!(%service, %user, "rule set through the admin API");
    axum::Json(rule).into_response()
}

pub(super) async fn delete_rule(
    State(state): State<HttpState>,
    Path((service, user)): Path<(String, String)>,
) -> Response {
    let file = match file(&state) {
        Ok(f) => f,
        Err(r) => return refused(r),
    };
    if rule_of(&*state.limits, &service, &user).is_none() {
        return error(
            StatusCode::NOT_FOUND,
            format!("{user:?} has no rule of their own in {service:?}"),
        );
    }
    let (s, u) = (service.clone(), user.clone());
    if let Err(r) = edit(file, move |text| edit_rule(text, &s, &u, None)).await {
        return refused(r);
    }
    tracing::info!(%service, %user, "rule removed through the admin API");
    StatusCode::NO_CONTENT.into_response()
}

/// Runs an edit of `file` off the runtime's workers (it reads, writes and
/// syncs files).
async fn edit(
    file: Arc<FileLimits>,
    change: impl FnOnce(&str) -> Result<String, EditError> + Send + 'static,
) -> Result<(), Refusal> {
    let done = tokio::task::spawn_blocking(move || file.edit(change)).await;
    match done {
        Ok(Ok(())) => Ok(()),
        Ok(Err(e @ (EditError::Body(_) | EditError::Invalid(_)))) => {
            Err((StatusCode::BAD_REQUEST, e.to_string()))
        }
        Ok(Err(e)) => Err((StatusCode::INTERNAL_SERVER_ERROR, e.to_string())),
        Err(e) => Err((StatusCode::INTERNAL_SERVER_ERROR, e.to_string())),
    }
}
