#!/usr/bin/env bash
# The reliability figures of docs/reliability.md (opt-in; not part of
# scripts/test.sh):
#
#  1. Over-grants: three sidecars on one Redis, then on a three-master Redis
#     Cluster, each loaded by its own charon-load (32 in flight) for SECONDS,
#     about 10^6 decisions in all, over 1 000 customers of a burst-tier
#     resource granting 100 an hour each. Every customer is asked ~1 000
#     times, so exactly 100 000 OK answers are right; more is an over-grant
#     (fewer, a lost grant). Answers decided by the fallback instead of Redis
#     are counted too (they would not be exact).
#  2. Leaked holds: ROUNDS rounds on two sidecars sharing one Redis (fast
#     membership timings): clients reserve and release copies on both, then
#     one client process and one sidecar are SIGKILLed, the other client too,
#     and the killed sidecar is started again; the copy log must be empty
#     within the heartbeat ttl plus the reap interval. Leaked = copies still
#     counted after 10 s.
#
#   bash scripts/reliability-figures.sh [SECONDS] [ROUNDS]   (defaults 40, 100)
#
# Everything on 127.0.0.1; every process stopped by PID.
set -euo pipefail
cd "$(dirname "$0")/.."
seconds="${1:-40}"
rounds="${2:-100}"
# shellcheck source=scripts/bench-lib.sh
source scripts/bench-lib.sh

cat >"$work/grants.yaml" <<'YAML'
domain: edge
descriptors:
  - key: customer
    resource: api
resources:
  api:
    rate:
      tiers:
        - {limit: 100, window: 1h, active: forever}
YAML
cat >"$work/copies.yaml" <<'YAML'
domain: edge
resources:
  pool:
    copies: {domain_limit: 5, global_limit: 1000}
YAML

# start_sidecar CONFIG STORE GRPC ADMIN [ARGS…]: appends its PID to pids.
start_sidecar() {
    local config=$1 store=$2 grpc=$3 admin=$4
    shift 4
    target/dist/charon serve --config "$config" --store "$store" \
        --grpc-addr "127.0.0.1:$grpc" --admin-addr "127.0.0.1:$admin" "$@" \
        >>"$work/sidecar-$grpc.log" 2>&1 &
    pids+=("$!")
    last_sidecar=$!
}
wait_ready() { until curl -sf "http://127.0.0.1:$1/readyz" | grep -q 'store reachable'; do sleep 0.1; done; }
wait_registered() { until curl -sf "http://127.0.0.1:$1/metrics" | grep -q '^charon_copy_log_registered 1'; do sleep 0.05; done; }
metric() { curl -sf "http://127.0.0.1:$1/metrics" | awk -v name="$2" '$1 == name { print $2 }'; }

over_grants() { # label store-url
    local label=$1 store=$2 grpcs=() admins=() loads=() run
    run="run$RANDOM$RANDOM-"
    for _ in 1 2 3; do
        local grpc admin
        grpc=$(free_port)
        admin=$(free_port)
        start_sidecar "$work/grants.yaml" "$store" "$grpc" "$admin" --store-timeout 2s
        grpcs+=("$grpc")
        admins+=("$admin")
    done
    for admin in "${admins[@]}"; do wait_ready "$admin"; done
    for grpc in "${grpcs[@]}"; do
        target/dist/charon-load --target "http://127.0.0.1:$grpc" --key customer --prefix "$run" \
            --tenants 1000 --connections 2 --concurrency 32 --duration "${seconds}s" \
            >"$work/load-$grpc.txt" &
        loads+=("$!")
        pids+=("$!")
    done
    for load in "${loads[@]}"; do wait "$load"; done
    local requests=0 ok=0 degraded=0
    for grpc in "${grpcs[@]}"; do
        requests=$((requests + $(awk -F'[ =]' '/^summary:/ { print $3 }' "$work/load-$grpc.txt")))
        ok=$((ok + $(awk -F'[ =]' '/^summary:/ { print $5 }' "$work/load-$grpc.txt")))
    done
    for admin in "${admins[@]}"; do
        degraded=$((degraded + $(metric "$admin" charon_store_degraded_decisions_total | cut -d. -f1)))
    done
    echo "over-grants $label: decisions=$requests ok=$ok expected=100000 over_grants=$((ok > 100000 ? ok - 100000 : 0)) lost_grants=$((ok < 100000 ? 100000 - ok : 0)) degraded=$degraded"
}

