//! A concurrency limit behind a real Envoy (examples/envoy/concurrency.yaml
//! and concurrency-limits.yaml): Envoy takes a slot when a request starts
//! (`hits_addend` 1) and gives it back when its stream is done
//! (`is_negative_hits`, Envoy 1.38 and later), for refused requests too.
//!
//! - Under sustained overload (eight callers of one user, two slots, long
//!   requests) the upstream never holds more than two of that user's
//!   requests at once, and the slots are used again second after second.
//! - An Envoy SIGKILLed with requests in flight never gives their slots
//!   back: they are taken until the limit's `max_hold`, no longer, and are
//!   counted as `unreturned`.

use std::fs;
use std::process::Command;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use axum::extract::State;
use axum::http::HeaderMap;

use super::envoy_e2e::{
    Proc, example_with_ports, find_envoy, free_ports, manifest_dir, spawn_envoy,
};

const READY: Duration = Duration::from_secs(30);
/// The slots of concurrency-limits.yaml.
const SLOTS: u64 = 2;

/// The upstream: how many requests it holds now, and the most it held.
#[derive(Default)]
struct Upstream {
    now: AtomicU64,
    most: AtomicU64,
}

/// One request held by the upstream, counted out when it ends or is dropped
/// (its Envoy gone).
struct Held(Arc<Upstream>);

impl Drop for Held {
    fn drop(&mut self) {
        self.0.now.fetch_sub(1, Ordering::SeqCst);
    }
}

/// Answers after `x-hold-ms` milliseconds.
async fn serve(State(upstream): State<Arc<Upstream>>, headers: HeaderMap) -> &'static str {
    let now = upstream.now.fetch_add(1, Ordering::SeqCst) + 1;
    upstream.most.fetch_max(now, Ordering::SeqCst);
    let _held = Held(upstream.clone());
    let ms = headers
        .get("x-hold-ms")
        .and_then(|value| value.to_str().ok()?.parse().ok())
        .unwrap_or(200);
    tokio::time::sleep(Duration::from_millis(ms)).await;
    "done"
}

/// Charon on the example's limits (`max_hold` replaced by `hold`), an
/// upstream, and a real Envoy in front, which can be killed and replaced.
struct Gate {
    upstream: Arc<Upstream>,
    upstream_port: u16,
    grpc: u16,
    sidecar_admin: u16,
    client: reqwest::Client,
    envoy: Option<(Proc, u16)>,
    _sidecar: Proc,
    dir: tempfile::TempDir,
}

impl Gate {
    async fn start(hold: &str) -> Gate {
        let dir = tempfile::tempdir().expect("temp dir");
        let example =
            fs::read_to_string(manifest_dir().join("examples/envoy/concurrency-limits.yaml"))
                .expect("read examples/envoy/concurrency-limits.yaml");
        assert_eq!(example.matches("max_hold: 60s").count(), 1);
        let config = dir.path().join("limits.yaml");
        fs::write(
            &config,
            example.replace("max_hold: 60s", &format!("max_hold: {hold}")),
        )
        .expect("write limits");
        let upstream = Arc::new(Upstream::default());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind upstream");
        let upstream_port = listener.local_addr().expect("upstream addr").port();
        let app = axum::Router::new()
            .fallback(serve)
            .with_state(upstream.clone());
        tokio::spawn(async move {
            axum::serve(listener, app).await.expect("upstream server");
        });
        let [grpc, sidecar_admin] = free_ports::<2>();
        let sidecar = Proc::spawn(
            "charon",
            Command::new(env!("CARGO_BIN_EXE_charon"))
                .env("NO_COLOR", "1")
                .arg("serve")
                .arg("--config")
                .arg(&config)
                .arg("--grpc-addr")
                .arg(format!("127.0.0.1:{grpc}"))
                .arg("--admin-addr")
                .arg(format!("127.0.0.1:{sidecar_admin}")),
            dir.path(),
        );
        let client = reqwest::Client::builder()
            .no_proxy()
            .timeout(Duration::from_secs(120))
            .pool_max_idle_per_host(16)
            .build()
            .expect("reqwest client");
        let mut gate = Gate {
            upstream,
            upstream_port,
            grpc,
            sidecar_admin,
            client,
            envoy: None,
            _sidecar: sidecar,
            dir,
        };
        gate.wait_ready(&format!("http://127.0.0.1:{sidecar_admin}/readyz"))
            .await;
        gate.start_envoy().await;
        gate
    }

