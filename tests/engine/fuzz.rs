//! Hostile input, generated: the configuration loader, Envoy's request
//! mapping, the Charon API's operations and the admin JSON endpoints take
//! structured garbage (wrong types, huge and negative numbers, empty and
//! oversized strings, unicode, deep nesting) and must answer with a clear
//! error or a decision: never a panic, never a hang. (The Redis reply codec
//! has its own target in `src/store/redis/codec.rs`.)
//!
//! A short run is part of the test command. The long run is opt-in:
//! `CHARON_FUZZ_CASES=1000000 cargo test --release --test engine fuzz::`.
#![cfg(all(unix, feature = "server"))]

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use axum::extract::ConnectInfo;
use charon::api::v1::session_request::Op;
use charon::api::v1::{ReleaseOp, RequestOp, ReserveOp, SeizeOp, TransferOp};
use charon::client::{Backend, Embedded};
use charon::server::admin::{self, AdminState, access::Access, state::StateSources};
use charon::server::metrics::Metrics;
use charon::server::rls::{RlsOptions, RlsService};
use charon::store::open::SidecarStore;
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::{
    Entry, RateLimitOverride,
};
use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitRequest;
use envoy_types::pb::google::protobuf::UInt64Value;
use proptest::prelude::*;
use tower::ServiceExt;

/// Cases per target: `CHARON_FUZZ_CASES`, else a short run.
fn cases() -> u32 {
    std::env::var("CHARON_FUZZ_CASES")
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or(256)
}

/// What any one answer may take before it counts as a hang.
const HANG: Duration = Duration::from_secs(10);

const CONFIG: &str = r#"
domain: fuzz
descriptors:
  - key: tenant
    rate_limit: {unit: second, requests_per_unit: 5}
    descriptors:
      - key: path
        value: "/api/*"
        rate_limit: {unit: minute, requests_per_unit: 100, name: api}
  - key: customer
    resource: api
resources:
  api:
    rate:
      hard_limit: 50
      global_limit: 500
      tiers:
        - {limit: 10, window: 1s, active: forever}
        - {limit: 20, window: 1s, active: 5s, cooldown: 10s}
  seats:
    copies: {domain_limit: 3, global_limit: 10, groups: [{name: g, limit: 4, domains: [acme]}]}
"#;

fn config() -> charon::config::Config {
    charon::config::load_str(CONFIG, "fuzz.yaml")
        .expect("the fuzz config loads")
        .config
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a runtime")
}

/// Strings as an attacker sends them: names the configuration knows,
/// empty, unicode, control characters, and over the 4096-byte cap.
fn text() -> impl Strategy<Value = String> + Clone {
    prop_oneof![
        3 => prop::sample::select(vec![
            "fuzz", "tenant", "path", "customer", "api", "seats", "acme", "g", "/api/x", "",
        ])
        .prop_map(str::to_owned),
        2 => "\\PC{0,12}",
        1 => "[\\x00-\\x1f{}*]{0,6}",
        1 => (4090usize..4200).prop_map(|n| "x".repeat(n)),
    ]
}

/// Counts anywhere in their type's range, edges included.
fn number() -> impl Strategy<Value = i64> + Clone {
    prop_oneof![
        -3i64..12,
        Just(i64::MAX),
        Just(i64::MIN),
        Just(1_000_000_001),
        any::<i64>(),
    ]
}

// ---------------------------------------------------------------------------
// The configuration loader

