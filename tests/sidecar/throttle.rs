//! `charon throttle`, the throttling sidecar, as users run it: the real
//! binary in front of a real upstream on real sockets. Slots and the queue,
//! the fixed-rate drain, upstreams that fail in every way, bodies streamed,
//! WebSocket upgrades, h2c, and a drain on SIGTERM.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::{BodyExt, Full, StreamBody};
use hyper::body::Frame;
use hyper_util::rt::{TokioExecutor, TokioIo};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

use crate::support::KilledOnDrop;
use crate::support::redis::free_port;

/// What the upstream saw.
#[derive(Default)]
pub(crate) struct Seen {
    pub(crate) running: AtomicUsize,
    most_running: AtomicUsize,
    /// When each request reached it, from the test's start.
    pub(crate) arrivals: std::sync::Mutex<Vec<Duration>>,
    versions: std::sync::Mutex<Vec<http::Version>>,
}

type UpstreamBody = http_body_util::combinators::BoxBody<Bytes, Infallible>;

/// An upstream on HTTP/1.1 and h2c: `/slow?ms=N` reads the request's
/// body, then answers after N ms;
/// `/stream` sends a chunk, waits 600 ms, sends another, `/big` sends
/// 16 MiB at once, `/hang` never answers, anything else answers at once.
pub(crate) async fn upstream(seen: Arc<Seen>, start: Instant) -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("addr");
    tokio::spawn(async move {
        loop {
            let Ok((stream, _)) = listener.accept().await else {
                return;
            };
            let seen = seen.clone();
            let service =
                hyper::service::service_fn(move |request: http::Request<hyper::body::Incoming>| {
                    let seen = seen.clone();
                    async move {
                        seen.arrivals.lock().unwrap().push(start.elapsed());
                        seen.versions.lock().unwrap().push(request.version());
                        let path = request.uri().path().to_owned();
                        let query = request.uri().query().unwrap_or("").to_owned();
                        let body: UpstreamBody = match path.as_str() {
                            "/slow" => {
                                // As an app would, it reads the request first.
                                let _ = request.into_body().collect().await;
                                let ms: u64 = query
                                    .strip_prefix("ms=")
                                    .and_then(|ms| ms.parse().ok())
                                    .unwrap_or(100);
                                let now = seen.running.fetch_add(1, Ordering::SeqCst) + 1;
                                seen.most_running.fetch_max(now, Ordering::SeqCst);
                                tokio::time::sleep(Duration::from_millis(ms)).await;
                                seen.running.fetch_sub(1, Ordering::SeqCst);
                                Full::new(Bytes::from("slow")).boxed()
                            }
                            "/stream" => {
                                let chunks = futures_util::stream::unfold(0, |sent| async move {
                                    match sent {
                                        0 => Some((
                                            Ok::<_, Infallible>(Frame::data(Bytes::from("first "))),
                                            1,
                                        )),
                                        1 => {
                                            tokio::time::sleep(Duration::from_millis(600)).await;
                                            Some((Ok(Frame::data(Bytes::from("second"))), 2))
                                        }
                                        _ => None,
                                    }
                                });
                                StreamBody::new(chunks).boxed()
                            }
                            "/costly" => {
                                // Says it took 100 ms of CPU (it took none).
                                let mut response =
                                    http::Response::new(Full::new(Bytes::from("costly")).boxed());
                                response
                                    .headers_mut()
                                    .insert("x-cpu-ms", http::HeaderValue::from_static("100"));
                                return Ok::<_, Infallible>(response);
                            }
                            "/big" => Full::new(Bytes::from(vec![b'x'; 16 << 20])).boxed(),
                            "/hang" => {
                                std::future::pending::<()>().await;
                                Full::new(Bytes::new()).boxed()
                            }
                            _ => Full::new(Bytes::from("ok")).boxed(),
                        };
                        Ok::<_, Infallible>(http::Response::new(body))
                    }
                });
            tokio::spawn(async move {
                let _ = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new())
                    .serve_connection(TokioIo::new(stream), service)
                    .await;
            });
        }
    });
    addr
}

/// `charon throttle` in front of `upstream`, ready; its port and admin port.
pub(crate) struct Throttle {
    child: KilledOnDrop,
    pub(crate) port: u16,
    admin: u16,
}

impl Throttle {
    pub(crate) async fn start(upstream: &str, flags: &[&str]) -> Throttle {
        Self::start_with(upstream, flags, Command::new(env!("CARGO_BIN_EXE_charon"))).await
    }

