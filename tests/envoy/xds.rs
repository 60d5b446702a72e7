//! Charon under Envoy Gateway (docs/envoy-compatibility.md#configuration-over-xds):
//! started as `ratelimit` with exactly the environment Envoy Gateway gives
//! its rate-limit container (paths and ports pointed at this test), fed its
//! limits by a control plane over ADS with mutual TLS, asked by a real Envoy
//! over mutual TLS. The control plane here is the test's own ADS server,
//! playing Envoy Gateway's part: it serves RateLimitConfig snapshots to
//! node `envoy-ratelimit` and records every ACK and NACK.

use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::process::Command;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use envoy_types::pb::envoy::service::discovery::v3::aggregated_discovery_service_server::{
    AggregatedDiscoveryService, AggregatedDiscoveryServiceServer,
};
use envoy_types::pb::envoy::service::discovery::v3::{
    DeltaDiscoveryRequest, DeltaDiscoveryResponse, DiscoveryRequest, DiscoveryResponse,
};
use envoy_types::pb::google::protobuf::Any;
use envoy_types::pb::ratelimit::config::ratelimit::v3::{
    RateLimitConfig, RateLimitDescriptor, RateLimitPolicy, RateLimitUnit,
};
use prost::Message;
use tokio::sync::watch;
use tokio_stream::Stream;
use tonic::transport::{Certificate, Identity, Server, ServerTlsConfig};

use super::envoy_e2e::{Proc, find_envoy, free_ports, spawn_envoy};
use crate::support::certs;

mod ai_gateway;
mod prometheus;

const TYPE: &str = "type.googleapis.com/ratelimit.config.ratelimit.v3.RateLimitConfig";
const READY: Duration = Duration::from_secs(30);
/// The issue's promise: limits change within a second of the push.
const APPLIED_WITHIN: Duration = Duration::from_secs(1);

/// What the control plane serves: a version and its resources.
#[derive(Clone)]
struct Snapshot {
    version: String,
    resources: Vec<Any>,
}

/// A request the control plane received.
#[derive(Debug, Clone)]
struct Seen {
    node: String,
    version: String,
    nonce: String,
    error: Option<String>,
}

#[derive(Clone)]
struct ControlPlane {
    snapshot: watch::Sender<Option<Snapshot>>,
    seen: Arc<Mutex<Vec<Seen>>>,
    /// Set to end every stream this server instance opened (it is going
    /// away); a restarted server has a new one.
    kill: watch::Sender<bool>,
    mutual_tls: bool,
}

/// A running instance of the control plane.
struct Running {
    task: tokio::task::JoinHandle<()>,
    kill: watch::Sender<bool>,
}

type ResponseStream = Pin<Box<dyn Stream<Item = Result<DiscoveryResponse, tonic::Status>> + Send>>;
type DeltaStream =
    Pin<Box<dyn Stream<Item = Result<DeltaDiscoveryResponse, tonic::Status>> + Send>>;

#[tonic::async_trait]
impl AggregatedDiscoveryService for ControlPlane {
    type StreamAggregatedResourcesStream = ResponseStream;
    type DeltaAggregatedResourcesStream = DeltaStream;

