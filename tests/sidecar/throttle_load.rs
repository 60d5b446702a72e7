//! The attacks of `throttle_attacks` as a load run, in the overload
//! benchmark's shape (opt-in, ignored by the test command): `charon
//! throttle --max-concurrency 4 --queue 16` with its default protections,
//! an honest open-loop client at 50 requests a second (half
//! `critical_plus`, half the default level) on an upstream that takes
//! 20 ms a request, and one attack at a time. It prints honest goodput per
//! criticality with each attack against its value without, and the
//! proxy's CPU time and resident memory.
//!
//! `cargo test --test sidecar throttle_load -- --ignored --nocapture`
//! (`CHARON_LOAD_SECONDS`, default 10, sets each phase's length;
//! `CHARON_THROTTLE_BIN` runs another build of `charon`, such as
//! `target/release/charon`).

use std::process::Command;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use tokio::io::AsyncWriteExt;
use tokio::net::TcpStream;

use super::throttle::{Seen, Throttle, upstream};

#[derive(Clone, Copy, Debug, PartialEq)]
enum Attack {
    None,
    SlowBody,
    NeverRead,
    RapidReset,
    Slowloris,
    IdleConnections,
}

/// Honest requests sent and served (200), per level: critical_plus, default.
#[derive(Default)]
struct Goodput {
    sent: [AtomicU64; 2],
    served: [AtomicU64; 2],
}

