#!/usr/bin/env bash
# The sidecar's resident memory (opt-in; not part of scripts/test.sh): idle
# with the example configuration, then after KEYS fixed-window keys filled
# through the gRPC face (charon-load, tenants in turn, an hour's window so
# none expires while it runs). Prints VmRSS, RssAnon, RssFile and
# AnonHugePages (the store's large tables on huge pages) of the sidecar,
# and the store's key count from /metrics. Everything on
# 127.0.0.1; every process stopped by PID.
#
#   bash scripts/bench-rss.sh [KEYS]    (default 1000000)
set -euo pipefail
cd "$(dirname "$0")/.."
keys="${1:-1000000}"
cargo build --profile dist --workspace --bins -q

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
work=$(mktemp -d)
pids=()
cleanup() { for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; done; rm -rf "$work"; }
trap cleanup EXIT

rss() {
    { grep -E '^(VmRSS|RssAnon|RssFile)' "/proc/$1/status"; grep -E '^AnonHugePages' "/proc/$1/smaps_rollup"; } |
        awk '{ printf "%s %.1f MiB  ", $1, $2 / 1024 }'
    echo
}

start() { # config
    grpc=$(free_port) admin=$(free_port)
    target/dist/charon serve --config "$1" --grpc-addr "127.0.0.1:$grpc" \
        --admin-addr "127.0.0.1:$admin" >"$work/charon.log" 2>&1 &
    sidecar=$!
    pids+=("$sidecar")
    until curl -sf "http://127.0.0.1:$admin/readyz" >/dev/null; do sleep 0.1; done
    sleep 2
}

start examples/envoy/ratelimit.yaml
printf 'idle, examples/envoy/ratelimit.yaml: '
rss "$sidecar"
kill "$sidecar"

cat >"$work/hour.yaml" <<'YAML'
domain: edge
descriptors:
  - key: tenant
    rate_limit: {unit: hour, requests_per_unit: 1000000}
YAML
start "$work/hour.yaml"
printf 'idle, one fixed window per tenant: '
rss "$sidecar"
# Tenants in turn: each of KEYS tenants once per pass; run until every one
# was seen (the load tool stops at its duration, so ask for enough).
seconds=$(( keys / 25000 + 10 ))
target/dist/charon-load --target "http://127.0.0.1:$grpc" --domain edge --key tenant \
    --tenants "$keys" --pick round-robin --concurrency 64 --duration "${seconds}s" |
    grep -E '^(requests|throughput|granted)' || true
held=$(curl -sf "http://127.0.0.1:$admin/metrics" | awk '/^charon_store_keys / { print $2 }')
printf 'after %s keys filled (store holds %s): ' "$keys" "$held"
rss "$sidecar"
