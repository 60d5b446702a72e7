//! A hot key's queue (src/store/redis/queue.rs): single fixed-window
//! decisions on a key with a call in flight wait for it and go together as
//! one call, on a real `redis-server` started here on a free port.
//!
//! What it proves: hundreds of concurrent decisions on one key (a fixed
//! window, a GCRA bucket) cost Redis a few calls, not one each; every decision gets the answer the memory store
//! gives deciding the same requests one after another in the order they
//! came (limits, hits of 0 and more, shadow mode and counted refusals mixed);
//! on a Cluster too; and callers that give up (their futures dropped, the
//! one with the call in flight among them) leave no key stalled.

use crate::redis_store::{runtime, store_at};
use crate::support;

use std::sync::Arc;
use std::time::Duration;

use charon::clock::ManualClock;
use charon::engine::{Decision, GcraItem, GcraLimit, Item, SlotKind, WindowItem};
use charon::store::{Batch, MemoryStore, RedisStore, Store};
use support::redis::{RedisCluster, RedisServer};

const NOW: u64 = 1_700_000_000_000;

/// One request of one fixed window on `key`.
fn window(key: &str, limit: u64, hits: u64, shadow: bool, count_rejected: bool) -> Batch<'static> {
    let mut batch = Batch::default();
    let slot = batch.slot(key.to_owned(), SlotKind::Window);
    batch.items.push(Item::Window(WindowItem {
        slot,
        limit,
        period: 60_000,
        hits,
        shadow,
        count_rejected,
    }));
    batch
}

/// A mix of requests on one key, as varied as a hot tenant's: mostly one
/// hit, some of several or none, some in shadow mode or counting their
/// refusals, and the limit changing part way (a reload).
fn mixed_requests(key: &str, count: usize) -> Vec<Batch<'static>> {
    (0..count)
        .map(|i| {
            let limit = if i < count / 2 { 150 } else { 180 };
            let hits = [1, 1, 1, 3, 0, 1, 2][i % 7];
            window(key, limit, hits, i % 11 == 0, i % 13 == 0)
        })
        .collect()
}

/// One request of one GCRA bucket on `key`.
fn bucket(key: &str, count: u64, burst: u64, hits: u64, shadow: bool) -> Batch<'static> {
    let mut batch = Batch::default();
    let slot = batch.slot(key.to_owned(), SlotKind::Gcra);
    batch.items.push(Item::Gcra(GcraItem {
        slot,
        limit: GcraLimit {
            count,
            period: 60_000,
            burst,
        },
        hits,
        shadow,
    }));
    batch
}

fn evalsha_calls(redis: &RedisServer) -> u64 {
    redis
        .command(&["INFO", "commandstats"])
        .lines()
        .find_map(|line| line.strip_prefix("cmdstat_evalsha:calls="))
        .and_then(|rest| rest.split(',').next())
        .and_then(|calls| calls.parse().ok())
        .unwrap_or(0)
}