    async fn wait_ready(&mut self, url: &str) {
        let deadline = Instant::now() + READY;
        loop {
            if let Some((envoy, _)) = &mut self.envoy {
                assert!(envoy.exited().is_none(), "Envoy exited; its log follows");
            }
            if self
                .client
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

    /// A new Envoy on the example, on fresh ports.
    async fn start_envoy(&mut self) {
        let [listen, admin] = free_ports::<2>();
        let yaml = example_with_ports(
            "concurrency.yaml",
            listen,
            admin,
            self.upstream_port,
            self.grpc,
        );
        // A busy two-core machine: a refund that missed its deadline would
        // hold its slot until `max_hold`.
        assert_eq!(yaml.matches("  timeout: 0.25s").count(), 1);
        let yaml = yaml.replace("  timeout: 0.25s", "  timeout: 2s");
        let path = self.dir.path().join(format!("envoy-{listen}.yaml"));
        fs::write(&path, yaml).expect("write envoy.yaml");
        let envoy = spawn_envoy(&find_envoy(), &path, admin, self.dir.path());
        self.envoy = Some((envoy, listen));
        self.wait_ready(&format!("http://127.0.0.1:{admin}/ready"))
            .await;
    }

    /// SIGKILL: Envoy gives nothing back.
    fn kill_envoy(&mut self) {
        if let Some((mut envoy, _)) = self.envoy.take() {
            envoy.kill();
        }
    }

    /// One request of `user` through Envoy, held `hold_ms` by the upstream;
    /// its status.
    fn request(
        &self,
        user: &str,
        hold_ms: u64,
    ) -> impl std::future::Future<Output = Result<u16, String>> + Send + 'static {
        let listen = self.envoy.as_ref().map_or(0, |(_, listen)| *listen);
        let sent = self
            .client
            .get(format!("http://127.0.0.1:{listen}/work"))
            .header("x-user", user)
            .header("x-hold-ms", hold_ms.to_string())
            .send();
        async move {
            let reply = sent.await.map_err(|error| error.to_string())?;
            let status = reply.status().as_u16();
            let _ = reply.bytes().await;
            Ok(status)
        }
    }

    async fn metrics(&self) -> String {
        let url = format!("http://127.0.0.1:{}/metrics", self.sidecar_admin);
        match self.client.get(url).send().await {
            Ok(reply) => reply.text().await.unwrap_or_default(),
            Err(_) => String::new(),
        }
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn under_sustained_overload_the_upstream_never_holds_more_than_the_slots() {
    let gate = Arc::new(Gate::start("60s").await);
    let started = Instant::now();
    const SECONDS: u64 = 4;
    // Eight callers of one user, each asking again 20 ms after a refusal,
    // for four seconds; the upstream holds each admitted request 200 ms.
    let callers: Vec<_> = (0..8)
        .map(|_| {
            let gate = gate.clone();
            tokio::spawn(async move {
                let mut admitted = Vec::new();
                let mut refused = 0u64;
                while started.elapsed() < Duration::from_secs(SECONDS) {
                    match gate.request("ann", 200).await {
                        Ok(200) => admitted.push(started.elapsed()),
                        Ok(429) => {
                            refused += 1;
                            tokio::time::sleep(Duration::from_millis(20)).await;
                        }
                        other => panic!("Envoy answered {other:?}"),
                    }
                }
                (admitted, refused)
            })
        })
        .collect();
    let mut admitted = Vec::new();
    let mut refused = 0;
    for caller in callers {
        let (times, refusals) = caller.await.expect("a caller");
        admitted.extend(times);
        refused += refusals;
    }
    let most = gate.upstream.most.load(Ordering::SeqCst);
    assert!(
        most <= SLOTS,
        "the upstream held {most} of one user's requests at once; the limit is {SLOTS}"
    );
    assert!(refused > 0, "eight callers on two slots were never refused");
    // Every second, the slots were taken again.
    let per_second: Vec<usize> = (0..SECONDS)
        .map(|second| admitted.iter().filter(|at| at.as_secs() == second).count())
        .collect();
    assert!(
        per_second.iter().all(|&n| n >= SLOTS as usize),
        "admitted per second {per_second:?} (two slots, 200 ms requests: up to 10 a second); refused {refused}"
    );
    // Another user has slots of its own meanwhile.
    assert_eq!(gate.request("bob", 10).await, Ok(200));
}

#[tokio::test(flavor = "multi_thread")]
async fn a_killed_envoys_slots_come_back_after_max_hold() {
    const HOLD: Duration = Duration::from_secs(5);
    let mut gate = Gate::start("5s").await;
    let taken = Instant::now();
    // Two requests that would hold their slots for a minute.
    let hanging: Vec<_> = (0..SLOTS)
        .map(|_| tokio::spawn(gate.request("cat", 60_000)))
        .collect();
    let deadline = Instant::now() + Duration::from_secs(10);
    while gate.upstream.now.load(Ordering::SeqCst) < SLOTS {
        assert!(Instant::now() < deadline, "the two requests never arrived");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(
        gate.request("cat", 10).await,
        Ok(429),
        "both slots are taken"
    );

    gate.kill_envoy();
    for request in hanging {
        let _ = request.await;
    }
    gate.start_envoy().await;
    let mut answers = Vec::new();
    let back = loop {
        let status = gate.request("cat", 10).await;
        answers.push(status.clone());
        if status == Ok(200) {
            break taken.elapsed();
        }
        assert_eq!(status, Ok(429), "answers so far: {answers:?}");
        assert!(
            taken.elapsed() < HOLD + Duration::from_secs(5),
            "the slots are still taken {:?} after they were; max_hold is {HOLD:?}",
            taken.elapsed()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert!(
        back >= HOLD,
        "a slot came back after {back:?}, before max_hold ({HOLD:?}) had passed"
    );
    assert_eq!(answers.first(), Some(&Ok(429)), "{answers:?}");
    let metrics = gate.metrics().await;
    let unreturned = metrics
        .lines()
        .find(|line| line.contains("outcome=\"unreturned\""))
        .unwrap_or_default()
        .to_owned();
    assert!(
        unreturned.ends_with(" 2"),
        "the two hits never given back are counted: {unreturned:?} in {}",
        metrics
            .lines()
            .filter(|l| l.starts_with("charon_limit"))
            .collect::<Vec<_>>()
            .join("\n")
    );
}
