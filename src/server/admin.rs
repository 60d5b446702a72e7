//! The admin HTTP endpoints: `/healthz` (the process answers), `/readyz`
//! (serving decisions; 503 while starting or shutting down) and `/metrics`
//! (Prometheus text).

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use axum::Router;
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::IntoResponse;
use axum::routing::get;

use crate::store::MemoryStats;

use super::metrics::Metrics;

#[derive(Clone)]
pub struct AdminState {
    pub ready: Arc<AtomicBool>,
    pub metrics: Arc<Metrics>,
    /// Read at each scrape, so the gauges are current.
    pub store_stats: Arc<dyn Fn() -> MemoryStats + Send + Sync>,
}

pub fn router(state: AdminState) -> Router {
    Router::new()
        .route("/healthz", get(|| async { "ok\n" }))
        .route("/readyz", get(readyz))
        .route("/metrics", get(metrics))
        .with_state(state)
}

async fn readyz(State(state): State<AdminState>) -> impl IntoResponse {
    if state.ready.load(Ordering::SeqCst) {
        (StatusCode::OK, "ready\n")
    } else {
        (StatusCode::SERVICE_UNAVAILABLE, "not ready\n")
    }
}

async fn metrics(State(state): State<AdminState>) -> impl IntoResponse {
    state.metrics.set_store((state.store_stats)());
    (
        [(
            header::CONTENT_TYPE,
            "application/openmetrics-text; version=1.0.0; charset=utf-8",
        )],
        state.metrics.encode(),
    )
}
