//! What a user migrating from envoyproxy/ratelimit relies on, against the
//! real `charon serve` over gRPC and HTTP (docs/design.md#resets,
//! docs/envoy-compatibility.md): resets in whole
//! seconds that never tell a client to retry at once, the wait of a bulk
//! request, duplicate descriptors counted in order, upstream's config fields
//! (`quota_mode`, `metadata`, `detailed_metric`, `value_to_metric`) and
//! switches (shadow and quota modes, merged files, response headers,
//! dynamic metadata), `POST /json`, `/rlconfig`, gRPC health and reflection,
//! and settings from the environment.

use crate::support;

use std::collections::HashMap;
use std::process::Command;

use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::Entry;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::{Code, DescriptorStatus};
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
use envoy_types::pb::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};
use envoy_types::pb::google::protobuf::{UInt64Value, value::Kind};
use tonic::transport::Channel;

use support::sidecar::{Sidecar, eventually, memory_sidecar, tempdir, write_config};

async fn rls(sidecar: &Sidecar) -> RateLimitServiceClient<Channel> {
    RateLimitServiceClient::connect(sidecar.grpc_url())
        .await
        .expect("the sidecar accepts gRPC")
}

fn descriptor(entries: &[(&str, &str)], hits: Option<u64>) -> RateLimitDescriptor {
    RateLimitDescriptor {
        entries: entries
            .iter()
            .map(|(key, value)| Entry {
                key: (*key).to_owned(),
                value: (*value).to_owned(),
            })
            .collect(),
        hits_addend: hits.map(|value| UInt64Value { value }),
        ..Default::default()
    }
}

async fn ask(
    client: &mut RateLimitServiceClient<Channel>,
    domain: &str,
    descriptors: Vec<RateLimitDescriptor>,
) -> RateLimitResponse {
    client
        .should_rate_limit(RateLimitRequest {
            domain: domain.to_owned(),
            descriptors,
            hits_addend: 0,
        })
        .await
        .expect("a decision")
        .into_inner()
}

fn over(code: i32) -> bool {
    code == Code::OverLimit as i32
}

/// `duration_until_reset` in seconds; it must be whole.
fn reset_seconds(status: &DescriptorStatus) -> i64 {
    let reset = status
        .duration_until_reset
        .as_ref()
        .expect("a limited status says when it resets");
    assert_eq!(reset.nanos, 0, "Envoy reads whole seconds only");
    reset.seconds
}

#[tokio::test]
async fn resets_are_whole_seconds_rounded_up_and_never_zero_when_over() {
    let dir = tempdir();
    let sidecar = memory_sidecar(
        dir.path(),
        "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 1}\n  - key: m\n    rate_limit: {unit: minute, requests_per_unit: 100}\n",
    )
    .await;
    let mut client = rls(&sidecar).await;
    // A SECOND window ends within a second: its reset is 1, never 0.
    let mut rejected = None;
    for _ in 0..20 {
        let answer = ask(&mut client, "d", vec![descriptor(&[("k", "a")], None)]).await;
        assert_eq!(reset_seconds(&answer.statuses[0]), 1);
        if over(answer.overall_code) {
            rejected = Some(answer);
            break;
        }
    }
    let rejected = rejected.expect("a second request within one second is over");
    assert_eq!(rejected.statuses[0].limit_remaining, 0);
    let answer = ask(&mut client, "d", vec![descriptor(&[("m", "a")], None)]).await;
    let seconds = reset_seconds(&answer.statuses[0]);
    assert!((1..=60).contains(&seconds), "{seconds}");
}

#[tokio::test]
async fn zero_limits_and_bans_say_when() {
    let dir = tempdir();
    let sidecar = memory_sidecar(
        dir.path(),
        r#"
domain: d
descriptors:
  - key: zero
    rate_limit: {unit: minute, requests_per_unit: 0}
  - key: user
    resource: banned
resources:
  banned:
    rate:
      ban: {limit: 1, window: 1m, duration: 1h}
"#,
    )
    .await;
    let mut client = rls(&sidecar).await;
    let answer = ask(&mut client, "d", vec![descriptor(&[("zero", "a")], None)]).await;
    assert!(over(answer.overall_code));
    let seconds = reset_seconds(&answer.statuses[0]);
    assert!((1..=60).contains(&seconds), "the window's end: {seconds}");
    assert_eq!(answer.statuses[0].limit_remaining, 0);

    // One per minute; the request past it is let in and banned for an hour.
    for _ in 0..2 {
        let answer = ask(&mut client, "d", vec![descriptor(&[("user", "eve")], None)]).await;
        assert!(!over(answer.overall_code));
    }
    let answer = ask(&mut client, "d", vec![descriptor(&[("user", "eve")], None)]).await;
    assert!(over(answer.overall_code));
    let seconds = reset_seconds(&answer.statuses[0]);
    assert!(
        (3_590..=3_600).contains(&seconds),
        "when the ban lifts: {seconds}"
    );
}

#[tokio::test]
async fn a_bulk_request_that_cannot_fit_says_when_it_could() {
    bulk_requests("memory").await;
}

#[tokio::test]
async fn a_bulk_request_that_cannot_fit_says_when_it_could_on_redis() {
    let redis = support::redis::RedisServer::start();
    bulk_requests(&redis.url()).await;
}

/// A sidecar on `store` with `yaml`, ready.
async fn sidecar_on(dir: &std::path::Path, store: &str, yaml: &str, extra: &[&str]) -> Sidecar {
    let sidecar = Sidecar::start(dir, &write_config(dir, yaml), store, extra);
    let ready = if store == "memory" {
        "ready"
    } else {
        "ready: store reachable"
    };
    sidecar.wait_readyz(200, ready).await;
    sidecar
}