echo "== 1. over-grants, three sidecars, ${seconds} s of load each" >&2
over_grants "one-redis" "redis://127.0.0.1:$redis_port"

cluster_ports=()
for _ in 1 2 3; do
    port=$(free_port)
    mkdir -p "$work/node-$port"
    redis-server --port "$port" --bind 127.0.0.1 --cluster-enabled yes --cluster-node-timeout 2000 \
        --cluster-config-file "$work/node-$port/nodes.conf" --dir "$work/node-$port" \
        --save "" --appendonly no --loglevel warning >"$work/node-$port.log" 2>&1 &
    pids+=("$!")
    cluster_ports+=("$port")
done
for port in "${cluster_ports[@]}"; do until redis-cli -p "$port" ping >/dev/null 2>&1; do sleep 0.1; done; done
redis-cli --cluster create "${cluster_ports[@]/#/127.0.0.1:}" --cluster-yes >"$work/cluster.log" 2>&1
for port in "${cluster_ports[@]}"; do
    until redis-cli -p "$port" cluster info | grep -q 'cluster_state:ok'; do sleep 0.1; done
done
over_grants "cluster" "redis+cluster://$(IFS=,; echo "${cluster_ports[*]/#/127.0.0.1:}")"

echo "== 2. leaked holds, $rounds rounds of SIGKILL" >&2
fast=(--heartbeat 100ms --heartbeat-ttl 600ms --reap-interval 100ms --store-timeout 1s)
store="redis://127.0.0.1:$redis_port"
ports=("$(free_port)" "$(free_port)")
admins=("$(free_port)" "$(free_port)")
sidecar_pids=()
for i in 0 1; do
    start_sidecar "$work/copies.yaml" "$store" "${ports[$i]}" "${admins[$i]}" "${fast[@]}"
    sidecar_pids+=("$last_sidecar")
done
for admin in "${admins[@]}"; do wait_registered "$admin"; done
held() { # copies counted across every copy log of the store
    local total=0 key value
    # A copy log's counts: a hash behind the tag, kind `c` (store/keys.rs).
    for key in $(redis-cli -p "$redis_port" --scan --pattern '{????????}c*'); do
        [ "$(redis-cli -p "$redis_port" type "$key")" = hash ] || continue
        value=$(redis-cli -p "$redis_port" hget "$key" g)
        case "$value" in '' | *[!0-9]*) value=0 ;; esac
        total=$((total + value))
    done
    echo "$total"
}
leaked=0
slowest=0
for round in $(seq "$rounds"); do
    clients=()
    for i in 0 1; do
        target/dist/charon-load --target "http://127.0.0.1:${ports[$i]}" --domain edge --copies pool \
            --tenants 50 --connections 1 --concurrency 8 --duration 30s >/dev/null 2>&1 &
        clients+=("$!")
        pids+=("$!")
    done
    sleep 0.3
    victim=$((round % 2))
    kill -9 "${clients[$victim]}" "${sidecar_pids[$victim]}" 2>/dev/null || true
    kill -9 "${clients[$((1 - victim))]}" 2>/dev/null || true
    wait "${clients[@]}" "${sidecar_pids[$victim]}" 2>/dev/null || true
    killed=$(date +%s%N)
    start_sidecar "$work/copies.yaml" "$store" "${ports[$victim]}" "${admins[$victim]}" "${fast[@]}"
    sidecar_pids[victim]=$last_sidecar
    left=$(held)
    deadline=$((SECONDS + 10))
    while [ "$left" -ne 0 ] && [ "$SECONDS" -lt "$deadline" ]; do
        sleep 0.05
        left=$(held)
    done
    took=$((($(date +%s%N) - killed) / 1000000))
    [ "$took" -gt "$slowest" ] && slowest=$took
    leaked=$((leaked + left))
    wait_registered "${admins[$victim]}"
done
echo "leaked holds: rounds=$rounds leaked=$leaked slowest_release_ms=$slowest"
