//! [`AdaptiveThrottleLayer`] on an outgoing client, on tokio's paused
//! clock: a caller whose backend refuses backs off before sending, and
//! comes back when the backend accepts again; an outgoing call made while
//! handling a throttled request carries that request's criticality.

use std::convert::Infallible;
use std::sync::atomic::{AtomicU16, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Router;
use axum::body::Body;
use axum::routing::get;
use charon::layer::{AdaptiveError, AdaptiveThrottleLayer, ThrottleLayer};
use http::{Request, Response, StatusCode};
use tower::{Service, ServiceBuilder, ServiceExt};

/// A backend that answers every request with `status`, counting them.
#[derive(Clone, Default)]
struct Backend {
    status: Arc<AtomicU16>,
    received: Arc<AtomicU64>,
    criticality: Arc<Mutex<Vec<String>>>,
}

impl Backend {
    fn service(
        &self,
    ) -> impl Service<Request<()>, Response = Response<()>, Error = Infallible, Future: Send>
    + Clone
    + Send
    + 'static {
        let backend = self.clone();
        tower::service_fn(move |request: Request<()>| {
            let backend = backend.clone();
            async move {
                backend.received.fetch_add(1, Ordering::Relaxed);
                if let (Some(level), Ok(mut seen)) = (
                    request.headers().get("x-criticality"),
                    backend.criticality.lock(),
                ) {
                    seen.push(level.to_str().unwrap_or("?").to_owned());
                }
                let mut response = Response::new(());
                *response.status_mut() =
                    StatusCode::from_u16(backend.status.load(Ordering::Relaxed))
                        .unwrap_or(StatusCode::OK);
                Ok::<_, Infallible>(response)
            }
        })
    }
}

/// Sends `count` requests, ten a second; how many the backend received
/// and how many the caller refused itself.
async fn send<S>(client: &mut S, backend: &Backend, count: u64) -> (u64, u64)
where
    S: Service<Request<()>, Response = Response<()>, Error = AdaptiveError<Infallible>>,
{
    let before = backend.received.load(Ordering::Relaxed);
    let mut refused_here = 0;
    for _ in 0..count {
        let request = Request::get("http://backend.test/")
            .body(())
            .unwrap_or_else(|e| panic!("{e}"));
        match client.ready().await {
            Ok(ready) => match ready.call(request).await {
                Ok(_) => {}
                Err(AdaptiveError::Throttled { .. }) => refused_here += 1,
                Err(AdaptiveError::Inner(never)) => match never {},
            },
            Err(error) => panic!("{error}"),
        }
        tokio::time::advance(Duration::from_millis(100)).await;
    }
    (
        backend.received.load(Ordering::Relaxed) - before,
        refused_here,
    )
}

#[tokio::test(start_paused = true)]
async fn a_refused_caller_backs_off_and_recovers() {
    let backend = Backend::default();
    backend.status.store(200, Ordering::Relaxed);
    let layer = AdaptiveThrottleLayer::new();
    let mut client = ServiceBuilder::new()
        .layer(layer.clone())
        .service(backend.service());

    // An accepting backend: everything is sent.
    assert_eq!(send(&mut client, &backend, 100).await, (100, 0));
    assert_eq!(layer.counts("backend.test"), (100, 100));
    // (The window is 30 seconds: 100 requests at 10 a second fit.)

    // The backend refuses. Once the window no longer remembers its
    // accepts (30 seconds), the caller sends a tenth (the bound).
    backend.status.store(503, Ordering::Relaxed);
    let (sent, _) = send(&mut client, &backend, 300).await;
    assert!(sent < 300, "sent {sent} of 300 to a refusing backend");
    let (sent, refused) = send(&mut client, &backend, 600).await;
    assert!((30..=90).contains(&sent), "sent {sent} of the last 600");
    assert_eq!(sent + refused, 600);

    // The backend accepts again: the caller sends twice as much each
    // window, everything again within four.
    backend.status.store(200, Ordering::Relaxed);
    send(&mut client, &backend, 1_200).await;
    let (sent, refused) = send(&mut client, &backend, 100).await;
    assert_eq!((sent, refused), (100, 0));
}

#[tokio::test]
async fn an_outgoing_call_carries_the_criticality_of_the_request_handled() {
    let backend = Backend::default();
    backend.status.store(200, Ordering::Relaxed);
    let client = ServiceBuilder::new()
        .layer(AdaptiveThrottleLayer::new())
        .service(backend.service());
    let handler = move || {
        let client = client.clone();
        async move {
            let request = Request::get("http://backend.test/")
                .body(())
                .unwrap_or_else(|e| panic!("{e}"));
            match client.oneshot(request).await {
                Ok(_) => "called",
                Err(_) => "not called",
            }
        }
    };
    let app = Router::new()
        .route("/", get(handler))
        .layer(ThrottleLayer::new(4));
    for level in ["sheddable", "critical_plus"] {
        let request = Request::get("/")
            .header("x-criticality", level)
            .body(Body::empty())
            .unwrap_or_else(|e| panic!("{e}"));
        let response = app
            .clone()
            .oneshot(request)
            .await
            .unwrap_or_else(|e| match e {});
        assert_eq!(response.status(), StatusCode::OK);
    }
    let seen = backend
        .criticality
        .lock()
        .map(|s| s.clone())
        .unwrap_or_default();
    assert_eq!(seen, ["sheddable", "critical_plus"]);
}
