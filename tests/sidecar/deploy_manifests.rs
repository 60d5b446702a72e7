//! The Kubernetes manifests against the code, without a cluster:
//!
//! - the sidecar in every rendered overlay (`kubectl kustomize`) is exactly
//!   the one `charon inject` adds (`charon::inject::review::sidecar`), so the
//!   two ways of deploying cannot drift apart;
//! - the real `charon` binary, started with the arguments of the memory
//!   overlay's sidecar and the rendered `charon-limits` ConfigMap as its
//!   mounted directory, becomes live and ready on the probes' paths;
//! - two replicas of each central overlay (`central/redis`,
//!   `central/sentinel`, `central/redis-cluster`), started with the
//!   Deployment's arguments on a real Redis, Sentinel or Cluster, share
//!   Istio's limits whichever replica is asked.
//!
//! `scripts/validate-deploy.sh` (part of the test command) checks the rest:
//! schemas, security settings, yamllint and `envoy --mode validate`.
#![cfg(all(unix, feature = "server"))]

use crate::support;

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

/// The objects of `kubectl kustomize <dir>`, as JSON.
fn render(overlay: &str) -> Vec<Value> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("deploy/kubernetes")
        .join(overlay);
    let yaml = Command::new(support::venv::tool("kubectl"))
        .arg("kustomize")
        .arg(&dir)
        .output()
        .expect("kubectl runs");
    assert!(
        yaml.status.success(),
        "{}",
        String::from_utf8_lossy(&yaml.stderr)
    );
    // PyYAML comes with kubernetes-validate in the same venv.
    let mut python = Command::new(support::venv::tool("python"))
        .args([
            "-c",
            "import json, sys, yaml; print(json.dumps([d for d in yaml.safe_load_all(sys.stdin) if d]))",
        ])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .expect("python runs");
    {
        use std::io::Write;
        let mut stdin = python.stdin.take().expect("stdin");
        stdin.write_all(&yaml.stdout).expect("write YAML");
    }
    let output = python.wait_with_output().expect("python ends");
    assert!(output.status.success());
    serde_json::from_slice(&output.stdout).expect("JSON")
}

/// Every pod template's `charon` init container.
fn sidecars(objects: &[Value]) -> Vec<(String, Value)> {
    objects
        .iter()
        .filter_map(|object| {
            let init = object
                .pointer("/spec/template/spec/initContainers")?
                .as_array()?;
            let charon = init.iter().find(|c| c["name"] == "charon")?;
            let name = object["metadata"]["name"].as_str()?.to_owned();
            Some((name, charon.clone()))
        })
        .collect()
}

#[test]
fn every_overlay_runs_exactly_the_sidecar_the_injector_adds() {
    for (overlay, store) in [
        ("overlays/memory", "memory"),
        ("overlays/redis", "redis://charon-redis:6379"),
        ("overlays/redis-cluster", ""),
    ] {
        let objects = render(overlay);
        let sidecars = sidecars(&objects);
        assert!(
            sidecars.len() >= 2,
            "{overlay}: demo-app and front-envoy carry the sidecar"
        );
        for (name, sidecar) in sidecars {
            let args = sidecar["args"].as_array().expect("args");
            let rendered_store = args.last().and_then(Value::as_str).expect("a --store");
            if !store.is_empty() {
                assert_eq!(rendered_store, store, "{overlay} {name}");
            } else {
                assert!(
                    rendered_store.starts_with("redis+cluster://"),
                    "{rendered_store}"
                );
            }
            let injected = charon::inject::review::sidecar(
                sidecar["image"].as_str().expect("an image"),
                rendered_store,
            );
            assert_eq!(
                sidecar, injected,
                "{overlay} {name}: the manifest and the injector differ"
            );
        }
    }
}

