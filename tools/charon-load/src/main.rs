//! `charon-load`: a load generator for Charon's Envoy RateLimitService.
//!
//! Sends `ShouldRateLimit` requests, each with one descriptor
//! `[(KEY, PREFIX<N>)]`, over `--connections` HTTP/2 connections (one tonic
//! `Channel` each, connected separately), keeping `--concurrency` requests in
//! flight in total for `--duration`; then prints counts, throughput and
//! latency percentiles. It only targets loopback addresses: it is for
//! measuring a sidecar on this machine, not for loading anyone's service.
//!
//! ```text
//! charon-load --target http://127.0.0.1:8081 --domain edge --key tenant \
//!     --tenants 100000 --connections 4 --concurrency 64 --duration 20s [--hot]
//! ```
//!
//! With `--copies RESOURCE` it measures the Charon API instead: each of the
//! `--concurrency` workers opens one session and loops on a reserve of one
//! copy of RESOURCE for domain `PREFIX<N>` and its release; one request is one
//! reserve + release pair, OK when the reserve was granted.
//!
//! With `--budget` it plays token budgets under concurrency instead
//! (`budget.rs`): `--concurrency` streams check, run, and charge a cost
//! known after the response against `[("generic_key", "tokens")]` of
//! `--domain`, for `--windows` whole windows of `--budget-period`, and it
//! prints the cost charged per window against `--budget-limit`.

mod budget;
mod tally;
mod workers;

use std::process::ExitCode;
use std::sync::Arc;
use std::sync::atomic::AtomicU64;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use clap::{Parser, ValueEnum};
use tonic::transport::Endpoint;

use tally::{Tally, ms, own_cpu_seconds, percentile};
use workers::{Plan, copies_worker, paced_worker, worker};

#[derive(Parser, Debug, Clone)]
#[command(
    name = "charon-load",
    version,
    about = "Load-test a Charon (or any Envoy RLS) sidecar on this machine"
)]
struct Args {
    /// The sidecar's gRPC address (several, comma-separated: connections
    /// take them in turn); only 127.0.0.1, localhost and `[::1]` are accepted.
    #[arg(long, default_value = "http://127.0.0.1:8081")]
    target: String,
    /// The request's domain (Charon's namespace).
    #[arg(long, default_value = "edge")]
    domain: String,
    /// The descriptor entry's key.
    #[arg(long, default_value = "tenant")]
    key: String,
    /// The descriptor entry's value is PREFIX followed by the tenant number.
    #[arg(long, default_value = "tenant-")]
    prefix: String,
    /// How many distinct tenants to spread requests over.
    #[arg(long, default_value_t = 100_000, value_parser = clap::value_parser!(u64).range(1..))]
    tenants: u64,
    /// How tenants are picked.
    #[arg(long, value_enum, default_value_t = Pick::Uniform)]
    pick: Pick,
    /// Send every request for one tenant (PREFIX0).
    #[arg(long)]
    hot: bool,
    /// HTTP/2 connections (one tonic Channel each).
    #[arg(long, default_value_t = 4, value_parser = clap::value_parser!(u64).range(1..=1024))]
    connections: u64,
    /// Requests in flight in total, spread over the connections.
    #[arg(long, default_value_t = 64, value_parser = clap::value_parser!(u64).range(1..=100_000))]
    concurrency: u64,
    /// How long to send for (e.g. 500ms, 20s, 2m).
    #[arg(long, default_value = "20s", value_parser = parse_duration)]
    duration: Duration,
    /// A request that takes longer than this counts as an error.
    #[arg(long, default_value = "2s", value_parser = parse_duration)]
    timeout: Duration,
    /// Measure reserve + release pairs of this copy-limited resource through
    /// Charon API sessions (one per worker) instead of ShouldRateLimit.
    #[arg(long)]
    copies: Option<String>,
    /// Open loop: send this many requests per second in all, on schedule,
    /// whether or not earlier ones were answered (latency is counted from
    /// the scheduled instant, so queueing shows); --concurrency is then
    /// ignored. Without it, --concurrency requests are kept in flight.
    #[arg(long, value_parser = clap::value_parser!(u64).range(1..=10_000_000))]
    rate: Option<u64>,
    /// Threads of the client's runtime (default: one per core).
    #[arg(long)]
    threads: Option<usize>,
    /// Token budgets under concurrency (see `budget.rs`); the domain's
    /// limit on `generic_key=tokens` decides how checks are admitted.
    #[arg(long)]
    budget: bool,
    /// With --budget: the budget per window, to report against.
    #[arg(long, default_value_t = 100_000)]
    budget_limit: u64,
    /// With --budget: the budget's window (its limit's unit).
    #[arg(long, default_value = "1m", value_parser = parse_duration)]
    budget_period: Duration,
    /// With --budget: whole windows to run.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u64).range(1..=60))]
    windows: u64,
    /// With --budget: reserve each request's max_tokens through the Charon
    /// API's `Cost` call and commit its cost, instead of Envoy's check and
    /// charge.
    #[arg(long, conflicts_with = "budget_refund")]
    budget_reserve: bool,
    /// With --budget: the shortest time from a request's admission to its
    /// charge (ms); each is drawn uniformly up to --budget-longest-ms.
    #[arg(long, default_value_t = 200)]
    budget_shortest_ms: u64,
    /// With --budget: the longest time from admission to charge (ms).
    #[arg(long, default_value_t = 3_000)]
    budget_longest_ms: u64,
    /// With --budget: how long a refused stream waits before it asks again (ms).
    #[arg(long, default_value_t = 100)]
    budget_retry_ms: u64,
    /// With --budget: charge each request's max_tokens through Envoy's
    /// RateLimitService when it starts and give back what it did not use
    /// when it ends (`is_negative_hits`), instead of check and charge.
    #[arg(long)]
    budget_refund: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum Pick {
    /// Uniformly at random.
    Uniform,
    /// In turn: 0, 1, 2, ... shared by all workers.
    RoundRobin,
}

fn parse_duration(text: &str) -> Result<Duration, String> {
    let ms = charon::config::duration::parse(text)?;
    if ms == charon::config::FOREVER || ms == 0 {
        return Err(format!("`{text}`: give a finite, non-zero duration"));
    }
    Ok(Duration::from_millis(ms))
}

/// Accepts only `http://` loopback targets.
fn check_target(target: &str) -> anyhow::Result<()> {
    let uri: tonic::codegen::http::Uri = target
        .parse()
        .with_context(|| format!("--target {target}: not a URI"))?;
    if uri.scheme_str() != Some("http") {
        bail!("--target {target}: only http:// (plaintext gRPC on loopback) is supported");
    }
    match uri.host() {
        Some("127.0.0.1" | "localhost" | "[::1]") => Ok(()),
        _ => bail!(
            "--target {target}: charon-load only targets loopback (127.0.0.1, localhost or [::1])"
        ),
    }
}

/// The command line as run, quoted for a shell where needed.
fn command_line() -> String {
    std::env::args()
        .enumerate()
        .map(|(i, arg)| {
            let arg = if i == 0 {
                "charon-load".to_owned()
            } else {
                arg
            };
            if !arg.is_empty()
                && arg
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || "-_./:=@[]".contains(c))
            {
                arg
            } else {
                format!("'{}'", arg.replace('\'', r"'\''"))
            }
        })
        .collect::<Vec<_>>()
        .join(" ")
}

