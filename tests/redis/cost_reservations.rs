//! Reservations on a token budget (`cost: after_response`), through the
//! Charon API's `Cost` call, by the Rust client, on two sidecars sharing one
//! `redis-server`: a reservation made on one sidecar is committed on the
//! other, after the first was killed; what does not fit is refused with a
//! wait; a settled reservation cannot be settled again; a refund gives back
//! within its window; an abandoned reservation is charged its estimate by
//! the store's clock; bad calls get their error kind and change nothing.
#![cfg(all(unix, feature = "server"))]

use crate::support;

use std::time::Duration;

use charon::client::{Client, ClientError, ClientOptions, ErrorKind, ReserveCost, Sidecar as Link};
use charon::limiter::Descriptor;
use support::redis::RedisServer;
use support::sidecar::{READY_TIMEOUT, Sidecar, eventually, tempdir, write_config};

const CONFIG: &str = "domain: ai
descriptors:
  - key: tenant
    rate_limit: {unit: hour, requests_per_unit: 1000, cost: after_response, initial_cost: 100, max_charge: 5000}
  - key: plain
    rate_limit: {unit: hour, requests_per_unit: 10}
";

/// A client of `sidecar` that fails closed, once the sidecar is ready.
pub(crate) async fn client_of(sidecar: &Sidecar) -> Client {
    let client = Client::with_options(
        Link::connect(&sidecar.grpc_url()).expect("a sidecar URL"),
        ClientOptions {
            fail_open: false,
            call_timeout: Duration::from_secs(5),
            ..ClientOptions::default()
        },
    );
    assert!(client.ready(READY_TIMEOUT).await, "{}", sidecar.log());
    client
}

fn tenant(name: &str) -> Vec<Descriptor> {
    vec![Descriptor::new([("tenant", name)])]
}

