//! Reserves that wait for a copy, on the embedded engine (memory store):
//! granted as copies are released, by criticality then arrival; refused at
//! their deadline when none is; `ConcurrencyLayer` with `max_wait` makes a
//! request wait for a copy instead of answering 429. Real time, with
//! margins: a wait is bounded below by what it waits for, never asserted
//! short.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::Router;
use axum::body::Body;
use axum::routing::get;
use charon::client::Client;
use charon::criticality::Criticality;
use charon::layer::ConcurrencyLayer;
use http::{Request, StatusCode};
use tower::ServiceExt;

const CONFIG: &str = "
domain: jobs
resources:
  encoder:
    copies: {domain_limit: 1}
";

fn client() -> Client {
    let config = charon::config::load_str(CONFIG, "jobs.yaml")
        .map(|loaded| loaded.config)
        .unwrap_or_else(|errors| panic!("{errors}"));
    Client::embedded(config)
}

#[tokio::test]
async fn waiting_reserves_are_granted_by_criticality_then_arrival() {
    let client = client();
    let mut first = client
        .hold("jobs", "encoder", "acme")
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    assert!(first.is_granted());
    let order = Arc::new(Mutex::new(Vec::new()));
    let mut waiters = Vec::new();
    for (name, level) in [
        ("shed", Criticality::Sheddable),
        ("crit-a", Criticality::Critical),
        ("crit-b", Criticality::Critical),
        ("plus", Criticality::CriticalPlus),
    ] {
        let (client, order) = (client.clone(), order.clone());
        waiters.push(tokio::spawn(async move {
            let hold = client
                .hold("jobs", "encoder", "acme")
                .max_wait(Duration::from_secs(30))
                .criticality(level)
                .await
                .unwrap_or_else(|e| panic!("{e}"));
            assert!(hold.is_granted(), "{name} waited in vain");
            if let Ok(mut order) = order.lock() {
                order.push(name);
            }
            // Held a moment, then released by the drop: the next one's turn.
            tokio::time::sleep(Duration::from_millis(20)).await;
            drop(hold);
        }));
        // Each has joined the queue before the next arrives.
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert!(order.lock().map(|o| o.is_empty()).unwrap_or(false));
    assert_eq!(first.release(1).await.ok(), Some(1));
    for waiter in waiters {
        assert!(waiter.await.is_ok());
    }
    let order = order.lock().map(|o| o.clone()).unwrap_or_default();
    assert_eq!(order, ["plus", "crit-a", "crit-b", "shed"]);
}

#[tokio::test]
async fn a_reserve_that_waits_in_vain_is_refused_at_its_deadline() {
    let client = client();
    let held = client
        .hold("jobs", "encoder", "acme")
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    assert!(held.is_granted());
    let asked = Instant::now();
    let refused = client
        .hold("jobs", "encoder", "acme")
        .max_wait(Duration::from_millis(300))
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    assert!(!refused.is_granted());
    assert!(asked.elapsed() >= Duration::from_millis(300));
    // Another domain was never in that queue.
    let other = client
        .hold("jobs", "encoder", "globex")
        .max_wait(Duration::from_secs(5))
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    assert!(other.is_granted());
}

async fn slow() -> &'static str {
    tokio::time::sleep(Duration::from_millis(300)).await;
    "done"
}

async fn statuses(app: Router) -> Vec<StatusCode> {
    let tasks: Vec<_> = (0..2)
        .map(|_| {
            let app = app.clone();
            tokio::spawn(async move {
                let request = Request::get("/")
                    .header("x-tenant-id", "acme")
                    .body(Body::empty())
                    .unwrap_or_else(|e| panic!("{e}"));
                let response = app.oneshot(request).await.unwrap_or_else(|e| match e {});
                let status = response.status();
                drop(response);
                status
            })
        })
        .collect();
    let mut statuses = Vec::new();
    for task in tasks {
        statuses.push(task.await.unwrap_or(StatusCode::IM_A_TEAPOT));
    }
    statuses.sort();
    statuses
}

#[tokio::test]
async fn the_concurrency_layer_waits_for_a_copy_up_to_its_max_wait() {
    let client = client();
    // Without a wait, the second of two requests at once is refused.
    let refusing = Router::new()
        .route("/", get(slow))
        .layer(ConcurrencyLayer::new(client.clone(), "jobs", "encoder"));
    assert_eq!(
        statuses(refusing).await,
        [StatusCode::OK, StatusCode::TOO_MANY_REQUESTS]
    );
    // With one, it waits for the first to end.
    let waiting = Router::new()
        .route("/", get(slow))
        .layer(ConcurrencyLayer::new(client, "jobs", "encoder").max_wait(Duration::from_secs(10)));
    let began = Instant::now();
    assert_eq!(statuses(waiting).await, [StatusCode::OK, StatusCode::OK]);
    assert!(began.elapsed() >= Duration::from_millis(600));
}
