//! What the configuration API costs (docs/configuration-api.md).
//!
//! - `rebuild/10k_overrides`: applying one change with 10⁴ per-domain
//!   overrides configured. A change rebuilds the whole configuration (files
//!   plus every API object, compiled and swapped in at once), so this is the
//!   cost of one delta, paid once per change on every sidecar, off the
//!   request path (a blocking task).
//! - `snapshot/apply_and_overlay_10k`: a sidecar's bookkeeping for one
//!   change: applying it to its snapshot and producing the overlay to load.
//! - `decision/quiet` and `decision/while_changes_stream`: one fixed-window
//!   decision on the memory store, with no change, and while another thread
//!   swaps the configuration in ten times a second: the swap is one atomic
//!   pointer store, so the two should not differ.
//!
//! Run: `cargo bench --bench config_api -- --warm-up-time 1 --measurement-time 3`

mod support;

use std::hint::black_box;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use charon::clock::ManualClock;
use charon::config::load_with_overlay;
use charon::config::overlay::Overlay;
use charon::config::{LoadOptions, load_str};
use charon::limiter::{Descriptor, Limiter, RateLimitRequest};
use charon::store::MemoryStore;
use charon::store::config_log::{Change, ObjectPath, Snapshot};
use criterion::{Criterion, criterion_group, criterion_main};

use self::support::ready;

const CONFIG: &str = "
domain: shop
descriptors:
  - key: tenant
    rate_limit: {unit: hour, requests_per_unit: 1000000000}
resources:
  api:
    rate:
      tiers:
        - {limit: 100, window: 1s, active: forever}
";

const DOMAINS: usize = 10_000;

fn override_body(i: usize) -> String {
    format!("{{tiers: [{{limit: {}, window: 1s}}]}}", 100 + i % 50)
}

fn bench_rebuild(c: &mut Criterion) {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let path = dir.path().join("shop.yaml");
    std::fs::write(&path, CONFIG).expect("the config is written");
    let mut overlay = Overlay::default();
    for i in 0..DOMAINS {
        overlay.set_override("shop", "api", &format!("d{i}"), Some(override_body(i)));
    }
    let loaded = load_with_overlay(&path, LoadOptions::default(), &[], &overlay).expect("loads");
    assert!(
        loaded
            .notes
            .iter()
            .all(|note| !note.message.contains("skipped"))
    );
    let mut group = c.benchmark_group("rebuild");
    group.sample_size(10);
    group.bench_function("10k_overrides", |b| {
        b.iter(|| {
            load_with_overlay(&path, LoadOptions::default(), &[], black_box(&overlay))
                .expect("loads")
        })
    });
    group.finish();

    let mut snapshot = Snapshot::default();
    for i in 0..DOMAINS {
        snapshot.apply(&change(i as u64 + 1, i));
    }
    let mut next = DOMAINS as u64;
    c.bench_function("snapshot/apply_and_overlay_10k", |b| {
        b.iter(|| {
            next += 1;
            snapshot.apply(&change(next, 7));
            black_box(snapshot.overlay())
        })
    });
}

fn change(version: u64, domain: usize) -> Change {
    Change {
        version,
        at_ms: 0,
        who: "bench".into(),
        path: ObjectPath::Override {
            namespace: "shop".into(),
            resource: "api".into(),
            domain: format!("d{domain}"),
        },
        body: Some(override_body(domain)),
    }
}

fn bench_decisions(c: &mut Criterion) {
    let clock = ManualClock::new(1_767_225_600_000);
    let config = load_str(CONFIG, "shop.yaml").expect("loads").config;
    let other = load_str(&CONFIG.replace("limit: 100,", "limit: 200,"), "shop.yaml")
        .expect("loads")
        .config;
    let limiter = Arc::new(Limiter::new(
        config.clone(),
        MemoryStore::with_clock(clock.clone()),
    ));
    let request = RateLimitRequest::new("shop", vec![Descriptor::new([("tenant", "t1")])]);
    let mut group = c.benchmark_group("decision");
    group.bench_function("quiet", |b| {
        b.iter(|| {
            clock.advance(1);
            ready(limiter.should_rate_limit(black_box(request.clone()))).expect("decided")
        })
    });
    let stop = Arc::new(AtomicBool::new(false));
    let swapper = {
        let (limiter, stop) = (limiter.clone(), stop.clone());
        std::thread::spawn(move || {
            let mut flip = false;
            while !stop.load(Ordering::Relaxed) {
                flip = !flip;
                limiter.replace_config(if flip { other.clone() } else { config.clone() });
                std::thread::sleep(Duration::from_millis(100));
            }
        })
    };
    group.bench_function("while_changes_stream", |b| {
        b.iter(|| {
            clock.advance(1);
            ready(limiter.should_rate_limit(black_box(request.clone()))).expect("decided")
        })
    });
    stop.store(true, Ordering::Relaxed);
    let _ = swapper.join();
    group.finish();
}

criterion_group!(benches, bench_rebuild, bench_decisions);
criterion_main!(benches);