async fn bulk_requests(store: &str) {
    let dir = tempdir();
    let sidecar = sidecar_on(
        dir.path(),
        store,
        r#"
domain: d
descriptors:
  - key: k
    rate_limit: {unit: minute, requests_per_unit: 10}
  - key: bucket
    rate_limit: {algorithm: gcra, unit: minute, requests_per_unit: 60, burst: 10}
"#,
        &[],
    )
    .await;
    let mut client = rls(&sidecar).await;
    // More than the limit: it never fits; the window's end is reported.
    let answer = ask(&mut client, "d", vec![descriptor(&[("k", "a")], Some(11))]).await;
    assert!(over(answer.overall_code));
    assert_eq!(answer.statuses[0].limit_remaining, 0);
    assert!((1..=60).contains(&reset_seconds(&answer.statuses[0])));
    // One that crosses the limit: it fits in the next window.
    let answer = ask(&mut client, "d", vec![descriptor(&[("k", "a")], Some(6))]).await;
    assert!(!over(answer.overall_code));
    let answer = ask(&mut client, "d", vec![descriptor(&[("k", "a")], Some(6))]).await;
    assert!(over(answer.overall_code));
    assert_eq!(answer.statuses[0].limit_remaining, 0, "over: 0 left");
    assert!((1..=60).contains(&reset_seconds(&answer.statuses[0])));

    // A bucket of 10 refilling one per second: after 8, a request for 5
    // waits for three more tokens, 3 s; a request for 11 never fits.
    let answer = ask(
        &mut client,
        "d",
        vec![descriptor(&[("bucket", "a")], Some(8))],
    )
    .await;
    assert!(!over(answer.overall_code));
    let answer = ask(
        &mut client,
        "d",
        vec![descriptor(&[("bucket", "a")], Some(5))],
    )
    .await;
    assert!(over(answer.overall_code));
    let wait = reset_seconds(&answer.statuses[0]);
    assert!((2..=3).contains(&wait), "three tokens to wait for: {wait}");
    let answer = ask(
        &mut client,
        "d",
        vec![descriptor(&[("bucket", "b")], Some(11))],
    )
    .await;
    assert!(over(answer.overall_code));
    assert!(reset_seconds(&answer.statuses[0]) >= 1);
}

#[tokio::test]
async fn a_descriptor_twice_is_counted_in_order() {
    duplicates("memory").await;
}

#[tokio::test]
async fn a_descriptor_twice_is_counted_in_order_on_redis() {
    let redis = support::redis::RedisServer::start();
    duplicates(&redis.url()).await;
}

async fn duplicates(store: &str) {
    let dir = tempdir();
    let sidecar = sidecar_on(
        dir.path(),
        store,
        "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: hour, requests_per_unit: 20}\n",
        &[],
    )
    .await;
    let mut client = rls(&sidecar).await;
    let twice = vec![
        descriptor(&[("k", "a")], Some(11)),
        descriptor(&[("k", "a")], Some(11)),
    ];
    let answer = ask(&mut client, "d", twice).await;
    assert!(over(answer.overall_code));
    assert!(!over(answer.statuses[0].code), "the first 11 fit");
    assert!(over(answer.statuses[1].code), "the second crosses 20");
    assert_eq!(answer.statuses[1].limit_remaining, 0);
    // All or nothing: the rejected request consumed nothing.
    let answer = ask(&mut client, "d", vec![descriptor(&[("k", "a")], Some(20))]).await;
    assert!(!over(answer.overall_code));
}

const QUOTAS: &str = r#"
domain: q
descriptors:
  - key: service
    value: service_1
    quota_mode: true
    rate_limit: {unit: hour, requests_per_unit: 1}
  - key: service
    value: service_2
    quota_mode: true
    rate_limit: {unit: hour, requests_per_unit: 2}
  - key: service
    value: service_3
    quota_mode: true
    rate_limit: {unit: hour, requests_per_unit: 5}
  - key: plain
    rate_limit: {unit: hour, requests_per_unit: 1}
"#;

#[tokio::test]
async fn quota_descriptors_reject_only_together() {
    quotas("memory").await;
}

#[tokio::test]
async fn quota_descriptors_reject_only_together_on_redis() {
    let redis = support::redis::RedisServer::start();
    quotas(&redis.url()).await;
}

async fn quotas(store: &str) {
    let dir = tempdir();
    let sidecar = sidecar_on(dir.path(), store, QUOTAS, &[]).await;
    let mut client = rls(&sidecar).await;
    let both = || {
        vec![
            descriptor(&[("service", "service_1")], None),
            descriptor(&[("service", "service_2")], None),
        ]
    };
    // As upstream's integration test: 1 and 2 pass, 3 is over.
    let first = ask(&mut client, "q", both()).await;
    assert!(!over(first.overall_code));
    let second = ask(&mut client, "q", both()).await;
    assert!(!over(second.overall_code), "service_2 still has room");
    assert!(over(second.statuses[0].code), "service_1 says it is over");
    let third = ask(&mut client, "q", both()).await;
    assert!(over(third.overall_code), "every quota is over");
    // A descriptor that is not a quota rejects on its own.
    let plain = || {
        vec![
            descriptor(&[("plain", "x")], None),
            descriptor(&[("service", "service_3")], None),
        ]
    };
    assert!(!over(ask(&mut client, "q", plain()).await.overall_code));
    assert!(over(ask(&mut client, "q", plain()).await.overall_code));
}

