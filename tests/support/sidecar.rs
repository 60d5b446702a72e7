//! A `charon serve` child process for end-to-end tests (admin probes,
//! metrics, readiness waits), and a Charon API session client over it. Used
//! by the copy tests and the Redis sidecar tests. It takes `free_port` from
//! the Redis harness (`support/redis.rs`).

use std::fs::File;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use charon::api::v1::charon_client::CharonClient;
use charon::api::v1::session_request::Op;
use charon::api::v1::session_response::Result as Answer;
use charon::api::v1::{ReleaseOp, ReserveOp, SeizeOp, SessionRequest, SessionResponse, TransferOp};
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::transport::Channel;

use super::redis::free_port;

pub const READY_TIMEOUT: Duration = Duration::from_secs(30);
pub const POLL: Duration = Duration::from_millis(50);

/// A running `charon serve`, killed (by PID) when dropped; its stderr goes to
/// a log file, printed when a test fails.
pub struct Sidecar {
    child: Child,
    pub grpc: u16,
    pub admin: u16,
    log: PathBuf,
}

impl Sidecar {
    pub fn start(dir: &Path, config: &Path, store: &str, extra: &[&str]) -> Sidecar {
        Self::start_at(dir, config, store, (free_port(), free_port()), extra)
    }

    /// On given (grpc, admin) ports: a restart where clients expect it.
    pub fn start_at(
        dir: &Path,
        config: &Path,
        store: &str,
        ports: (u16, u16),
        extra: &[&str],
    ) -> Sidecar {
        Self::start_admin_on(dir, config, store, "127.0.0.1", ports, extra)
    }

    /// With the admin port on `admin_ip` (`0.0.0.0`: reachable from the
    /// network); the tests still reach it at 127.0.0.1.
    pub fn start_admin_on(
        dir: &Path,
        config: &Path,
        store: &str,
        admin_ip: &str,
        (grpc, admin): (u16, u16),
        extra: &[&str],
    ) -> Sidecar {
        let log = dir.join(format!("sidecar-{grpc}.log"));
        let stderr = File::create(&log).expect("the sidecar log can be created");
        let child = Command::new(env!("CARGO_BIN_EXE_charon"))
            .arg("serve")
            .arg("--config")
            .arg(config)
            .args(["--grpc-addr", &format!("127.0.0.1:{grpc}")])
            .args(["--admin-addr", &format!("{admin_ip}:{admin}")])
            .args(["--store", store])
            .args(extra)
            .env("RUST_LOG", "info")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(stderr)
            .spawn()
            .expect("charon starts");
        Sidecar {
            child,
            grpc,
            admin,
            log,
        }
    }

