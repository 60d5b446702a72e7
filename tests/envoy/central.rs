//! The central topology as processes (deploy/kubernetes/central): `charon
//! serve` replicas on one Redis behind a real Envoy
//! (examples/envoy/central.yaml) that spreads its calls over them, its
//! endpoints given over EDS as a control plane would. Under load, the
//! replicas go from 2 to 5 and back to 2; one is SIGKILLed, and the others
//! leave by SIGTERM as Kubernetes removes them (the endpoint goes when the
//! replica turns not ready, within its `--shutdown-delay`).
//!
//! What holds: no request fails (Envoy's retry policy absorbs the replica
//! that vanished mid-call); every tenant is admitted exactly up to its limit
//! (never more; fewer only by the calls in flight to the killed replica,
//! whose counts landed but whose answers were lost); and the copies held
//! through the killed replica are reaped within the heartbeat ttl plus the
//! reap interval (docs/copy-limits.md#crash-safety-across-sidecars).
#![cfg(all(unix, feature = "server"))]

use std::collections::HashMap;
use std::path::Path;
use std::process::Command;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use charon::api::v1::charon_client::CharonClient;
use charon::clock::Clock;

use crate::envoy_e2e::{Proc, find_envoy, free_ports, manifest_dir, spawn_envoy, wait_ready};
use crate::support;
use support::redis::RedisServer;
use support::sidecar::Session;

/// Per tenant per day: the load reaches it about halfway through.
const LIMIT: u64 = 150;
const TENANTS: usize = 20;
/// Requests in flight at once (and so the most a SIGKILL can lose).
const IN_FLIGHT: usize = 8;

const CONFIG: &str = "
domain: edge
descriptors:
  - key: tenant
    rate_limit: {unit: day, requests_per_unit: 150}
resources:
  pool:
    copies: {domain_limit: 3}
";

struct Replica {
    proc: Proc,
    grpc: u16,
    admin: u16,
}

fn start_replica(dir: &Path, config: &Path, redis: &str) -> Replica {
    let [grpc, admin] = free_ports::<2>();
    let proc = Proc::spawn(
        "charon",
        Command::new(env!("CARGO_BIN_EXE_charon"))
            .args(["serve", "--config"])
            .arg(config)
            .args(["--grpc-addr", &format!("127.0.0.1:{grpc}")])
            .args(["--admin-addr", &format!("127.0.0.1:{admin}")])
            .args(["--store", redis])
            .args(["--shutdown-delay", "1s"])
            .args(["--heartbeat", "100ms", "--heartbeat-ttl", "600ms"])
            .args(["--reap-interval", "100ms"]),
        dir,
    );
    Replica { proc, grpc, admin }
}

async fn wait_replica_ready(client: &reqwest::Client, replica: &mut Replica) {
    let url = format!("http://127.0.0.1:{}/readyz", replica.admin);
    wait_ready(client, &url, &mut replica.proc).await;
}

/// Rewrites Envoy's endpoints file (written aside, then renamed over it,
/// as Envoy's file watcher needs) to `ports`.
fn publish(dir: &Path, ports: &[u16]) {
    let endpoints: String = ports
        .iter()
        .map(|port| {
            format!(
                "          - endpoint: {{address: {{socket_address: {{address: 127.0.0.1, port_value: {port}}}}}}}\n"
            )
        })
        .collect();
    let text = format!(
        "resources:\n  - \"@type\": type.googleapis.com/envoy.config.endpoint.v3.ClusterLoadAssignment\n    cluster_name: charon\n    endpoints:\n      - lb_endpoints:\n{endpoints}"
    );
    let aside = dir.join("endpoints.yaml.new");
    std::fs::write(&aside, text).expect("endpoints written");
    std::fs::rename(&aside, dir.join("endpoints.yaml")).expect("endpoints moved");
}

/// examples/envoy/central.yaml with this test's ports and endpoints file.
fn envoy_config(dir: &Path, listen: u16, admin: u16, upstream: u16) -> String {
    let path = manifest_dir().join("examples/envoy/central.yaml");
    let mut text = std::fs::read_to_string(&path).expect("the example");
    for (from, to) in [
        ("port_value: 10000", format!("port_value: {listen}")),
        ("port_value: 9901", format!("port_value: {admin}")),
        ("port_value: 8080", format!("port_value: {upstream}")),
        (
            "path: examples/envoy/central-endpoints.yaml",
            format!("path: {}", dir.join("endpoints.yaml").display()),
        ),
        (
            "watched_directory: {path: examples/envoy}",
            format!("watched_directory: {{path: {}}}", dir.display()),
        ),
    ] {
        assert_eq!(text.matches(from).count(), 1, "one `{from}` in the example");
        text = text.replace(from, &to);
    }
    text
}

