//! What a request costs on a capacity lease (docs/design.md#capacity-leases):
//! the local limiter alone (`try_acquire`), and the Tower layer on a lease
//! over a bare handler, against the bare handler. Nothing reaches a sidecar
//! on this path: the lease is renewed in the background.
//!
//! Run: `cargo bench --bench lease -- --warm-up-time 1 --measurement-time 3`

mod support;

use std::hint::black_box;
use std::sync::Arc;

use charon::client::lease::LeaseLimiter;
use charon::layer::LeaseLimitLayer;
use criterion::{Criterion, criterion_group, criterion_main};
use tower::{Layer, Service};

use self::support::ready;

fn bench(c: &mut Criterion) {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .expect("a runtime");
    let _entered = runtime.enter();
    // A rate no benchmark reaches: every request passes.
    let limiter = Arc::new(LeaseLimiter::with_rate(1e12));
    c.bench_function("lease/try_acquire", |b| {
        b.iter(|| black_box(limiter.try_acquire(1)))
    });
    let handler = || {
        tower::service_fn(|_: http::Request<()>| async {
            Ok::<_, std::convert::Infallible>(http::Response::new(()))
        })
    };
    let mut bare = handler();
    c.bench_function("lease/bare_handler", |b| {
        b.iter(|| ready(bare.call(black_box(http::Request::new(())))))
    });
    let mut limited = LeaseLimitLayer::new(limiter.clone()).layer(handler());
    c.bench_function("lease/layer", |b| {
        b.iter(|| ready(limited.call(black_box(http::Request::new(())))))
    });
}

criterion_group!(benches, bench);
criterion_main!(benches);
