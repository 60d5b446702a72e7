//! [`ThrottleLayer`] in front of an axum app, on tokio's paused clock:
//! requests over capacity wait and run by criticality then arrival; a full
//! queue evicts the newest of the least critical; a request that could not
//! start before its deadline is refused at once, one that waited past it at
//! its deadline; a slot is freed when the response body ends or is dropped,
//! and a turn that reached a request dropped before it ran is given back.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Router;
use axum::body::Body;
use axum::extract::State;
use axum::routing::get;
use charon::layer::{Criticality, ThrottleLayer, thread_cpu_time};
use http::{HeaderMap, Request, StatusCode};
use http_body_util::BodyExt;
use tokio::sync::Semaphore;
use tower::ServiceExt;

/// Each request records its `x-criticality` when it starts, then waits for
/// a permit of the gate (or `x-hold-ms`), so a test decides when slots free.
#[derive(Clone)]
struct Probe {
    started: Arc<Mutex<Vec<String>>>,
    gate: Arc<Semaphore>,
}

impl Default for Probe {
    fn default() -> Self {
        Self {
            started: Arc::default(),
            gate: Arc::new(Semaphore::new(0)),
        }
    }
}

async fn work(State(probe): State<Probe>, headers: HeaderMap) -> &'static str {
    let name = headers
        .get("x-name")
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
        .to_owned();
    if let Ok(mut started) = probe.started.lock() {
        started.push(name);
    }
    match headers
        .get("x-hold-ms")
        .and_then(|v| v.to_str().ok()?.parse().ok())
    {
        Some(ms) => tokio::time::sleep(Duration::from_millis(ms)).await,
        None => {
            if let Ok(permit) = probe.gate.acquire().await {
                permit.forget();
            }
        }
    }
    "done"
}

fn app(probe: &Probe, layer: ThrottleLayer) -> Router {
    Router::new()
        .route("/", get(work))
        .with_state(probe.clone())
        .layer(layer)
}

fn request(name: &str, headers: &[(&str, &str)]) -> Request<Body> {
    let mut builder = Request::get("/").header("x-name", name);
    for (key, value) in headers {
        builder = builder.header(*key, *value);
    }
    builder
        .body(Body::empty())
        .unwrap_or_else(|e| panic!("{e}"))
}

/// Sends `request` on a task; its status, once the whole body is read.
fn send(app: &Router, request: Request<Body>) -> tokio::task::JoinHandle<StatusCode> {
    let app = app.clone();
    tokio::spawn(async move {
        let response = app.oneshot(request).await.unwrap_or_else(|e| match e {});
        let status = response.status();
        let _ = response.into_body().collect().await;
        status
    })
}

/// Lets every task run until it waits on something.
async fn settle() {
    for _ in 0..20 {
        tokio::task::yield_now().await;
    }
}

fn started(probe: &Probe) -> Vec<String> {
    probe.started.lock().map(|s| s.clone()).unwrap_or_default()
}

async fn status(task: tokio::task::JoinHandle<StatusCode>) -> StatusCode {
    task.await.unwrap_or_else(|e| panic!("{e}"))
}

#[tokio::test(start_paused = true)]
async fn requests_over_capacity_wait_and_run_by_criticality_then_arrival() {
    let probe = Probe::default();
    let app = app(
        &probe,
        ThrottleLayer::new(1)
            .max_queue(10)
            .max_wait(Duration::from_secs(3_600)),
    );
    let first = send(&app, request("first", &[("x-criticality", "sheddable")]));
    settle().await;
    let mut waiting = Vec::new();
    for (name, level) in [
        ("shed", "sheddable"),
        ("crit-a", "critical"),
        ("crit-b", "critical"),
        ("plus", "critical_plus"),
        ("shed-plus", "sheddable_plus"),
    ] {
        waiting.push(send(&app, request(name, &[("x-criticality", level)])));
        settle().await;
    }
    assert_eq!(started(&probe), ["first"]);
    for _ in 0..6 {
        probe.gate.add_permits(1);
        settle().await;
    }
    assert_eq!(status(first).await, StatusCode::OK);
    for task in waiting {
        assert_eq!(status(task).await, StatusCode::OK);
    }
    assert_eq!(
        started(&probe),
        ["first", "plus", "crit-a", "crit-b", "shed-plus", "shed"]
    );
}

