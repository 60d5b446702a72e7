//! `charon inject` end to end: the real binary serving HTTPS with a
//! certificate from a private CA (made with `openssl`), fed the recorded
//! AdmissionReviews of `tests/fixtures/admission/` with `curl`; each returned
//! patch is applied to its pod with `kubectl patch --local` and the result
//! validated with `kubernetes-validate --strict -k 1.29` (both installed by
//! `scripts/test-deps.sh` into `target/envoy-venv`). Also: idempotency (an
//! injected pod is left alone), bad input (malformed JSON, a pod without
//! containers, an unknown annotation value, a huge body), and a certificate
//! replaced on disk being served without a restart.
#![cfg(all(unix, feature = "server"))]

use crate::support;

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use base64::Engine;
use serde_json::{Value, json};

const FIXTURES: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/admission");

fn run(command: &mut Command) -> String {
    let output = command.output().expect("the command runs");
    assert!(
        output.status.success(),
        "{command:?} failed:\n{}\n{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8_lossy(&output.stdout).into_owned()
}

/// A CA and a certificate for 127.0.0.1 signed by it: `<name>-ca.pem`,
/// `<name>.pem`, `<name>.key`.
fn make_certificates(dir: &Path, name: &str) {
    let openssl = |args: &[&str]| {
        run(Command::new("openssl").args(args).current_dir(dir));
    };
    std::fs::write(
        dir.join("leaf.ext"),
        "subjectAltName=IP:127.0.0.1,DNS:localhost\nbasicConstraints=CA:FALSE\n",
    )
    .expect("write leaf.ext");
    let (ca, ca_key) = (format!("{name}-ca.pem"), format!("{name}-ca.key"));
    let (leaf, key, csr) = (
        format!("{name}.pem"),
        format!("{name}.key"),
        format!("{name}.csr"),
    );
    openssl(&[
        "req",
        "-x509",
        "-newkey",
        "rsa:2048",
        "-nodes",
        "-keyout",
        &ca_key,
        "-out",
        &ca,
        "-days",
        "2",
        "-subj",
        &format!("/CN={name}-ca"),
    ]);
    openssl(&[
        "req",
        "-newkey",
        "rsa:2048",
        "-nodes",
        "-keyout",
        &key,
        "-out",
        &csr,
        "-subj",
        "/CN=127.0.0.1",
    ]);
    openssl(&[
        "x509",
        "-req",
        "-in",
        &csr,
        "-CA",
        &ca,
        "-CAkey",
        &ca_key,
        "-CAcreateserial",
        "-out",
        &leaf,
        "-days",
        "2",
        "-extfile",
        "leaf.ext",
    ]);
}

struct Webhook {
    child: Child,
    port: u16,
    dir: tempfile::TempDir,
}

impl Webhook {
    fn start() -> Webhook {
        let dir = tempfile::Builder::new()
            .prefix("charon-inject-")
            .tempdir()
            .expect("tempdir");
        make_certificates(dir.path(), "first");
        std::fs::copy(dir.path().join("first.pem"), dir.path().join("tls.crt")).expect("copy");
        std::fs::copy(dir.path().join("first.key"), dir.path().join("tls.key")).expect("copy");
        let port = support::redis::free_port();
        let child = Command::new(env!("CARGO_BIN_EXE_charon"))
            .args(["inject", "--addr", &format!("127.0.0.1:{port}")])
            .arg("--tls-cert")
            .arg(dir.path().join("tls.crt"))
            .arg("--tls-key")
            .arg(dir.path().join("tls.key"))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("charon inject starts");
        let webhook = Webhook { child, port, dir };
        webhook.wait_healthy("first-ca.pem");
        webhook
    }

    fn url(&self, path: &str) -> String {
        format!("https://127.0.0.1:{}{path}", self.port)
    }

    /// `curl` over TLS trusting `ca`: (HTTP status, body); `None` if the TLS
    /// connection failed (e.g. the certificate is not trusted).
    fn curl(&self, ca: &str, args: &[&str], path: &str) -> Option<(u16, String)> {
        let output = Command::new("curl")
            .args(["-sS", "--max-time", "10", "--cacert"])
            .arg(self.dir.path().join(ca))
            .args(args)
            .args(["-w", "\n%{http_code}"])
            .arg(self.url(path))
            .output()
            .expect("curl runs");
        if !output.status.success() {
            return None;
        }
        let text = String::from_utf8_lossy(&output.stdout).into_owned();
        let (body, code) = text.rsplit_once('\n')?;
        Some((code.parse().ok()?, body.to_owned()))
    }

    fn post(&self, body_file: &Path) -> (u16, String) {
        let data = format!("@{}", body_file.display());
        self.curl(
            "first-ca.pem",
            &[
                "-X",
                "POST",
                "-H",
                "Content-Type: application/json",
                "--data-binary",
                &data,
            ],
            "/mutate",
        )
        .expect("the webhook answers over TLS")
    }

    fn wait_healthy(&self, ca: &str) {
        let deadline = Instant::now() + Duration::from_secs(30);
        while self.curl(ca, &[], "/healthz").map(|(code, _)| code) != Some(200) {
            assert!(
                Instant::now() < deadline,
                "charon inject did not serve /healthz trusting {ca}"
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}

impl Drop for Webhook {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn fixture(name: &str) -> Value {
    let text = std::fs::read_to_string(format!("{FIXTURES}/{name}")).expect("fixture");
    serde_json::from_str(&text).expect("fixture JSON")
}

fn response(body: &str) -> Value {
    let review: Value = serde_json::from_str(body).unwrap_or_else(|e| panic!("{e}: {body}"));
    assert_eq!(review["kind"], json!("AdmissionReview"));
    assert_eq!(review["apiVersion"], json!("admission.k8s.io/v1"));
    review["response"].clone()
}

/// Applies the response's patch to the review's pod with `kubectl patch
/// --local`, validates the result, and returns it.
fn apply_and_validate(dir: &Path, review: &Value, response: &Value) -> Value {
    assert_eq!(response["patchType"], json!("JSONPatch"));
    let patch = base64::engine::general_purpose::STANDARD
        .decode(response["patch"].as_str().expect("a patch"))
        .expect("base64");
    let pod_file = dir.join("pod.json");
    std::fs::write(&pod_file, review["request"]["object"].to_string()).expect("write pod");
    let patched = run(Command::new(support::venv::tool("kubectl"))
        .args(["patch", "--local", "--type", "json", "-o", "json", "-f"])
        .arg(&pod_file)
        .arg("-p")
        .arg(String::from_utf8(patch).expect("UTF-8 patch")));
    let mut pod: Value = serde_json::from_str(&patched).expect("kubectl prints JSON");
    // A controller's pod has only `generateName` at admission; the API
    // server names it after the webhooks. The validator wants a name.
    if pod["metadata"].get("name").is_none() {
        let name = format!(
            "{}x7k2q",
            pod["metadata"]["generateName"].as_str().unwrap_or("pod-")
        );
        pod["metadata"]["name"] = json!(name);
    }
    let patched_file = dir.join("patched.json");
    std::fs::write(&patched_file, pod.to_string()).expect("write patched");
    run(Command::new(support::venv::tool("kubernetes-validate"))
        .args(["--strict", "-k", "1.29"])
        .arg(&patched_file));
    pod
}

#[test]
fn opted_in_pods_get_a_valid_native_sidecar_and_everything_else_is_admitted_unchanged() {
    let webhook = Webhook::start();
    let dir = webhook.dir.path().to_owned();

    for name in ["opted-in-full.json", "opted-in-minimal.json"] {
        let review = fixture(name);
        let (code, body) = webhook.post(Path::new(&format!("{FIXTURES}/{name}")));
        assert_eq!(code, 200, "{name}: {body}");
        let answer = response(&body);
        assert_eq!(answer["uid"], review["request"]["uid"], "{name}");
        assert_eq!(answer["allowed"], json!(true));
        let pod = apply_and_validate(&dir, &review, &answer);

        let init = pod["spec"]["initContainers"]
            .as_array()
            .expect("init containers");
        let sidecar = &init[0];
        assert_eq!(sidecar["name"], json!("charon"), "{name}");
        assert_eq!(
            sidecar["restartPolicy"],
            json!("Always"),
            "a native sidecar"
        );
        assert_eq!(
            sidecar["securityContext"]["readOnlyRootFilesystem"],
            json!(true)
        );
        assert_eq!(
            sidecar["readinessProbe"]["httpGet"]["path"],
            json!("/readyz")
        );
        let containers = pod["spec"]["containers"].as_array().expect("containers");
        assert_eq!(containers.len(), 1, "the app is untouched");
        assert_eq!(
            pod["metadata"]["annotations"]["charon.io/injected"],
            json!("true")
        );
        let volumes = pod["spec"]["volumes"].as_array().expect("volumes");
        let config = volumes
            .iter()
            .find(|v| v["name"] == json!("charon-config"))
            .expect("the config volume");
        if name == "opted-in-full.json" {
            // Existing init containers and volumes are kept; the annotations
            // choose the ConfigMap and the store.
            assert_eq!(init.len(), 2);
            assert_eq!(init[1]["name"], json!("migrate"));
            assert!(volumes.iter().any(|v| v["name"] == json!("cache")));
            assert_eq!(config["configMap"]["name"], json!("shop-limits"));
            let args = sidecar["args"].as_array().expect("args");
            let store = args.iter().position(|a| a == "--store").expect("--store");
            assert_eq!(args[store + 1], json!("redis://charon-redis:6379"));
            // The admin token from the annotated Secret, mounted read-only.
            let token = args
                .iter()
                .position(|a| a == "--admin-token-file")
                .expect("--admin-token-file");
            assert_eq!(args[token + 1], json!("/etc/charon-admin/token"));
            let secret = volumes
                .iter()
                .find(|v| v["name"] == json!("charon-admin-token"))
                .expect("the token volume");
            assert_eq!(secret["secret"]["secretName"], json!("charon-admin"));
            // TLS on the gRPC port, and the CA of the clients (mTLS).
            for (flag, file) in [
                ("--grpc-tls-cert", "/etc/charon-tls/tls.crt"),
                ("--grpc-tls-key", "/etc/charon-tls/tls.key"),
                ("--grpc-client-ca", "/etc/charon-client-ca/ca.crt"),
            ] {
                let at = args.iter().position(|a| a == flag).expect(flag);
                assert_eq!(args[at + 1], json!(file));
            }
            for (volume, secret) in [
                ("charon-grpc-tls", "charon-grpc-tls"),
                ("charon-grpc-client-ca", "envoy-client-ca"),
            ] {
                let found = volumes
                    .iter()
                    .find(|v| v["name"] == json!(volume))
                    .expect(volume);
                assert_eq!(found["secret"]["secretName"], json!(secret));
            }
            assert!(
                sidecar["volumeMounts"]
                    .as_array()
                    .expect("mounts")
                    .iter()
                    .any(|m| m["mountPath"] == json!("/etc/charon-admin")
                        && m["readOnly"] == json!(true))
            );
        } else {
            assert_eq!(config["configMap"]["name"], json!("charon-limits"));
        }

        // Idempotent: the injected pod, reviewed again, is left alone.
        let mut again = review.clone();
        again["request"]["object"] = pod;
        let again_file = dir.join("again.json");
        std::fs::write(&again_file, again.to_string()).expect("write");
        let (code, body) = webhook.post(&again_file);
        assert_eq!(code, 200);
        let answer = response(&body);
        assert_eq!(answer["allowed"], json!(true));
        assert!(
            answer.get("patch").is_none(),
            "{name} injected twice: {answer}"
        );
    }

    for name in [
        "not-annotated.json",
        "unknown-value.json",
        "no-containers.json",
        "not-a-pod.json",
    ] {
        let review = fixture(name);
        let (code, body) = webhook.post(Path::new(&format!("{FIXTURES}/{name}")));
        assert_eq!(code, 200, "{name}: {body}");
        let answer = response(&body);
        assert_eq!(
            answer,
            json!({"uid": review["request"]["uid"], "allowed": true}),
            "{name} must be admitted unchanged"
        );
    }
}

#[test]
fn bad_requests_get_clear_answers_and_the_webhook_keeps_serving() {
    let webhook = Webhook::start();
    let dir = webhook.dir.path().to_owned();
    let (code, body) = webhook.post(Path::new(&format!("{FIXTURES}/malformed.json")));
    assert_eq!(code, 400);
    assert!(body.contains("not JSON"), "{body}");

    std::fs::write(dir.join("empty.json"), "{}").expect("write");
    let (code, body) = webhook.post(&dir.join("empty.json"));
    assert_eq!(code, 400);
    assert!(body.contains("AdmissionReview"), "{body}");

    // A body over the 4 MiB cap: refused without being read whole.
    let huge = format!(
        "{{\"request\": {{\"uid\": \"x\", \"pad\": \"{}\"}}}}",
        "a".repeat(5 << 20)
    );
    std::fs::write(dir.join("huge.json"), huge).expect("write");
    // The webhook answers 413 and closes while curl may still be sending;
    // curl then sometimes reports the reset instead of the answer. Either
    // way the body is refused, and the webhook keeps serving (below).
    let data = format!("@{}", dir.join("huge.json").display());
    let answer = webhook.curl(
        "first-ca.pem",
        &["-X", "POST", "--data-binary", &data],
        "/mutate",
    );
    if let Some((code, _)) = answer {
        assert_eq!(code, 413);
    }

    // Its metrics: the process's series, in the classic text format.
    let (code, metrics) = webhook
        .curl("first-ca.pem", &[], "/metrics")
        .expect("the webhook answers /metrics");
    assert_eq!(code, 200);
    for name in [
        "process_resident_memory_bytes ",
        "process_open_fds ",
        "process_cpu_seconds_total ",
    ] {
        assert!(
            metrics.lines().any(|l| l.starts_with(name)),
            "{name} in\n{metrics}"
        );
    }

    // A client that never finishes its handshake does not block the others.
    let stalled = std::net::TcpStream::connect(("127.0.0.1", webhook.port)).expect("connect");
    let (code, _) = webhook.post(Path::new(&format!("{FIXTURES}/opted-in-minimal.json")));
    assert_eq!(code, 200);
    drop(stalled);
}

#[test]
fn a_certificate_replaced_on_disk_is_served_without_a_restart() {
    let webhook = Webhook::start();
    let dir = webhook.dir.path().to_owned();
    make_certificates(&dir, "second");
    // As a Secret update does: the new files appear in place.
    std::fs::copy(dir.join("second.key"), dir.join("tls.key.new")).expect("copy");
    std::fs::copy(dir.join("second.pem"), dir.join("tls.crt.new")).expect("copy");
    std::fs::rename(dir.join("tls.key.new"), dir.join("tls.key")).expect("rename");
    std::fs::rename(dir.join("tls.crt.new"), dir.join("tls.crt")).expect("rename");
    webhook.wait_healthy("second-ca.pem");
    assert!(
        webhook.curl("first-ca.pem", &[], "/healthz").is_none(),
        "the old certificate is gone"
    );

    // A broken replacement is refused; the current certificate stays.
    std::fs::write(dir.join("tls.crt"), "not a certificate").expect("write");
    std::thread::sleep(Duration::from_millis(2_500));
    webhook.wait_healthy("second-ca.pem");
}
