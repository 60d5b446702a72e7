//! The load of the overload benchmark (`scripts/bench-overload.sh`): an
//! open-loop HTTP load on `examples/overload`, on this machine only.
//!
//! 1. Calibrates: `--calibrate-concurrency` requests kept in flight for
//!    `--calibrate` give the app's capacity in requests per second.
//! 2. Offers 1x that capacity for `--phase`, then steps to `--multiple` x
//!    for `--phase`: critical requests at half the capacity throughout, the
//!    rest sheddable; arrivals are Poisson (seeded), each request sent on
//!    schedule whether or not earlier ones were answered, latency counted
//!    from its scheduled instant. A client gives up on a request after
//!    `--give-up` (and says so in `x-give-up-at`).
//! 3. Prints per phase and criticality: offered, goodput, p50/p99, the
//!    share of rejections; the CPU the app spent on requests that ended
//!    rejected; how long the step took to settle; and the layer's median
//!    prediction error, from the app's `/stats`.
//!
//! ```text
//! cargo run --release --example overload_load -- --addr 127.0.0.1:3000
//! ```

use std::collections::BTreeMap;
use std::net::{IpAddr, SocketAddr};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use anyhow::{Context, bail};
use bytes::Bytes;
use clap::Parser;
use http_body_util::{BodyExt, Empty};
use hyper::client::conn::http1::SendRequest;
use hyper_util::rt::TokioIo;
use tokio::net::TcpStream;
use tokio::time::Instant;

#[derive(Parser, Clone)]
struct Args {
    /// The app's address (loopback only).
    #[arg(long, default_value = "127.0.0.1:3000")]
    addr: SocketAddr,
    /// CPU each request asks the app to burn (ms).
    #[arg(long, default_value_t = 10.0)]
    cpu_ms: f64,
    /// How much each request's CPU varies around `--cpu-ms` (uniform, as a
    /// fraction: 0.2 is ±20 %).
    #[arg(long, default_value_t = 0.2)]
    jitter: f64,
    /// How long to measure the capacity for (seconds).
    #[arg(long, default_value_t = 3.0)]
    calibrate: f64,
    /// Requests in flight while calibrating.
    #[arg(long, default_value_t = 4)]
    calibrate_concurrency: usize,
    /// How long each phase lasts (seconds).
    #[arg(long, default_value_t = 10.0)]
    phase: f64,
    /// The second phase's load, in multiples of the capacity.
    #[arg(long, default_value_t = 4.0)]
    multiple: f64,
    /// When a client stops waiting for an answer (seconds).
    #[arg(long, default_value_t = 2.0)]
    give_up: f64,
    /// Seeds the arrivals.
    #[arg(long, default_value_t = 1)]
    seed: u64,
}

#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Debug)]
enum Level {
    Critical,
    Sheddable,
}

impl Level {
    fn header(self) -> &'static str {
        match self {
            Level::Critical => "critical",
            Level::Sheddable => "sheddable",
        }
    }
}

/// One request's fate.
struct Outcome {
    phase: usize,
    level: Level,
    /// When it was scheduled, from the start of the run.
    at: Duration,
    /// Answered 200 within the give-up time; else refused or given up.
    ok: bool,
    latency: Duration,
}

/// Keep-alive HTTP/1.1 connections, reused one request at a time.
struct Pool {
    addr: SocketAddr,
    idle: Mutex<Vec<SendRequest<Empty<Bytes>>>>,
}

impl Pool {
    async fn get(&self) -> anyhow::Result<SendRequest<Empty<Bytes>>> {
        loop {
            let idle = self.idle.lock().ok().and_then(|mut idle| idle.pop());
            let Some(mut sender) = idle else { break };
            if sender.ready().await.is_ok() {
                return Ok(sender);
            }
        }
        let stream = TcpStream::connect(self.addr).await?;
        stream.set_nodelay(true)?;
        let (sender, connection) =
            hyper::client::conn::http1::handshake(TokioIo::new(stream)).await?;
        tokio::spawn(connection);
        Ok(sender)
    }

