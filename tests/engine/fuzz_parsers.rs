//! Hostile input for the parsers added since the first security pass: a
//! `RateLimitConfig` pushed over xDS (translated, then loaded), Boulder's
//! limit files (the marker, its defaults and overrides, and the id
//! formats), and RLQS usage reports on a live stream. Each must end in a
//! clear error, a namespace or an answer: never a panic, never a hang;
//! and an RLQS stream that was sent garbage still answers a good report.
//!
//! A short run is part of the test command (`CHARON_FUZZ_CASES`, as in
//! `fuzz.rs`, for a long one).
#![cfg(all(unix, feature = "server"))]

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use charon::client::Embedded;
use charon::server::metrics::Metrics;
use charon::server::rlqs::RlqsService;
use envoy_types::pb::envoy::service::rate_limit_quota::v3::rate_limit_quota_service_client::RateLimitQuotaServiceClient;
use envoy_types::pb::envoy::service::rate_limit_quota::v3::rate_limit_quota_service_server::RateLimitQuotaServiceServer;
use envoy_types::pb::envoy::service::rate_limit_quota::v3::rate_limit_quota_usage_reports::BucketQuotaUsage;
use envoy_types::pb::envoy::service::rate_limit_quota::v3::{BucketId, RateLimitQuotaUsageReports};
use envoy_types::pb::ratelimit::config::ratelimit::v3::{
    RateLimitConfig, RateLimitDescriptor, RateLimitPolicy, RateLimitReplace,
};
use proptest::prelude::*;

fn cases() -> u32 {
    std::env::var("CHARON_FUZZ_CASES")
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or(128)
}

/// What any one answer may take before it counts as a hang.
const HANG: Duration = Duration::from_secs(10);

/// Short and long, ASCII and not, empty, with the characters formats care
/// about.
fn text() -> impl Strategy<Value = String> + Clone {
    prop_oneof![
        Just(String::new()),
        "[a-z_]{1,12}",
        "[ -~]{0,24}",
        "\\PC{0,16}",
        Just("é\u{0}\u{202e}🔥".to_owned()),
        Just("x".repeat(70_000)),
        Just("*".to_owned()),
        Just("1.2.3.4".to_owned()),
        Just("2001:db8::/48".to_owned()),
    ]
}

fn descriptor(depth: u32) -> BoxedStrategy<RateLimitDescriptor> {
    let policy = (
        text(),
        any::<i32>(),
        any::<u32>(),
        any::<bool>(),
        prop::collection::vec(text(), 0..2),
    )
        .prop_map(
            |(name, unit, requests_per_unit, unlimited, replaces)| RateLimitPolicy {
                name,
                // Known units mostly, unknown numbers too.
                unit: unit.rem_euclid(9) - 1,
                requests_per_unit,
                unlimited,
                replaces: replaces
                    .into_iter()
                    .map(|name| RateLimitReplace { name })
                    .collect(),
            },
        );
    let leaf = (
        text(),
        text(),
        prop::option::of(policy),
        any::<(bool, bool, bool)>(),
    )
        .prop_map(
            |(key, value, rate_limit, (shadow_mode, detailed_metric, quota_mode))| {
                RateLimitDescriptor {
                    key,
                    value,
                    rate_limit,
                    shadow_mode,
                    detailed_metric,
                    quota_mode,
                    ..RateLimitDescriptor::default()
                }
            },
        );
    if depth == 0 {
        return leaf.boxed();
    }
    (leaf, prop::collection::vec(descriptor(depth - 1), 0..3))
        .prop_map(|(mut descriptor, children)| {
            descriptor.descriptors = children;
            descriptor
        })
        .boxed()
}