    /// Started as `ratelimit` (a link to the binary, as Envoy Gateway's
    /// image has it) with upstream's environment: `vars` and the ports,
    /// nothing else.
    pub fn start_as_ratelimit(dir: &Path, vars: &[(&str, &str)]) -> Sidecar {
        let (grpc, admin) = (free_port(), free_port());
        let link = dir.join("ratelimit");
        if !link.exists() {
            std::os::unix::fs::symlink(env!("CARGO_BIN_EXE_charon"), &link).expect("a link");
        }
        let log = dir.join(format!("ratelimit-{grpc}.log"));
        let stderr = File::create(&log).expect("the sidecar log can be created");
        let child = Command::new(&link)
            .env_clear()
            .envs(vars.iter().copied())
            .env("HOST", "127.0.0.1")
            .env("GRPC_HOST", "127.0.0.1")
            .env("PORT", admin.to_string())
            .env("GRPC_PORT", grpc.to_string())
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(stderr)
            .spawn()
            .expect("ratelimit starts");
        Sidecar {
            child,
            grpc,
            admin,
            log,
        }
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log)
            .unwrap_or_else(|error| format!("(cannot read {}: {error})", self.log.display()))
    }

    /// Its (grpc, admin) ports, to start it again where clients expect it.
    pub fn ports(&self) -> (u16, u16) {
        (self.grpc, self.admin)
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// SIGKILL, and wait for the process to be gone.
    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// SIGTERM (a clean shutdown), and wait (without blocking the runtime,
    /// whose clients must see the sidecar close) for the exit status.
    pub async fn terminate(&mut self) -> std::process::ExitStatus {
        let status = Command::new("kill")
            .args(["-TERM", &self.child.id().to_string()])
            .status()
            .expect("kill runs");
        assert!(status.success());
        let deadline = Instant::now() + READY_TIMEOUT;
        loop {
            if let Some(status) = self.child.try_wait().expect("try_wait") {
                return status;
            }
            assert!(
                Instant::now() < deadline,
                "the sidecar did not exit on SIGTERM"
            );
            tokio::time::sleep(POLL).await;
        }
    }

    pub fn grpc_url(&self) -> String {
        format!("http://127.0.0.1:{}", self.grpc)
    }

    pub fn admin_url(&self, path: &str) -> String {
        format!("http://127.0.0.1:{}{path}", self.admin)
    }

    /// `PUT path` on the admin port (the configuration API) as "the test";
    /// the status.
    pub async fn put_admin(&self, path: &str, body: &str) -> u16 {
        reqwest::Client::new()
            .put(self.admin_url(path))
            .header("x-charon-actor", "the test")
            .body(body.to_owned())
            .send()
            .await
            .expect("the admin port answers")
            .status()
            .as_u16()
    }

    pub fn is_alive(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(None))
    }

    pub async fn metrics(&self) -> Result<String, String> {
        reqwest::get(self.admin_url("/metrics"))
            .await
            .map_err(|error| format!("/metrics did not answer: {error}"))?
            .text()
            .await
            .map_err(|error| format!("/metrics body: {error}"))
    }

    /// One sample (a gauge, or a counter's `…_total`) from `/metrics`.
    pub async fn metric(&self, name: &str) -> f64 {
        let metrics = self
            .metrics()
            .await
            .unwrap_or_else(|error| panic!("{error}"));
        metric_value(&metrics, name)
            .unwrap_or_else(|| panic!("no sample {name} in /metrics:\n{metrics}"))
    }

    /// `/readyz`: its status code and trimmed body.
    pub async fn readyz(&self) -> Result<(u16, String), String> {
        let response = reqwest::get(self.admin_url("/readyz"))
            .await
            .map_err(|error| format!("/readyz did not answer: {error}"))?;
        let status = response.status().as_u16();
        let body = response
            .text()
            .await
            .map_err(|error| format!("/readyz body: {error}"))?;
        Ok((status, body.trim().to_owned()))
    }

    /// Waits until `/readyz` answers `status` with `body`.
    pub async fn wait_readyz(&self, status: u16, body: &str) {
        eventually(
            &format!("sidecar :{} /readyz answering {status} {body:?}", self.grpc),
            READY_TIMEOUT,
            async || match self.readyz().await? {
                (code, text) if code == status && text == body => Ok(()),
                (code, text) => Err(format!("{code} {text:?}")),
            },
        )
        .await;
    }

    /// Waits until `/readyz` is 200 and, with Redis, the sidecar is
    /// registered in the copy log.
    pub async fn wait_serving(&self) {
        eventually(
            &format!("sidecar :{} ready and registered", self.grpc),
            READY_TIMEOUT,
            async || {
                let metrics = self.metrics().await?;
                match metric_value(&metrics, "charon_copy_log_registered") {
                    Some(1.0) => Ok(()),
                    other => Err(format!("charon_copy_log_registered = {other:?}")),
                }
            },
        )
        .await;
    }

    pub async fn client(&self) -> CharonClient<Channel> {
        CharonClient::connect(format!("http://127.0.0.1:{}", self.grpc))
            .await
            .unwrap_or_else(|error| panic!("cannot connect to sidecar :{}: {error}", self.grpc))
    }

    pub async fn session(&self) -> Session {
        Session::open(self.client().await).await
    }
}