#[tokio::test(start_paused = true)]
async fn a_full_queue_evicts_the_newest_sheddable_for_a_critical_request() {
    let probe = Probe::default();
    let app = app(&probe, ThrottleLayer::new(1).max_queue(2));
    let running = send(&app, request("running", &[]));
    settle().await;
    let old = send(&app, request("old", &[("x-criticality", "sheddable")]));
    settle().await;
    let new = send(&app, request("new", &[("x-criticality", "sheddable")]));
    settle().await;
    let critical = send(&app, request("critical", &[("x-criticality", "critical")]));
    settle().await;
    // The newest sheddable request made room, and is told at once.
    assert_eq!(status(new).await, StatusCode::SERVICE_UNAVAILABLE);
    // Full of requests at least as critical: a sheddable newcomer is refused.
    let refused = app
        .clone()
        .oneshot(request("late", &[("x-criticality", "sheddable")]))
        .await
        .unwrap_or_else(|e| match e {});
    assert_eq!(refused.status(), StatusCode::SERVICE_UNAVAILABLE);
    assert!(refused.headers().contains_key("retry-after"));
    for _ in 0..3 {
        probe.gate.add_permits(1);
        settle().await;
    }
    for task in [running, critical, old] {
        assert_eq!(status(task).await, StatusCode::OK);
    }
    assert_eq!(started(&probe), ["running", "critical", "old"]);
}

