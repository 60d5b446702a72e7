#!/usr/bin/env bash
# The copy log's load benchmark (opt-in; not part of scripts/test.sh):
# reserve + release pairs through one sidecar, 64 concurrent Charon API
# sessions, on the memory store and on one local Redis, spread over 1000
# domains and over one hot domain; with the CPU seconds of the sidecar and of
# Redis. Everything on 127.0.0.1, every process stopped by PID.
#
#   bash scripts/bench-copies.sh [SECONDS]    (default 10 s per run)
set -euo pipefail
cd "$(dirname "$0")/.."
duration="${1:-10}"
# shellcheck source=scripts/bench-lib.sh
source scripts/bench-lib.sh

cat >"$work/copies.yaml" <<'YAML'
domain: bench
resources:
  pool:
    copies:
      domain_limit: 100
      global_limit: 100000
      groups:
        - {name: hot-group, limit: 1000, domains: [tenant-0]}
YAML

run() {
    local store="$1" label="$2"
    shift 2
    local grpc admin sidecar
    grpc=$(free_port)
    admin=$(free_port)
    target/dist/charon serve --config "$work/copies.yaml" --store "$store" \
        --grpc-addr "127.0.0.1:$grpc" --admin-addr "127.0.0.1:$admin" --store-timeout 1s \
        >"$work/sidecar.log" 2>&1 &
    sidecar=$!
    pids+=("$sidecar")
    until curl -sf "http://127.0.0.1:$admin/metrics" | grep -q '^charon_copy_log_registered 1'; do sleep 0.1; done
    local sidecar_cpu redis_cpu
    sidecar_cpu=$(cpu_seconds "$sidecar")
    redis_cpu=$(cpu_seconds "$redis_pid")
    echo "== $label"
    target/dist/charon-load --target "http://127.0.0.1:$grpc" --domain bench --copies pool \
        --connections 4 --concurrency 64 --duration "${duration}s" "$@" | sed 's/^/   /'
    echo "   cpu: sidecar $(minus "$(cpu_seconds "$sidecar")" "$sidecar_cpu") s, redis $(minus "$(cpu_seconds "$redis_pid")" "$redis_cpu") s"
    kill "$sidecar"
    wait "$sidecar" 2>/dev/null || true
}

run memory "memory store, 1000 domains" --tenants 1000
run "redis://127.0.0.1:$redis_port" "redis, 1000 domains" --tenants 1000
run "redis://127.0.0.1:$redis_port" "redis, one hot domain in a group" --hot
echo "== redis: counts left after the runs (expect none)"
redis-cli -p "$redis_port" --scan | while read -r key; do
    case "$(redis-cli -p "$redis_port" type "$key")" in
        hash) echo "   $key: $(redis-cli -p "$redis_port" hgetall "$key" | tr '\n' ' ')" ;;
    esac
done