proptest! {
    #![proptest_config(ProptestConfig { cases: cases(), ..ProptestConfig::default() })]

    /// A pushed `RateLimitConfig` is written out and loaded as a file: a
    /// namespace or errors, whatever it holds.
    #[test]
    fn a_pushed_rate_limit_config_loads_or_is_refused(
        domain in text(),
        descriptors in prop::collection::vec(descriptor(3), 0..4),
    ) {
        let config = RateLimitConfig { name: "fuzz".into(), domain, descriptors };
        let text = charon::server::xds::translate::file_text(&config);
        prop_assert!(!text.is_empty());
        let _ = charon::config::load_str(&text, "xds:fuzz");
    }
}

/// A Boulder limit, as its files spell one: numbers, durations, garbage.
fn boulder_limit() -> impl Strategy<Value = String> + Clone {
    prop_oneof![
        (any::<i64>(), any::<i64>(), text()).prop_map(|(burst, count, period)| format!(
            "{{burst: {burst}, count: {count}, period: {period:?}}}"
        )),
        Just("{burst: 10, count: 10, period: 1s}".to_owned()),
        Just("{burst: 0, count: 0, period: 0s}".to_owned()),
        Just("[1, 2, 3]".to_owned()),
        Just("null".to_owned()),
        text().prop_map(|text| format!("{text:?}")),
    ]
}

fn boulder_names() -> impl Strategy<Value = String> + Clone {
    prop_oneof![
        Just("NewRegistrationsPerIPAddress".to_owned()),
        Just("NewRegistrationsPerIPv6Range".to_owned()),
        Just("NewOrdersPerAccount".to_owned()),
        Just("CertificatesPerDomain".to_owned()),
        Just("CertificatesPerFQDNSet".to_owned()),
        text(),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig { cases: cases(), ..ProptestConfig::default() })]

    /// Boulder's files, both override formats, written as a namespace's
    /// directory: loaded or refused, with the ids checked by their format.
    #[test]
    fn boulder_files_load_or_are_refused(
        defaults in prop::collection::vec((boulder_names(), boulder_limit()), 0..4),
        flat in prop::collection::vec((boulder_names(), text(), boulder_limit()), 0..4),
        listed in prop::collection::vec((boulder_names(), boulder_limit(), prop::collection::vec(text(), 0..3)), 0..3),
        as_list in any::<bool>(),
        junk in prop::option::of(text()),
    ) {
        let dir = tempfile::tempdir().expect("temp dir");
        std::fs::create_dir_all(dir.path().join("boulder")).expect("dir");
        let defaults: String = defaults
            .iter()
            .map(|(name, limit)| format!("{name:?}: {limit}\n"))
            .collect();
        let overrides: String = if as_list {
            listed
                .iter()
                .map(|(name, limit, ids)| {
                    let ids: String = ids.iter().map(|id| format!("{{id: {id:?}}}, ")).collect();
                    format!("- {name:?}: {{limit: {limit}, ids: [{ids}]}}\n")
                })
                .collect()
        } else {
            flat.iter()
                .map(|(name, id, limit)| format!("{:?}: {limit}\n", format!("{name}:{id}")))
                .collect()
        };
        let defaults = junk.clone().unwrap_or(defaults);
        std::fs::write(dir.path().join("boulder/defaults.yaml"), defaults).expect("write");
        std::fs::write(dir.path().join("boulder/overrides.yaml"), overrides).expect("write");
        std::fs::write(
            dir.path().join("acme.yaml"),
            "domain: acme-ca\nformat: boulder\ndefaults: boulder/defaults.yaml\noverrides: boulder/overrides.yaml\n",
        )
        .expect("write");
        let _ = charon::config::load_path(dir.path());
        for (name, id, _) in &flat {
            let _ = charon::config::boulder::canonical_id_for(name, id);
        }
    }
}

