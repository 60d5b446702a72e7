//! TCP proxies the tests put between a sidecar and its peers: one that cuts
//! the link the way a partition does (bytes stop moving, connections stay
//! open), one that closes its connections the way a client that dies does.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

/// A TCP proxy to `upstream` that, once `stall` is set, stops moving bytes
/// while keeping every connection open: a partition as a sidecar sees it
/// (calls hang; nothing fails fast).
pub async fn stalling_proxy(upstream: u16, stall: Arc<AtomicBool>) -> u16 {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("a port for the proxy");
    let port = listener.local_addr().expect("its address").port();
    tokio::spawn(async move {
        while let Ok((inbound, _)) = listener.accept().await {
            let stall = stall.clone();
            tokio::spawn(async move {
                let Ok(outbound) = tokio::net::TcpStream::connect(("127.0.0.1", upstream)).await
                else {
                    return;
                };
                let (ri, wi) = inbound.into_split();
                let (ro, wo) = outbound.into_split();
                tokio::join!(pipe(ri, wo, stall.clone()), pipe(ro, wi, stall));
            });
        }
    });
    port
}

async fn pipe(
    mut from: tokio::net::tcp::OwnedReadHalf,
    mut to: tokio::net::tcp::OwnedWriteHalf,
    stall: Arc<AtomicBool>,
) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut buffer = vec![0u8; 16 * 1024];
    loop {
        while stall.load(Ordering::SeqCst) {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let n = match from.read(&mut buffer).await {
            Ok(0) | Err(_) => return,
            Ok(n) => n,
        };
        while stall.load(Ordering::SeqCst) {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        if to.write_all(&buffer[..n]).await.is_err() {
            return;
        }
    }
}

/// A TCP proxy to `upstream` whose connections all close at once when
/// `close` is set: what the upstream sees when a client process dies (the
/// kernel closes its sockets), with no HTTP/2 or gRPC goodbye.
pub async fn closing_proxy(upstream: u16, close: tokio::sync::watch::Receiver<bool>) -> u16 {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("a port for the proxy");
    let port = listener.local_addr().expect("its address").port();
    tokio::spawn(async move {
        while let Ok((mut inbound, _)) = listener.accept().await {
            let mut close = close.clone();
            tokio::spawn(async move {
                let Ok(mut outbound) =
                    tokio::net::TcpStream::connect(("127.0.0.1", upstream)).await
                else {
                    return;
                };
                // Both sockets are dropped, so closed, on either event.
                tokio::select! {
                    _ = tokio::io::copy_bidirectional(&mut inbound, &mut outbound) => {}
                    _ = close.wait_for(|closed| *closed) => {}
                }
            });
        }
    });
    port
}
