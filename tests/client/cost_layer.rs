//! [`CostLimitLayer`] on the embedded engine: a budget of tokens per hour
//! on a `cost: after_response` descriptor, checked before each request and
//! charged the response's [`Cost`] when its body ends, when it is dropped
//! half sent, as it streams; not on a server error unless asked.

use std::convert::Infallible;
use std::time::Duration;

use axum::Router;
use axum::body::Body;
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use bytes::Bytes;
use charon::client::Client;
use charon::layer::{Action, Actions, Cost, CostLimitLayer};
use futures_util::StreamExt;
use http::{Request, StatusCode};
use http_body_util::BodyExt;
use tower::ServiceExt;

/// `limit` tokens an hour; one request predicted at 1 token before any
/// charge, so that the first requests are let in and what the charges
/// teach decides the next.
fn client(limit: u64) -> Client {
    let yaml = format!(
        "domain: ai\ndescriptors:\n  - key: generic_key\n    value: tokens\n    rate_limit: {{unit: hour, requests_per_unit: {limit}, cost: after_response, initial_cost: 1}}\n"
    );
    let config = charon::config::load_str(&yaml, "ai.yaml")
        .unwrap_or_else(|errors| panic!("{errors}"))
        .config;
    Client::embedded(config)
}

fn answered_with(cost: u64, status: StatusCode) -> Response {
    let mut response = (status, "answered").into_response();
    response.extensions_mut().insert(Cost::new(cost));
    response
}

fn app(client: Client, charge_errors: bool) -> Router {
    let layer = CostLimitLayer::new(
        client,
        "ai",
        Actions::new().descriptor([Action::generic_key("tokens")]),
    )
    .charge_errors(charge_errors);
    routes().layer(layer)
}

/// The same routes, a request's `x-max-tokens` reserved at admission.
fn app_reserving(client: Client) -> Router {
    let layer = CostLimitLayer::new(
        client,
        "ai",
        Actions::new().descriptor([Action::generic_key("tokens")]),
    )
    .estimate_header("x-max-tokens");
    routes().layer(layer)
}

/// The same routes, the cost read from the trailer `x-cost`.
fn app_with_trailer(client: Client) -> Router {
    let layer = CostLimitLayer::new(
        client,
        "ai",
        Actions::new().descriptor([Action::generic_key("tokens")]),
    )
    .cost_trailer(http::HeaderName::from_static("x-cost"));
    routes().layer(layer)
}

fn routes() -> Router {
    Router::new()
        .route(
            "/trailer",
            get(|| async {
                // A body that says its cost, 700, in a trailer at its end.
                let mut trailers = http::HeaderMap::new();
                trailers.insert("x-cost", http::HeaderValue::from_static("700"));
                let frames = futures_util::stream::iter([
                    Ok::<_, Infallible>(http_body::Frame::data(Bytes::from_static(b"tokens"))),
                    Ok(http_body::Frame::trailers(trailers)),
                ]);
                Body::new(http_body_util::StreamBody::new(frames)).into_response()
            }),
        )
        .route("/100", get(|| async { answered_with(100, StatusCode::OK) }))
        .route("/600", get(|| async { answered_with(600, StatusCode::OK) }))
        .route(
            "/failed",
            get(|| async { answered_with(600, StatusCode::INTERNAL_SERVER_ERROR) }),
        )
        .route("/free", get(|| async { "no cost said" }))
        .route(
            "/stream",
            get(|| async {
                // 3 chunks of 400 tokens, counted as they are sent.
                let cost = Cost::default();
                let counting = cost.clone();
                let chunks = futures_util::stream::iter(0..3).map(move |_| {
                    counting.add(400);
                    Ok::<_, Infallible>(Bytes::from_static(b"tokens "))
                });
                let mut response = Body::from_stream(chunks).into_response();
                response.extensions_mut().insert(cost);
                response
            }),
        )
}

