//! Envoy Gateway's dashboards on Charon (docs/envoy-compatibility.md#metrics):
//! Charon started as `ratelimit` with exactly the environment Envoy
//! Gateway gives its rate-limit container when Prometheus is on
//! (`USE_PROMETHEUS`, `PROMETHEUS_ADDR`, `PROMETHEUS_MAPPER_YAML` with its
//! `statsd_conf.yaml`, ports pointed at this test), limits over xDS shaped
//! as Envoy Gateway's translator shapes them (its domain and descriptor
//! names, a shadow-mode rule, `masked_remote_address`, a level below it),
//! multi-hit requests crossing the near-limit threshold and the limit, and
//! a real Prometheus scraping it every second. Every expression of Envoy
//! Gateway's "Global Ratelimit" dashboard (its Go runtime panel aside) and
//! every counter query of its observability page returns a series through
//! the query API, and the counters hold what upstream's rules give
//! (tests/fixtures/envoy-gateway/SOURCE.md says where the files come from).

use std::time::{Duration, Instant};

use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor as Descriptor;
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::Entry;
use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitRequest;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::Code;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
use envoy_types::pb::google::protobuf::Any;
use envoy_types::pb::ratelimit::config::ratelimit::v3::{
    RateLimitConfig, RateLimitDescriptor, RateLimitPolicy, RateLimitUnit,
};
use prost::Message;
use tonic::transport::{Certificate, Channel, ClientTlsConfig, Identity};

use super::super::envoy_e2e::free_ports;
use super::{ControlPlane, TYPE, certificates, start_ratelimit_with, until_status};
use crate::support::prometheus::Prometheus;

/// The listener Envoy Gateway names the domain after (the dashboard's
/// `$DefaultDomain`).
const DOMAIN: &str = "default/eg/http";
const FIXTURES: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/envoy-gateway");

/// A route's rule as Envoy Gateway's translator writes it: the route's
/// key with itself as value, and the rule's match below it.
fn route(name: &str) -> String {
    format!("httproute/default/{name}/rule/0/match/0/ratelimit_example")
}

fn level(key: &str, value: &str, below: Vec<RateLimitDescriptor>) -> RateLimitDescriptor {
    RateLimitDescriptor {
        key: key.into(),
        value: value.into(),
        descriptors: below,
        ..Default::default()
    }
}

/// A limit a year: its window (aligned to the epoch) ends once a year, so
/// a run of the test is not cut in two by a new window.
fn limited(key: &str, value: &str, per_year: u32, shadow: bool) -> RateLimitDescriptor {
    RateLimitDescriptor {
        key: key.into(),
        value: value.into(),
        rate_limit: Some(RateLimitPolicy {
            unit: RateLimitUnit::Year as i32,
            requests_per_unit: per_year,
            ..Default::default()
        }),
        shadow_mode: shadow,
        ..Default::default()
    }
}

fn gateway_limits() -> Any {
    let rule = "rule-0-match-0";
    let descriptors = vec![
        // The dashboard's own example.
        level(
            &route("http-ratelimit"),
            &route("http-ratelimit"),
            vec![limited(rule, rule, 10, false)],
        ),
        // A client CIDR (Envoy Gateway's e2e test queries its key2).
        level(
            &route("cidr-ratelimit"),
            &route("cidr-ratelimit"),
            vec![limited("masked_remote_address", "0.0.0.0/0", 3, false)],
        ),
        // A rule in shadow mode: over its limit, answered OK.
        level(
            &route("shadow-ratelimit"),
            &route("shadow-ratelimit"),
            vec![limited(rule, rule, 2, true)],
        ),
        // Three levels: the third folded into the first two's labels.
        level(
            &route("deep-ratelimit"),
            &route("deep-ratelimit"),
            vec![level(
                rule,
                rule,
                vec![limited("masked_remote_address", "192.168.0.0/16", 5, false)],
            )],
        ),
    ];
    Any {
        type_url: TYPE.into(),
        value: RateLimitConfig {
            name: DOMAIN.into(),
            domain: DOMAIN.into(),
            descriptors,
        }
        .encode_to_vec(),
    }
}

