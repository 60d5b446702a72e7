//! Capacity leases end to end (docs/design.md#capacity-leases): the real
//! `charon` binary, `GetCapacity` and `ReleaseCapacity` over gRPC, on the
//! memory store and on two sidecars sharing a real `redis-server`.
//!
//! What it proves:
//!
//! - clients renewing in turn converge to their max-min fair shares within
//!   two rounds, and the leases handed out never sum past the capacity;
//! - on Redis, clients of two sidecars share one pool the same way;
//! - a client that stops renewing loses its lease at expiry, and the others
//!   gain its share (also a real client process killed with SIGKILL, which
//!   releases nothing); a released lease goes to the others at once;
//! - every mistake is a typed error per resource (unknown, wrong kind, not a
//!   number), or an `INVALID_ARGUMENT` for the call (no client id), and a
//!   bad `capacity:` configuration is refused with its line.
#![cfg(all(unix, feature = "server"))]

use crate::support;

use std::time::Duration;

use charon::api::v1::capacity_answer::Result as Answered;
use charon::api::v1::charon_client::CharonClient;
use charon::api::v1::error::Kind;
use charon::api::v1::{
    CapacityLease, CapacityRef, CapacityWant, GetCapacityRequest, ReleaseCapacityRequest,
};
use support::KilledOnDrop;
use support::redis::RedisServer;
use support::sidecar::{Sidecar, tempdir, write_config};
use tonic::transport::Channel;

const CONFIG: &str = "
domain: jobs
resources:
  backend:
    capacity: {capacity: 100, algorithm: fair_share, lease: 2s, refresh_interval: 500ms, learning: 0s, safe_capacity: 10}
  search:
    rate:
      tiers:
        - {limit: 5, window: 1s}
";

/// Asks for `wants` of `backend` as `client`; the capacity granted.
async fn lease(client: &mut CharonClient<Channel>, id: &str, wants: f64) -> f64 {
    let lease = lease_of(client, id, wants).await;
    // The configured interval, or a fifth of it while the lease moves.
    assert!(
        [500, 100].contains(&lease.refresh_interval_ms),
        "{}",
        lease.refresh_interval_ms
    );
    lease.capacity
}

/// Asks for `wants` of `backend` as `client`; the lease granted.
pub(crate) async fn lease_of(
    client: &mut CharonClient<Channel>,
    id: &str,
    wants: f64,
) -> CapacityLease {
    let answer = client
        .get_capacity(GetCapacityRequest {
            client_id: id.to_owned(),
            resources: vec![CapacityWant {
                namespace: "jobs".into(),
                resource: "backend".into(),
                domain: "acme".into(),
                wants,
                has: 0.0,
                held_below: None,
            }],
        })
        .await
        .expect("GetCapacity answers")
        .into_inner();
    match answer.answers.first().and_then(|a| a.result.clone()) {
        Some(Answered::Lease(lease)) => lease,
        other => panic!("{id}: {other:?}"),
    }
}

/// Rounds of renewals by (client, sidecar index, wants), in turn; the
/// leases after each round. Checks that the leases live at any moment (the
/// last one each client got) never sum past the capacity.
async fn rounds(
    clients: &mut [CharonClient<Channel>],
    asks: &[(&str, usize, f64)],
    count: usize,
) -> Vec<Vec<f64>> {
    let mut held = vec![0.0; asks.len()];
    let mut history = Vec::new();
    for _ in 0..count {
        for (index, (id, sidecar, wants)) in asks.iter().enumerate() {
            held[index] = lease(&mut clients[*sidecar], id, *wants).await;
            let sum: f64 = held.iter().sum();
            assert!(sum <= 100.0 + 1e-6, "live leases {held:?} sum past 100");
        }
        history.push(held.clone());
    }
    history
}

async fn fair_shares_converge(clients: &mut [CharonClient<Channel>], sidecar_of: [usize; 3]) {
    // a alone wants everything, then b (30) and c (100) join: max-min fair
    // is 35, 30, 35, reached within two rounds of renewals.
    assert_eq!(lease(&mut clients[sidecar_of[0]], "a", 100.0).await, 100.0);
    let history = rounds(
        clients,
        &[
            ("a", sidecar_of[0], 100.0),
            ("b", sidecar_of[1], 30.0),
            ("c", sidecar_of[2], 100.0),
        ],
        3,
    )
    .await;
    assert_eq!(history[2], [35.0, 30.0, 35.0], "rounds: {history:?}");
}

