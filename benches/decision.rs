//! What one decision costs, from the engine alone up to the limiter on the
//! memory store.
//!
//! Time comes from a [`ManualClock`] moved forward by 1 ms per decision, so
//! windows roll, tiers get entered and cool down, and slots expire the way
//! they would at 1 000 requests per second of simulated time, identically on
//! every run (no `clock_gettime` in the measurement either).
//!
//! Kinds:
//! - `fixed`: a fixed-window leaf (`tenant`, 10⁹ per hour: always granted).
//! - `gcra`: a GCRA leaf (`bucket`, 1 000 per second, bursts of 2 000): the
//!   hot tenant at 1 req/ms stays just within it.
//! - `tiers`: a 3-tier burst resource (`burst`) with a hard and a global
//!   limit; tier 1 is 1 000 per second, so the hot tenant, at 1 000 requests
//!   per simulated second, bursts into tiers 2 and 3 and is refused while they
//!   cool down (the mix is printed once before the measurement).
//!
//! Tenants: `hot` is one tenant; `100k` cycles through 100 000 precomputed
//! tenants, so the store holds a realistic map and each visit finds state
//! from 100 simulated seconds earlier.
//!
//! Limiter benchmarks poll the future once with a no-op waker: the memory
//! store's future is ready at once, so no runtime is measured. Building the
//! request (as the gRPC layer would) and dropping the answer are outside the
//! measurement (`iter_batched`).
//!
//! Run: `cargo bench --bench decision -- --warm-up-time 1 --measurement-time 3`

mod support;

use std::hint::black_box;
use std::sync::Arc;

use charon::clock::ManualClock;
use charon::config::{Config, RatePolicy, RateResource, Resource};
use charon::engine::{self, GcraItem, Item, Slot, SlotKind, TiersItem, WindowItem};
use charon::limiter::{Descriptor, Limiter, RateLimitRequest};
use charon::store::MemoryStore;
use criterion::{BatchSize, Criterion, criterion_group, criterion_main};

use self::support::ready;

const CONFIG: &str = r#"
domain: bench
descriptors:
  - key: tenant
    rate_limit: {unit: hour, requests_per_unit: 1000000000}
  - key: bucket
    rate_limit: {algorithm: gcra, unit: second, requests_per_unit: 1000, burst: 2000}
  - key: monthly
    rate_limit: {unit: month, requests_per_unit: 1000000000, calendar: {time_zone: Europe/Paris}}
  - key: burst
    resource: api
  - key: bucketed
    resource: uploads
resources:
  uploads:
    rate:
      hard_limit: 20000
      global_limit: 1000000
      gcra: {burst: 2000, count: 1000, period: 1s}
  api:
    rate:
      hard_limit: 20000
      global_limit: 1000000
      tiers:
        - {limit: 1000, window: 1s, active: forever}
        - {limit: 5000, window: 1s, active: 5s, cooldown: 15s}
        - {limit: 10000, window: 1s, active: 10s, cooldown: 60s}
"#;

const TENANTS: usize = 100_000;
/// 2026-01-01T00:00:00Z: a realistic epoch-ms magnitude.
const START_MS: u64 = 1_767_225_600_000;
/// The fixed-window leaf's period (unit: hour).
const HOUR_MS: u64 = 3_600_000;

fn config() -> Config {
    charon::config::load_str(CONFIG, "bench.yaml")
        .unwrap()
        .config
}

fn rate_resource(config: &Config, name: &str) -> Arc<RateResource> {
    match config.namespace("bench").unwrap().resources.get(name) {
        Some(Resource::Rate(rate)) => rate.clone(),
        _ => panic!("bench.yaml: `api` is not a rate resource"),
    }
}

fn requests(key: &str, count: usize) -> Vec<RateLimitRequest> {
    (0..count)
        .map(|i| RateLimitRequest::new("bench", vec![Descriptor::new([(key, format!("t{i}"))])]))
        .collect()
}

/// A limiter whose store reads `clock`, with every tenant seen once.
fn new_limiter(
    clock: &ManualClock,
    warm: &[RateLimitRequest],
) -> Limiter<MemoryStore<ManualClock>> {
    let limiter = Limiter::new(config(), MemoryStore::with_clock(clock.clone()));
    for request in warm {
        clock.advance(1);
        ready(limiter.should_rate_limit(request.clone())).unwrap();
    }
    limiter
}