fn request(entries: &[(&str, &str)], hits: u32) -> RateLimitRequest {
    RateLimitRequest {
        domain: DOMAIN.into(),
        descriptors: vec![Descriptor {
            entries: entries
                .iter()
                .map(|(key, value)| Entry {
                    key: (*key).into(),
                    value: (*value).into(),
                })
                .collect(),
            ..Default::default()
        }],
        hits_addend: hits,
    }
}

/// Every PromQL of the dashboard (its Go runtime panel aside, which
/// Charon has no series for) with `$DefaultDomain` set, and every query of
/// the observability page, split into the counter queries and the
/// histogram-mapping ones (`_count`).
fn fixture_queries() -> (Vec<String>, Vec<String>) {
    let text = std::fs::read_to_string(format!("{FIXTURES}/global-ratelimit.json"))
        .expect("the dashboard fixture");
    let dashboard: serde_json::Value = serde_json::from_str(&text).expect("dashboard JSON");
    let mut exprs = Vec::new();
    let mut stack = vec![&dashboard];
    while let Some(value) = stack.pop() {
        match value {
            serde_json::Value::Object(map) => {
                if let Some(serde_json::Value::String(expr)) = map.get("expr") {
                    exprs.push(expr.replace("$DefaultDomain", DOMAIN));
                }
                stack.extend(map.values());
            }
            serde_json::Value::Array(items) => stack.extend(items),
            _ => {}
        }
    }
    assert!(exprs.len() >= 6, "{exprs:?}");
    exprs.retain(|expr| !expr.contains("go_memstats_"));
    let docs = std::fs::read_to_string(format!("{FIXTURES}/rate-limit-observability.md"))
        .expect("the docs fixture");
    let mut counters = Vec::new();
    let mut histograms = Vec::new();
    for block in docs.split("```promql\n").skip(1) {
        let query = block
            .split("```")
            .next()
            .unwrap_or_default()
            .trim()
            .to_owned();
        if query.contains("_count") {
            histograms.push(query);
        } else {
            counters.push(query);
        }
    }
    assert_eq!((counters.len(), histograms.len()), (5, 5), "{docs}");
    exprs.extend(counters);
    // Envoy Gateway's e2e checks.
    exprs.push(
        r#"ratelimit_service_rate_limit_over_limit{key2="masked_remote_address_0_0_0_0/0"}"#.into(),
    );
    (exprs, histograms)
}