/// YAML-ish documents: the configuration's own keys, nested at random,
/// with values of every type.
fn yaml_value(depth: u32) -> BoxedStrategy<String> {
    let leaf = prop_oneof![
        number().prop_map(|n| n.to_string()),
        text().prop_map(|t| format!("{t:?}")),
        prop::sample::select(vec![
            "forever",
            "1s",
            "0s",
            "-1s",
            "99999999999h",
            "true",
            "null",
            "~",
            "minute",
            "[]",
            "{}",
            "&a x",
            "*a",
            "!!binary aGk=",
        ])
        .prop_map(str::to_owned),
    ];
    if depth == 0 {
        return leaf.boxed();
    }
    let key = prop::sample::select(vec![
        "domain",
        "descriptors",
        "key",
        "value",
        "rate_limit",
        "unit",
        "requests_per_unit",
        "resource",
        "resources",
        "rate",
        "tiers",
        "limit",
        "window",
        "active",
        "cooldown",
        "hard_limit",
        "global_limit",
        "copies",
        "domain_limit",
        "groups",
        "domains",
        "name",
        "settings",
        "shadow_mode",
        "gcra",
        "soft_limit",
        "replaces",
        "detailed_metric",
    ]);
    prop_oneof![
        2 => leaf,
        1 => prop::collection::vec((key, yaml_value(depth - 1)), 0..4).prop_map(|pairs| {
            let body: Vec<String> = pairs.iter().map(|(k, v)| format!("{k}: {v}")).collect();
            format!("{{{}}}", body.join(", "))
        }),
        1 => prop::collection::vec(yaml_value(depth - 1), 0..4)
            .prop_map(|items| format!("[{}]", items.join(", "))),
    ]
    .boxed()
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(cases()))]

    #[test]
    fn the_loader_answers_any_document(
        top in prop::collection::vec(
            (prop::sample::select(vec!["domain", "descriptors", "resources", "settings", "junk"]),
             yaml_value(4)),
            0..5,
        ),
        raw in "\\PC{0,64}",
        use_raw in any::<bool>(),
    ) {
        let document = if use_raw {
            raw
        } else {
            top.iter().map(|(k, v)| format!("{k}: {v}\n")).collect()
        };
        match charon::config::load_str(&document, "fuzz.yaml") {
            Ok(loaded) => {
                // What loads is usable: every namespace has its name.
                for namespace in loaded.config.namespaces() {
                    prop_assert!(!namespace.name.is_empty());
                }
            }
            Err(errors) => prop_assert!(!errors.to_string().is_empty()),
        }
    }
}

// ---------------------------------------------------------------------------
// Envoy's request mapping

fn descriptor() -> impl Strategy<Value = RateLimitDescriptor> {
    (
        prop::collection::vec((text(), text()), 0..4),
        prop::option::of(any::<u64>()),
        prop::option::of((any::<u32>(), -2i32..10)),
        any::<bool>(),
    )
        .prop_map(|(entries, hits, limit, negative)| RateLimitDescriptor {
            entries: entries
                .into_iter()
                .map(|(key, value)| Entry { key, value })
                .collect(),
            hits_addend: hits.map(|value| UInt64Value { value }),
            limit: limit.map(|(requests_per_unit, unit)| RateLimitOverride {
                requests_per_unit,
                unit,
            }),
            is_negative_hits: negative,
        })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(cases()))]

    #[test]
    fn envoy_requests_get_a_decision_or_a_clear_status(
        requests in prop::collection::vec(
            (text(), prop::collection::vec(descriptor(), 0..6), any::<u32>()),
            1..6,
        ),
    ) {
        let runtime = runtime();
        runtime.block_on(async {
            let limiter = Arc::new(charon::limiter::Limiter::new(
                config(),
                SidecarStore::Memory(charon::store::MemoryStore::new()),
            ));
            let service = RlsService::new(limiter, Arc::new(Metrics::new()), RlsOptions::default());
            for (domain, descriptors, hits_addend) in requests {
                let count = descriptors.len();
                let request = RateLimitRequest { domain, descriptors, hits_addend };
                let answer = tokio::time::timeout(HANG, service.decide(request))
                    .await
                    .map_err(|_| TestCaseError::fail("a request hung"))?;
                match answer {
                    Ok(response) => prop_assert_eq!(response.statuses.len(), count),
                    Err(status) => {
                        prop_assert_eq!(status.code(), tonic::Code::InvalidArgument);
                        prop_assert!(!status.message().is_empty());
                    }
                }
            }
            Ok(())
        })?;
    }
}

// ---------------------------------------------------------------------------
// The Charon API's operations

fn op() -> impl Strategy<Value = Op> {
    let at = (text(), text(), text());
    let groups = prop::collection::vec(text(), 0..3);
    prop_oneof![
        (
            at.clone(),
            prop::option::of(number()),
            prop::option::of(number())
        )
            .prop_map(
                |((namespace, resource, domain), copies, min_copies)| Op::Request(RequestOp {
                    namespace,
                    resource,
                    domain,
                    copies,
                    min_copies,
                })
            ),
        (
            at.clone(),
            prop::option::of(number()),
            prop::option::of(number())
        )
            .prop_map(
                |((namespace, resource, domain), copies, min_copies)| Op::Reserve(ReserveOp {
                    namespace,
                    resource,
                    domain,
                    copies,
                    min_copies,
                    ..ReserveOp::default()
                })
            ),
        (at.clone(), number(), groups.clone()).prop_map(
            |((namespace, resource, domain), copies, groups)| Op::Release(ReleaseOp {
                namespace,
                resource,
                domain,
                copies,
                groups,
                done: None,
            })
        ),
        (at, number(), groups, any::<u64>()).prop_map(
            |((namespace, resource, domain), copies, groups, ttl_ms)| Op::Transfer(TransferOp {
                namespace,
                resource,
                domain,
                copies,
                groups,
                ttl_ms,
            })
        ),
        text().prop_map(|transfer_id| Op::Seize(SeizeOp { transfer_id })),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(cases()))]

    #[test]
    fn api_operations_get_an_answer_or_a_typed_error(ops in prop::collection::vec(op(), 1..12)) {
        let runtime = runtime();
        runtime.block_on(async {
            let engine = Embedded::memory(config());
            for op in ops {
                let reply = tokio::time::timeout(HANG, engine.call(op))
                    .await
                    .map_err(|_| TestCaseError::fail("an operation hung"))?;
                prop_assert!(reply.is_ok(), "the embedded engine is always reachable");
            }
            Ok(())
        })?;
    }
}

