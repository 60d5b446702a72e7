//! Envoy's network (L4) rate limit filter against the real `charon`
//! (examples/envoy/tcp.yaml, tcp-limits.yaml): one `ShouldRateLimit` per
//! new TCP connection; two a minute are proxied, the third is closed by
//! Envoy before it reaches the upstream.

use std::fs;
use std::process::Command;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};

use super::envoy_e2e::{
    Proc, example_with_ports, find_envoy, free_ports, manifest_dir, spawn_envoy, wait_ready,
};

/// Connects through Envoy, writes `ping` and reads what comes back (empty
/// if the connection was closed first).
async fn ping(port: u16) -> Vec<u8> {
    let Ok(mut stream) = tokio::net::TcpStream::connect(("127.0.0.1", port)).await else {
        return Vec::new();
    };
    // A write to a connection Envoy already closed may fail: nothing back.
    let _ = stream.write_all(b"ping").await;
    let mut back = vec![0u8; 4];
    match tokio::time::timeout(Duration::from_secs(5), stream.read_exact(&mut back)).await {
        Ok(Ok(_)) => back,
        _ => Vec::new(),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn envoys_network_filter_closes_the_connection_over_the_limit() {
    let dir = tempfile::tempdir().expect("temp dir");
    // An echo server as the upstream.
    let upstream = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind upstream");
    let upstream_port = upstream.local_addr().expect("upstream addr").port();
    tokio::spawn(async move {
        while let Ok((mut stream, _)) = upstream.accept().await {
            tokio::spawn(async move {
                let mut buffer = [0u8; 64];
                while let Ok(read) = stream.read(&mut buffer).await {
                    if read == 0 || stream.write_all(&buffer[..read]).await.is_err() {
                        break;
                    }
                }
            });
        }
    });
    let [grpc, sidecar_admin, listen, admin] = free_ports::<4>();
    let limits = manifest_dir().join("examples/envoy/tcp-limits.yaml");
    let mut sidecar = Proc::spawn(
        "charon",
        Command::new(env!("CARGO_BIN_EXE_charon"))
            .arg("serve")
            .arg("--config")
            .arg(&limits)
            .arg("--grpc-addr")
            .arg(format!("127.0.0.1:{grpc}"))
            .arg("--admin-addr")
            .arg(format!("127.0.0.1:{sidecar_admin}")),
        dir.path(),
    );
    let config = dir.path().join("envoy.yaml");
    fs::write(
        &config,
        example_with_ports("tcp.yaml", listen, admin, upstream_port, grpc),
    )
    .expect("write envoy.yaml");
    let mut envoy = spawn_envoy(&find_envoy(), &config, admin, dir.path());
    let client = reqwest::Client::builder()
        .no_proxy()
        .build()
        .expect("a client");
    let ready = format!("http://127.0.0.1:{sidecar_admin}/readyz");
    wait_ready(&client, &ready, &mut sidecar).await;
    let ready = format!("http://127.0.0.1:{admin}/ready");
    wait_ready(&client, &ready, &mut envoy).await;
    let answers = [ping(listen).await, ping(listen).await, ping(listen).await];
    assert_eq!(
        answers,
        [b"ping".to_vec(), b"ping".to_vec(), Vec::new()],
        "two connections proxied, the third closed"
    );
}
