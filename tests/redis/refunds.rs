//! Refunds (Envoy 1.38's `is_negative_hits`) over gRPC, through the real
//! `charon serve` on the memory store, one Redis and a three-master Cluster:
//! a descriptor with `is_negative_hits` gives its hits back, never below 0,
//! never past the limit, and is always answered OK; a concurrency limit
//! (`max_hold`) pairs a refused hit with its refund.
//!
//! Every limit is per day, so a window that turns during a test is a
//! midnight (UTC) in the few seconds a store's checks take; a run that
//! crosses one asks again under fresh names.
#![cfg(all(unix, feature = "server"))]

use crate::support;

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::Entry;
use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitRequest;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::Code;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
use envoy_types::pb::google::protobuf::UInt64Value;
use support::redis::{RedisCluster, RedisServer};
use support::sidecar::{Sidecar, metric_value, tempdir, write_config};
use tonic::transport::Channel;

const CONFIG: &str = r#"domain: refunds
descriptors:
  - key: window
    rate_limit: {unit: day, requests_per_unit: 3}
  - key: sliding
    rate_limit: {unit: day, requests_per_unit: 3, algorithm: sliding_window}
  - key: log
    rate_limit: {unit: day, requests_per_unit: 3, algorithm: sliding_log}
  - key: bucket
    rate_limit: {unit: day, requests_per_unit: 3, algorithm: gcra}
  - key: shadow
    shadow_mode: true
    rate_limit: {unit: day, requests_per_unit: 3}
  - key: pair
    rate_limit: {unit: day, requests_per_unit: 2}
  - key: slots
    rate_limit: {unit: day, requests_per_unit: 2, max_hold: 60s}
  - key: brief
    rate_limit: {unit: day, requests_per_unit: 1, max_hold: 1s}
  - key: customer
    resource: api
resources:
  api:
    rate:
      tiers:
        - {limit: 2, window: 1d, active: forever}
"#;

/// The kinds that give hits back, each with a limit of 3 a day.
const KINDS: [&str; 4] = ["window", "sliding", "log", "bucket"];

fn day() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |since| since.as_secs() / 86_400)
}

fn descriptor(key: &str, value: &str, hits: u64, refund: bool) -> RateLimitDescriptor {
    RateLimitDescriptor {
        entries: vec![Entry {
            key: key.to_owned(),
            value: value.to_owned(),
        }],
        hits_addend: Some(UInt64Value { value: hits }),
        is_negative_hits: refund,
        ..Default::default()
    }
}

struct Asker {
    client: RateLimitServiceClient<Channel>,
}

impl Asker {
    async fn new(sidecar: &Sidecar) -> Asker {
        let client = RateLimitServiceClient::connect(sidecar.grpc_url())
            .await
            .unwrap_or_else(|error| panic!("cannot connect to the sidecar: {error}"));
        Asker { client }
    }

    async fn ask(&mut self, descriptors: Vec<RateLimitDescriptor>) -> &'static str {
        let request = RateLimitRequest {
            domain: "refunds".to_owned(),
            descriptors,
            hits_addend: 0,
        };
        let answer = tokio::time::timeout(
            Duration::from_secs(10),
            self.client.should_rate_limit(request),
        )
        .await
        .unwrap_or_else(|_| panic!("no answer within 10 s"))
        .unwrap_or_else(|status| panic!("gRPC error: {status:?}"))
        .into_inner();
        match Code::try_from(answer.overall_code) {
            Ok(Code::Ok) => "OK",
            Ok(Code::OverLimit) => "OVER_LIMIT",
            _ => "other",
        }
    }

    async fn hit(&mut self, key: &str, value: &str, hits: u64) -> &'static str {
        self.ask(vec![descriptor(key, value, hits, false)]).await
    }

    async fn refund(&mut self, key: &str, value: &str, hits: u64) -> &'static str {
        self.ask(vec![descriptor(key, value, hits, true)]).await
    }

    /// What the issue's checks answer for one kind, under names made of
    /// `run`.
    async fn checks(&mut self, kind: &str, run: &str) -> Vec<(&'static str, Vec<&'static str>)> {
        let mut seen = Vec::new();
        let name = format!("{run}-given-back");
        seen.push((
            "3 hits, a refund of 2, then three hits",
            vec![
                self.hit(kind, &name, 3).await,
                self.refund(kind, &name, 2).await,
                self.hit(kind, &name, 1).await,
                self.hit(kind, &name, 1).await,
                self.hit(kind, &name, 1).await,
            ],
        ));
        let name = format!("{run}-fresh");
        seen.push((
            "a refund of 5 on a fresh key, then four hits",
            vec![
                self.refund(kind, &name, 5).await,
                self.hit(kind, &name, 1).await,
                self.hit(kind, &name, 1).await,
                self.hit(kind, &name, 1).await,
                self.hit(kind, &name, 1).await,
            ],
        ));
        let name = format!("{run}-at-limit");
        seen.push((
            "3 hits, a 4th, a refund at the limit, of 0, of u64::MAX, then four hits",
            vec![
                self.hit(kind, &name, 3).await,
                self.hit(kind, &name, 1).await,
                self.refund(kind, &name, 1).await,
                self.refund(kind, &name, 0).await,
                self.refund(kind, &name, u64::MAX).await,
                self.hit(kind, &name, 1).await,
                self.hit(kind, &name, 1).await,
                self.hit(kind, &name, 1).await,
                self.hit(kind, &name, 1).await,
            ],
        ));
        seen
    }
}

