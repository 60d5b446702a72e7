//! What a layer does with a request over its limit (`Exceed`): refuse,
//! redirect, or let it through degraded with `OverLimit` in its extensions;
//! and a request past a soft limit carries `SoftLimitExceeded` to its
//! handler.

use axum::Router;
use axum::body::Body;
use axum::extract::Request as AxumRequest;
use axum::routing::get;
use charon::client::Client;
use charon::layer::{Exceed, OverLimit, RateLimitLayer, SoftLimitExceeded};
use http::{Request, StatusCode};
use http_body_util::BodyExt;
use tower::ServiceExt;

/// Two requests a minute, the second past a soft limit of one.
const TWO_A_MINUTE: &str = r#"
domain: shop
resources:
  api:
    rate:
      soft_limit: 1
      tiers:
        - {limit: 2, window: 60s, active: forever, cooldown: 0s}
"#;

fn app(exceed: Exceed) -> Router {
    let config = charon::config::load_str(TWO_A_MINUTE, "shop.yaml")
        .unwrap_or_else(|errors| panic!("{errors}"))
        .config;
    Router::new()
        .route(
            "/",
            get(|request: AxumRequest| async move {
                let extensions = request.extensions();
                match (
                    extensions.get::<OverLimit>(),
                    extensions.get::<SoftLimitExceeded>(),
                ) {
                    (Some(_), _) => "reduced".to_owned(),
                    (None, Some(soft)) => format!("full, past the soft limit of {}", soft.resource),
                    (None, None) => "full".to_owned(),
                }
            }),
        )
        .layer(RateLimitLayer::new(Client::embedded(config), "shop", "api").on_exceed(exceed))
}

async fn call(app: &Router, grpc: bool) -> (StatusCode, http::HeaderMap, String) {
    let mut request = Request::get("/").header("x-tenant-id", "acme");
    if grpc {
        request = request.header("content-type", "application/grpc");
    }
    let response = app
        .clone()
        .oneshot(request.body(Body::empty()).expect("a request"))
        .await
        .expect("answered");
    let (parts, body) = response.into_parts();
    let body = body.collect().await.expect("a body").to_bytes();
    (
        parts.status,
        parts.headers,
        String::from_utf8_lossy(&body).into_owned(),
    )
}

#[tokio::test]
async fn a_degraded_request_reaches_its_handler_marked() {
    let app = app(Exceed::Degrade);
    let (status, _, body) = call(&app, false).await;
    assert_eq!((status, body.as_str()), (StatusCode::OK, "full"));
    let (status, _, body) = call(&app, false).await;
    assert_eq!(
        (status, body.as_str()),
        (StatusCode::OK, "full, past the soft limit of api")
    );
    let (status, _, body) = call(&app, false).await;
    assert_eq!((status, body.as_str()), (StatusCode::OK, "reduced"));
}

#[tokio::test]
async fn an_exceeding_request_is_redirected_but_a_grpc_one_refused() {
    let app = app(Exceed::redirect("/busy"));
    for _ in 0..2 {
        assert_eq!(call(&app, false).await.0, StatusCode::OK);
    }
    let (status, headers, _) = call(&app, false).await;
    assert_eq!(status, StatusCode::SEE_OTHER);
    assert_eq!(
        headers.get("location").map(|v| v.as_bytes()),
        Some(&b"/busy"[..])
    );
    let (status, headers, _) = call(&app, true).await;
    assert_eq!(status, StatusCode::OK, "gRPC answers in trailers-only form");
    assert_eq!(
        headers.get("grpc-status").map(|v| v.as_bytes()),
        Some(&b"8"[..])
    );
}

#[tokio::test]
async fn by_default_an_exceeding_request_is_refused() {
    let app = app(Exceed::default());
    for _ in 0..2 {
        assert_eq!(call(&app, false).await.0, StatusCode::OK);
    }
    let (status, headers, _) = call(&app, false).await;
    assert_eq!(status, StatusCode::TOO_MANY_REQUESTS);
    assert!(headers.contains_key("retry-after"));
}

