//! How the memory store grows and what a decision costs as it grows: bytes
//! per active key (a fixed window, a GCRA bucket, a sliding window counter,
//! a sliding log of 1, 8, 17, 32 and 128 instants, a hybrid limiter, a cost
//! budget, a 3-tier resource after one request and after 32), and the
//! limiter's time per decision at 1, 10⁴, 10⁶ and 10⁷ keys, at 1, 4 and 16
//! descriptors per request, at 1, 3 and 8 tiers, and on a sliding log.
//!
//! Bytes are counted by a global allocator that keeps a running total of
//! live heap bytes, plus the large tables the store maps outside it
//! ([`mapped_table_bytes`]), so the figure is the store's own, not the
//! process RSS. Every key is decided at one instant, so all are live.
//! Times: the median of 7 rounds of 200 000 decisions (fewer for 16
//! descriptors), each on a [`ManualClock`] moved 1 ms per decision, the
//! request built before the clock starts. Not part of the test suite:
//!
//! `cargo bench --bench growth` (a few minutes in release; 10⁷ keys need
//! about 2 GiB). With `PROBE_KEYS=N` in the environment it prints only the
//! time per decision at N fixed-window keys, three times (for A/B runs of
//! two builds' binaries); `PROBE_KEY=tiers3` (or another key of the
//! bench's configuration) probes that key instead.

mod support;

use std::alloc::{GlobalAlloc, Layout, System};
use std::hint::black_box;
use std::sync::atomic::{AtomicIsize, Ordering};
use std::time::Instant;

use charon::clock::ManualClock;
use charon::limiter::{Descriptor, Limiter, RateLimitRequest};
use charon::store::{MemoryStore, mapped_table_bytes};

use self::support::ready;

/// The system allocator, counting live bytes.
struct Counting;

static LIVE: AtomicIsize = AtomicIsize::new(0);

