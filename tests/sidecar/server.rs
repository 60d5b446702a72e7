//! The sidecar as users run it: the real `charon` binary on real sockets,
//! driven by a real gRPC client. Startup, answers, bad input, health,
//! metrics, reload (file change, ConfigMap symlink swap, SIGHUP), shutdown.

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use bytes::{Buf, BufMut};
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::Entry;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::Code;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
use envoy_types::pb::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};
use tonic::codec::{Codec, DecodeBuf, Decoder, EncodeBuf, Encoder};
use tonic::transport::Channel;

const CONFIG: &str = r#"
domain: edge
descriptors:
  - key: tenant
    rate_limit: {unit: hour, requests_per_unit: 3}
  - key: customer
    resource: api
resources:
  api:
    rate:
      tiers:
        - {limit: 2, window: 1h, active: forever}
"#;

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free port")
}

/// A running sidecar, killed (by PID) when dropped.
struct Sidecar {
    child: Child,
    grpc: u16,
    admin: u16,
    /// How to start it again, on other ports, if it could not bind.
    relaunch: Launch,
}

/// A sidecar's flags and where its log goes.
struct Launch {
    config: PathBuf,
    extra: Vec<String>,
    stderr: Box<dyn Fn() -> Stdio + Send>,
}

impl Launch {
    /// `charon serve` on two ports picked free: the process and its ports.
    fn spawn(&self) -> (Child, u16, u16) {
        let (grpc, admin) = (free_port(), free_port());
        let child = Command::new(env!("CARGO_BIN_EXE_charon"))
            .arg("serve")
            .arg("--config")
            .arg(&self.config)
            .args(["--grpc-addr", &format!("127.0.0.1:{grpc}")])
            .args(["--admin-addr", &format!("127.0.0.1:{admin}")])
            .args(&self.extra)
            .env("RUST_LOG", "info")
            .env_remove("NO_COLOR")
            .stdout(Stdio::null())
            .stderr((self.stderr)())
            .spawn()
            .expect("charon starts");
        (child, grpc, admin)
    }
}

/// What `charon serve` says on stderr when it refuses to start on `config`
/// with `extra` flags (it must exit non-zero).
fn refused_start(config: &Path, extra: &[&str]) -> String {
    let output = Command::new(env!("CARGO_BIN_EXE_charon"))
        .args(["serve", "--config"])
        .arg(config)
        .args(["--grpc-addr", &format!("127.0.0.1:{}", free_port())])
        .args(["--admin-addr", &format!("127.0.0.1:{}", free_port())])
        .args(extra)
        .output()
        .expect("charon runs");
    assert!(!output.status.success());
    String::from_utf8_lossy(&output.stderr).into_owned()
}

impl Sidecar {
    fn start(config: &Path) -> Self {
        Self::start_with(config, &[], Stdio::null)
    }

    /// With more flags, and stderr (the log) where `stderr` says.
    fn start_with(
        config: &Path,
        extra: &[&str],
        stderr: impl Fn() -> Stdio + Send + 'static,
    ) -> Self {
        Self::launch(Launch {
            config: config.to_owned(),
            extra: extra.iter().map(|flag| (*flag).to_owned()).collect(),
            stderr: Box::new(stderr),
        })
    }

    fn launch(relaunch: Launch) -> Self {
        let (child, grpc, admin) = relaunch.spawn();
        Self {
            child,
            grpc,
            admin,
            relaunch,
        }
    }