async fn run(args: Args) -> anyhow::Result<bool> {
    // Several sidecars, comma-separated: connections take them in turn.
    let targets: Vec<&str> = args.target.split(',').collect();
    let mut endpoints = Vec::new();
    for target in &targets {
        check_target(target)?;
        let endpoint = Endpoint::from_shared(target.to_string())
            .with_context(|| format!("--target {target}: not a valid endpoint"))?
            .tcp_nodelay(true)
            .connect_timeout(Duration::from_secs(5));
        endpoints.push((target, endpoint));
    }
    let mut channels = Vec::new();
    for index in 0..args.connections {
        let (target, endpoint) = &endpoints[index as usize % endpoints.len()];
        let channel = endpoint.connect().await.with_context(|| {
            format!(
                "cannot connect to {target} (connection {} of {})",
                index + 1,
                args.connections
            )
        })?;
        channels.push(channel);
    }

    let tenants = if args.hot { 1 } else { args.tenants };
    let plan = Arc::new(Plan {
        values: (0..tenants)
            .map(|n| format!("{}{n}", args.prefix))
            .collect(),
        round_robin: AtomicU64::new(0),
        args: args.clone(),
    });

    println!("command: {}", command_line());
    if args.budget {
        println!(
            "settings: target {} domain {} streams {} budget {} per {:?}, {} whole windows, {}",
            args.target,
            args.domain,
            args.concurrency,
            args.budget_limit,
            args.budget_period,
            args.windows,
            if args.budget_reserve {
                "reserve max_tokens, commit the cost (Charon API)"
            } else if args.budget_refund {
                "charge max_tokens, give back the rest (Envoy's RateLimitService, is_negative_hits)"
            } else {
                "check, then charge (Envoy's RateLimitService)"
            }
        );
    } else {
        println!(
            "settings: target {} domain {} key {} tenants {} ({}) connections {} concurrency {} rate {} duration {:?} timeout {:?}",
            args.target,
            args.domain,
            args.key,
            if args.hot {
                format!("1, hot: {}0", args.prefix)
            } else {
                format!("{} as {}<N>", args.tenants, args.prefix)
            },
            match (args.hot, args.pick) {
                (true, _) => "always the same",
                (false, Pick::Uniform) => "uniform",
                (false, Pick::RoundRobin) => "round robin",
            },
            args.connections,
            args.concurrency,
            args.rate.map_or_else(
                || "closed loop".to_owned(),
                |rate| format!("{rate}/s open loop")
            ),
            args.duration,
            args.timeout,
        );
    }

    let seed = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64);
    if args.budget {
        let run = budget::Run {
            domain: args.domain.clone(),
            streams: args.concurrency,
            budget: args.budget_limit,
            period: args.budget_period,
            windows: args.windows,
            seed,
            durations: (
                args.budget_shortest_ms,
                args.budget_longest_ms.max(args.budget_shortest_ms),
            ),
            retry: Duration::from_millis(args.budget_retry_ms),
            way: if args.budget_reserve {
                budget::Way::Reserve
            } else if args.budget_refund {
                budget::Way::Refund
            } else {
                budget::Way::CheckThenCharge
            },
        };
        let report = budget::run(channels, run).await;
        for line in report.lines {
            println!("{line}");
        }
        println!("worst overshoot: {:+.1}%", report.worst_overshoot);
        return Ok(true);
    }
    let started = Instant::now();
    let deadline = tokio::time::Instant::now() + args.duration;
    let mut workers = Vec::new();
    if let Some(rate) = args.rate {
        // One pacer per connection, each sending its share of the rate.
        for index in 0..args.connections {
            let channel = channels[index as usize].clone();
            let seed = seed ^ index.wrapping_mul(0xA076_1D64_78BD_642F);
            let share = rate as f64 / args.connections as f64;
            workers.push(tokio::spawn(paced_worker(
                plan.clone(),
                channel,
                seed,
                deadline,
                share,
            )));
        }
    }
    for index in 0..args.concurrency * u64::from(args.rate.is_none()) {
        let channel = channels[(index % args.connections) as usize].clone();
        let seed = seed ^ index.wrapping_mul(0xA076_1D64_78BD_642F);
        if args.copies.is_some() {
            workers.push(tokio::spawn(copies_worker(
                plan.clone(),
                channel,
                seed,
                deadline,
            )));
        } else {
            workers.push(tokio::spawn(worker(plan.clone(), channel, seed, deadline)));
        }
    }
    let mut total = Tally::default();
    for worker in workers {
        match worker.await {
            Ok(tally) => total.merge(tally),
            Err(error) => total.error(format!("worker failed: {error}")),
        }
    }
    let elapsed = started.elapsed();

    let mut latencies = std::mem::take(&mut total.latencies);
    latencies.sort_unstable();
    let errors = total.error_count();
    let requests = total.ok + total.over_limit + total.other + errors;
    if let Some(resource) = &args.copies {
        println!(
            "mode: reserve + release pairs of `{resource}`, one session per worker (a request is one pair; OK: granted, OVER_LIMIT: rejected)"
        );
    }
    println!("requests: {requests}");
    println!(
        "errors: {errors}{}",
        if total.errors.is_empty() {
            String::new()
        } else {
            format!(
                " ({})",
                total
                    .errors
                    .iter()
                    .map(|(what, count)| format!("{what}: {count}"))
                    .collect::<Vec<_>>()
                    .join(", ")
            )
        }
    );
    println!(
        "answers: OK {} OVER_LIMIT {} other {}",
        total.ok, total.over_limit, total.other
    );
    println!(
        "throughput: {:.0} req/s over {:.2} s",
        requests as f64 / elapsed.as_secs_f64(),
        elapsed.as_secs_f64()
    );
    let max = latencies.last().copied().unwrap_or(0);
    println!(
        "latency: p50 {} p90 {} p99 {} p99.9 {} max {}",
        ms(percentile(&latencies, 0.50)),
        ms(percentile(&latencies, 0.90)),
        ms(percentile(&latencies, 0.99)),
        ms(percentile(&latencies, 0.999)),
        ms(max),
    );
    let client_cpu = own_cpu_seconds();
    if let Some(seconds) = client_cpu {
        println!("client cpu: {seconds:.2} s (this load tool's own)");
    }
    // One line for scripts (scripts/bench-ab.sh).
    let us = |nanos: u64| nanos / 1_000;
    println!(
        "summary: requests={requests} ok={} over_limit={} errors={errors} seconds={:.3} p50_us={} p99_us={} p999_us={} max_us={} client_cpu_s={:.2}",
        total.ok,
        total.over_limit,
        elapsed.as_secs_f64(),
        us(percentile(&latencies, 0.50)),
        us(percentile(&latencies, 0.99)),
        us(percentile(&latencies, 0.999)),
        us(max),
        client_cpu.unwrap_or(f64::NAN),
    );
    Ok(requests > errors)
}

fn main() -> ExitCode {
    let args = Args::parse();
    let mut builder = tokio::runtime::Builder::new_multi_thread();
    builder.enable_all();
    if let Some(threads) = args.threads {
        builder.worker_threads(threads.max(1));
    }
    let runtime = match builder.build() {
        Ok(runtime) => runtime,
        Err(error) => {
            eprintln!("error: cannot start the runtime: {error}");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(run(args)) {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => {
            eprintln!("error: no request got an answer");
            ExitCode::FAILURE
        }
        Err(error) => {
            eprintln!("error: {error:#}");
            ExitCode::from(2)
        }
    }
}
