//! The Tower layers (`charon::layer`) end to end: real axum and tonic
//! servers on loopback, driven by real HTTP/gRPC clients, in front of a real
//! sidecar (`charon serve`) and of the embedded engine.
//!
//! What it proves: limits per tenant as the configuration says, with exact
//! `Retry-After`, `RateLimit-Policy`, `RateLimit` headers and JSON body;
//! missing tenants shared or refused; no more requests through than the
//! limit when many run at once; fail open and fail closed; a concurrency
//! hold released when the client disconnects mid-response; gRPC requests
//! refused with `RESOURCE_EXHAUSTED`; rejected requests never reach the
//! upstream the service calls (a wiremock stand-in); granted responses past
//! a soft limit carry `x-charon-soft-limit`; Envoy-style descriptor lists
//! applied in process, several limits decided all or nothing.
#![cfg(all(unix, feature = "server"))]

use crate::support;

use std::convert::Infallible;
use std::net::SocketAddr;
use std::time::Duration;

use axum::Router;
use axum::body::Body;
use axum::routing::get;
use bytes::Bytes;
use charon::client::Client;
use charon::layer::{
    Action, Actions, ConcurrencyLayer, DescriptorLimitLayer, MethodAndRoute, MissingDomain,
    RateLimitLayer,
};
use http::StatusCode;
use support::sidecar::{eventually, sidecar_client, tempdir};

const CONFIG: &str = r#"
domain: shop
resources:
  root:
    rate:
      tiers:
        - {limit: 5, window: 10s, active: forever, cooldown: 0s}
  streams:
    copies: {domain_limit: 1}
  warned:
    rate:
      soft_limit: 3
      tiers:
        - {limit: 5, window: 10s, active: forever, cooldown: 0s}
  "GET /users/{id}":
    rate:
      tiers:
        - {limit: 2, window: 10s, active: forever, cooldown: 0s}
"#;

fn config() -> charon::config::Config {
    charon::config::load_str(CONFIG, "shop.yaml")
        .expect("the test config loads")
        .config
}

/// Serves `app` on a free loopback port until the test ends.
async fn serve(app: Router) -> SocketAddr {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await });
    address
}

async fn get_as(address: SocketAddr, path: &str, tenant: Option<&str>) -> reqwest::Response {
    let mut request = reqwest::Client::new().get(format!("http://{address}{path}"));
    if let Some(tenant) = tenant {
        request = request.header("x-tenant-id", tenant);
    }
    request.send().await.expect("the service answers")
}

fn header(response: &reqwest::Response, name: &str) -> String {
    response
        .headers()
        .get(name)
        .map(|value| value.to_str().unwrap().to_owned())
        .unwrap_or_default()
}