// ---------------------------------------------------------------------------
// The admin JSON endpoints

fn json_value(depth: u32) -> BoxedStrategy<serde_json::Value> {
    use serde_json::{Value, json};
    let leaf = prop_oneof![
        number().prop_map(|n| json!(n)),
        any::<f64>().prop_map(|f| json!(f)),
        text().prop_map(Value::String),
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
    ];
    if depth == 0 {
        return leaf.boxed();
    }
    let key = prop::sample::select(vec![
        "rate",
        "domain",
        "tick_ms",
        "requests",
        "at_ms",
        "count",
        "until_ms",
        "keep_ticks",
        "x",
    ]);
    prop_oneof![
        2 => leaf,
        1 => prop::collection::btree_map(key.prop_map(str::to_owned), json_value(depth - 1), 0..5)
            .prop_map(|map| Value::Object(map.into_iter().collect())),
        1 => prop::collection::vec(json_value(depth - 1), 0..5).prop_map(Value::Array),
    ]
    .boxed()
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(cases()))]

    #[test]
    fn admin_endpoints_answer_any_body(
        bodies in prop::collection::vec(
            (0usize..4, json_value(3), text(), any::<bool>()),
            1..6,
        ),
    ) {
        let runtime = runtime();
        runtime.block_on(async {
            let limiter = Arc::new(charon::limiter::Limiter::new(
                config(),
                SidecarStore::Memory(charon::store::MemoryStore::new()),
            ));
            let copies: Arc<dyn charon::store::copies::CopyLog> =
                Arc::new(charon::store::MemoryCopies::new());
            let store = limiter.clone();
            let router = admin::router(
                AdminState {
                    ready: Arc::new(true.into()),
                    metrics: Arc::new(Metrics::new()),
                    store_status: Arc::new(move || store.store().status()),
                },
                StateSources {
                    limiter,
                    copies,
                    origins: None,
                    proposals: None,
                },
                Access::new(None).expect("no token file"),
            );
            let mut session = String::from("none");
            for (route, body, text, with_rate) in bodies {
                let mut body = body;
                if with_rate && let Some(object) = body.as_object_mut() {
                    // Often a valid policy, so the later routes are reached.
                    object.insert("rate".into(), "{tiers: [{limit: 3, window: 1s, active: forever}]}".into());
                }
                let encoded = |t: &str| t.replace(|c: char| !c.is_ascii_alphanumeric(), "_");
                let (method, uri) = match route {
                    0 => ("POST", "/ui/simulator/sessions".to_owned()),
                    1 => ("POST", format!("/ui/simulator/sessions/{session}/requests")),
                    2 => ("GET", format!(
                        "/debug/state?namespace=fuzz&resource={}&domain={}",
                        encoded(&text), encoded(&text)
                    )),
                    _ => ("DELETE", format!("/ui/simulator/sessions/{}", encoded(&text))),
                };
                let mut request = http::Request::builder()
                    .method(method)
                    .uri(&uri)
                    .header("content-type", "application/json")
                    .body(Body::from(body.to_string()))
                    .expect("a request");
                request
                    .extensions_mut()
                    .insert(ConnectInfo(SocketAddr::from(([127, 0, 0, 1], 9))));
                let response = tokio::time::timeout(HANG, router.clone().oneshot(request))
                    .await
                    .map_err(|_| TestCaseError::fail("an admin request hung"))?
                    .expect("infallible");
                let status = response.status();
                prop_assert!(
                    !status.is_server_error(),
                    "{} {} answered {}", method, uri, status
                );
                let bytes = axum::body::to_bytes(response.into_body(), 1 << 24)
                    .await
                    .map_err(|e| TestCaseError::fail(e.to_string()))?;
                if route == 0 && status.is_success()
                    && let Ok(started) = serde_json::from_slice::<serde_json::Value>(&bytes)
                    && let Some(id) = started["id"].as_str()
                {
                    session = id.to_owned();
                }
            }
            Ok(())
        })?;
    }
}