    async fn stream_aggregated_resources(
        &self,
        request: tonic::Request<tonic::Streaming<DiscoveryRequest>>,
    ) -> Result<tonic::Response<ResponseStream>, tonic::Status> {
        if self.mutual_tls && request.peer_certs().is_none_or(|certs| certs.is_empty()) {
            return Err(tonic::Status::unauthenticated("no client certificate"));
        }
        if *self.kill.borrow() {
            return Err(tonic::Status::unavailable("control plane going away"));
        }
        let mut requests = request.into_inner();
        let (tx, rx) = tokio::sync::mpsc::channel(8);
        let (seen, mut snapshots, mut kill) = (
            self.seen.clone(),
            self.snapshot.subscribe(),
            self.kill.subscribe(),
        );
        tokio::spawn(async move {
            let mut nonce = 0u64;
            // The version the client has, as go-control-plane tracks it: a
            // snapshot it already holds is not sent again.
            let mut client_has = String::new();
            let mut sent_version: Option<String> = None;
            loop {
                if *kill.borrow() {
                    let _ = tx
                        .send(Err(tonic::Status::unavailable("control plane going away")))
                        .await;
                    return;
                }
                let pending = snapshots.borrow_and_update().clone().filter(|s| {
                    Some(&s.version) != sent_version.as_ref() && s.version != client_has
                });
                if let Some(snapshot) = pending {
                    nonce += 1;
                    sent_version = Some(snapshot.version.clone());
                    let response = DiscoveryResponse {
                        version_info: snapshot.version,
                        resources: snapshot.resources,
                        type_url: TYPE.into(),
                        nonce: nonce.to_string(),
                        ..Default::default()
                    };
                    if tx.send(Ok(response)).await.is_err() {
                        return;
                    }
                }
                tokio::select! {
                    _ = async { kill.wait_for(|killed| *killed).await.is_ok() } => {
                        let _ = tx.send(Err(tonic::Status::unavailable("control plane going away"))).await;
                        return;
                    }
                    changed = snapshots.changed() => if changed.is_err() { return },
                    received = requests.message() => match received {
                        Ok(Some(request)) => {
                            if request.error_detail.is_none() && client_has.is_empty() {
                                client_has = request.version_info.clone();
                            }
                            seen.lock().expect("seen").push(Seen {
                                node: request.node.map(|n| n.id).unwrap_or_default(),
                                version: request.version_info,
                                nonce: request.response_nonce,
                                error: request.error_detail.map(|status| status.message),
                            });
                        }
                        _ => return,
                    },
                }
            }
        });
        Ok(tonic::Response::new(Box::pin(
            tokio_stream::wrappers::ReceiverStream::new(rx),
        )))
    }

    async fn delta_aggregated_resources(
        &self,
        _request: tonic::Request<tonic::Streaming<DeltaDiscoveryRequest>>,
    ) -> Result<tonic::Response<DeltaStream>, tonic::Status> {
        Err(tonic::Status::unimplemented("state of the world only"))
    }
}

impl ControlPlane {
    fn new() -> Self {
        Self {
            snapshot: watch::channel(None).0,
            seen: Arc::default(),
            kill: watch::channel(false).0,
            mutual_tls: false,
        }
    }

    fn push(&self, version: &str, resources: Vec<Any>) {
        self.snapshot.send_replace(Some(Snapshot {
            version: version.into(),
            resources,
        }));
    }

    fn seen(&self) -> Vec<Seen> {
        self.seen.lock().expect("seen").clone()
    }