/// Five per tenant per 10 s, with exact headers, on any backend.
async fn limits_each_tenant(client: Client) {
    let app = Router::new()
        .route("/", get(|| async { "hello" }))
        .layer(RateLimitLayer::new(client.clone(), "shop", "root"));
    let address = serve(app).await;
    for remaining in (0..5).rev() {
        let ok = get_as(address, "/", Some("acme")).await;
        assert_eq!(ok.status(), StatusCode::OK);
        assert_eq!(header(&ok, "ratelimit-policy"), r#""root";q=5;w=10"#);
        let current = header(&ok, "ratelimit");
        assert!(
            current.starts_with(&format!(r#""root";r={remaining};t="#)),
            "{current}"
        );
        let reset: u64 = current.rsplit('=').next().unwrap().parse().unwrap();
        assert!((9..=11).contains(&reset), "{current}");
        assert_eq!(ok.text().await.unwrap(), "hello");
    }
    let rejected = get_as(address, "/", Some("acme")).await;
    assert_eq!(rejected.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(header(&rejected, "content-type"), "application/json");
    let retry_after: u64 = header(&rejected, "retry-after").parse().unwrap();
    assert!((9..=11).contains(&retry_after), "{retry_after}");
    assert_eq!(header(&rejected, "ratelimit-policy"), r#""root";q=5;w=10"#);
    assert_eq!(
        header(&rejected, "ratelimit"),
        format!(r#""root";r=0;t={retry_after}"#)
    );
    let body: serde_json::Value = serde_json::from_str(&rejected.text().await.unwrap()).unwrap();
    assert_eq!(body["error"], "rate_limited");
    let retry_after_ms = body["retry_after_ms"].as_u64().unwrap();
    assert_eq!(
        retry_after_ms.div_ceil(1000),
        retry_after,
        "Retry-After is the ms rounded up"
    );

    assert_eq!(
        get_as(address, "/", Some("globex")).await.status(),
        StatusCode::OK
    );
    // No tenant: one shared domain for all such requests.
    for _ in 0..5 {
        assert_eq!(get_as(address, "/", None).await.status(), StatusCode::OK);
    }
    assert_eq!(
        get_as(address, "/", None).await.status(),
        StatusCode::TOO_MANY_REQUESTS
    );
    assert_eq!(client.stats().degraded, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_rate_layer_limits_each_tenant_on_the_embedded_engine() {
    limits_each_tenant(Client::embedded(config())).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_rate_layer_limits_each_tenant_on_a_sidecar() {
    let dir = tempdir();
    let sidecar = support::sidecar::memory_sidecar(dir.path(), CONFIG).await;
    limits_each_tenant(sidecar_client(&sidecar).await).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn routes_missing_tenants_and_unlimited_resources() {
    let client = Client::embedded(config());
    let app = Router::new()
        .route("/users/{id}", get(|| async { "user" }))
        .route("/health", get(|| async { "ok" }))
        .layer(
            RateLimitLayer::new(client, "shop", "unused")
                .resource(MethodAndRoute)
                .missing_domain(MissingDomain::Reject(StatusCode::UNAUTHORIZED))
                .granted_headers(false),
        );
    let address = serve(app).await;
    let refused = get_as(address, "/users/1", None).await;
    assert_eq!(refused.status(), StatusCode::UNAUTHORIZED);
    // One limit for the route, whatever the id.
    let first = get_as(address, "/users/1", Some("acme")).await;
    assert_eq!(first.status(), StatusCode::OK);
    assert!(
        first.headers().get("ratelimit").is_none(),
        "granted_headers(false)"
    );
    assert_eq!(
        get_as(address, "/users/2", Some("acme")).await.status(),
        StatusCode::OK
    );
    let third = get_as(address, "/users/3", Some("acme")).await;
    assert_eq!(third.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(
        header(&third, "ratelimit-policy"),
        r#""GET /users/{id}";q=2;w=10"#
    );
    // `GET /health` is configured nowhere: not limited.
    for _ in 0..10 {
        assert_eq!(
            get_as(address, "/health", Some("acme")).await.status(),
            StatusCode::OK
        );
    }
}

async fn never_more_than_the_limit(client: Client) {
    let app = Router::new()
        .route("/", get(|| async { "hello" }))
        .layer(RateLimitLayer::new(client, "shop", "root"));
    let address = serve(app).await;
    let http = reqwest::Client::new();
    let requests = (0..60).map(|_| {
        let http = http.clone();
        tokio::spawn(async move {
            http.get(format!("http://{address}/"))
                .header("x-tenant-id", "crowd")
                .send()
                .await
                .map(|response| response.status())
        })
    });
    let mut granted = 0;
    for request in requests.collect::<Vec<_>>() {
        if request.await.unwrap().unwrap() == StatusCode::OK {
            granted += 1;
        }
    }
    assert_eq!(granted, 5, "exactly the limit gets through");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_requests_never_exceed_the_limit() {
    never_more_than_the_limit(Client::embedded(config())).await;
    let dir = tempdir();
    let sidecar = support::sidecar::memory_sidecar(dir.path(), CONFIG).await;
    never_more_than_the_limit(sidecar_client(&sidecar).await).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unreachable_sidecar_fails_open_or_closed() {
    let dead = format!("http://127.0.0.1:{}", support::redis::free_port());
    let open = Client::sidecar(&dead).unwrap();
    let closed = Client::sidecar(&dead).unwrap();
    let app = Router::new()
        .route("/open", get(|| async { "through" }))
        .layer(RateLimitLayer::new(open.clone(), "shop", "root"))
        .merge(
            Router::new()
                .route("/closed", get(|| async { "through" }))
                .layer(RateLimitLayer::new(closed.clone(), "shop", "root").fail_closed(true)),
        )
        .merge(
            Router::new()
                .route("/held", get(|| async { "through" }))
                .layer(ConcurrencyLayer::new(closed.clone(), "shop", "streams").fail_closed(true)),
        );
    let address = serve(app).await;
    for _ in 0..10 {
        let response = get_as(address, "/open", Some("acme")).await;
        assert_eq!(response.status(), StatusCode::OK);
        assert!(
            response.headers().get("ratelimit").is_none(),
            "nothing to report"
        );
    }
    assert_eq!(open.stats().degraded, 10, "every fail-open is counted");
    assert_eq!(
        get_as(address, "/closed", Some("acme")).await.status(),
        StatusCode::SERVICE_UNAVAILABLE
    );
    assert_eq!(
        get_as(address, "/held", Some("acme")).await.status(),
        StatusCode::SERVICE_UNAVAILABLE
    );
}

/// A body that sends one chunk, then nothing until the client goes away.
fn endless_body() -> Body {
    let first = futures_util::stream::once(async {
        Ok::<_, Infallible>(Bytes::from_static(b"first chunk\n"))
    });
    Body::from_stream(futures_util::StreamExt::chain(
        first,
        futures_util::stream::pending(),
    ))
}

async fn holds_until_the_body_ends(client: Client) {
    let app = Router::new()
        .route("/stream", get(|| async { endless_body() }))
        .route("/short", get(|| async { "done" }))
        .layer(ConcurrencyLayer::new(client, "shop", "streams"));
    let address = serve(app).await;
    // A complete response gives its copy back once it is sent (the
    // release runs in the background: poll for it).
    for _ in 0..3 {
        let short = eventually(
            "the last copy released",
            Duration::from_secs(10),
            async || {
                let short = get_as(address, "/short", Some("acme")).await;
                match short.status() {
                    StatusCode::OK => Ok(short),
                    other => Err(other.to_string()),
                }
            },
        )
        .await;
        assert_eq!(header(&short, "ratelimit-policy"), r#""streams";q=1"#);
        assert_eq!(header(&short, "ratelimit"), r#""streams";r=0"#);
        assert_eq!(short.text().await.unwrap(), "done");
    }
    let mut streaming = eventually("the stream starts", Duration::from_secs(10), async || {
        let streaming = get_as(address, "/stream", Some("acme")).await;
        match streaming.status() {
            StatusCode::OK => Ok(streaming),
            other => Err(other.to_string()),
        }
    })
    .await;
    assert_eq!(streaming.chunk().await.unwrap().unwrap(), "first chunk\n");
    let busy = get_as(address, "/short", Some("acme")).await;
    assert_eq!(busy.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(header(&busy, "retry-after"), "1");
    let body: serde_json::Value = serde_json::from_str(&busy.text().await.unwrap()).unwrap();
    assert_eq!(body["error"], "concurrency_limited");
    assert_eq!(
        get_as(address, "/short", Some("globex")).await.status(),
        StatusCode::OK
    );
    // The client disconnects mid-response: the copy comes back.
    drop(streaming);
    eventually(
        "the disconnected stream's copy released",
        Duration::from_secs(10),
        async || match get_as(address, "/short", Some("acme")).await.status() {
            StatusCode::OK => Ok(()),
            other => Err(other.to_string()),
        },
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_concurrency_hold_lasts_until_the_body_ends_on_the_embedded_engine() {
    holds_until_the_body_ends(Client::embedded(config())).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_concurrency_hold_lasts_until_the_body_ends_on_a_sidecar() {
    let dir = tempdir();
    let sidecar = support::sidecar::memory_sidecar(dir.path(), CONFIG).await;
    holds_until_the_body_ends(sidecar_client(&sidecar).await).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn grpc_requests_get_resource_exhausted() {
    use tonic_health::pb::HealthCheckRequest;
    use tonic_health::pb::health_client::HealthClient;

    let (_reporter, health) = tonic_health::server::health_reporter();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = listener.local_addr().unwrap();
    let client = Client::embedded(config());
    tokio::spawn(
        tonic::transport::Server::builder()
            .layer(RateLimitLayer::new(client, "shop", "root"))
            .add_service(health)
            .serve_with_incoming(tokio_stream::wrappers::TcpListenerStream::new(listener)),
    );
    let mut health = eventually(
        "the gRPC server is up",
        Duration::from_secs(10),
        async || {
            let channel = tonic::transport::Endpoint::from_shared(format!("http://{address}"))
                .map_err(|e| e.to_string())?
                .connect()
                .await
                .map_err(|e| e.to_string())?;
            Ok(HealthClient::new(channel))
        },
    )
    .await;
    let check = || {
        let mut request = tonic::Request::new(HealthCheckRequest {
            service: String::new(),
        });
        request
            .metadata_mut()
            .insert("x-tenant-id", "acme".parse().unwrap());
        request
    };
    for _ in 0..5 {
        health.check(check()).await.expect("granted");
    }
    let status = health.check(check()).await.unwrap_err();
    assert_eq!(status.code(), tonic::Code::ResourceExhausted, "{status:?}");
    assert!(
        status.message().starts_with("rate_limited: retry after"),
        "{status:?}"
    );
    let retry_after: u64 = status
        .metadata()
        .get("retry-after")
        .unwrap()
        .to_str()
        .unwrap()
        .parse()
        .unwrap();
    assert!((9..=11).contains(&retry_after));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rejected_requests_never_reach_the_upstream() {
    use wiremock::matchers::{method, path};
    use wiremock::{Mock, MockServer, ResponseTemplate};

    let upstream = MockServer::start().await;
    Mock::given(method("GET"))
        .and(path("/inventory"))
        .respond_with(ResponseTemplate::new(200).set_body_string("42 widgets"))
        .expect(5)
        .mount(&upstream)
        .await;
    let inventory = format!("{}/inventory", upstream.uri());
    let app = Router::new()
        .route(
            "/",
            get(move || {
                let inventory = inventory.clone();
                async move { reqwest::get(inventory).await.unwrap().text().await.unwrap() }
            }),
        )
        .layer(RateLimitLayer::new(
            Client::embedded(config()),
            "shop",
            "root",
        ));
    let address = serve(app).await;
    let mut statuses = Vec::new();
    for _ in 0..8 {
        statuses.push(get_as(address, "/", Some("acme")).await.status().as_u16());
    }
    assert_eq!(statuses, [200, 200, 200, 200, 200, 429, 429, 429]);
    // `expect(5)` is verified when the mock server drops.
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn granted_responses_past_the_soft_limit_carry_a_warning() {
    let app = Router::new()
        .route("/", get(|| async { "hello" }))
        .layer(RateLimitLayer::new(
            Client::embedded(config()),
            "shop",
            "warned",
        ));
    let address = serve(app).await;
    let mut warnings = Vec::new();
    for _ in 0..6 {
        let response = get_as(address, "/", Some("acme")).await;
        warnings.push((
            response.status().as_u16(),
            header(&response, "x-charon-soft-limit"),
        ));
    }
    let quiet = (200, String::new());
    let warned = (200, "warned".to_owned());
    assert_eq!(
        warnings,
        [
            quiet.clone(),
            quiet.clone(),
            quiet,
            warned.clone(),
            warned,
            (429, String::new())
        ]
    );
}

/// Envoy-style: three per tenant per minute (named), four a minute for
/// everyone (unnamed), and a `resource:` leaf with burst tiers.
const DESCRIPTORS: &str = r#"
domain: catalog
descriptors:
  - key: generic_key
    value: api
    descriptors:
      - key: tenant
        rate_limit: {name: per-tenant, unit: minute, requests_per_unit: 3}
  - key: generic_key
    value: everyone
    rate_limit: {unit: minute, requests_per_unit: 4}
"#;

fn descriptor_app(client: Client) -> Router {
    let tenant = http::HeaderName::from_static("x-tenant-id");
    let actions = Actions::new()
        .descriptor([
            Action::generic_key("api"),
            Action::request_header(tenant, "tenant"),
        ])
        .descriptor([Action::generic_key("everyone")]);
    Router::new()
        .route("/", get(|| async { "hello" }))
        .layer(DescriptorLimitLayer::new(client, "catalog", actions))
}

/// A rejected request counts in none of its limits; the headers name the
/// limit that bit.
async fn descriptors_all_or_nothing(client: Client) {
    let address = serve(descriptor_app(client)).await;
    for remaining in (1..4).rev() {
        let ok = get_as(address, "/", Some("acme")).await;
        assert_eq!(ok.status(), StatusCode::OK);
        // The limit closest to biting: everyone's (4 - n) or acme's (3 - n).
        assert_eq!(header(&ok, "ratelimit-policy"), r#""per-tenant";q=3;w=60"#);
        assert!(
            header(&ok, "ratelimit").starts_with(&format!(r#""per-tenant";r={}"#, remaining - 1)),
            "{}",
            header(&ok, "ratelimit")
        );
    }
    // acme is over its own limit: rejected, and `everyone` not counted.
    let rejected = get_as(address, "/", Some("acme")).await;
    assert_eq!(rejected.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(
        header(&rejected, "ratelimit-policy"),
        r#""per-tenant";q=3;w=60"#
    );
    let retry_after: u64 = header(&rejected, "retry-after").parse().unwrap();
    assert!((1..=60).contains(&retry_after), "{retry_after}");
    // So the fourth hit of `everyone` is still there for beta…
    let ok = get_as(address, "/", Some("beta")).await;
    assert_eq!(ok.status(), StatusCode::OK, "the rejected request counted");
    let current = header(&ok, "ratelimit");
    assert!(current.starts_with(r#""generic_key";r=0;t="#), "{current}");
    // …and then `everyone` is spent, while beta's own limit is not counted
    // for the rejected request either.
    let rejected = get_as(address, "/", Some("beta")).await;
    assert_eq!(rejected.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(
        header(&rejected, "ratelimit-policy"),
        r#""generic_key";q=4;w=60"#
    );
    // Without the tenant header, only `everyone` applies: still spent.
    let anonymous = get_as(address, "/", None).await;
    assert_eq!(anonymous.status(), StatusCode::TOO_MANY_REQUESTS);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn descriptor_limits_are_all_or_nothing_on_the_embedded_engine() {
    let config = charon::config::load_str(DESCRIPTORS, "catalog.yaml")
        .expect("the descriptor config loads")
        .config;
    descriptors_all_or_nothing(Client::embedded(config)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn descriptor_limits_are_all_or_nothing_on_a_sidecar() {
    let dir = tempdir();
    let sidecar = support::sidecar::memory_sidecar(dir.path(), DESCRIPTORS).await;
    descriptors_all_or_nothing(sidecar_client(&sidecar).await).await;
}

/// With `every_descriptor_headers`, `RateLimit-Policy` names each
/// descriptor's policy (the unnamed one by its keys), granted or refused;
/// `RateLimit` stays the tightest's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_descriptors_policy_when_asked() {
    let config = charon::config::load_str(DESCRIPTORS, "catalog.yaml")
        .expect("the descriptor config loads")
        .config;
    let tenant = http::HeaderName::from_static("x-tenant-id");
    let actions = Actions::new()
        .descriptor([
            Action::generic_key("api"),
            Action::request_header(tenant, "tenant"),
        ])
        .descriptor([Action::generic_key("everyone")]);
    let app = Router::new().route("/", get(|| async { "hello" })).layer(
        DescriptorLimitLayer::new(Client::embedded(config), "catalog", actions)
            .every_descriptor_headers(true),
    );
    let address = serve(app).await;
    let both = r#""per-tenant";q=3;w=60, "generic_key";q=4;w=60"#;
    let ok = get_as(address, "/", Some("acme")).await;
    assert_eq!(ok.status(), StatusCode::OK);
    assert_eq!(header(&ok, "ratelimit-policy"), both);
    assert!(header(&ok, "ratelimit").starts_with(r#""per-tenant";r=2;t="#));
    for _ in 0..2 {
        assert_eq!(
            get_as(address, "/", Some("acme")).await.status(),
            StatusCode::OK
        );
    }
    let refused = get_as(address, "/", Some("acme")).await;
    assert_eq!(refused.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(header(&refused, "ratelimit-policy"), both);
    assert!(header(&refused, "ratelimit").starts_with(r#""per-tenant";r=0;t="#));
}

/// A calendar day through the descriptor layer
/// (docs/design.md#calendar-windows): the policy's window is the day's own
/// length and the 429 says to retry at midnight UTC.
async fn a_calendar_days_refusal_says_retry_at_midnight(client: Client) {
    let to_midnight = || {
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .expect("after the epoch")
            .as_secs();
        86_400 - now % 86_400
    };
    if to_midnight() < 60 {
        tokio::time::sleep(std::time::Duration::from_secs(to_midnight() + 2)).await;
    }
    let tenant = http::HeaderName::from_static("x-tenant-id");
    let actions = Actions::new().descriptor([
        Action::generic_key("api"),
        Action::request_header(tenant, "tenant"),
    ]);
    let app = Router::new()
        .route("/", get(|| async { "hello" }))
        .layer(DescriptorLimitLayer::new(client, "catalog", actions));
    let address = serve(app).await;
    let ok = get_as(address, "/", Some("acme")).await;
    assert_eq!(ok.status(), StatusCode::OK);
    assert_eq!(header(&ok, "ratelimit-policy"), r#""daily";q=1;w=86400"#);
    let refused = get_as(address, "/", Some("acme")).await;
    assert_eq!(refused.status(), StatusCode::TOO_MANY_REQUESTS);
    let retry_after: u64 = header(&refused, "retry-after").parse().expect("seconds");
    let expected = to_midnight();
    assert!(
        retry_after.abs_diff(expected) <= 5,
        "retry after {retry_after} s, {expected} s to midnight"
    );
}

const DAILY: &str = "
domain: catalog
descriptors:
  - key: generic_key
    value: api
    descriptors:
      - key: tenant
        rate_limit: {name: daily, unit: day, requests_per_unit: 1, calendar: {time_zone: UTC}}
";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_calendar_day_on_the_embedded_engine() {
    let config = charon::config::load_str(DAILY, "catalog.yaml")
        .expect("the calendar config loads")
        .config;
    a_calendar_days_refusal_says_retry_at_midnight(Client::embedded(config)).await;
}

/// The same through the Charon API of a sidecar.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_calendar_day_through_a_sidecars_charon_api() {
    let dir = tempdir();
    let sidecar = support::sidecar::memory_sidecar(dir.path(), DAILY).await;
    a_calendar_days_refusal_says_retry_at_midnight(sidecar_client(&sidecar).await).await;
}