/// What the memory store answers to `requests` one after another at `NOW`.
fn one_after_another(requests: &[Batch<'static>]) -> Vec<Decision> {
    let memory = MemoryStore::with_clock(ManualClock::new(NOW));
    runtime().block_on(async {
        let mut decisions = Vec::new();
        for request in requests {
            decisions.push(
                memory
                    .decide(request.clone())
                    .await
                    .expect("memory answers"),
            );
        }
        decisions
    })
}

/// Every request at once, on one store, in the order given.
fn all_at_once(
    store: &RedisStore,
    runtime: &tokio::runtime::Runtime,
    requests: &[Batch<'static>],
) -> Vec<Decision> {
    runtime.block_on(async {
        futures_util::future::join_all(requests.iter().map(|request| store.decide_batch(request)))
            .await
            .into_iter()
            .map(|decision| decision.expect("Redis answers"))
            .collect()
    })
}

/// Every request at once on a fresh Redis: the answers, and the scripts
/// Redis ran for them.
fn all_at_once_on_one_redis(requests: &[Batch<'static>]) -> (Vec<Decision>, u64) {
    let redis = RedisServer::start();
    let runtime = runtime();
    let _entered = runtime.enter();
    let store = store_at(&redis.url(), &ManualClock::new(NOW));
    let before = evalsha_calls(&redis);
    let decisions = all_at_once(&store, &runtime, requests);
    (decisions, evalsha_calls(&redis) - before)
}

#[test]
fn concurrent_decisions_on_one_key_share_calls_and_answer_as_one_by_one() {
    let requests = mixed_requests("{hot}w:tenant:acme", 400);
    let (decisions, calls) = all_at_once_on_one_redis(&requests);
    assert_eq!(decisions, one_after_another(&requests));
    let granted = decisions.iter().filter(|d| d.granted).count();
    assert!(
        granted > 100 && granted < 400,
        "a mix of answers: {granted} granted"
    );
    // The first goes alone; the rest wait for it and go at most 64 a call
    // (and a first call of the script is sent twice: NOSCRIPT).
    assert!(calls <= 10, "{calls} calls of Redis for 400 decisions");
}

#[test]
fn a_hot_bucket_queues_as_a_hot_window_does() {
    // A bucket of 100 a minute, a burst of 120, then of 150 (a reload).
    let requests: Vec<Batch<'static>> = (0..300)
        .map(|i| {
            let (count, burst) = if i < 150 { (100, 120) } else { (100, 150) };
            bucket(
                "{hot}a:tenant:acme",
                count,
                burst,
                [1, 1, 2, 0, 1][i % 5],
                i % 9 == 0,
            )
        })
        .collect();
    let (decisions, calls) = all_at_once_on_one_redis(&requests);
    assert_eq!(decisions, one_after_another(&requests));
    let granted = decisions.iter().filter(|d| d.granted).count();
    assert!(
        granted > 50 && granted < 300,
        "a mix of answers: {granted} granted"
    );
    assert!(calls <= 10, "{calls} calls of Redis for 300 decisions");
}

#[test]
fn a_cluster_queues_each_key_on_its_own_master() {
    let cluster = RedisCluster::start(3);
    let runtime = runtime();
    let _entered = runtime.enter();
    let store = store_at(&cluster.url(), &ManualClock::new(NOW));
    // Two hot keys behind different hash tags, their requests interleaved.
    let acme = mixed_requests("{acme}w:tenant", 200);
    let globex = mixed_requests("{globex}w:tenant", 200);
    let interleaved: Vec<Batch<'static>> = acme
        .iter()
        .zip(&globex)
        .flat_map(|(a, g)| [a.clone(), g.clone()])
        .collect();
    let decisions = all_at_once(&store, &runtime, &interleaved);
    let (on_acme, on_globex): (Vec<_>, Vec<_>) = decisions
        .into_iter()
        .enumerate()
        .partition(|(index, _)| index % 2 == 0);
    let strip =
        |pairs: Vec<(usize, Decision)>| pairs.into_iter().map(|(_, d)| d).collect::<Vec<_>>();
    assert_eq!(strip(on_acme), one_after_another(&acme));
    assert_eq!(strip(on_globex), one_after_another(&globex));
}

#[test]
fn callers_that_leave_do_not_stall_their_key() {
    let redis = RedisServer::start();
    let runtime = runtime();
    let _entered = runtime.enter();
    let store = Arc::new(store_at(&redis.url(), &ManualClock::new(NOW)));
    let key = "{hot}w:tenant:initech";
    runtime.block_on(async {
        let handles: Vec<_> = (0..100)
            .map(|_| {
                let store = store.clone();
                tokio::spawn(async move {
                    store
                        .decide_batch(&window(key, 1_000, 1, false, false))
                        .await
                })
            })
            .collect();
        // Every task has joined the queue (the first has its call in
        // flight); then the first ten leave, the one in flight among them.
        tokio::task::yield_now().await;
        for handle in &handles[..10] {
            handle.abort();
        }
        let mut answered = 0;
        for handle in handles.into_iter().skip(10) {
            let decision = tokio::time::timeout(Duration::from_secs(5), handle)
                .await
                .expect("no queued decision is left without a call")
                .expect("the task ran")
                .expect("Redis answers");
            assert!(decision.granted);
            answered += 1;
        }
        assert_eq!(answered, 90);
        // And the key takes new decisions at once.
        let after = tokio::time::timeout(
            Duration::from_secs(5),
            store.decide_batch(&window(key, 1_000, 1, false, false)),
        )
        .await
        .expect("the key is not stalled")
        .expect("Redis answers");
        let charon::engine::Outcome::Window(outcome) = after.outcomes[0] else {
            panic!("a window's outcome: {after:?}");
        };
        // The 90 answered, and those that left which Redis had counted.
        assert!((90..=100).contains(&outcome.before), "{outcome:?}");
    });
}

/// End to end: one `charon serve` on Redis, 32 clients asking for one tenant
/// at once. Every answer is OK (the limit is far), and the metrics show
/// calls that carried queued decisions.
#[cfg(all(unix, feature = "server"))]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sidecar_queues_one_tenants_concurrent_requests() {
    use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
    use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::Entry;
    use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitRequest;
    use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::Code;
    use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
    use support::sidecar::{Sidecar, metric_value, tempdir, write_config};

    let redis = RedisServer::start();
    let dir = tempdir();
    let config = write_config(
        dir.path(),
        "domain: edge\ndescriptors:\n  - key: tenant\n    rate_limit: {unit: hour, requests_per_unit: 1000000}\n",
    );
    let sidecar = Sidecar::start(
        dir.path(),
        &config,
        &redis.url(),
        &["--store-timeout", "5s"],
    );
    sidecar.wait_readyz(200, "ready: store reachable").await;
    let url = format!("http://127.0.0.1:{}", sidecar.grpc);
    let clients: Vec<_> = (0..32)
        .map(|_| {
            let url = url.clone();
            tokio::spawn(async move {
                let mut client = RateLimitServiceClient::connect(url)
                    .await
                    .expect("the sidecar listens");
                let mut ok = 0;
                for _ in 0..25 {
                    let request = RateLimitRequest {
                        domain: "edge".to_owned(),
                        descriptors: vec![RateLimitDescriptor {
                            entries: vec![Entry {
                                key: "tenant".to_owned(),
                                value: "acme".to_owned(),
                            }],
                            ..Default::default()
                        }],
                        hits_addend: 0,
                    };
                    let answer = client.should_rate_limit(request).await.expect("an answer");
                    ok += u64::from(answer.into_inner().overall_code == Code::Ok as i32);
                }
                ok
            })
        })
        .collect();
    let mut ok = 0;
    for client in clients {
        ok += client.await.expect("the client ran");
    }
    assert_eq!(ok, 800, "every request is within the limit");
    let metrics = sidecar
        .metrics()
        .await
        .unwrap_or_else(|error| panic!("{error}"));
    let count = |operation: &str| {
        metric_value(
            &metrics,
            &format!(
                "charon_store_call_duration_seconds_count{{operation=\"{operation}\",result=\"ok\"}}"
            ),
        )
        .unwrap_or(0.0)
    };
    assert_eq!(count("decide"), 800.0, "{metrics}");
    assert!(count("decide_queue") >= 1.0, "no queued call:\n{metrics}");
    // Redis ran fewer scripts than there were decisions.
    let evalsha = evalsha_calls(&redis);
    assert!(evalsha < 800, "{evalsha} EVALSHA for 800 decisions");
}