#[tokio::test]
async fn quota_mode_for_the_whole_process() {
    let dir = tempdir();
    let sidecar = sidecar_on(
        dir.path(),
        "memory",
        "domain: q\ndescriptors:\n  - key: a\n    rate_limit: {unit: hour, requests_per_unit: 1}\n  - key: b\n    rate_limit: {unit: hour, requests_per_unit: 2}\n",
        &["--quota-mode"],
    )
    .await;
    let mut client = rls(&sidecar).await;
    let both = || {
        vec![
            descriptor(&[("a", "x")], None),
            descriptor(&[("b", "x")], None),
        ]
    };
    assert!(!over(ask(&mut client, "q", both()).await.overall_code));
    assert!(!over(ask(&mut client, "q", both()).await.overall_code));
    assert!(over(ask(&mut client, "q", both()).await.overall_code));
}

#[tokio::test]
async fn shadow_mode_for_the_whole_process_answers_ok_and_counts() {
    let dir = tempdir();
    let sidecar = sidecar_on(
        dir.path(),
        "memory",
        "domain: s\ndescriptors:\n  - key: k\n    rate_limit: {unit: hour, requests_per_unit: 1}\n",
        &["--shadow-mode", "--response-headers", "ratelimit"],
    )
    .await;
    let mut client = rls(&sidecar).await;
    ask(&mut client, "s", vec![descriptor(&[("k", "a")], None)]).await;
    let answer = ask(&mut client, "s", vec![descriptor(&[("k", "a")], None)]).await;
    assert!(!over(answer.overall_code), "shadow mode answers OK");
    assert!(over(answer.statuses[0].code), "the status still says over");
    let remaining = answer
        .response_headers_to_add
        .iter()
        .find(|h| h.key == "RateLimit-Remaining")
        .map(|h| h.value.as_str());
    assert_eq!(remaining, Some("0"));
    assert_eq!(
        sidecar
            .metric("charon_global_shadow_mode_total{namespace=\"s\"}")
            .await,
        1.0
    );
}

#[tokio::test]
async fn metadata_comes_back_as_dynamic_metadata_when_asked() {
    let dir = tempdir();
    let sidecar = sidecar_on(
        dir.path(),
        "memory",
        r#"
domain: m
descriptors:
  - key: service
    value: one
    metadata: {name: service_1, nested: {tier: gold, weight: 2}}
    rate_limit: {unit: hour, requests_per_unit: 1}
  - key: service
    value: two
    metadata: {name: service_2, other: true}
    rate_limit: {unit: hour, requests_per_unit: 5}
"#,
        &["--response-dynamic-metadata"],
    )
    .await;
    let mut client = rls(&sidecar).await;
    let both = || {
        vec![
            descriptor(&[("service", "one")], None),
            descriptor(&[("service", "two")], Some(2)),
        ]
    };
    let answer = ask(&mut client, "m", both()).await;
    let metadata = answer.dynamic_metadata.expect("dynamic metadata");
    let field = |s: &envoy_types::pb::google::protobuf::Struct, k: &str| {
        s.fields.get(k).and_then(|v| v.kind.clone())
    };
    assert_eq!(
        field(&metadata, "domain"),
        Some(Kind::StringValue("m".into()))
    );
    let Some(Kind::ListValue(descriptors)) = field(&metadata, "descriptors") else {
        panic!("descriptors are echoed: {metadata:?}");
    };
    let Some(Kind::StructValue(second)) = descriptors.values[1].kind.clone() else {
        panic!("a descriptor is a struct");
    };
    assert_eq!(field(&second, "hitsAddend"), Some(Kind::NumberValue(2.0)));
    let Some(Kind::ListValue(entries)) = field(&second, "entries") else {
        panic!("entries are echoed");
    };
    assert_eq!(
        entries.values[0].kind,
        Some(Kind::StringValue("service=two".into()))
    );
    let Some(Kind::StructValue(merged)) = field(&metadata, "metadata") else {
        panic!("matched metadata is merged: {metadata:?}");
    };
    // The first value of a key stays; maps merge; keys of both are there.
    assert_eq!(
        field(&merged, "name"),
        Some(Kind::StringValue("service_1".into()))
    );
    assert_eq!(field(&merged, "other"), Some(Kind::BoolValue(true)));
    let Some(Kind::StructValue(nested)) = field(&merged, "nested") else {
        panic!("nested maps stay maps");
    };
    assert_eq!(field(&nested, "weight"), Some(Kind::NumberValue(2.0)));
    // Over its limit, a descriptor's metadata is left out.
    let answer = ask(&mut client, "m", both()).await;
    let metadata = answer.dynamic_metadata.expect("dynamic metadata");
    let Some(Kind::StructValue(merged)) = field(&metadata, "metadata") else {
        panic!("service two still matched: {metadata:?}");
    };
    assert_eq!(
        field(&merged, "name"),
        Some(Kind::StringValue("service_2".into()))
    );

    // Without the switch there is none.
    let plain = memory_sidecar(&dir.path().join("plain"), {
        std::fs::create_dir_all(dir.path().join("plain")).expect("a directory");
        "domain: m\ndescriptors:\n  - key: service\n    metadata: {name: x}\n    rate_limit: {unit: hour, requests_per_unit: 1}\n"
    })
    .await;
    let mut client = rls(&plain).await;
    let answer = ask(
        &mut client,
        "m",
        vec![descriptor(&[("service", "a")], None)],
    )
    .await;
    assert!(answer.dynamic_metadata.is_none());
}

