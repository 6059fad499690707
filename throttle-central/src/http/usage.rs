//! `GET /v1/usage` (a user's or a service's rows, a page at a time, JSON
//! or CSV) and `GET /v1/usage/top` (the heaviest users of a range): the
//! usage store's questions, answered off the async tasks.

use std::time::{Duration, UNIX_EPOCH};

use axum::extract::rejection::QueryRejection;
use axum::extract::{Query, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde::Deserialize;
use serde_json::{Map, Value, json};

use super::{DEFAULT_PAGE_ROWS, HttpState, MAX_PAGE_ROWS, error};
use crate::usage::{RowCursor, RowsQuery, Step, TopQuery, UsageConfig, UsageRow};

/// Users answered per resource unless `n` says otherwise.
const DEFAULT_N: usize = 10;
/// Most users answered per resource.
const MAX_N: usize = 1_000;
/// The range asked when `from` is not given: the day before `to`.
const DEFAULT_RANGE_S: i64 = 86_400;

#[derive(Debug, Deserialize)]
pub(super) struct UsageParams {
    service: Option<String>,
    user: Option<String>,
    resource: Option<String>,
    from: Option<String>,
    to: Option<String>,
    step: Option<String>,
    limit: Option<usize>,
    after: Option<String>,
    n: Option<usize>,
}

/// The range and step a question names, checked.
struct Range {
    service: String,
    step: Step,
    from_s: i64,
    to_s: i64,
}

/// A time of the API: Unix seconds, or RFC 3339 (`2026-11-27T10:00:00Z`).
fn parse_time(name: &str, text: &str) -> Result<i64, String> {
    if let Ok(s) = text.parse::<i64>() {
        return Ok(s);
    }
    let t = humantime::parse_rfc3339_weak(text)
        .map_err(|e| format!("{name} must be Unix seconds or RFC 3339: {e}"))?;
    let since = t
        .duration_since(UNIX_EPOCH)
        .map_err(|_| format!("{name} is before 1970"))?;
    i64::try_from(since.as_secs()).map_err(|_| format!("{name} is too far ahead"))
}

/// `unix_s` in RFC 3339, UTC.
fn format_time(unix_s: i64) -> String {
    let t = match u64::try_from(unix_s) {
        Ok(s) => UNIX_EPOCH + Duration::from_secs(s),
        Err(_) => UNIX_EPOCH,
    };
    humantime::format_rfc3339_seconds(t).to_string()
}

impl UsageParams {
    /// The range asked, at `now_s`, against `usage`'s retention.
    fn range(&self, usage: &UsageConfig, now_s: i64) -> Result<Range, String> {
        let service = self.service.clone().ok_or("service is required")?;
        let to_s = match &self.to {
            Some(t) => parse_time("to", t)?,
            None => now_s,
        };
        let from_s = match &self.from {
            Some(t) => parse_time("from", t)?,
            None => to_s.saturating_sub(DEFAULT_RANGE_S),
        };
        if from_s >= to_s {
            return Err(format!("from ({from_s}) must be before to ({to_s})"));
        }
        let step = match &self.step {
            Some(s) => s.parse()?,
            None => usage.retention.finest_holding(from_s, now_s),
        };
        Ok(Range {
            service,
            step,
            from_s: step.start_of(from_s),
            to_s,
        })
    }

    fn rows_query(&self, range: Range) -> Result<RowsQuery, String> {
        let limit = self.limit.unwrap_or(DEFAULT_PAGE_ROWS);
        if !(1..=MAX_PAGE_ROWS).contains(&limit) {
            return Err(format!("limit must be 1 to {MAX_PAGE_ROWS}, not {limit}"));
        }
        let after = match &self.after {
            Some(text) => {
                Some(RowCursor::decode(text).ok_or("after is not a cursor this API gave")?)
            }
            None => None,
        };
        Ok(RowsQuery {
            step: range.step,
            service: range.service,
            user: self.user.clone(),
            resource: self.resource.clone(),
            from_s: range.from_s,
            to_s: range.to_s,
            after,
            limit,
        })
    }
}

/// The question's parameters and the usage store, or the answer that
/// says why there is no answer (bad parameters, no store).
fn asked(
    state: &HttpState,
    params: Result<Query<UsageParams>, QueryRejection>,
) -> Result<(UsageParams, UsageConfig), Box<Response>> {
    let Query(params) =
        params.map_err(|e| Box::new(error(StatusCode::BAD_REQUEST, e.body_text())))?;
    let usage = state.usage.clone().ok_or_else(|| {
        Box::new(error(
            StatusCode::NOT_FOUND,
            "no usage store: start the central with --usage".into(),
        ))
    })?;
    Ok((params, usage))
}

/// Runs `f` on the store off the async tasks, one of the monitor's places
/// taken meanwhile.
async fn blocking<T: Send + 'static>(
    state: &HttpState,
    f: impl FnOnce() -> Result<T, crate::usage::UsageError> + Send + 'static,
) -> Result<T, Response> {
    let Ok(_place) = state.monitor_places.acquire().await else {
        return Err(error(StatusCode::SERVICE_UNAVAILABLE, "stopping".into()));
    };
    match tokio::task::spawn_blocking(f).await {
        Ok(Ok(out)) => Ok(out),
        Ok(Err(e)) => Err(error(
            StatusCode::SERVICE_UNAVAILABLE,
            format!("usage store: {e}"),
        )),
        Err(e) => Err(error(
            StatusCode::INTERNAL_SERVER_ERROR,
            format!("usage query: {e}"),
        )),
    }
}

