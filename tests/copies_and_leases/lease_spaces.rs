//! The lease states a server keeps for itself, beside a user's, on the
//! engine embedded in the process (docs/design.md#capacity-leases):
//!
//! - a user's names never meet the server's own: a capacity resource
//!   called `rlqs`, asked for under an RLQS bucket's name, and a domain
//!   called `global` beside a global limit each have a lease state of their
//!   own; a resource named under the prefix a global limit's shares are
//!   asked for is refused at load;
//! - an embedded engine renews its global shares as a sidecar does: beside
//!   a sidecar on one Redis, the two split a global limit instead of each
//!   admitting the whole of it.
#![cfg(all(unix, feature = "server"))]

use crate::support;

use std::time::Duration;

use charon::client::Embedded;
use charon::config::{Config, load_str};
use charon::limiter::{Descriptor, RateLimitRequest};
use charon::service::Service;
use charon::service::leases::quota::{Bucket, BucketAssignment, Demand};
use charon::service::ops::{CapacityWant, GetCapacity, ResourceKey};
use charon::store::ResourceRef;
use charon::store::copies::CopyTimings;
use charon::store::leases::{LeaseKey, LeaseSpace};
use charon::store::open::StoreOptions;
use support::redis::RedisServer;
use support::sidecar::{Sidecar, eventually, tempdir, write_config};

const CONFIG: &str = "
domain: edge
descriptors:
  - key: tenant
    rate_limit: {unit: second, requests_per_unit: 10}
  - key: route
    value: search
    rate_limit: {unit: second, requests_per_unit: 100, global: true}
resources:
  rlqs:
    capacity: {capacity: 50, algorithm: fair_share, lease: 10s, refresh_interval: 1s, learning: 0s}
  pool:
    capacity: {capacity: 30, algorithm: fair_share, lease: 10s, refresh_interval: 1s, learning: 0s}
";

/// The name a global limit's shares are asked for under.
const GLOBAL: &str = "rate_limit:route_search";

fn config() -> Config {
    load_str(CONFIG, "edge.yaml")
        .unwrap_or_else(|errors| panic!("{errors}"))
        .config
}

/// `client`'s lease of `resource` for `domain`, wanting `wants`.
async fn lease(service: &Service, client: &str, resource: &str, domain: &str, wants: f64) -> f64 {
    let request = GetCapacity::new(
        client.to_owned(),
        vec![CapacityWant {
            at: ResourceKey::new("edge", resource, domain),
            wants,
            has: 0.0,
            held_below: None,
        }],
    )
    .unwrap();
    let mut answers = service.get_capacity(&request).await;
    answers.remove(0).unwrap().capacity
}

/// The tokens an Envoy is assigned each second for `tenant=acme`.
async fn tokens(service: &Service, envoy: &str) -> u32 {
    let bucket = Bucket::new([("tenant".to_owned(), "acme".to_owned())]);
    match service
        .quota("edge", &bucket, envoy, Demand::Unknown)
        .await
        .unwrap()
        .0
    {
        BucketAssignment::Assigned {
            tokens_per_fill,
            fill_interval,
            ..
        } => tokens_per_fill / u32::try_from(fill_interval.as_secs().max(1)).unwrap_or(1),
        other => panic!("{other:?}"),
    }
}