/// `charon serve --upstream-metrics` with a mapper file that is not
/// upstream's: what it changes is logged as not followed, its response
/// time's `scale` is, and upstream's series are on the admin port's
/// `/metrics`, in the classic text format for a plain GET.
#[tokio::test]
async fn another_mapper_is_read_and_what_it_changes_is_logged() {
    let dir = tempdir();
    let mapper = dir.path().join("mapper.yaml");
    std::fs::write(
        &mapper,
        "mappings:\n  - match: \"ratelimit_server.*.response_time\"\n    name: \"ratelimit_service_response_time_seconds\"\n    timer_type: histogram\n    scale: 0.001\n    labels:\n      grpc_method: \"$1\"\n  - match: \"ratelimit.service.rate_limit.*.*.*.total_hits\"\n    name: \"deep_hits\"\n",
    )
    .expect("mapper written");
    let mapper = mapper.display().to_string();
    let sidecar = sidecar_on(
        dir.path(),
        "memory",
        "domain: m\ndescriptors:\n  - key: tenant\n    rate_limit: {unit: hour, requests_per_unit: 5}\n",
        &["--upstream-metrics", "--upstream-metrics-mapper", &mapper],
    )
    .await;
    let mut client = rls(&sidecar).await;
    ask(
        &mut client,
        "m",
        vec![descriptor(&[("tenant", "a")], Some(2))],
    )
    .await;
    // A refund counts as upstream's PR #1140 counts it, and nowhere else.
    ask(
        &mut client,
        "m",
        vec![RateLimitDescriptor {
            is_negative_hits: true,
            ..descriptor(&[("tenant", "a")], Some(1))
        }],
    )
    .await;
    let log = sidecar.log();
    assert!(
        log.contains("\"deep_hits\" is not upstream's: not followed"),
        "{log}"
    );
    assert!(
        log.contains("is not in the file: exported all the same"),
        "{log}"
    );
    let text = sidecar.metrics().await.expect("/metrics");
    for line in [
        "# TYPE ratelimit_service_rate_limit_total_hits counter",
        "ratelimit_service_rate_limit_total_hits{domain=\"m\",key1=\"tenant\"} 2",
        "ratelimit_service_rate_limit_within_limit{domain=\"m\",key1=\"tenant\"} 2",
        "ratelimit_service_rate_limit_total_negative_hits{domain=\"m\",key1=\"tenant\"} 1",
        "ratelimit_service_rate_limit_limit{domain=\"m\",key1=\"tenant\"} 5",
        "ratelimit_service_config_load_success 1",
    ] {
        assert!(text.lines().any(|l| l == line), "{line} in\n{text}");
    }
    assert!(!text.contains("deep_hits"), "{text}");
}

/// `--response-deciding-limit`: the limit that decided, named in the
/// answer's dynamic metadata (docs/operations.md#which-limit-fired), over
/// its limit and within it, with no other metadata asked for.
#[tokio::test]
async fn the_deciding_limit_is_named_in_dynamic_metadata_when_asked() {
    let dir = tempdir();
    let sidecar = sidecar_on(
        dir.path(),
        "memory",
        r#"
domain: m
descriptors:
  - key: tenant
    rate_limit: {name: per-tenant, unit: hour, requests_per_unit: 1}
  - key: route
    rate_limit: {name: per-route, unit: minute, requests_per_unit: 100}
"#,
        &["--response-deciding-limit"],
    )
    .await;
    let mut client = rls(&sidecar).await;
    let both = || {
        vec![
            descriptor(&[("tenant", "acme")], None),
            descriptor(&[("route", "api")], None),
        ]
    };
    let field = |s: &envoy_types::pb::google::protobuf::Struct, k: &str| {
        s.fields.get(k).and_then(|v| v.kind.clone())
    };
    let deciding = |answer: &RateLimitResponse| {
        let metadata = answer.dynamic_metadata.clone().expect("dynamic metadata");
        assert!(field(&metadata, "descriptors").is_none(), "{metadata:?}");
        match field(&metadata, "decidingLimit") {
            Some(Kind::StructValue(deciding)) => deciding,
            other => panic!("decidingLimit: {other:?}"),
        }
    };
    // Within both: the one with the fewest hits left, as the headers pick.
    let first = deciding(&ask(&mut client, "m", both()).await);
    assert_eq!(
        field(&first, "name"),
        Some(Kind::StringValue("per-tenant".into()))
    );
    assert_eq!(
        field(&first, "key"),
        Some(Kind::StringValue("m.tenant".into()))
    );
    assert_eq!(field(&first, "overLimit"), Some(Kind::BoolValue(false)));
    // Over it: the one that refused.
    let answer = ask(&mut client, "m", both()).await;
    assert_eq!(answer.overall_code, Code::OverLimit as i32);
    let second = deciding(&answer);
    assert_eq!(
        field(&second, "name"),
        Some(Kind::StringValue("per-tenant".into()))
    );
    assert_eq!(field(&second, "overLimit"), Some(Kind::BoolValue(true)));
    assert_eq!(
        field(&second, "requestsPerUnit"),
        Some(Kind::NumberValue(1.0))
    );
    assert_eq!(
        field(&second, "unit"),
        Some(Kind::StringValue("HOUR".into()))
    );
}

#[tokio::test]
async fn detailed_metric_and_value_to_metric_shape_the_limit_label() {
    let dir = tempdir();
    let sidecar = memory_sidecar(
        dir.path(),
        r#"
domain: stats
descriptors:
  - key: plain
    rate_limit: {unit: hour, requests_per_unit: 5}
  - key: detailed
    detailed_metric: true
    rate_limit: {unit: hour, requests_per_unit: 5}
  - key: route
    value_to_metric: true
    descriptors:
      - key: method
        rate_limit: {unit: hour, requests_per_unit: 1}
"#,
    )
    .await;
    let mut client = rls(&sidecar).await;
    ask(
        &mut client,
        "stats",
        vec![descriptor(&[("plain", "x")], None)],
    )
    .await;
    ask(
        &mut client,
        "stats",
        vec![descriptor(&[("detailed", "x")], Some(3))],
    )
    .await;
    for _ in 0..2 {
        ask(
            &mut client,
            "stats",
            vec![descriptor(&[("route", "draw"), ("method", "GET")], None)],
        )
        .await;
    }
    let metric = async |limit: &str, outcome: &str| {
        sidecar
            .metric(&format!(
                "charon_limit_hits_total{{namespace=\"stats\",limit=\"{limit}\",outcome=\"{outcome}\"}}"
            ))
            .await
    };
    assert_eq!(metric("stats.plain", "within_limit").await, 1.0);
    assert_eq!(metric("stats.detailed_x", "within_limit").await, 3.0);
    assert_eq!(metric("stats.route_draw.method", "within_limit").await, 1.0);
    assert_eq!(metric("stats.route_draw.method", "over_limit").await, 1.0);
}

