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

/// PoolCounter's ACQ4ANY through the layer: twenty requests for one page
/// at once; one renders it (300 ms) and caches it, the nineteen others wait
/// for anyone's result and are served from the cache as soon as the first
/// succeeded, told so by `ResultReady`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_concurrency_layer_serves_waiters_the_result_of_the_one_that_did_the_work() {
    use std::sync::atomic::{AtomicUsize, Ordering};
    let client = client();
    let rendered = Arc::new(AtomicUsize::new(0));
    let from_cache = Arc::new(AtomicUsize::new(0));
    let cache: Arc<Mutex<Option<String>>> = Arc::default();
    let page = {
        let (rendered, from_cache, cache) = (rendered.clone(), from_cache.clone(), cache.clone());
        move |request: Request<Body>| {
            let (rendered, from_cache, cache) =
                (rendered.clone(), from_cache.clone(), cache.clone());
            async move {
                if request
                    .extensions()
                    .get::<charon::layer::ResultReady>()
                    .is_some()
                {
                    from_cache.fetch_add(1, Ordering::SeqCst);
                    return cache
                        .lock()
                        .map(|page| page.clone())
                        .ok()
                        .flatten()
                        .unwrap_or_default();
                }
                tokio::time::sleep(Duration::from_millis(300)).await;
                rendered.fetch_add(1, Ordering::SeqCst);
                let page = "<h1>home</h1>".to_owned();
                if let Ok(mut cached) = cache.lock() {
                    *cached = Some(page.clone());
                }
                page
            }
        }
    };
    let app = Router::new().route("/", get(page)).layer(
        ConcurrencyLayer::new(client, "jobs", "encoder")
            .max_wait(Duration::from_secs(10))
            .for_anyone(),
    );
    let began = Instant::now();
    let tasks: Vec<_> = (0..20)
        .map(|_| {
            let app = app.clone();
            tokio::spawn(async move {
                let request = Request::get("/")
                    .header("x-tenant-id", "acme")
                    .body(Body::empty())
                    .unwrap_or_else(|e| panic!("{e}"));
                let response = app.oneshot(request).await.unwrap_or_else(|e| match e {});
                let status = response.status();
                let body = axum::body::to_bytes(response.into_body(), 1 << 16)
                    .await
                    .unwrap_or_default();
                (status, body)
            })
        })
        .collect();
    for task in tasks {
        let (status, body) = task.await.unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(status, StatusCode::OK);
        assert_eq!(&body[..], b"<h1>home</h1>");
    }
    let took = began.elapsed();
    assert_eq!(rendered.load(Ordering::SeqCst), 1);
    assert_eq!(from_cache.load(Ordering::SeqCst), 19);
    // One rendering, not twenty (6 s).
    assert!(took < Duration::from_millis(1_500), "{took:?}");
}
