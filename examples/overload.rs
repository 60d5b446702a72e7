//! An app to overload: `GET /work?cpu_ms=N` burns N ms of CPU in its
//! handler and answers 200 (`&jitter=J`: between N·(1−J) and N·(1+J), at
//! random, so that costs vary as real ones do), behind Charon's `ThrottleLayer` (`--mode
//! throttle`) or with nothing in front (`--mode none`). Requests say how
//! much they matter in `x-criticality` (`critical_plus`, `critical`,
//! `sheddable_plus`, `sheddable`).
//!
//! ```text
//! cargo run --release --example overload -- --addr 127.0.0.1:3000 [--mode throttle|none]
//! curl -s 'localhost:3000/work?cpu_ms=10' -H 'x-criticality: sheddable'
//! curl -s localhost:3000/stats     # per class: predicted and measured CPU
//! ```
//!
//! A request may say in `x-give-up-at` (Unix milliseconds) when its client
//! stops waiting for it; CPU spent on it past that instant is counted as
//! wasted (`late_cpu_ms` in `/stats`). `scripts/bench-overload.sh` loads it.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use axum::extract::{Query, State};
use axum::http::{HeaderMap, Uri};
use axum::routing::get;
use axum::{Json, Router};
use charon::layer::{ThrottleLayer, thread_cpu_time};
use clap::{Parser, ValueEnum};
use serde::{Deserialize, Serialize};

#[derive(Parser)]
struct Args {
    /// Where to listen.
    #[arg(long, default_value = "127.0.0.1:3000")]
    addr: SocketAddr,
    #[arg(long, value_enum, default_value = "throttle")]
    mode: Mode,
    /// Requests in progress at once, with the layer.
    #[arg(long, default_value_t = 2)]
    capacity: usize,
    /// The handlers' CPU budget, with the layer (ms of CPU per second).
    #[arg(long, default_value_t = 900.0)]
    cpu_budget_ms: f64,
    /// The longest a request waits for its turn, with the layer.
    #[arg(long, default_value_t = 500)]
    max_wait_ms: u64,
    /// How many requests may wait, with the layer.
    #[arg(long, default_value_t = 1_000)]
    max_queue: usize,
    /// The runtime's worker threads: one burns while another takes the
    /// next requests off the sockets.
    #[arg(long, default_value_t = 2)]
    workers: usize,
}

#[derive(Clone, Copy, PartialEq, ValueEnum)]
enum Mode {
    Throttle,
    None,
}

/// What the handlers measured themselves, per class, in either mode.
#[derive(Default, Clone, Serialize)]
struct Tally {
    requests: u64,
    cpu_ms: f64,
    /// CPU spent on requests after their client gave up.
    late_cpu_ms: f64,
}

#[derive(Clone, Default)]
struct App {
    tallies: Arc<Mutex<BTreeMap<String, Tally>>>,
    layer: Option<ThrottleLayer>,
}

#[derive(Deserialize)]
struct Work {
    cpu_ms: Option<f64>,
    jitter: Option<f64>,
}

/// A number in [0, 1), different for each call (splitmix64 of a counter).
fn uniform() -> f64 {
    static DRAWS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let mut z = DRAWS
        .fetch_add(0x9E37_79B9_7F4A_7C15, std::sync::atomic::Ordering::Relaxed)
        .wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    ((z ^ (z >> 31)) >> 11) as f64 / (1u64 << 53) as f64
}

fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(args.workers.max(1))
        .enable_all()
        .build()?
        .block_on(serve(args))
}

