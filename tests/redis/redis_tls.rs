//! `rediss://`: the Redis store over TLS, against a real `redis-server`
//! listening only for TLS, with a CA and a certificate made here by
//! `openssl`: verified against a private CA (`SSL_CERT_FILE`, read by the
//! sidecar at start) and with `#insecure`; and a Redis that asks for client
//! certificates (its default), answered with `--store-ca`,
//! `--store-tls-cert` and `--store-tls-key`.

use crate::support;

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use charon::engine::{Item, SlotKind, WindowItem};
use charon::store::keys;
use charon::store::{Batch, RedisOptions, RedisStore};

fn openssl(dir: &Path, args: &[&str]) {
    let output = Command::new("openssl")
        .args(args)
        .current_dir(dir)
        .output()
        .expect("openssl runs (scripts/test-deps.sh installs it)");
    assert!(
        output.status.success(),
        "openssl {args:?}: {}",
        String::from_utf8_lossy(&output.stderr)
    );
}

/// A CA, and a certificate for 127.0.0.1 signed by it.
fn make_certificates(dir: &Path) {
    std::fs::write(
        dir.join("leaf.ext"),
        "subjectAltName=IP:127.0.0.1,DNS:localhost\nbasicConstraints=CA:FALSE\n",
    )
    .expect("write leaf.ext");
    openssl(
        dir,
        &[
            "req",
            "-x509",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-keyout",
            "ca.key",
            "-out",
            "ca.pem",
            "-days",
            "2",
            "-subj",
            "/CN=charon-test-ca",
        ],
    );
    openssl(
        dir,
        &[
            "req",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-keyout",
            "leaf.key",
            "-out",
            "leaf.csr",
            "-subj",
            "/CN=127.0.0.1",
        ],
    );
    openssl(
        dir,
        &[
            "x509",
            "-req",
            "-in",
            "leaf.csr",
            "-CA",
            "ca.pem",
            "-CAkey",
            "ca.key",
            "-CAcreateserial",
            "-out",
            "leaf.pem",
            "-days",
            "2",
            "-extfile",
            "leaf.ext",
        ],
    );
}

/// `redis-server` with TLS only, killed by PID when dropped.
struct TlsRedis {
    child: Child,
    port: u16,
}

impl TlsRedis {
    fn start(dir: &Path) -> Self {
        Self::start_asking(dir, false)
    }

    /// With `auth_clients`, Redis's default: a client certificate signed by
    /// `ca.pem` is required.
    fn start_asking(dir: &Path, auth_clients: bool) -> Self {
        let port = support::redis::free_port();
        let child = Command::new("redis-server")
            .args([
                "--port",
                "0",
                "--bind",
                "127.0.0.1",
                "--save",
                "",
                "--appendonly",
                "no",
            ])
            .args(["--tls-port", &port.to_string()])
            .args(["--tls-cert-file", "leaf.pem", "--tls-key-file", "leaf.key"])
            .args(["--tls-ca-cert-file", "ca.pem", "--tls-auth-clients"])
            .arg(if auth_clients { "yes" } else { "no" })
            .args(["--dir", "."])
            .current_dir(dir)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("redis-server starts");
        Self { child, port }
    }
}

