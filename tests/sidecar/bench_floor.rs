//! `examples/bench/rls_floor.rs`, the do-nothing rate limit service that
//! `scripts/bench-ab.sh` runs in the sidecar's place (`NEW_BIN`) to measure
//! the floor of the stack, still does what docs/performance.md says: it
//! takes `charon serve`'s flags, says ready on `/readyz`, answers OK, and
//! with `--store redis://…` makes one script call per request.
//!
//! The example's binary is built by `cargo build --examples`, which
//! `scripts/test.sh` runs before the tests.

use crate::support;

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use envoy_types::pb::envoy::extensions::common::ratelimit::v3::{
    RateLimitDescriptor, rate_limit_descriptor::Entry,
};
use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitRequest;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::Code;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
use support::KilledOnDrop;
use support::redis::{RedisServer, free_port};

/// Starts the floor server on `store` as bench-ab.sh does, waits for
/// `/readyz`, and asks `ShouldRateLimit` three times.
async fn three_answers(store: &str) -> Vec<i32> {
    let (grpc, admin) = (free_port(), free_port());
    let _floor = KilledOnDrop(
        Command::new(support::example_binary("rls_floor"))
            .args([
                "serve",
                "--config",
                "examples/bench/fixed.yaml",
                "--store",
                store,
            ])
            .args(["--grpc-addr", &format!("127.0.0.1:{grpc}")])
            .args(["--admin-addr", &format!("127.0.0.1:{admin}")])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("the floor server starts"),
    );
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        match reqwest::get(format!("http://127.0.0.1:{admin}/readyz")).await {
            Ok(response) if response.status().is_success() => break,
            _ if Instant::now() < deadline => tokio::time::sleep(Duration::from_millis(50)).await,
            other => panic!("the floor server never said ready: {other:?}"),
        }
    }
    let mut client = RateLimitServiceClient::connect(format!("http://127.0.0.1:{grpc}"))
        .await
        .expect("the floor server's gRPC port");
    let mut codes = Vec::new();
    for tenant in ["a", "b", "a"] {
        let request = RateLimitRequest {
            domain: "edge".into(),
            descriptors: vec![RateLimitDescriptor {
                entries: vec![Entry {
                    key: "tenant".into(),
                    value: tenant.into(),
                }],
                ..Default::default()
            }],
            hits_addend: 1,
        };
        let answer = client.should_rate_limit(request).await.expect("an answer");
        codes.push(answer.into_inner().overall_code);
    }
    codes
}

#[tokio::test]
async fn the_floor_server_answers_ok_on_memory() {
    assert_eq!(three_answers("memory").await, vec![Code::Ok as i32; 3]);
}

#[tokio::test]
async fn the_floor_server_makes_one_script_call_per_request_on_redis() {
    let redis = RedisServer::start();
    assert_eq!(three_answers(&redis.url()).await, vec![Code::Ok as i32; 3]);
    let stats = redis.command(&["INFO", "commandstats"]);
    // The first call finds no script (NOSCRIPT), loads it and calls again.
    let field = |name: &str| {
        stats
            .lines()
            .find_map(|line| line.strip_prefix("cmdstat_evalsha:"))
            .and_then(|fields| {
                fields
                    .split(',')
                    .find_map(|field| field.strip_prefix(name))
                    .and_then(|value| value.parse::<u64>().ok())
            })
            .unwrap_or(0)
    };
    assert_eq!(field("calls=") - field("failed_calls="), 3, "{stats}");
}