async fn serve(args: Args) -> anyhow::Result<()> {
    let layer = (args.mode == Mode::Throttle).then(|| {
        ThrottleLayer::new(args.capacity)
            .cpu_budget(args.cpu_budget_ms)
            .max_wait(Duration::from_millis(args.max_wait_ms))
            .max_queue(args.max_queue)
            .classify(class_of)
    });
    let app = App {
        layer: layer.clone(),
        ..App::default()
    };
    let work = Router::new()
        .route("/work", get(work))
        .with_state(app.clone());
    let work = match layer {
        Some(layer) => work.layer(layer),
        None => work,
    };
    let router = Router::new()
        .route("/stats", get(stats))
        .with_state(app)
        .merge(work);
    let listener = tokio::net::TcpListener::bind(args.addr).await?;
    println!("listening on http://{}", listener.local_addr()?);
    axum::serve(listener, router).await?;
    Ok(())
}

/// A request's class: the work it asks for.
fn class_of(uri: &Uri, _: &HeaderMap) -> String {
    uri.path_and_query()
        .map_or_else(|| uri.path().to_owned(), |pq| pq.as_str().to_owned())
}

fn unix_ms() -> u128 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |since| since.as_millis())
}

async fn work(
    State(app): State<App>,
    Query(work): Query<Work>,
    uri: Uri,
    headers: HeaderMap,
) -> &'static str {
    let jitter = work.jitter.unwrap_or(0.0).clamp(0.0, 1.0);
    let ms =
        work.cpu_ms.unwrap_or(1.0).clamp(0.0, 10_000.0) * (1.0 + jitter * (2.0 * uniform() - 1.0));
    let began = thread_cpu_time();
    let until = began + Duration::from_secs_f64(ms / 1_000.0);
    while thread_cpu_time() < until {
        std::hint::spin_loop();
    }
    let used_ms = (thread_cpu_time() - began).as_secs_f64() * 1_000.0;
    let gave_up = headers
        .get("x-give-up-at")
        .and_then(|v| v.to_str().ok()?.parse::<u128>().ok())
        .is_some_and(|at| unix_ms() > at);
    if let Ok(mut tallies) = app.tallies.lock() {
        let tally = tallies.entry(class_of(&uri, &headers)).or_default();
        tally.requests += 1;
        tally.cpu_ms += used_ms;
        if gave_up {
            tally.late_cpu_ms += used_ms;
        }
    }
    "done\n"
}

#[derive(Serialize)]
struct Stats {
    /// The process's CPU time so far (user and system).
    process_cpu_ms: f64,
    /// Requests the layer refused.
    refused: u64,
    /// Per class: the layer's prediction and measurement (with the layer),
    /// and what the handler measured of its own burn.
    classes: BTreeMap<String, ClassStats>,
}

#[derive(Serialize, Default)]
struct ClassStats {
    handler: Tally,
    layer: Option<charon::layer::ClassCost>,
}

async fn stats(State(app): State<App>) -> Json<Stats> {
    let mut classes: BTreeMap<String, ClassStats> = BTreeMap::new();
    if let Ok(tallies) = app.tallies.lock() {
        for (class, tally) in tallies.iter() {
            classes.entry(class.clone()).or_default().handler = tally.clone();
        }
    }
    let mut refused = 0;
    if let Some(layer) = &app.layer {
        for cost in layer.costs() {
            let class = cost.class.clone();
            classes.entry(class).or_default().layer = Some(cost);
        }
        refused = layer
            .counts()
            .refused
            .load(std::sync::atomic::Ordering::Relaxed);
    }
    Json(Stats {
        process_cpu_ms: process_cpu().as_secs_f64() * 1_000.0,
        refused,
        classes,
    })
}

fn process_cpu() -> Duration {
    clock(libc::CLOCK_PROCESS_CPUTIME_ID)
}

fn clock(id: libc::clockid_t) -> Duration {
    let mut now = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: a valid timespec to write into, a clock Linux defines.
    if unsafe { libc::clock_gettime(id, &mut now) } != 0 {
        return Duration::ZERO;
    }
    Duration::new(
        u64::try_from(now.tv_sec).unwrap_or(0),
        u32::try_from(now.tv_nsec).unwrap_or(0),
    )
}
