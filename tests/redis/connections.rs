//! One sidecar on Redis serving every family of state — rate limits, copy
//! holds, capacity leases and the configuration API's log — shares one
//! Redis client: Redis sees at most two connections from it (docs/redis.md,
//! "What each family keeps"), where one per family would be four.
#![cfg(all(unix, feature = "server"))]

use crate::support;

use std::time::Duration;

use charon::api::v1::{CapacityWant, GetCapacityRequest, RequestOp};
use support::redis::RedisServer;
use support::sidecar::{Sidecar, tempdir, write_config};

const CONFIG: &str = "
domain: shop
resources:
  api:
    rate:
      tiers:
        - {limit: 100, window: 1h, active: forever}
  seats:
    copies:
      domain_limit: 3
  backend:
    capacity: {capacity: 10, algorithm: fair_share, lease: 10s, refresh_interval: 1s}
";

/// The clients Redis has, but the `redis-cli` that asks.
fn sidecar_connections(redis: &RedisServer) -> Vec<String> {
    redis
        .command(&["CLIENT", "LIST"])
        .lines()
        .filter(|line| !line.contains("cmd=client|list"))
        .map(str::to_owned)
        .collect()
}

#[tokio::test]
async fn a_sidecar_serving_every_family_holds_at_most_two_redis_connections() {
    let redis = RedisServer::start();
    let dir = tempdir();
    let config = write_config(dir.path(), CONFIG);
    let sidecar = Sidecar::start(dir.path(), &config, &redis.url(), &[]);
    sidecar.wait_serving().await;
    let mut client = sidecar.client().await;

    // A rate decision.
    let rate = client
        .request(RequestOp {
            namespace: "shop".into(),
            resource: "api".into(),
            domain: "acme".into(),
            copies: None,
            min_copies: None,
        })
        .await
        .expect("a rate request is answered")
        .into_inner();
    assert_eq!(rate.granted, 1);
    // A copy hold, in a session.
    let mut session = sidecar.session().await;
    let (granted, _) = session.hold("shop", "seats", "acme", 2).await;
    assert_eq!(granted, 2);
    // A capacity lease.
    let lease = client
        .get_capacity(GetCapacityRequest {
            client_id: "worker-1".into(),
            resources: vec![CapacityWant {
                namespace: "shop".into(),
                resource: "backend".into(),
                domain: "acme".into(),
                wants: 4.0,
                has: 0.0,
                held_below: None,
            }],
        })
        .await
        .expect("a lease is answered")
        .into_inner();
    assert_eq!(lease.answers.len(), 1);
    // A configuration API write, which every sidecar reads from Redis.
    let status = sidecar
        .put_admin(
            "/v1/namespaces/shop/resources/api/domains/vip",
            r#"{"tiers": [{"limit": 5, "window": "1h"}]}"#,
        )
        .await;
    assert_eq!(status, 200);

    // Heartbeats, the reaper and the log's sync run on their own; give them
    // time to open whatever they would open.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let connections = sidecar_connections(&redis);
    assert!(
        !connections.is_empty() && connections.len() <= 2,
        "{} connections from one sidecar:\n{}",
        connections.len(),
        connections.join("\n")
    );
    // And they stay that way while it works on.
    for _ in 0..10 {
        let (granted, _) = session.hold("shop", "seats", "acme", 1).await;
        assert_eq!(granted, 1);
        session.release("shop", "seats", "acme", 1, &[]).await;
        let now = sidecar_connections(&redis);
        assert!(now.len() <= 2, "{}", now.join("\n"));
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    session.close();
}