    fn put(&self, sender: SendRequest<Empty<Bytes>>) {
        if let Ok(mut idle) = self.idle.lock() {
            idle.push(sender);
        }
    }

    /// GET `path`: the status, once the body is read.
    async fn call(&self, path: &str, headers: &[(&str, String)]) -> anyhow::Result<u16> {
        let mut sender = self.get().await?;
        let mut request = hyper::Request::get(path).header("host", "overload");
        for (name, value) in headers {
            request = request.header(*name, value);
        }
        let response = sender.send_request(request.body(Empty::new())?).await?;
        let status = response.status().as_u16();
        response.into_body().collect().await?;
        self.put(sender);
        Ok(status)
    }
}

fn unix_ms() -> u128 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |since| since.as_millis())
}

/// xorshift64*: enough randomness for arrival times, and seeded.
struct Arrivals(u64);

impl Arrivals {
    /// The gap to the next arrival of a Poisson process at `rate` per second.
    fn gap(&mut self, rate: f64) -> Duration {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        let uniform =
            (self.0.wrapping_mul(0x2545_F491_4F6C_DD1D) >> 11) as f64 / (1u64 << 53) as f64;
        Duration::from_secs_f64(-(1.0 - uniform).ln() / rate)
    }
}

async fn calibrate(pool: Arc<Pool>, args: &Args, path: &str) -> anyhow::Result<f64> {
    let until = Instant::now() + Duration::from_secs_f64(args.calibrate);
    let mut workers = Vec::new();
    for _ in 0..args.calibrate_concurrency {
        let (pool, path) = (pool.clone(), path.to_owned());
        workers.push(tokio::spawn(async move {
            let mut ok = 0u64;
            while Instant::now() < until {
                let headers = [("x-criticality", "critical".to_owned())];
                if pool.call(&path, &headers).await? == 200 {
                    ok += 1;
                }
            }
            anyhow::Ok(ok)
        }));
    }
    let mut ok = 0;
    for worker in workers {
        ok += worker.await??;
    }
    Ok(ok as f64 / args.calibrate)
}

/// The app's `/stats`.
async fn stats(pool: &Pool) -> anyhow::Result<serde_json::Value> {
    let mut sender = pool.get().await?;
    let request = hyper::Request::get("/stats")
        .header("host", "overload")
        .body(Empty::new())?;
    let body = sender
        .send_request(request)
        .await?
        .into_body()
        .collect()
        .await?;
    Ok(serde_json::from_slice(&body.to_bytes())?)
}

fn number(value: &serde_json::Value, pointer: &str) -> f64 {
    value
        .pointer(pointer)
        .and_then(serde_json::Value::as_f64)
        .unwrap_or(0.0)
}

/// CPU the app's handlers spent past their client's giving up, in all.
fn late_cpu_ms(stats: &serde_json::Value) -> f64 {
    stats["classes"].as_object().map_or(0.0, |classes| {
        classes
            .values()
            .map(|c| number(c, "/handler/late_cpu_ms"))
            .sum()
    })
}