fn refused_kind(error: ClientError) -> ErrorKind {
    match error {
        ClientError::Refused { kind, .. } => kind,
        other => panic!("a refusal, not {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reservation_made_on_one_sidecar_is_committed_on_another() {
    let redis = RedisServer::start();
    let dir = tempdir();
    let config = write_config(dir.path(), CONFIG);
    let options = ["--store-timeout", "2s"];
    let mut first = Sidecar::start(dir.path(), &config, &redis.url(), &options);
    let second = Sidecar::start(dir.path(), &config, &redis.url(), &options);
    let (a, b) = (client_of(&first).await, client_of(&second).await);

    let held = a
        .reserve_cost(ReserveCost::new("ai", tenant("acme"), 600))
        .await
        .expect("answered");
    assert!(held.granted && !held.degraded, "{held:?}");
    assert_eq!(held.remaining, 400);
    let refused = b
        .reserve_cost(ReserveCost::new("ai", tenant("acme"), 500))
        .await
        .expect("answered");
    assert!(!refused.granted, "600 + 500 is over 1000: {refused:?}");
    assert!(refused.retry_after.is_some());
    let too_big = b
        .reserve_cost(ReserveCost::new("ai", tenant("acme"), 1_001))
        .await
        .expect("answered");
    assert_eq!(too_big.retry_after, None, "more than the limit never fits");

    // The sidecar that made it dies: the reservation is in Redis.
    first.kill();
    let id = held.id().to_owned();
    let committed = held.clone().commit(700).await.err();
    assert!(committed.is_some(), "its own sidecar is gone");
    let moved = rebind_id(&b, &id);
    let committed = moved
        .commit(700)
        .await
        .expect("committed on the other sidecar");
    assert!(committed.charged_at_ms > 0);
    let after = b
        .reserve_cost(ReserveCost::new("ai", tenant("acme"), 300))
        .await
        .expect("answered");
    assert!(after.granted, "700 charged, 300 fits exactly: {after:?}");
    after.cancel().await.expect("cancelled");
    assert_eq!(
        refused_kind(rebind_id(&b, &id).commit(1).await.unwrap_err()),
        ErrorKind::UnknownReservation,
        "settled once"
    );

    committed.refund(200).await.expect("refunded in its window");
    let room = b
        .reserve_cost(ReserveCost::new("ai", tenant("acme"), 500))
        .await
        .expect("answered");
    assert!(
        room.granted && room.remaining == 0,
        "1000 - 500 charged: {room:?}"
    );
    room.cancel().await.expect("cancelled");
}

/// The reservation `id` on acme's budget, settled through `client`.
fn rebind_id(client: &Client, id: &str) -> charon::client::CostReservation {
    charon::client::CostReservation::resume(client, "ai", tenant("acme"), id)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_abandoned_reservation_is_charged_its_estimate_when_it_expires() {
    let redis = RedisServer::start();
    let dir = tempdir();
    let config = write_config(dir.path(), CONFIG);
    let sidecar = Sidecar::start(
        dir.path(),
        &config,
        &redis.url(),
        &["--store-timeout", "2s"],
    );
    let client = client_of(&sidecar).await;
    let reserve = |name: &str, amount, release| {
        ReserveCost::new("ai", tenant(name), amount)
            .ttl(Duration::from_millis(300))
            .release_on_expiry(release)
    };
    let charged = client
        .reserve_cost(reserve("kept", 800, false))
        .await
        .unwrap();
    let released = client
        .reserve_cost(reserve("freed", 800, true))
        .await
        .unwrap();
    assert!(charged.granted && released.granted);
    let left = |name: &'static str| {
        let client = client.clone();
        async move {
            let probe = client
                .reserve_cost(ReserveCost::new("ai", tenant(name), 1))
                .await
                .map_err(|error| error.to_string())?;
            let remaining = probe.remaining;
            probe.cancel().await.map_err(|error| error.to_string())?;
            Ok::<u64, String>(remaining + 1)
        }
    };
    let kept_left = eventually(
        "the charged reservation expires",
        Duration::from_secs(20),
        async || match left("kept").await? {
            200 => Ok(200),
            other => Err(format!("{other} left")),
        },
    )
    .await;
    assert_eq!(kept_left, 200, "charged at its estimate");
    let freed_left = eventually(
        "the released one expires",
        Duration::from_secs(20),
        async || match left("freed").await? {
            1000 => Ok(1000),
            other => Err(format!("{other} left")),
        },
    )
    .await;
    assert_eq!(freed_left, 1000);
    assert_eq!(
        refused_kind(charged.commit(10).await.unwrap_err()),
        ErrorKind::UnknownReservation,
        "too late to commit"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_cost_calls_are_refused_with_their_kind() {
    let redis = RedisServer::start();
    let dir = tempdir();
    let config = write_config(dir.path(), CONFIG);
    let sidecar = Sidecar::start(
        dir.path(),
        &config,
        &redis.url(),
        &["--store-timeout", "2s"],
    );
    let client = client_of(&sidecar).await;
    let refusal = async |reserve: ReserveCost| match client.reserve_cost(reserve).await {
        Err(ClientError::Refused { kind, message }) => (kind, message),
        other => panic!("a refusal, not {other:?}"),
    };
    let (kind, message) = refusal(ReserveCost::new("ai", tenant("acme"), 0)).await;
    assert_eq!(kind, ErrorKind::Malformed, "{message}");
    let (kind, message) = refusal(ReserveCost::new("ai", tenant("acme"), 5_001)).await;
    assert_eq!(kind, ErrorKind::Malformed);
    assert!(message.contains("max_charge, 5000"), "{message}");
    let (kind, message) = refusal(ReserveCost::new("ai", tenant("acme"), u64::MAX)).await;
    assert_eq!(kind, ErrorKind::Malformed, "{message}");
    let (kind, message) = refusal(ReserveCost::new(
        "ai",
        vec![Descriptor::new([("plain", "x")])],
        1,
    ))
    .await;
    assert_eq!(kind, ErrorKind::Malformed);
    assert!(message.contains("cost: after_response"), "{message}");
    let (kind, _) = refusal(ReserveCost::new(
        "ai",
        vec![Descriptor::new([("nothing", "x")])],
        1,
    ))
    .await;
    assert_eq!(kind, ErrorKind::UnknownResource);
    let (kind, _) = refusal(ReserveCost::new("nowhere", tenant("acme"), 1)).await;
    assert_eq!(kind, ErrorKind::Malformed);
    let (kind, _) =
        refusal(ReserveCost::new("ai", tenant("acme"), 1).ttl(Duration::from_secs(7_200))).await;
    assert_eq!(kind, ErrorKind::Malformed);
    let (kind, _) = refusal(ReserveCost::new("ai", tenant(&"é".repeat(5_000)), 1)).await;
    assert_eq!(kind, ErrorKind::Malformed);
    for id in ["", "abc", "-1", "99999999999999999999"] {
        let error = rebind_id(&client, id).commit(1).await;
        // An empty id is nothing held by this client: a no-op.
        if id.is_empty() {
            assert!(error.is_ok());
            continue;
        }
        assert_eq!(
            refused_kind(error.unwrap_err()),
            ErrorKind::Malformed,
            "{id:?}"
        );
    }
    assert_eq!(
        refused_kind(rebind_id(&client, "12345").cancel().await.unwrap_err()),
        ErrorKind::UnknownReservation
    );
    // Nothing of that was recorded.
    let whole = client
        .reserve_cost(ReserveCost::new("ai", tenant("acme"), 1_000))
        .await
        .unwrap();
    assert!(whole.granted, "{whole:?}");
}