impl Drop for TlsRedis {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[test]
fn the_store_speaks_tls() {
    let dir = tempfile::tempdir().expect("a temp dir");
    make_certificates(dir.path());
    let redis = TlsRedis::start(dir.path());
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a runtime");
    let _entered = runtime.enter();
    let store = RedisStore::open(
        &format!("rediss://127.0.0.1:{}/#insecure", redis.port),
        RedisOptions {
            timeout: Duration::from_secs(2),
            ..RedisOptions::default()
        },
    )
    .expect("a valid URL");
    let deadline = Instant::now() + Duration::from_secs(20);
    while let Err(error) = runtime.block_on(store.ping()) {
        assert!(Instant::now() < deadline, "no TLS answer: {error}");
        std::thread::sleep(Duration::from_millis(100));
    }
    let mut batch = Batch::default();
    let slot = batch.slot(
        keys::descriptor_key(SlotKind::Window, "ns", [("k", "v")], 60_000),
        SlotKind::Window,
    );
    batch.items.push(Item::Window(WindowItem {
        slot,
        limit: 1,
        period: 60_000,
        hits: 1,
        shadow: false,
        count_rejected: false,
    }));
    let first = runtime
        .block_on(store.decide_batch(&batch))
        .expect("decided over TLS");
    let second = runtime
        .block_on(store.decide_batch(&batch))
        .expect("decided over TLS");
    assert!(first.granted && !second.granted);
}

#[test]
fn a_sidecar_verifies_redis_against_a_private_ca() {
    let dir = tempfile::tempdir().expect("a temp dir");
    make_certificates(dir.path());
    let redis = TlsRedis::start(dir.path());
    std::fs::write(
        dir.path().join("limits.yaml"),
        "domain: edge\ndescriptors:\n  - key: tenant\n    rate_limit: {unit: hour, requests_per_unit: 3}\n",
    )
    .expect("write the config");
    let (grpc, admin) = (support::redis::free_port(), support::redis::free_port());
    let mut sidecar = Command::new(env!("CARGO_BIN_EXE_charon"))
        .arg("serve")
        .arg("--config")
        .arg(dir.path().join("limits.yaml"))
        .args(["--store", &format!("rediss://127.0.0.1:{}", redis.port)])
        .args(["--grpc-addr", &format!("127.0.0.1:{grpc}")])
        .args(["--admin-addr", &format!("127.0.0.1:{admin}")])
        .env("SSL_CERT_FILE", dir.path().join("ca.pem"))
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("charon starts");
    let deadline = Instant::now() + Duration::from_secs(30);
    let readyz = loop {
        let body = http_get(admin, "/readyz").unwrap_or_default();
        if body.contains("store reachable") && !body.contains("unreachable") {
            break body;
        }
        if Instant::now() > deadline {
            let _ = sidecar.kill();
            panic!("the sidecar never reached Redis over TLS; /readyz said {body:?}");
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    let _ = sidecar.kill();
    let _ = sidecar.wait();
    assert!(readyz.starts_with("ready"), "{readyz}");
}

/// A bare HTTP/1.0 GET (the body), to keep this test free of HTTP crates.
fn http_get(port: u16, path: &str) -> Option<String> {
    use std::io::{Read, Write};
    let mut stream = std::net::TcpStream::connect(("127.0.0.1", port)).ok()?;
    stream.set_read_timeout(Some(Duration::from_secs(2))).ok()?;
    write!(stream, "GET {path} HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n").ok()?;
    let mut response = String::new();
    stream.read_to_string(&mut response).ok()?;
    response
        .split_once("\r\n\r\n")
        .map(|(_, body)| body.to_string())
}

/// The sidecar's `/readyz` body once it says the store is reachable, or the
/// last body seen when `within` runs out.
fn readyz_until_reachable(admin: u16, within: Duration) -> String {
    let deadline = Instant::now() + within;
    loop {
        let body = http_get(admin, "/readyz").unwrap_or_default();
        if (body.contains("store reachable") && !body.contains("unreachable"))
            || Instant::now() > deadline
        {
            return body;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

#[test]
fn a_redis_that_asks_for_client_certificates_gets_ours() {
    let dir = tempfile::tempdir().expect("a temp dir");
    make_certificates(dir.path());
    let (cert, key) = support::certs::leaf(
        dir.path(),
        "ca",
        "sidecar",
        "DNS:charon-sidecar",
        "clientAuth",
    );
    let redis = TlsRedis::start_asking(dir.path(), true);
    std::fs::write(
        dir.path().join("limits.yaml"),
        "domain: edge\ndescriptors:\n  - key: tenant\n    rate_limit: {unit: hour, requests_per_unit: 3}\n",
    )
    .expect("write the config");
    let start = |extra: &[&str]| {
        let (grpc, admin) = (support::redis::free_port(), support::redis::free_port());
        let child = Command::new(env!("CARGO_BIN_EXE_charon"))
            .arg("serve")
            .arg("--config")
            .arg(dir.path().join("limits.yaml"))
            .args(["--store", &format!("rediss://127.0.0.1:{}", redis.port)])
            .args(["--grpc-addr", &format!("127.0.0.1:{grpc}")])
            .args(["--admin-addr", &format!("127.0.0.1:{admin}")])
            .args(extra)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("charon starts");
        (child, admin)
    };
    let ca = dir.path().join("ca.pem").display().to_string();
    let (cert, key) = (cert.display().to_string(), key.display().to_string());
    let (mut with_cert, admin) = start(&[
        "--store-ca",
        &ca,
        "--store-tls-cert",
        &cert,
        "--store-tls-key",
        &key,
    ]);
    let readyz = readyz_until_reachable(admin, Duration::from_secs(30));
    let _ = with_cert.kill();
    let _ = with_cert.wait();
    assert!(
        readyz.starts_with("ready: store reachable"),
        "with our certificate: {readyz:?}"
    );
    // The same CA but no client certificate: Redis refuses the handshake.
    let (mut without, admin) = start(&["--store-ca", &ca]);
    let readyz = readyz_until_reachable(admin, Duration::from_secs(4));
    let _ = without.kill();
    let _ = without.wait();
    assert!(
        !readyz.contains("store reachable") || readyz.contains("unreachable"),
        "without a client certificate: {readyz:?}"
    );
}
