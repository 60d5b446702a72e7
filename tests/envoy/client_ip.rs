//! Limits per client network behind a real Envoy
//! (examples/envoy/client-ip.yaml): `masked_remote_address` masks the
//! client's address to its /24, so two addresses of one network share a
//! limit, and an address of another network has its own.

use std::fs;
use std::net::IpAddr;
use std::process::Command;
use std::time::{Duration, Instant};

use super::envoy_e2e::{Proc, find_envoy, free_ports, manifest_dir, spawn_envoy};
use super::token_budget::clear_of_the_hour;

const READY: Duration = Duration::from_secs(30);

#[tokio::test(flavor = "multi_thread")]
async fn addresses_of_one_network_share_a_limit() {
    clear_of_the_hour().await;
    let dir = tempfile::tempdir().expect("temp dir");
    let limits = fs::read_to_string(manifest_dir().join("examples/envoy/client-ip-limits.yaml"))
        .expect("read the example's limits")
        .replace("requests_per_unit: 100", "requests_per_unit: 2");
    let config = dir.path().join("limits.yaml");
    fs::write(&config, limits).expect("write limits");
    let upstream = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind upstream");
    let upstream_port = upstream.local_addr().expect("upstream addr").port();
    tokio::spawn(async move {
        let app = axum::Router::new().fallback(|| async { "answered" });
        axum::serve(upstream, app).await.expect("upstream server");
    });
    let [listen, envoy_admin, grpc, sidecar_admin] = free_ports::<4>();
    let mut sidecar = Proc::spawn(
        "charon",
        Command::new(env!("CARGO_BIN_EXE_charon"))
            .env("NO_COLOR", "1")
            .arg("serve")
            .arg("--config")
            .arg(&config)
            .args(["--grpc-addr", &format!("127.0.0.1:{grpc}")])
            .args(["--admin-addr", &format!("127.0.0.1:{sidecar_admin}")]),
        dir.path(),
    );
    let mut yaml = fs::read_to_string(manifest_dir().join("examples/envoy/client-ip.yaml"))
        .expect("read the example");
    for (from, to) in [
        (10000, listen),
        (9901, envoy_admin),
        (8080, upstream_port),
        (8081, grpc),
    ] {
        let needle = format!("port_value: {from}");
        assert_eq!(yaml.matches(&needle).count(), 1, "one `{needle}`");
        yaml = yaml.replace(&needle, &format!("port_value: {to}"));
    }
    let envoy_config = dir.path().join("envoy.yaml");
    fs::write(&envoy_config, yaml).expect("write envoy.yaml");
    let mut envoy = spawn_envoy(&find_envoy(), &envoy_config, envoy_admin, dir.path());
    let from = |address: &str| {
        reqwest::Client::builder()
            .no_proxy()
            .local_address(address.parse::<IpAddr>().expect("an address"))
            .timeout(Duration::from_secs(10))
            .build()
            .expect("a client")
    };
    let plain = from("127.0.0.1");
    for (url, proc) in [
        (
            format!("http://127.0.0.1:{sidecar_admin}/readyz"),
            &mut sidecar,
        ),
        (format!("http://127.0.0.1:{envoy_admin}/ready"), &mut envoy),
    ] {
        let deadline = Instant::now() + READY;
        while !plain
            .get(&url)
            .send()
            .await
            .is_ok_and(|reply| reply.status() == 200)
        {
            assert!(proc.exited().is_none(), "a process exited; its log follows");
            assert!(Instant::now() < deadline, "not ready: {url}");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
    let route = format!("http://127.0.0.1:{listen}/");
    let status = |client: &reqwest::Client| {
        let (client, route) = (client.clone(), route.clone());
        async move {
            client
                .get(&route)
                .send()
                .await
                .expect("Envoy answers")
                .status()
                .as_u16()
        }
    };
    // 127.0.0.1 and 127.0.0.2: one /24, two a hour between them.
    let (one, two, other) = (from("127.0.0.1"), from("127.0.0.2"), from("127.0.1.1"));
    assert_eq!(status(&one).await, 200);
    assert_eq!(status(&two).await, 200);
    assert_eq!(status(&one).await, 429, "the network's two are spent");
    assert_eq!(status(&two).await, 429);
    assert_eq!(status(&other).await, 200, "127.0.1.0/24 is another network");
}
