//! `/metrics` on the example nodes: the layer's and reporter's metrics
//! ([`throttle_layer::telemetry`]) in Prometheus' text format.

use anyhow::Context;
use axum::Router;
use axum::http::header;
use axum::response::IntoResponse;
use axum::routing::get;
use metrics_exporter_prometheus::{PrometheusBuilder, PrometheusHandle};

/// Installs a Prometheus recorder as this process's, every metric of the
/// layer described.
///
/// # Errors
///
/// When a recorder is installed already.
pub fn install() -> anyhow::Result<PrometheusHandle> {
    let handle = PrometheusBuilder::new()
        .install_recorder()
        .context("installing the Prometheus recorder")?;
    throttle_layer::telemetry::describe();
    Ok(handle)
}

/// `GET /metrics`, rendered from `handle`.
pub fn router(handle: PrometheusHandle) -> Router {
    Router::new().route(
        "/metrics",
        get(move || {
            let text = handle.render();
            async move { ([(header::CONTENT_TYPE, "text/plain; version=0.0.4")], text).into_response() }
        }),
    )
}