/// The same actions over a leased capacity (`LeaseLimitLayer`): a limiter
/// of one request a second, full with one token.
fn lease_app(
    layer: impl FnOnce(charon::layer::LeaseLimitLayer) -> charon::layer::LeaseLimitLayer,
) -> Router {
    let limiter = std::sync::Arc::new(charon::client::lease::LeaseLimiter::with_rate(1.0));
    Router::new()
        .route(
            "/",
            get(|request: AxumRequest| async move {
                match request.extensions().get::<OverLimit>() {
                    Some(_) => "reduced",
                    None => "full",
                }
            }),
        )
        .layer(layer(charon::layer::LeaseLimitLayer::new(limiter)))
}

#[tokio::test]
async fn a_lease_layer_degrades_redirects_or_refuses_as_told() {
    let degrading = lease_app(|layer| layer.on_exceed(Exceed::Degrade));
    let (status, _, body) = call(&degrading, false).await;
    assert_eq!((status, body.as_str()), (StatusCode::OK, "full"));
    let (status, _, body) = call(&degrading, false).await;
    assert_eq!((status, body.as_str()), (StatusCode::OK, "reduced"));

    let redirecting = lease_app(|layer| layer.on_exceed(Exceed::redirect("/busy")));
    assert_eq!(call(&redirecting, false).await.0, StatusCode::OK);
    let (status, headers, _) = call(&redirecting, false).await;
    assert_eq!(status, StatusCode::SEE_OTHER);
    assert_eq!(
        headers.get("location").map(|v| v.as_bytes()),
        Some(&b"/busy"[..])
    );

    let refusing = lease_app(|layer| layer);
    assert_eq!(call(&refusing, false).await.0, StatusCode::OK);
    let (status, headers, _) = call(&refusing, false).await;
    assert_eq!(status, StatusCode::TOO_MANY_REQUESTS);
    assert!(headers.contains_key("retry-after"));
}

#[tokio::test]
async fn a_lease_layer_waits_for_the_refill_that_comes_in_time() {
    use std::time::{Duration, Instant};
    // One a second, one token: the first passes; the second, at once,
    // waits for the next token (about a second) and passes; the third,
    // which would wait two, is refused at once.
    let waiting = lease_app(|layer| layer.max_wait(Duration::from_millis(1_500)));
    assert_eq!(call(&waiting, false).await.0, StatusCode::OK);
    let began = Instant::now();
    let (second, third) = tokio::join!(
        async {
            let answer = call(&waiting, false).await;
            (answer.0, began.elapsed())
        },
        async {
            tokio::time::sleep(Duration::from_millis(50)).await;
            let answer = call(&waiting, false).await;
            (answer.0, began.elapsed())
        },
    );
    assert_eq!(second.0, StatusCode::OK);
    assert!(second.1 >= Duration::from_millis(900), "{second:?}");
    assert_eq!(third.0, StatusCode::TOO_MANY_REQUESTS);
    assert!(
        third.1 < Duration::from_millis(900),
        "refused at once: {third:?}"
    );
}

#[tokio::test]
async fn a_rate_layer_waits_for_the_next_refill_up_to_its_max_wait() {
    // Two a second: the third request of a burst waits for the window to
    // turn (under a second) and passes; without a wait it is refused.
    const TWO_A_SECOND: &str = r#"
domain: shop
resources:
  api:
    rate:
      tiers:
        - {limit: 2, window: 1s, active: forever, cooldown: 0s}
"#;
    let config = charon::config::load_str(TWO_A_SECOND, "shop.yaml")
        .unwrap_or_else(|errors| panic!("{errors}"))
        .config;
    let client = Client::embedded(config);
    let app = |wait: std::time::Duration| {
        Router::new()
            .route("/", get(|| async { "ok" }))
            .layer(RateLimitLayer::new(client.clone(), "shop", "api").max_wait(wait))
    };
    let waiting = app(std::time::Duration::from_secs(3));
    for _ in 0..2 {
        assert_eq!(call(&waiting, false).await.0, StatusCode::OK);
    }
    assert_eq!(
        call(&waiting, false).await.0,
        StatusCode::OK,
        "waited for the window"
    );
    let refusing = app(std::time::Duration::ZERO);
    for _ in 0..2 {
        let _ = call(&refusing, false).await;
    }
    assert_eq!(
        call(&refusing, false).await.0,
        StatusCode::TOO_MANY_REQUESTS
    );
}
