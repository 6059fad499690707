//! The admin API: `GET`, `PUT` and `DELETE /v1/limits/{service}/{user}`
//! (one user's rule), `PUT` and `DELETE /v1/blocks/{service}/{user}` and
//! `GET /v1/blocks` (block lists).
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
use crate::limits::{EditError, FileLimits, LimitSource, edit_block, edit_rule};

/// Edits one user's entry of a service in a file's text.
type Editor = fn(&str, &str, &str, Option<&Value>) -> Result<String, EditError>;

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
    let present = rule_of(&*state.limits, &service, &user).is_some();
    let missing = format!("{user:?} has no rule of their own in {service:?}");
    remove(
        &state,
        (service, user),
        present.then_some(edit_rule as Editor).ok_or(missing),
    )
    .await
}

/// Edits `user`'s entry of `service` out of the file with `editor`, or
/// answers 404 with the message in `editor`'s place.
async fn remove(
    state: &HttpState,
    (service, user): (String, String),
    editor: Result<Editor, String>,
) -> Response {
    let file = match file(state) {
        Ok(f) => f,
        Err(r) => return refused(r),
    };
    let editor = match editor {
        Ok(e) => e,
        Err(missing) => return error(StatusCode::NOT_FOUND, missing),
    };
    let (s, u) = (service.clone(), user.clone());
    if let Err(r) = edit(file, move |text| editor(text, &s, &u, None)).await {
        return refused(r);
    }
    tracing::info!(%service, %user, "entry removed through the admin API");
    StatusCode::NO_CONTENT.into_response()
}

pub(super) async fn get_blocks(State(state): State<HttpState>) -> Response {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX));
    let blocks: serde_json::Map<String, Value> = state
        .limits
        .blocks()
        .into_iter()
        .map(|(service, users)| {
            let users: serde_json::Map<String, Value> = users
                .into_iter()
                .map(|(user, b)| {
                    let entry = json!({"until_ms": b.until_ms, "reason": b.reason, "active": b.holds_at(now)});
                    (user, entry)
                })
                .collect();
            (service, Value::Object(users))
        })
        .collect();
    axum::Json(json!({"blocks": blocks})).into_response()
}

pub(super) async fn put_block(
    State(state): State<HttpState>,
    Path((service, user)): Path<(String, String)>,
    body: Bytes,
) -> Response {
    let file = match file(&state) {
        Ok(f) => f,
        Err(r) => return refused(r),
    };
    let block: Value = if body.is_empty() {
        json!({})
    } else {
        match serde_json::from_slice(&body) {
            Ok(v) => v,
            Err(e) => {
                return error(
                    StatusCode::BAD_REQUEST,
                    format!("the body is not JSON: {e}"),
                );
            }
        }
    };
    let (s, u) = (service.clone(), user.clone());
    if let Err(r) = edit(file, move |text| edit_block(text, &s, &u, Some(&block))).await {
        return refused(r);
    }
    tracing::info!(%service, %user, "user blocked through the admin API");
    let blocks = state.limits.blocks();
    let block = blocks.get(&service).and_then(|users| users.get(&user));
    axum::Json(json!(block)).into_response()
}

pub(super) async fn delete_block(
    State(state): State<HttpState>,
    Path((service, user)): Path<(String, String)>,
) -> Response {
    let blocks = state.limits.blocks();
    let present = blocks.get(&service).is_some_and(|u| u.contains_key(&user));
    let missing = format!("{user:?} is not blocked in {service:?}");
    remove(
        &state,
        (service, user),
        present.then_some(edit_block as Editor).ok_or(missing),
    )
    .await
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
