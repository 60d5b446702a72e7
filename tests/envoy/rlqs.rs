//! Envoy's Rate Limit Quota Service with real Envoys
//! (examples/envoy/rlqs.yaml): two Envoys report one tenant's bucket to the
//! real `charon`, each gets its share of the tenant's 10 requests per second
//! as a token bucket, and together they admit the limit, with reports to
//! Charon rather than a call per request.

use std::fs;
use std::process::Command;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use super::envoy_e2e::{
    Proc, example_with_ports, find_envoy, free_ports, manifest_dir, spawn_envoy,
};
use crate::support::sidecar::metric_value;

const READY: Duration = Duration::from_secs(30);

async fn wait_ready(client: &reqwest::Client, url: &str, proc: &mut Proc) {
    let deadline = Instant::now() + READY;
    loop {
        assert!(proc.exited().is_none(), "a process exited; its log follows");
        if client
            .get(url)
            .send()
            .await
            .is_ok_and(|r| r.status() == 200)
        {
            return;
        }
        assert!(Instant::now() < deadline, "not ready: {url}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Admitted and refused requests per second of the run, for one Envoy.
struct Tally {
    admitted: Vec<AtomicU64>,
}

/// Sends `per_second` requests a second for tenant acme through `port`
/// for `seconds`, counting 200s per second from `start`.
async fn load(
    client: reqwest::Client,
    port: u16,
    per_second: u64,
    seconds: u64,
    start: tokio::time::Instant,
    tally: Arc<Tally>,
) {
    let gap = Duration::from_secs(1) / per_second as u32;
    let mut tick = tokio::time::interval_at(start, gap);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    while start.elapsed() < Duration::from_secs(seconds) {
        tick.tick().await;
        let second = start.elapsed().as_secs() as usize;
        let status = client
            .get(format!("http://127.0.0.1:{port}/"))
            .header("x-tenant", "acme")
            .send()
            .await
            .map_or(0, |reply| reply.status().as_u16());
        if status == 200
            && let Some(count) = tally.admitted.get(second)
        {
            count.fetch_add(1, Ordering::Relaxed);
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_envoys_share_a_buckets_limit_through_rlqs() {
    let dir = tempfile::tempdir().expect("temp dir");
    let limits = manifest_dir().join("examples/envoy/rlqs-limits.yaml");
    let upstream = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind upstream");
    let upstream_port = upstream.local_addr().expect("upstream addr").port();
    tokio::spawn(async move {
        let app = axum::Router::new().route("/", axum::routing::get(|| async { "ok" }));
        axum::serve(upstream, app).await.expect("upstream server");
    });
    let [grpc, sidecar_admin, listen_a, admin_a, listen_b, admin_b] = free_ports::<6>();
    let mut sidecar = Proc::spawn(
        "charon",
        Command::new(env!("CARGO_BIN_EXE_charon"))
            .env("NO_COLOR", "1")
            .env("CHARON_LOG_LEVEL", "charon=debug,info")
            .arg("serve")
            .arg("--config")
            .arg(&limits)
            .arg("--grpc-addr")
            .arg(format!("127.0.0.1:{grpc}"))
            .arg("--admin-addr")
            .arg(format!("127.0.0.1:{sidecar_admin}")),
        dir.path(),
    );
    let mut envoys = Vec::new();
    for (name, listen, admin) in [("a", listen_a, admin_a), ("b", listen_b, admin_b)] {
        let own = dir.path().join(name);
        fs::create_dir_all(&own).expect("a directory per Envoy");
        let config = own.join("envoy.yaml");
        let yaml = example_with_ports("rlqs.yaml", listen, admin, upstream_port, grpc);
        fs::write(&config, yaml).expect("write envoy.yaml");
        envoys.push((spawn_envoy(&find_envoy(), &config, admin, &own), admin));
    }
    let client = reqwest::Client::builder()
        .no_proxy()
        .timeout(Duration::from_secs(5))
        .build()
        .expect("reqwest client");
    wait_ready(
        &client,
        &format!("http://127.0.0.1:{sidecar_admin}/readyz"),
        &mut sidecar,
    )
    .await;
    for (envoy, admin) in &mut envoys {
        wait_ready(&client, &format!("http://127.0.0.1:{admin}/ready"), envoy).await;
    }

    // 30 requests a second through each Envoy, for 9 seconds: three times
    // the tenant's limit of 10 a second together.
    const SECONDS: u64 = 9;
    let start = tokio::time::Instant::now() + Duration::from_millis(100);
    let tallies: Vec<Arc<Tally>> = (0..2)
        .map(|_| {
            Arc::new(Tally {
                admitted: (0..SECONDS).map(|_| AtomicU64::new(0)).collect(),
            })
        })
        .collect();
    let runs: Vec<_> = [listen_a, listen_b]
        .into_iter()
        .zip(&tallies)
        .map(|(port, tally)| {
            tokio::spawn(load(
                client.clone(),
                port,
                30,
                SECONDS,
                start,
                tally.clone(),
            ))
        })
        .collect();
    for run in runs {
        run.await.expect("a load");
    }
    let per_second: Vec<Vec<u64>> = tallies
        .iter()
        .map(|tally| {
            tally
                .admitted
                .iter()
                .map(|count| count.load(Ordering::Relaxed))
                .collect()
        })
        .collect();
    // Each new assignment starts with a full bucket in Envoy, so the first
    // second admits more (measured: 10 + 10, then 5 + 5 every second).
    // From the second on, any five seconds: the limit, within 5 %, half
    // each.
    let context = format!("admitted per second: {per_second:?}");
    eprintln!("{context}");
    for from in 1..=(SECONDS as usize - 5) {
        let span = |envoy: usize| per_second[envoy][from..from + 5].iter().sum::<u64>();
        let (a, b) = (span(0), span(1));
        assert!(
            (47..=53).contains(&(a + b)),
            "{a} + {b} from {from} s; {context}"
        );
        assert!(
            (20..=30).contains(&a) && (20..=30).contains(&b),
            "{context}"
        );
    }

    // Reports, not a call per request: a few answers a second per Envoy
    // against 540 requests, and no ShouldRateLimit at all.
    let metrics = client
        .get(format!("http://127.0.0.1:{sidecar_admin}/metrics"))
        .send()
        .await
        .expect("metrics")
        .text()
        .await
        .expect("metrics text");
    let assigned =
        metric_value(&metrics, "charon_rlqs_buckets_total{outcome=\"assigned\"}").unwrap_or(0.0);
    eprintln!("decided {assigned} times");
    assert!(
        (4.0..=108.0).contains(&assigned),
        "{assigned} decisions; {context}"
    );
    let decisions: f64 = metrics
        .lines()
        .filter(|line| line.starts_with("charon_decisions_total{"))
        .filter_map(|line| line.rsplit(' ').next()?.parse::<f64>().ok())
        .sum();
    assert_eq!(decisions, 0.0, "no ShouldRateLimit");
}