#[test]
fn the_memory_overlays_sidecar_starts_with_its_configmap_and_becomes_ready() {
    let objects = render("overlays/memory");
    let (_, sidecar) = sidecars(&objects).into_iter().next().expect("a sidecar");
    let config = objects
        .iter()
        .find(|o| o["kind"] == "ConfigMap" && o["metadata"]["name"] == "charon-limits")
        .expect("the charon-limits ConfigMap");
    let dir = tempfile::Builder::new()
        .prefix("charon-deploy-")
        .tempdir()
        .expect("tempdir");
    for (file, text) in config["data"].as_object().expect("data") {
        std::fs::write(dir.path().join(file), text.as_str().expect("text")).expect("write");
    }
    // The manifest's arguments, with the mount path and ports of this test.
    let (grpc, admin) = (support::redis::free_port(), support::redis::free_port());
    let args: Vec<String> = sidecar["args"]
        .as_array()
        .expect("args")
        .iter()
        .map(|arg| match arg.as_str().expect("a string") {
            "/etc/charon" => dir.path().display().to_string(),
            "127.0.0.1:8081" => format!("127.0.0.1:{grpc}"),
            "0.0.0.0:9102" => format!("127.0.0.1:{admin}"),
            other => other.to_owned(),
        })
        .collect();
    assert_eq!(args[0], "serve");
    let mut child = spawn(&args);
    let runtime = tokio::runtime::Runtime::new().expect("runtime");
    let ready = runtime.block_on(passes_its_probes(&sidecar, admin));
    let _ = child.kill();
    let _ = child.wait();
    assert!(
        ready,
        "the sidecar did not become live and ready on the manifest's probes"
    );
}

/// The demo app's throttling sidecar is the one the injector adds for
/// `charon.io/throttle: "5678"`, the Service sends traffic through it, and
/// the real binary, started with its arguments, becomes live and ready on
/// its probes and forwards to the app's port.
#[test]
fn the_demo_apps_throttling_sidecar_is_the_injectors_and_fronts_the_app() {
    let objects = render("overlays/memory");
    let app = objects
        .iter()
        .find(|o| o["kind"] == "Deployment" && o["metadata"]["name"] == "demo-app")
        .expect("the demo-app Deployment");
    let throttle = app
        .pointer("/spec/template/spec/initContainers")
        .and_then(Value::as_array)
        .and_then(|init| init.iter().find(|c| c["name"] == "charon-throttle"))
        .expect("a charon-throttle sidecar");
    let image = throttle["image"].as_str().expect("an image");
    assert_eq!(
        *throttle,
        charon::inject::throttle::throttle_sidecar(image, 5678),
        "the manifest and the injector differ"
    );
    let service = objects
        .iter()
        .find(|o| o["kind"] == "Service" && o["metadata"]["name"] == "demo-app")
        .expect("the demo-app Service");
    assert_eq!(
        service.pointer("/spec/ports/0/targetPort"),
        Some(&Value::from("charon-throttle"))
    );

    // The manifest's arguments, on this test's ports, in front of an app.
    let runtime = tokio::runtime::Runtime::new().expect("runtime");
    let (app_addr, (port, admin)) = runtime.block_on(async {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let addr = listener.local_addr().expect("addr");
        tokio::spawn(async move {
            use tokio::io::{AsyncReadExt, AsyncWriteExt};
            while let Ok((mut stream, _)) = listener.accept().await {
                tokio::spawn(async move {
                    let mut request = [0u8; 4096];
                    let _ = stream.read(&mut request).await;
                    let _ = stream
                        .write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 5\r\n\r\nhello")
                        .await;
                });
            }
        });
        (
            addr,
            (support::redis::free_port(), support::redis::free_port()),
        )
    });
    let args: Vec<String> = throttle["args"]
        .as_array()
        .expect("args")
        .iter()
        .map(|arg| match arg.as_str().expect("a string") {
            "0.0.0.0:8090" => format!("127.0.0.1:{port}"),
            "0.0.0.0:9103" => format!("127.0.0.1:{admin}"),
            "http://127.0.0.1:5678" => format!("http://{app_addr}"),
            other => other.to_owned(),
        })
        .collect();
    assert_eq!(args[0], "throttle");
    let mut child = spawn(&args);
    let answered = runtime.block_on(async {
        if !passes_its_probes(throttle, admin).await {
            return None;
        }
        let reply = reqwest::get(format!("http://127.0.0.1:{port}/"))
            .await
            .ok()?;
        reply.text().await.ok()
    });
    let _ = child.kill();
    let _ = child.wait();
    assert_eq!(answered.as_deref(), Some("hello"));
}

