//! Traces as the people who run Charon collect them: Envoy Gateway starts
//! its rate-limit container as `ratelimit` with upstream's tracing
//! variables and an OTLP/HTTP collector (port 4318); `charon serve` sends
//! to an OTLP/gRPC collector, an OTLP/HTTP one, or both, each getting every
//! span; and a collector that is down costs no answer.

use std::time::{Duration, Instant};

use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::Entry;
use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitRequest;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::Code;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;

use super::support::otlp::{Collector, HttpCollector};
use super::support::redis::free_port;
use super::support::sidecar::{READY_TIMEOUT, Sidecar, tempdir, write_config};

const SPAN: &str = "envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit";

const CONFIG: &str = "domain: traced\ndescriptors:\n  - key: user\n    rate_limit: {unit: minute, requests_per_unit: 1000}\n";

/// Asks `n` times for a user of `domain`; every answer must be OK.
async fn ask(sidecar: &Sidecar, n: usize) {
    let mut client = RateLimitServiceClient::connect(sidecar.grpc_url())
        .await
        .expect("the sidecar accepts gRPC");
    for i in 0..n {
        let request = RateLimitRequest {
            domain: "traced".into(),
            descriptors: vec![RateLimitDescriptor {
                entries: vec![Entry {
                    key: "user".into(),
                    value: format!("u{i}"),
                }],
                ..Default::default()
            }],
            hits_addend: 1,
        };
        let answer = client
            .should_rate_limit(request)
            .await
            .unwrap_or_else(|status| panic!("request {i}: {status}\n{}", sidecar.log()))
            .into_inner();
        assert_eq!(answer.overall_code, Code::Ok as i32, "request {i}");
    }
}

/// Waits until `count()` reaches `want`, and a little longer to see that
/// it goes no further.
async fn until<F: std::future::Future<Output = usize>>(
    want: usize,
    mut count: impl FnMut() -> F,
    what: &str,
    sidecar: &Sidecar,
) {
    let deadline = Instant::now() + READY_TIMEOUT;
    loop {
        let got = count().await;
        if got >= want {
            assert_eq!(got, want, "{what}: one span per request");
            return;
        }
        assert!(
            Instant::now() < deadline,
            "{what}: {got} of {want} spans\n{}",
            sidecar.log()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn envoy_gateways_tracing_environment_reaches_an_otlp_http_collector() {
    let collector = HttpCollector::start().await;
    let dir = tempdir();
    let config = dir.path().join("data/ratelimit/config");
    std::fs::create_dir_all(&config).expect("the runtime directory");
    std::fs::write(config.join("traced.yaml"), CONFIG).expect("the config");
    let root = dir.path().join("data").display().to_string();
    let endpoint = collector.endpoint();
    // Envoy Gateway's variables (internal/infrastructure/kubernetes/
    // ratelimit/resource.go); it never sets TRACING_EXPORTER_PROTOCOL.
    let sidecar = Sidecar::start_as_ratelimit(
        dir.path(),
        &[
            ("RUNTIME_ROOT", root.as_str()),
            ("RUNTIME_SUBDIRECTORY", "ratelimit"),
            ("RUNTIME_WATCH_ROOT", "false"),
            ("USE_STATSD", "false"),
            ("TRACING_ENABLED", "true"),
            ("TRACING_SERVICE_NAME", "envoy-ratelimit"),
            ("TRACING_SERVICE_NAMESPACE", "envoy-gateway-system"),
            ("TRACING_SERVICE_INSTANCE_ID", "envoy-ratelimit-5d8c9-x7k2p"),
            ("TRACING_SAMPLING_RATE", "1.0"),
            ("OTEL_EXPORTER_OTLP_ENDPOINT", endpoint.as_str()),
        ],
    );
    sidecar.wait_serving().await;
    ask(&sidecar, 5).await;
    let spans = || async {
        collector
            .received()
            .await
            .into_iter()
            .filter(|received| received.span.name == SPAN)
            .count()
    };
    until(5, spans, "the OTLP/HTTP collector", &sidecar).await;
    let received = collector.received().await;
    let resource = &received[0].resource;
    assert_eq!(resource["service.name"], "envoy-ratelimit");
    assert_eq!(resource["service.namespace"], "envoy-gateway-system");
    assert_eq!(
        resource["service.instance.id"],
        "envoy-ratelimit-5d8c9-x7k2p"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn both_collectors_get_every_span_and_a_dead_one_costs_no_answer() {
    let grpc = Collector::default();
    let grpc_endpoint = grpc.start().await;
    let http = HttpCollector::start().await;
    let dir = tempdir();
    let config = write_config(dir.path(), CONFIG);
    let http_endpoint = http.endpoint();
    let sidecar = Sidecar::start(
        dir.path(),
        &config,
        "memory",
        &[
            "--otlp-endpoint",
            &grpc_endpoint,
            "--otlp-http-endpoint",
            &http_endpoint,
            "--trace-sample-ratio",
            "1",
            "--trace-service-name",
            "charon-edge",
        ],
    );
    sidecar.wait_serving().await;
    ask(&sidecar, 20).await;
    let grpc_spans = || async { grpc.spans().iter().filter(|span| span.name == SPAN).count() };
    until(20, grpc_spans, "the OTLP/gRPC collector", &sidecar).await;
    let http_spans = || async {
        http.received()
            .await
            .iter()
            .filter(|received| received.span.name == SPAN)
            .count()
    };
    until(20, http_spans, "the OTLP/HTTP collector", &sidecar).await;
    let received = http.received().await;
    assert_eq!(received[0].resource["service.name"], "charon-edge");
    // A random instance id, so that two replicas never look like one.
    assert_eq!(received[0].resource["service.instance.id"].len(), 32);

    // Nothing listens on either port: every request is still answered, and
    // the sidecar still stops when asked.
    let dead = format!("http://127.0.0.1:{}", free_port());
    let dir = tempdir();
    let config = write_config(dir.path(), CONFIG);
    let mut sidecar = Sidecar::start(
        dir.path(),
        &config,
        "memory",
        &[
            "--otlp-endpoint",
            &dead,
            "--otlp-http-endpoint",
            &dead,
            "--trace-sample-ratio",
            "1",
        ],
    );
    sidecar.wait_serving().await;
    ask(&sidecar, 200).await;
    assert!(sidecar.terminate().await.success(), "{}", sidecar.log());
}
