//! The gRPC port as a central deployment runs it: TLS, mTLS with an
//! allowed-SAN list, a certificate rotated under a running sidecar, and a
//! Unix socket. Real `charon serve`, real sockets, certificates made by
//! `openssl`, clients from tonic.
#![cfg(all(unix, feature = "server"))]

use crate::support;

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::Entry;
use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitRequest;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
use support::certs;
use support::sidecar::{READY_TIMEOUT, Sidecar, eventually, tempdir, write_config};
use tonic::transport::{Certificate, Channel, ClientTlsConfig, Endpoint, Identity};

const CONFIG: &str = "domain: tls\ndescriptors:\n  - key: tenant\n    rate_limit: {unit: hour, requests_per_unit: 100}\n";

fn request() -> RateLimitRequest {
    RateLimitRequest {
        domain: "tls".into(),
        descriptors: vec![RateLimitDescriptor {
            entries: vec![Entry {
                key: "tenant".into(),
                value: "acme".into(),
            }],
            ..Default::default()
        }],
        hits_addend: 1,
    }
}

/// A client of the sidecar's port over TLS, trusting `ca`, presenting
/// `identity` if given; the error if it cannot connect or ask.
async fn ask_tls(port: u16, ca: &Path, identity: Option<(&Path, &Path)>) -> Result<(), String> {
    let mut tls = ClientTlsConfig::new()
        .ca_certificate(Certificate::from_pem(std::fs::read(ca).unwrap()))
        .domain_name("localhost");
    if let Some((cert, key)) = identity {
        tls = tls.identity(Identity::from_pem(
            std::fs::read(cert).unwrap(),
            std::fs::read(key).unwrap(),
        ));
    }
    let channel = Endpoint::from_shared(format!("https://127.0.0.1:{port}"))
        .unwrap()
        .tls_config(tls)
        .map_err(|e| e.to_string())?
        .connect_timeout(Duration::from_secs(5))
        .connect()
        .await
        .map_err(|e| format!("connect: {e:?}"))?;
    ask(channel).await
}

async fn ask(channel: Channel) -> Result<(), String> {
    let answer = tokio::time::timeout(
        Duration::from_secs(10),
        RateLimitServiceClient::new(channel).should_rate_limit(request()),
    )
    .await
    .map_err(|_| "no answer".to_owned())?;
    answer.map(|_| ()).map_err(|status| format!("{status:?}"))
}

async fn ask_plain(port: u16) -> Result<(), String> {
    let channel = Endpoint::from_shared(format!("http://127.0.0.1:{port}"))
        .unwrap()
        .connect_timeout(Duration::from_secs(5))
        .connect()
        .await
        .map_err(|e| format!("connect: {e:?}"))?;
    ask(channel).await
}

struct Pki {
    dir: PathBuf,
}

impl Pki {
    fn new(dir: &Path) -> Self {
        certs::ca(dir, "ca");
        certs::ca(dir, "other-ca");
        certs::leaf(
            dir,
            "ca",
            "server",
            "DNS:localhost,IP:127.0.0.1",
            "serverAuth",
        );
        certs::leaf(dir, "ca", "envoy", "DNS:envoy.charon.svc", "clientAuth");
        certs::leaf(dir, "ca", "stranger", "DNS:stranger.example", "clientAuth");
        certs::leaf(
            dir,
            "other-ca",
            "forged",
            "DNS:envoy.charon.svc",
            "clientAuth",
        );
        Self {
            dir: dir.to_owned(),
        }
    }

    fn path(&self, name: &str) -> PathBuf {
        self.dir.join(name)
    }

    fn pair(&self, name: &str) -> (PathBuf, PathBuf) {
        (
            self.path(&format!("{name}.pem")),
            self.path(&format!("{name}.key")),
        )
    }
}

