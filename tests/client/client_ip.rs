//! `ClientIp` in a rate layer: behind a trusted proxy each client counts
//! on its own (from `X-Forwarded-For`), an untrusted peer counts as itself
//! whatever it writes, and IPv6 clients of one /64 share a limit.

use std::net::SocketAddr;

use axum::Router;
use axum::body::Body;
use axum::routing::get;
use charon::client::Client;
use charon::layer::{ClientIp, RateLimitLayer};
use http::{Request, StatusCode};
use tower::ServiceExt;

const TWO_A_MINUTE: &str = r#"
domain: shop
resources:
  api:
    rate:
      tiers:
        - {limit: 2, window: 60s, active: forever, cooldown: 0s}
"#;

fn app() -> Router {
    let config = charon::config::load_str(TWO_A_MINUTE, "shop.yaml")
        .unwrap_or_else(|errors| panic!("{errors}"))
        .config;
    let keys = ClientIp::new().trust("10.0.0.0/8").expect("a range");
    Router::new()
        .route("/", get(|| async { "hello" }))
        .layer(RateLimitLayer::new(Client::embedded(config), "shop", "api").domain(keys))
}

async fn status(app: &Router, peer: &str, xff: Option<&str>) -> StatusCode {
    let mut request = Request::get("/");
    if let Some(xff) = xff {
        request = request.header("x-forwarded-for", xff);
    }
    let mut request = request.body(Body::empty()).expect("a request");
    let peer: SocketAddr = peer.parse().expect("a peer");
    request.extensions_mut().insert(peer);
    app.clone()
        .oneshot(request)
        .await
        .expect("answered")
        .status()
}

#[tokio::test]
async fn clients_behind_a_trusted_proxy_count_on_their_own() {
    let app = app();
    let proxy = "10.0.0.2:443";
    for _ in 0..2 {
        assert_eq!(
            status(&app, proxy, Some("198.51.100.1")).await,
            StatusCode::OK
        );
    }
    assert_eq!(
        status(&app, proxy, Some("198.51.100.1")).await,
        StatusCode::TOO_MANY_REQUESTS
    );
    // Another client through the same proxy: its own two.
    assert_eq!(
        status(&app, proxy, Some("198.51.100.2")).await,
        StatusCode::OK
    );
    // A forged first hop does not change who the proxy saw.
    assert_eq!(
        status(&app, proxy, Some("203.0.113.250, 198.51.100.1")).await,
        StatusCode::TOO_MANY_REQUESTS
    );
}

#[tokio::test]
async fn an_untrusted_peer_is_keyed_by_itself_whatever_it_writes() {
    let app = app();
    for forged in ["198.51.100.10", "198.51.100.11"] {
        assert_eq!(
            status(&app, "203.0.113.9:5000", Some(forged)).await,
            StatusCode::OK
        );
    }
    assert_eq!(
        status(&app, "203.0.113.9:5000", Some("198.51.100.12")).await,
        StatusCode::TOO_MANY_REQUESTS
    );
}

#[tokio::test]
async fn ipv6_clients_of_one_prefix_share_a_limit() {
    let app = app();
    assert_eq!(
        status(&app, "[2001:db8:1:2::1]:5000", None).await,
        StatusCode::OK
    );
    assert_eq!(
        status(&app, "[2001:db8:1:2::ffff]:5000", None).await,
        StatusCode::OK
    );
    assert_eq!(
        status(&app, "[2001:db8:1:2:abcd::9]:5000", None).await,
        StatusCode::TOO_MANY_REQUESTS,
        "the third address of one /64"
    );
    assert_eq!(
        status(&app, "[2001:db8:1:3::1]:5000", None).await,
        StatusCode::OK
    );
}
