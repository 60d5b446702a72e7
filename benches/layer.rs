//! What the Tower layers add to a request (docs/performance.md#the-tower-layer):
//! an axum handler called
//! through its `Router` (no sockets, so only the middleware differs), bare,
//! behind `RateLimitLayer` on the embedded memory engine, behind
//! `DescriptorLimitLayer` and `CostLimitLayer` (a check before, a charge
//! when the body ends) on it, behind
//! tower-governor (the in-process baseline users compare with), and behind
//! `RateLimitLayer` on a real sidecar over loopback gRPC. Every request is
//! granted (limits far above the load), for the tenant in `x-tenant-id`.
//!
//! `cargo bench --bench layer` prints criterion's means, then the remote
//! sidecar's latency distribution (p50/p99 over 20 000 sequential requests,
//! bare handler's subtracted).

use std::net::TcpListener;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use axum::Router;
use axum::body::Body;
use axum::routing::get;
use charon::client::{Client, ClientOptions};
use charon::layer::{
    Action, Actions, Cost, CostLimitLayer, DescriptorLimitLayer, RateLimitLayer, ThrottleLayer,
};
use criterion::Criterion;
use http::Request;
use tower::ServiceExt;
use tower_governor::GovernorError;
use tower_governor::governor::GovernorConfigBuilder;
use tower_governor::key_extractor::KeyExtractor;

const CONFIG: &str = r#"
domain: bench
descriptors:
  - key: generic_key
    value: plain
    rate_limit: {unit: second, requests_per_unit: 4000000000}
  - key: generic_key
    value: tokens
    rate_limit: {unit: second, requests_per_unit: 4000000000, cost: after_response, initial_cost: 1}
  - key: generic_key
    value: reserved
    rate_limit: {unit: second, requests_per_unit: 4000000000, cost: after_response, initial_cost: 1}
resources:
  api:
    rate:
      tiers:
        - {limit: 1000000000, window: 1s, active: forever, cooldown: 0s}
"#;

fn config() -> charon::config::Config {
    charon::config::load_str(CONFIG, "bench.yaml")
        .expect("the bench config loads")
        .config
}

fn request() -> Request<Body> {
    Request::builder()
        .uri("/")
        .header("x-tenant-id", "acme")
        .body(Body::empty())
        .expect("a request")
}

fn bare() -> Router {
    Router::new().route("/", get(|| async { "hello" }))
}

/// A handler that says what its response cost (1), for the cost layer and
/// for the plain descriptor layer it is compared with.
fn costed() -> Router {
    Router::new().route(
        "/",
        get(|| async {
            let mut response = axum::response::IntoResponse::into_response("hello");
            response.extensions_mut().insert(Cost::new(1));
            response
        }),
    )
}

/// tower-governor keyed like Charon's layer: by `x-tenant-id`.
#[derive(Clone)]
struct Tenant;

impl KeyExtractor for Tenant {
    type Key = String;

    fn extract<T>(&self, request: &Request<T>) -> Result<String, GovernorError> {
        request
            .headers()
            .get("x-tenant-id")
            .and_then(|value| value.to_str().ok())
            .map(str::to_owned)
            .ok_or(GovernorError::UnableToExtractKey)
    }
}

fn governed() -> Router {
    let config = GovernorConfigBuilder::default()
        .per_nanosecond(1)
        .burst_size(u32::MAX)
        .key_extractor(Tenant)
        .finish()
        .expect("a governor config");
    bare().layer(tower_governor::GovernorLayer::new(config))
}

/// A `charon serve` on loopback, killed on drop.
struct Sidecar {
    child: Child,
    grpc: u16,
    _dir: tempfile::TempDir,
}

impl Drop for Sidecar {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|listener| listener.local_addr())
        .map(|address| address.port())
        .expect("a free port")
}

fn sidecar() -> Sidecar {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let path = dir.path().join("bench.yaml");
    std::fs::write(&path, CONFIG).expect("the config is written");
    let grpc = free_port();
    let child = Command::new(env!("CARGO_BIN_EXE_charon"))
        .arg("serve")
        .arg("--config")
        .arg(&path)
        .args(["--grpc-addr", &format!("127.0.0.1:{grpc}")])
        .args(["--admin-addr", &format!("127.0.0.1:{}", free_port())])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("charon starts");
    Sidecar {
        child,
        grpc,
        _dir: dir,
    }
}

async fn call(app: &Router) {
    let response = app.clone().oneshot(request()).await.expect("infallible");
    assert!(response.status().is_success(), "{}", response.status());
}

