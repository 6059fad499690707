//! The admin API: `GET`, `PUT` and `DELETE /v1/limits/{service}/{user}`
//! (one user's rule), `PUT` and `DELETE /v1/blocks/{service}/{user}` and
//! `GET /v1/blocks` (block lists).
//! A change is written to the limits file (atomically, keeping the rest of
//! it as it was), or to the limits kept in etcd (a compare-and-swap on the
//! key), and applied at once, so the document stays the one source of the
//! limits and a change survives a restart. Behind the bearer token
//! when one is set.

use axum::body::Bytes;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde_json::{Value, json};
use throttle_clock::{Clock, SystemClock};

use super::{HttpState, error};
use crate::limits::{EditError, Editable, LimitSource, edit_block, edit_rule};

/// Edits one user's entry of a service in a file's text.
type Editor = fn(&str, &str, &str, Option<&Value>) -> Result<String, EditError>;

/// Why a request was refused: its status and message.
type Refusal = (StatusCode, String);

/// A handler's response, or its refusal as JSON.
fn answer(result: Result<Response, Refusal>) -> Response {
    result.unwrap_or_else(|(status, why)| error(status, why))
}

/// The limits to edit, or why there are none.
fn file(state: &HttpState) -> Result<Editable, Refusal> {
    state.editable.clone().ok_or_else(|| {
        let why =
            "the limits are not read from a file or etcd (--limits): there is nothing to edit";
        (StatusCode::CONFLICT, why.into())
    })
}

/// The JSON of a request body; `empty` for no body at all, if allowed.
fn json_body(body: &Bytes, empty: Option<Value>) -> Result<Value, Refusal> {
    match empty {
        Some(v) if body.is_empty() => Ok(v),
        _ => serde_json::from_slice(body).map_err(|e| {
            (
                StatusCode::BAD_REQUEST,
                format!("the body is not JSON: {e}"),
            )
        }),
    }
}

/// `user`'s own rule of `service` in force, as JSON.
fn rule_of(source: &dyn LimitSource, service: &str, user: &str) -> Option<Value> {
    let rules = source.list_limits(service);
    let rule = rules.into_iter().find(|l| l.user == user)?;
    Some(json!(rule))
}

/// `user`'s block in `service`, as JSON.
fn block_of(source: &dyn LimitSource, service: &str, user: &str) -> Option<Value> {
    let blocks = source.blocks();
    let block = blocks.get(service)?.get(user)?;
    Some(json!(block))
}

fn no_rule(service: &str, user: &str) -> Refusal {
    let why = format!("{user:?} has no rule of their own in {service:?}");
    (StatusCode::NOT_FOUND, why)
}

fn not_blocked(service: &str, user: &str) -> Refusal {
    (
        StatusCode::NOT_FOUND,
        format!("{user:?} is not blocked in {service:?}"),
    )
}

pub(super) async fn get_rule(
    State(state): State<HttpState>,
    Path((service, user)): Path<(String, String)>,
) -> Response {
    let rule = rule_of(&*state.limits, &service, &user);
    answer(
        rule.map(|r| axum::Json(r).into_response())
            .ok_or_else(|| no_rule(&service, &user)),
    )
}

pub(super) async fn put_rule(
    State(state): State<HttpState>,
    Path((service, user)): Path<(String, String)>,
    body: Bytes,
) -> Response {
    answer(
        put(&state, edit_rule, &service, &user, json_body(&body, None))
            .await
            .map(|()| {
                let rule = rule_of(&*state.limits, &service, &user).unwrap_or(Value::Null);
                axum::Json(rule).into_response()
            }),
    )
}

pub(super) async fn delete_rule(
    State(state): State<HttpState>,
    Path((service, user)): Path<(String, String)>,
) -> Response {
    let present = rule_of(&*state.limits, &service, &user).is_some();
    let missing = no_rule(&service, &user);
    answer(
        delete(
            &state,
            edit_rule,
            &service,
            &user,
            present.then_some(()).ok_or(missing),
        )
        .await,
    )
}

pub(super) async fn get_blocks(State(state): State<HttpState>) -> Response {
    let now = SystemClock.now_ms();
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
    let block = json_body(&body, Some(json!({})));
    answer(
        put(&state, edit_block, &service, &user, block)
            .await
            .map(|()| {
                let block = block_of(&*state.limits, &service, &user).unwrap_or(Value::Null);
                axum::Json(block).into_response()
            }),
    )
}

pub(super) async fn delete_block(
    State(state): State<HttpState>,
    Path((service, user)): Path<(String, String)>,
) -> Response {
    let present = block_of(&*state.limits, &service, &user).is_some();
    let missing = not_blocked(&service, &user);
    answer(
        delete(
            &state,
            edit_block,
            &service,
            &user,
            present.then_some(()).ok_or(missing),
        )
        .await,
    )
}

/// Writes `body` as `user`'s entry of `service` with `editor`.
async fn put(
    state: &HttpState,
    editor: Editor,
    service: &str,
    user: &str,
    body: Result<Value, Refusal>,
) -> Result<(), Refusal> {
    let file = file(state)?;
    let body = body?;
    edit(file, editor, service, user, Some(body)).await?;
    tracing::info!(%service, %user, "entry set through the admin API");
    Ok(())
}

/// Removes `user`'s entry of `service` with `editor`, if `present` (else
/// its refusal).
async fn delete(
    state: &HttpState,
    editor: Editor,
    service: &str,
    user: &str,
    present: Result<(), Refusal>,
) -> Result<Response, Refusal> {
    let file = file(state)?;
    present?;
    edit(file, editor, service, user, None).await?;
    tracing::info!(%service, %user, "entry removed through the admin API");
    Ok(StatusCode::NO_CONTENT.into_response())
}

/// Runs `editor` on the limits `file`.
async fn edit(
    file: Editable,
    editor: Editor,
    service: &str,
    user: &str,
    body: Option<Value>,
) -> Result<(), Refusal> {
    let (service, user) = (service.to_owned(), user.to_owned());
    let change = move |text: &str| editor(text, &service, &user, body.as_ref());
    match file.edit(Box::new(change)).await {
        Ok(()) => Ok(()),
        Err(e @ (EditError::Body(_) | EditError::Invalid(_))) => {
            Err((StatusCode::BAD_REQUEST, e.to_string()))
        }
        Err(e @ EditError::Etcd(_)) => Err((StatusCode::SERVICE_UNAVAILABLE, e.to_string())),
        Err(e) => Err((StatusCode::INTERNAL_SERVER_ERROR, e.to_string())),
    }
}
