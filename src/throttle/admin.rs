//! The throttling sidecar's admin port: the kit's skeleton (`/healthz`,
//! `/readyz`: 200 while it serves, 503 once it drains, the kubelet's
//! readiness probe; `/metrics`), filled with the proxy's counts, the
//! protections against hostile clients among them
//! (`charon_throttle_protection_total`); and `/stats` (JSON).

use std::sync::Arc;
use std::sync::atomic::Ordering;

use axum::Router;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::IntoResponse;
use axum::routing::get;
use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::registry::Registry;
use serde::Serialize;

use super::Proxy;
use super::protect::Reason;
use crate::kit::admin;
use crate::layer::ThrottleLayer;

/// What `/stats` shows.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct Stats {
    /// Whether the proxy serves (false while it drains).
    pub ready: bool,
    /// Requests taken in, refused ones included.
    pub requests: u64,
    /// How many may reach the upstream at once now (none: no limit).
    pub concurrency_limit: Option<usize>,
    /// Refused for want of a slot before their deadline.
    pub refused_overloaded: u64,
    /// Refused because the drain queue was full.
    pub refused_queue_full: u64,
    /// Refused 429 by the per-tenant limits (`--config`).
    pub refused_tenant_limit: u64,
    /// Waiting in the drain queue now.
    pub drain_waiting: usize,
    /// Answered 502: the upstream refused, reset, or did not speak HTTP.
    pub upstream_failures: u64,
    /// Answered 504: no response headers in time.
    pub upstream_timeouts: u64,
    /// Criticality values it did not know (the default level was used).
    pub unknown_criticality: u64,
    /// Deadline headers it could not read (ignored).
    pub bad_deadlines: u64,
    /// Each request class's (path's) predicted and reported cost.
    pub classes: Vec<crate::layer::ClassCost>,
    /// Client connections open now.
    pub open_connections: u64,
    /// The most client connections open at once.
    pub max_connections: usize,
    /// What each protection stopped, by [`Reason::name`].
    pub protection: std::collections::BTreeMap<&'static str, u64>,
}

impl Proxy {
    /// What the proxy counted so far.
    pub fn stats(&self) -> Stats {
        let throttle = |read: fn(&crate::layer::ThrottleCounts) -> u64| {
            self.throttle_counts.as_deref().map_or(0, read)
        };
        Stats {
            ready: self.ready.load(Ordering::SeqCst),
            requests: self.counts.requests.load(Ordering::Relaxed),
            concurrency_limit: self.throttle.as_ref().map(|layer| layer.limit()),
            refused_overloaded: throttle(|counts| counts.refused.load(Ordering::Relaxed)),
            refused_queue_full: self.drain.as_ref().map_or(0, |queue| queue.refused()),
            refused_tenant_limit: self.counts.tenant_refused.load(Ordering::Relaxed),
            drain_waiting: self.drain.as_ref().map_or(0, |queue| queue.waiting()),
            upstream_failures: self.counts.upstream_failures.load(Ordering::Relaxed),
            upstream_timeouts: self.counts.upstream_timeouts.load(Ordering::Relaxed),
            unknown_criticality: throttle(|counts| {
                counts.unknown_criticality.load(Ordering::Relaxed)
            }),
            bad_deadlines: throttle(|counts| counts.bad_deadlines.load(Ordering::Relaxed)),
            classes: self
                .throttle
                .as_ref()
                .map(ThrottleLayer::costs)
                .unwrap_or_default(),
            open_connections: self
                .protection_counts
                .open_connections
                .load(Ordering::Relaxed),
            max_connections: self.max_connections,
            protection: Reason::ALL
                .into_iter()
                .map(|reason| (reason.name(), self.protection_counts.get(reason)))
                .collect(),
        }
    }

