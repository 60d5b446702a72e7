#!/usr/bin/env bash
# Token budgets under concurrency (opt-in; not part of scripts/test.sh): a
# budget of 100 000 tokens a minute, 64 concurrent streams whose costs are
# log-normal (median 500, p95 about 2 500) and known only when each request
# ends, after 0.2 to 3 s; through Envoy's RateLimitService on three sidecars
# sharing one local Redis, the streams spread over them
# (tools/charon-load/src/budget.rs plays Envoy's two calls).
# Three ways, each over whole minutes:
#
#   check-then-charge  a fixed window with count_rejected: true, how
#                      envoyproxy/ratelimit counts a check (hits_addend 0)
#                      and a charge (hits_addend = cost);
#   after-response     cost: after_response, predicted admission;
#   reserve-commit     cost: after_response, each request's max_tokens (the
#                      smallest power of two its cost fits in) reserved
#                      through the Charon API's Cost call, the cost committed;
#   charge-refund      a plain fixed window, each request's max_tokens
#                      charged through Envoy's call when it starts and the
#                      rest given back (is_negative_hits) when it ends, as
#                      examples/envoy/token-budget-exact.yaml has Envoy do.
#
#   bash scripts/bench-budget.sh [WINDOWS]    (default 2 minutes per way)
#
# BUDGET_WINDOW=20 makes the budget's window 20 s instead of a minute,
# BUDGET_WAYS="after-response" runs only those ways, and LOAD_ARGS="..." go
# to charon-load (--budget-shortest-ms, --budget-longest-ms,
# --budget-retry-ms shape the load: docs/performance.md#token-budgets-under-concurrency).
set -euo pipefail
cd "$(dirname "$0")/.."
windows="${1:-2}"
window_s="${BUDGET_WINDOW:-60}"
ways="${BUDGET_WAYS:-check-then-charge after-response reserve-commit charge-refund}"
read -r -a load_args <<<"${LOAD_ARGS:-}"
unit="unit: second, unit_multiplier: $window_s"
# shellcheck source=scripts/bench-lib.sh
source scripts/bench-lib.sh

mkdir -p "$work/limits"
cat >"$work/limits/check-then-charge.yaml" <<'YAML'
domain: check-then-charge
descriptors:
  - key: generic_key
    value: tokens
    rate_limit: {UNIT, requests_per_unit: 100000, count_rejected: true}
YAML
cat >"$work/limits/after-response.yaml" <<'YAML'
domain: after-response
descriptors:
  - key: generic_key
    value: tokens
    rate_limit: {UNIT, requests_per_unit: 100000, cost: after_response, initial_cost: 1000}
YAML
sed 's/^domain: after-response/domain: reserve-commit/' "$work/limits/after-response.yaml" \
    >"$work/limits/reserve-commit.yaml"
cat >"$work/limits/charge-refund.yaml" <<'YAML'
domain: charge-refund
descriptors:
  - key: generic_key
    value: tokens
    rate_limit: {UNIT, requests_per_unit: 100000}
YAML

sed -i "s/UNIT/$unit/" "$work"/limits/*.yaml

targets=()
admins=()
for sidecar in 1 2 3; do
    grpc=$(free_port)
    admin=$(free_port)
    ./target/dist/charon serve --config "$work/limits" --store "redis://127.0.0.1:$redis_port" \
        --store-timeout 1s --grpc-addr "127.0.0.1:$grpc" --admin-addr "127.0.0.1:$admin" \
        2>"$work/charon-$sidecar.log" &
    pids+=("$!")
    targets+=("http://127.0.0.1:$grpc")
    admins+=("$admin")
done
for admin in "${admins[@]}"; do
    until curl -sf "127.0.0.1:$admin/readyz" >/dev/null; do sleep 0.1; done
done
target=$(IFS=,; echo "${targets[*]}")

for way in $ways; do
    echo "== $way ($windows whole windows of $window_s s, 64 streams, budget 100 000 a window)"
    reserve=()
    if [ "$way" = reserve-commit ]; then reserve=(--budget-reserve); fi
    if [ "$way" = charge-refund ]; then reserve=(--budget-refund); fi
    ./target/dist/charon-load --budget --target "$target" --domain "$way" \
        --connections 6 --concurrency 64 --windows "$windows" --budget-period "${window_s}s" \
        "${reserve[@]}" "${load_args[@]}" | sed "s/^/   /"
done
for admin in "${admins[@]}"; do
    echo "   degraded decisions: $(curl -s "127.0.0.1:$admin/metrics" | grep -E '^charon_store_degraded_decisions_total' | awk '{print $2}')"
done