fn arg(path: &Path) -> String {
    path.display().to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_serves_good_clients_and_refuses_plaintext() {
    let dir = tempdir();
    let pki = Pki::new(dir.path());
    let config = write_config(dir.path(), CONFIG);
    let (cert, key) = pki.pair("server");
    let sidecar = Sidecar::start(
        dir.path(),
        &config,
        "memory",
        &["--grpc-tls-cert", &arg(&cert), "--grpc-tls-key", &arg(&key)],
    );
    sidecar.wait_readyz(200, "ready").await;
    eventually("a TLS client is answered", READY_TIMEOUT, async || {
        ask_tls(sidecar.grpc, &pki.path("ca.pem"), None).await
    })
    .await;
    assert!(ask_plain(sidecar.grpc).await.is_err(), "plaintext answered");
    // A client that trusts another CA does not trust this sidecar.
    assert!(
        ask_tls(sidecar.grpc, &pki.path("other-ca.pem"), None)
            .await
            .is_err()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mtls_needs_a_certificate_from_the_ca_naming_an_allowed_san() {
    let dir = tempdir();
    let pki = Pki::new(dir.path());
    let config = write_config(dir.path(), CONFIG);
    let (cert, key) = pki.pair("server");
    let sidecar = Sidecar::start(
        dir.path(),
        &config,
        "memory",
        &[
            "--grpc-tls-cert",
            &arg(&cert),
            "--grpc-tls-key",
            &arg(&key),
            "--grpc-client-ca",
            &arg(&pki.path("ca.pem")),
            "--grpc-allowed-san",
            "envoy.charon.svc,10.0.0.9",
        ],
    );
    sidecar.wait_readyz(200, "ready").await;
    let ca = pki.path("ca.pem");
    let (envoy_cert, envoy_key) = pki.pair("envoy");
    eventually(
        "a client with an allowed certificate",
        READY_TIMEOUT,
        async || ask_tls(sidecar.grpc, &ca, Some((&envoy_cert, &envoy_key))).await,
    )
    .await;
    assert!(
        ask_tls(sidecar.grpc, &ca, None).await.is_err(),
        "no certificate"
    );
    let (cert, key) = pki.pair("stranger");
    assert!(
        ask_tls(sidecar.grpc, &ca, Some((&cert, &key)))
            .await
            .is_err(),
        "a SAN not on the list"
    );
    let (cert, key) = pki.pair("forged");
    assert!(
        ask_tls(sidecar.grpc, &ca, Some((&cert, &key)))
            .await
            .is_err(),
        "a certificate from another CA"
    );
    assert!(ask_plain(sidecar.grpc).await.is_err(), "plaintext");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rotated_certificate_is_served_without_a_restart_or_a_dropped_stream() {
    let dir = tempdir();
    let pki = Pki::new(dir.path());
    certs::leaf(
        dir.path(),
        "other-ca",
        "rotated",
        "DNS:localhost,IP:127.0.0.1",
        "serverAuth",
    );
    let config = write_config(dir.path(), CONFIG);
    let (live_cert, live_key) = (dir.path().join("live.pem"), dir.path().join("live.key"));
    let (cert, key) = pki.pair("server");
    std::fs::copy(&cert, &live_cert).unwrap();
    std::fs::copy(&key, &live_key).unwrap();
    let sidecar = Sidecar::start(
        dir.path(),
        &config,
        "memory",
        &[
            "--grpc-tls-cert",
            &arg(&live_cert),
            "--grpc-tls-key",
            &arg(&live_key),
        ],
    );
    sidecar.wait_readyz(200, "ready").await;
    let old_ca = pki.path("ca.pem");
    let mut established = None;
    eventually(
        "served with the first certificate",
        READY_TIMEOUT,
        async || {
            let tls = ClientTlsConfig::new()
                .ca_certificate(Certificate::from_pem(std::fs::read(&old_ca).unwrap()))
                .domain_name("localhost");
            let channel = Endpoint::from_shared(format!("https://127.0.0.1:{}", sidecar.grpc))
                .unwrap()
                .tls_config(tls)
                .map_err(|e| e.to_string())?
                .connect()
                .await
                .map_err(|e| e.to_string())?;
            ask(channel.clone()).await?;
            established = Some(channel);
            Ok(())
        },
    )
    .await;
    let established = established.expect("a connection");

    // The Secret is rotated to a certificate from another CA.
    let (cert, key) = pki.pair("rotated");
    std::fs::copy(&key, &live_key).unwrap();
    std::fs::copy(&cert, &live_cert).unwrap();
    let new_ca = pki.path("other-ca.pem");
    eventually(
        "new connections get the new certificate",
        READY_TIMEOUT,
        async || ask_tls(sidecar.grpc, &new_ca, None).await,
    )
    .await;
    // The connection made before the rotation still answers.
    ask(established)
        .await
        .expect("the established connection is kept");
    assert!(sidecar.log().contains("reloaded the TLS certificate"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_unix_socket_serves_grpc_with_mode_0600_and_is_removed_at_exit() {
    let dir = tempdir();
    let config = write_config(dir.path(), CONFIG);
    let socket = dir.path().join("charon.sock");
    let mut sidecar = Sidecar::start(
        dir.path(),
        &config,
        "memory",
        &["--grpc-uds", &arg(&socket)],
    );
    sidecar.wait_readyz(200, "ready").await;
    let mode = std::fs::metadata(&socket).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o600, "socket mode {mode:o}");
    let path = socket.clone();
    let channel = Endpoint::from_static("http://charon.sock")
        .connect_with_connector(tower::service_fn(move |_| {
            let path = path.clone();
            async move {
                Ok::<_, std::io::Error>(hyper_util::rt::TokioIo::new(
                    tokio::net::UnixStream::connect(path).await?,
                ))
            }
        }))
        .await
        .expect("connects over the socket");
    ask(channel).await.expect("answered over the socket");
    // TCP still answers beside it.
    ask_plain(sidecar.grpc).await.expect("answered over TCP");
    let status = sidecar.terminate().await;
    assert!(status.success(), "{status:?}");
    assert!(!socket.exists(), "the socket file is removed at exit");
}

/// The Rust client speaks mTLS and the Unix socket too: sessions (the
/// Charon API) and Envoy-style requests both get the sidecar's answer.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_rust_client_reaches_a_sidecar_over_mtls_and_a_unix_socket() {
    use charon::client::{Client, ClientOptions, Sidecar as Remote, SidecarOptions};
    let dir = tempdir();
    let pki = Pki::new(dir.path());
    let config = write_config(dir.path(), CONFIG);
    let socket = dir.path().join("charon.sock");
    let (cert, key) = pki.pair("server");
    let sidecar = Sidecar::start(
        dir.path(),
        &config,
        "memory",
        &[
            "--grpc-tls-cert",
            &arg(&cert),
            "--grpc-tls-key",
            &arg(&key),
            "--grpc-client-ca",
            &arg(&pki.path("ca.pem")),
            "--grpc-uds",
            &arg(&socket),
        ],
    );
    sidecar.wait_readyz(200, "ready").await;
    let (envoy_cert, envoy_key) = pki.pair("envoy");
    let tls = ClientTlsConfig::new()
        .ca_certificate(Certificate::from_pem(
            std::fs::read(pki.path("ca.pem")).unwrap(),
        ))
        .identity(Identity::from_pem(
            std::fs::read(envoy_cert).unwrap(),
            std::fs::read(envoy_key).unwrap(),
        ))
        .domain_name("localhost");
    let options = ClientOptions {
        call_timeout: Duration::from_secs(5),
        fail_open: false,
        ..ClientOptions::default()
    };
    let over_tls = Remote::connect_with(
        &format!("https://127.0.0.1:{}", sidecar.grpc),
        SidecarOptions {
            tls: Some(tls),
            ..SidecarOptions::default()
        },
    )
    .expect("a TLS sidecar client");
    let over_socket =
        Remote::connect(&format!("unix:{}", socket.display())).expect("a socket sidecar client");
    for (name, backend) in [("mTLS", over_tls), ("socket", over_socket)] {
        let client = Client::with_options(backend, options.clone());
        assert!(client.ready(READY_TIMEOUT).await, "{name}: no session");
        let descriptors = charon::limiter::RateLimitRequest::new(
            "tls",
            vec![charon::limiter::Descriptor::new([("tenant", "acme")])],
        );
        let answer = client
            .should_rate_limit(descriptors)
            .await
            .unwrap_or_else(|error| panic!("{name}: {error}"));
        assert!(
            !answer.unanswered && answer.is_granted(),
            "{name}: {answer:?}"
        );
        assert_eq!(
            answer.statuses[0].limit.as_ref().unwrap().requests_per_unit,
            100
        );
        // A session operation: refused by the sidecar itself, so it came
        // through the session.
        let refused = client.request("tls", "no-such-resource", "acme").await;
        assert!(
            matches!(refused, Err(charon::client::ClientError::Refused { .. })),
            "{name}: {refused:?}"
        );
    }
}