    /// Waits until `/readyz` answers 200. A sidecar that exits first is
    /// started again on other ports (twice at most): a port picked free can
    /// be taken by another process before the sidecar binds it.
    async fn ready(mut self) -> Self {
        let mut relaunches = 0;
        let mut deadline = Instant::now() + Duration::from_secs(30);
        loop {
            if let Ok(response) = reqwest::get(self.admin_url("/readyz")).await
                && response.status().is_success()
            {
                return self;
            }
            if let Ok(Some(status)) = self.child.try_wait() {
                assert!(
                    relaunches < 2,
                    "the sidecar exited before it was ready, three times: {status}"
                );
                relaunches += 1;
                (self.child, self.grpc, self.admin) = self.relaunch.spawn();
                deadline = Instant::now() + Duration::from_secs(30);
                continue;
            }
            assert!(Instant::now() < deadline, "sidecar not ready within 30 s");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    fn admin_url(&self, path: &str) -> String {
        format!("http://127.0.0.1:{}{path}", self.admin)
    }

    async fn client(&self) -> RateLimitServiceClient<Channel> {
        RateLimitServiceClient::connect(format!("http://127.0.0.1:{}", self.grpc))
            .await
            .expect("connects")
    }

    async fn metrics(&self) -> String {
        reqwest::get(self.admin_url("/metrics"))
            .await
            .expect("metrics answer")
            .text()
            .await
            .expect("metrics text")
    }

    fn signal(&self, name: &str) {
        let status = Command::new("kill")
            .args([format!("-{name}"), self.child.id().to_string()])
            .status()
            .expect("kill runs");
        assert!(status.success());
    }

    fn wait_exit(&mut self, within: Duration) -> Option<std::process::ExitStatus> {
        let deadline = Instant::now() + within;
        while Instant::now() < deadline {
            if let Ok(Some(status)) = self.child.try_wait() {
                return Some(status);
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        None
    }
}

impl Drop for Sidecar {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn write_config(dir: &Path, name: &str, yaml: &str) -> PathBuf {
    let path = dir.join(name);
    std::fs::write(&path, yaml).expect("config written");
    path
}

fn request(domain: &str, entries: &[(&str, &str)]) -> RateLimitRequest {
    RateLimitRequest {
        domain: domain.to_owned(),
        descriptors: vec![RateLimitDescriptor {
            entries: entries
                .iter()
                .map(|(k, v)| Entry {
                    key: (*k).to_owned(),
                    value: (*v).to_owned(),
                })
                .collect(),
            ..Default::default()
        }],
        hits_addend: 0,
    }
}

async fn ask(
    client: &mut RateLimitServiceClient<Channel>,
    req: RateLimitRequest,
) -> RateLimitResponse {
    client
        .should_rate_limit(req)
        .await
        .expect("an answer")
        .into_inner()
}

/// Polls `check` until it holds (reloads are asynchronous).
async fn eventually<F, Fut>(what: &str, mut check: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let deadline = Instant::now() + Duration::from_secs(20);
    while !check().await {
        assert!(Instant::now() < deadline, "never happened: {what}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn answers_envoy_with_statuses_in_order() {
    let dir = tempfile::tempdir().expect("tempdir");
    let sidecar = Sidecar::start(&write_config(dir.path(), "edge.yaml", CONFIG))
        .ready()
        .await;
    let mut client = sidecar.client().await;
    let mut req = request("edge", &[("tenant", "acme")]);
    req.descriptors
        .push(request("edge", &[("nothing", "x")]).descriptors.remove(0));
    req.descriptors
        .push(request("edge", &[("customer", "c1")]).descriptors.remove(0));
    let answer = ask(&mut client, req).await;
    assert_eq!(answer.overall_code, Code::Ok as i32);
    assert_eq!(answer.statuses.len(), 3);
    let fixed = &answer.statuses[0];
    let limit = fixed.current_limit.as_ref().expect("a limit");
    assert_eq!(limit.requests_per_unit, 3);
    assert_eq!(limit.unit, 3, "HOUR");
    assert_eq!(fixed.limit_remaining, 2);
    let reset = fixed.duration_until_reset.expect("a reset");
    assert!(reset.seconds <= 3_600 && (reset.seconds, reset.nanos) > (0, 0));
    assert!(answer.statuses[1].current_limit.is_none());
    let tiers = &answer.statuses[2];
    let tier_limit = tiers.current_limit.as_ref().expect("tier limit");
    assert_eq!(tier_limit.requests_per_unit, 2);
    // Envoy's units cannot say every window: the name carries the real one.
    assert_eq!(tier_limit.name, "api/tier1/1h");
    assert_eq!(tiers.limit_remaining, 1);

    ask(&mut client, request("edge", &[("tenant", "acme")])).await;
    ask(&mut client, request("edge", &[("tenant", "acme")])).await;
    let over = ask(&mut client, request("edge", &[("tenant", "acme")])).await;
    assert_eq!(over.overall_code, Code::OverLimit as i32);
    assert_eq!(over.statuses[0].code, Code::OverLimit as i32);
    assert_eq!(over.statuses[0].limit_remaining, 0);

    // Metrics: decisions by namespace and result, and the latency histogram.
    let metrics = sidecar.metrics().await;
    assert!(
        metrics.contains(r#"charon_decisions_total{namespace="edge",result="ok"} 3"#),
        "{metrics}"
    );
    assert!(metrics.contains(r#"charon_decisions_total{namespace="edge",result="over_limit"} 1"#));
    assert!(metrics.contains("charon_decision_latency_seconds_count 4"));
    assert!(!metrics.contains("acme"), "no per-domain labels");
    // Two keys hold state: acme's window and c1's tiers.
    assert!(metrics.contains("charon_store_keys 2"), "{metrics}");
    assert!(metrics.contains("charon_store_unrecorded_decisions 0"));
}

#[tokio::test(flavor = "multi_thread")]
async fn bad_requests_get_clear_errors_and_others_keep_being_served() {
    let dir = tempfile::tempdir().expect("tempdir");
    let sidecar = Sidecar::start(&write_config(dir.path(), "edge.yaml", CONFIG))
        .ready()
        .await;
    let mut client = sidecar.client().await;

    let code_of = |result: Result<tonic::Response<RateLimitResponse>, tonic::Status>| match result {
        Ok(_) => panic!("expected an error"),
        Err(status) => (status.code(), status.message().to_owned()),
    };
    let (code, message) = code_of(
        client
            .should_rate_limit(request("", &[("tenant", "x")]))
            .await,
    );
    assert_eq!(code, tonic::Code::InvalidArgument);
    assert!(message.contains("domain"), "{message}");
    let mut empty = request("edge", &[]);
    empty.descriptors.clear();
    let (code, message) = code_of(client.should_rate_limit(empty).await);
    assert_eq!(code, tonic::Code::InvalidArgument);
    assert!(message.contains("descriptors"), "{message}");
    let huge_value = "v".repeat(1 << 20);
    let (code, _) = code_of(
        client
            .should_rate_limit(request("edge", &[("tenant", &huge_value)]))
            .await,
    );
    assert_eq!(code, tonic::Code::InvalidArgument);
    let deep: Vec<(String, String)> = (0..10_000)
        .map(|i| (format!("k{i}"), "v".to_owned()))
        .collect();
    let deep: Vec<(&str, &str)> = deep.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
    let (code, _) = code_of(client.should_rate_limit(request("edge", &deep)).await);
    assert_eq!(code, tonic::Code::InvalidArgument);

    let mut max_hits = request("edge", &[("tenant", "greedy")]);
    max_hits.hits_addend = u32::MAX;
    assert_eq!(
        ask(&mut client, max_hits).await.overall_code,
        Code::OverLimit as i32
    );
    // Nothing was consumed by the rejected request.
    let after = ask(&mut client, request("edge", &[("tenant", "greedy")])).await;
    assert_eq!(after.statuses[0].limit_remaining, 2);

    // Invalid UTF-8 in a protobuf string: an error, not a crash.
    let status = raw_call(sidecar.grpc, invalid_utf8_request())
        .await
        .expect_err("refused");
    assert_eq!(status.code(), tonic::Code::InvalidArgument, "{status:?}");
    assert!(status.message().contains("UTF-8"), "{status:?}");
    // Bytes that are not protobuf at all: the same.
    let status = raw_call(sidecar.grpc, vec![0xff; 64])
        .await
        .expect_err("refused");
    assert_eq!(status.code(), tonic::Code::InvalidArgument, "{status:?}");

    // And everyone else is still served.
    let ok = ask(&mut client, request("edge", &[("tenant", "fine")])).await;
    assert_eq!(ok.overall_code, Code::Ok as i32);
}

/// A RateLimitRequest whose domain is not UTF-8, encoded by hand.
fn invalid_utf8_request() -> Vec<u8> {
    let entry = [0x0a, 0x01, b'k', 0x12, 0x01, b'v'];
    let mut descriptor = vec![0x0a, entry.len() as u8];
    descriptor.extend_from_slice(&entry);
    let mut message = vec![0x0a, 0x02, 0xff, 0xfe, 0x12, descriptor.len() as u8];
    message.extend_from_slice(&descriptor);
    message
}

/// Sends raw protobuf bytes to ShouldRateLimit.
async fn raw_call(port: u16, body: Vec<u8>) -> Result<Vec<u8>, tonic::Status> {
    let channel = Channel::from_shared(format!("http://127.0.0.1:{port}"))
        .expect("uri")
        .connect()
        .await
        .expect("connects");
    let mut grpc = tonic::client::Grpc::new(channel);
    grpc.ready().await.expect("ready");
    let path = tonic::codegen::http::uri::PathAndQuery::from_static(
        "/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit",
    );
    grpc.unary(tonic::Request::new(body), path, RawCodec)
        .await
        .map(tonic::Response::into_inner)
}

#[derive(Default, Clone, Copy)]
struct RawCodec;

impl Codec for RawCodec {
    type Encode = Vec<u8>;
    type Decode = Vec<u8>;
    type Encoder = RawCodec;
    type Decoder = RawCodec;
    fn encoder(&mut self) -> Self::Encoder {
        RawCodec
    }
    fn decoder(&mut self) -> Self::Decoder {
        RawCodec
    }
}

impl Encoder for RawCodec {
    type Item = Vec<u8>;
    type Error = tonic::Status;
    fn encode(&mut self, item: Vec<u8>, dst: &mut EncodeBuf<'_>) -> Result<(), Self::Error> {
        dst.put_slice(&item);
        Ok(())
    }
}

impl Decoder for RawCodec {
    type Item = Vec<u8>;
    type Error = tonic::Status;
    fn decode(&mut self, src: &mut DecodeBuf<'_>) -> Result<Option<Vec<u8>>, Self::Error> {
        Ok(Some(src.copy_to_bytes(src.remaining()).to_vec()))
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn the_admin_port_says_what_it_serves_at_its_root() {
    let dir = tempfile::tempdir().expect("tempdir");
    let sidecar = Sidecar::start(&write_config(dir.path(), "edge.yaml", CONFIG))
        .ready()
        .await;
    let root = reqwest::get(sidecar.admin_url("/"))
        .await
        .expect("GET / answers");
    assert_eq!(root.status(), 200);
    let index = root.text().await.expect("a body");
    assert_eq!(index, charon::server::admin::INDEX);
    // Every GET path it lists answers (not 404): the list stays true.
    let client = reqwest::Client::new();
    let mut listed = 0;
    for line in index.lines() {
        let mut words = line.split_whitespace();
        let (Some("GET"), Some(path)) = (words.next(), words.next()) else {
            continue;
        };
        listed += 1;
        let status = client
            .get(sidecar.admin_url(path))
            .send()
            .await
            .expect("answers")
            .status();
        assert_ne!(status, 404, "GET {path} is listed but not served");
    }
    assert!(listed >= 9, "{index}");
}

#[tokio::test(flavor = "multi_thread")]
async fn health_endpoints_and_grpc_health() {
    let dir = tempfile::tempdir().expect("tempdir");
    let sidecar = Sidecar::start(&write_config(dir.path(), "edge.yaml", CONFIG))
        .ready()
        .await;
    let healthz = reqwest::get(sidecar.admin_url("/healthz"))
        .await
        .expect("healthz");
    assert!(healthz.status().is_success());
    let channel = Channel::from_shared(format!("http://127.0.0.1:{}", sidecar.grpc))
        .expect("uri")
        .connect()
        .await
        .expect("connects");
    let mut health = tonic_health::pb::health_client::HealthClient::new(channel);
    for service in ["", "envoy.service.ratelimit.v3.RateLimitService"] {
        let answer = health
            .check(tonic_health::pb::HealthCheckRequest {
                service: service.to_owned(),
            })
            .await
            .expect("health answers")
            .into_inner();
        assert_eq!(
            answer.status,
            tonic_health::pb::health_check_response::ServingStatus::Serving as i32,
            "service {service:?}"
        );
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn reloads_on_change_and_keeps_the_old_config_when_the_new_one_is_bad() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = write_config(dir.path(), "edge.yaml", CONFIG);
    let sidecar = Sidecar::start(&path).ready().await;
    let mut client = sidecar.client().await;
    let remaining = |answer: RateLimitResponse| answer.statuses[0].limit_remaining;
    assert_eq!(
        remaining(ask(&mut client, request("edge", &[("tenant", "a")])).await),
        2
    );

    write_config(
        dir.path(),
        "edge.yaml",
        &CONFIG.replace("requests_per_unit: 3", "requests_per_unit: 50"),
    );
    let mut n = 0;
    eventually("the new limit applies", || {
        n += 1;
        let mut client = client.clone();
        let tenant = format!("fresh{n}");
        async move { remaining(ask(&mut client, request("edge", &[("tenant", &tenant)])).await) == 49 }
    })
    .await;

    write_config(
        dir.path(),
        "edge.yaml",
        "domain: edge\ndescriptors: [oops\n",
    );
    eventually("the bad config is rejected", || async {
        sidecar
            .metrics()
            .await
            .contains(r#"charon_config_reloads_total{result="rejected"}"#)
    })
    .await;
    assert_eq!(
        remaining(ask(&mut client, request("edge", &[("tenant", "b")])).await),
        49
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn reloads_a_configmap_symlink_swap_and_on_sighup() {
    // The layout kubelet writes: data in a timestamped directory, `..data`
    // pointing at it, and the visible file a symlink through `..data`.
    let dir = tempfile::tempdir().expect("tempdir");
    let first = dir.path().join("..2026_01_01_00_00_00.1");
    std::fs::create_dir(&first).expect("mkdir");
    write_config(&first, "edge.yaml", CONFIG);
    std::os::unix::fs::symlink("..2026_01_01_00_00_00.1", dir.path().join("..data")).expect("ln");
    std::os::unix::fs::symlink("..data/edge.yaml", dir.path().join("edge.yaml")).expect("ln");

    let sidecar = Sidecar::start(&dir.path().join("edge.yaml")).ready().await;
    let mut client = sidecar.client().await;
    assert_eq!(
        ask(&mut client, request("edge", &[("tenant", "a")]))
            .await
            .statuses[0]
            .limit_remaining,
        2
    );

    let second = dir.path().join("..2026_01_01_00_01_00.2");
    std::fs::create_dir(&second).expect("mkdir");
    write_config(
        &second,
        "edge.yaml",
        &CONFIG.replace("requests_per_unit: 3", "requests_per_unit: 7"),
    );
    std::os::unix::fs::symlink("..2026_01_01_00_01_00.2", dir.path().join("..data_tmp"))
        .expect("ln");
    std::fs::rename(dir.path().join("..data_tmp"), dir.path().join("..data")).expect("swap");
    let mut n = 0;
    eventually("the swapped config applies", || {
        n += 1;
        let mut client = client.clone();
        let tenant = format!("t{n}");
        async move {
            ask(&mut client, request("edge", &[("tenant", &tenant)]))
                .await
                .statuses[0]
                .limit_remaining
                == 6
        }
    })
    .await;

    let reloads = |text: &str| -> u64 {
        text.lines()
            .find(|l| l.starts_with(r#"charon_config_reloads_total{result="ok"}"#))
            .and_then(|l| l.rsplit(' ').next())
            .and_then(|v| v.parse().ok())
            .unwrap_or(0)
    };
    let before = reloads(&sidecar.metrics().await);
    sidecar.signal("HUP");
    eventually("SIGHUP reloads", || async {
        reloads(&sidecar.metrics().await) > before
    })
    .await;
}

#[tokio::test(flavor = "multi_thread")]
async fn reading_the_config_or_touching_other_files_does_not_reload_it() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = write_config(dir.path(), "edge.yaml", CONFIG);
    let sidecar = Sidecar::start(&path).ready().await;
    for i in 0..5 {
        std::fs::read_to_string(&path).expect("readable");
        // Files beside the config are none of its business.
        std::fs::write(dir.path().join(format!("notes-{i}.txt")), "x").expect("written");
        let status = Command::new(env!("CARGO_BIN_EXE_charon"))
            .arg("check")
            .arg(&path)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .expect("check runs");
        assert!(status.success());
    }
    // Give a (wrong) reload time to happen, then make sure none did.
    tokio::time::sleep(Duration::from_secs(1)).await;
    let metrics = sidecar.metrics().await;
    assert!(
        !metrics.contains("charon_config_reloads_total{"),
        "{metrics}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn sigterm_shuts_down_cleanly() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut sidecar = Sidecar::start(&write_config(dir.path(), "edge.yaml", CONFIG))
        .ready()
        .await;
    let mut client = sidecar.client().await;
    ask(&mut client, request("edge", &[("tenant", "a")])).await;
    sidecar.signal("TERM");
    let status = sidecar
        .wait_exit(Duration::from_secs(15))
        .expect("exits after SIGTERM");
    assert!(status.success(), "{status:?}");
}

/// A central Deployment's shutdown: after SIGTERM, `--shutdown-delay` of
/// not ready yet still answering (calls sent before the Service drops the
/// endpoint, on an open connection and on a new one), then a clean exit.
#[tokio::test(flavor = "multi_thread")]
async fn sigterm_with_a_shutdown_delay_answers_while_not_ready() {
    let dir = tempfile::tempdir().expect("tempdir");
    let config = write_config(dir.path(), "edge.yaml", CONFIG);
    let mut sidecar = Sidecar::start_with(&config, &["--shutdown-delay", "5s"], Stdio::null)
        .ready()
        .await;
    let mut open = sidecar.client().await;
    ask(&mut open, request("edge", &[("tenant", "a")])).await;
    sidecar.signal("TERM");
    let signalled = Instant::now();
    eventually("/readyz says not ready", || {
        let url = sidecar.admin_url("/readyz");
        async move {
            reqwest::get(url)
                .await
                .is_ok_and(|reply| reply.status() == 503)
        }
    })
    .await;
    // Well inside the delay: both connections are still answered.
    let answer = ask(&mut open, request("edge", &[("tenant", "b")])).await;
    assert_eq!(answer.overall_code(), Code::Ok);
    let mut fresh = sidecar.client().await;
    let answer = ask(&mut fresh, request("edge", &[("tenant", "c")])).await;
    assert_eq!(answer.overall_code(), Code::Ok);
    assert!(
        signalled.elapsed() < Duration::from_secs(5),
        "the calls took the whole delay; the test proves nothing"
    );
    assert!(
        sidecar.wait_exit(Duration::from_secs(1)).is_none(),
        "exited before the delay"
    );
    let status = sidecar
        .wait_exit(Duration::from_secs(20))
        .expect("exits after the delay");
    assert!(status.success(), "{status:?}");
    assert!(
        signalled.elapsed() >= Duration::from_secs(5),
        "exited before the delay"
    );
}

#[test]
fn refuses_to_start_on_an_invalid_config() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = write_config(
        dir.path(),
        "edge.yaml",
        "domain: edge\ndescriptors:\n  - key: k\n    rate_limit: {unit: fortnight, requests_per_unit: 1}\n",
    );
    let stderr = refused_start(&path, &[]);
    assert!(stderr.contains("edge.yaml:4:"), "{stderr}");
    assert!(stderr.contains("fortnight"), "{stderr}");
}

/// Runs a sidecar with `extra` flags through a decision, a reload failure
/// (a WARN or ERROR line) and SIGTERM, and returns everything it logged.
async fn log_of_a_short_run(extra: &[&str]) -> Vec<u8> {
    let dir = tempfile::tempdir().expect("tempdir");
    let config = write_config(dir.path(), "edge.yaml", CONFIG);
    let log = dir.path().join("stderr.log");
    let stderr = {
        let log = log.clone();
        move || Stdio::from(std::fs::File::create(&log).expect("log file"))
    };
    let sidecar = Sidecar::start_with(&config, extra, stderr);
    let ready = tokio::spawn(sidecar.ready()).await;
    let mut sidecar = ready.unwrap_or_else(|error| {
        let log = std::fs::read_to_string(&log).unwrap_or_default();
        panic!("{error}; the sidecar's log:\n{log}")
    });
    let mut client = sidecar.client().await;
    ask(&mut client, request("edge", &[("tenant", "a")])).await;
    std::fs::write(&config, "domain: [").expect("config written");
    sidecar.signal("HUP");
    eventually("the failed reload is counted", || {
        let sidecar = &sidecar;
        async move {
            sidecar
                .metrics()
                .await
                .contains("charon_config_reloads_total{result=\"rejected\"} 1")
        }
    })
    .await;
    sidecar.signal("TERM");
    let status = sidecar
        .wait_exit(Duration::from_secs(15))
        .expect("exits after SIGTERM");
    assert!(status.success(), "{status:?}");
    std::fs::read(&log).expect("log read")
}

#[tokio::test(flavor = "multi_thread")]
async fn json_logs_are_one_object_per_line() {
    let log = log_of_a_short_run(&["--log-format", "json"]).await;
    let text = String::from_utf8(log).expect("UTF-8 log");
    let lines: Vec<&str> = text.lines().collect();
    assert!(lines.len() >= 3, "{text}");
    let mut levels = std::collections::BTreeSet::new();
    for line in &lines {
        let event: serde_json::Value =
            serde_json::from_str(line).unwrap_or_else(|error| panic!("not JSON ({error}): {line}"));
        for field in ["timestamp", "level", "target", "fields"] {
            assert!(event.get(field).is_some(), "no {field}: {line}");
        }
        levels.insert(event["level"].as_str().unwrap_or_default().to_owned());
    }
    assert!(levels.contains("INFO"), "{levels:?}");
    assert!(
        levels.contains("WARN") || levels.contains("ERROR"),
        "{text}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn text_logs_to_a_file_carry_no_escape_codes() {
    let log = log_of_a_short_run(&[]).await;
    let text = String::from_utf8_lossy(&log);
    assert!(text.lines().count() >= 3, "{text}");
    assert!(
        !log.contains(&0x1b),
        "ANSI escape codes in a non-terminal log:\n{text}"
    );
    assert!(text.contains(" INFO "), "{text}");
}

#[test]
fn a_log_level_that_cannot_be_read_is_refused_at_start() {
    let dir = tempfile::tempdir().expect("tempdir");
    let config = write_config(dir.path(), "edge.yaml", CONFIG);
    let stderr = refused_start(&config, &["--log-level", "charon=loud"]);
    assert!(stderr.contains("--log-level"), "{stderr}");
    assert!(stderr.contains("charon=loud"), "{stderr}");
}

#[tokio::test(flavor = "multi_thread")]
async fn sampled_decisions_are_logged_within_the_rate_cap() {
    let dir = tempfile::tempdir().expect("tempdir");
    let config = write_config(dir.path(), "edge.yaml", CONFIG);
    let log = dir.path().join("stderr.log");
    let stderr = {
        let log = log.clone();
        move || Stdio::from(std::fs::File::create(&log).expect("log file"))
    };
    let flags = [
        "--log-format",
        "json",
        "--decision-log-sample",
        "1",
        "--decision-log-max-per-second",
        "3",
    ];
    let mut sidecar = Sidecar::start_with(&config, &flags, stderr).ready().await;
    let mut client = sidecar.client().await;
    // 3 an hour: three grants, then rejections.
    for _ in 0..10 {
        ask(&mut client, request("edge", &[("tenant", "a")])).await;
    }
    // A decision in a later second says how many were held back.
    tokio::time::sleep(Duration::from_millis(1100)).await;
    ask(&mut client, request("edge", &[("tenant", "b")])).await;
    sidecar.signal("TERM");
    sidecar
        .wait_exit(Duration::from_secs(15))
        .expect("exits after SIGTERM");
    let text = std::fs::read_to_string(&log).expect("log read");
    let events: Vec<serde_json::Value> = text
        .lines()
        .filter_map(|line| serde_json::from_str::<serde_json::Value>(line).ok())
        .filter(|event| event["target"] == "charon::decision")
        .collect();
    let decisions: Vec<&serde_json::Value> = events
        .iter()
        .filter(|event| event["fields"]["message"] == "decision")
        .map(|event| &event["fields"])
        .collect();
    let held_back: u64 = events
        .iter()
        .filter_map(|event| event["fields"]["held_back"].as_u64())
        .sum();
    // Every decision was sampled; each was logged or counted as held back
    // (the burst may straddle a second: up to twice the cap).
    assert_eq!(decisions.len() as u64 + held_back, 11, "{text}");
    assert!(decisions.len() <= 7, "the cap of 3 a second held: {text}");
    assert!(held_back >= 4, "{text}");
    let first = decisions[0];
    assert_eq!(first["namespace"], "edge");
    assert_eq!(first["descriptors"], "tenant=a");
    assert_eq!(first["outcome"], "ok");
    assert_eq!(first["limit"], "edge.tenant");
    let last = decisions.last().expect("the last decision");
    assert_eq!(last["descriptors"], "tenant=b");
    if let Some(over) = decisions.iter().find(|d| d["outcome"] == "over_limit") {
        assert!(
            over["retry_after_s"].as_u64().is_some_and(|s| s >= 1),
            "{over}"
        );
    }
}

/// The sample lines of `metrics` whose name and labels start with `prefix`.
fn samples<'m>(metrics: &'m str, prefix: &str) -> Vec<&'m str> {
    metrics
        .lines()
        .filter(|line| line.starts_with(prefix))
        .collect()
}

#[tokio::test(flavor = "multi_thread")]
async fn tier_hits_and_unconfigured_resources_are_counted_by_limit() {
    use charon::api::v1::RequestOp;
    use charon::api::v1::charon_client::CharonClient;
    let dir = tempfile::tempdir().expect("tempdir");
    write_config(dir.path(), "edge.yaml", CONFIG);
    write_config(
        dir.path(),
        "open.yaml",
        "domain: open\nsettings:\n  allow_unconfigured: true\n",
    );
    let sidecar = Sidecar::start(dir.path()).ready().await;
    // Envoy: customer c1 on resource `api` (2 an hour, one tier): two
    // grants, the second near the limit, then one over.
    let mut client = sidecar.client().await;
    for _ in 0..3 {
        ask(&mut client, request("edge", &[("customer", "c1")])).await;
    }
    // The Charon API: the same resource for domain d1, three times.
    let mut api = CharonClient::connect(format!("http://127.0.0.1:{}", sidecar.grpc))
        .await
        .expect("connects");
    let op = |namespace: &str, resource: &str, domain: &str| RequestOp {
        namespace: namespace.into(),
        resource: resource.into(),
        domain: domain.into(),
        copies: Some(1),
        min_copies: None,
    };
    for _ in 0..3 {
        api.request(op("edge", "api", "d1"))
            .await
            .expect("an answer");
    }
    // A resource `open` does not configure but allows: granted, recorded.
    for _ in 0..2 {
        api.request(op("open", "uploads", "d1"))
            .await
            .expect("an answer");
    }
    let metrics = sidecar.metrics().await;
    let expect = |line: &str| {
        assert!(
            metrics.lines().any(|l| l == line),
            "no `{line}` in:\n{metrics}"
        );
    };
    for limit in ["edge.customer", "api"] {
        expect(&format!(
            "charon_tier_hits_total{{namespace=\"edge\",limit=\"{limit}\",outcome=\"within_limit\",tier=\"1\",limited_by=\"none\"}} 2"
        ));
        expect(&format!(
            "charon_tier_hits_total{{namespace=\"edge\",limit=\"{limit}\",outcome=\"over_limit\",tier=\"1\",limited_by=\"tier\"}} 1"
        ));
    }
    expect("charon_limit_hits_total{namespace=\"edge\",limit=\"api\",outcome=\"within_limit\"} 2");
    expect("charon_limit_hits_total{namespace=\"edge\",limit=\"api\",outcome=\"near_limit\"} 1");
    expect("charon_limit_hits_total{namespace=\"edge\",limit=\"api\",outcome=\"over_limit\"} 1");
    expect("charon_unconfigured_hits_total{namespace=\"open\",resource=\"uploads\"} 2");
    assert_eq!(
        samples(&metrics, "charon_unconfigured_series_folded_total "),
        ["charon_unconfigured_series_folded_total 0"]
    );
}

/// The resident bytes of `pid`'s mappings of its own executable's code.
fn resident_code_kib(pid: u32) -> u64 {
    let smaps = std::fs::read_to_string(format!("/proc/{pid}/smaps")).unwrap_or_default();
    let exe = std::fs::read_link(format!("/proc/{pid}/exe")).unwrap_or_default();
    let exe = exe.to_string_lossy().into_owned();
    let mut in_code = false;
    let mut kib = 0;
    for line in smaps.lines() {
        let fields: Vec<&str> = line.split_whitespace().collect();
        if fields.first().is_some_and(|f| f.contains('-')) && fields.len() >= 5 {
            in_code = fields[1] == "r-xp" && line.ends_with(exe.as_str());
        } else if in_code && fields.first() == Some(&"Rss:") {
            kib += fields
                .get(1)
                .and_then(|v| v.parse::<u64>().ok())
                .unwrap_or(0);
        }
    }
    kib
}

#[cfg(target_os = "linux")]
#[tokio::test(flavor = "multi_thread")]
async fn gives_back_the_code_only_starting_ran_and_keeps_serving() {
    use crate::support::sidecar as logged;
    let dir = logged::tempdir();
    let sidecar = logged::memory_sidecar(dir.path(), CONFIG).await;
    let released = logged::eventually(
        "the startup pages are released",
        Duration::from_secs(20),
        async || {
            let log = sidecar.log();
            log.lines()
                .find(|line| line.contains("startup pages released"))
                .map(str::to_owned)
                .ok_or(log)
        },
    )
    .await;
    let kib: u64 = released
        .split("kib=")
        .nth(1)
        .and_then(|rest| rest.split_whitespace().next())
        .and_then(|n| n.parse().ok())
        .unwrap_or(0);
    // A debug build's start runs megabytes of code; idle runs little.
    let code_resident = resident_code_kib(sidecar.pid());
    assert!(
        kib > 1024 && code_resident < kib,
        "released {kib} KiB, {code_resident} KiB of code resident after: {released}"
    );

    // Serving runs the released code again, from the file.
    let mut client = RateLimitServiceClient::connect(sidecar.grpc_url())
        .await
        .expect("connects");
    for remaining in [2, 1, 0] {
        let answer = ask(&mut client, request("edge", &[("tenant", "acme")])).await;
        assert_eq!(answer.overall_code, Code::Ok as i32);
        assert_eq!(answer.statuses[0].limit_remaining, remaining);
    }
    let over = ask(&mut client, request("edge", &[("tenant", "acme")])).await;
    assert_eq!(over.overall_code, Code::OverLimit as i32);
    let answer = ask(&mut client, request("edge", &[("customer", "c1")])).await;
    assert_eq!(answer.statuses[0].limit_remaining, 1);
}
