//! The multi-region benchmark of global limits (`scripts/bench-regions.sh`,
//! docs/design.md#global-limits): a root, three regions leasing from it
//! through a proxy that delays every byte by `--between-regions` (100 ms),
//! and a leaf sidecar per region leasing from its region through one that
//! delays by `--inside-region` (1 ms), all on the memory store, all the
//! `charon` binary given. Every server loads the same file: a global limit
//! of `--capacity` requests a second, and a plain (local) limit to compare
//! latencies with.
//!
//! Poisson load on each leaf, on this machine only, in phases:
//!
//! 1. steady over capacity: demands 50 %, 50 % and 10 % of the capacity
//!    (`--demands`; below 100 % in all, what is refused while the limit
//!    has room);
//! 2. a shift: the third region's demand goes to 100 % (10× by default);
//! 3. the root cut off (its proxy stalls every connection) for `--cut`;
//! 4. healed.
//!
//! It prints, per phase, what was admitted in each second as a share of the
//! capacity (the steady state's worst and the shift's), the utilisation
//! (admitted over what could be, `min(demand, capacity)`) and what the
//! leaves' shares add up to meanwhile (below the capacity while a share
//! given back waits for another server's round), the seconds the
//! shares took to settle after the shift (each region within 10 % of its
//! fair share), the p99 of a global decision against a local one on the
//! same leaf (what the global limit adds on the request path), and with the
//! root cut off: when the leaves' grants ran out and what was admitted
//! after, and the recovery once it is back.
//!
//! ```text
//! cargo run --release --example regions -- --charon target/release/charon
//! ```

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use anyhow::Context;
use clap::Parser;
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::Entry;
use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitRequest;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::Code;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::time::Instant;
use tonic::transport::Channel;

#[derive(Parser)]
struct Args {
    /// The charon binary.
    #[arg(long, default_value = "target/release/charon")]
    charon: PathBuf,
    /// The global limit, requests a second.
    #[arg(long, default_value_t = 300)]
    capacity: u64,
    /// Each steady phase, in seconds.
    #[arg(long, default_value_t = 20)]
    phase: u64,
    /// How long the root is cut off, in seconds (its leases last 10).
    #[arg(long, default_value_t = 20)]
    cut: u64,
    /// The delay between a region and the root, in ms.
    #[arg(long, default_value_t = 100)]
    between_regions: u64,
    /// The delay between a leaf and its region, in ms.
    #[arg(long, default_value_t = 1)]
    inside_region: u64,
    /// How often the regions renew their shares from the root
    /// (`--global-refresh-interval` of the root), in ms: the root has few
    /// clients, so it can answer them often. 0: the server's default
    /// (500 ms), and no flag, for a `charon` from before the flag.
    #[arg(long, default_value_t = 200)]
    root_refresh: u64,
    /// How often the leaves renew theirs from their region (the regions'
    /// `--global-refresh-interval`), in ms: what convergence is counted in.
    /// 0: as for `--root-refresh`.
    #[arg(long, default_value_t = 500)]
    region_refresh: u64,
    /// Local (not global) requests a second on each leaf, for the latency
    /// compared with.
    #[arg(long, default_value_t = 50)]
    local_rate: u64,
    #[arg(long, default_value_t = 7)]
    seed: u64,
    /// The three regions' demands in the steady phase, in percent of the
    /// capacity (the shift takes the third to 100 %). Below 100 in all,
    /// the steady phase shows what is refused while the limit has room.
    #[arg(long, value_delimiter = ',', default_values_t = [50, 50, 10])]
    demands: Vec<u64>,
}

const LIMITS: &str = "
domain: api
descriptors:
  - key: route
    value: search
    rate_limit: {unit: second, requests_per_unit: CAPACITY, global: true}
  - key: route
    value: local
    rate_limit: {unit: second, requests_per_unit: 1000000}
";

