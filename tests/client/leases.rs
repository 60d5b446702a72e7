//! Capacity leases through the Rust client (docs/design.md#capacity-leases),
//! on both backends: the embedded engine apportions exactly as a sidecar
//! does, and the background renewer works on either.
#![cfg(feature = "server")]

use crate::support;

use std::time::Duration;

use charon::api::v1::capacity_answer::Result as Answered;
use charon::api::v1::{CapacityRef, CapacityWant, GetCapacityRequest, ReleaseCapacityRequest};
use charon::client::lease::{LeaseOptions, LeaseRenewer};
use charon::client::{Client, ClientError, ErrorKind};
use support::sidecar::{memory_sidecar, sidecar_client, tempdir};

const CONFIG: &str = "
domain: jobs
resources:
  backend:
    capacity: {capacity: 100, algorithm: fair_share, lease: 60s, refresh_interval: 200ms, learning: 0s}
  search:
    rate:
      tiers:
        - {limit: 5, window: 1s}
";

/// What `client` is granted of `backend` for `acme`.
async fn lease(client: &Client, id: &str, wants: f64, has: f64) -> Result<f64, String> {
    let mut answer = client
        .get_capacity(GetCapacityRequest {
            client_id: id.into(),
            resources: vec![CapacityWant {
                namespace: "jobs".into(),
                resource: "backend".into(),
                domain: "acme".into(),
                wants,
                has,
                held_below: None,
            }],
        })
        .await
        .map_err(|error| error.to_string())?;
    match answer.answers.pop().and_then(|answer| answer.result) {
        Some(Answered::Lease(lease)) => Ok(lease.capacity),
        Some(Answered::Error(error)) => Err(error.message),
        None => Err("no answer".into()),
    }
}

/// Two clients converge to their fair shares; one releases, the other
/// gets everything; a rate resource is refused with the reason.
async fn leases_as_configured(client: &Client) -> Vec<Result<f64, String>> {
    let mut seen = vec![
        lease(client, "a", 100.0, 0.0).await,
        // a holds everything until it renews.
        lease(client, "b", 100.0, 0.0).await,
        lease(client, "a", 100.0, 100.0).await,
        lease(client, "b", 100.0, 0.0).await,
    ];
    let released = client
        .release_capacity(ReleaseCapacityRequest {
            client_id: "a".into(),
            resources: vec![CapacityRef {
                namespace: "jobs".into(),
                resource: "backend".into(),
                domain: "acme".into(),
            }],
        })
        .await
        .expect("a release is answered");
    assert_eq!(released.released, [true]);
    seen.push(lease(client, "b", 100.0, 50.0).await);
    let wrong_kind = client
        .get_capacity(GetCapacityRequest {
            client_id: "c".into(),
            resources: vec![CapacityWant {
                namespace: "jobs".into(),
                resource: "search".into(),
                domain: "acme".into(),
                wants: 1.0,
                has: 0.0,
                held_below: None,
            }],
        })
        .await
        .expect("answered per resource");
    assert!(
        matches!(
            &wrong_kind.answers[0].result,
            Some(Answered::Error(error)) if error.message.contains("not a leased capacity")
        ),
        "{wrong_kind:?}"
    );
    // No client id: the call itself is refused.
    let refused = client
        .get_capacity(GetCapacityRequest {
            client_id: String::new(),
            resources: Vec::new(),
        })
        .await;
    assert!(
        matches!(
            refused,
            Err(ClientError::Refused {
                kind: ErrorKind::Malformed,
                ..
            })
        ),
        "{refused:?}"
    );
    seen
}

#[tokio::test]
async fn the_embedded_engine_leases_capacity_as_a_sidecar_does() {
    let config = charon::config::load_str(CONFIG, "jobs.yaml")
        .expect("the test config loads")
        .config;
    let embedded = leases_as_configured(&Client::embedded(config)).await;
    assert_eq!(
        embedded,
        [Ok(100.0), Ok(0.0), Ok(50.0), Ok(50.0), Ok(100.0)],
        "fair shares, then everything once a releases"
    );
    let dir = tempdir();
    let sidecar = memory_sidecar(dir.path(), CONFIG).await;
    let remote = leases_as_configured(&sidecar_client(&sidecar).await).await;
    assert_eq!(remote, embedded);
}

#[tokio::test]
async fn a_renewer_on_the_embedded_engine_follows_its_lease() {
    let config = charon::config::load_str(CONFIG, "jobs.yaml")
        .expect("the test config loads")
        .config;
    let client = Client::embedded(config);
    let limiter = LeaseRenewer::spawn(
        client.clone(),
        LeaseOptions {
            initial_wants: 40.0,
            ..LeaseOptions::new("worker", "jobs", "backend", "acme")
        },
    );
    let mut rate = 0.0;
    for _ in 0..100 {
        rate = limiter.rate();
        if rate == 40.0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(rate, 40.0, "the renewer's first lease is what it wants");
    // Another client of the same engine sees that share taken.
    assert_eq!(lease(&client, "other", 100.0, 0.0).await, Ok(60.0));
}

/// The paper's safe capacity -1: with no server to answer, a client in
/// safe mode lets everything through; 0 lets nothing through.
#[tokio::test]
async fn a_safe_capacity_of_minus_one_means_no_limit_while_the_server_is_away() {
    // Nothing listens on port 1: every renewal fails.
    let away = || {
        charon::client::Client::with_options(
            charon::client::Sidecar::connect("http://127.0.0.1:1").expect("a url"),
            charon::client::ClientOptions {
                call_timeout: Duration::from_millis(50),
                ..Default::default()
            },
        )
    };
    let options = |safe: f64| LeaseOptions {
        safe_capacity: safe,
        retry_interval: Duration::from_millis(20),
        ..LeaseOptions::new("worker", "jobs", "backend", "acme")
    };
    let unlimited = LeaseRenewer::spawn(away(), options(-1.0));
    let forbidden = LeaseRenewer::spawn(away(), options(0.0));
    // Once the first renewal has failed, a thousand at once pass: no
    // bucket at any rate would hold them.
    let mut all = 0;
    for _ in 0..250 {
        all = (0..1_000)
            .filter(|_| unlimited.try_acquire(1).is_ok())
            .count();
        if all == 1_000 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(all, 1_000);
    assert!(forbidden.try_acquire(1).is_err());
}