#[tokio::test(start_paused = true)]
async fn a_request_that_cannot_start_before_its_deadline_is_refused_at_once() {
    let probe = Probe::default();
    let layer = ThrottleLayer::new(1).max_wait(Duration::from_secs(10));
    let counts = layer.counts();
    let app = app(&probe, layer);
    // The layer learns that a request holds its slot for 200 ms.
    let learned = send(&app, request("learned", &[("x-hold-ms", "200")]));
    assert_eq!(status(learned).await, StatusCode::OK);
    let running = send(&app, request("running", &[]));
    settle().await;
    // 50 ms of patience against a 200 ms turn: no wait at all.
    let asked = tokio::time::Instant::now();
    let hasty = app
        .clone()
        .oneshot(request("hasty", &[("grpc-timeout", "50m")]))
        .await
        .unwrap_or_else(|e| match e {});
    assert_eq!(hasty.status(), StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(asked.elapsed(), Duration::ZERO);
    // The deadline Envoy forwards counts the same.
    let forwarded = app
        .clone()
        .oneshot(request(
            "forwarded",
            &[("x-envoy-expected-rq-timeout-ms", "50")],
        ))
        .await
        .unwrap_or_else(|e| match e {});
    assert_eq!(forwarded.status(), StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(asked.elapsed(), Duration::ZERO);
    // A deadline that does not parse is ignored (and counted): it waits.
    let patient = send(&app, request("patient", &[("grpc-timeout", "soon")]));
    settle().await;
    probe.gate.add_permits(1);
    settle().await;
    assert_eq!(status(running).await, StatusCode::OK);
    probe.gate.add_permits(1);
    assert_eq!(status(patient).await, StatusCode::OK);
    let counts = (
        counts
            .bad_deadlines
            .load(std::sync::atomic::Ordering::Relaxed),
        counts.refused.load(std::sync::atomic::Ordering::Relaxed),
    );
    assert_eq!(counts, (1, 2));
}

#[tokio::test(start_paused = true)]
async fn a_request_still_waiting_at_its_deadline_is_refused_then() {
    let probe = Probe::default();
    let app = app(
        &probe,
        ThrottleLayer::new(1).max_wait(Duration::from_millis(100)),
    );
    let running = send(&app, request("running", &[]));
    settle().await;
    let asked = tokio::time::Instant::now();
    let waiting = send(&app, request("waiting", &[]));
    assert_eq!(status(waiting).await, StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(asked.elapsed(), Duration::from_millis(100));
    // It left the queue: the next request gets the slot when it frees.
    let next = send(&app, request("next", &[]));
    settle().await;
    probe.gate.add_permits(2);
    assert_eq!(status(running).await, StatusCode::OK);
    assert_eq!(status(next).await, StatusCode::OK);
    assert_eq!(started(&probe), ["running", "next"]);
}

#[tokio::test(start_paused = true)]
async fn a_slot_is_freed_when_the_response_is_dropped_unread() {
    let probe = Probe::default();
    probe.gate.add_permits(10);
    let layer = ThrottleLayer::new(1)
        .max_wait(Duration::from_millis(10))
        .default_criticality(Criticality::Sheddable);
    let counts = layer.counts();
    let app = app(&probe, layer);
    for round in 0..3 {
        let response = app
            .clone()
            .oneshot(request(
                &format!("r{round}"),
                &[("x-criticality", "urgent")],
            ))
            .await
            .unwrap_or_else(|e| match e {});
        assert_eq!(response.status(), StatusCode::OK);
        // Dropped with its body unread: the slot goes with it.
        drop(response);
    }
    assert_eq!(started(&probe), ["r0", "r1", "r2"]);
    assert_eq!(
        counts
            .unknown_criticality
            .load(std::sync::atomic::Ordering::Relaxed),
        3
    );
}

/// Burns the milliseconds of CPU its path says (`/burn/N`), on the thread
/// that polls it.
async fn burn(axum::extract::Path(ms): axum::extract::Path<u64>) -> &'static str {
    let until = thread_cpu_time() + Duration::from_millis(ms);
    while thread_cpu_time() < until {
        std::hint::spin_loop();
    }
    "burnt"
}

fn burning(layer: ThrottleLayer) -> Router {
    Router::new().route("/burn/{ms}", get(burn)).layer(layer)
}

async fn call(app: &Router, path: &str) -> StatusCode {
    let request = Request::get(path)
        .body(Body::empty())
        .unwrap_or_else(|e| panic!("{e}"));
    let response = app
        .clone()
        .oneshot(request)
        .await
        .unwrap_or_else(|e| match e {});
    let status = response.status();
    let _ = response.into_body().collect().await;
    status
}

#[tokio::test]
async fn each_class_cpu_cost_is_measured_and_predicted() {
    let layer = ThrottleLayer::new(4).cpu_budget(10_000.0);
    let app = burning(layer.clone());
    for _ in 0..30 {
        assert_eq!(call(&app, "/burn/2").await, StatusCode::OK);
        assert_eq!(call(&app, "/burn/5").await, StatusCode::OK);
    }
    let costs = layer.costs();
    let classes: Vec<&str> = costs.iter().map(|c| c.class.as_str()).collect();
    assert_eq!(classes, ["/burn/2", "/burn/5"]);
    for (cost, ms) in costs.iter().zip([2.0, 5.0]) {
        assert_eq!(cost.requests, 30, "{cost:?}");
        // The handler burns at least its milliseconds; the rest of the
        // poll (routing, the response) is small beside them.
        assert!(cost.measured_mean_ms >= ms, "{cost:?}");
        assert!(cost.measured_mean_ms < ms * 1.5, "{cost:?}");
        assert!((cost.predicted_ms - ms).abs() < ms * 0.5, "{cost:?}");
        assert!(cost.median_error.is_some_and(|e| e < 0.2), "{cost:?}");
    }
}

#[tokio::test]
async fn a_cpu_budget_makes_requests_wait_for_it_to_fill() {
    // 100 ms of CPU per second, bursts of 5 ms; each request costs 10 ms.
    let layer = ThrottleLayer::new(8)
        .cpu_budget(100.0)
        .max_wait(Duration::from_secs(30));
    let app = burning(layer.clone());
    // The layer learns the class's cost (the first request, predicted at
    // nothing, is charged its 10 ms when it ends), then the budget refills.
    assert_eq!(call(&app, "/burn/10").await, StatusCode::OK);
    tokio::time::sleep(Duration::from_millis(300)).await;
    let began = std::time::Instant::now();
    let tasks: Vec<_> = (0..4)
        .map(|_| {
            let app = app.clone();
            tokio::spawn(async move { call(&app, "/burn/10").await })
        })
        .collect();
    for task in tasks {
        // Each waits its turn, woken as the budget fills: none is refused.
        assert_eq!(task.await.ok(), Some(StatusCode::OK));
    }
    // 5 ms at once, then 10 ms per 100 ms: the last starts 300 ms later.
    // Without the budget the four take 40 ms of CPU.
    assert!(
        began.elapsed() >= Duration::from_millis(250),
        "{:?}",
        began.elapsed()
    );
    assert_eq!(layer.costs()[0].requests, 5);
}

/// How long a request takes: 10 ms times the requests in progress when it
/// starts (a service that slows as it is given more at once), or 10 ms.
#[derive(Clone, Default)]
struct Congestible {
    in_progress: Arc<std::sync::atomic::AtomicU64>,
    fixed: Arc<std::sync::atomic::AtomicBool>,
}

async fn congested(State(service): State<Congestible>) -> &'static str {
    use std::sync::atomic::Ordering::Relaxed;
    let now = service.in_progress.fetch_add(1, Relaxed) + 1;
    let factor = if service.fixed.load(Relaxed) { 1 } else { now };
    tokio::time::sleep(Duration::from_millis(10 * factor)).await;
    service.in_progress.fetch_sub(1, Relaxed);
    "done"
}

/// `clients` loops of requests until `until`.
async fn closed_loop(app: &Router, clients: usize, until: tokio::time::Instant) {
    let tasks: Vec<_> = (0..clients)
        .map(|_| {
            let app = app.clone();
            tokio::spawn(async move {
                while tokio::time::Instant::now() < until {
                    assert_eq!(call(&app, "/").await, StatusCode::OK);
                }
            })
        })
        .collect();
    for task in tasks {
        assert!(task.await.is_ok());
    }
}

#[tokio::test(start_paused = true)]
async fn the_adaptive_limit_finds_the_concurrency_the_service_sustains() {
    let service = Congestible::default();
    let layer = ThrottleLayer::new(20)
        .adaptive_limit(1, 20)
        .max_queue(100)
        .max_wait(Duration::from_secs(3_600));
    let app = Router::new()
        .route("/", get(congested))
        .with_state(service.clone())
        .layer(layer.clone());
    assert_eq!(layer.limit(), 20);
    // Thirty callers on a service that slows with concurrency: the limit
    // comes down to where requests take at most twice the no-load 10 ms.
    let now = tokio::time::Instant::now();
    closed_loop(&app, 30, now + Duration::from_secs(10)).await;
    let limit = layer.limit();
    assert!((1..=3).contains(&limit), "limit {limit}");
    // The service no longer slows: the limit goes back up to its maximum.
    service
        .fixed
        .store(true, std::sync::atomic::Ordering::Relaxed);
    let now = tokio::time::Instant::now();
    closed_loop(&app, 30, now + Duration::from_secs(2)).await;
    assert_eq!(layer.limit(), 20);
}

async fn panics() -> &'static str {
    panic!("the handler fails")
}