async fn get_from(app: &Router, path: &str) -> Response<Body> {
    app.clone()
        .oneshot(Request::get(path).body(Body::empty()).expect("a request"))
        .await
        .expect("answered")
}

/// `path` asked with `x-max-tokens: max_tokens`.
async fn get_at_most(app: &Router, path: &str, max_tokens: u64) -> Response<Body> {
    let request = Request::get(path)
        .header("x-max-tokens", max_tokens)
        .body(Body::empty())
        .expect("a request");
    app.clone().oneshot(request).await.expect("answered")
}

/// Its status, the body read to the end.
async fn status_at_most(app: &Router, path: &str, max_tokens: u64) -> StatusCode {
    let response = get_at_most(app, path, max_tokens).await;
    let status = response.status();
    let _ = response.into_body().collect().await;
    settled().await;
    status
}

/// A request's status, its body read to the end.
async fn status_of(app: &Router, path: &str) -> StatusCode {
    let response = get_from(app, path).await;
    let status = response.status();
    let _ = response.into_body().collect().await;
    settled().await;
    status
}

/// Charges are spawned only when they cannot finish at once; the embedded
/// engine finishes at once, but give a spawned one a moment anyway.
async fn settled() {
    tokio::time::sleep(Duration::from_millis(20)).await;
}

// Once 600 is charged of 1 000, one more request is predicted at 600 plus
// three deviations (300 each): refused. Uncharged, it is predicted at 1.

#[tokio::test]
async fn a_response_is_charged_its_cost_when_its_body_ends() {
    let app = app(client(1_000), false);
    let first = get_from(&app, "/600").await;
    assert_eq!(first.status(), StatusCode::OK);
    // Its body not sent yet: nothing charged, the next is let in.
    let second = get_from(&app, "/600").await;
    assert_eq!(second.status(), StatusCode::OK);
    let _ = first.into_body().collect().await;
    let _ = second.into_body().collect().await;
    settled().await;
    assert_eq!(status_of(&app, "/600").await, StatusCode::TOO_MANY_REQUESTS);
}

#[tokio::test]
async fn a_body_dropped_unsent_is_charged_all_the_same() {
    let app = app(client(1_000), false);
    drop(get_from(&app, "/600").await);
    settled().await;
    assert_eq!(status_of(&app, "/600").await, StatusCode::TOO_MANY_REQUESTS);
}

#[tokio::test]
async fn a_stream_is_charged_what_it_counted_when_it_ended_or_was_dropped() {
    // 2 000 an hour: 400 charged leaves room for one more (400 + 400 +
    // 3·200 = 1 400); 1 200 charged does not (1 200 + 1 200 + 3·600).
    let half = app(client(2_000), false);
    let response = get_from(&half, "/stream").await;
    let mut body = response.into_body();
    let first = body.frame().await.expect("a frame").expect("data");
    assert!(first.is_data());
    drop(body);
    settled().await;
    assert_eq!(
        status_of(&half, "/free").await,
        StatusCode::OK,
        "400 charged"
    );

    let whole = app(client(2_000), false);
    assert_eq!(status_of(&whole, "/stream").await, StatusCode::OK);
    assert_eq!(
        status_of(&whole, "/free").await,
        StatusCode::TOO_MANY_REQUESTS,
        "1 200 charged"
    );
}

#[tokio::test]
async fn a_server_error_is_not_charged_unless_asked() {
    let spared = app(client(1_000), false);
    assert_eq!(
        status_of(&spared, "/failed").await,
        StatusCode::INTERNAL_SERVER_ERROR
    );
    assert_eq!(
        status_of(&spared, "/free").await,
        StatusCode::OK,
        "not charged"
    );

    let charged = app(client(1_000), true);
    assert_eq!(
        status_of(&charged, "/failed").await,
        StatusCode::INTERNAL_SERVER_ERROR
    );
    assert_eq!(
        status_of(&charged, "/free").await,
        StatusCode::TOO_MANY_REQUESTS,
        "charged"
    );
}