impl Drop for Sidecar {
    fn drop(&mut self) {
        if std::thread::panicking() {
            eprintln!(
                "--- log of sidecar grpc :{} admin :{}:\n{}",
                self.grpc,
                self.admin,
                self.log()
            );
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// One Charon API session: send an operation, wait for its answer.
pub struct Session {
    outbound: Option<mpsc::Sender<SessionRequest>>,
    inbound: tonic::Streaming<SessionResponse>,
    next_id: u64,
}

impl Session {
    pub async fn open(mut client: CharonClient<Channel>) -> Session {
        let (outbound, receiver) = mpsc::channel(16);
        let inbound = client
            .session(ReceiverStream::new(receiver))
            .await
            .expect("the session opens")
            .into_inner();
        Session {
            outbound: Some(outbound),
            inbound,
            next_id: 1,
        }
    }

    /// Sends `op` and returns its answer; `Err` when the stream ended (with
    /// its status).
    pub async fn call(&mut self, op: Op) -> Result<Answer, tonic::Status> {
        self.call_raw(Some(op)).await
    }

    /// Sends `op` without waiting for its answer; its id.
    pub async fn send(&mut self, op: Op) -> u64 {
        let id = self.next_id;
        self.next_id += 1;
        let outbound = self.outbound.as_ref().expect("the session is open");
        outbound
            .send(SessionRequest { id, op: Some(op) })
            .await
            .expect("the session's sender is open");
        id
    }

    /// The next answer, with the id of its operation, within `within`.
    pub async fn answer(&mut self, within: Duration) -> Result<(u64, Answer), tonic::Status> {
        let response = tokio::time::timeout(within, self.inbound.message())
            .await
            .map_err(|_| tonic::Status::deadline_exceeded(format!("no answer within {within:?}")))??
            .ok_or_else(|| tonic::Status::unavailable("the stream ended"))?;
        Ok((
            response.id,
            response.result.expect("an answer has a result"),
        ))
    }

    /// [`call`](Self::call) with any `op`, even none.
    pub async fn call_raw(&mut self, op: Option<Op>) -> Result<Answer, tonic::Status> {
        let id = self.next_id;
        self.next_id += 1;
        let outbound = self.outbound.as_ref().expect("the session is open");
        outbound
            .send(SessionRequest { id, op })
            .await
            .map_err(|_| tonic::Status::unavailable("the session's sender is closed"))?;
        let response = tokio::time::timeout(Duration::from_secs(10), self.inbound.message())
            .await
            .map_err(|_| tonic::Status::deadline_exceeded("no answer within 10 s"))??
            .ok_or_else(|| tonic::Status::unavailable("the stream ended"))?;
        assert_eq!(response.id, id, "answers carry the request's id");
        Ok(response.result.expect("an answer has a result"))
    }

    /// The stream's end: its status, once the server ends it.
    pub async fn ended(&mut self, within: Duration) -> tonic::Status {
        let deadline = Instant::now() + within;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match tokio::time::timeout(left, self.inbound.message()).await {
                Err(_) => panic!("the session did not end within {within:?}"),
                Ok(Err(status)) => return status,
                Ok(Ok(None)) => return tonic::Status::ok("ended"),
                Ok(Ok(Some(_))) => {}
            }
        }
    }

    /// Closes the sending side (a clean end of the session).
    pub fn close(&mut self) {
        self.outbound = None;
    }

    pub async fn reserve(
        &mut self,
        ns: &str,
        resource: &str,
        domain: &str,
        copies: i64,
        min: i64,
    ) -> Answer {
        self.call(Op::Reserve(ReserveOp {
            namespace: ns.into(),
            resource: resource.into(),
            domain: domain.into(),
            copies: Some(copies),
            min_copies: Some(min),
            ..ReserveOp::default()
        }))
        .await
        .expect("reserve is answered")
    }

    /// Reserves and returns (granted, groups), panicking on an error.
    pub async fn hold(
        &mut self,
        ns: &str,
        resource: &str,
        domain: &str,
        copies: i64,
    ) -> (u64, Vec<String>) {
        match self.reserve(ns, resource, domain, copies, 1).await {
            Answer::Reserve(answer) => (answer.granted, answer.groups),
            other => panic!("reserve answered {other:?}"),
        }
    }

    pub async fn release(
        &mut self,
        ns: &str,
        resource: &str,
        domain: &str,
        copies: i64,
        groups: &[String],
    ) -> Answer {
        self.call(Op::Release(ReleaseOp {
            namespace: ns.into(),
            resource: resource.into(),
            domain: domain.into(),
            copies,
            groups: groups.to_vec(),
            done: None,
        }))
        .await
        .expect("release is answered")
    }

    pub async fn transfer(
        &mut self,
        ns: &str,
        resource: &str,
        domain: &str,
        copies: i64,
        groups: &[String],
        ttl_ms: u64,
    ) -> Answer {
        self.call(Op::Transfer(TransferOp {
            namespace: ns.into(),
            resource: resource.into(),
            domain: domain.into(),
            copies,
            groups: groups.to_vec(),
            ttl_ms,
        }))
        .await
        .expect("transfer is answered")
    }

    pub async fn seize(&mut self, transfer_id: &str) -> Answer {
        self.call(Op::Seize(SeizeOp {
            transfer_id: transfer_id.into(),
        }))
        .await
        .expect("seize is answered")
    }
}

/// A sidecar on the memory store with `yaml` as its configuration, ready.
pub async fn memory_sidecar(dir: &Path, yaml: &str) -> Sidecar {
    let sidecar = Sidecar::start(dir, &write_config(dir, yaml), "memory", &[]);
    sidecar.wait_readyz(200, "ready").await;
    sidecar
}

/// A Rust client of `sidecar` once its session is up, with a deadline that
/// a loaded test machine cannot miss.
pub async fn sidecar_client(sidecar: &Sidecar) -> charon::client::Client {
    let client = charon::client::Client::with_options(
        charon::client::Sidecar::connect(&sidecar.grpc_url()).expect("a sidecar url"),
        charon::client::ClientOptions {
            call_timeout: Duration::from_secs(5),
            ..Default::default()
        },
    );
    assert!(
        client.ready(Duration::from_secs(20)).await,
        "the session opens"
    );
    client
}

pub fn write_config(dir: &Path, yaml: &str) -> PathBuf {
    let path = dir.join("limits.yaml");
    std::fs::write(&path, yaml).expect("the config can be written");
    let check = Command::new(env!("CARGO_BIN_EXE_charon"))
        .arg("check")
        .arg(&path)
        .output()
        .expect("charon check runs");
    assert!(
        check.status.success(),
        "charon check refuses the test config:\n{}",
        String::from_utf8_lossy(&check.stderr)
    );
    path
}

pub fn tempdir() -> tempfile::TempDir {
    tempfile::Builder::new()
        .prefix("charon-sidecar-")
        .tempdir()
        .expect("a temporary directory")
}

/// The value of the sample `name` (no labels) in Prometheus text.
pub fn metric_value(metrics: &str, name: &str) -> Option<f64> {
    metrics.lines().find_map(|line| {
        let (key, value) = line.rsplit_once(' ')?;
        if key == name {
            value.parse().ok()
        } else {
            None
        }
    })
}

/// Polls `probe` until it returns `Ok`, or panics after `within` with `what`
/// and the last `Err`.
pub async fn eventually<T>(
    what: &str,
    within: Duration,
    mut probe: impl AsyncFnMut() -> Result<T, String>,
) -> T {
    let deadline = Instant::now() + within;
    loop {
        match probe().await {
            Ok(value) => return value,
            Err(last) => {
                assert!(
                    Instant::now() < deadline,
                    "{what}: did not happen within {within:?}; last seen: {last}"
                );
                tokio::time::sleep(POLL).await;
            }
        }
    }
}