#[tokio::test]
async fn a_handler_that_panics_frees_its_slot_and_settles_its_cost() {
    let layer = ThrottleLayer::new(1)
        .cpu_budget(10_000.0)
        .max_wait(Duration::from_millis(200));
    let app = Router::new()
        .route("/panic", get(panics))
        .route("/burn/{ms}", get(burn))
        .layer(layer.clone());
    for _ in 0..3 {
        let app = app.clone();
        // The panic unwinds through the layer's future: the task fails.
        let failed = tokio::spawn(async move { call(&app, "/panic").await }).await;
        assert!(failed.is_err_and(|e| e.is_panic()));
    }
    // The one slot is free: a request runs at once, not refused.
    assert_eq!(call(&app, "/burn/1").await, StatusCode::OK);
    let costs = layer.costs();
    let panicked = costs.iter().find(|c| c.class == "/panic");
    assert_eq!(panicked.map(|c| c.requests), Some(3));
}

#[tokio::test(start_paused = true)]
async fn a_turn_sent_to_a_request_dropped_before_it_ran_frees_its_slot() {
    let probe = Probe::default();
    let app = app(
        &probe,
        ThrottleLayer::new(1)
            .max_queue(10)
            .max_wait(Duration::from_secs(3_600)),
    );
    let mut service = app.clone();
    probe.gate.add_permits(1);
    let running = tower::Service::call(&mut service, request("running", &[]));
    let response = running.await.unwrap_or_else(|e| match e {});
    // Queued (polled once, so it waits its turn); its client is about to go.
    let mut queued = Box::pin(tower::Service::call(&mut service, request("gone", &[])));
    assert!(futures_util::poll!(&mut queued).is_pending());
    // The running request's body ends: its slot goes to the queued one...
    let _ = response.into_body().collect().await;
    // ...which is dropped before it reads its turn (a reset, a disconnect).
    drop(queued);
    let next = send(&app, request("next", &[]));
    settle().await;
    probe.gate.add_permits(1);
    assert_eq!(status(next).await, StatusCode::OK);
    assert_eq!(started(&probe), ["running", "next"]);
}
