//! Several token budgets on one request behind a real Envoy
//! (examples/envoy/token-budget-several.yaml): a user's, an organisation's
//! and a model's, each charged the request's `x-max-tokens` when it starts
//! and given back what it did not use when it ends. One budget that cannot
//! pay refuses the request and charges none of the others; each budget's
//! refund is its own.

use std::fs;
use std::time::Duration;

use axum::http::HeaderMap;

use super::envoy_e2e::manifest_dir;
use super::token_budget::Budget;

/// Time for the refunds, sent when a stream ends, to land before the next
/// request's charge.
const REFUND_LANDS: Duration = Duration::from_millis(300);

/// Uses `x-use-tokens` of the request's `x-max-tokens` and says what is
/// left of the maximum.
async fn llm(headers: HeaderMap) -> ([(&'static str, String); 1], &'static str) {
    let number = |name: &str| {
        headers
            .get(name)
            .and_then(|value| value.to_str().ok()?.parse::<u64>().ok())
            .unwrap_or(0)
    };
    let max = number("x-max-tokens");
    let spent = number("x-use-tokens").min(max);
    ([("x-unused-tokens", (max - spent).to_string())], "answered")
}

#[tokio::test(flavor = "multi_thread")]
async fn one_budget_that_cannot_pay_charges_none_and_each_gets_its_own_refund() {
    let limits =
        fs::read_to_string(manifest_dir().join("examples/envoy/token-budget-several-limits.yaml"))
            .expect("read examples/envoy/token-budget-several-limits.yaml");
    let app = axum::Router::new().fallback(llm);
    let budget = Budget::start_on("token-budget-several.yaml", &limits, &[], app, "5s").await;
    // Budgets: users 20 000, the organisation 50 000, models 30 000.
    let mut statuses = Vec::new();
    for (user, model, max, use_) in [
        // ann uses 3 000 of 8 000: each of her three budgets is charged
        // 8 000 and given 5 000 back.
        ("ann", "big", 8_000, 3_000),
        // ann has 17 000 left: 17 001 is refused, on all three.
        ("ann", "big", 17_001, 0),
        // 17 000 fits exactly (and is all given back).
        ("ann", "big", 17_000, 0),
        // The model has 27 000 left, had the refused request charged it
        // 17 001 it would have 9 999: bob's 19 000 fits.
        ("bob", "big", 19_000, 19_000),
        // The organisation has 28 000 left (10 999 had it been charged).
        ("carol", "small", 20_000, 0),
        // The model big has 8 000 left, exactly.
        ("dave", "big", 8_001, 0),
        ("dave", "big", 8_000, 8_000),
    ] {
        let headers = [
            ("x-user", user.to_owned()),
            ("x-org", "acme".to_owned()),
            ("x-model", model.to_owned()),
            ("x-max-tokens", max.to_string()),
            ("x-use-tokens", use_.to_string()),
        ];
        statuses.push(budget.request_with(&headers).await);
        tokio::time::sleep(REFUND_LANDS).await;
    }
    assert_eq!(statuses, [200, 429, 200, 200, 200, 429, 200]);
}