fn bench_limiter(c: &mut Criterion) {
    let mut group = c.benchmark_group("limiter");
    for (kind, key) in [
        ("fixed", "tenant"),
        ("calendar", "monthly"),
        ("gcra", "bucket"),
        ("tiers", "burst"),
        ("gcra-resource", "bucketed"),
    ] {
        // One hot tenant.
        let clock = ManualClock::new(START_MS);
        let hot = requests(key, 1);
        let limiter = new_limiter(&clock, &hot);
        if kind == "tiers" {
            report_mix(&hot[0]);
        }
        group.bench_function(format!("{kind}/hot"), |b| {
            b.iter_batched(
                || hot[0].clone(),
                |request| {
                    clock.advance(1);
                    ready(limiter.should_rate_limit(black_box(request))).unwrap()
                },
                BatchSize::SmallInput,
            )
        });

        // 100 000 tenants, round robin.
        let clock = ManualClock::new(START_MS);
        let many = requests(key, TENANTS);
        let limiter = new_limiter(&clock, &many);
        let mut next = 0;
        group.bench_function(format!("{kind}/100k"), |b| {
            b.iter_batched(
                || {
                    next = (next + 1) % TENANTS;
                    many[next].clone()
                },
                |request| {
                    clock.advance(1);
                    ready(limiter.should_rate_limit(black_box(request))).unwrap()
                },
                BatchSize::SmallInput,
            )
        });
        eprintln!(
            "limiter/{kind}/100k: {} keys in the store at the end",
            limiter.store().len()
        );
    }
    group.finish();
}

/// Prints what share of the hot tenant's requests are granted over two
/// simulated minutes, so the `tiers/hot` number can be read for what it is.
fn report_mix(request: &RateLimitRequest) {
    let clock = ManualClock::new(START_MS);
    let limiter = new_limiter(&clock, &[]);
    let (mut ok, mut over) = (0u64, 0u64);
    for _ in 0..120_000 {
        clock.advance(1);
        if ready(limiter.should_rate_limit(request.clone()))
            .unwrap()
            .over_limit
        {
            over += 1;
        } else {
            ok += 1;
        }
    }
    eprintln!("limiter/tiers/hot: over 120 s at 1 req/ms: {ok} OK, {over} OVER_LIMIT");
}

fn bench_engine(c: &mut Criterion) {
    let config = config();
    let rate = rate_resource(&config, "api");
    let policy: &RatePolicy = rate.policy_for("t0");
    let uploads = rate_resource(&config, "uploads");
    let bucket_policy: &RatePolicy = uploads.policy_for("t0");
    let fixed = [Item::Window(WindowItem {
        slot: 0,
        limit: 1_000_000_000,
        period: HOUR_MS,
        hits: 1,
        shadow: false,
        count_rejected: false,
    })];
    let gcra = [Item::Gcra(GcraItem {
        slot: 0,
        limit: engine::GcraLimit {
            count: 1_000,
            period: 1_000,
            burst: 2_000,
        },
        hits: 1,
        shadow: false,
    })];
    let tiers = [Item::Tiers(TiersItem {
        slot: 0,
        global_slot: Some(1),
        policy,
        global_limit: rate.global_limit,
        copies: 1,
        min_copies: 1,
        check_only: false,
        shadow: false,
    })];
    let bucketed = [Item::Tiers(TiersItem {
        slot: 0,
        global_slot: Some(1),
        policy: bucket_policy,
        global_limit: uploads.global_limit,
        copies: 1,
        min_copies: 1,
        check_only: false,
        shadow: false,
    })];
    let mut group = c.benchmark_group("engine");
    for (kind, items, slots) in [
        ("fixed", &fixed[..], vec![Slot::new(SlotKind::Window)]),
        ("gcra", &gcra[..], vec![Slot::new(SlotKind::Gcra)]),
        (
            "tiers",
            &tiers[..],
            vec![Slot::new(SlotKind::Tiers), Slot::new(SlotKind::Log)],
        ),
        (
            "gcra-resource",
            &bucketed[..],
            vec![Slot::new(SlotKind::Tiers), Slot::new(SlotKind::Log)],
        ),
    ] {
        // One hot tenant: the same state every time.
        let mut hot = slots.clone();
        let mut now = START_MS;
        group.bench_function(format!("{kind}/hot"), |b| {
            b.iter(|| {
                now += 1;
                engine::decide(black_box(items), &mut hot, now)
            })
        });

        // 100 000 tenants: swap each tenant's state into slot 0 (the global
        // log, if any, stays shared in slot 1), as a store would hand it over.
        let mut states: Vec<Slot> = vec![slots[0].clone(); TENANTS];
        let mut batch = slots;
        let mut now = START_MS;
        let mut next = 0;
        group.bench_function(format!("{kind}/100k"), |b| {
            b.iter(|| {
                now += 1;
                next = (next + 1) % TENANTS;
                std::mem::swap(&mut batch[0], &mut states[next]);
                let decision = engine::decide(black_box(items), &mut batch, now);
                std::mem::swap(&mut batch[0], &mut states[next]);
                decision
            })
        });
    }
    group.finish();
}

criterion_group!(benches, bench_engine, bench_limiter);
criterion_main!(benches);
