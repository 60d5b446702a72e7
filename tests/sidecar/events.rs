//! Every face in the decision log, and the Charon API per domain: a sidecar
//! with `--decision-log-sample 1` logs the Charon API's operations (session
//! and unary), its cost calls and RLQS assignments beside
//! `ShouldRateLimit`, and counts the Charon API's operations per domain in
//! `charon_domain_operations_total`.

use std::collections::HashMap;
use std::time::Duration;

use charon::api::v1::charon_client::CharonClient;
use charon::api::v1::{CostRequest, RequestOp};
use envoy_types::pb::envoy::service::rate_limit_quota::v3::rate_limit_quota_service_client::RateLimitQuotaServiceClient;
use envoy_types::pb::envoy::service::rate_limit_quota::v3::rate_limit_quota_usage_reports::BucketQuotaUsage;
use envoy_types::pb::envoy::service::rate_limit_quota::v3::{BucketId, RateLimitQuotaUsageReports};
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;

use crate::support::sidecar::{Sidecar, eventually, tempdir, write_config};

const CONFIG: &str = "
domain: edge
descriptors:
  - key: tenant
    rate_limit: {unit: second, requests_per_unit: 10}
resources:
  seats:
    copies: {domain_limit: 2}
  api:
    rate:
      tiers:
        - {limit: 1, window: 1h, active: forever}
";

/// The decision log's events in `log` (JSON lines), as their fields.
fn decisions(log: &str) -> Vec<serde_json::Value> {
    log.lines()
        .filter_map(|line| serde_json::from_str::<serde_json::Value>(line).ok())
        .filter(|event| event["target"] == "charon::decision")
        .map(|event| event["fields"].clone())
        .filter(|fields| fields["message"] == "decision")
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_face_reaches_the_decision_log_and_the_api_is_counted_per_domain() {
    let dir = tempdir();
    let config = write_config(dir.path(), CONFIG);
    let sidecar = Sidecar::start(
        dir.path(),
        &config,
        "memory",
        &[
            "--log-format",
            "json",
            "--decision-log-sample",
            "1",
            "--decision-log-max-per-second",
            "1000",
        ],
    );
    sidecar.wait_readyz(200, "ready").await;

    // The Charon API: a session's reserve and release, unary requests.
    let mut session = sidecar.session().await;
    let (granted, groups) = session.hold("edge", "seats", "acme", 3).await;
    assert_eq!(granted, 2);
    session.release("edge", "seats", "acme", 2, &groups).await;
    let mut client: CharonClient<_> = sidecar.client().await;
    for domain in ["acme", "acme", "globex"] {
        client
            .request(RequestOp {
                namespace: "edge".into(),
                resource: "api".into(),
                domain: domain.into(),
                copies: None,
                min_copies: None,
            })
            .await
            .expect("answered");
    }
    // A cost call (its descriptor names no budget: answered, and logged).
    let _ = client
        .cost(CostRequest {
            namespace: "edge".into(),
            descriptors: vec![charon::api::v1::CostDescriptor {
                entries: vec![charon::api::v1::CostEntry {
                    key: "tenant".into(),
                    value: "acme".into(),
                }],
            }],
            op: Some(charon::api::v1::cost_request::Op::Reserve(
                charon::api::v1::CostReserve {
                    amount: 5,
                    ..Default::default()
                },
            )),
        })
        .await;

    // RLQS: one Envoy reports one bucket and is told its assignment.
    let mut rlqs = RateLimitQuotaServiceClient::connect(sidecar.grpc_url())
        .await
        .expect("connects");
    let (reports, receiver) = mpsc::channel(4);
    let mut answers = rlqs
        .stream_rate_limit_quotas(ReceiverStream::new(receiver))
        .await
        .expect("a stream")
        .into_inner();
    reports
        .send(RateLimitQuotaUsageReports {
            domain: "edge".into(),
            bucket_quota_usages: vec![BucketQuotaUsage {
                bucket_id: Some(BucketId {
                    bucket: HashMap::from([("tenant".to_owned(), "acme".to_owned())]),
                }),
                time_elapsed: None,
                num_requests_allowed: 1,
                num_requests_denied: 0,
            }],
        })
        .await
        .expect("sent");
    let answer = tokio::time::timeout(Duration::from_secs(5), answers.message()).await;
    assert!(matches!(answer, Ok(Ok(Some(_)))), "{answer:?}");

    // Per domain: acme's reserve, release and two requests (one rejected),
    // globex's request.
    let metrics = sidecar.metrics().await.expect("metrics");
    for line in [
        "charon_domain_operations_total{namespace=\"edge\",domain=\"acme\",operation=\"reserve\",outcome=\"ok\"} 1",
        "charon_domain_operations_total{namespace=\"edge\",domain=\"acme\",operation=\"release\",outcome=\"ok\"} 1",
        "charon_domain_operations_total{namespace=\"edge\",domain=\"acme\",operation=\"request\",outcome=\"ok\"} 1",
        "charon_domain_operations_total{namespace=\"edge\",domain=\"acme\",operation=\"request\",outcome=\"rejected\"} 1",
        "charon_domain_operations_total{namespace=\"edge\",domain=\"globex\",operation=\"request\",outcome=\"ok\"} 1",
    ] {
        assert!(metrics.contains(line), "{line}\n{metrics}");
    }

    // The log has an event of each face.
    let events = eventually(
        "the events in the log",
        Duration::from_secs(5),
        async || {
            let events = decisions(&sidecar.log());
            let has = |face: &str, operation: &str| {
                events
                    .iter()
                    .any(|event| event["face"] == face && event["operation"] == operation)
            };
            if has("charon_api", "reserve")
                && has("charon_api", "release")
                && has("charon_api", "request")
                && has("charon_api", "cost")
                && has("rlqs", "assign")
            {
                Ok(events)
            } else {
                Err(format!("{events:?}"))
            }
        },
    )
    .await;
    let reserve = events
        .iter()
        .find(|event| event["operation"] == "reserve")
        .expect("a reserve");
    assert_eq!(reserve["namespace"], "edge");
    assert_eq!(reserve["resource"], "seats");
    assert_eq!(reserve["domain"], "acme");
    assert_eq!(reserve["outcome"], "ok");
    assert_eq!(reserve["amount"], 2);
    let assigned = events
        .iter()
        .find(|event| event["face"] == "rlqs")
        .expect("an assignment");
    assert_eq!(assigned["resource"], "tenant=acme");
    assert_eq!(assigned["outcome"], "assigned");
    assert_eq!(assigned["amount"], 10);
}