    /// Waits for a request that answers `nonce`-bearing responses of
    /// `version` (ACK) or refuses one (NACK, `error` set).
    async fn answer_after(&self, from: usize) -> Seen {
        let deadline = Instant::now() + READY;
        loop {
            if let Some(seen) = self
                .seen()
                .into_iter()
                .skip(from)
                .find(|s| !s.nonce.is_empty())
            {
                return seen;
            }
            assert!(
                Instant::now() < deadline,
                "no ACK or NACK: {:?}",
                self.seen()
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    /// Serves on `port` (with mutual TLS if `tls`) until [`ControlPlane::stop`].
    async fn serve(&self, port: u16, tls: Option<&Tls>) -> Running {
        let instance = ControlPlane {
            kill: watch::channel(false).0,
            mutual_tls: tls.is_some(),
            ..self.clone()
        };
        let kill = instance.kill.clone();
        let config = tls.map(|tls| {
            ServerTlsConfig::new()
                .identity(Identity::from_pem(
                    std::fs::read(&tls.cert).expect("cert"),
                    std::fs::read(&tls.key).expect("key"),
                ))
                .client_ca_root(Certificate::from_pem(std::fs::read(&tls.ca).expect("ca")))
        });
        let service = AggregatedDiscoveryServiceServer::new(instance);
        // The port of an instance just stopped: its connections may linger
        // a moment.
        let deadline = Instant::now() + READY;
        let listener = loop {
            match tokio::net::TcpListener::bind(("127.0.0.1", port)).await {
                Ok(listener) => break listener,
                Err(error) => {
                    assert!(Instant::now() < deadline, "cannot bind {port}: {error}");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            }
        };
        let task = tokio::spawn(async move {
            let mut builder = Server::builder();
            if let Some(config) = config {
                builder = builder.tls_config(config).expect("server TLS");
            }
            builder
                .add_service(service)
                .serve_with_incoming(tokio_stream::wrappers::TcpListenerStream::new(listener))
                .await
                .expect("the control plane serves");
        });
        Running { task, kill }
    }

    /// Ends the instance's streams and stops accepting.
    async fn stop(&self, server: Running) {
        server.kill.send_replace(true);
        server.task.abort();
        let _ = server.task.await;
    }
}

fn limit(domain: &str, value: &str, unit: RateLimitUnit, per_unit: u32) -> Any {
    Any {
        type_url: TYPE.into(),
        value: RateLimitConfig {
            name: domain.into(),
            domain: domain.into(),
            descriptors: vec![RateLimitDescriptor {
                key: "generic_key".into(),
                value: value.into(),
                rate_limit: Some(RateLimitPolicy {
                    unit: unit as i32,
                    requests_per_unit: per_unit,
                    ..Default::default()
                }),
                ..Default::default()
            }],
        }
        .encode_to_vec(),
    }
}

/// One certificate for everything, as Envoy Gateway mounts one Secret:
/// Charon's gRPC server and xDS client, the control plane, Envoy.
struct Tls {
    ca: PathBuf,
    cert: PathBuf,
    key: PathBuf,
}

fn certificates(dir: &Path) -> Tls {
    let ca = certs::ca(dir, "ca");
    let (cert, key) = certs::leaf(
        dir,
        "ca",
        "tls",
        "DNS:localhost,IP:127.0.0.1",
        "serverAuth,clientAuth",
    );
    Tls { ca, cert, key }
}

/// Envoy in front of `upstream`, asking Charon on `grpc` over mutual TLS
/// for domain `gateway`, descriptor `generic_key=route`.
fn envoy_yaml(listen: u16, admin: u16, upstream: u16, grpc: u16, tls: &Tls) -> String {
    format!(
        r#"
admin:
  address: {{socket_address: {{address: 127.0.0.1, port_value: {admin}}}}}
static_resources:
  listeners:
    - name: edge
      address: {{socket_address: {{address: 127.0.0.1, port_value: {listen}}}}}
      filter_chains:
        - filters:
            - name: envoy.filters.network.http_connection_manager
              typed_config:
                "@type": type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager
                stat_prefix: edge
                route_config:
                  virtual_hosts:
                    - name: all
                      domains: ["*"]
                      routes:
                        - match: {{prefix: "/"}}
                          route:
                            cluster: upstream
                            rate_limits:
                              - actions: [{{generic_key: {{descriptor_value: route}}}}]
                http_filters:
                  - name: envoy.filters.http.ratelimit
                    typed_config:
                      "@type": type.googleapis.com/envoy.extensions.filters.http.ratelimit.v3.RateLimit
                      domain: gateway
                      failure_mode_deny: true
                      timeout: 1s
                      rate_limit_service:
                        transport_api_version: V3
                        grpc_service: {{envoy_grpc: {{cluster_name: ratelimit}}}}
                  - name: envoy.filters.http.router
                    typed_config:
                      "@type": type.googleapis.com/envoy.extensions.filters.http.router.v3.Router
  clusters:
    - name: upstream
      type: STATIC
      connect_timeout: 1s
      load_assignment:
        cluster_name: upstream
        endpoints: [{{lb_endpoints: [{{endpoint: {{address: {{socket_address: {{address: 127.0.0.1, port_value: {upstream}}}}}}}}}]}}]
    - name: ratelimit
      type: STATIC
      connect_timeout: 1s
      typed_extension_protocol_options:
        envoy.extensions.upstreams.http.v3.HttpProtocolOptions:
          "@type": type.googleapis.com/envoy.extensions.upstreams.http.v3.HttpProtocolOptions
          explicit_http_config: {{http2_protocol_options: {{}}}}
      transport_socket:
        name: envoy.transport_sockets.tls
        typed_config:
          "@type": type.googleapis.com/envoy.extensions.transport_sockets.tls.v3.UpstreamTlsContext
          sni: localhost
          common_tls_context:
            tls_certificates:
              - certificate_chain: {{filename: "{cert}"}}
                private_key: {{filename: "{key}"}}
            validation_context:
              trusted_ca: {{filename: "{ca}"}}
              match_typed_subject_alt_names:
                - san_type: DNS
                  matcher: {{exact: localhost}}
      load_assignment:
        cluster_name: ratelimit
        endpoints: [{{lb_endpoints: [{{endpoint: {{address: {{socket_address: {{address: 127.0.0.1, port_value: {grpc}}}}}}}}}]}}]
"#,
        cert = tls.cert.display(),
        key = tls.key.display(),
        ca = tls.ca.display(),
    )
}

/// `charon` as Envoy Gateway starts its rate-limit container: the link
/// `ratelimit`, Envoy Gateway's environment and nothing else.
fn start_ratelimit(dir: &Path, tls: &Tls, port: u16, grpc: u16, xds: u16) -> Proc {
    start_ratelimit_with(dir, tls, [port, grpc, xds], &[])
}

/// [`start_ratelimit`] with more of Envoy Gateway's variables (those it
/// sets when Prometheus or tracing is on).
fn start_ratelimit_with(
    dir: &Path,
    tls: &Tls,
    [port, grpc, xds]: [u16; 3],
    more: &[(&str, String)],
) -> Proc {
    let link = dir.join("ratelimit");
    std::os::unix::fs::symlink(env!("CARGO_BIN_EXE_charon"), &link).expect("a link");
    let file = |path: &PathBuf| path.display().to_string();
    let vars = [
        ("RUNTIME_ROOT", dir.join("data").display().to_string()),
        ("RUNTIME_SUBDIRECTORY", "ratelimit".into()),
        ("RUNTIME_IGNOREDOTFILES", "true".into()),
        ("RUNTIME_WATCH_ROOT", "false".into()),
        ("LOG_LEVEL", "info".into()),
        ("USE_STATSD", "false".into()),
        ("CONFIG_TYPE", "GRPC_XDS_SOTW".into()),
        ("CONFIG_GRPC_XDS_SERVER_URL", format!("localhost:{xds}")),
        ("CONFIG_GRPC_XDS_NODE_ID", "envoy-ratelimit".into()),
        ("FORCE_START_WITHOUT_INITIAL_CONFIG", "true".into()),
        ("GRPC_SERVER_USE_TLS", "true".into()),
        ("GRPC_SERVER_TLS_CERT", file(&tls.cert)),
        ("GRPC_SERVER_TLS_KEY", file(&tls.key)),
        ("GRPC_SERVER_TLS_CA_CERT", file(&tls.ca)),
        ("CONFIG_GRPC_XDS_SERVER_USE_TLS", "true".into()),
        ("CONFIG_GRPC_XDS_CLIENT_TLS_CERT", file(&tls.cert)),
        ("CONFIG_GRPC_XDS_CLIENT_TLS_KEY", file(&tls.key)),
        ("CONFIG_GRPC_XDS_SERVER_TLS_CACERT", file(&tls.ca)),
        ("PORT", port.to_string()),
        ("GRPC_PORT", grpc.to_string()),
        ("HOST", "127.0.0.1".into()),
        ("GRPC_HOST", "127.0.0.1".into()),
    ];
    Proc::spawn(
        "ratelimit",
        Command::new(&link)
            .env_clear()
            .envs(vars.iter().map(|(k, v)| (*k, v.as_str())))
            .envs(more.iter().map(|(k, v)| (*k, v.as_str()))),
        dir,
    )
}

async fn status(client: &reqwest::Client, url: &str) -> Option<u16> {
    client
        .get(url)
        .send()
        .await
        .ok()
        .map(|reply| reply.status().as_u16())
}

/// Waits until `url` answers `want`.
async fn until_status(client: &reqwest::Client, url: &str, want: u16, proc: &mut Proc) {
    let deadline = Instant::now() + READY;
    loop {
        assert!(proc.exited().is_none(), "a process exited; its log follows");
        if status(client, url).await == Some(want) {
            return;
        }
        assert!(Instant::now() < deadline, "{url} never answered {want}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// A client for the tests' loopback calls (Charon's probes, Envoy).
fn http_client() -> reqwest::Client {
    reqwest::Client::builder()
        .no_proxy()
        .timeout(Duration::from_secs(5))
        .build()
        .expect("reqwest client")
}

/// An upstream on a free port that answers every request; its port.
async fn spawn_upstream() -> u16 {
    let upstream = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind upstream");
    let port = upstream.local_addr().expect("upstream addr").port();
    tokio::spawn(async move {
        let app = axum::Router::new().fallback(|| async { "answered" });
        axum::serve(upstream, app).await.expect("upstream server");
    });
    port
}

/// Envoy on `yaml` (written into `dir`), once its admin on `admin` says
/// ready.
async fn ready_envoy(dir: &Path, yaml: String, admin: u16, http: &reqwest::Client) -> Proc {
    let config = dir.join("envoy.yaml");
    std::fs::write(&config, yaml).expect("write envoy.yaml");
    let mut envoy = spawn_envoy(&find_envoy(), &config, admin, dir);
    let ready = format!("http://127.0.0.1:{admin}/ready");
    until_status(http, &ready, 200, &mut envoy).await;
    envoy
}

#[tokio::test(flavor = "multi_thread")]
async fn under_envoy_gateway_limits_come_over_xds_with_mutual_tls() {
    let dir = tempfile::tempdir().expect("temp dir");
    let tls = certificates(dir.path());
    let upstream_port = spawn_upstream().await;
    let [listen, envoy_admin, grpc, port, xds] = free_ports::<5>();
    let control = ControlPlane::new();
    let server = control.serve(xds, Some(&tls)).await;

    // Started without a snapshot: serving, not ready.
    let mut charon = start_ratelimit(dir.path(), &tls, port, grpc, xds);
    let http = http_client();
    let healthcheck = format!("http://127.0.0.1:{port}/healthcheck");
    until_status(&http, &healthcheck, 503, &mut charon).await;
    let deadline = Instant::now() + READY;
    while !control.seen().iter().any(|s| s.node == "envoy-ratelimit") {
        assert!(
            Instant::now() < deadline,
            "no request from node envoy-ratelimit"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(
        status(&http, &healthcheck).await,
        Some(503),
        "not ready before the first snapshot"
    );

    // The first snapshot: ready, and Envoy is limited by it (2 a minute).
    let before = control.seen().len();
    control.push(
        "1",
        vec![limit("gateway", "route", RateLimitUnit::Minute, 2)],
    );
    let ack = control.answer_after(before).await;
    assert_eq!(
        (ack.version.as_str(), ack.error.as_deref()),
        ("1", None),
        "ACK of version 1"
    );
    until_status(&http, &healthcheck, 200, &mut charon).await;

    let yaml = envoy_yaml(listen, envoy_admin, upstream_port, grpc, &tls);
    let _envoy = ready_envoy(dir.path(), yaml, envoy_admin, &http).await;
    let route = format!("http://127.0.0.1:{listen}/");
    let mut statuses = Vec::new();
    for _ in 0..3 {
        statuses.push(status(&http, &route).await.expect("Envoy answers"));
    }
    assert_eq!(
        statuses,
        [200, 200, 429],
        "2 a minute, from snapshot 1, over mTLS"
    );

    // A new snapshot raises the limit: applied (ACKed) within a second,
    // and Envoy's next request passes.
    let before = control.seen().len();
    let pushed = Instant::now();
    control.push(
        "2",
        vec![limit("gateway", "route", RateLimitUnit::Minute, 100)],
    );
    let ack = control.answer_after(before).await;
    assert!(
        pushed.elapsed() < APPLIED_WITHIN,
        "applied in {:?}",
        pushed.elapsed()
    );
    assert_eq!((ack.version.as_str(), ack.error.as_deref()), ("2", None));
    assert_eq!(status(&http, &route).await, Some(200), "100 a minute now");

    // An invalid snapshot is NACKed with its reason; version 2 keeps serving.
    let before = control.seen().len();
    control.push(
        "3",
        vec![limit("gateway", "route", RateLimitUnit::Unknown, 1)],
    );
    let nack = control.answer_after(before).await;
    assert_eq!(nack.version, "2", "a NACK carries the last good version");
    let reason = nack.error.expect("a NACK says why");
    assert!(
        reason.contains("xds:gateway") && reason.contains("invalid rate limit unit"),
        "{reason}"
    );
    for _ in 0..3 {
        assert_eq!(
            status(&http, &route).await,
            Some(200),
            "version 2 still serves"
        );
    }

    // The control plane restarts: Charon reconnects, says which version it
    // has, and takes the next snapshot (1 an hour: a new window).
    control.stop(server).await;
    let before = control.seen().len();
    control.push("4", vec![limit("gateway", "route", RateLimitUnit::Hour, 1)]);
    let server = control.serve(xds, Some(&tls)).await;
    let ack = control.answer_after(before).await;
    let opened = control.seen()[before..]
        .iter()
        .find(|seen| seen.nonce.is_empty())
        .cloned()
        .unwrap_or_else(|| panic!("no new stream after {before}: {:?}", control.seen()));
    assert_eq!(
        opened.version, "2",
        "reconnected with the last ACKed version"
    );
    assert_eq!((ack.version.as_str(), ack.error.as_deref()), ("4", None));
    assert_eq!(
        status(&http, &route).await,
        Some(200),
        "1 an hour: the first"
    );
    assert_eq!(status(&http, &route).await, Some(429), "1 an hour: spent");
    control.stop(server).await;
    assert!(
        charon.exited().is_none(),
        "charon runs on without its control plane"
    );
    assert_eq!(status(&http, &healthcheck).await, Some(200));
}

/// Without FORCE_START_WITHOUT_INITIAL_CONFIG the sidecar waits for the
/// first snapshot before it listens; files and xDS domains coexist, and a
/// domain from both is refused with the reason, the last good set serving.
#[tokio::test(flavor = "multi_thread")]
async fn files_and_xds_coexist_and_the_first_snapshot_is_awaited() {
    let dir = tempfile::tempdir().expect("temp dir");
    let config = dir.path().join("limits");
    std::fs::create_dir(&config).expect("config dir");
    std::fs::write(
        config.join("files.yaml"),
        "domain: files\ndescriptors:\n  - key: k\n    rate_limit: {unit: minute, requests_per_unit: 1}\n",
    )
    .expect("write a file");
    let [grpc, admin, xds] = free_ports::<3>();
    let control = ControlPlane::new();
    let server = control.serve(xds, None).await;
    let mut charon = Proc::spawn(
        "charon",
        Command::new(env!("CARGO_BIN_EXE_charon"))
            .env("NO_COLOR", "1")
            .arg("serve")
            .arg("--config")
            .arg(&config)
            .args(["--grpc-addr", &format!("127.0.0.1:{grpc}")])
            .args(["--admin-addr", &format!("127.0.0.1:{admin}")])
            .args(["--config-xds", &format!("127.0.0.1:{xds}")])
            .args(["--config-xds-node-id", "sidecar-1"]),
        dir.path(),
    );
    let deadline = Instant::now() + READY;
    while !control.seen().iter().any(|s| s.node == "sidecar-1") {
        assert!(Instant::now() < deadline, "no request from node sidecar-1");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    let http = http_client();
    let readyz = format!("http://127.0.0.1:{admin}/readyz");
    let read_rlconfig = || async {
        http.get(format!("http://127.0.0.1:{admin}/rlconfig"))
            .send()
            .await
            .expect("rlconfig")
            .text()
            .await
            .expect("text")
    };
    assert_eq!(
        status(&http, &readyz).await,
        None,
        "not listening before the first snapshot"
    );

    control.push("a", vec![limit("pushed", "v", RateLimitUnit::Second, 5)]);
    until_status(&http, &readyz, 200, &mut charon).await;
    let rlconfig = read_rlconfig().await;
    assert!(
        rlconfig.contains("files.k") && rlconfig.contains("pushed.generic_key_v"),
        "{rlconfig}"
    );

    let before = control.seen().len();
    control.push("b", vec![limit("files", "v", RateLimitUnit::Second, 5)]);
    let nack = control.answer_after(before).await;
    assert_eq!(nack.version, "a");
    let reason = nack.error.expect("refused");
    assert!(
        reason.contains("domain `files` is already defined"),
        "{reason}"
    );
    let rlconfig = read_rlconfig().await;
    assert!(
        rlconfig.contains("pushed.generic_key_v"),
        "snapshot a still serves: {rlconfig}"
    );
    control.stop(server).await;
}

/// Milliseconds into the current second of the wall clock.
fn into_second() -> u64 {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("after the epoch");
    u64::from(now.subsec_millis())
}

/// Sleeps until the wall clock is at least `from` ms into a second (the
/// next one if it is past `to` already).
async fn until_into_second(from: u64, to: u64) {
    loop {
        let at = into_second();
        if (from..to).contains(&at) {
            return;
        }
        let wait = if at < from {
            from - at
        } else {
            1_000 - at + from
        };
        tokio::time::sleep(Duration::from_millis(wait)).await;
    }
}

/// `--xds-extensions` (docs/envoy-compatibility.md#charons-extensions-for-xds-fed-limits)
/// under Envoy Gateway: a limit of 5 a second pushed over xDS, which the
/// operator's file makes a sliding window. A burst of 5 at the end of one
/// second and another at the start of the next: a fixed window admits
/// both; the sliding window still counts most of the first and refuses
/// most of the second, through a real Envoy.
#[tokio::test(flavor = "multi_thread")]
async fn an_operators_extension_makes_a_pushed_limit_a_sliding_window() {
    let dir = tempfile::tempdir().expect("temp dir");
    let tls = certificates(dir.path());
    let upstream_port = spawn_upstream().await;
    let [listen, envoy_admin, grpc, port, xds] = free_ports::<5>();
    let control = ControlPlane::new();
    let _server = control.serve(xds, Some(&tls)).await;
    let extensions = dir.path().join("extensions.yaml");
    std::fs::write(
        &extensions,
        "extensions:\n  - domain: gateway\n    descriptors: [generic_key=route]\n    rate_limit: {algorithm: sliding_window}\n  - domain: gateway\n    descriptors: [generic_key=elsewhere]\n    rate_limit: {algorithm: gcra}\n",
    )
    .expect("write the extensions");
    let mut charon = start_ratelimit_with(
        dir.path(),
        &tls,
        [port, grpc, xds],
        &[("CHARON_XDS_EXTENSIONS", extensions.display().to_string())],
    );
    let http = http_client();
    let healthcheck = format!("http://127.0.0.1:{port}/healthcheck");
    until_status(&http, &healthcheck, 503, &mut charon).await;
    let before = control.seen().len();
    control.push(
        "1",
        vec![limit("gateway", "route", RateLimitUnit::Second, 5)],
    );
    let ack = control.answer_after(before).await;
    assert_eq!((ack.version.as_str(), ack.error.as_deref()), ("1", None));
    until_status(&http, &healthcheck, 200, &mut charon).await;
    let yaml = envoy_yaml(listen, envoy_admin, upstream_port, grpc, &tls);
    let _envoy = ready_envoy(dir.path(), yaml, envoy_admin, &http).await;
    let route = format!("http://127.0.0.1:{listen}/");
    let burst = || async {
        let mut admitted = 0;
        for _ in 0..5 {
            if status(&http, &route).await == Some(200) {
                admitted += 1;
            }
        }
        admitted
    };
    // A slow machine may send the second burst late in its second, when
    // the first one weighs little: then the experiment is run again.
    let mut runs = Vec::new();
    for _ in 0..3 {
        // A quiet second first: the windows before count nothing.
        tokio::time::sleep(Duration::from_millis(2_100)).await;
        until_into_second(700, 760).await;
        let first = burst().await;
        until_into_second(30, 90).await;
        let started = into_second();
        let second = burst().await;
        let ended = into_second();
        runs.push((first, second, started, ended));
        if ended >= started && ended < 400 {
            break;
        }
    }
    let &(first, second, started, ended) = runs.last().expect("a run");
    assert!(
        ended >= started && ended < 400,
        "every run was late: {runs:?}"
    );
    assert_eq!(first, 5, "the first burst fits: {runs:?}");
    assert!(
        second <= 1,
        "a fixed window would admit the whole second burst; the sliding window at most 1: {runs:?}"
    );
    // The extension that named no pushed limit is said, with its place.
    let log = std::fs::read_to_string(dir.path().join("ratelimit.log")).unwrap_or_default();
    assert!(
        log.contains("an xDS extension matches no pushed limit")
            && log.contains("extensions.yaml:5:5"),
        "{log}"
    );

    // The operator changes the file (a ConfigMap's update): a token bucket
    // of 5 a second with bursts of 1. Read again and the last snapshot
    // applied with it, no push needed: two requests at once, the second
    // refused, where the sliding window admits both.
    std::fs::write(
        &extensions,
        "extensions:\n  - domain: gateway\n    descriptors: [generic_key=route]\n    rate_limit: {algorithm: gcra, burst: 1}\n",
    )
    .expect("rewrite the extensions");
    let deadline = Instant::now() + READY;
    loop {
        tokio::time::sleep(Duration::from_millis(1_500)).await;
        let pair = [status(&http, &route).await, status(&http, &route).await];
        if pair == [Some(200), Some(429)] {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the new extensions never applied: {pair:?}"
        );
    }
    let log = std::fs::read_to_string(dir.path().join("ratelimit.log")).unwrap_or_default();
    assert!(log.contains("xDS extensions reloaded"), "{log}");
    assert!(charon.exited().is_none());
}