/// The central Charon of each `central/` overlay, as it would run: two
/// replicas started with the Deployment's own arguments (the mount path,
/// the ports and the store's address rewritten to this test's Redis,
/// Sentinel or Cluster) become live and ready on the manifest's probes, and
/// share Istio's limits: the product page once a minute, whichever replica
/// Envoy's call reaches.
#[test]
fn the_central_replicas_share_istios_limits_on_each_store() {
    use support::redis::{RedisCluster, RedisSentinel, RedisServer};
    let runtime = tokio::runtime::Runtime::new().expect("runtime");
    let redis = RedisServer::start();
    let sentinel = RedisSentinel::start();
    let cluster = RedisCluster::start(3);
    for (overlay, store) in [
        ("central/redis", redis.url()),
        ("central/sentinel", sentinel.url()),
        ("central/redis-cluster", cluster.url()),
    ] {
        let objects = render(overlay);
        let deployment = objects
            .iter()
            .find(|o| o["kind"] == "Deployment" && o["metadata"]["name"] == "charon")
            .unwrap_or_else(|| panic!("{overlay}: the charon Deployment"));
        let container = deployment
            .pointer("/spec/template/spec/containers/0")
            .expect("its container");
        let config = objects
            .iter()
            .find(|o| o["kind"] == "ConfigMap" && o["metadata"]["name"] == "charon-limits")
            .expect("the charon-limits ConfigMap");
        let dir = tempfile::Builder::new()
            .prefix("charon-central-")
            .tempdir()
            .expect("tempdir");
        for (file, text) in config["data"].as_object().expect("data") {
            std::fs::write(dir.path().join(file), text.as_str().expect("text")).expect("write");
        }
        let args = container["args"].as_array().expect("args");
        let replica = |grpc: u16, admin: u16| -> Vec<String> {
            let mut previous = "";
            args.iter()
                .map(|arg| {
                    let arg = arg.as_str().expect("a string");
                    let rewritten = match (previous, arg) {
                        (_, "/etc/charon") => dir.path().display().to_string(),
                        (_, "0.0.0.0:8081") => format!("127.0.0.1:{grpc}"),
                        (_, "0.0.0.0:9102") => format!("127.0.0.1:{admin}"),
                        ("--store", _) => store.clone(),
                        (_, other) => other.to_owned(),
                    };
                    previous = arg;
                    rewritten
                })
                .collect()
        };
        let ports: Vec<(u16, u16)> = (0..2)
            .map(|_| (support::redis::free_port(), support::redis::free_port()))
            .collect();
        let mut children: Vec<_> = ports
            .iter()
            .map(|(grpc, admin)| spawn(&replica(*grpc, *admin)))
            .collect();
        let codes = runtime.block_on(async {
            for (_, admin) in &ports {
                if !passes_its_probes(container, *admin).await {
                    return None;
                }
            }
            let mut codes = Vec::new();
            for (grpc, _) in &ports {
                codes.push(product_page(*grpc).await?);
            }
            Some(codes)
        });
        for child in &mut children {
            let _ = child.kill();
            let _ = child.wait();
        }
        assert_eq!(
            codes,
            Some(vec![1, 2]),
            "{overlay}: the first call to the product page is OK (1), the second, on the other replica, OVER_LIMIT (2)"
        );
    }
}

/// Istio's descriptor for a request to /productpage, asked of the replica
/// on `grpc`: the overall code (1 OK, 2 OVER_LIMIT).
async fn product_page(grpc: u16) -> Option<i32> {
    use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
    use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::Entry;
    use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitRequest;
    use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
    let mut client = RateLimitServiceClient::connect(format!("http://127.0.0.1:{grpc}"))
        .await
        .ok()?;
    let request = RateLimitRequest {
        domain: "ratelimit".into(),
        descriptors: vec![RateLimitDescriptor {
            entries: vec![Entry {
                key: "PATH".into(),
                value: "/productpage".into(),
            }],
            ..Default::default()
        }],
        hits_addend: 1,
    };
    let answer = client.should_rate_limit(request).await.ok()?;
    Some(answer.into_inner().overall_code)
}

/// `charon` with a manifest's arguments (rewritten for the test's paths and
/// ports), its output discarded.
fn spawn(args: &[String]) -> std::process::Child {
    Command::new(env!("CARGO_BIN_EXE_charon"))
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("charon starts")
}

/// Whether `container`'s liveness and readiness probes, asked on the
/// admin port `admin`, both answer 200 within 30 s.
async fn passes_its_probes(container: &Value, admin: u16) -> bool {
    let probe = |pointer: &str| {
        let path = container
            .pointer(pointer)
            .and_then(Value::as_str)
            .expect("a probe path");
        format!("http://127.0.0.1:{admin}{path}")
    };
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let live = reqwest::get(probe("/livenessProbe/httpGet/path")).await;
        let ready = reqwest::get(probe("/readinessProbe/httpGet/path")).await;
        if let (Ok(live), Ok(ready)) = (live, ready)
            && live.status() == 200
            && ready.status() == 200
        {
            return true;
        }
        if Instant::now() > deadline {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}