async fn client(sidecar: &Sidecar) -> CharonClient<Channel> {
    CharonClient::connect(sidecar.grpc_url())
        .await
        .expect("connects")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leases_on_one_sidecar_converge_expire_and_release() {
    let dir = tempdir();
    let config = write_config(dir.path(), CONFIG);
    let sidecar = Sidecar::start(dir.path(), &config, "memory", &[]);
    sidecar.wait_readyz(200, "ready").await;
    let mut clients = vec![client(&sidecar).await];
    fair_shares_converge(&mut clients, [0, 0, 0]).await;

    // c stops renewing: at expiry (2 s) its share goes to a.
    tokio::time::sleep(Duration::from_millis(2_200)).await;
    let history = rounds(&mut clients, &[("a", 0, 100.0), ("b", 0, 30.0)], 2).await;
    assert_eq!(
        history[1],
        [70.0, 30.0],
        "after c's lease expired: {history:?}"
    );

    // b gives its lease back: a gets all it wants on its next renewal.
    let released = clients[0]
        .release_capacity(ReleaseCapacityRequest {
            client_id: "b".into(),
            resources: vec![CapacityRef {
                namespace: "jobs".into(),
                resource: "backend".into(),
                domain: "acme".into(),
            }],
        })
        .await
        .expect("ReleaseCapacity answers")
        .into_inner();
    assert_eq!(released.released, [true]);
    assert_eq!(lease(&mut clients[0], "a", 100.0).await, 100.0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn clients_of_two_sidecars_share_one_pool_on_redis() {
    let redis = RedisServer::start();
    let dir = tempdir();
    let config = write_config(dir.path(), CONFIG);
    let args = ["--store-timeout", "2s"];
    let one = Sidecar::start(dir.path(), &config, &redis.url(), &args);
    let two = Sidecar::start(dir.path(), &config, &redis.url(), &args);
    one.wait_readyz(200, "ready: store reachable").await;
    two.wait_readyz(200, "ready: store reachable").await;
    let mut clients = vec![client(&one).await, client(&two).await];
    fair_shares_converge(&mut clients, [0, 1, 1]).await;
    let key = charon::store::keys::lease_key('l', "jobs", "backend", "acme");
    assert!(
        !redis.command(&["GET", &key]).trim().is_empty(),
        "the leases live in Redis"
    );

    // Many clients at once on both sidecars: the pool is never overdrawn.
    let mut tasks = Vec::new();
    for n in 0..8 {
        let mut client = clients[n % 2].clone();
        tasks.push(tokio::spawn(async move {
            let mut got = Vec::new();
            for _ in 0..5 {
                got.push(lease(&mut client, &format!("w{n}"), 50.0).await);
            }
            got
        }));
    }
    for task in tasks {
        let got = task.await.expect("a client");
        assert!(got.iter().all(|g| *g <= 50.0), "{got:?}");
    }
    let live: f64 = {
        let state = redis.command(&["GET", &key]);
        let state: serde_json::Value = serde_json::from_str(&state).expect("the state is JSON");
        state["c"]
            .as_object()
            .expect("clients")
            .values()
            .map(|client| client["h"].as_f64().unwrap_or(0.0))
            .sum()
    };
    assert!(live <= 100.0 + 1e-6, "{live} leased of 100");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mistakes_are_typed_errors() {
    let dir = tempdir();
    let config = write_config(dir.path(), CONFIG);
    let sidecar = Sidecar::start(dir.path(), &config, "memory", &[]);
    sidecar.wait_readyz(200, "ready").await;
    let mut client = client(&sidecar).await;
    let want = |resource: &str, wants: f64| CapacityWant {
        namespace: "jobs".into(),
        resource: resource.into(),
        domain: "acme".into(),
        wants,
        has: 0.0,
        held_below: None,
    };
    let answer = client
        .get_capacity(GetCapacityRequest {
            client_id: "x".into(),
            resources: vec![
                want("nothing", 1.0),
                want("search", 1.0),
                want("backend", f64::NAN),
                want("backend", 10.0),
            ],
        })
        .await
        .expect("answers")
        .into_inner();
    let kinds: Vec<Option<Kind>> = answer
        .answers
        .iter()
        .map(|a| match &a.result {
            Some(Answered::Error(error)) => Kind::try_from(error.kind).ok(),
            _ => None,
        })
        .collect();
    assert_eq!(
        kinds,
        [
            Some(Kind::UnknownResource),
            Some(Kind::WrongKind),
            Some(Kind::Malformed),
            None
        ],
        "{answer:?}"
    );
    let refused = client
        .get_capacity(GetCapacityRequest {
            client_id: String::new(),
            resources: vec![want("backend", 1.0)],
        })
        .await
        .expect_err("no client id");
    assert_eq!(refused.code(), tonic::Code::InvalidArgument);

    let bad =
        "domain: jobs\nresources:\n  backend:\n    capacity: {capacity: 100, algorithm: fairest}\n";
    let errors = charon::config::load_str(bad, "bad.yaml").expect_err("refused");
    assert!(errors.to_string().contains("bad.yaml:4:"), "{errors}");
    assert!(
        errors.to_string().contains("unknown algorithm `fairest`"),
        "{errors}"
    );
    let bad = "domain: jobs\nresources:\n  backend:\n    capacity: {capacity: 100, lease: 1s, refresh_interval: 5s}\n";
    let errors = charon::config::load_str(bad, "bad.yaml").expect_err("refused");
    assert!(errors.to_string().contains("refresh"), "{errors}");
}

/// Keeps asking `limiter` for one unit every millisecond until `stop`.
fn demand(
    limiter: std::sync::Arc<charon::client::lease::LeaseLimiter>,
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        while !stop.load(std::sync::atomic::Ordering::SeqCst) {
            let _ = limiter.try_acquire(1);
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
    })
}

async fn rate_becomes(limiter: &charon::client::lease::LeaseLimiter, what: &str, expected: f64) {
    support::sidecar::eventually(what, Duration::from_secs(15), async || {
        match limiter.rate() {
            rate if (rate - expected).abs() < 1e-9 => Ok(()),
            rate => Err(format!("rate {rate}")),
        }
    })
    .await;
}

/// Two background renewers on `sidecar`, each asked for a unit every
/// millisecond, returned once both hold their fair share (50 each).
async fn busy_renewers(
    sidecar: &Sidecar,
    clients: [(&str, charon::client::lease::FailureMode); 2],
) -> Busy {
    use charon::client::lease::{LeaseOptions, LeaseRenewer};
    let client = charon::client::Client::sidecar(&sidecar.grpc_url()).expect("a client");
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let limiters = clients.map(|(id, mode)| {
        LeaseRenewer::spawn(
            client.clone(),
            LeaseOptions {
                failure_mode: mode,
                retry_interval: Duration::from_millis(200),
                ..LeaseOptions::new(id, "jobs", "backend", "acme")
            },
        )
    });
    let demands = limiters
        .each_ref()
        .map(|limiter| demand(limiter.clone(), stop.clone()));
    for ((id, _), limiter) in clients.iter().zip(&limiters) {
        rate_becomes(limiter, &format!("{id}'s fair share"), 50.0).await;
    }
    Busy {
        limiters,
        stop,
        demands,
    }
}

struct Busy {
    limiters: [std::sync::Arc<charon::client::lease::LeaseLimiter>; 2],
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
    demands: [tokio::task::JoinHandle<()>; 2],
}

impl Busy {
    /// Stops asking, and waits for the askers.
    async fn stop(self) {
        self.stop.store(true, std::sync::atomic::Ordering::SeqCst);
        for task in self.demands {
            task.await.expect("a demand task");
        }
    }
}

/// Two clients, each renewing in the background from the demand it
/// measured, converge to half the capacity each; with the sidecar gone,
/// one falls back to the safe capacity and the other (pessimistic) to
/// nothing; when a sidecar is back they share the capacity again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn renewers_share_by_measured_demand_and_follow_their_failure_mode() {
    use charon::client::lease::FailureMode;

    let dir = tempdir();
    let config = write_config(dir.path(), CONFIG);
    let mut sidecar = Sidecar::start(dir.path(), &config, "memory", &[]);
    sidecar.wait_readyz(200, "ready").await;
    let busy = busy_renewers(
        &sidecar,
        [("p", FailureMode::Safe), ("q", FailureMode::Pessimistic)],
    )
    .await;
    let [safe, pessimist] = &busy.limiters;

    let ports = (sidecar.grpc, sidecar.admin);
    sidecar.kill();
    rate_becomes(safe, "p on the safe capacity", 10.0).await;
    rate_becomes(pessimist, "q on nothing", 0.0).await;

    let sidecar = Sidecar::start_at(dir.path(), &config, "memory", ports, &[]);
    sidecar.wait_readyz(200, "ready").await;
    rate_becomes(safe, "p's fair share again", 50.0).await;
    rate_becomes(pessimist, "q's fair share again", 50.0).await;
    busy.stop().await;
}

/// The layer on a lease answers from the local limiter alone: the bucket
/// holds a second of the rate, then 429 with `Retry-After`, and a second
/// later (Tokio's clock, paused and advanced) the rate's worth passes again.
#[tokio::test(start_paused = true)]
async fn the_layer_on_a_lease_answers_429_with_retry_after_locally() {
    use charon::client::lease::LeaseLimiter;
    use charon::layer::LeaseLimitLayer;
    use std::sync::Arc;
    use tower::{Layer, Service, ServiceExt};

    let limiter = Arc::new(LeaseLimiter::with_rate(5.0));
    let mut service =
        LeaseLimitLayer::new(limiter).layer(tower::service_fn(|_: http::Request<String>| async {
            Ok::<_, std::convert::Infallible>(http::Response::new(String::from("ok")))
        }));
    let mut statuses = Vec::new();
    for _ in 0..7 {
        let response = service
            .ready()
            .await
            .expect("ready")
            .call(http::Request::new(String::new()))
            .await
            .expect("answered");
        statuses.push(response.status().as_u16());
        if response.status() == 429 {
            assert_eq!(response.headers()["retry-after"], "1");
        }
    }
    assert_eq!(statuses, [200, 200, 200, 200, 200, 429, 429]);
    tokio::time::advance(Duration::from_secs(1)).await;
    let response = service
        .ready()
        .await
        .expect("ready")
        .call(http::Request::new(String::new()))
        .await
        .expect("answered");
    assert_eq!(response.status(), 200);
}

/// The same clients on a sidecar whose Redis is SIGKILLed: every renewal
/// is answered `STORE_UNAVAILABLE`, so each follows its failure mode; once
/// Redis is back (empty) they share the capacity again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn renewers_follow_their_failure_mode_when_redis_dies_and_recover() {
    use charon::client::lease::FailureMode;

    let mut redis = RedisServer::start();
    let dir = tempdir();
    let config = write_config(dir.path(), CONFIG);
    let sidecar = Sidecar::start(
        dir.path(),
        &config,
        &redis.url(),
        &["--store-timeout", "500ms"],
    );
    sidecar.wait_readyz(200, "ready: store reachable").await;
    let busy = busy_renewers(
        &sidecar,
        [
            ("o", FailureMode::Optimistic),
            ("p", FailureMode::Pessimistic),
        ],
    )
    .await;
    let [optimist, pessimist] = &busy.limiters;

    redis.kill();
    support::sidecar::eventually("o on what it wants", Duration::from_secs(15), async || {
        match optimist.rate() {
            // What it measured (about 1 000 a second) times the headroom.
            rate if rate > 100.0 => Ok(()),
            rate => Err(format!("rate {rate}")),
        }
    })
    .await;
    rate_becomes(pessimist, "p on nothing", 0.0).await;

    redis.restart();
    rate_becomes(optimist, "o's fair share again", 50.0).await;
    rate_becomes(pessimist, "p's fair share again", 50.0).await;
    busy.stop().await;
}

/// A client *process* (`examples/lease_workers.rs`, one worker, as a user
/// runs it) holding a lease is killed with SIGKILL, so nothing is released:
/// the sidecar keeps counting its lease until expiry (5 s after its last
/// renewal, which was at most a refresh interval, 1 s, before the kill),
/// then a client that wants the whole capacity gets it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_process_killed_with_sigkill_frees_its_share_at_expiry() {
    use std::process::Stdio;
    use std::time::Instant;

    let dir = tempdir();
    let config = example_config(dir.path());
    let sidecar = Sidecar::start(dir.path(), &config, "memory", &[]);
    sidecar.wait_readyz(200, "ready").await;
    let mut worker = start_worker(1, &sidecar, 120, Stdio::null());

    // The probe wants everything; with the worker alive it gets at most the
    // other half of the fair share.
    let mut probe = client(&sidecar).await;
    let ask =
        async |probe: &mut CharonClient<Channel>| lease_of(probe, "probe", 100.0).await.capacity;
    support::sidecar::eventually(
        "the worker holds its fair share",
        Duration::from_secs(15),
        async || match ask(&mut probe).await {
            granted if (granted - 50.0).abs() < 1e-9 => Ok(()),
            granted => Err(format!("the probe got {granted}")),
        },
    )
    .await;

    worker.0.kill().expect("SIGKILL the worker");
    let killed = Instant::now();
    let _ = worker.0.wait();
    // Until its lease can have expired (4 s at the earliest), the dead
    // worker's half stays taken.
    while killed.elapsed() < Duration::from_millis(3_500) {
        let granted = ask(&mut probe).await;
        assert!(
            granted <= 50.0 + 1e-9,
            "{:?} after the kill the probe got {granted}: the dead worker's lease went early",
            killed.elapsed()
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    // By its expiry (5 s at the latest, plus a margin) all of it is free.
    let freed = loop {
        let granted = ask(&mut probe).await;
        if (granted - 100.0).abs() < 1e-9 {
            break killed.elapsed();
        }
        assert!(
            killed.elapsed() < Duration::from_secs(10),
            "10 s after the kill the probe still gets {granted}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert!(
        freed >= Duration::from_millis(3_500),
        "freed after {freed:?}"
    );
}

/// A worker of `examples/lease_workers` on `sidecar`, for `seconds`.
fn start_worker(
    worker: u32,
    sidecar: &Sidecar,
    seconds: u32,
    stdout: std::process::Stdio,
) -> KilledOnDrop {
    KilledOnDrop(
        std::process::Command::new(support::example_binary("lease_workers"))
            .arg(worker.to_string())
            .env("CHARON_URL", sidecar.grpc_url())
            .env("SECONDS", seconds.to_string())
            .stdout(stdout)
            .stderr(std::process::Stdio::null())
            .spawn()
            .expect("a worker starts"),
    )
}

/// `examples/lease_workers.yaml`, written into `dir`.
fn example_config(dir: &std::path::Path) -> std::path::PathBuf {
    let example = concat!(env!("CARGO_MANIFEST_DIR"), "/examples/lease_workers.yaml");
    write_config(
        dir,
        &std::fs::read_to_string(example).expect("the example's configuration"),
    )
}

/// The example's three worker processes, as a user runs them, on two
/// sidecars sharing one Redis (workers 1 and 3 on one, 2 on the other).
/// Each renews every second asking for the demand it measured (× 1.2), and
/// their demand shifts: 80/s for worker 1 throughout, 60/s for worker 2 from
/// the 5th second, 100/s for worker 3 from the 10th to the 20th. Their
/// printed leases reach the fair shares of 100 within two refresh intervals
/// of the measured change (plus the second it takes to measure it): all to
/// worker 1, then half each, then a third each, then half each again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_worker_processes_on_two_sidecars_follow_their_fair_shares() {
    use std::process::Stdio;

    let redis = RedisServer::start();
    let dir = tempdir();
    let config = example_config(dir.path());
    let one = Sidecar::start(dir.path(), &config, &redis.url(), &[]);
    let two = Sidecar::start(dir.path(), &config, &redis.url(), &[]);
    one.wait_readyz(200, "ready: store reachable").await;
    two.wait_readyz(200, "ready: store reachable").await;
    let workers: Vec<KilledOnDrop> = [(1, &one), (2, &two), (3, &one)]
        .into_iter()
        .map(|(worker, sidecar)| start_worker(worker, sidecar, 30, Stdio::piped()))
        .collect();
    // Each worker prints `t=12s worker 2: lease   33.3/s, ...` per second.
    let leases: Vec<Vec<f64>> = tokio::task::spawn_blocking(move || {
        workers
            .into_iter()
            .map(|mut worker| {
                let mut printed = String::new();
                if let Some(mut stdout) = worker.0.stdout.take() {
                    std::io::Read::read_to_string(&mut stdout, &mut printed)
                        .expect("the worker's output");
                }
                printed
                    .lines()
                    .filter_map(|line| {
                        let rate = line.split("lease").nth(1)?.split("/s").next()?;
                        rate.trim().parse::<f64>().ok()
                    })
                    .collect()
            })
            .collect()
    })
    .await
    .expect("the workers' output");
    assert!(
        leases.iter().all(|printed| printed.len() == 30),
        "every worker printed 30 seconds: {leases:?}"
    );
    // (seconds, each worker's share, how near its printed lease must be).
    let expected: [(std::ops::Range<usize>, [f64; 3], f64); 4] = [
        // Worker 1 alone asks what it measured × 1.2 (about 96: the
        // requests that fall in each measured second vary by one or two).
        (2..5, [96.0, 0.0, 0.0], 4.0),
        (8..10, [50.0, 50.0, 0.0], 0.1),
        (13..20, [100.0 / 3.0, 100.0 / 3.0, 100.0 / 3.0], 0.1),
        (23..30, [50.0, 50.0, 0.0], 0.1),
    ];
    for (seconds, shares, tolerance) in expected {
        for t in seconds {
            for (worker, share) in shares.iter().enumerate() {
                assert!(
                    (leases[worker][t] - share).abs() <= tolerance,
                    "t={t}s worker {}: lease {} instead of {share:.1}; all: {leases:?}",
                    worker + 1,
                    leases[worker][t]
                );
            }
        }
    }
}