/// An RLQS face on the embedded engine, served once for every case.
fn rlqs_server() -> (&'static tokio::runtime::Runtime, SocketAddr) {
    static SERVER: OnceLock<(tokio::runtime::Runtime, SocketAddr)> = OnceLock::new();
    let (runtime, addr) = SERVER.get_or_init(|| {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .expect("a runtime");
        let addr = runtime.block_on(async {
            let config = charon::config::load_str(
                "domain: edge\ndescriptors:\n  - key: tenant\n    rate_limit: {unit: second, requests_per_unit: 10}\n",
                "edge.yaml",
            )
            .unwrap_or_else(|errors| panic!("{errors}"))
            .config;
            let engine = Embedded::memory(config);
            let service = RlqsService::new(engine.service().clone(), Arc::new(Metrics::new()));
            let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
                .await
                .expect("bind");
            let addr = listener.local_addr().expect("addr");
            tokio::spawn(async move {
                let _engine = engine;
                let _ = tonic::transport::Server::builder()
                    .add_service(RateLimitQuotaServiceServer::new(service))
                    .serve_with_incoming(tokio_stream::wrappers::TcpListenerStream::new(listener))
                    .await;
            });
            addr
        });
        (runtime, addr)
    });
    (runtime, *addr)
}

fn usage() -> impl Strategy<Value = BucketQuotaUsage> {
    (
        prop::collection::hash_map(text(), text(), 0..20),
        prop::option::of((any::<i64>(), any::<i32>())),
        any::<u64>(),
        any::<u64>(),
        any::<bool>(),
    )
        .prop_map(
            |(bucket, elapsed, allowed, denied, has_id)| BucketQuotaUsage {
                bucket_id: has_id.then_some(BucketId { bucket }),
                time_elapsed: elapsed.map(|(seconds, nanos)| {
                    envoy_types::pb::google::protobuf::Duration { seconds, nanos }
                }),
                num_requests_allowed: allowed,
                num_requests_denied: denied,
            },
        )
}

proptest! {
    #![proptest_config(ProptestConfig { cases: cases(), ..ProptestConfig::default() })]

    /// Garbage usage reports (any domain, bucket ids of any size, counts
    /// and times out of range) on one stream: the server never falls over,
    /// and a good report after them is still answered.
    #[test]
    fn rlqs_reports_are_answered_or_skipped_and_the_stream_goes_on(
        reports in prop::collection::vec(
            (prop_oneof![Just(String::new()), Just("edge".to_owned()), text()], prop::collection::vec(usage(), 0..6)),
            1..5,
        ),
    ) {
        let (runtime, addr) = rlqs_server();
        runtime.block_on(async {
            let mut client = RateLimitQuotaServiceClient::connect(format!("http://{addr}"))
                .await
                .expect("connects");
            let (sender, receiver) = tokio::sync::mpsc::channel(16);
            let mut answers = client
                .stream_rate_limit_quotas(tokio_stream::wrappers::ReceiverStream::new(receiver))
                .await
                .expect("a stream")
                .into_inner();
            // The first domain named is the stream's: the good report
            // speaks for edge only if the garbage named none or edge.
            let named = reports
                .iter()
                .map(|(domain, _)| domain.as_str())
                .find(|domain| !domain.is_empty())
                .is_some_and(|domain| domain != "edge");
            for (domain, usages) in reports {
                sender
                    .send(RateLimitQuotaUsageReports { domain, bucket_quota_usages: usages })
                    .await
                    .expect("the stream is open");
            }
            if named {
                return;
            }
            sender
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
                .expect("the stream is open");
            // Answers come for what had a limit; the good report's among them.
            let answered = tokio::time::timeout(HANG, async {
                while let Ok(Some(answer)) = answers.message().await {
                    if answer.bucket_action.iter().any(|action| {
                        action.bucket_id.as_ref().is_some_and(|id| {
                            id.bucket.get("tenant").map(String::as_str) == Some("acme")
                                && id.bucket.len() == 1
                        })
                    }) {
                        return true;
                    }
                }
                false
            })
            .await;
            assert_eq!(answered, Ok(true), "the stream went on");
        });
    }
}
