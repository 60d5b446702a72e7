//! One admin skeleton for every program: `/healthz` (the process answers),
//! the readiness paths (whether the program serves, and why not) and
//! `/metrics` (its series and the process's, in the format the scraper asks
//! for). Each program fills it with what only it knows (`charon serve` the
//! store's state, `charon throttle` its drain, `charon inject` nothing) and
//! merges its own routes beside it, so that a probe or a scraper finds the
//! same paths on every pod whichever program runs there.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use axum::Router;
use axum::http::{HeaderMap, StatusCode, header};
use axum::routing::get;
use prometheus_client::registry::Registry;

use crate::kit::scrape;

/// `/readyz`'s answer now: 200 while the program serves, 503 otherwise, and
/// a line that says why.
pub type Readiness = Arc<dyn Fn() -> (StatusCode, String) + Send + Sync>;

/// `/metrics`'s answer to a scrape that sent `Accept` (if it did): a
/// content type and the exposition. Asynchronous, because a program may
/// read a store before it answers.
pub type Exposition = Arc<
    dyn Fn(Option<String>) -> Pin<Box<dyn Future<Output = (&'static str, String)> + Send>>
        + Send
        + Sync,
>;

/// Where every program answers its readiness, `/readyz` first: `/ready`
/// for the throttle's pods deployed before the programs agreed on one name,
/// `/healthcheck` at envoyproxy/ratelimit's path, which Envoy Gateway's
/// probes ask.
pub const READY_PATHS: [&str; 3] = ["/readyz", "/ready", "/healthcheck"];

/// `/healthz`, the [`READY_PATHS`] answered by `readiness`, and `/metrics`
/// answered by `metrics`.
pub fn router(readiness: Readiness, metrics: Exposition) -> Router {
    let mut router = Router::new().route("/healthz", get(|| async { "ok\n" }));
    for path in READY_PATHS {
        let readiness = readiness.clone();
        router = router.route(path, get(move || std::future::ready(readiness())));
    }
    router.merge(metrics_router(metrics, "/metrics"))
}

/// `/metrics` alone, at `path`: for a listener of its own.
pub fn metrics_router(metrics: Exposition, path: &str) -> Router {
    Router::new().route(
        path,
        get(move |headers: HeaderMap| {
            let answer = metrics(scrape::accept(&headers).map(str::to_owned));
            async move {
                let (content_type, body) = answer.await;
                ([(header::CONTENT_TYPE, content_type)], body)
            }
        }),
    )
}

/// Ready while the program runs: for one that serves as soon as it listens.
pub fn always_ready() -> Readiness {
    Arc::new(|| (StatusCode::OK, "ready\n".to_owned()))
}

/// The exposition of `registries` and the process's series, for a program
/// whose series are all in registries.
pub fn registries(registries: Vec<Registry>) -> Exposition {
    let mut process = Registry::default();
    crate::kit::process::register(&mut process);
    let registries: Arc<Vec<Registry>> =
        Arc::new(registries.into_iter().chain([process]).collect());
    Arc::new(move |accept| {
        let registries = registries.clone();
        Box::pin(async move {
            let all: Vec<&Registry> = registries.iter().collect();
            scrape::render(&all, accept.as_deref(), |_, _| {})
        })
    })
}