#[tokio::test]
async fn files_of_one_domain_merge_only_when_asked() {
    let dir = tempdir();
    let limits = dir.path().join("limits");
    std::fs::create_dir_all(&limits).expect("a directory");
    std::fs::write(
        limits.join("a.yaml"),
        "domain: shared\ndescriptors:\n  - key: a\n    rate_limit: {unit: hour, requests_per_unit: 1}\n",
    )
    .expect("written");
    std::fs::write(
        limits.join("b.yaml"),
        "domain: shared\ndescriptors:\n  - key: b\n    rate_limit: {unit: hour, requests_per_unit: 2}\n",
    )
    .expect("written");
    let refused = Command::new(env!("CARGO_BIN_EXE_charon"))
        .args(["serve", "--config"])
        .arg(&limits)
        .args(["--grpc-addr", "127.0.0.1:0", "--admin-addr", "127.0.0.1:0"])
        .output()
        .expect("charon runs");
    assert!(!refused.status.success());
    let stderr = String::from_utf8_lossy(&refused.stderr);
    assert!(
        stderr.contains("b.yaml") && stderr.contains("already defined"),
        "{stderr}"
    );

    let sidecar = Sidecar::start(dir.path(), &limits, "memory", &["--merge-domain-config"]);
    sidecar.wait_readyz(200, "ready").await;
    let mut client = rls(&sidecar).await;
    let answer = ask(
        &mut client,
        "shared",
        vec![
            descriptor(&[("a", "x")], None),
            descriptor(&[("b", "x")], None),
        ],
    )
    .await;
    let limits: Vec<u32> = answer
        .statuses
        .iter()
        .map(|s| s.current_limit.as_ref().map_or(0, |l| l.requests_per_unit))
        .collect();
    assert_eq!(limits, [1, 2]);
}