fn bench_layers(
    c: &mut Criterion,
    runtime: &tokio::runtime::Runtime,
    remote: &Router,
    with_remote: bool,
) {
    let embedded = runtime.block_on(async {
        bare().layer(RateLimitLayer::new(
            Client::embedded(config()),
            "bench",
            "api",
        ))
    });
    // A plain fixed window on a descriptor against a cost known after the
    // response (a check before, a charge when the body ends): the cost
    // layer's price is the difference.
    // With an estimate, a reservation before and a commit after.
    let (plain, costs, reserving) = runtime.block_on(async {
        let client = Client::embedded(config());
        (
            costed().layer(DescriptorLimitLayer::new(
                client.clone(),
                "bench",
                Actions::new().descriptor([Action::generic_key("plain")]),
            )),
            costed().layer(CostLimitLayer::new(
                client.clone(),
                "bench",
                Actions::new().descriptor([Action::generic_key("tokens")]),
            )),
            costed().layer(
                CostLimitLayer::new(
                    client,
                    "bench",
                    Actions::new().descriptor([Action::generic_key("reserved")]),
                )
                .estimate(|_| Some(1)),
            ),
        )
    });
    let apps = [
        ("bare", bare()),
        // The server throttler, not overloaded: what a slot costs.
        ("throttle", bare().layer(ThrottleLayer::new(1_024))),
        // With a CPU budget: each request measured and predicted too.
        (
            "throttle-cpu",
            bare().layer(ThrottleLayer::new(1_024).cpu_budget(1e9)),
        ),
        ("charon-embedded-memory", embedded),
        ("charon-embedded-descriptor", plain),
        ("charon-embedded-cost", costs),
        ("charon-embedded-reserve", reserving),
        ("tower-governor", governed()),
        ("charon-sidecar", remote.clone()),
    ];
    let apps = apps
        .into_iter()
        .filter(|(name, _)| with_remote || *name != "charon-sidecar");
    // As `axum::serve` does once: routes built now, not per request.
    let apps = apps.map(|(name, app)| (name, app.with_state::<()>(())));
    let mut group = c.benchmark_group("layer");
    // The decision itself, as the embedded engine makes it: what the layer
    // and the client add is the rows below minus this and `bare`.
    let limiter = charon::limiter::Limiter::new(config(), charon::store::MemoryStore::new());
    let namespace = limiter.config().namespace("bench").cloned().expect("bench");
    let Some(charon::config::Resource::Rate(rate)) = namespace.resources.get("api").cloned() else {
        panic!("api is a rate resource");
    };
    group.bench_function("decision", |b| {
        b.to_async(runtime).iter(|| async {
            let (outcome, _) = limiter
                .request_hits(&namespace, &rate, "acme", 1, 1)
                .await
                .expect("a decision");
            assert_eq!(outcome.granted, 1);
        })
    });
    let client = runtime.block_on(async { Client::embedded(config()) });
    group.bench_function("client-only", |b| {
        b.to_async(runtime).iter(|| async {
            let answer = client
                .request("bench", "api", "acme")
                .await
                .expect("answer");
            assert!(answer.is_granted());
        })
    });
    for (name, app) in apps {
        group.bench_function(name, |b| b.to_async(runtime).iter(|| call(&app)));
    }
    group.finish();
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    let index = ((sorted.len() - 1) as f64 * p).round() as usize;
    sorted[index]
}

fn latencies(runtime: &tokio::runtime::Runtime, app: &Router, count: usize) -> Vec<Duration> {
    runtime.block_on(async {
        let mut samples = Vec::with_capacity(count);
        for _ in 0..count {
            let started = Instant::now();
            call(app).await;
            samples.push(started.elapsed());
        }
        samples.sort();
        samples
    })
}

fn main() {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a runtime");
    // `CHARON_BENCH_REMOTE=0`: in-process rows only (for profiling).
    let with_remote = std::env::var("CHARON_BENCH_REMOTE").map_or(true, |value| value != "0");
    let sidecar = sidecar();
    let remote = runtime.block_on(async {
        // A deadline that a loaded machine cannot miss: a fail-open answer
        // would look fast (and is refused below).
        let client = Client::with_options(
            charon::client::Sidecar::connect(&format!("http://127.0.0.1:{}", sidecar.grpc))
                .expect("a sidecar client"),
            ClientOptions {
                call_timeout: Duration::from_secs(5),
                ..ClientOptions::default()
            },
        );
        // Until the sidecar answers (not fail-open).
        let deadline = Instant::now() + Duration::from_secs(30);
        while with_remote && !client.ready(Duration::from_secs(1)).await {
            assert!(Instant::now() < deadline, "the sidecar did not start");
        }
        (
            bare().layer(RateLimitLayer::new(client.clone(), "bench", "api")),
            client,
        )
    });
    let (remote, remote_client) = remote;

    let degraded_at_start = remote_client.stats().degraded;
    let mut criterion = Criterion::default().configure_from_args();
    bench_layers(&mut criterion, &runtime, &remote, with_remote);
    criterion.final_summary();

    // Fail-open answers would pass for fast ones: there must be none.
    assert_eq!(
        remote_client.stats().degraded,
        degraded_at_start,
        "the sidecar answered every call"
    );
    // `cargo test --all-targets` runs this once as a smoke test: no
    // latency run then.
    let benchmarking = std::env::args().any(|arg| arg == "--bench");
    if !with_remote || !benchmarking {
        return;
    }
    let count = 20_000;
    let bare = latencies(&runtime, &bare().with_state(()), count);
    let remote = remote.with_state(());
    let degraded_before = remote_client.stats().degraded;
    let remote = latencies(&runtime, &remote, count);
    for (name, samples) in [("bare", &bare), ("charon-sidecar", &remote)] {
        println!(
            "{name:16} p50 {:>9.1?}  p99 {:>9.1?}",
            percentile(samples, 0.5),
            percentile(samples, 0.99)
        );
    }
    assert_eq!(
        remote_client.stats().degraded,
        degraded_before,
        "no fail-open"
    );
    println!(
        "sidecar adds     p50 {:>9.1?}  p99 {:>9.1?}",
        percentile(&remote, 0.5).saturating_sub(percentile(&bare, 0.5)),
        percentile(&remote, 0.99).saturating_sub(percentile(&bare, 0.99))
    );
}
