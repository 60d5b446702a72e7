//! The admin HTTP endpoints: `/healthz` (the process answers), `/readyz`
//! (serving decisions; 503 while starting or shutting down), `/metrics`
//! (Prometheus text), and the pages for people: `/ui/simulator` (burst tiers
//! on the real engine, [`simulator`]) and `/ui/state` (one domain's
//! live state, [`state`]), and `/debug/learned` (limits proposed from
//! recorded use, [`learned`]). The pages are in the binary, with no
//! external fetch; the admin port listens on localhost by default.
//!
//! With Redis, `/readyz` names the store's state in its body. While Redis is
//! unreachable the sidecar still answers by `--on-store-error`: with `allow`
//! or `local` it stays ready (200, body `ready, degraded: ...`), because a
//! sidecar's readiness is its pod's, and a Redis outage must not take every
//! pod out of service (no new single point of failure); with `deny` it is
//! not ready (503), since every answer would be a rejection. When Redis
//! refuses the sidecar's credentials or permissions, it is not ready
//! whatever the policy, and the body names the cause: that is a
//! misconfiguration to fix, not an outage to ride out.

pub mod access;
pub mod config_api;
pub mod config_client;
pub mod learned;
pub mod simulator;
pub mod state;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use axum::Router;
use axum::extract::DefaultBodyLimit;
use axum::http::{StatusCode, header};
use axum::response::{Html, IntoResponse};
use axum::routing::{delete, get, post};

use crate::kit::admin;
use crate::store::OnStoreError;

use super::metrics::Metrics;
use crate::store::open::StoreStatus;

use self::access::Access;
use self::simulator::Simulations;
use self::state::StateSources;

/// The largest body the simulator takes (10 000 requests fit).
const MAX_BODY_BYTES: usize = 1 << 20;

#[derive(Clone)]
pub struct AdminState {
    pub ready: Arc<AtomicBool>,
    pub metrics: Arc<Metrics>,
    /// Read at each scrape, so the gauges are current.
    pub store_status: Arc<dyn Fn() -> StoreStatus + Send + Sync>,
}

/// `GET /`: what this port serves, the first thing a newcomer asks it.
/// (tests/sidecar/server.rs checks that every path listed answers.)
pub const INDEX: &str = "\
charon admin port (docs/operations.md)

GET    /healthz                liveness: 200 while the process runs
GET    /readyz                 readiness: 503 while starting or draining, or with no store under --on-store-error deny
GET    /ready                  the same, at the name charon throttle answered first
GET    /healthcheck            the same, at envoyproxy/ratelimit's path
GET    /metrics                Prometheus metrics
GET    /ui/simulator           the simulator page (docs/simulator.md)
GET    /ui/state               the live state view
GET    /debug/resources        configured resources and their holds *
GET    /debug/state            ?namespace=&resource=&domain=: a domain's state *
GET    /debug/learned          ?namespace=&pick=peak|p99|p95|p50: limits proposed from recorded use *
POST   /json                   envoyproxy/ratelimit's JSON ShouldRateLimit
GET    /rlconfig               the running limits, as envoyproxy/ratelimit prints them
GET    /v1/namespaces          the configuration API (docs/configuration-api.md) *
PUT    /v1/namespaces/NS/resources/RESOURCE/domains/DOMAIN   a per-domain override *
GET    /v1/changes             the configuration API's change log *

* with --admin-token-file: the bearer token; without it: loopback peers only.
";

/// The admin port's routes. What reads tenant state or changes anything
/// (`/debug/*`, the simulator's sessions) passes `access` first; probes,
/// `/metrics` and the static pages do not.
pub fn router(admin: AdminState, sources: StateSources, access: Access) -> Router {
    let simulations = Arc::new(Simulations::default());
    let pages = Router::new()
        .route(
            "/ui",
            get(|| async { axum::response::Redirect::to("/ui/simulator") }),
        )
        .route(
            "/ui/simulator",
            get(|| async { Html(include_str!("ui/simulator.html")) }),
        )
        .route(
            "/ui/state",
            get(|| async { Html(include_str!("ui/state.html")) }),
        )
        .merge(
            Router::new()
                .route("/ui/simulator/sessions", post(simulator::start))
                .route(
                    "/ui/simulator/sessions/{id}/requests",
                    post(simulator::feed),
                )
                .route("/ui/simulator/sessions/{id}", delete(simulator::end))
                .route("/ui/simulator/leases", post(simulator::leases))
                .layer(DefaultBodyLimit::max(MAX_BODY_BYTES))
                .with_state(simulations)
                .layer(axum::middleware::from_fn_with_state(
                    access.clone(),
                    access::guard,
                )),
        )
        .merge(
            Router::new()
                .route("/debug/resources", get(state::resources))
                .route("/debug/state", get(state::state))
                .route("/debug/learned", get(learned::proposal))
                .with_state(sources.clone())
                .layer(axum::middleware::from_fn_with_state(
                    access.clone(),
                    access::guard,
                )),
        )
        .layer(axum::middleware::from_fn(addressed_directly));
    Router::new()
        .route("/", get(|| async { INDEX }))
        .merge(admin::router(
            readiness(admin.clone()),
            exposition(admin, sources),
        ))
        .merge(pages)
}

