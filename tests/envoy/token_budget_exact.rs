//! An exact token budget behind a real Envoy
//! (examples/envoy/token-budget-exact.yaml): each request is charged its
//! `x-max-tokens` when it starts and given back what it did not use
//! (`is_negative_hits`, the upstream's `x-unused-tokens`) when it ends.
//! What the admitted requests used never passes the budget, and nearly all
//! of it is used.

use std::fs;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use axum::extract::State;
use axum::http::HeaderMap;

use super::envoy_e2e::manifest_dir;
use super::token_budget::Budget;

/// The budget of token-budget-exact-limits.yaml.
const BUDGET: u64 = 100_000;
/// Time for a refund, sent when a stream ends, to land before the next
/// request's charge.
const REFUND_LANDS: Duration = Duration::from_millis(300);

/// What the stand-in for an LLM proxy was asked to use, in all.
#[derive(Default)]
struct Used(AtomicU64);

/// Uses `x-use-tokens` of the request's `x-max-tokens` (after
/// `x-hold-ms`), and says what is left of the maximum.
async fn llm(
    State(used): State<Arc<Used>>,
    headers: HeaderMap,
) -> ([(&'static str, String); 1], &'static str) {
    let number = |name: &str| {
        headers
            .get(name)
            .and_then(|value| value.to_str().ok()?.parse::<u64>().ok())
            .unwrap_or(0)
    };
    let max = number("x-max-tokens");
    let spent = number("x-use-tokens").min(max);
    tokio::time::sleep(Duration::from_millis(number("x-hold-ms"))).await;
    used.0.fetch_add(spent, Ordering::SeqCst);
    ([("x-unused-tokens", (max - spent).to_string())], "answered")
}

async fn start() -> (Budget, Arc<Used>) {
    let limits =
        fs::read_to_string(manifest_dir().join("examples/envoy/token-budget-exact-limits.yaml"))
            .expect("read examples/envoy/token-budget-exact-limits.yaml");
    let used = Arc::new(Used::default());
    let app = axum::Router::new().fallback(llm).with_state(used.clone());
    // A generous deadline: a charge that times out fails open.
    let budget = Budget::start_on("token-budget-exact.yaml", &limits, &[], app, "5s").await;
    (budget, used)
}

fn ask(max: u64, use_: u64, hold_ms: u64) -> [(&'static str, String); 3] {
    [
        ("x-max-tokens", max.to_string()),
        ("x-use-tokens", use_.to_string()),
        ("x-hold-ms", hold_ms.to_string()),
    ]
}

#[tokio::test(flavor = "multi_thread")]
async fn a_request_is_admitted_only_if_its_maximum_fits_and_gives_back_the_rest() {
    let (budget, used) = start().await;
    let mut statuses = Vec::new();
    // Each uses 10 000 of a maximum of 40 000: seven fit (70 000 used), the
    // eighth's 40 000 does not; a maximum of 30 000 still does, once.
    for max in [40_000; 8].into_iter().chain([30_000, 30_000]) {
        statuses.push(budget.request_with(&ask(max, 10_000, 0)).await);
        tokio::time::sleep(REFUND_LANDS).await;
    }
    assert_eq!(
        statuses,
        [200, 200, 200, 200, 200, 200, 200, 429, 200, 429],
        "maxima of 40 000 then 30 000, each using 10 000, against 100 000"
    );
    assert_eq!(used.0.load(Ordering::SeqCst), 80_000);
    // Envoy sends no refund for a request the upstream never answered: its
    // format has no metadata to read (what the refund of a refused charge
    // would otherwise give back is nothing it was charged).
    let refunded = budget
        .metric("charon_limit_hits_total{namespace=\"ai\",limit=\"ai.generic_key_tokens\",outcome=\"refunded\"}")
        .await;
    assert_eq!(refunded, 8.0 * 30_000.0 - 10_000.0, "tokens given back");
}

#[tokio::test(flavor = "multi_thread")]
async fn concurrent_streams_never_pass_the_budget_and_use_nearly_all_of_it() {
    let (budget, used) = start().await;
    let budget = Arc::new(budget);
    // Sixteen streams, each asking with a maximum of 2 000 to 4 000 and
    // using a drawn part of it, held 50 to 250 ms, until refused ten times
    // in a row.
    let streams: Vec<_> = (0..16u64)
        .map(|stream| {
            let budget = budget.clone();
            tokio::spawn(async move {
                let mut seed = stream.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
                let mut draw = move |below: u64| {
                    seed ^= seed << 13;
                    seed ^= seed >> 7;
                    seed ^= seed << 17;
                    seed % below
                };
                let (mut admitted, mut refused_in_a_row) = (0u64, 0);
                while refused_in_a_row < 10 {
                    let max = 2_000 + draw(2_001);
                    let use_ = 100 + draw(max - 99);
                    match budget.request_with(&ask(max, use_, 50 + draw(200))).await {
                        200 => {
                            admitted += 1;
                            refused_in_a_row = 0;
                        }
                        429 => {
                            refused_in_a_row += 1;
                            tokio::time::sleep(Duration::from_millis(50)).await;
                        }
                        other => panic!("Envoy answered {other}"),
                    }
                }
                admitted
            })
        })
        .collect();
    let mut admitted = 0;
    for stream in streams {
        admitted += stream.await.expect("a stream");
    }
    let used = used.0.load(Ordering::SeqCst);
    assert!(
        used <= BUDGET,
        "the admitted requests used {used} tokens of a budget of {BUDGET}"
    );
    assert!(
        used * 10 >= BUDGET * 9,
        "only {used} of {BUDGET} tokens were used ({admitted} requests)"
    );
}
