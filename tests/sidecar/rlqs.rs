//! Envoy's Rate Limit Quota Service on the real sidecar (memory store),
//! spoken by a gRPC client as Envoy's `rate_limit_quota` filter speaks it:
//! two streams reporting one bucket share its limit (fair share), the one
//! whose share shrank told at once, and one that leaves gives its share
//! back at once; an `unlimited`
//! descriptor is allowed all; a bucket no limit applies to, and a domain
//! that is no namespace, get no assignment and are counted, and the stream
//! goes on.

use std::collections::HashMap;
use std::time::Duration;

use envoy_types::pb::envoy::r#type::v3::rate_limit_strategy::{BlanketRule, Strategy};
use envoy_types::pb::envoy::service::rate_limit_quota::v3::rate_limit_quota_response::bucket_action::BucketAction as Action;
use envoy_types::pb::envoy::service::rate_limit_quota::v3::rate_limit_quota_service_client::RateLimitQuotaServiceClient;
use envoy_types::pb::envoy::service::rate_limit_quota::v3::rate_limit_quota_usage_reports::BucketQuotaUsage;
use envoy_types::pb::envoy::service::rate_limit_quota::v3::{
    BucketId, RateLimitQuotaResponse, RateLimitQuotaUsageReports,
};
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;

use crate::support::sidecar::{Sidecar, memory_sidecar, tempdir};

const CONFIG: &str = "
domain: edge
descriptors:
  - key: tenant
    rate_limit: {unit: second, requests_per_unit: 10}
  - key: internal
    rate_limit: {unlimited: true}
";

/// What a bucket was answered: tokens per second, allow all, deny all,
/// or abandoned.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Told {
    Tokens(u32),
    AllowAll,
    DenyAll,
    Abandoned,
}

/// One Envoy: a stream of reports and its answers.
struct Envoy {
    reports: mpsc::Sender<RateLimitQuotaUsageReports>,
    answers: tonic::Streaming<RateLimitQuotaResponse>,
    domain: String,
}

fn bucket(key: &str, value: &str) -> BucketId {
    BucketId {
        bucket: HashMap::from([(key.to_owned(), value.to_owned())]),
    }
}

impl Envoy {
    async fn connect(sidecar: &Sidecar, domain: &str) -> Envoy {
        let mut client = RateLimitQuotaServiceClient::connect(sidecar.grpc_url())
            .await
            .expect("connects");
        let (reports, receiver) = mpsc::channel(16);
        let answers = client
            .stream_rate_limit_quotas(ReceiverStream::new(receiver))
            .await
            .expect("a stream")
            .into_inner();
        Envoy {
            reports,
            answers,
            domain: domain.to_owned(),
        }
    }

    /// Reports `requests` of each bucket over one second.
    async fn report(&mut self, buckets: &[BucketId], requests: u64) {
        let usages = buckets
            .iter()
            .map(|id| BucketQuotaUsage {
                bucket_id: Some(id.clone()),
                time_elapsed: Some(envoy_types::pb::google::protobuf::Duration {
                    seconds: 1,
                    nanos: 0,
                }),
                num_requests_allowed: requests,
                num_requests_denied: 0,
            })
            .collect();
        let report = RateLimitQuotaUsageReports {
            domain: self.domain.clone(),
            bucket_quota_usages: usages,
        };
        self.reports.send(report).await.expect("the stream is open");
    }

    /// The next answer, per bucket's first entry value.
    async fn told(&mut self) -> Option<HashMap<String, Told>> {
        let next = tokio::time::timeout(Duration::from_secs(2), self.answers.message()).await;
        let answer = next.ok()?.expect("no stream error")?;
        Some(
            answer
                .bucket_action
                .into_iter()
                .map(|action| {
                    let id = action.bucket_id.unwrap_or_default();
                    let value = id.bucket.values().next().cloned().unwrap_or_default();
                    let told = match action.bucket_action {
                        Some(Action::AbandonAction(_)) => Told::Abandoned,
                        Some(Action::QuotaAssignmentAction(assigned)) => {
                            let ttl = assigned.assignment_time_to_live.unwrap_or_default();
                            assert!(ttl.seconds > 0, "a time to live");
                            match assigned.rate_limit_strategy.and_then(|s| s.strategy) {
                                Some(Strategy::TokenBucket(bucket)) => {
                                    // Tokens every 10 s, a bucket of a tenth of a
                                    // second's share, at least two tokens once the
                                    // demand is known, one before or while the
                                    // second's new tokens are spent
                                    // (docs/design.md#rlqs).
                                    let fill = bucket.fill_interval.unwrap_or_default();
                                    assert_eq!(fill.seconds, 10);
                                    let per_fill = bucket.tokens_per_fill.unwrap_or_default();
                                    let most = (per_fill.value / 100).max(2);
                                    assert!(
                                        (1..=most).contains(&bucket.max_tokens),
                                        "{} tokens of a share of {}",
                                        bucket.max_tokens,
                                        per_fill.value
                                    );
                                    Told::Tokens(per_fill.value / 10)
                                }
                                Some(Strategy::BlanketRule(rule))
                                    if rule == BlanketRule::DenyAll as i32 =>
                                {
                                    Told::DenyAll
                                }
                                Some(Strategy::BlanketRule(_)) => Told::AllowAll,
                                other => panic!("{other:?}"),
                            }
                        }
                        None => panic!("an action without a kind"),
                    };
                    (value, told)
                })
                .collect(),
        )
    }