#[tokio::test(flavor = "multi_thread")]
async fn envoy_gateways_dashboard_and_queries_read_charons_series() {
    let (exprs, histogram_queries) = fixture_queries();
    let dir = tempfile::tempdir().expect("temp dir");
    let tls = certificates(dir.path());
    let [grpc, port, xds, metrics, prometheus_port] = free_ports::<5>();
    let control = ControlPlane::new();
    control.push("1", vec![gateway_limits()]);
    let _server = control.serve(xds, Some(&tls)).await;
    // Envoy Gateway mounts its mapper from a ConfigMap at this path.
    let mapper = dir.path().join("etc/statsd-exporter/conf.yaml");
    std::fs::create_dir_all(mapper.parent().expect("a folder")).expect("mapper folder");
    std::fs::copy(format!("{FIXTURES}/statsd_conf.yaml"), &mapper).expect("mapper copied");
    let mut charon = start_ratelimit_with(
        dir.path(),
        &tls,
        [port, grpc, xds],
        &[
            ("USE_PROMETHEUS", "true".into()),
            ("PROMETHEUS_ADDR", format!(":{metrics}")),
            ("PROMETHEUS_MAPPER_YAML", mapper.display().to_string()),
        ],
    );
    let http = super::http_client();
    until_status(
        &http,
        &format!("http://127.0.0.1:{port}/healthcheck"),
        200,
        &mut charon,
    )
    .await;
    let prometheus = Prometheus::start(
        dir.path(),
        prometheus_port,
        &format!("127.0.0.1:{metrics}"),
        &[("app_kubernetes_io_component", "ratelimit")],
    )
    .await;

    let pem = |path: &std::path::Path| std::fs::read(path).expect("PEM");
    let channel = Channel::from_shared(format!("https://127.0.0.1:{grpc}"))
        .expect("url")
        .tls_config(
            ClientTlsConfig::new()
                .ca_certificate(Certificate::from_pem(pem(&tls.ca)))
                .identity(Identity::from_pem(pem(&tls.cert), pem(&tls.key)))
                .domain_name("localhost"),
        )
        .expect("client TLS")
        .connect()
        .await
        .expect("Charon's gRPC port over mutual TLS");
    let mut client = RateLimitServiceClient::new(channel);
    let rule = ("rule-0-match-0", "rule-0-match-0");
    let (http_route, cidr_route) = (route("http-ratelimit"), route("cidr-ratelimit"));
    let (shadow_route, deep_route) = (route("shadow-ratelimit"), route("deep-ratelimit"));
    let traffic = [
        // 10 a year, hits of 5, 4, 3, 1: 0→5, 5→9 (one past the near
        // threshold of 8), 9→12 (2 over, 1 near), 12→13 (1 over).
        (request(&[(&http_route, &http_route), rule], 5), Code::Ok),
        (request(&[(&http_route, &http_route), rule], 4), Code::Ok),
        (
            request(&[(&http_route, &http_route), rule], 3),
            Code::OverLimit,
        ),
        (
            request(&[(&http_route, &http_route), rule], 1),
            Code::OverLimit,
        ),
        // 3 a year (threshold 2), one hit at a time: the third near, the
        // fourth over.
        (
            request(
                &[
                    (&cidr_route, &cidr_route),
                    ("masked_remote_address", "0.0.0.0/0"),
                ],
                1,
            ),
            Code::Ok,
        ),
        (
            request(
                &[
                    (&cidr_route, &cidr_route),
                    ("masked_remote_address", "0.0.0.0/0"),
                ],
                1,
            ),
            Code::Ok,
        ),
        (
            request(
                &[
                    (&cidr_route, &cidr_route),
                    ("masked_remote_address", "0.0.0.0/0"),
                ],
                1,
            ),
            Code::Ok,
        ),
        (
            request(
                &[
                    (&cidr_route, &cidr_route),
                    ("masked_remote_address", "0.0.0.0/0"),
                ],
                1,
            ),
            Code::OverLimit,
        ),
        // 2 a year in shadow mode (threshold 1): the third is over, and OK.
        (
            request(&[(&shadow_route, &shadow_route), rule], 1),
            Code::Ok,
        ),
        (
            request(&[(&shadow_route, &shadow_route), rule], 1),
            Code::Ok,
        ),
        (
            request(&[(&shadow_route, &shadow_route), rule], 1),
            Code::Ok,
        ),
        // Three levels deep, 2 of 5.
        (
            request(
                &[
                    (&deep_route, &deep_route),
                    rule,
                    ("masked_remote_address", "192.168.0.0/16"),
                ],
                2,
            ),
            Code::Ok,
        ),
    ];
    for (n, (asked, expected)) in traffic.into_iter().enumerate() {
        let answer = client
            .should_rate_limit(asked)
            .await
            .expect("answered")
            .into_inner();
        assert_eq!(
            answer.overall_code, expected as i32,
            "request {n}: {answer:?}"
        );
    }

    // A plain GET, as Envoy Gateway's e2e helper sends: the classic text,
    // counters under their bare names, and the process's series.
    let scrape = http
        .get(format!("http://127.0.0.1:{metrics}/metrics"))
        .send()
        .await
        .expect("the metrics port answers");
    let content_type = scrape.headers()["content-type"]
        .to_str()
        .unwrap_or("")
        .to_owned();
    let text = scrape.text().await.expect("a body");
    assert!(
        content_type.starts_with("text/plain; version=0.0.4"),
        "{content_type}"
    );
    for line in [
        "# TYPE ratelimit_service_rate_limit_total_hits counter",
        "# TYPE ratelimit_service_response_time_seconds histogram",
        "# TYPE charon_decisions_total counter",
        "ratelimit_service_total_requests{grpc_method=\"ShouldRateLimit\"} 12",
    ] {
        assert!(text.lines().any(|l| l == line), "{line} in\n{text}");
    }
    assert!(
        !text.contains("total_hits_total") && !text.contains("# EOF"),
        "{text}"
    );
    assert!(
        text.lines()
            .any(|l| l.starts_with("process_resident_memory_bytes "))
    );

    // Through Prometheus: every query returns a series.
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let mut empty = Vec::new();
        for expr in &exprs {
            match prometheus.query(expr).await {
                Ok(series) if !series.is_empty() => {}
                Ok(_) => empty.push(expr.clone()),
                Err(error) => panic!("{error}"),
            }
        }
        if empty.is_empty() {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "no series for {empty:#?}\ntargets: {}\nprometheus log:\n{}",
            prometheus.targets().await,
            prometheus.log()
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    // The histogram-mapping queries find nothing, as against upstream:
    // statsd counters stay counters whatever the mapper's `timer_type`.
    for query in &histogram_queries {
        assert_eq!(prometheus.query(query).await, Ok(Vec::new()), "{query}");
    }

    // The counters hold what upstream's base limiter counts.
    let value = async |stat: &str, route: &str, key2: &str| -> String {
        let expr = format!(
            "ratelimit_service_rate_limit_{stat}{{domain=\"{DOMAIN}\",key1=\"{route}_{route}\",key2=\"{key2}\"}}"
        );
        let series = prometheus.query(&expr).await.expect("a query");
        match series.as_slice() {
            [(_, value)] => value.clone(),
            [] => "absent".into(),
            more => panic!("{expr}: {more:?}"),
        }
    };
    let rule2 = "rule-0-match-0_rule-0-match-0";
    for (route, key2, [total, within, near, over, shadow]) in [
        (&http_route, rule2, ["13", "9", "2", "3", "absent"]),
        (
            &cidr_route,
            "masked_remote_address_0_0_0_0/0",
            ["4", "3", "1", "1", "absent"],
        ),
        (&shadow_route, rule2, ["3", "2", "1", "1", "1"]),
        (&deep_route, rule2, ["2", "2", "absent", "absent", "absent"]),
    ] {
        let got = [
            value("total_hits", route, key2).await,
            value("within_limit", route, key2).await,
            value("near_limit", route, key2).await,
            value("over_limit", route, key2).await,
            value("shadow_mode", route, key2).await,
        ];
        assert_eq!(got, [total, within, near, over, shadow], "{route} {key2}");
    }
    let service = [
        ("ratelimit_service_total_requests", "12"),
        ("ratelimit_service_response_time_seconds_count", "12"),
        ("ratelimit_service_config_load_success", "1"),
        (
            "ratelimit_service_rate_limit_limit{key2=\"masked_remote_address_0_0_0_0/0\"}",
            "3",
        ),
    ];
    for (expr, expected) in service {
        let series = prometheus.query(expr).await.expect("a query");
        assert_eq!(
            series.iter().map(|(_, v)| v.as_str()).collect::<Vec<_>>(),
            [expected],
            "{expr}"
        );
    }
    // Charon's own gauge of each configured limit: the four of the domain.
    let limits = prometheus
        .query(&format!(
            "charon_limit_requests_per_unit{{namespace=\"{DOMAIN}\",unit=\"year\"}}"
        ))
        .await
        .expect("a query");
    let mut values: Vec<&str> = limits.iter().map(|(_, v)| v.as_str()).collect();
    values.sort_unstable();
    assert_eq!(values, ["10", "2", "3", "5"], "{limits:?}");
    // Envoy Gateway's mapper is followed whole: nothing logged against it.
    let log = std::fs::read_to_string(dir.path().join("ratelimit.log")).unwrap_or_default();
    assert!(log.contains("USE_STATSD is set but not used"), "{log}");
    assert!(!log.contains("PROMETHEUS_MAPPER_YAML"), "{log}");
    let _ = charon.pid();
}