fn now_s(state: &HttpState) -> i64 {
    state.clock.now_ms().div_euclid(1000)
}

fn wants_csv(headers: &HeaderMap) -> bool {
    headers
        .get(header::ACCEPT)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.contains("text/csv"))
}

pub(super) async fn rows(
    State(state): State<HttpState>,
    headers: HeaderMap,
    params: Result<Query<UsageParams>, QueryRejection>,
) -> Response {
    let (params, usage) = match asked(&state, params) {
        Ok(asked) => asked,
        Err(r) => return *r,
    };
    let query = match params
        .range(&usage, now_s(&state))
        .and_then(|range| params.rows_query(range))
    {
        Ok(q) => q,
        Err(e) => return error(StatusCode::BAD_REQUEST, e),
    };
    let asked = query.clone();
    let store = usage.store.clone();
    let rows = match blocking(&state, move || store.rows(&asked)).await {
        Ok(rows) => rows,
        Err(r) => return r,
    };
    let next = (rows.len() == query.limit)
        .then(|| rows.last().map(|r| r.cursor().encode()))
        .flatten();
    if wants_csv(&headers) {
        return with_link(csv(&query, &rows), &query, next.as_deref());
    }
    let body = axum::Json(json!({
        "service": query.service,
        "step": query.step.name(),
        "from": format_time(query.from_s),
        "to": format_time(query.to_s),
        "rows": rows.iter().map(|r| json!({
            "start": format_time(r.start_s),
            "start_s": r.start_s,
            "user": r.user,
            "resource": r.resource,
            "admitted": r.admitted,
            "refused": r.refused,
        })).collect::<Vec<_>>(),
        "next": next,
    }));
    with_link(body.into_response(), &query, next.as_deref())
}

/// A field of a CSV line, quoted when it must be (RFC 4180).
fn field(text: &str) -> String {
    if text.contains([',', '"', '\n', '\r']) {
        format!("\"{}\"", text.replace('"', "\"\""))
    } else {
        text.to_owned()
    }
}

/// The `Link` to the page after `query`'s, which starts after `next`.
fn link(query: &RowsQuery, next: &str) -> Option<HeaderValue> {
    let mut q = form_urlencoded::Serializer::new(String::new());
    q.append_pair("service", &query.service);
    q.append_pair("step", query.step.name());
    q.append_pair("from", &query.from_s.to_string());
    q.append_pair("to", &query.to_s.to_string());
    if let Some(user) = &query.user {
        q.append_pair("user", user);
    }
    if let Some(resource) = &query.resource {
        q.append_pair("resource", resource);
    }
    q.append_pair("limit", &query.limit.to_string());
    q.append_pair("after", next);
    HeaderValue::from_str(&format!("</v1/usage?{}>; rel=\"next\"", q.finish())).ok()
}

/// `response` with the `Link` to the next page, if there is one.
fn with_link(mut response: Response, query: &RowsQuery, next: Option<&str>) -> Response {
    if let Some(link) = next.and_then(|n| link(query, n)) {
        response.headers_mut().insert(header::LINK, link);
    }
    response
}