#[tokio::test]
async fn a_users_names_never_meet_the_servers_own_lease_states() {
    let engine = Embedded::memory(config());
    let service = engine.service();
    // An Envoy takes the bucket `tenant=acme` (10 a second) whole.
    assert_eq!(tokens(service, "envoy-1").await, 10);
    // A capacity resource named `rlqs`, for a domain named as that bucket:
    // its own pool of 50, not a second client of the bucket's 10.
    assert_eq!(
        lease(service, "worker", "rlqs", "tenant=acme", 50.0).await,
        50.0
    );
    assert_eq!(tokens(service, "envoy-1").await, 10);
    // A domain named `global` beside a global limit: the resource's own 30.
    assert_eq!(lease(service, "worker", "pool", "global", 30.0).await, 30.0);
    let bucket = LeaseKey {
        space: LeaseSpace::RlqsBucket,
        at: ResourceRef {
            namespace: "edge",
            resource: "rlqs",
            domain: "tenant=acme",
        },
    };
    let usage = service.leases.store.usage(bucket).await.unwrap();
    assert_eq!((usage.clients, usage.held), (1, 10.0));
    let capacity = LeaseKey::capacity(ResourceRef {
        namespace: "edge",
        resource: "rlqs",
        domain: "tenant=acme",
    });
    let usage = service.leases.store.usage(capacity).await.unwrap();
    assert_eq!((usage.clients, usage.held), (1, 50.0));
    // A child server asks for the global limit's shares by its reserved
    // name, in the global limits' space: it finds the limit of 100, all of
    // it its own, the 60 it did not ask for lent (nobody else wants any).
    assert_eq!(
        lease(service, "region-a", GLOBAL, "global", 40.0).await,
        100.0
    );
}

#[test]
fn a_resource_named_under_the_global_limits_prefix_is_refused() {
    let loaded = load_str(
        "
domain: edge
resources:
  rate_limit:route_search:
    capacity: {capacity: 50, algorithm: fair_share}
",
        "edge.yaml",
    );
    let Err(errors) = loaded else {
        panic!("a resource under a reserved name loads");
    };
    let text = errors.to_string();
    assert!(text.contains("kept for global limits"), "{text}");
}

/// This engine's share of the global limit now.
/// The engine's share of the global limit, and how much of it is lent.
fn share(engine: &Embedded) -> (u64, u64) {
    let config = engine.service().config();
    let global = &config.namespace("edge").unwrap().globals[GLOBAL];
    let share = engine
        .service()
        .limiter
        .global_shares()
        .share("edge", GLOBAL, &global.limit);
    (share.requests_per_unit(), share.lent())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_embedded_engine_and_a_sidecar_on_one_redis_split_a_global_limit() {
    let redis = RedisServer::start();
    let dir = tempdir();
    let path = write_config(dir.path(), CONFIG);
    let sidecar = Sidecar::start(dir.path(), &path, &redis.url(), &[]);
    sidecar.wait_serving().await;
    let options = StoreOptions {
        url: redis.url(),
        ..Default::default()
    };
    let engine = Embedded::open(config(), &options, CopyTimings::default())
        .await
        .unwrap();
    // The engine is asked 40 times a second, the sidecar not at all.
    let limiter = engine.service().limiter.clone();
    let load = tokio::spawn(async move {
        let mut every = tokio::time::interval(Duration::from_millis(25));
        loop {
            every.tick().await;
            let request =
                RateLimitRequest::new("edge", vec![Descriptor::new([("route", "search")])]);
            let _ = limiter.should_rate_limit(request).await;
        }
    });
    // Until its first renewal the engine admits the whole limit, as it
    // would without `global`; once it renews beside the sidecar, its own
    // part follows its demand (40 a second and some headroom) and the rest
    // is lent to it, the only server that wants some: still 100, of which
    // 40 to 60 lent. An engine that never renewed would keep all 100 with
    // nothing lent, and so would the sidecar, which saw no other server.
    let (share, lent) = eventually(
        "the embedded engine's share follows its demand",
        Duration::from_secs(20),
        async || match share(&engine) {
            (share, lent @ 40..=60) => Ok((share, lent)),
            (share, lent) => Err(format!("share {share}, {lent} of it lent")),
        },
    )
    .await;
    load.abort();
    assert_eq!(share, 100, "{lent} lent");
}

#[tokio::test]
async fn an_embedded_engine_pushes_nudges_through_the_client() {
    use tokio_stream::StreamExt;
    let engine = Embedded::memory(config());
    let service = engine.service().clone();
    let client = charon::client::Client::new(engine);
    let Ok(mut nudges) = client.watch_capacity("region-a").await else {
        panic!("an embedded engine refused a watch");
    };
    assert!(service.leases.nudges.nudge("region-a"));
    let nudged = tokio::time::timeout(Duration::from_secs(5), nudges.next()).await;
    assert!(matches!(nudged, Ok(Some(Ok(())))));
    assert!(client.watch_capacity("").await.is_err());
}