    async fn told_one(&mut self) -> Told {
        let told = self.told().await.expect("an answer");
        assert_eq!(told.len(), 1, "{told:?}");
        told.into_values().next().expect("one")
    }
}

#[tokio::test]
async fn two_envoys_share_a_buckets_limit_and_a_leaver_gives_its_share_back() {
    let dir = tempdir();
    let sidecar = memory_sidecar(dir.path(), CONFIG).await;
    let acme = [bucket("tenant", "acme")];
    let mut a = Envoy::connect(&sidecar, "edge").await;
    let mut b = Envoy::connect(&sidecar, "edge").await;
    // A alone: the whole limit.
    a.report(&acme, 50).await;
    assert_eq!(a.told_one().await, Told::Tokens(10));
    // B joins: A is told its smaller share at once, without reporting,
    // and B gets the half A gave back.
    b.report(&acme, 50).await;
    assert_eq!(b.told_one().await, Told::Tokens(5));
    assert_eq!(a.told_one().await, Told::Tokens(5));
    // Another tenant is another bucket with a limit of its own; B's demand
    // there (3 a second, and a twentieth more) is all it asks for, and the rest,
    // which nobody wants, is lent to it.
    b.report(&[bucket("tenant", "globex")], 3).await;
    assert_eq!(b.told_one().await, Told::Tokens(10));
    // B goes away: A is told the whole limit again, at once.
    drop(b);
    assert_eq!(a.told_one().await, Told::Tokens(10));
}

#[tokio::test]
async fn buckets_without_a_limit_get_no_assignment_and_are_counted() {
    let dir = tempdir();
    let sidecar = memory_sidecar(dir.path(), CONFIG).await;
    let mut a = Envoy::connect(&sidecar, "edge").await;
    // An unlimited descriptor: allow all. No descriptor: nothing said.
    a.report(&[bucket("internal", "batch"), bucket("region", "eu")], 5)
        .await;
    let told = a.told().await.expect("an answer");
    assert_eq!(told, HashMap::from([("batch".to_owned(), Told::AllowAll)]));
    assert_eq!(
        sidecar
            .metric("charon_rlqs_buckets_total{outcome=\"no_limit\"}")
            .await,
        1.0
    );
    // A domain that is no namespace: no answer, counted, stream open.
    let mut stranger = Envoy::connect(&sidecar, "nowhere").await;
    stranger.report(&[bucket("tenant", "acme")], 5).await;
    stranger.report(&[bucket("tenant", "acme")], 5).await;
    assert_eq!(stranger.told().await, None);
    assert_eq!(
        sidecar
            .metric("charon_rlqs_buckets_total{outcome=\"unknown_domain\"}")
            .await,
        2.0
    );
    // The first stream still answers (its 5 a second and a twentieth more,
    // the rest of the 10 lent: nobody else wants any).
    a.report(&[bucket("tenant", "acme")], 5).await;
    assert_eq!(a.told_one().await, Told::Tokens(10));
}

/// On Redis the Envoys of every sidecar share one pool: an Envoy on
/// sidecar 2 joins one on sidecar 1, and within a few of their one-second
/// refreshes each holds half.
#[tokio::test]
async fn envoys_of_two_sidecars_share_a_bucket_on_redis() {
    use crate::support::redis::RedisServer;
    use crate::support::sidecar::write_config;

    let redis = RedisServer::start();
    let dir = tempdir();
    let config = write_config(dir.path(), CONFIG);
    let one = Sidecar::start(dir.path(), &config, &redis.url(), &[]);
    let two = Sidecar::start(dir.path(), &config, &redis.url(), &[]);
    one.wait_serving().await;
    two.wait_serving().await;
    let acme = [bucket("tenant", "acme")];
    let mut a = Envoy::connect(&one, "edge").await;
    a.report(&acme, 50).await;
    assert_eq!(a.told_one().await, Told::Tokens(10));
    let mut b = Envoy::connect(&two, "edge").await;
    b.report(&acme, 50).await;
    // Nothing is free until A's sidecar asks again for it.
    assert_eq!(b.told_one().await, Told::DenyAll);
    let settled = async {
        let mut last = (Told::Tokens(10), Told::DenyAll);
        while last != (Told::Tokens(5), Told::Tokens(5)) {
            // An answer names the one bucket; a quiet stream is no answer.
            let only = |told: Option<HashMap<String, Told>>| told?.into_values().next();
            tokio::select! {
                told = a.told() => last.0 = only(told).unwrap_or(last.0),
                told = b.told() => last.1 = only(told).unwrap_or(last.1),
            }
        }
    };
    assert!(
        tokio::time::timeout(Duration::from_secs(10), settled)
            .await
            .is_ok(),
        "the shares did not settle at half each"
    );
}