#[tokio::test]
async fn a_response_that_says_no_cost_charges_nothing() {
    let app = app(client(1_000), false);
    for _ in 0..5 {
        assert_eq!(status_of(&app, "/free").await, StatusCode::OK);
    }
}

/// Through a sidecar the charge is a round trip: it finishes on the
/// runtime after the body has ended.
#[tokio::test(flavor = "multi_thread")]
async fn through_a_sidecar_the_charge_lands_after_the_body_ends() {
    let dir = crate::support::sidecar::tempdir();
    let yaml = "domain: ai\ndescriptors:\n  - key: generic_key\n    value: tokens\n    rate_limit: {unit: hour, requests_per_unit: 1000, cost: after_response, initial_cost: 1}\n";
    let sidecar = crate::support::sidecar::memory_sidecar(dir.path(), yaml).await;
    let app = app(
        crate::support::sidecar::sidecar_client(&sidecar).await,
        false,
    );
    assert_eq!(status_of(&app, "/600").await, StatusCode::OK);
    crate::support::sidecar::eventually(
        "the charge lands and the next request is refused",
        Duration::from_secs(10),
        async || match status_of(&app, "/free").await {
            StatusCode::TOO_MANY_REQUESTS => Ok(()),
            other => Err(other.to_string()),
        },
    )
    .await;
}

// With an estimate the layer reserves it: what is in flight is held at its
// estimate, not predicted, and the commit gives back what was not spent.

#[tokio::test]
async fn an_estimate_is_held_while_the_response_runs_and_settled_at_its_cost() {
    let app = app_reserving(client(1_000));
    let first = get_at_most(&app, "/600", 600).await;
    assert_eq!(first.status(), StatusCode::OK);
    assert_eq!(
        get_at_most(&app, "/600", 600).await.status(),
        StatusCode::TOO_MANY_REQUESTS,
        "600 held, 600 more does not fit"
    );
    let _ = first.into_body().collect().await;
    settled().await;
    assert_eq!(
        status_at_most(&app, "/100", 400).await,
        StatusCode::OK,
        "600 + 400 fits"
    );
    // Reserved 400, cost 100: 300 given back, so 300 fits now and 301 not.
    assert_eq!(
        status_at_most(&app, "/free", 301).await,
        StatusCode::TOO_MANY_REQUESTS
    );
    assert_eq!(status_at_most(&app, "/free", 300).await, StatusCode::OK);
}

#[tokio::test]
async fn a_reservation_is_cancelled_on_a_server_error_and_committed_on_drop() {
    let app = app_reserving(client(1_000));
    assert_eq!(
        status_at_most(&app, "/failed", 900).await,
        StatusCode::INTERNAL_SERVER_ERROR
    );
    assert_eq!(
        status_at_most(&app, "/free", 1_000).await,
        StatusCode::OK,
        "the failed request's 900 were given back, and /free charged nothing"
    );
    drop(get_at_most(&app, "/600", 700).await);
    settled().await;
    assert_eq!(
        status_at_most(&app, "/free", 401).await,
        StatusCode::TOO_MANY_REQUESTS
    );
    assert_eq!(
        status_at_most(&app, "/free", 400).await,
        StatusCode::OK,
        "600 committed"
    );
}

#[tokio::test]
async fn a_request_without_an_estimate_is_checked_with_the_prediction() {
    let app = app_reserving(client(1_000));
    for _ in 0..3 {
        assert_eq!(status_of(&app, "/free").await, StatusCode::OK);
    }
    let bad = Request::get("/free")
        .header("x-max-tokens", "lots")
        .body(Body::empty())
        .expect("a request");
    assert_eq!(
        app.clone().oneshot(bad).await.expect("answered").status(),
        StatusCode::OK
    );
}