#[tokio::test]
async fn response_headers_upstream_names_and_ietf() {
    let dir = tempdir();
    let config = write_config(
        dir.path(),
        "domain: h\ndescriptors:\n  - key: k\n    rate_limit: {name: per-key, unit: hour, requests_per_unit: 2}\n  - key: wide\n    rate_limit: {unit: hour, requests_per_unit: 100}\n",
    );
    let upstream = Sidecar::start(
        dir.path(),
        &config,
        "memory",
        &[
            "--response-headers",
            "ratelimit",
            "--limit-header",
            "A-Ratelimit-Limit",
        ],
    );
    let ietf = Sidecar::start(
        dir.path(),
        &config,
        "memory",
        &["--response-headers", "ietf"],
    );
    upstream.wait_readyz(200, "ready").await;
    ietf.wait_readyz(200, "ready").await;
    let headers = |answer: &RateLimitResponse| -> HashMap<String, String> {
        answer
            .response_headers_to_add
            .iter()
            .map(|h| (h.key.clone(), h.value.clone()))
            .collect()
    };
    let mut client = rls(&upstream).await;
    let request = || {
        vec![
            descriptor(&[("wide", "x")], None),
            descriptor(&[("k", "a")], None),
        ]
    };
    let answer = ask(&mut client, "h", request()).await;
    let got = headers(&answer);
    // The descriptor with the fewest hits left decides.
    assert_eq!(got["A-Ratelimit-Limit"], "2");
    assert_eq!(got["RateLimit-Remaining"], "1");
    let reset: u64 = got["RateLimit-Reset"].parse().expect("seconds");
    assert!((1..=3_600).contains(&reset));

    let mut client = rls(&ietf).await;
    ask(&mut client, "h", request()).await;
    ask(&mut client, "h", request()).await;
    let answer = ask(&mut client, "h", request()).await;
    assert!(over(answer.overall_code));
    let got = headers(&answer);
    assert_eq!(got["ratelimit-policy"], r#""per-key";q=2;w=3600"#);
    let retry: u64 = got["retry-after"].parse().expect("seconds");
    assert_eq!(
        i64::try_from(retry).ok(),
        Some(reset_seconds(&answer.statuses[1])),
        "Retry-After is this request's own wait"
    );
    assert!(
        got["ratelimit"].starts_with(r#""per-key";r=0;t="#),
        "{got:?}"
    );
}

#[tokio::test]
async fn post_json_and_rlconfig_on_the_admin_port() {
    let dir = tempdir();
    let sidecar = memory_sidecar(
        dir.path(),
        "domain: j\ndescriptors:\n  - key: k\n    rate_limit: {unit: minute, requests_per_unit: 1}\n    descriptors:\n      - key: sub\n        shadow_mode: true\n        rate_limit: {unit: second, requests_per_unit: 5}\n",
    )
    .await;
    let http = reqwest::Client::new();
    let post = async |body: &str| {
        let response = http
            .post(sidecar.admin_url("/json"))
            .body(body.to_owned())
            .send()
            .await
            .expect("/json answers");
        let status = response.status().as_u16();
        (status, response.text().await.expect("a body"))
    };
    let request = r#"{"domain":"j","descriptors":[{"entries":[{"key":"k","value":"v"}]}]}"#;
    let (status, body) = post(request).await;
    assert_eq!(status, 200, "{body}");
    let json: serde_json::Value = serde_json::from_str(&body).expect("JSON");
    assert_eq!(json["overallCode"], "OK");
    assert_eq!(json["statuses"][0]["currentLimit"]["unit"], "MINUTE");
    let (status, body) = post(request).await;
    assert_eq!(status, 429, "{body}");
    let json: serde_json::Value = serde_json::from_str(&body).expect("JSON");
    assert_eq!(json["statuses"][0]["code"], "OVER_LIMIT");
    let reset = json["statuses"][0]["durationUntilReset"]
        .as_str()
        .expect("a duration");
    assert!(reset.ends_with('s') && reset != "0s", "{reset}");
    // A refund (`isNegativeHits`, Envoy 1.38) gives the hit back.
    let refund = r#"{"domain":"j","descriptors":[{"entries":[{"key":"k","value":"v"}],"isNegativeHits":true}]}"#;
    let (status, body) = post(refund).await;
    assert_eq!(status, 200, "{body}");
    let (status, body) = post(request).await;
    assert_eq!(status, 200, "the refunded hit is free again: {body}");
    // snake_case names and string numbers, as proto3 JSON allows.
    let (status, _) = post(
        r#"{"domain":"j","hits_addend":"1","descriptors":[{"entries":[{"key":"k","value":"w"}],"hits_addend":"0"}]}"#,
    )
    .await;
    assert_eq!(status, 200);
    for bad in [
        "",
        "}",
        r#"{"domain":"j","descriptors":[]}"#,
        r#"{"domain":"j","nope":1}"#,
    ] {
        let (status, body) = post(bad).await;
        assert_eq!(status, 400, "{bad:?} -> {body}");
        assert!(body.starts_with("bad request: "), "{body}");
    }

    let dump = reqwest::get(sidecar.admin_url("/rlconfig"))
        .await
        .expect("/rlconfig answers")
        .text()
        .await
        .expect("a body");
    assert_eq!(
        dump,
        "j.k: unit=MINUTE requests_per_unit=1, shadow_mode: false, quota_mode: false\n\
         j.k.sub: unit=SECOND requests_per_unit=5, shadow_mode: true, quota_mode: false\n"
    );
}

#[tokio::test]
async fn health_names_every_service_and_reflection_lists_them() {
    use tonic_health::pb::health_check_response::ServingStatus;
    use tonic_health::pb::{HealthCheckRequest, health_client::HealthClient};
    use tonic_reflection::pb::v1::ServerReflectionRequest;
    use tonic_reflection::pb::v1::server_reflection_client::ServerReflectionClient;
    use tonic_reflection::pb::v1::server_reflection_request::MessageRequest;
    use tonic_reflection::pb::v1::server_reflection_response::MessageResponse;

    let dir = tempdir();
    let sidecar = memory_sidecar(dir.path(), "domain: x\n").await;
    let channel = Channel::from_shared(sidecar.grpc_url())
        .expect("a URL")
        .connect()
        .await
        .expect("connects");
    let mut health = HealthClient::new(channel.clone());
    for service in [
        "",
        "envoy.service.ratelimit.v3.RateLimitService",
        "charon.v1.Charon",
    ] {
        let status = health
            .check(HealthCheckRequest {
                service: service.to_owned(),
            })
            .await
            .unwrap_or_else(|error| panic!("{service:?}: {error}"))
            .into_inner()
            .status;
        assert_eq!(status, ServingStatus::Serving as i32, "{service:?}");
    }

    let mut reflection = ServerReflectionClient::new(channel);
    let ask = |request: MessageRequest| {
        tokio_stream::iter([ServerReflectionRequest {
            host: String::new(),
            message_request: Some(request),
        }])
    };
    let mut answers = reflection
        .server_reflection_info(ask(MessageRequest::ListServices(String::new())))
        .await
        .expect("reflection answers")
        .into_inner();
    let answer = answers
        .message()
        .await
        .expect("a message")
        .expect("one answer");
    let Some(MessageResponse::ListServicesResponse(list)) = answer.message_response else {
        panic!("a service list: {answer:?}");
    };
    let names: Vec<String> = list.service.into_iter().map(|s| s.name).collect();
    for wanted in ["charon.v1.Charon", "grpc.health.v1.Health"] {
        assert!(names.iter().any(|n| n == wanted), "{wanted} in {names:?}");
    }
    let mut answers = reflection
        .server_reflection_info(ask(MessageRequest::FileContainingSymbol(
            "charon.v1.Charon".into(),
        )))
        .await
        .expect("reflection answers")
        .into_inner();
    let answer = answers
        .message()
        .await
        .expect("a message")
        .expect("one answer");
    assert!(
        matches!(
            answer.message_response,
            Some(MessageResponse::FileDescriptorResponse(ref files)) if !files.file_descriptor_proto.is_empty()
        ),
        "{answer:?}"
    );
}

#[tokio::test]
async fn every_serve_flag_reads_its_environment_variable() {
    let dir = tempdir();
    let config = write_config(
        dir.path(),
        "domain: e\ndescriptors:\n  - key: k\n    rate_limit: {unit: hour, requests_per_unit: 1}\n",
    );
    let (grpc, admin) = (support::redis::free_port(), support::redis::free_port());
    let mut child = Command::new(env!("CARGO_BIN_EXE_charon"))
        .arg("serve")
        .env("CHARON_CONFIG", &config)
        .env("CHARON_GRPC_ADDR", format!("127.0.0.1:{grpc}"))
        .env("CHARON_ADMIN_ADDR", format!("127.0.0.1:{admin}"))
        .env("CHARON_RESPONSE_HEADERS", "ratelimit")
        .env("CHARON_SHADOW_MODE", "1")
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("charon starts");
    let url = format!("http://127.0.0.1:{admin}/readyz");
    eventually(
        "the sidecar from the environment is ready",
        support::sidecar::READY_TIMEOUT,
        async || match reqwest::get(&url).await {
            Ok(response) if response.status().is_success() => Ok(()),
            Ok(response) => Err(response.status().to_string()),
            Err(error) => Err(error.to_string()),
        },
    )
    .await;
    let mut client = RateLimitServiceClient::connect(format!("http://127.0.0.1:{grpc}"))
        .await
        .expect("gRPC on CHARON_GRPC_ADDR");
    ask(&mut client, "e", vec![descriptor(&[("k", "a")], None)]).await;
    let answer = ask(&mut client, "e", vec![descriptor(&[("k", "a")], None)]).await;
    let _ = child.kill();
    let _ = child.wait();
    assert!(!over(answer.overall_code), "CHARON_SHADOW_MODE=1");
    assert!(
        answer
            .response_headers_to_add
            .iter()
            .any(|h| h.key == "RateLimit-Limit"),
        "CHARON_RESPONSE_HEADERS=ratelimit: {answer:?}"
    );
    // Every flag of `serve` names its variable in --help: Charon's own, but
    // for the xDS client's, which take envoyproxy/ratelimit's names.
    let help = Command::new(env!("CARGO_BIN_EXE_charon"))
        .args(["serve", "--help"])
        .output()
        .expect("help");
    let help = String::from_utf8_lossy(&help.stdout);
    let flags = help.matches("\n      --").count();
    let charon = help.matches("[env: CHARON_").count();
    let upstream = [
        "[env: CONFIG_GRPC_XDS_",
        "[env: XDS_CLIENT_",
        "[env: FORCE_START_",
    ]
    .iter()
    .map(|prefix| help.matches(prefix).count())
    .sum::<usize>();
    assert!(flags >= 19, "{help}");
    assert_eq!(upstream, 14, "the xDS flags' variables: {help}");
    assert_eq!(charon + upstream, flags, "{help}");
}

/// The per-limit counters after a scripted sequence: within, near (past 80%
/// of the limit), over, a `shadow_mode` limit over, and a namespace that
/// ignores its configuration.
#[tokio::test]
async fn every_outcome_is_counted_per_limit_in_hits() {
    let dir = tempdir();
    let sidecar = memory_sidecar(
        dir.path(),
        r#"
domain: seq
descriptors:
  - key: k
    rate_limit: {unit: hour, requests_per_unit: 5}
  - key: shadowed
    shadow_mode: true
    rate_limit: {unit: hour, requests_per_unit: 1}
"#,
    )
    .await;
    let mut client = rls(&sidecar).await;
    // 5 an hour: 4 hits within (the 5th hit is past 80%), then 3 over.
    for hits in [2, 2, 1, 3] {
        ask(
            &mut client,
            "seq",
            vec![descriptor(&[("k", "x")], Some(hits))],
        )
        .await;
    }
    // 1 an hour in shadow mode: within, then over but let through.
    for _ in 0..2 {
        ask(
            &mut client,
            "seq",
            vec![descriptor(&[("shadowed", "x")], None)],
        )
        .await;
    }
    let metric = async |limit: &str, outcome: &str| {
        sidecar
            .metric(&format!(
                "charon_limit_hits_total{{namespace=\"seq\",limit=\"{limit}\",outcome=\"{outcome}\"}}"
            ))
            .await
    };
    assert_eq!(metric("seq.k", "within_limit").await, 5.0);
    // The request that reached 5 of 5 (past 80%) counts as near, in hits.
    assert_eq!(metric("seq.k", "near_limit").await, 1.0);
    assert_eq!(metric("seq.k", "over_limit").await, 3.0);
    assert_eq!(metric("seq.shadowed", "within_limit").await, 1.0);
    assert_eq!(metric("seq.shadowed", "shadow_mode").await, 1.0);
}

#[tokio::test]
async fn ignore_configured_rejections_count_as_shadow() {
    let dir = tempdir();
    let sidecar = memory_sidecar(
        dir.path(),
        r#"
domain: quiet
settings:
  ignore_configured: true
descriptors:
  - key: k
    rate_limit: {unit: hour, requests_per_unit: 1}
"#,
    )
    .await;
    let mut client = rls(&sidecar).await;
    for _ in 0..3 {
        ask(&mut client, "quiet", vec![descriptor(&[("k", "x")], None)]).await;
    }
    let metric = async |outcome: &str| {
        sidecar
            .metric(&format!(
                "charon_limit_hits_total{{namespace=\"quiet\",limit=\"quiet.k\",outcome=\"{outcome}\"}}"
            ))
            .await
    };
    assert_eq!(metric("within_limit").await, 1.0);
    assert_eq!(metric("shadow_mode").await, 2.0);
    let metrics = sidecar.metrics().await.expect("/metrics");
    assert!(
        !metrics.contains("limit=\"quiet.k\",outcome=\"over_limit\""),
        "nothing is rejected: {metrics}"
    );
}

/// Past 10 000 distinct limit keys (a `detailed_metric` limit seeing new
/// values), new keys are counted under `limit="overflow"` and each fold is
/// counted: the metrics stay bounded whatever clients send.
#[tokio::test]
async fn limit_keys_past_the_cap_fold_into_overflow() {
    let dir = tempdir();
    let sidecar = memory_sidecar(
        dir.path(),
        "domain: fold\ndescriptors:\n  - key: user\n    detailed_metric: true\n    rate_limit: {unit: hour, requests_per_unit: 5}\n",
    )
    .await;
    let mut client = rls(&sidecar).await;
    // 40 requests of 256 descriptors: 10 240 distinct users.
    for batch in 0..40 {
        let descriptors = (0..256)
            .map(|i| descriptor(&[("user", &format!("u{}", batch * 256 + i))], None))
            .collect();
        ask(&mut client, "fold", descriptors).await;
    }
    let overflow = sidecar
        .metric("charon_limit_hits_total{namespace=\"fold\",limit=\"overflow\",outcome=\"within_limit\"}")
        .await;
    assert_eq!(overflow, 240.0);
    assert_eq!(
        sidecar.metric("charon_limit_series_folded_total").await,
        240.0
    );
    let metrics = sidecar.metrics().await.expect("/metrics");
    let series = metrics
        .lines()
        .filter(|line| line.starts_with("charon_limit_hits_total{namespace=\"fold\""))
        .count();
    assert_eq!(series, 10_001, "10 000 keys and the overflow");
}

/// `charon` started as upstream's container starts `/bin/ratelimit`: a link
/// named `ratelimit`, upstream's environment and nothing else.
fn start_as_ratelimit(dir: &std::path::Path, vars: &[(&str, String)]) -> std::process::Child {
    let link = dir.join("ratelimit");
    if !link.exists() {
        std::os::unix::fs::symlink(env!("CARGO_BIN_EXE_charon"), &link).expect("a link");
    }
    Command::new(&link)
        .env_clear()
        .envs(vars.iter().map(|(k, v)| (*k, v.as_str())))
        .stdout(std::fs::File::create(dir.join("ratelimit.log")).expect("log"))
        .stderr(std::fs::File::create(dir.join("ratelimit.err")).expect("log"))
        .spawn()
        .expect("ratelimit starts")
}

#[tokio::test]
async fn invoked_as_ratelimit_it_reads_upstreams_environment() {
    let dir = tempdir();
    let config_dir = dir.path().join("data/ratelimit/config");
    std::fs::create_dir_all(&config_dir).expect("runtime dir");
    std::fs::write(
        config_dir.join("ai.yaml"),
        "domain: ai\ndescriptors:\n  - key: generic_key\n    value: tokens\n    rate_limit: {unit: hour, requests_per_unit: 10000}\n",
    )
    .expect("config");
    let [port, grpc_port, metrics_port] = [
        support::redis::free_port(),
        support::redis::free_port(),
        support::redis::free_port(),
    ];
    // Envoy Gateway's variables (less TLS and Redis), pointed at this test.
    let vars = [
        (
            "RUNTIME_ROOT",
            dir.path().join("data").display().to_string(),
        ),
        ("RUNTIME_SUBDIRECTORY", "ratelimit".to_owned()),
        ("RUNTIME_IGNOREDOTFILES", "true".to_owned()),
        ("RUNTIME_WATCH_ROOT", "false".to_owned()),
        ("LOG_LEVEL", "info".to_owned()),
        ("USE_STATSD", "false".to_owned()),
        ("CONFIG_TYPE", "FILE".to_owned()),
        ("HOST", "127.0.0.1".to_owned()),
        ("PORT", port.to_string()),
        ("GRPC_HOST", "127.0.0.1".to_owned()),
        ("GRPC_PORT", grpc_port.to_string()),
        ("USE_PROMETHEUS", "true".to_owned()),
        ("PROMETHEUS_ADDR", format!("127.0.0.1:{metrics_port}")),
    ];
    let mut child = support::KilledOnDrop(start_as_ratelimit(dir.path(), &vars));
    let healthcheck = format!("http://127.0.0.1:{port}/healthcheck");
    eventually(
        "GET /healthcheck answers 200",
        std::time::Duration::from_secs(20),
        async || {
            if let Ok(Some(status)) = child.0.try_wait() {
                return Err(format!("exited: {status}"));
            }
            match reqwest::get(&healthcheck).await {
                Ok(reply) if reply.status() == 200 => Ok(()),
                Ok(reply) => Err(format!("status {}", reply.status())),
                Err(error) => Err(error.to_string()),
            }
        },
    )
    .await;
    let mut client = RateLimitServiceClient::connect(format!("http://127.0.0.1:{grpc_port}"))
        .await
        .expect("gRPC on GRPC_PORT");
    // Upstream's counting by default: the charge past the budget is
    // recorded, and the next check is refused.
    let mut codes = Vec::new();
    for hits in [0, 6_000, 6_000, 0] {
        let answer = ask(
            &mut client,
            "ai",
            vec![descriptor(&[("generic_key", "tokens")], Some(hits))],
        )
        .await;
        codes.push(over(answer.overall_code));
    }
    assert_eq!(codes, [false, false, true, true]);
    // Metrics on PROMETHEUS_ADDR, as Envoy Gateway's scrape expects them.
    let metrics = reqwest::get(format!("http://127.0.0.1:{metrics_port}/metrics"))
        .await
        .expect("metrics on PROMETHEUS_ADDR");
    assert_eq!(metrics.status(), 200);
    let text = metrics.text().await.expect("a body");
    assert!(text.contains("charon_"), "{text}");
    let log = std::fs::read_to_string(dir.path().join("ratelimit.log")).unwrap_or_default()
        + &std::fs::read_to_string(dir.path().join("ratelimit.err")).unwrap_or_default();
    assert!(
        log.contains("USE_STATSD is set but not used"),
        "each unused variable is named: {log}"
    );
    drop(child);

    // A value that cannot be honoured stops the start, naming the variable:
    // one upstream reads itself, and one read as a flag's environment.
    for (name, value) in [
        ("CONFIG_TYPE", "GRPC_XDS_DELTA"),
        ("XDS_CLIENT_BACKOFF_INITIAL_INTERVAL", "soon"),
    ] {
        let mut wrong = vars.to_vec();
        wrong.retain(|(kept, _)| *kept != name);
        wrong.push((name, value.to_owned()));
        let status = start_as_ratelimit(dir.path(), &wrong)
            .wait()
            .expect("exits");
        assert!(!status.success());
        let err = std::fs::read_to_string(dir.path().join("ratelimit.err")).unwrap_or_default();
        assert!(err.contains(name), "{err}");
    }
}