    /// The admin port's routes: the kit's skeleton, ready while the proxy
    /// serves, and `/stats`.
    pub fn admin_router(&self) -> Router {
        let mut registry = Registry::default();
        registry.register_collector(Box::new(StatsCollector(self.clone())));
        let proxy = self.clone();
        let readiness: admin::Readiness = Arc::new(move || {
            if proxy.ready.load(Ordering::SeqCst) {
                (StatusCode::OK, "ready\n".to_owned())
            } else {
                (StatusCode::SERVICE_UNAVAILABLE, "draining\n".to_owned())
            }
        });
        Router::new()
            .route("/stats", get(stats))
            .with_state(self.clone())
            .merge(admin::router(readiness, admin::registries(vec![registry])))
    }
}

async fn stats(State(proxy): State<Proxy>) -> impl IntoResponse {
    axum::Json(proxy.stats())
}

/// The proxy's counts, read at each scrape.
struct StatsCollector(Proxy);

impl std::fmt::Debug for StatsCollector {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("StatsCollector")
    }
}

impl Collector for StatsCollector {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let stats = self.0.stats();
        let counters = [
            (
                "charon_throttle_requests",
                "Requests the proxy took in, refused ones included.",
                stats.requests,
            ),
            (
                "charon_throttle_refused_overloaded",
                "Requests refused for want of a slot before their deadline.",
                stats.refused_overloaded,
            ),
            (
                "charon_throttle_refused_queue_full",
                "Requests refused because the drain queue was full.",
                stats.refused_queue_full,
            ),
            (
                "charon_throttle_refused_tenant_limit",
                "Requests refused 429 by the per-tenant limits.",
                stats.refused_tenant_limit,
            ),
            (
                "charon_throttle_upstream_failures",
                "Requests answered 502: the upstream refused, reset or did not speak HTTP.",
                stats.upstream_failures,
            ),
            (
                "charon_throttle_upstream_timeouts",
                "Requests answered 504: no response headers in time.",
                stats.upstream_timeouts,
            ),
            (
                "charon_throttle_unknown_criticality",
                "Criticality values the proxy did not know (given the default level).",
                stats.unknown_criticality,
            ),
        ];
        for (name, help, value) in counters {
            let counter = ConstCounter::new(value);
            let metric = encoder.encode_descriptor(name, help, None, counter.metric_type())?;
            counter.encode(metric)?;
        }
        let protection = ConstCounter::new(0u64);
        let mut family = encoder.encode_descriptor(
            "charon_throttle_protection",
            "What the protections against hostile clients stopped, by reason.",
            None,
            protection.metric_type(),
        )?;
        for (reason, count) in &stats.protection {
            let labels = [("reason", *reason)];
            let metric = family.encode_family(&labels)?;
            ConstCounter::new(*count).encode(metric)?;
        }
        let gauges = [
            (
                "charon_throttle_concurrency_limit",
                "How many requests may reach the upstream at once now (0: no limit).",
                stats.concurrency_limit.unwrap_or(0),
            ),
            (
                "charon_throttle_drain_waiting",
                "Requests waiting in the drain queue now.",
                stats.drain_waiting,
            ),
            (
                "charon_throttle_open_connections",
                "Client connections open now.",
                usize::try_from(stats.open_connections).unwrap_or(usize::MAX),
            ),
            (
                "charon_throttle_max_connections",
                "The most client connections open at once.",
                stats.max_connections,
            ),
        ];
        for (name, help, value) in gauges {
            let gauge = ConstGauge::new(i64::try_from(value).unwrap_or(i64::MAX));
            let metric = encoder.encode_descriptor(name, help, None, gauge.metric_type())?;
            gauge.encode(metric)?;
        }
        let ready = ConstGauge::new(i64::from(stats.ready));
        let metric = encoder.encode_descriptor(
            "charon_throttle_ready",
            "1 while the proxy serves, 0 while it drains.",
            None,
            ready.metric_type(),
        )?;
        ready.encode(metric)
    }
}
