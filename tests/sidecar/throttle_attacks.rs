//! `charon throttle` against hostile clients, one test per attack, on real
//! sockets: a body sent slowly and one too large, an answer never read,
//! HTTP/2 streams reset as soon as they are accepted, headers dripped
//! (slowloris), and idle connections past the descriptor limit. Each
//! checks that honest requests are still served, that the attack got its
//! answer (a status or a closed connection), and that `/metrics` counted
//! it. Timeouts are set short; the margins are generous.

use std::process::Command;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use super::throttle::{Seen, Throttle, upstream};

/// A protection's count on `/metrics`.
async fn protection(throttle: &Throttle, reason: &str) -> u64 {
    let text = reqwest::get(throttle.admin_url("/metrics"))
        .await
        .expect("metrics")
        .text()
        .await
        .expect("metrics");
    let prefix = format!("charon_throttle_protection_total{{reason=\"{reason}\"}} ");
    text.lines()
        .find_map(|line| line.strip_prefix(&prefix))
        .and_then(|value| value.trim().parse().ok())
        .unwrap_or_else(|| panic!("no {prefix} in\n{text}"))
}

/// Waits (up to 20 s) until `reason` has been counted at least `least` times.
async fn counted(throttle: &Throttle, reason: &str, least: u64) -> u64 {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let count = protection(throttle, reason).await;
        if count >= least {
            return count;
        }
        assert!(Instant::now() < deadline, "{reason}: {count} < {least}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

async fn status(url: &str) -> u16 {
    reqwest::get(url)
        .await
        .expect("the proxy answers")
        .status()
        .as_u16()
}

/// Reads what the server sends until it closes (or 20 s pass: `None`).
async fn until_closed(stream: &mut TcpStream) -> Option<Vec<u8>> {
    let mut read = Vec::new();
    let mut buffer = [0u8; 4096];
    let reading = async {
        loop {
            match stream.read(&mut buffer).await {
                Ok(0) | Err(_) => return,
                Ok(n) => read.extend_from_slice(&buffer[..n]),
            }
        }
    };
    tokio::time::timeout(Duration::from_secs(20), reading)
        .await
        .ok()
        .map(|()| read)
}

async fn started(flags: &[&str]) -> (Arc<Seen>, Throttle) {
    let seen = Arc::new(Seen::default());
    let addr = upstream(seen.clone(), Instant::now()).await;
    let throttle = Throttle::start(&format!("http://{addr}"), flags).await;
    (seen, throttle)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_body_sent_slowly_holds_no_slot_and_gets_408_one_too_large_413() {
    let (_, throttle) = started(&[
        "--max-concurrency",
        "1",
        "--request-body-timeout-ms",
        "1500",
    ])
    .await;
    // Two clients drip a body of 1000 bytes a byte at a time.
    let mut slow = Vec::new();
    for _ in 0..2 {
        let mut client = TcpStream::connect(("127.0.0.1", throttle.port))
            .await
            .expect("connect");
        client
            .write_all(b"POST / HTTP/1.1\r\nhost: x\r\ncontent-length: 1000\r\n\r\nab")
            .await
            .expect("write");
        slow.push(client);
    }
    let drip = async {
        for _ in 0..10 {
            tokio::time::sleep(Duration::from_millis(100)).await;
            for client in &mut slow {
                let _ = client.write_all(b"c").await;
            }
        }
    };
    // Meanwhile the one slot serves others.
    let honest = async {
        for _ in 0..5 {
            assert_eq!(status(&throttle.url("/")).await, 200);
        }
    };
    tokio::join!(drip, honest);
    for client in &mut slow {
        let answer = until_closed(client).await.expect("closed after its 408");
        let answer = String::from_utf8_lossy(&answer).to_lowercase();
        assert!(answer.starts_with("http/1.1 408"), "{answer}");
    }
    assert_eq!(counted(&throttle, "body_timeout", 2).await, 2);

    // Past the buffer's bound: 413 before a byte of the body is read.
    let mut large = TcpStream::connect(("127.0.0.1", throttle.port))
        .await
        .expect("connect");
    large
        .write_all(b"POST / HTTP/1.1\r\nhost: x\r\ncontent-length: 2000000\r\n\r\n")
        .await
        .expect("write");
    let answer = until_closed(&mut large)
        .await
        .expect("closed after its 413");
    let answer = String::from_utf8_lossy(&answer).to_lowercase();
    assert!(answer.starts_with("http/1.1 413"), "{answer}");
    assert_eq!(counted(&throttle, "body_too_large", 1).await, 1);
    // A body within the bound, chunked, goes through whole.
    let mut chunked = TcpStream::connect(("127.0.0.1", throttle.port))
        .await
        .expect("connect");
    chunked
        .write_all(
            b"POST / HTTP/1.1\r\nhost: x\r\nconnection: close\r\ntransfer-encoding: chunked\r\n\r\n5\r\nhello\r\n",
        )
        .await
        .expect("write");
    tokio::time::sleep(Duration::from_millis(200)).await;
    chunked.write_all(b"0\r\n\r\n").await.expect("write");
    let answer = until_closed(&mut chunked).await.expect("answered");
    let answer = String::from_utf8_lossy(&answer).to_lowercase();
    assert!(answer.starts_with("http/1.1 200"), "{answer}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_never_reads_its_answer_holds_no_slot_and_is_closed() {
    let (_, throttle) = started(&[
        "--max-concurrency",
        "1",
        "--response-write-timeout-ms",
        "1500",
    ])
    .await;
    // 16 MiB asked for, none of it read.
    let mut stuck = Vec::new();
    for _ in 0..2 {
        let mut client = TcpStream::connect(("127.0.0.1", throttle.port))
            .await
            .expect("connect");
        client
            .write_all(b"GET /big HTTP/1.1\r\nhost: x\r\n\r\n")
            .await
            .expect("write");
        stuck.push(client);
    }
    // Its answer is past the buffer: its slot is given back once the
    // buffer is full, and the one slot serves others.
    tokio::time::sleep(Duration::from_millis(500)).await;
    for _ in 0..5 {
        assert_eq!(status(&throttle.url("/")).await, 200);
    }
    counted(&throttle, "response_streamed", 2).await;
    // Its writes stall; the connection is closed.
    counted(&throttle, "write_timeout", 2).await;
    for client in &mut stuck {
        assert!(until_closed(client).await.is_some(), "never closed");
    }
    assert_eq!(status(&throttle.url("/")).await, 200);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn streams_reset_once_accepted_leave_the_queue_and_close_the_connection() {
    let (seen, throttle) = started(&[
        "--max-concurrency",
        "1",
        "--queue",
        "16",
        "--max-wait-ms",
        "10000",
        "--max-resets-per-connection",
        "10",
    ])
    .await;
    // The one slot is busy for 3 s: every other request queues.
    let busy = tokio::spawn(reqwest::get(throttle.url("/slow?ms=3000")));
    while seen.running.load(std::sync::atomic::Ordering::SeqCst) == 0 {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let tcp = TcpStream::connect(("127.0.0.1", throttle.port))
        .await
        .expect("connect");
    let (mut client, connection) = h2::client::handshake(tcp).await.expect("h2 handshake");
    let connection = tokio::spawn(connection);
    let mut reset = 0;
    for _ in 0..1_000 {
        let Ok(ready) = client.clone().ready().await else {
            break;
        };
        client = ready;
        let request = http::Request::get(throttle.url("/"))
            .body(())
            .expect("request");
        let Ok((_, mut stream)) = client.send_request(request, true) else {
            break;
        };
        // Reset once the proxy has had the time to accept it.
        tokio::time::sleep(Duration::from_millis(2)).await;
        stream.send_reset(h2::Reason::CANCEL);
        reset += 1;
    }
    assert!(reset < 1_000, "the connection was never closed");
    let closed = tokio::time::timeout(Duration::from_secs(10), connection).await;
    assert!(closed.is_ok(), "the connection outlived its budget");
    assert!(counted(&throttle, "too_many_resets", 1).await >= 1);
    assert!(counted(&throttle, "cancelled", 11).await >= 11);
    let busy = busy.await.expect("joined").expect("answered");
    assert_eq!(busy.status(), 200);
    // None of the reset requests reached the upstream; the next one does.
    assert_eq!(seen.arrivals.lock().unwrap().len(), 1);
    assert_eq!(status(&throttle.url("/")).await, 200);
    assert_eq!(seen.arrivals.lock().unwrap().len(), 2);
}

/// Opens `n` HTTP/2 streams on `client` to `path`, each its own request.
async fn streams(
    client: &mut h2::client::SendRequest<bytes::Bytes>,
    throttle: &Throttle,
    path: &str,
    n: usize,
) -> Vec<h2::SendStream<bytes::Bytes>> {
    let mut opened = Vec::new();
    for _ in 0..n {
        *client = client
            .clone()
            .ready()
            .await
            .expect("the connection is open");
        let request = http::Request::get(throttle.url(path))
            .body(())
            .expect("request");
        let (_, stream) = client.send_request(request, true).expect("a stream");
        opened.push(stream);
    }
    opened
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_connection_that_only_cancels_keeps_one_place_in_the_queue() {
    let (_, throttle) = started(&[
        "--max-concurrency",
        "1",
        "--queue",
        "6",
        "--max-wait-ms",
        "10000",
    ])
    .await;
    let busy = tokio::spawn(reqwest::get(throttle.url("/slow?ms=1500")));
    tokio::time::sleep(Duration::from_millis(200)).await;
    let tcp = TcpStream::connect(("127.0.0.1", throttle.port))
        .await
        .expect("connect");
    let (mut client, connection) = h2::client::handshake(tcp).await.expect("h2 handshake");
    let connection = tokio::spawn(connection);
    // Twenty streams, reset once the proxy has had them: the queue's six
    // places would be its, but a new connection has four, and each
    // cancel takes one back.
    for mut stream in streams(&mut client, &throttle, "/slow?ms=10", 20).await {
        tokio::time::sleep(Duration::from_millis(1)).await;
        stream.send_reset(h2::Reason::CANCEL);
    }
    // Twenty more, held open: one place in the queue.
    let _held = streams(&mut client, &throttle, "/slow?ms=10", 20).await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    // Five honest clients of the same level still find a place each.
    let honest: Vec<_> = (0..5)
        .map(|_| tokio::spawn(reqwest::get(throttle.url("/"))))
        .collect();
    for request in honest {
        let answer = request.await.expect("joined").expect("answered");
        assert_eq!(answer.status(), 200, "an honest request lost its place");
    }
    assert_eq!(busy.await.expect("joined").expect("answered").status(), 200);
    connection.abort();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn headers_dripped_or_never_sent_get_the_connection_closed() {
    let (_, throttle) = started(&["--header-read-timeout-ms", "1000"]).await;
    let mut dripping = Vec::new();
    let mut silent = Vec::new();
    for _ in 0..20 {
        let mut client = TcpStream::connect(("127.0.0.1", throttle.port))
            .await
            .expect("connect");
        client
            .write_all(b"GET / HTTP/1.1\r\n")
            .await
            .expect("write");
        dripping.push(client);
        silent.push(
            TcpStream::connect(("127.0.0.1", throttle.port))
                .await
                .expect("connect"),
        );
    }
    let drip = async {
        for _ in 0..20 {
            tokio::time::sleep(Duration::from_millis(200)).await;
            for client in &mut dripping {
                let _ = client.write_all(b"x-drip: 1\r\n").await;
            }
        }
    };
    let honest = async {
        for _ in 0..5 {
            assert_eq!(status(&throttle.url("/")).await, 200);
            tokio::time::sleep(Duration::from_millis(300)).await;
        }
    };
    tokio::join!(drip, honest);
    for client in dripping.iter_mut().chain(&mut silent) {
        assert!(until_closed(client).await.is_some(), "never closed");
    }
    assert!(counted(&throttle, "header_timeout", 40).await >= 40);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_connections_past_the_descriptor_limit_make_room_for_new_ones() {
    let seen = Arc::new(Seen::default());
    let addr = upstream(seen, Instant::now()).await;
    // Started with a soft limit of 128 descriptors and a hard one of 256:
    // the proxy raises the soft one, and its cap follows, (256 - 64) / 2.
    let mut command = Command::new(env!("CARGO_BIN_EXE_charon"));
    limit_descriptors(&mut command, 128, 256);
    let throttle = Throttle::start_with(&format!("http://{addr}"), &[], command).await;
    // More idle connections than the proxy has descriptors for.
    let mut idle = Vec::new();
    for _ in 0..300 {
        idle.push(
            TcpStream::connect(("127.0.0.1", throttle.port))
                .await
                .expect("connect"),
        );
    }
    for _ in 0..20 {
        let reply = tokio::time::timeout(Duration::from_secs(5), reqwest::get(throttle.url("/")))
            .await
            .expect("answered in time")
            .expect("the proxy answers");
        assert_eq!(reply.status(), 200);
    }
    assert!(counted(&throttle, "connection_evicted", 200).await >= 200);
    let stats = throttle.stats().await;
    assert_eq!(stats["max_connections"], 96, "{stats}");
    assert!(
        stats["open_connections"].as_u64().expect("a count") <= 96,
        "{stats}"
    );
}

/// Runs `command` with limits of `soft` and `hard` open files.
fn limit_descriptors(command: &mut Command, soft: u64, hard: u64) {
    use std::os::unix::process::CommandExt;
    let limit = libc::rlimit {
        rlim_cur: soft,
        rlim_max: hard,
    };
    // SAFETY: setrlimit is async-signal-safe and only reads `limit`.
    unsafe {
        command.pre_exec(move || {
            if libc::setrlimit(libc::RLIMIT_NOFILE, &limit) == 0 {
                Ok(())
            } else {
                Err(std::io::Error::last_os_error())
            }
        });
    }
}