/// A `charon serve`, stopped by its pid when dropped.
struct Server {
    child: Child,
    grpc: u16,
    admin: u16,
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn free_port() -> anyhow::Result<u16> {
    let listener = std::net::TcpListener::bind("127.0.0.1:0")?;
    Ok(listener.local_addr()?.port())
}

fn serve(charon: &Path, dir: &Path, name: &str, extra: &[String]) -> anyhow::Result<Server> {
    let (grpc, admin) = (free_port()?, free_port()?);
    let log = std::fs::File::create(dir.join(format!("{name}.log")))?;
    let child = Command::new(charon)
        .arg("serve")
        .arg("--config")
        .arg(dir.join("limits.yaml"))
        .args(["--grpc-addr", &format!("127.0.0.1:{grpc}")])
        .args(["--admin-addr", &format!("127.0.0.1:{admin}")])
        .args(["--store", "memory"])
        .args(extra)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(log)
        .spawn()
        .with_context(|| format!("starting {}", charon.display()))?;
    Ok(Server { child, grpc, admin })
}

async fn connect(port: u16) -> anyhow::Result<RateLimitServiceClient<Channel>> {
    let began = Instant::now();
    loop {
        match RateLimitServiceClient::connect(format!("http://127.0.0.1:{port}")).await {
            Ok(client) => return Ok(client),
            Err(_) if began.elapsed() < Duration::from_secs(20) => {
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            Err(error) => return Err(error.into()),
        }
    }
}

/// A TCP proxy to `upstream` that holds every chunk `delay` before passing
/// it on (in order), and while `cut` is set moves nothing at all.
async fn delaying_proxy(
    upstream: u16,
    delay: Duration,
    cut: Arc<AtomicBool>,
) -> anyhow::Result<u16> {
    let listener = TcpListener::bind("127.0.0.1:0").await?;
    let port = listener.local_addr()?.port();
    tokio::spawn(async move {
        while let Ok((inbound, _)) = listener.accept().await {
            let cut = cut.clone();
            tokio::spawn(async move {
                let Ok(outbound) = TcpStream::connect(("127.0.0.1", upstream)).await else {
                    return;
                };
                let _ = inbound.set_nodelay(true);
                let _ = outbound.set_nodelay(true);
                let (ri, wi) = inbound.into_split();
                let (ro, wo) = outbound.into_split();
                tokio::join!(pipe(ri, wo, delay, cut.clone()), pipe(ro, wi, delay, cut));
            });
        }
    });
    Ok(port)
}

async fn pipe(
    mut from: tokio::net::tcp::OwnedReadHalf,
    mut to: tokio::net::tcp::OwnedWriteHalf,
    delay: Duration,
    cut: Arc<AtomicBool>,
) {
    let (sender, mut receiver) = tokio::sync::mpsc::unbounded_channel::<(Instant, Vec<u8>)>();
    let writer = tokio::spawn(async move {
        while let Some((due, chunk)) = receiver.recv().await {
            tokio::time::sleep_until(due).await;
            while cut.load(Ordering::Relaxed) {
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            if to.write_all(&chunk).await.is_err() {
                return;
            }
        }
    });
    let mut buffer = vec![0u8; 64 * 1024];
    loop {
        match from.read(&mut buffer).await {
            Ok(0) | Err(_) => break,
            Ok(read) => {
                if sender
                    .send((Instant::now() + delay, buffer[..read].to_vec()))
                    .is_err()
                {
                    break;
                }
            }
        }
    }
    drop(sender);
    let _ = writer.await;
}

/// What one leaf's load recorded.
#[derive(Default)]
struct Record {
    /// Global requests admitted, by the second they were decided in (the
    /// middle of the call: the leaves' windows are seconds of the same
    /// clock, and a request decided at a window's end may be answered in
    /// the next second).
    admitted: BTreeMap<u64, u64>,
    /// Global requests sent, by second.
    sent: BTreeMap<u64, u64>,
    /// Latencies (µs) of global and local decisions, by second.
    global_us: Vec<(u64, u64)>,
    local_us: Vec<(u64, u64)>,
}

fn epoch_second() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |now| now.as_secs())
}

/// The second of the middle of a call that took `took` and just ended.
fn decided_second(took: Duration) -> u64 {
    (SystemTime::now() - took / 2)
        .duration_since(UNIX_EPOCH)
        .map_or(0, |now| now.as_secs())
}

fn request(route: &str) -> RateLimitRequest {
    RateLimitRequest {
        domain: "api".into(),
        descriptors: vec![RateLimitDescriptor {
            entries: vec![Entry {
                key: "route".into(),
                value: route.into(),
            }],
            ..Default::default()
        }],
        hits_addend: 0,
    }
}

/// Poisson arrivals at `rate` a second (read at every arrival) on `client`,
/// each answered in its own task, until `stop`.
fn poisson(
    client: RateLimitServiceClient<Channel>,
    route: &'static str,
    rate: Arc<AtomicU64>,
    record: Arc<Mutex<Record>>,
    stop: Arc<AtomicBool>,
    seed: u64,
) {
    tokio::spawn(async move {
        let mut state = seed;
        let mut next = Instant::now();
        while !stop.load(Ordering::Relaxed) {
            let per_second = rate.load(Ordering::Relaxed) as f64;
            if per_second <= 0.0 {
                tokio::time::sleep(Duration::from_millis(20)).await;
                next = Instant::now();
                continue;
            }
            // splitmix64, then an exponential gap.
            state = state.wrapping_add(0x9E37_79B9_7F4A_7C15);
            let mut z = state;
            z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
            let uniform = ((z ^ (z >> 31)) >> 11) as f64 / (1u64 << 53) as f64;
            next += Duration::from_secs_f64(-(1.0 - uniform).ln() / per_second);
            tokio::time::sleep_until(next).await;
            let mut client = client.clone();
            let record = record.clone();
            tokio::spawn(async move {
                let sent = Instant::now();
                let answer = client.should_rate_limit(request(route)).await;
                let took = sent.elapsed();
                let micros = u64::try_from(took.as_micros()).unwrap_or(u64::MAX);
                let second = epoch_second();
                let decided = decided_second(took);
                let admitted =
                    answer.is_ok_and(|answer| answer.into_inner().overall_code == Code::Ok as i32);
                let mut record = record
                    .lock()
                    .unwrap_or_else(|poisoned| poisoned.into_inner());
                if route == "local" {
                    record.local_us.push((second, micros));
                } else {
                    *record.sent.entry(second).or_default() += 1;
                    record.global_us.push((second, micros));
                    if admitted {
                        *record.admitted.entry(decided).or_default() += 1;
                    }
                }
            });
        }
    });
}

fn percentile(mut values: Vec<u64>, p: f64) -> f64 {
    if values.is_empty() {
        return f64::NAN;
    }
    values.sort_unstable();
    let index = ((values.len() as f64 - 1.0) * p).round() as usize;
    values[index.min(values.len() - 1)] as f64 / 1000.0
}

/// What the three leaves admitted, each second of `from..to`.
fn admitted(records: &[Arc<Mutex<Record>>], from: u64, to: u64) -> Vec<[u64; 3]> {
    (from..to)
        .map(|second| {
            let mut row = [0u64; 3];
            for (slot, record) in row.iter_mut().zip(records) {
                let record = record
                    .lock()
                    .unwrap_or_else(|poisoned| poisoned.into_inner());
                *slot = record.admitted.get(&second).copied().unwrap_or(0);
            }
            row
        })
        .collect()
}

fn sent(records: &[Arc<Mutex<Record>>], from: u64, to: u64) -> u64 {
    records
        .iter()
        .map(|record| {
            let record = record
                .lock()
                .unwrap_or_else(|poisoned| poisoned.into_inner());
            record.sent.range(from..to).map(|(_, n)| n).sum::<u64>()
        })
        .sum()
}

fn latencies(records: &[Arc<Mutex<Record>>], from: u64, to: u64, local: bool) -> Vec<u64> {
    records
        .iter()
        .flat_map(|record| {
            let record = record
                .lock()
                .unwrap_or_else(|poisoned| poisoned.into_inner());
            let list = if local {
                &record.local_us
            } else {
                &record.global_us
            };
            list.iter()
                .filter(|(second, _)| (from..to).contains(second))
                .map(|(_, micros)| *micros)
                .collect::<Vec<_>>()
        })
        .collect()
}

/// Each leaf's share of the global limit (from its `/metrics`), every
/// 50 ms for `span`, with when it was read.
async fn watch_shares(admins: &[u16], span: Duration) -> Vec<(Instant, Vec<u64>)> {
    let began = Instant::now();
    let mut rows = vec![];
    while began.elapsed() < span {
        let mut row = Vec::with_capacity(admins.len());
        for &admin in admins {
            if let Some(share) = share_of(admin).await {
                row.push(share);
            }
        }
        rows.push((Instant::now(), row));
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    rows
}

/// A server's `charon_global_limit_share`, read with a bare HTTP/1.0 GET.
async fn share_of(admin: u16) -> Option<u64> {
    let mut stream = TcpStream::connect(("127.0.0.1", admin)).await.ok()?;
    stream
        .write_all(b"GET /metrics HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n")
        .await
        .ok()?;
    let mut text = String::new();
    stream.read_to_string(&mut text).await.ok()?;
    text.lines()
        .find(|line| line.starts_with("charon_global_limit_share{"))
        .and_then(|line| line.rsplit(' ').next())
        .and_then(|value| value.trim().parse().ok())
}

fn percent(n: u64, capacity: u64) -> f64 {
    100.0 * n as f64 / capacity as f64
}

fn summary(name: &str, rows: &[[u64; 3]], capacity: u64) {
    if std::env::var_os("REGIONS_ROWS").is_some() {
        println!("{name}: {rows:?}");
    }
    let totals: Vec<u64> = rows.iter().map(|row| row.iter().sum()).collect();
    let worst = totals.iter().copied().max().unwrap_or(0);
    let mean = totals.iter().sum::<u64>() as f64 / totals.len().max(1) as f64;
    println!(
        "{name}: admitted a second, mean {:.1} % of the capacity, worst {:.1} %; per region (last second) {:?}",
        100.0 * mean / capacity as f64,
        percent(worst, capacity),
        rows.last().copied().unwrap_or_default()
    );
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    anyhow::ensure!(
        args.demands.len() == 3,
        "--demands takes three percentages, one per region: {:?}",
        args.demands
    );
    let capacity = args.capacity;
    let temp = tempfile::tempdir()?;
    let dir = temp.path().to_path_buf();
    // REGIONS_KEEP: the servers' logs stay (at debug with
    // CHARON_LOG_LEVEL=charon=debug).
    if std::env::var_os("REGIONS_KEEP").is_some() {
        println!("logs in {}", temp.keep().display());
    }
    std::fs::write(
        dir.as_path().join("limits.yaml"),
        LIMITS.replace("CAPACITY", &capacity.to_string()),
    )?;
    let never = Arc::new(AtomicBool::new(false));
    let root_cut = Arc::new(AtomicBool::new(false));
    let refresh = |ms: u64| match ms {
        0 => vec![],
        ms => vec!["--global-refresh-interval".to_owned(), format!("{ms}ms")],
    };
    let root = serve(
        &args.charon,
        dir.as_path(),
        "root",
        &refresh(args.root_refresh),
    )?;
    connect(root.grpc).await?;
    let mut servers = vec![];
    let mut leaves = vec![];
    let mut leaf_admins = vec![];
    // A server named `name` leasing from `parent` through a proxy that
    // delays by `delay_ms` and stops moving while `cut` is set.
    let below =
        async |name: String, parent: u16, delay_ms: u64, cut: &Arc<AtomicBool>, refresh_ms: u64| {
            let proxy =
                delaying_proxy(parent, Duration::from_millis(delay_ms), cut.clone()).await?;
            let mut extra = vec![
                "--parent".into(),
                format!("http://127.0.0.1:{proxy}"),
                "--level-id".into(),
                name.clone(),
            ];
            extra.extend(refresh(refresh_ms));
            let server = serve(&args.charon, dir.as_path(), &name, &extra)?;
            let client = connect(server.grpc).await?;
            anyhow::Ok((server, client))
        };
    for region in 0..3 {
        let (parent, _) = below(
            format!("region-{region}"),
            root.grpc,
            args.between_regions,
            &root_cut,
            args.region_refresh,
        )
        .await?;
        let (leaf, client) = below(
            format!("leaf-{region}"),
            parent.grpc,
            args.inside_region,
            &never,
            args.region_refresh,
        )
        .await?;
        leaves.push(client);
        leaf_admins.push(leaf.admin);
        servers.push(parent);
        servers.push(leaf);
    }

    let stop = Arc::new(AtomicBool::new(false));
    let records: Vec<Arc<Mutex<Record>>> = (0..3).map(|_| Arc::default()).collect();
    let rates: Vec<Arc<AtomicU64>> = args
        .demands
        .iter()
        .map(|percent| Arc::new(AtomicU64::new(capacity * percent / 100)))
        .collect();
    for (index, client) in leaves.iter().enumerate() {
        let seed = args.seed.wrapping_mul(31).wrapping_add(index as u64);
        poisson(
            client.clone(),
            "search",
            rates[index].clone(),
            records[index].clone(),
            stop.clone(),
            seed,
        );
        poisson(
            client.clone(),
            "local",
            Arc::new(AtomicU64::new(args.local_rate)),
            records[index].clone(),
            stop.clone(),
            seed ^ 0xABCD,
        );
    }
    println!(
        "global limit {capacity}/s; delays {} ms between regions, {} ms inside; leases {} ms, refresh {} ms from the root, {} ms from a region",
        args.between_regions,
        args.inside_region,
        charon::config::global::LEASE_MS,
        args.root_refresh,
        args.region_refresh
    );

    // 1. Steady: by default over capacity, 50 % + 50 % + 10 % = 110 %.
    let began = epoch_second() + 1;
    let start_shares = watch_shares(&leaf_admins, Duration::from_secs(args.phase)).await;
    let steady_end = epoch_second();
    // The first seconds converge from the start; the last half is steady.
    let steady_from = steady_end - args.phase / 2;
    let steady = admitted(&records, steady_from, steady_end);
    let demand: u64 = args.demands.iter().sum();
    summary(&format!("steady ({demand} % demand)"), &steady, capacity);
    let admitted_steady = steady
        .iter()
        .map(|row| row.iter().sum::<u64>())
        .sum::<u64>();
    let utilisation = admitted_steady as f64 / (capacity * steady.len() as u64) as f64;
    if demand >= 100 {
        println!(
            "utilisation (admitted over capacity, demand above it): {:.1} %",
            100.0 * utilisation
        );
    }
    // Admitted by the second decided, sent by the second sent: a request
    // or two at the edges may fall on either side.
    let sent_steady = sent(&records, steady_from, steady_end);
    println!(
        "refused in the steady phase: {} of {sent_steady} sent ({:.1} %), {:.1} % of the capacity admitted",
        sent_steady.saturating_sub(admitted_steady),
        100.0 * sent_steady.saturating_sub(admitted_steady) as f64 / sent_steady.max(1) as f64,
        100.0 * utilisation
    );
    // What the shares add up to in the steady half: below the capacity
    // while a share given back waits for another server's next round.
    let steady_sums: Vec<u64> = start_shares[start_shares.len() / 2..]
        .iter()
        .filter(|(_, row)| row.len() == 3)
        .map(|(_, row)| row.iter().sum())
        .collect();
    if let (Some(least), false, true) = (
        steady_sums.iter().min(),
        steady_sums.is_empty(),
        demand >= 100,
    ) {
        println!(
            "steady shares add up to {:.1} of {capacity} on average (least {least}): {:.1} % in transit",
            steady_sums.iter().sum::<u64>() as f64 / steady_sums.len() as f64,
            100.0
                - 100.0 * steady_sums.iter().sum::<u64>() as f64
                    / (steady_sums.len() as u64 * capacity) as f64
        );
    }
    let startup = admitted(&records, began, steady_from);
    summary("start", &startup, capacity);

    // 2. The third region's demand to 100 % (×10 by default: 200 % in all).
    let shifted = epoch_second() + 1;
    rates[2].store(capacity, Ordering::Relaxed);
    let changed = Instant::now();
    let shares = watch_shares(&leaf_admins, Duration::from_secs(args.phase)).await;
    let shift_end = epoch_second();
    let shift = admitted(&records, shifted, shift_end);
    let shifted_demand = demand - args.demands[2] + 100;
    summary(
        &format!("shift ({shifted_demand} % demand)"),
        &shift,
        capacity,
    );
    let fair = capacity as f64 / 3.0;
    let settled = shift.windows(3).position(|three| {
        three
            .iter()
            .all(|row| row.iter().all(|&n| (n as f64 - fair).abs() <= 0.1 * fair))
    });
    let refresh_ms = match args.region_refresh {
        0 => charon::config::global::REFRESH_MS,
        ms => ms,
    };
    match settled {
        Some(seconds) => println!(
            "converged {seconds} s after the shift ({:.0} refresh intervals of {refresh_ms} ms): each region within 10 % of {fair:.0}/s for 3 s",
            (seconds * 1000) as f64 / refresh_ms as f64
        ),
        None => println!("did not converge within {} s", args.phase),
    }
    // The shares themselves, read from each leaf's metrics every 50 ms.
    let within = |row: &[u64]| {
        row.len() == 3
            && row
                .iter()
                .all(|&share| (share as f64 - fair).abs() <= 0.1 * fair)
    };
    let hold = Duration::from_secs(3);
    let last = shares.last().map_or(changed, |(at, _)| *at);
    let settled_at = shares.iter().position(|(at, row)| {
        within(row)
            && *at + hold <= last
            && shares
                .iter()
                .filter(|(later, _)| *later >= *at && *later < *at + hold)
                .all(|(_, row)| within(row))
    });
    if std::env::var_os("REGIONS_ROWS").is_some() {
        for (at, row) in &shares {
            println!(
                "share {:>5} ms {row:?}",
                at.saturating_duration_since(changed).as_millis()
            );
        }
    }
    match settled_at.map(|index| shares[index].0.saturating_duration_since(changed)) {
        Some(after) => println!(
            "shares settled {} ms after the demand changed ({:.1} refresh intervals of {refresh_ms} ms): each leaf's share within 10 % of {fair:.0} for 3 s",
            after.as_millis(),
            after.as_millis() as f64 / refresh_ms as f64
        ),
        None => println!("the shares did not settle within {} s", args.phase),
    }
    let late = admitted(&records, shift_end - args.phase / 2, shift_end);
    let late_util = late.iter().map(|row| row.iter().sum::<u64>()).sum::<u64>() as f64
        / (capacity * late.len() as u64) as f64;
    println!(
        "utilisation after the shift settled: {:.1} %",
        100.0 * late_util
    );
    let global = latencies(&records, began, shift_end, false);
    let local = latencies(&records, began, shift_end, true);
    println!(
        "decision latency p50/p99: global {:.3}/{:.3} ms, local {:.3}/{:.3} ms: the global limit adds {:.3} ms at p99",
        percentile(global.clone(), 0.5),
        percentile(global.clone(), 0.99),
        percentile(local.clone(), 0.5),
        percentile(local.clone(), 0.99),
        percentile(global, 0.99) - percentile(local, 0.99)
    );

    // 3. The root cut off.
    let cut_at = epoch_second() + 1;
    root_cut.store(true, Ordering::Relaxed);
    tokio::time::sleep(Duration::from_secs(args.cut)).await;
    let cut_end = epoch_second();
    let cut = admitted(&records, cut_at, cut_end);
    let over = cut
        .iter()
        .position(|row| row.iter().sum::<u64>() > capacity * 102 / 100);
    let totals: Vec<String> = cut
        .iter()
        .map(|row| format!("{:.0}", percent(row.iter().sum(), capacity)))
        .collect();
    println!(
        "root cut off: admitted a second (% of capacity) [{}]; within the limit for {} s (the grants' 10 s, then the regions' safe shares: by default their last grants, at most 100 % together)",
        totals.join(", "),
        over.map_or(cut.len(), |seconds| seconds)
    );

    // 4. Healed.
    let healed = epoch_second() + 1;
    root_cut.store(false, Ordering::Relaxed);
    tokio::time::sleep(Duration::from_secs(args.phase)).await;
    let heal_end = epoch_second();
    let after = admitted(&records, healed, heal_end);
    let back = after.windows(3).position(|three| {
        three
            .iter()
            .all(|row| row.iter().sum::<u64>() <= capacity * 102 / 100)
    });
    summary("healed", &after, capacity);
    match back {
        Some(seconds) => println!("back within the limit {seconds} s after the root returned"),
        None => println!("not back within the limit in {} s", args.phase),
    }
    println!(
        "requests sent: {} global in all",
        sent(&records, began, heal_end)
    );
    stop.store(true, Ordering::Relaxed);
    drop(servers);
    drop(root);
    Ok(())
}