fn expected() -> Vec<(&'static str, Vec<&'static str>)> {
    vec![
        (
            "3 hits, a refund of 2, then three hits",
            vec!["OK", "OK", "OK", "OK", "OVER_LIMIT"],
        ),
        (
            "a refund of 5 on a fresh key, then four hits",
            vec!["OK", "OK", "OK", "OK", "OVER_LIMIT"],
        ),
        (
            "3 hits, a 4th, a refund at the limit, of 0, of u64::MAX, then four hits",
            vec![
                "OK",
                "OVER_LIMIT",
                "OK",
                "OK",
                "OK",
                "OK",
                "OK",
                "OK",
                "OVER_LIMIT",
            ],
        ),
    ]
}

/// Runs every check on `sidecar`, again under new names if a day began
/// meanwhile.
async fn refunds_hold(sidecar: &Sidecar, store: &str) {
    let mut asker = Asker::new(sidecar).await;
    for attempt in 0..3 {
        let started = day();
        let mut failures = Vec::new();
        for kind in KINDS {
            let seen = asker.checks(kind, &format!("{store}-{attempt}")).await;
            if seen != expected() {
                failures.push(format!("{kind}: {seen:?}"));
            }
        }
        let run = format!("{store}-{attempt}");
        // The default counting: a refused hit records nothing, so a refund
        // after it frees a held one.
        let pair = vec![
            asker.hit("pair", &run, 1).await,
            asker.hit("pair", &run, 1).await,
            asker.hit("pair", &run, 1).await,
            asker.refund("pair", &run, 1).await,
            asker.hit("pair", &run, 1).await,
        ];
        if pair != ["OK", "OK", "OVER_LIMIT", "OK", "OK"] {
            failures.push(format!(
                "acquire, acquire, refused, release, acquire: {pair:?}"
            ));
        }
        // A concurrency limit: Envoy's refund of the refused hit pays what
        // it owes, not a held hit.
        let slots = vec![
            asker.hit("slots", &run, 1).await,
            asker.hit("slots", &run, 1).await,
            asker.hit("slots", &run, 1).await,
            asker.refund("slots", &run, 1).await,
            asker.hit("slots", &run, 1).await,
            asker.refund("slots", &run, 1).await,
            asker.refund("slots", &run, 1).await,
            asker.hit("slots", &run, 1).await,
            asker.hit("slots", &run, 1).await,
        ];
        let want = [
            "OK",
            "OK",
            "OVER_LIMIT",
            "OK",
            "OVER_LIMIT",
            "OK",
            "OK",
            "OK",
            "OVER_LIMIT",
        ];
        if slots != want {
            failures.push(format!("max_hold: {slots:?}"));
        }
        // Shadow mode counts hits, so it takes refunds: the 4th hit of 3 is
        // reported over (and let through) only without the refund.
        let shadow = format!("{run}-shadow");
        asker.hit("shadow", &shadow, 3).await;
        asker.refund("shadow", &shadow, 1).await;
        let shadowed = shadowed_before_after(sidecar, &mut asker, &shadow).await;
        if shadowed != (0.0, 1.0) {
            failures.push(format!(
                "shadow mode: shadow_mode hits went {shadowed:?} over two hits after a refund"
            ));
        }
        // Burst tiers cannot take hits back: a refund is answered OK and
        // changes nothing.
        let tiers = vec![
            asker.hit("customer", &run, 2).await,
            asker.refund("customer", &run, 1).await,
            asker.hit("customer", &run, 1).await,
        ];
        if tiers != ["OK", "OK", "OVER_LIMIT"] {
            failures.push(format!("burst tiers: {tiers:?}"));
        }
        // A hit never given back is held for max_hold, then counted.
        let brief = vec![
            asker.hit("brief", &run, 1).await,
            asker.hit("brief", &run, 1).await,
            asker.refund("brief", &run, 1).await,
            asker.hit("brief", &run, 1).await,
        ];
        if brief != ["OK", "OVER_LIMIT", "OK", "OVER_LIMIT"] {
            failures.push(format!("max_hold 1s, at once: {brief:?}"));
        }
        tokio::time::sleep(Duration::from_millis(1_100)).await;
        let after = asker.hit("brief", &run, 1).await;
        if after != "OK" {
            failures.push(format!("max_hold 1s, 1.1 s later: {after}"));
        }
        if day() != started {
            eprintln!("note: a day began during the checks on {store}; asking again");
            continue;
        }
        assert!(failures.is_empty(), "on {store}:\n{}", failures.join("\n"));
        let metrics = sidecar.metrics().await.unwrap_or_default();
        let refunded = metric_value(
            &metrics,
            "charon_limit_hits_total{namespace=\"refunds\",limit=\"refunds.window\",outcome=\"refunded\"}",
        );
        assert!(
            refunded.is_some_and(|hits| hits >= 8.0),
            "refunds are counted in charon_limit_hits_total: {refunded:?}"
        );
        let unreturned = metric_value(
            &metrics,
            "charon_limit_hits_total{namespace=\"refunds\",limit=\"refunds.brief\",outcome=\"unreturned\"}",
        );
        assert_eq!(
            unreturned,
            Some(1.0),
            "the hit held past max_hold is counted"
        );
        return;
    }
    panic!("three days began during the checks: the clock is wrong");
}

