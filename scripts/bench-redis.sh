#!/usr/bin/env bash
# The Redis store's load benchmark (opt-in; not part of scripts/test.sh):
# one sidecar on one local Redis, charon-load with 64 requests in flight, for
# a fixed window and a 3-tier resource (with and without a global limit), one
# hot tenant and 100 000 tenants; the CPU seconds of the sidecar and of Redis;
# and beside it redis-benchmark running EVALSHA of a trivial script, pipelined
# (-P 16) and not. Everything on 127.0.0.1, every process stopped by PID.
#
#   bash scripts/bench-redis.sh [SECONDS]    (default 10 s per run)
set -euo pipefail
cd "$(dirname "$0")/.."
duration="${1:-10}"
# shellcheck source=scripts/bench-lib.sh
source scripts/bench-lib.sh

echo "== redis-benchmark: EVALSHA of 'return 1', 64 clients"
sha=$(redis-cli -p "$redis_port" script load "return 1")
for pipeline in 1 16; do
    printf 'P=%-3s ' "$pipeline"
    redis-benchmark -p "$redis_port" -c 64 -n 400000 -P "$pipeline" -q evalsha "$sha" 0 | tr '\r' '\n' | tail -1
done

cat >"$work/tiers-no-global.yaml" <<'YAML'
domain: edge
descriptors:
  - key: tenant
    value: "bursty-*"
    resource: api
resources:
  api:
    rate:
      hard_limit: 20000
      tiers:
        - {limit: 1000, window: 1s, active: forever}
        - {limit: 5000, window: 1s, active: 5s, cooldown: 15s}
        - {limit: 10000, window: 1s, active: 10s, cooldown: 60s}
YAML

run() { # name config prefix load-args...
    local name=$1 config=$2 prefix=$3
    shift 3
    redis-cli -p "$redis_port" flushall >/dev/null
    local grpc admin
    grpc=$(free_port)
    admin=$(free_port)
    ./target/dist/charon serve --config "$config" --store "redis://127.0.0.1:$redis_port" \
        --grpc-addr "127.0.0.1:$grpc" --admin-addr "127.0.0.1:$admin" 2>"$work/charon.log" &
    local charon_pid=$!
    pids+=("$charon_pid")
    until curl -sf "127.0.0.1:$admin/readyz" >/dev/null; do sleep 0.1; done
    local charon_before redis_before
    charon_before=$(cpu_seconds "$charon_pid")
    redis_before=$(cpu_seconds "$redis_pid")
    echo "== $name"
    ./target/dist/charon-load --target "http://127.0.0.1:$grpc" --prefix "$prefix" \
        --connections 4 --concurrency 64 --duration "${duration}s" "$@" | grep -E "^(errors|answers|throughput|latency):" | sed "s/^/   /" || true
    echo "   CPU seconds over ${duration} s: sidecar $(minus "$(cpu_seconds "$charon_pid")" "$charon_before")," \
        "redis $(minus "$(cpu_seconds "$redis_pid")" "$redis_before")"
    echo "   degraded: $(curl -s "127.0.0.1:$admin/metrics" | grep -E '^charon_store_degraded_decisions_total' | awk '{print $2}')"
    kill "$charon_pid"
    wait "$charon_pid" 2>/dev/null || true
}

run "fixed window, one hot tenant" examples/bench/fixed.yaml tenant- --hot
run "fixed window, 100000 tenants" examples/bench/fixed.yaml tenant- --tenants 100000
run "GCRA, 100000 tenants" examples/bench/gcra.yaml tenant- --tenants 100000
run "3 tiers + H, one hot tenant" "$work/tiers-no-global.yaml" bursty- --hot
run "3 tiers + H, 100000 tenants" "$work/tiers-no-global.yaml" bursty- --tenants 100000
run "3 tiers + H + G, 100000 tenants" examples/bench/tiers.yaml bursty- --tenants 100000