fn csv(query: &RowsQuery, rows: &[UsageRow]) -> Response {
    let mut body = String::from("start,step,service,user,resource,admitted,refused\r\n");
    let service = field(&query.service);
    for r in rows {
        body.push_str(&format!(
            "{},{},{service},{},{},{},{}\r\n",
            format_time(r.start_s),
            query.step.name(),
            field(&r.user),
            field(&r.resource),
            r.admitted,
            r.refused
        ));
    }
    let csv_type = HeaderValue::from_static("text/csv; charset=utf-8");
    ([(header::CONTENT_TYPE, csv_type)], body).into_response()
}

pub(super) async fn top(
    State(state): State<HttpState>,
    params: Result<Query<UsageParams>, QueryRejection>,
) -> Response {
    let (params, usage) = match asked(&state, params) {
        Ok(asked) => asked,
        Err(r) => return *r,
    };
    let n = params.n.unwrap_or(DEFAULT_N);
    let range = match params.range(&usage, now_s(&state)) {
        Ok(r) if (1..=MAX_N).contains(&n) => r,
        Ok(_) => {
            return error(
                StatusCode::BAD_REQUEST,
                format!("n must be 1 to {MAX_N}, not {n}"),
            );
        }
        Err(e) => return error(StatusCode::BAD_REQUEST, e),
    };
    let query = TopQuery {
        step: range.step,
        service: range.service,
        resource: params.resource.clone().unwrap_or_default(),
        from_s: range.from_s,
        to_s: range.to_s,
        n,
    };
    let (asked, store, only) = (query.clone(), usage.store.clone(), params.resource.clone());
    let answered = blocking(&state, move || {
        let resources = match only {
            Some(r) => vec![r],
            None => store.resources(&asked)?,
        };
        let mut out = Vec::with_capacity(resources.len());
        for resource in resources {
            let q = TopQuery {
                resource,
                ..asked.clone()
            };
            let top = store.top(&q)?;
            out.push((q.resource, top));
        }
        Ok(out)
    })
    .await;
    let answered = match answered {
        Ok(a) => a,
        Err(r) => return r,
    };
    let mut resources = Map::new();
    for (resource, users) in answered {
        let users: Vec<Value> = users
            .iter()
            .map(|u| json!({"user": u.user, "admitted": u.admitted, "refused": u.refused}))
            .collect();
        resources.insert(resource, Value::Array(users));
    }
    axum::Json(json!({
        "service": query.service,
        "step": query.step.name(),
        "from": format_time(query.from_s),
        "to": format_time(query.to_s),
        "resources": resources,
    }))
    .into_response()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn times_read_as_seconds_or_rfc3339_and_fields_are_quoted() {
        assert_eq!(parse_time("from", "1795000000"), Ok(1_795_000_000));
        assert_eq!(
            parse_time("from", "2026-11-27T10:00:00Z"),
            Ok(1_795_773_600)
        );
        assert!(parse_time("from", "yesterday").is_err());
        assert_eq!(format_time(1_795_773_600), "2026-11-27T10:00:00Z");
        assert_eq!(field("a,b"), "\"a,b\"");
        assert_eq!(field("say \"hi\""), "\"say \"\"hi\"\"\"");
        assert_eq!(field("plain"), "plain");
    }

    #[tokio::test]
    async fn a_csv_page_links_to_the_next() {
        let query = RowsQuery {
            step: Step::Minute,
            service: "front".into(),
            user: Some("a b".into()),
            resource: None,
            from_s: 60,
            to_s: 180,
            after: None,
            limit: 1,
        };
        let row = UsageRow {
            start_s: 60,
            user: "a,b".into(),
            resource: "requests".into(),
            admitted: 7,
            refused: 1,
        };
        let next = row.cursor().encode();
        let response = with_link(csv(&query, &[row]), &query, Some(&next));
        let link = response.headers()[header::LINK]
            .to_str()
            .unwrap()
            .to_owned();
        assert_eq!(
            link,
            format!(
                "</v1/usage?service=front&step=minute&from=60&to=180&user=a+b&limit=1&after={next}>; rel=\"next\""
            )
        );
        let body = axum::body::to_bytes(response.into_body(), 1 << 16)
            .await
            .unwrap();
        assert_eq!(
            std::str::from_utf8(&body).unwrap(),
            "start,step,service,user,resource,admitted,refused\r\n\
             1970-01-01T00:01:00Z,minute,front,\"a,b\",requests,7,1\r\n"
        );
    }
}