fn handler_cpu_ms(stats: &serde_json::Value) -> f64 {
    stats["classes"].as_object().map_or(0.0, |classes| {
        classes.values().map(|c| number(c, "/handler/cpu_ms")).sum()
    })
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    if sorted.is_empty() {
        return Duration::ZERO;
    }
    let rank = (p * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

fn ms(duration: Duration) -> String {
    format!("{:.1}", duration.as_secs_f64() * 1_000.0)
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    if !matches!(args.addr.ip(), IpAddr::V4(ip) if ip.is_loopback())
        && args.addr.ip() != IpAddr::from([0u16, 0, 0, 0, 0, 0, 0, 1])
    {
        bail!("--addr {}: only loopback addresses are loaded", args.addr);
    }
    let pool = Arc::new(Pool {
        addr: args.addr,
        idle: Mutex::new(Vec::new()),
    });
    let path = format!("/work?cpu_ms={}&jitter={}", args.cpu_ms, args.jitter);
    let capacity = calibrate(pool.clone(), &args, &path)
        .await
        .context("calibrating (is the app listening?)")?;
    if capacity < 1.0 {
        bail!("the app answered {capacity:.1} requests per second while calibrating");
    }
    println!(
        "capacity: {capacity:.1} requests/s at {} ms of CPU each (±{} %)",
        args.cpu_ms,
        args.jitter * 100.0
    );
    // Let the calibration's queue drain before the run.
    tokio::time::sleep(Duration::from_millis(500)).await;

    let phases = [1.0, args.multiple];
    let phase = Duration::from_secs_f64(args.phase);
    let give_up = Duration::from_secs_f64(args.give_up);
    let outcomes: Arc<Mutex<Vec<Outcome>>> = Arc::default();
    let before = stats(&pool).await?;
    let start = Instant::now();
    let mut senders = Vec::new();
    for (level, seed) in [
        (Level::Critical, args.seed),
        (Level::Sheddable, args.seed ^ 0x9E37_79B9),
    ] {
        let (pool, outcomes, path) = (pool.clone(), outcomes.clone(), path.clone());
        senders.push(tokio::spawn(async move {
            let mut arrivals = Arrivals(seed.max(1));
            let mut tasks = Vec::new();
            let mut at = Duration::ZERO;
            loop {
                let index = (at.as_secs_f64() / phase.as_secs_f64()) as usize;
                let Some(multiple) = phases.get(index) else {
                    break;
                };
                let rate = match level {
                    Level::Critical => capacity / 2.0,
                    Level::Sheddable => capacity * (multiple - 0.5),
                };
                at += arrivals.gap(rate);
                tokio::time::sleep_until(start + at).await;
                let (pool, outcomes, path) = (pool.clone(), outcomes.clone(), path.clone());
                let scheduled = at;
                tasks.push(tokio::spawn(async move {
                    let headers = [
                        ("x-criticality", level.header().to_owned()),
                        (
                            "x-give-up-at",
                            (unix_ms() + give_up.as_millis()).to_string(),
                        ),
                    ];
                    let answer = tokio::time::timeout(give_up, pool.call(&path, &headers)).await;
                    let ok = matches!(answer, Ok(Ok(200)));
                    let latency = start.elapsed().saturating_sub(scheduled);
                    if let Ok(mut outcomes) = outcomes.lock() {
                        outcomes.push(Outcome {
                            phase: index,
                            level,
                            at: scheduled,
                            ok,
                            latency,
                        });
                    }
                }));
            }
            for task in tasks {
                let _ = task.await;
            }
        }));
    }
    for sender in senders {
        sender.await?;
    }
    let after = stats(&pool).await?;
    let elapsed = start.elapsed();
    let outcomes = std::mem::take(&mut *outcomes.lock().map_err(|_| anyhow::anyhow!("poisoned"))?);
    report(&args, elapsed, &outcomes, &before, &after);
    Ok(())
}

fn report(
    args: &Args,
    elapsed: Duration,
    outcomes: &[Outcome],
    before: &serde_json::Value,
    after: &serde_json::Value,
) {
    let mut p99_at_1x = Duration::ZERO;
    println!("phase  level      offered/s  goodput/s  goodput%   p50 ms   p99 ms  rejected");
    for (index, multiple) in [1.0, args.multiple].into_iter().enumerate() {
        let mut rejected_by_level = BTreeMap::new();
        for level in [Level::Critical, Level::Sheddable] {
            let mine: Vec<&Outcome> = outcomes
                .iter()
                .filter(|o| o.phase == index && o.level == level)
                .collect();
            let mut latencies: Vec<Duration> =
                mine.iter().filter(|o| o.ok).map(|o| o.latency).collect();
            latencies.sort();
            let ok = latencies.len();
            let p99 = percentile(&latencies, 0.99);
            if index == 0 && level == Level::Critical {
                p99_at_1x = p99;
            }
            rejected_by_level.insert(level, mine.len() - ok);
            println!(
                "{multiple:>4}x  {:<9} {:>10.1} {:>10.1} {:>8.1}% {:>8} {:>8} {:>9}",
                level.header(),
                mine.len() as f64 / args.phase,
                ok as f64 / args.phase,
                100.0 * ok as f64 / mine.len().max(1) as f64,
                ms(percentile(&latencies, 0.5)),
                ms(p99),
                mine.len() - ok,
            );
        }
        let rejected: usize = rejected_by_level.values().sum();
        let on_sheddable = rejected_by_level
            .get(&Level::Sheddable)
            .copied()
            .unwrap_or(0);
        println!(
            "{multiple:>4}x  rejections on sheddable: {:.1}% of {rejected}",
            100.0 * on_sheddable as f64 / rejected.max(1) as f64
        );
    }
    // Settling: from the step, 100-ms windows of critical requests whose
    // goodput is at least 99 % of what they offered and whose p99 is at
    // most twice the 1x p99; settled from the first window after the last
    // one that is not.
    let step = Duration::from_secs_f64(args.phase);
    let window = Duration::from_millis(100);
    let windows = (args.phase / 0.1).round() as usize;
    let mut last_bad = None;
    for w in 0..windows {
        let from = step + window * w as u32;
        let mine: Vec<&Outcome> = outcomes
            .iter()
            .filter(|o| o.level == Level::Critical && o.at >= from && o.at < from + window)
            .collect();
        let mut latencies: Vec<Duration> =
            mine.iter().filter(|o| o.ok).map(|o| o.latency).collect();
        latencies.sort();
        let good = latencies.len() as f64 >= 0.99 * mine.len() as f64
            && percentile(&latencies, 0.99) <= p99_at_1x * 2;
        if !good {
            last_bad = Some(w);
        }
    }
    match last_bad {
        None => println!("settled after the step in: 0 ms (no window outside the bounds)"),
        Some(w) if w + 1 == windows => {
            println!("settled after the step in: never (within {} s)", args.phase)
        }
        Some(w) => println!("settled after the step in: {} ms", (w + 1) * 100),
    }
    // CPU: the app's, during the run; its handlers' on answered requests;
    // what went to requests that ended rejected: handlers that ran past
    // their client's giving up, and the server's own work spread over all
    // requests by count (what refusing costs).
    let process = number(after, "/process_cpu_ms") - number(before, "/process_cpu_ms");
    let handlers = handler_cpu_ms(after) - handler_cpu_ms(before);
    let late = late_cpu_ms(after) - late_cpu_ms(before);
    let all = outcomes.len().max(1) as f64;
    let rejected = outcomes.iter().filter(|o| !o.ok).count() as f64;
    let overhead = (process - handlers).max(0.0);
    let wasted = late + overhead * rejected / all;
    println!(
        "app CPU: {:.0} ms ({:.0} % of the run's {:.1} s); on requests that ended rejected: {:.1} % \
         (handlers past give-up {:.0} ms, refusals' share of the server's own {:.0} ms)",
        process,
        100.0 * process / (elapsed.as_secs_f64() * 1_000.0),
        elapsed.as_secs_f64(),
        100.0 * wasted / process.max(1.0),
        late,
        overhead
    );
    if let Some(classes) = after["classes"].as_object() {
        for (class, costs) in classes {
            if let Some(layer) = costs.get("layer").filter(|l| !l.is_null()) {
                println!(
                    "predictor {class}: predicted {:.2} ms, measured mean {:.2} ms, median error {:.1} % over the latest 128 of {} requests",
                    number(layer, "/predicted_ms"),
                    number(layer, "/measured_mean_ms"),
                    100.0 * number(layer, "/median_error"),
                    number(layer, "/requests"),
                );
            }
        }
    }
}