#[tokio::test]
async fn a_cost_stated_in_a_trailer_is_charged_when_the_body_ends() {
    let reading = app_with_trailer(client(1_000));
    assert_eq!(status_of(&reading, "/trailer").await, StatusCode::OK);
    // 700 charged: one more is predicted at 700 + 3·350, over 1 000.
    assert_eq!(
        status_of(&reading, "/free").await,
        StatusCode::TOO_MANY_REQUESTS
    );

    let unread = app(client(1_000), false);
    assert_eq!(status_of(&unread, "/trailer").await, StatusCode::OK);
    assert_eq!(
        status_of(&unread, "/free").await,
        StatusCode::OK,
        "a layer not told of the trailer charges nothing"
    );
}

/// Three budgets on one request through the layer (per user, per
/// organisation, per model; docs/configuration.md#several-budgets-on-one-request):
/// each is reserved the request's estimate and settled at its cost on its
/// own, and a budget that cannot pay refuses the request and reserves
/// nothing of the others, to the token.
#[tokio::test]
async fn three_budgets_on_one_request_settle_and_refuse_each_on_its_own() {
    const YAML: &str = "
domain: ai
descriptors:
  - key: user
    rate_limit: {unit: hour, requests_per_unit: 2000, cost: after_response, initial_cost: 1}
  - key: org
    rate_limit: {unit: hour, requests_per_unit: 1500, cost: after_response, initial_cost: 1}
  - key: generic_key
    value: model
    rate_limit: {unit: hour, requests_per_unit: 3000, cost: after_response, initial_cost: 1}
";
    let config = charon::config::load_str(YAML, "ai.yaml")
        .unwrap_or_else(|errors| panic!("{errors}"))
        .config;
    let user = http::HeaderName::from_static("x-user");
    let org = http::HeaderName::from_static("x-org");
    let layer = CostLimitLayer::new(
        Client::embedded(config),
        "ai",
        Actions::new()
            .descriptor([Action::request_header(user, "user")])
            .descriptor([Action::request_header(org, "org")])
            .descriptor([Action::generic_key("model")]),
    )
    .estimate_header("x-max-tokens");
    let app = Router::new()
        .route(
            "/cost/{tokens}",
            get(
                |axum::extract::Path(tokens): axum::extract::Path<u64>| async move {
                    answered_with(tokens, StatusCode::OK)
                },
            ),
        )
        .layer(layer);
    let ask = |user: &'static str, org: &'static str, at_most: u64, cost: u64| {
        let app = app.clone();
        async move {
            let request = Request::get(format!("/cost/{cost}"))
                .header("x-user", user)
                .header("x-org", org)
                .header("x-max-tokens", at_most)
                .body(Body::empty())
                .expect("a request");
            let response = app.oneshot(request).await.expect("answered");
            let status = response.status();
            let _ = response.into_body().collect().await;
            settled().await;
            status
        }
    };
    // 600 reserved of each, 100 charged: 500 given back to each.
    assert_eq!(ask("alice", "acme", 600, 100).await, StatusCode::OK);
    // acme has 1 400 left: a request that needs 1 500 is refused, and bob
    // and the model are reserved nothing for it…
    assert_eq!(
        ask("bob", "acme", 1_500, 1_500).await,
        StatusCode::TOO_MANY_REQUESTS
    );
    // …so bob's 2 000 are whole: 1 500 of them now, through another org.
    assert_eq!(ask("bob", "omega", 1_500, 1_500).await, StatusCode::OK);
    assert_eq!(
        ask("bob", "zeta", 501, 1).await,
        StatusCode::TOO_MANY_REQUESTS
    );
    // The model has spent 100 + 1 500 (alice's 500 given back): 1 400
    // left, to the token. Refused by the model, carol and zeta are reserved
    // nothing: zeta's 1 500 still cover the 1 400 that fit.
    assert_eq!(
        ask("carol", "zeta", 1_401, 1).await,
        StatusCode::TOO_MANY_REQUESTS
    );
    assert_eq!(ask("carol", "zeta", 1_400, 1_400).await, StatusCode::OK);
    assert_eq!(
        ask("dave", "acme", 1, 1).await,
        StatusCode::TOO_MANY_REQUESTS
    );
}