#[derive(Default, Debug, Clone)]
struct Tally {
    sent: u64,
    admitted: u64,
    refused: u64,
    failed: Vec<u16>,
}

/// Until `stop`: IN_FLIGHT loops of requests through Envoy, over the
/// tenants in turn, each loop pacing itself to about 60 a second.
fn start_load(
    client: reqwest::Client,
    url: String,
    stop: Arc<AtomicBool>,
    tallies: Arc<Mutex<HashMap<usize, Tally>>>,
) -> Vec<tokio::task::JoinHandle<()>> {
    (0..IN_FLIGHT)
        .map(|worker| {
            let (client, url, stop, tallies) =
                (client.clone(), url.clone(), stop.clone(), tallies.clone());
            tokio::spawn(async move {
                let mut turn = worker;
                let mut tick = tokio::time::interval(Duration::from_millis(16));
                while !stop.load(Ordering::SeqCst) {
                    tick.tick().await;
                    let tenant = turn % TENANTS;
                    turn += IN_FLIGHT;
                    let status = client
                        .get(&url)
                        .header("x-tenant", format!("tenant-{tenant}"))
                        .send()
                        .await
                        .map_or(0, |reply| reply.status().as_u16());
                    let mut tallies = tallies.lock().expect("tallies");
                    let tally = tallies.entry(tenant).or_default();
                    tally.sent += 1;
                    match status {
                        200 => tally.admitted += 1,
                        429 => tally.refused += 1,
                        other => tally.failed.push(other),
                    }
                }
            })
        })
        .collect()
}

fn terminate(replica: &Replica) {
    if let Some(pid) = replica.proc.pid() {
        let _ = Command::new("kill")
            .args(["-TERM", &pid.to_string()])
            .status();
    }
}

