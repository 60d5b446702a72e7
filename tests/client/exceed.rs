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