// SAFETY: forwards every call to `System` unchanged; only counts sizes.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        LIVE.fetch_add(layout.size() as isize, Ordering::Relaxed);
        // SAFETY: the caller's contract is passed on as is.
        unsafe { System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        LIVE.fetch_sub(layout.size() as isize, Ordering::Relaxed);
        // SAFETY: as above.
        unsafe { System.dealloc(ptr, layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        LIVE.fetch_add(
            new_size as isize - layout.size() as isize,
            Ordering::Relaxed,
        );
        // SAFETY: as above.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static ALLOCATOR: Counting = Counting;

/// 2026-01-01T00:00:00Z.
const START_MS: u64 = 1_767_225_600_000;

/// A fixed window, a GCRA bucket, and resources of 1, 3 and 8 tiers (each
/// tier's limit far above what one tenant sends, so every hit is granted
/// and recorded, the costly case).
fn config() -> charon::config::Config {
    let tiers = |n: usize| {
        (0..n)
            .map(|i| {
                let active = if i == 0 {
                    "forever".to_owned()
                } else {
                    "10s".to_owned()
                };
                format!(
                    "        - {{limit: {}, window: 1s, active: {active}, cooldown: 1m}}\n",
                    1_000_000 * (i + 1)
                )
            })
            .collect::<String>()
    };
    let yaml = format!(
        "domain: bench
descriptors:
  - key: tenant
    rate_limit: {{unit: hour, requests_per_unit: 1000000000}}
  - key: bucket
    rate_limit: {{algorithm: gcra, unit: second, requests_per_unit: 1000000, burst: 1000000}}
  - key: sliding
    rate_limit: {{algorithm: sliding_window, unit: hour, requests_per_unit: 1000000000}}
  - key: log
    rate_limit: {{algorithm: sliding_log, unit: hour, requests_per_unit: 10000}}
  - key: log1s
    rate_limit: {{algorithm: sliding_log, unit: second, requests_per_unit: 10000}}
  - key: hybrid
    rate_limit: {{algorithm: hybrid, unit: hour, requests_per_unit: 1000000}}
  - key: cost
    rate_limit: {{unit: hour, requests_per_unit: 1000000000, cost: after_response, initial_cost: 1}}
  - key: tiers1
    resource: t1
  - key: tiers3
    resource: t3
  - key: tiers8
    resource: t8
resources:
  t1:
    rate:
      tiers:
{}  t3:
    rate:
      hard_limit: 100000000
      global_limit: 1000000000
      tiers:
{}  t8:
    rate:
      tiers:
{}",
        tiers(1),
        tiers(3),
        tiers(8)
    );
    match charon::config::load_str(&yaml, "growth.yaml") {
        Ok(loaded) => loaded.config,
        Err(error) => panic!("the bench's config: {error}"),
    }
}

type Bench = Limiter<MemoryStore<ManualClock>>;

fn limiter(clock: &ManualClock) -> Bench {
    Limiter::new(
        config(),
        MemoryStore::with_clock(clock.clone()).with_max_keys(20_000_000),
    )
}

/// A request of `descriptors` descriptors on `key`, for tenants `first..`.
fn request(key: &str, first: usize, descriptors: usize) -> RateLimitRequest {
    RateLimitRequest::new(
        "bench",
        (first..first + descriptors)
            .map(|i| Descriptor::new([(key, format!("t{i}"))]))
            .collect(),
    )
}

/// Decides `request` a millisecond after the last one.
fn decide(limiter: &Bench, clock: &ManualClock, request: RateLimitRequest) {
    clock.advance(1);
    decide_now(limiter, request);
}

/// Decides `request` at the clock's time.
fn decide_now(limiter: &Bench, request: RateLimitRequest) {
    match ready(limiter.should_rate_limit(request)) {
        Ok(answer) => {
            black_box(answer);
        }
        Err(error) => panic!("the bench's request was refused: {error}"),
    }
}

/// Live heap bytes per key after `keys` tenants of `key` were seen once,
/// all at one instant: every key is still live when the heap is read
/// (a GCRA bucket or a tier's log would expire within the seconds that
/// 10^6 decisions a millisecond apart span, and be swept).
fn bytes_per_key(key: &str, keys: usize) -> f64 {
    bytes_per_key_of(key, keys, 1)
}

/// Live heap bytes per key after `keys` tenants of `key` were each seen
/// at `instants` instants a millisecond apart.
fn bytes_per_key_of(key: &str, keys: usize, instants: u64) -> f64 {
    let clock = ManualClock::new(START_MS);
    let limiter = limiter(&clock);
    decide_now(&limiter, request(key, 0, 1));
    let live = || LIVE.load(Ordering::Relaxed) + mapped_table_bytes() as isize;
    let before = live();
    for instant in 0..instants {
        if instant > 0 {
            clock.advance(1);
        }
        for tenant in 1..=keys {
            decide_now(&limiter, request(key, tenant, 1));
        }
    }
    let after = live();
    (after - before) as f64 / keys as f64
}

/// Median ns per decision of requests of `descriptors` descriptors on `key`,
/// cycling through `tenants` tenants (each seen once before measuring).
fn ns_per_decision(key: &str, tenants: usize, descriptors: usize) -> f64 {
    let clock = ManualClock::new(START_MS);
    let limiter = limiter(&clock);
    let groups = tenants.div_ceil(descriptors).max(1);
    for group in 0..groups {
        decide(
            &limiter,
            &clock,
            request(key, group * descriptors, descriptors),
        );
    }
    let per_round = (200_000 / descriptors).max(1);
    let mut rounds: Vec<f64> = (0..7)
        .map(|round| {
            let requests: Vec<RateLimitRequest> = (0..per_round)
                .map(|i| {
                    request(
                        key,
                        ((round * per_round + i) % groups) * descriptors,
                        descriptors,
                    )
                })
                .collect();
            let started = Instant::now();
            for request in requests {
                decide(&limiter, &clock, request);
            }
            started.elapsed().as_nanos() as f64 / per_round as f64
        })
        .collect();
    rounds.sort_by(f64::total_cmp);
    rounds[rounds.len() / 2]
}

fn main() {
    // `cargo bench` passes `--bench`; `cargo test --all-targets` does not, and
    // then a run at a thousandth of the sizes only shows that it works.
    let scale = if std::env::args().any(|arg| arg == "--bench") {
        1
    } else {
        1_000
    };
    if let Ok(keys) = std::env::var("PROBE_KEYS") {
        let keys: usize = keys.parse().unwrap_or(10_000);
        let key = std::env::var("PROBE_KEY").unwrap_or_else(|_| "tenant".to_owned());
        for _ in 0..3 {
            println!(
                "probe {key} {keys}: {:.0} ns",
                ns_per_decision(&key, keys, 1)
            );
        }
        return;
    }
    let million = 1_000_000 / scale;
    println!("bytes per active key, memory store, {million} keys (live heap and mapped tables)");
    for (kind, key) in [
        ("fixed window", "tenant"),
        ("GCRA bucket", "bucket"),
        ("sliding window counter", "sliding"),
        ("sliding log, one hit", "log"),
        ("hybrid quota-linear", "hybrid"),
        ("cost after response, one check", "cost"),
        ("3-tier resource, hard + global", "tiers3"),
    ] {
        println!("  {kind:32} {:8.0} B", bytes_per_key(key, million));
    }
    // Flat while a key logs at most 16 instants, boxed past that.
    for (kind, keys, instants) in [
        ("sliding log, 8 instants", million, 8),
        ("sliding log, 17 instants", million / 10, 17),
        ("sliding log, 32 instants", million / 10, 32),
        ("sliding log, 128 instants", million / 100, 128),
    ] {
        println!(
            "  {kind:32} {:8.0} B",
            bytes_per_key_of("log", keys, instants)
        );
    }
    // Each request a millisecond apart logs an instant in the first tier and
    // one in the hard limit's second: 64 instants for 32 requests.
    println!(
        "  {:32} {:8.0} B",
        "3-tier resource, 32 requests",
        bytes_per_key_of("tiers3", million / 10, 32)
    );
    if scale > 1 {
        println!("(a smoke run: `cargo bench --bench growth` measures)");
        return;
    }
    println!("limiter ns per decision, fixed window, by keys held");
    for keys in [1, 10_000, 1_000_000, 10_000_000] {
        println!(
            "  {keys:>9} keys {:10.0} ns",
            ns_per_decision("tenant", keys, 1)
        );
    }
    println!("limiter ns per decision, fixed window, 10^4 keys, by descriptors per request");
    for descriptors in [1, 4, 16] {
        println!(
            "  {descriptors:>2} descriptors {:10.0} ns",
            ns_per_decision("tenant", 10_000, descriptors)
        );
    }
    println!("limiter ns per decision, tier resource, 10^4 keys, by tiers");
    for (tiers, key) in [(1, "tiers1"), (3, "tiers3"), (8, "tiers8")] {
        println!(
            "  {tiers} tiers {:10.0} ns",
            ns_per_decision(key, 10_000, 1)
        );
    }
    println!("limiter ns per decision, sliding log, 10^4 keys");
    for (kind, key) in [
        ("1 s window (one instant)", "log1s"),
        ("1 h window (up to 140)", "log"),
    ] {
        println!("  {kind:26} {:10.0} ns", ns_per_decision(key, 10_000, 1));
    }
}