/// `shadow_mode` hits of the shadow limit after one more hit, then after
/// another: the first fits again thanks to the refund, the second does not.
async fn shadowed_before_after(sidecar: &Sidecar, asker: &mut Asker, name: &str) -> (f64, f64) {
    let count = async || {
        let metrics = sidecar.metrics().await.unwrap_or_default();
        metric_value(
            &metrics,
            "charon_limit_hits_total{namespace=\"refunds\",limit=\"refunds.shadow\",outcome=\"shadow_mode\"}",
        )
        .unwrap_or(0.0)
    };
    let before = count().await;
    assert_eq!(asker.hit("shadow", name, 1).await, "OK");
    let first = count().await - before;
    assert_eq!(asker.hit("shadow", name, 1).await, "OK");
    (first, count().await - before)
}

#[tokio::test]
async fn refunds_on_the_memory_store() {
    let dir = tempdir();
    let config = write_config(dir.path(), CONFIG);
    let sidecar = Sidecar::start(dir.path(), &config, "memory", &[]);
    sidecar.wait_serving().await;
    refunds_hold(&sidecar, "memory").await;
}

#[tokio::test]
async fn refunds_on_redis() {
    let redis = RedisServer::start();
    let dir = tempdir();
    let config = write_config(dir.path(), CONFIG);
    let sidecar = Sidecar::start(
        dir.path(),
        &config,
        &redis.url(),
        &["--store-timeout", "2s"],
    );
    sidecar.wait_serving().await;
    refunds_hold(&sidecar, "redis").await;
}

#[tokio::test]
async fn refunds_on_a_cluster() {
    let cluster = RedisCluster::start(3);
    let dir = tempdir();
    let config = write_config(dir.path(), CONFIG);
    let sidecar = Sidecar::start(
        dir.path(),
        &config,
        &cluster.url(),
        &["--store-timeout", "2s"],
    );
    sidecar.wait_serving().await;
    refunds_hold(&sidecar, "cluster").await;
}
