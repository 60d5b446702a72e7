//! [`ThrottleLayer`] in front of an axum app, on tokio's paused clock:
//! requests over capacity wait and run by criticality then arrival; a full
//! queue evicts the newest of the least critical; a request that could not
//! start before its deadline is refused at once, one that waited past it at
//! its deadline; a slot is freed when the response body ends or is dropped.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Router;
use axum::body::Body;
use axum::extract::State;
use axum::routing::get;
use charon::layer::{Criticality, ThrottleLayer};
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
    assert_eq!(counts, (1, 1));
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