/// A bucket whose limit leaves the configuration is abandoned: Envoy falls
/// back to its own no-assignment behaviour (within a second of the reload).
#[tokio::test]
async fn a_bucket_whose_limit_is_removed_is_abandoned() {
    use crate::support::sidecar::write_config;

    let dir = tempdir();
    let sidecar = memory_sidecar(dir.path(), CONFIG).await;
    let mut a = Envoy::connect(&sidecar, "edge").await;
    a.report(&[bucket("tenant", "acme")], 5).await;
    assert_eq!(a.told_one().await, Told::Tokens(10));
    let without_tenants = "
domain: edge
descriptors:
  - key: internal
    rate_limit: {unlimited: true}
";
    write_config(dir.path(), without_tenants);
    let abandoned = async {
        loop {
            if let Some(told) = a.told().await
                && told.get("acme") == Some(&Told::Abandoned)
            {
                return;
            }
        }
    };
    assert!(
        tokio::time::timeout(Duration::from_secs(15), abandoned)
            .await
            .is_ok(),
        "the bucket was not abandoned"
    );
    assert_eq!(
        sidecar
            .metric("charon_rlqs_buckets_total{outcome=\"abandoned\"}")
            .await,
        1.0
    );
}

/// A bucket id past its bounds (a key or value over 1 024 bytes, more than
/// 16 entries) gets no assignment and is counted; the stream goes on, and
/// so do the other buckets of the same report.
#[tokio::test]
async fn an_oversized_bucket_id_is_refused_and_counted_and_the_stream_goes_on() {
    let dir = tempdir();
    let sidecar = memory_sidecar(dir.path(), CONFIG).await;
    let mut a = Envoy::connect(&sidecar, "edge").await;
    let huge = "x".repeat(1_000_000);
    let many = BucketId {
        bucket: (0..17)
            .map(|entry| (format!("k{entry}"), "v".to_owned()))
            .collect(),
    };
    a.report(
        &[bucket("tenant", &huge), many, bucket("tenant", "acme")],
        5,
    )
    .await;
    let told = a.told().await.expect("an answer");
    assert_eq!(told, HashMap::from([("acme".to_owned(), Told::Tokens(10))]));
    assert_eq!(
        sidecar
            .metric("charon_rlqs_buckets_total{outcome=\"too_large\"}")
            .await,
        2.0
    );
    // Just at the bound: assigned.
    a.report(&[bucket("tenant", &"y".repeat(1_024))], 5).await;
    assert_eq!(a.told_one().await, Told::Tokens(10));
}

/// The resident memory of `pid`, in KiB.
fn resident_kib(pid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|status| {
            status
                .lines()
                .find(|line| line.starts_with("VmRSS:"))
                .and_then(|line| line.split_whitespace().nth(1)?.parse().ok())
        })
        .unwrap_or(0)
}

/// 12 000 buckets in one report: 10 000 are assigned, the rest counted
/// (`too_many`) and left to Envoy's no-assignment behaviour; the sidecar's
/// memory grows by tens of MiB, not without bound (measured, debug build:
/// 34 MiB resident before, 64 after, about 3 KiB a bucket).
#[tokio::test]
async fn a_stream_holds_at_most_ten_thousand_buckets() {
    let dir = tempdir();
    let sidecar = memory_sidecar(dir.path(), CONFIG).await;
    let before = resident_kib(sidecar.pid());
    let mut a = Envoy::connect(&sidecar, "edge").await;
    let buckets: Vec<BucketId> = (0..12_000)
        .map(|tenant| bucket("tenant", &format!("tenant-{tenant}")))
        .collect();
    a.report(&buckets, 5).await;
    let told = a.told().await.expect("an answer");
    assert_eq!(told.len(), 10_000);
    assert_eq!(
        sidecar
            .metric("charon_rlqs_buckets_total{outcome=\"too_many\"}")
            .await,
        2_000.0
    );
    let after = resident_kib(sidecar.pid());
    eprintln!("resident: {before} KiB before, {after} KiB after");
    assert!(
        after.saturating_sub(before) < 64 * 1024,
        "{before} KiB before, {after} KiB after"
    );
    // The stream goes on.
    a.report(&[bucket("tenant", "tenant-1")], 5).await;
    assert!(a.told().await.is_some());
}