/// The metrics alone at `path`, for a listener of its own
/// (`--metrics-addr`, `--metrics-path`).
pub fn metrics_router(admin: AdminState, sources: StateSources, path: &str) -> Router {
    let path = if path.is_empty() { "/metrics" } else { path };
    admin::metrics_router(exposition(admin, sources), path)
}

/// `router` behind `access` (and, like the pages, answering only requests
/// addressed to `localhost` or an IP address), taking bodies as large as a
/// configuration file.
pub fn guarded(router: Router, access: Access) -> Router {
    router
        .layer(DefaultBodyLimit::max(
            usize::try_from(crate::config::caps::MAX_FILE_BYTES).unwrap_or(usize::MAX),
        ))
        .layer(axum::middleware::from_fn_with_state(access, access::guard))
        .layer(axum::middleware::from_fn(addressed_directly))
}

/// The pages answer only requests addressed to `localhost` or an IP
/// address: a web page on another site whose name was re-pointed at
/// 127.0.0.1 (DNS rebinding) would otherwise read them from the user's
/// browser. Probes and scrapers, which use addresses, are not concerned.
async fn addressed_directly(
    request: axum::extract::Request,
    next: axum::middleware::Next,
) -> axum::response::Response {
    let host = request
        .headers()
        .get(header::HOST)
        .and_then(|host| host.to_str().ok())
        .map(str::to_owned)
        .or_else(|| request.uri().host().map(str::to_owned));
    match host {
        Some(host) if !is_direct(&host) => (
            StatusCode::FORBIDDEN,
            format!(
                "the admin pages answer requests to localhost or an IP address, not `{host}`\n"
            ),
        )
            .into_response(),
        _ => next.run(request).await,
    }
}

/// `localhost`, `127.0.0.1`, `[::1]`, `10.1.2.3:9102`…
fn is_direct(host: &str) -> bool {
    if let Some(bracketed) = host.strip_prefix('[') {
        return bracketed
            .split(']')
            .next()
            .is_some_and(|ip| ip.parse::<std::net::Ipv6Addr>().is_ok());
    }
    let name = host.rsplit_once(':').map_or(host, |(name, _)| name);
    name.eq_ignore_ascii_case("localhost") || name.parse::<std::net::Ipv4Addr>().is_ok()
}

/// Ready while serving, and by the store's state (the module's head says
/// how).
fn readiness(state: AdminState) -> admin::Readiness {
    Arc::new(move || ready_now(&state))
}

fn ready_now(state: &AdminState) -> (StatusCode, String) {
    if !state.ready.load(Ordering::SeqCst) {
        return (StatusCode::SERVICE_UNAVAILABLE, "not ready\n".to_string());
    }
    let status = (state.store_status)();
    if let Some(reason) = &status.refusal {
        return (
            StatusCode::SERVICE_UNAVAILABLE,
            format!(
                "not ready: Redis refuses the sidecar's credentials or permissions ({reason}); \
                 no --on-store-error fallback for that: fix the password or ACL user\n"
            ),
        );
    }
    match (status.redis, status.on_error) {
        (Some(redis), Some(policy)) if !redis.reachable => {
            let code = if policy == OnStoreError::Deny {
                StatusCode::SERVICE_UNAVAILABLE
            } else {
                StatusCode::OK
            };
            let verdict = if code == StatusCode::OK {
                "ready, degraded"
            } else {
                "not ready"
            };
            (
                code,
                format!(
                    "{verdict}: store unreachable, answering by --on-store-error {}\n",
                    policy.as_str()
                ),
            )
        }
        (Some(_), _) => (StatusCode::OK, "ready: store reachable\n".to_string()),
        _ => (StatusCode::OK, "ready\n".to_string()),
    }
}

/// The sidecar's registry, its store's state, its shares of global limits,
/// the copy holds and the configured limits, read at each scrape.
fn exposition(state: AdminState, sources: StateSources) -> admin::Exposition {
    Arc::new(move |accept| {
        let (state, sources) = (state.clone(), sources.clone());
        Box::pin(async move {
            state.metrics.set_store((state.store_status)());
            state
                .metrics
                .set_global_shares(&sources.limiter.config(), sources.limiter.global_shares());
            state
                .metrics
                .set_copy_holds(&state::copy_holds(&sources).await);
            let config = sources.limiter.config();
            state.metrics.set_configured_limits(&config);
            state.metrics.exposition(&config, accept.as_deref())
        })
    })
}

#[cfg(test)]
mod tests {
    use super::is_direct;

    #[test]
    fn pages_answer_to_addresses_and_localhost_only() {
        for host in [
            "localhost",
            "LOCALHOST:9102",
            "127.0.0.1",
            "10.0.0.7:9102",
            "[::1]",
            "[::1]:9102",
        ] {
            assert!(is_direct(host), "{host}");
        }
        for host in [
            "evil.example",
            "evil.example:9102",
            "127.0.0.1.nip.io",
            "[nonsense]",
            "",
        ] {
            assert!(!is_direct(host), "{host}");
        }
    }
}