    /// Started from `command` (the binary, with limits of its own).
    pub(crate) async fn start_with(
        upstream: &str,
        flags: &[&str],
        mut command: Command,
    ) -> Throttle {
        let (port, admin) = (free_port(), free_port());
        let child = command
            .arg("throttle")
            .args(["--listen", &format!("127.0.0.1:{port}")])
            .args(["--admin-addr", &format!("127.0.0.1:{admin}")])
            .args(["--upstream", upstream])
            .args(flags)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("charon throttle starts");
        let throttle = Throttle {
            child: KilledOnDrop(child),
            port,
            admin,
        };
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            if let Ok(reply) = reqwest::get(throttle.admin_url("/readyz")).await
                && reply.status() == 200
            {
                return throttle;
            }
            assert!(Instant::now() < deadline, "charon throttle not ready");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    pub(crate) fn pid(&self) -> u32 {
        self.child.0.id()
    }

    pub(crate) fn url(&self, path: &str) -> String {
        format!("http://127.0.0.1:{}{path}", self.port)
    }

    pub(crate) fn admin_url(&self, path: &str) -> String {
        format!("http://127.0.0.1:{}{path}", self.admin)
    }

    pub(crate) async fn stats(&self) -> serde_json::Value {
        let text = reqwest::get(self.admin_url("/stats"))
            .await
            .expect("stats")
            .text()
            .await
            .expect("stats");
        serde_json::from_str(&text).expect("stats are JSON")
    }
}

/// Sends `count` requests to `url` at once; their statuses and Retry-After.
async fn at_once(url: &str, count: usize, criticality: &str) -> Vec<(u16, Option<String>)> {
    let client = reqwest::Client::new();
    let sent = (0..count).map(|_| {
        let client = client.clone();
        let url = url.to_owned();
        let criticality = criticality.to_owned();
        async move {
            let reply = client
                .get(url)
                .header("x-criticality", criticality)
                .send()
                .await
                .expect("the proxy answers");
            let retry_after = reply
                .headers()
                .get("retry-after")
                .map(|value| value.to_str().unwrap_or("").to_owned());
            (reply.status().as_u16(), retry_after)
        }
    });
    futures_util::future::join_all(sent).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn at_most_the_limit_reaches_the_upstream_and_a_full_queue_refuses() {
    let seen = Arc::new(Seen::default());
    let addr = upstream(seen.clone(), Instant::now()).await;
    let throttle = Throttle::start(
        &format!("http://{addr}"),
        &[
            "--max-concurrency",
            "2",
            "--queue",
            "10",
            "--max-wait-ms",
            "5000",
        ],
    )
    .await;
    // Six at once, 300 ms each: two at a time, all served.
    let answers = at_once(&throttle.url("/slow?ms=300"), 6, "critical").await;
    assert!(
        answers.iter().all(|(status, _)| *status == 200),
        "{answers:?}"
    );
    assert_eq!(seen.most_running.load(Ordering::SeqCst), 2);

    // A queue of one: two run, one waits, the rest are refused at once
    // with a Retry-After.
    drop(throttle);
    seen.most_running.store(0, Ordering::SeqCst);
    let throttle = Throttle::start(
        &format!("http://{addr}"),
        &[
            "--max-concurrency",
            "2",
            "--queue",
            "1",
            "--max-wait-ms",
            "5000",
        ],
    )
    .await;
    let answers = at_once(&throttle.url("/slow?ms=500"), 6, "sheddable").await;
    let served = answers.iter().filter(|(status, _)| *status == 200).count();
    let refused: Vec<_> = answers
        .iter()
        .filter(|(status, _)| *status == 503)
        .collect();
    assert_eq!(served, 3, "{answers:?}");
    assert_eq!(refused.len(), 3, "{answers:?}");
    assert!(
        refused.iter().all(|(_, retry)| retry.is_some()),
        "{answers:?}"
    );
    let stats = throttle.stats().await;
    assert_eq!(stats["refused_overloaded"], 3, "{stats}");
    assert_eq!(stats["concurrency_limit"], 2, "{stats}");
    assert_eq!(stats["requests"], 6, "{stats}");
    let metrics = reqwest::get(throttle.admin_url("/metrics"))
        .await
        .expect("metrics")
        .text()
        .await
        .expect("text");
    for line in [
        "charon_throttle_requests_total 6",
        "charon_throttle_refused_overloaded_total 3",
        "charon_throttle_concurrency_limit 2",
        "charon_throttle_ready 1",
    ] {
        assert!(metrics.contains(line), "{line}\n{metrics}");
    }

    // A criticality that means nothing is the default level, counted.
    let client = reqwest::Client::new();
    let reply = client
        .get(throttle.url("/"))
        .header("x-criticality", "\u{1F525}junk")
        .send()
        .await
        .expect("answer");
    assert_eq!(reply.status(), 200);
    assert_eq!(throttle.stats().await["unknown_criticality"], 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_requests_own_deadline_bounds_its_wait() {
    let seen = Arc::new(Seen::default());
    let addr = upstream(seen.clone(), Instant::now()).await;
    let throttle = Throttle::start(
        &format!("http://{addr}"),
        &["--max-concurrency", "1", "--max-wait-ms", "10000"],
    )
    .await;
    // One request holds the only slot for a second.
    let url = throttle.url("/slow?ms=1000");
    let holder = tokio::spawn(async move { reqwest::get(url).await.map(|reply| reply.status()) });
    while seen.running.load(Ordering::SeqCst) == 0 {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    // Another that may wait 100 ms (gRPC's header, or Envoy's) is refused
    // well before the proxy's own 10 s, not served late.
    let client = reqwest::Client::new();
    for (header, value) in [
        ("grpc-timeout", "100m"),
        ("x-envoy-expected-rq-timeout-ms", "100"),
    ] {
        let asked = Instant::now();
        let reply = client
            .get(throttle.url("/"))
            .header(header, value)
            .send()
            .await
            .expect("answered");
        assert_eq!(reply.status(), 503, "{header}");
        assert!(reply.headers().contains_key("retry-after"), "{header}");
        assert!(
            asked.elapsed() < Duration::from_secs(5),
            "{header}: {:?}",
            asked.elapsed()
        );
    }
    assert_eq!(holder.await.expect("joined").expect("answered"), 200);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_drain_queue_releases_requests_at_its_rate() {
    let start = Instant::now();
    let seen = Arc::new(Seen::default());
    let addr = upstream(seen.clone(), start).await;
    // 10 a second, 20 may wait: 12 sent at once all pass, 100 ms apart.
    let throttle = Throttle::start(
        &format!("http://{addr}"),
        &["--drain-rate", "10", "--queue", "20"],
    )
    .await;
    seen.arrivals.lock().unwrap().clear();
    let answers = at_once(&throttle.url("/"), 12, "critical").await;
    assert!(
        answers.iter().all(|(status, _)| *status == 200),
        "{answers:?}"
    );
    let arrivals = seen.arrivals.lock().unwrap().clone();
    assert_eq!(arrivals.len(), 12);
    let gaps: Vec<u128> = arrivals
        .windows(2)
        .map(|pair| pair[1].saturating_sub(pair[0]).as_millis())
        .collect();
    // At the rate, not faster: every gap at least 90 ms; the whole 11 gaps
    // within a generous margin of 1.1 s.
    assert!(gaps.iter().all(|gap| *gap >= 90), "{gaps:?}");
    let span = arrivals[11] - arrivals[0];
    assert!(
        span >= Duration::from_millis(1_050) && span < Duration::from_millis(2_500),
        "{span:?}; {gaps:?}"
    );
    assert_eq!(
        throttle.stats().await["concurrency_limit"],
        serde_json::Value::Null
    );

    // Five may wait: of 12 at once, about six pass (the one going now and
    // the five waiting); the others are refused at once, with the time
    // the queue takes to drain as Retry-After.
    drop(throttle);
    let throttle = Throttle::start(
        &format!("http://{addr}"),
        &["--drain-rate", "10", "--queue", "5"],
    )
    .await;
    let answers = at_once(&throttle.url("/"), 12, "critical").await;
    let served = answers.iter().filter(|(status, _)| *status == 200).count();
    assert!((5..=7).contains(&served), "{answers:?}");
    for (status, retry_after) in &answers {
        if *status != 200 {
            assert_eq!(*status, 503, "{answers:?}");
            assert_eq!(retry_after.as_deref(), Some("1"), "{answers:?}");
        }
    }
    assert_eq!(
        throttle.stats().await["refused_queue_full"],
        (12 - served) as u64
    );
}

/// A TCP upstream that answers every connection with `reply` and closes.
async fn raw_upstream(reply: &'static [u8]) -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("addr");
    tokio::spawn(async move {
        while let Ok((mut stream, _)) = listener.accept().await {
            tokio::spawn(async move {
                let mut request = [0u8; 4096];
                let _ = stream.read(&mut request).await;
                let _ = stream.write_all(reply).await;
                let _ = stream.shutdown().await;
            });
        }
    });
    addr
}

/// A TCP upstream that reads the request and resets the connection.
async fn resetting_upstream() -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("addr");
    tokio::spawn(async move {
        while let Ok((mut stream, _)) = listener.accept().await {
            let mut request = [0u8; 4096];
            let _ = stream.read(&mut request).await;
            // Closing with a zero linger sends RST, not FIN.
            let _ = stream.set_zero_linger();
            drop(stream);
        }
    });
    addr
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_upstream_that_fails_is_a_502_one_that_hangs_a_504_and_the_proxy_stays() {
    let seen = Arc::new(Seen::default());
    let good = upstream(seen.clone(), Instant::now()).await;
    // Nothing listens there.
    let down = format!("http://127.0.0.1:{}", free_port());
    let throttle = Throttle::start(&down, &["--max-concurrency", "4"]).await;
    let reply = reqwest::get(throttle.url("/")).await.expect("answer");
    assert_eq!(reply.status(), 502);
    assert_eq!(throttle.stats().await["upstream_failures"], 1);
    drop(throttle);

    // Garbage instead of HTTP, headers too large for any proxy, nothing.
    let garbage = raw_upstream(b"this is not http\r\n\r\n").await;
    let huge: &'static [u8] = Box::leak(
        format!(
            "HTTP/1.1 200 OK\r\nx-big: {}\r\ncontent-length: 0\r\n\r\n",
            "a".repeat(1 << 20)
        )
        .into_bytes()
        .into_boxed_slice(),
    );
    let huge = raw_upstream(huge).await;
    // A connection closed without a word, and one reset (RST).
    let silent = raw_upstream(b"").await;
    let reset = resetting_upstream().await;
    for upstream in [garbage, huge, silent, reset] {
        let throttle =
            Throttle::start(&format!("http://{upstream}"), &["--max-concurrency", "1"]).await;
        for _ in 0..3 {
            let reply = reqwest::get(throttle.url("/")).await.expect("answer");
            assert_eq!(reply.status(), 502, "{upstream}");
        }
        // Each freed its slot: the only slot serves the next one.
        assert_eq!(throttle.stats().await["upstream_failures"], 3);
    }

    // A hang: 504 after the upstream timeout, and the slot comes back.
    let throttle = Throttle::start(
        &format!("http://{good}"),
        &["--max-concurrency", "1", "--upstream-timeout-ms", "300"],
    )
    .await;
    let asked = Instant::now();
    let reply = reqwest::get(throttle.url("/hang")).await.expect("answer");
    assert_eq!(reply.status(), 504);
    assert!(
        asked.elapsed() < Duration::from_secs(5),
        "{:?}",
        asked.elapsed()
    );
    let reply = reqwest::get(throttle.url("/")).await.expect("answer");
    assert_eq!(reply.status(), 200);
    assert_eq!(reply.text().await.expect("body"), "ok");
    assert_eq!(throttle.stats().await["upstream_timeouts"], 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bodies_stream_upgrades_join_and_h2c_stays_h2c() {
    let seen = Arc::new(Seen::default());
    let addr = upstream(seen.clone(), Instant::now()).await;
    let throttle = Throttle::start(&format!("http://{addr}"), &["--adaptive"]).await;

    // The first chunk comes through before the upstream sent the second.
    let asked = Instant::now();
    let mut reply = reqwest::get(throttle.url("/stream")).await.expect("answer");
    let first = reply.chunk().await.expect("a chunk").expect("not the end");
    assert_eq!(&first[..], b"first ");
    assert!(
        asked.elapsed() < Duration::from_millis(500),
        "{:?}",
        asked.elapsed()
    );
    let second = reply.chunk().await.expect("a chunk").expect("not the end");
    assert_eq!(&second[..], b"second");

    // h2c in, h2c out.
    let h2 = reqwest::Client::builder()
        .http2_prior_knowledge()
        .build()
        .expect("client");
    let reply = h2.get(throttle.url("/")).send().await.expect("answer");
    assert_eq!(reply.version(), http::Version::HTTP_2);
    assert_eq!(reply.status(), 200);
    assert_eq!(
        seen.versions.lock().unwrap().last(),
        Some(&http::Version::HTTP_2)
    );

    // A WebSocket-style upgrade: the upstream agrees and echoes.
    let echo = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let echo_addr = echo.local_addr().expect("addr");
    tokio::spawn(async move {
        while let Ok((stream, _)) = echo.accept().await {
            tokio::spawn(echo_or_answer(stream));
        }
    });
    let upgrading =
        Throttle::start(&format!("http://{echo_addr}"), &["--max-concurrency", "1"]).await;
    let mut client = TcpStream::connect(("127.0.0.1", upgrading.port))
        .await
        .expect("connect");
    client
        .write_all(
            b"GET /ws HTTP/1.1\r\nhost: x\r\nconnection: Upgrade\r\nupgrade: websocket\r\n\r\n",
        )
        .await
        .expect("write");
    let mut head = Vec::new();
    let mut byte = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") {
        client.read_exact(&mut byte).await.expect("the 101");
        head.push(byte[0]);
    }
    let head = String::from_utf8_lossy(&head).to_lowercase();
    assert!(head.starts_with("http/1.1 101"), "{head}");
    for message in [&b"ping"[..], b"\xF0\x9F\x94\xA5 unicode"] {
        client.write_all(message).await.expect("write");
        let mut echoed = vec![0u8; message.len()];
        client.read_exact(&mut echoed).await.expect("echo");
        assert_eq!(echoed, message);
    }
    // The upgraded connection holds no slot: the only one serves others.
    let reply = reqwest::get(upgrading.url("/after")).await.expect("answer");
    assert_eq!(reply.status(), 200);
}

/// Agrees to an upgrade and echoes what comes after it; answers any other
/// request with a plain 200.
async fn echo_or_answer(mut stream: TcpStream) {
    let mut request = Vec::new();
    let mut byte = [0u8; 1];
    while !request.ends_with(b"\r\n\r\n") {
        if stream.read_exact(&mut byte).await.is_err() {
            return;
        }
        request.push(byte[0]);
    }
    if !String::from_utf8_lossy(&request)
        .to_lowercase()
        .contains("upgrade: websocket")
    {
        let _ = stream
            .write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 5\r\n\r\nplain")
            .await;
        return;
    }
    let _ = stream
        .write_all(b"HTTP/1.1 101 Switching Protocols\r\nconnection: upgrade\r\nupgrade: websocket\r\n\r\n")
        .await;
    let mut buffer = [0u8; 64];
    while let Ok(read) = stream.read(&mut buffer).await {
        if read == 0 || stream.write_all(&buffer[..read]).await.is_err() {
            return;
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_lets_the_requests_in_flight_finish() {
    let seen = Arc::new(Seen::default());
    let addr = upstream(seen.clone(), Instant::now()).await;
    let mut throttle =
        Throttle::start(&format!("http://{addr}"), &["--max-concurrency", "4"]).await;
    let url = throttle.url("/slow?ms=800");
    let in_flight =
        tokio::spawn(async move { reqwest::get(url).await.map(|reply| reply.status()) });
    while seen.running.load(Ordering::SeqCst) == 0 {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let pid = throttle.child.0.id();
    let _ = Command::new("kill")
        .args(["-TERM", &pid.to_string()])
        .status();
    // While it drains, it says so to the readiness probe.
    let draining = tokio::time::timeout(Duration::from_secs(5), async {
        loop {
            let mut unready = 0;
            // `/readyz`, and `/ready`, its alias for pods deployed before.
            for path in ["/readyz", "/ready"] {
                if let Ok(reply) = reqwest::get(throttle.admin_url(path)).await
                    && reply.status() == 503
                {
                    unready += 1;
                }
            }
            if unready == 2 {
                return;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await;
    assert!(draining.is_ok(), "/ready never said draining");
    let status = in_flight.await.expect("joined").expect("answered");
    assert_eq!(status, 200);
    let exited = tokio::task::spawn_blocking(move || {
        let exited = throttle.child.0.wait();
        (exited, throttle)
    })
    .await
    .expect("joined");
    assert!(exited.0.expect("waited").success());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_budget_of_the_upstreams_cpu_paces_requests_by_the_cost_they_report() {
    let start = Instant::now();
    let seen = Arc::new(Seen::default());
    let addr = upstream(seen.clone(), start).await;
    // 1 000 ms of the upstream's CPU a second, requests that report 100 ms
    // each: 10 a second, whatever the slots allow.
    let throttle = Throttle::start(
        &format!("http://{addr}"),
        &[
            "--max-concurrency",
            "50",
            "--queue",
            "100",
            "--max-wait-ms",
            "10000",
            "--cpu-budget-ms",
            "1000",
        ],
    )
    .await;
    // One alone first, so the path's cost is known.
    assert_eq!(
        reqwest::get(throttle.url("/costly"))
            .await
            .expect("answer")
            .status(),
        200
    );
    tokio::time::sleep(Duration::from_millis(300)).await;
    seen.arrivals.lock().unwrap().clear();
    let answers = at_once(&throttle.url("/costly"), 20, "critical").await;
    assert!(
        answers.iter().all(|(status, _)| *status == 200),
        "{answers:?}"
    );
    let arrivals = seen.arrivals.lock().unwrap().clone();
    let span = arrivals[19] - arrivals[0];
    // 20 × 100 ms of a budget of 1 000 a second: about 2 s (the bucket
    // holds a twentieth of a second to start with).
    assert!(
        span >= Duration::from_millis(1_600) && span < Duration::from_millis(4_000),
        "{span:?}"
    );
    let stats = throttle.stats().await;
    let class = &stats["classes"][0];
    assert_eq!(class["class"], "/costly", "{stats}");
    assert_eq!(class["predicted_ms"], 100.0, "{stats}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tenants_quota_is_a_429_before_the_queue() {
    let dir = tempfile::tempdir().expect("temp dir");
    let limits = dir.path().join("edge.yaml");
    std::fs::write(
        &limits,
        "domain: edge\ndescriptors:\n  - key: x-tenant\n    rate_limit: {unit: minute, requests_per_unit: 3}\n",
    )
    .expect("write");
    let seen = Arc::new(Seen::default());
    let addr = upstream(seen.clone(), Instant::now()).await;
    let throttle = Throttle::start(
        &format!("http://{addr}"),
        &[
            "--adaptive",
            "--config",
            limits.to_str().expect("utf-8"),
            "--domain-header",
            "x-tenant",
        ],
    )
    .await;
    let client = reqwest::Client::new();
    let mut statuses = Vec::new();
    for tenant in ["acme", "acme", "acme", "acme", "acme", "other", ""] {
        let mut request = client.get(throttle.url("/"));
        if !tenant.is_empty() {
            request = request.header("x-tenant", tenant);
        }
        let reply = request.send().await.expect("answer");
        if reply.status() == 429 {
            assert!(reply.headers().contains_key("retry-after"));
        }
        statuses.push(reply.status().as_u16());
    }
    // acme's three a minute, then 429; another tenant and no tenant pass.
    assert_eq!(statuses, [200, 200, 200, 429, 429, 200, 200]);
    assert_eq!(throttle.stats().await["refused_tenant_limit"], 2);
    // Refused requests never reached the upstream.
    assert_eq!(seen.arrivals.lock().unwrap().len(), 5);
}

#[test]
fn bad_flags_are_refused_with_a_reason() {
    for (flags, reason) in [
        (
            &["--upstream", "http://127.0.0.1:1", "--drain-rate", "0"][..],
            "--drain-rate",
        ),
        (
            &["--upstream", "http://127.0.0.1:1", "--drain-rate", "0.001"],
            "one a minute",
        ),
        (
            &["--upstream", "http://127.0.0.1:1", "--max-concurrency", "0"],
            "--max-concurrency",
        ),
        (&["--upstream", "ftp://127.0.0.1:1"], "http://host:port"),
        (
            &["--upstream", "http://127.0.0.1:1/path"],
            "http://host:port",
        ),
        (
            &[
                "--upstream",
                "http://127.0.0.1:1",
                "--adaptive",
                "--max-concurrency",
                "3",
            ],
            "cannot be used with",
        ),
    ] {
        let output = Command::new(env!("CARGO_BIN_EXE_charon"))
            .arg("throttle")
            .args(["--listen", "127.0.0.1:0", "--admin-addr", "127.0.0.1:0"])
            .args(flags)
            .output()
            .expect("runs");
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(!output.status.success(), "{flags:?}");
        assert!(stderr.contains(reason), "{flags:?}: {stderr}");
    }
}
