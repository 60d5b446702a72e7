#!/usr/bin/env bash
# Decisions per Redis core, by kind of limit (opt-in; not part of
# scripts/test.sh): one sidecar (pinned to core 0) on one local Redis
# (pinned to core 1, with charon-load), for a fixed window, a GCRA bucket,
# a sliding window and a burst-tier resource, each with limits it never
# reaches, in three shapes:
#
#   hot      one key, 60-s windows: every decision updates the same counter
#   hot-100k 100 000 keys, 60-s windows: counters stay in their window
#   churn    100 000 keys, 1-s windows: nearly every decision starts a window
#
# at 1 and 64 requests in flight. Per run: Redis's script time per
# decision (INFO commandstats, `evalsha` and `eval`: what the issue of
# Redis work per decision compares), Redis's whole CPU per decision
# (/proc/PID/stat: the script, the network and the command parsing), and
# decisions per Redis core (one second of Redis CPU over its CPU per
# decision). Everything on 127.0.0.1; every process stopped by PID.
#
#   bash scripts/bench-redis-kinds.sh [SECONDS]   (default 5 s per run)
#
# BENCH_KINDS="fixed gcra" and BENCH_SHAPES="hot churn" run only those.
set -euo pipefail
cd "$(dirname "$0")/.."
duration="${1:-5}"
# shellcheck source=scripts/bench-lib.sh
source scripts/bench-lib.sh
taskset -pc 1 "$redis_pid" >/dev/null

config() { # kind unit: a namespace whose one limit is never reached
    local kind=$1 unit=$2
    case "$kind" in
    fixed) printf 'domain: edge\ndescriptors:\n  - key: tenant\n    rate_limit: {unit: %s, requests_per_unit: 1000000000}\n' "$unit" ;;
    gcra) printf 'domain: edge\ndescriptors:\n  - key: tenant\n    rate_limit: {algorithm: gcra, unit: %s, requests_per_unit: 1000000000}\n' "$unit" ;;
    sliding) printf 'domain: edge\ndescriptors:\n  - key: tenant\n    rate_limit: {algorithm: sliding_window, unit: %s, requests_per_unit: 1000000000}\n' "$unit" ;;
    tiers)
        local window=1s
        [ "$unit" = minute ] && window=1m
        printf 'domain: edge\ndescriptors:\n  - key: tenant\n    resource: api\nresources:\n  api:\n    rate:\n      tiers:\n        - {limit: 1000000000, window: %s, active: forever}\n' "$window"
        ;;
    esac
}

redis_script_usec() {
    redis-cli -p "$redis_port" info commandstats |
        awk -F'[=,]' '/^cmdstat_(evalsha|eval):/ { usec += $4 } END { printf "%d", usec }'
}

run() { # kind shape inflight
    local kind=$1 shape=$2 inflight=$3 unit=minute tenants=100000
    case "$shape" in
    hot) tenants=1 ;;
    churn) unit=second ;;
    esac
    config "$kind" "$unit" >"$work/$kind-$unit.yaml"
    redis-cli -p "$redis_port" flushall >/dev/null
    local grpc admin
    grpc=$(free_port)
    admin=$(free_port)
    taskset -c 0 ./target/dist/charon serve --config "$work/$kind-$unit.yaml" \
        --store "redis://127.0.0.1:$redis_port" \
        --grpc-addr "127.0.0.1:$grpc" --admin-addr "127.0.0.1:$admin" 2>"$work/charon.log" &
    local charon_pid=$!
    pids+=("$charon_pid")
    until curl -sf "127.0.0.1:$admin/readyz" >/dev/null; do sleep 0.1; done
    local connections=4
    [ "$inflight" = 1 ] && connections=1
    # Warm up (connections, scripts loaded, keys made), then measure.
    taskset -c 1 ./target/dist/charon-load --target "http://127.0.0.1:$grpc" --threads 1 \
        --connections "$connections" --concurrency "$inflight" --tenants "$tenants" \
        --duration 1s >/dev/null
    redis-cli -p "$redis_port" config resetstat >/dev/null
    local redis_cpu_before script_before summary
    redis_cpu_before=$(cpu_seconds "$redis_pid")
    script_before=$(redis_script_usec)
    summary=$(taskset -c 1 ./target/dist/charon-load --target "http://127.0.0.1:$grpc" --threads 1 \
        --connections "$connections" --concurrency "$inflight" --tenants "$tenants" \
        --duration "${duration}s" | grep '^summary:')
    local redis_cpu script
    redis_cpu=$(minus "$(cpu_seconds "$redis_pid")" "$redis_cpu_before")
    script=$(($(redis_script_usec) - script_before))
    # Decisions made without Redis (its deadline missed, the breaker open):
    # they cost Redis nothing, so a run with many says little of Redis.
    local degraded
    degraded=$(curl -s "127.0.0.1:$admin/metrics" |
        awk '/^charon_store_degraded_decisions_total/ { n += $2 } END { printf "%d", n }')
    kill "$charon_pid"
    wait "$charon_pid" 2>/dev/null || true
    echo "$summary" | awk -v kind="$kind" -v shape="$shape" -v inflight="$inflight" \
        -v cpu="$redis_cpu" -v script="$script" -v degraded="$degraded" '{
        for (i = 2; i <= NF; i++) { split($i, kv, "="); f[kv[1]] = kv[2] }
        answers = f["ok"] + f["over_limit"]
        cpu_us = cpu * 1e6 / answers
        printf "| %s | %s | %s | %.0f | %.2f | %.2f | %.0f | %d | %d |\n", kind, shape, inflight,
            f["requests"] / f["seconds"], script / answers, cpu_us, 1e6 / cpu_us, f["errors"] + f["over_limit"], degraded
    }'
}

echo "== $(git rev-parse --short HEAD)$(git diff --quiet || echo '+changes'), $(redis-server --version | awk '{print $3}'), ${duration} s per run"
echo "| kind | shape | in flight | decisions/s | Redis script µs/decision | Redis CPU µs/decision | decisions per Redis core | errors or refusals | degraded (no Redis) |"
echo "| --- | --- | --- | --- | --- | --- | --- | --- | --- |"
for kind in ${BENCH_KINDS:-fixed gcra sliding tiers}; do
    for shape in ${BENCH_SHAPES:-hot hot-100k churn}; do
        for inflight in 1 64; do
            run "$kind" "$shape" "$inflight"
        done
    done
done