/// What Kubernetes does when a replica is told to go: SIGTERM, and the
/// endpoint removed once the replica says it is not ready (its
/// `--shutdown-delay` keeps it answering meanwhile).
async fn drain(
    client: &reqwest::Client,
    dir: &Path,
    replicas: &mut Vec<Replica>,
    index: usize,
) -> Replica {
    let leaving = replicas.remove(index);
    terminate(&leaving);
    let url = format!("http://127.0.0.1:{}/readyz", leaving.admin);
    let deadline = Instant::now() + Duration::from_secs(10);
    while Instant::now() < deadline
        && client
            .get(&url)
            .send()
            .await
            .is_ok_and(|reply| reply.status() == 200)
    {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    publish(dir, &replicas.iter().map(|r| r.grpc).collect::<Vec<_>>());
    leaving
}

async fn session(grpc: u16) -> Session {
    let client = CharonClient::connect(format!("http://127.0.0.1:{grpc}"))
        .await
        .expect("a replica");
    Session::open(client).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replicas_scale_and_die_under_load_with_exact_decisions() {
    let envoy = find_envoy();
    let dir = tempfile::tempdir().expect("tempdir");
    let config = dir.path().join("limits.yaml");
    std::fs::write(&config, CONFIG).expect("limits written");
    let redis = RedisServer::start();
    let http = reqwest::Client::builder()
        .timeout(Duration::from_secs(5))
        .build()
        .expect("a client");

    let mut replicas: Vec<Replica> = (0..2)
        .map(|_| start_replica(dir.path(), &config, &redis.url()))
        .collect();
    for replica in &mut replicas {
        wait_replica_ready(&http, replica).await;
    }
    publish(
        dir.path(),
        &replicas.iter().map(|r| r.grpc).collect::<Vec<_>>(),
    );

    let upstream = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let upstream_port = upstream.local_addr().expect("addr").port();
    tokio::spawn(async move {
        let app = axum::Router::new().fallback(|| async { "upstream ok" });
        axum::serve(upstream, app).await.expect("upstream server");
    });
    let [listen, envoy_admin] = free_ports::<2>();
    let envoy_yaml = dir.path().join("envoy.yaml");
    std::fs::write(
        &envoy_yaml,
        envoy_config(dir.path(), listen, envoy_admin, upstream_port),
    )
    .expect("envoy config written");
    let mut envoy = spawn_envoy(&envoy, &envoy_yaml, envoy_admin, dir.path());
    wait_ready(
        &http,
        &format!("http://127.0.0.1:{envoy_admin}/ready"),
        &mut envoy,
    )
    .await;

    let started_day = charon::clock::SystemClock.now_ms() / 86_400_000;
    let stop = Arc::new(AtomicBool::new(false));
    let tallies = Arc::new(Mutex::new(HashMap::new()));
    let load = start_load(
        http.clone(),
        format!("http://127.0.0.1:{listen}/"),
        stop.clone(),
        tallies.clone(),
    );

    // 2 -> 5 replicas.
    tokio::time::sleep(Duration::from_secs(2)).await;
    for _ in 0..3 {
        let mut replica = start_replica(dir.path(), &config, &redis.url());
        wait_replica_ready(&http, &mut replica).await;
        replicas.push(replica);
    }
    publish(
        dir.path(),
        &replicas.iter().map(|r| r.grpc).collect::<Vec<_>>(),
    );
    tokio::time::sleep(Duration::from_secs(2)).await;

    // A replica holding copies is SIGKILLed; its endpoint goes a second
    // later, as a failing readiness probe would take it.
    let mut holder = session(replicas[1].grpc).await;
    assert_eq!(holder.hold("edge", "pool", "jobs", 3).await.0, 3);
    let mut witness = session(replicas[0].grpc).await;
    assert_eq!(
        witness.hold("edge", "pool", "jobs", 1).await.0,
        0,
        "all 3 held"
    );
    let mut killed = replicas.remove(1);
    killed.proc.kill();
    let killed_at = Instant::now();
    let reaped = loop {
        if witness.hold("edge", "pool", "jobs", 3).await.0 == 3 {
            break killed_at.elapsed();
        }
        assert!(
            killed_at.elapsed() < Duration::from_secs(10),
            "the killed replica's copies were not reaped"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    drop(holder);
    publish(
        dir.path(),
        &replicas.iter().map(|r| r.grpc).collect::<Vec<_>>(),
    );
    tokio::time::sleep(Duration::from_secs(1)).await;

    // One replica drained by SIGTERM, then back to 2.
    let mut gone = vec![drain(&http, dir.path(), &mut replicas, 1).await];
    tokio::time::sleep(Duration::from_secs(1)).await;
    while replicas.len() > 2 {
        gone.push(drain(&http, dir.path(), &mut replicas, 2).await);
    }
    tokio::time::sleep(Duration::from_secs(3)).await;
    stop.store(true, Ordering::SeqCst);
    for worker in load {
        worker.await.expect("a load worker");
    }
    for mut replica in gone {
        let deadline = Instant::now() + Duration::from_secs(20);
        while replica.proc.exited().is_none() {
            assert!(Instant::now() < deadline, "a drained replica did not exit");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        assert!(
            replica.proc.exited().is_some_and(|status| status.success()),
            "a drained replica exited with an error"
        );
    }

    let tallies = tallies.lock().expect("tallies").clone();
    let sent: u64 = tallies.values().map(|t| t.sent).sum();
    let failed: Vec<u16> = tallies.values().flat_map(|t| t.failed.clone()).collect();
    let lost: u64 = tallies
        .values()
        .map(|t| t.sent.min(LIMIT) - t.admitted.min(t.sent.min(LIMIT)))
        .sum();
    eprintln!(
        "sent {sent}, failed {}, admitted short of exact by {lost} in all, copies reaped after {reaped:?}; per tenant: {tallies:?}",
        failed.len()
    );
    let stats = http
        .get(format!(
            "http://127.0.0.1:{envoy_admin}/stats?filter=charon|ratelimit"
        ))
        .send()
        .await
        .expect("stats")
        .text()
        .await
        .expect("stats text");
    // What Envoy's retries and ejections absorbed.
    for line in stats.lines().filter(|line| {
        line.starts_with("cluster.charon.upstream_rq_retry")
            || line.starts_with("cluster.charon.upstream_cx_connect_fail")
            || line.starts_with("cluster.charon.outlier_detection.ejections_enforced_total")
    }) {
        eprintln!("{line}");
    }
    assert!(failed.is_empty(), "requests failed: {failed:?}");
    if charon::clock::SystemClock.now_ms() / 86_400_000 != started_day {
        eprintln!("the day's window turned during the run: admissions not compared");
        return;
    }
    for (tenant, tally) in &tallies {
        assert!(
            tally.admitted <= LIMIT,
            "tenant {tenant} over its limit: {tally:?}"
        );
        assert!(
            tally.sent > LIMIT,
            "tenant {tenant} never reached its limit: {tally:?}"
        );
    }
    assert!(
        lost <= IN_FLIGHT as u64,
        "admitted short of the limits by {lost}, more than the {IN_FLIGHT} calls in flight at the kill"
    );
    // The heartbeat ttl (600 ms) and one reap interval (100 ms), plus one
    // reaper lease if the killed replica was the reaper, with a margin.
    assert!(reaped < Duration::from_secs(5), "reaped after {reaped:?}");
}