impl Goodput {
    fn ratio(&self, level: usize) -> f64 {
        let sent = self.sent[level].load(Ordering::Relaxed).max(1);
        self.served[level].load(Ordering::Relaxed) as f64 / sent as f64
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "a load run of a minute or more: run it on purpose"]
async fn throttle_load() {
    let seconds: u64 = std::env::var("CHARON_LOAD_SECONDS")
        .ok()
        .and_then(|value| value.parse().ok())
        .unwrap_or(10);
    let seen = Arc::new(Seen::default());
    let addr = upstream(seen.clone(), Instant::now()).await;
    let upstream = format!("http://{addr}");
    let mut baseline = None;
    println!(
        "attack            critical_plus  default   (vs none)         proxy CPU ms  RSS KiB  upstream extra"
    );
    for attack in [
        Attack::None,
        Attack::SlowBody,
        Attack::NeverRead,
        Attack::RapidReset,
        Attack::Slowloris,
        Attack::IdleConnections,
    ] {
        let mut command = Command::new(
            std::env::var_os("CHARON_THROTTLE_BIN")
                .unwrap_or_else(|| env!("CARGO_BIN_EXE_charon").into()),
        );
        if attack == Attack::IdleConnections {
            limit_descriptors(&mut command, 1_024);
        }
        let throttle = Throttle::start_with(
            &upstream,
            &["--max-concurrency", "4", "--queue", "16"],
            command,
        )
        .await;
        let stop = Arc::new(AtomicBool::new(false));
        let attackers = start_attack(attack, throttle.port, stop.clone()).await;
        // Let the attack take hold before measuring.
        tokio::time::sleep(Duration::from_secs(1)).await;
        let arrived = seen.arrivals.lock().map_or(0, |arrivals| arrivals.len());
        let goodput = honest(&throttle, Duration::from_secs(seconds)).await;
        // What reached the upstream beyond the honest requests served.
        let extra = seen.arrivals.lock().map_or(0, |arrivals| arrivals.len())
            - arrived
            - (goodput.served[0].load(Ordering::Relaxed)
                + goodput.served[1].load(Ordering::Relaxed)) as usize;
        stop.store(true, Ordering::SeqCst);
        for attacker in attackers {
            attacker.abort();
        }
        let (cpu_ms, rss_kib) = usage(throttle.pid());
        let ratios = [goodput.ratio(0), goodput.ratio(1)];
        let base = *baseline.get_or_insert(ratios);
        println!(
            "{:<17} {:>6.1} %       {:>6.1} %  ({:>5.1} %, {:>5.1} %)  {:>8}     {:>7}  {:>8}",
            format!("{attack:?}"),
            ratios[0] * 100.0,
            ratios[1] * 100.0,
            ratios[0] / base[0] * 100.0,
            ratios[1] / base[1] * 100.0,
            cpu_ms,
            rss_kib,
            extra,
        );
        if let Ok(reply) = reqwest::get(throttle.admin_url("/stats")).await
            && let Ok(text) = reply.text().await
            && let Ok(stats) = serde_json::from_str::<serde_json::Value>(&text)
        {
            println!("    protection: {}", stats["protection"]);
        }
    }
}

/// The honest client: a request every 20 ms for `length`, alternately
/// critical_plus and of the default level, each given 5 s.
async fn honest(throttle: &Throttle, length: Duration) -> Arc<Goodput> {
    let goodput = Arc::new(Goodput::default());
    let client = reqwest::Client::builder()
        .timeout(Duration::from_secs(5))
        .build()
        .expect("client");
    let url = throttle.url("/slow?ms=20");
    let mut tick = tokio::time::interval(Duration::from_millis(20));
    let end = Instant::now() + length;
    let mut sent = Vec::new();
    let mut level = 0;
    while Instant::now() < end {
        tick.tick().await;
        level = 1 - level;
        goodput.sent[level].fetch_add(1, Ordering::Relaxed);
        let mut request = client.get(&url);
        if level == 0 {
            request = request.header("x-criticality", "critical_plus");
        }
        let goodput = goodput.clone();
        sent.push(tokio::spawn(async move {
            if let Ok(reply) = request.send().await
                && reply.status() == 200
                && reply.bytes().await.is_ok()
            {
                goodput.served[level].fetch_add(1, Ordering::Relaxed);
            }
        }));
    }
    for request in sent {
        let _ = request.await;
    }
    goodput
}

async fn start_attack(
    attack: Attack,
    port: u16,
    stop: Arc<AtomicBool>,
) -> Vec<tokio::task::JoinHandle<()>> {
    let (count, head, drip, pause): (usize, &'static [u8], &'static [u8], u64) = match attack {
        Attack::None => return Vec::new(),
        Attack::RapidReset => {
            return (0..2)
                .map(|_| tokio::spawn(rapid_reset(port, stop.clone())))
                .collect();
        }
        // 1 MB declared, 10 bytes a second.
        Attack::SlowBody => (
            4,
            b"POST /slow?ms=20 HTTP/1.1\r\nhost: x\r\ncontent-length: 1000000\r\n\r\n",
            b"0123456789",
            1_000,
        ),
        // 16 MiB asked for, never read.
        Attack::NeverRead => (4, b"GET /big HTTP/1.1\r\nhost: x\r\n\r\n", b"\r\n", 1_000),
        Attack::Slowloris => (500, b"GET / HTTP/1.1\r\n", b"x-a: b\r\n", 1_000),
        // More than the descriptor limit, 1024.
        Attack::IdleConnections => (1_200, b"", b"", 1_000),
    };
    (0..count)
        .map(|_| {
            let stop = stop.clone();
            tokio::spawn(async move {
                // Each attacker reconnects as soon as it is closed.
                while !stop.load(Ordering::SeqCst) {
                    let Ok(mut stream) = TcpStream::connect(("127.0.0.1", port)).await else {
                        tokio::time::sleep(Duration::from_millis(100)).await;
                        continue;
                    };
                    if stream.write_all(head).await.is_err() {
                        continue;
                    }
                    loop {
                        tokio::time::sleep(Duration::from_millis(pause)).await;
                        if stop.load(Ordering::SeqCst) {
                            return;
                        }
                        // A write to a closed connection fails (at the
                        // latest on the second try): reconnect.
                        if stream.write_all(drip).await.is_err()
                            || (drip.is_empty() && is_closed(&stream))
                        {
                            break;
                        }
                    }
                }
            })
        })
        .collect()
}

/// Whether the peer closed `stream` (a read would return 0 now).
fn is_closed(stream: &TcpStream) -> bool {
    let mut byte = [0u8; 1];
    match stream.try_read(&mut byte) {
        Ok(read) => read == 0,
        Err(error) => error.kind() != std::io::ErrorKind::WouldBlock,
    }
}

/// HTTP/2 streams sent 20 at a time and reset about 1 ms after their
/// HEADERS, reconnecting when the proxy closes the connection.
async fn rapid_reset(port: u16, stop: Arc<AtomicBool>) {
    while !stop.load(Ordering::SeqCst) {
        let Ok(tcp) = TcpStream::connect(("127.0.0.1", port)).await else {
            tokio::time::sleep(Duration::from_millis(100)).await;
            continue;
        };
        let Ok((mut client, connection)) = h2::client::handshake(tcp).await else {
            continue;
        };
        let connection = tokio::spawn(connection);
        'connection: while !stop.load(Ordering::SeqCst) {
            // A batch of streams, each reset about 1 ms after its HEADERS.
            let mut batch = Vec::new();
            for _ in 0..20 {
                let Ok(ready) = client.clone().ready().await else {
                    break 'connection;
                };
                client = ready;
                let Ok(request) =
                    http::Request::get(format!("http://127.0.0.1:{port}/slow?ms=20")).body(())
                else {
                    break 'connection;
                };
                let Ok((_, stream)) = client.send_request(request, true) else {
                    break 'connection;
                };
                batch.push(stream);
            }
            tokio::time::sleep(Duration::from_millis(1)).await;
            for mut stream in batch {
                stream.send_reset(h2::Reason::CANCEL);
            }
        }
        connection.abort();
    }
}

/// The process's CPU time (ms) and resident memory (KiB).
fn usage(pid: u32) -> (u64, u64) {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    let fields: Vec<&str> = stat
        .rsplit_once(')')
        .map_or("", |(_, rest)| rest)
        .split_whitespace()
        .collect();
    let ticks: u64 = [11, 12]
        .iter()
        .filter_map(|at| fields.get(*at)?.parse::<u64>().ok())
        .sum();
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    let rss = status
        .lines()
        .find_map(|line| line.strip_prefix("VmRSS:"))
        .and_then(|value| value.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or(0);
    // Clock ticks are 100 a second on Linux.
    (ticks * 10, rss)
}

/// Runs `command` with at most `descriptors` open files, soft and hard.
fn limit_descriptors(command: &mut Command, descriptors: u64) {
    use std::os::unix::process::CommandExt;
    let limit = libc::rlimit {
        rlim_cur: descriptors,
        rlim_max: descriptors,
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
