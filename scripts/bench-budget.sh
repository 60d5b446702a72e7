#!/usr/bin/env bash
# Token budgets under concurrency (opt-in; not part of scripts/test.sh): a
# budget of 100 000 tokens a minute, 64 concurrent streams whose costs are
# log-normal (median 500, p95 about 2 500) and known only when each request
# ends, after 0.2 to 3 s; through Envoy's RateLimitService on one sidecar on
# one local Redis (src/bin/charon-load/budget.rs plays Envoy's two calls).
# Three ways, each over whole minutes:
#
#   check-then-charge  a fixed window with count_rejected: true, how
#                      envoyproxy/ratelimit counts a check (hits_addend 0)
#                      and a charge (hits_addend = cost);
#   after-response     cost: after_response, predicted admission;
#   reserve-commit     cost: after_response, each request's max_tokens (the
#                      smallest power of two its cost fits in) reserved
#                      through the Charon API's Cost call, the cost committed.
#
#   bash scripts/bench-budget.sh [WINDOWS]    (default 2 minutes per way)
set -euo pipefail
cd "$(dirname "$0")/.."
windows="${1:-2}"
# shellcheck source=scripts/bench-lib.sh
source scripts/bench-lib.sh

mkdir -p "$work/limits"
cat >"$work/limits/check-then-charge.yaml" <<'YAML'
domain: check-then-charge
descriptors:
  - key: generic_key
    value: tokens
    rate_limit: {unit: minute, requests_per_unit: 100000, count_rejected: true}
YAML
cat >"$work/limits/after-response.yaml" <<'YAML'
domain: after-response
descriptors:
  - key: generic_key
    value: tokens
    rate_limit: {unit: minute, requests_per_unit: 100000, cost: after_response, initial_cost: 1000}
YAML
sed 's/^domain: after-response/domain: reserve-commit/' "$work/limits/after-response.yaml" \
    >"$work/limits/reserve-commit.yaml"

grpc=$(free_port)
admin=$(free_port)
./target/dist/charon serve --config "$work/limits" --store "redis://127.0.0.1:$redis_port" \
    --store-timeout 1s --grpc-addr "127.0.0.1:$grpc" --admin-addr "127.0.0.1:$admin" 2>"$work/charon.log" &
pids+=("$!")
until curl -sf "127.0.0.1:$admin/readyz" >/dev/null; do sleep 0.1; done

for way in check-then-charge after-response reserve-commit; do
    echo "== $way ($windows whole minutes, 64 streams, budget 100 000 a minute)"
    reserve=()
    if [ "$way" = reserve-commit ]; then reserve=(--budget-reserve); fi
    ./target/dist/charon-load --budget --target "http://127.0.0.1:$grpc" --domain "$way" \
        --connections 4 --concurrency 64 --windows "$windows" "${reserve[@]}" | sed "s/^/   /"
done
echo "   degraded decisions: $(curl -s "127.0.0.1:$admin/metrics" | grep -E '^charon_store_degraded_decisions_total' | awk '{print $2}')"
