#!/usr/bin/env bash
# Soak run (opt-in; not part of scripts/test.sh): one sidecar under steady
# load for MINUTES on each store (the memory store, then one local Redis):
# rate decisions over 10^6 tenants (charon-load at a steady SOAK_RATE per
# second, open loop; default 3000) and, beside them, copy reserve/release
# churn over 1 000 domains (2 in flight). Every 10 s
# it samples the sidecar's RSS and open file descriptors, its memory store's
# keys, and Redis's memory and key count, into target/soak/<store>.csv, then
# plots them (target/soak/soak.png; matplotlib in a venv under target/). What
# to look for: nothing grows past its cap (`--max-keys`, the windows' expiry).
#
#   bash scripts/soak.sh [MINUTES]     (default 30)
#
# Everything on 127.0.0.1; every process stopped by PID.
set -euo pipefail
cd "$(dirname "$0")/.."
minutes="${1:-30}"
rate="${SOAK_RATE:-3000}"
seconds=$((minutes * 60))
# shellcheck source=scripts/bench-lib.sh
source scripts/bench-lib.sh
out=target/soak
mkdir -p "$out"

cat >"$work/soak.yaml" <<'YAML'
domain: edge
descriptors:
  - key: tenant
    rate_limit: {unit: second, requests_per_unit: 1000}
resources:
  pool:
    copies: {domain_limit: 100, global_limit: 100000}
YAML

metric() { curl -sf "http://127.0.0.1:$1/metrics" | awk -v name="$2" '$1 == name { print $2 }'; }

soak() { # store-label store-url
    local label=$1 store=$2 grpc admin sidecar csv
    grpc=$(free_port)
    admin=$(free_port)
    csv="$out/$label.csv"
    target/dist/charon serve --config "$work/soak.yaml" --store "$store" \
        --grpc-addr "127.0.0.1:$grpc" --admin-addr "127.0.0.1:$admin" --store-timeout 1s \
        >"$work/sidecar-$label.log" 2>&1 &
    sidecar=$!
    pids+=("$sidecar")
    until curl -sf "http://127.0.0.1:$admin/metrics" | grep -q '^charon_copy_log_registered 1'; do sleep 0.1; done
    echo "== $label: ${minutes} min" >&2
    target/dist/charon-load --target "http://127.0.0.1:$grpc" --tenants 1000000 \
        --connections 2 --rate "$rate" --duration "${seconds}s" >"$work/rate-$label.txt" &
    local rate=$!
    pids+=("$rate")
    target/dist/charon-load --target "http://127.0.0.1:$grpc" --domain edge --copies pool \
        --tenants 1000 --connections 1 --concurrency 2 --duration "${seconds}s" >"$work/copies-$label.txt" &
    local copies=$!
    pids+=("$copies")
    echo "seconds,rss_kib,fds,store_keys,redis_used_kib,redis_keys" >"$csv"
    local start=$SECONDS
    while kill -0 "$rate" 2>/dev/null; do
        local rss fds keys redis_mem=0 redis_keys=0
        rss=$(awk '/^VmRSS:/ { print $2 }' "/proc/$sidecar/status")
        fds=$(find "/proc/$sidecar/fd" -mindepth 1 -maxdepth 1 | wc -l)
        keys=$(metric "$admin" charon_store_keys)
        if [ "$label" = redis ]; then
            redis_mem=$(redis-cli -p "$redis_port" info memory | awk -F: '/^used_memory:/ { printf "%d", $2 / 1024 }')
            redis_keys=$(redis-cli -p "$redis_port" dbsize)
        fi
        echo "$((SECONDS - start)),$rss,$fds,${keys:-0},$redis_mem,$redis_keys" >>"$csv"
        sleep 10
    done
    wait "$rate" "$copies" 2>/dev/null || true
    sed "s/^/   rate:   /" "$work/rate-$label.txt" | grep summary >&2 || true
    sed "s/^/   copies: /" "$work/copies-$label.txt" | grep summary >&2 || true
    kill "$sidecar"
    wait "$sidecar" 2>/dev/null || true
}

soak memory memory
soak redis "redis://127.0.0.1:$redis_port"

venv=target/soak-venv
[ -x "$venv/bin/python" ] || { python3 -m venv "$venv" && "$venv/bin/pip" install -q matplotlib; }
"$venv/bin/python" - "$out" <<'PY'
import csv, sys
import matplotlib
matplotlib.use("Agg")
import matplotlib.pyplot as plt
out = sys.argv[1]
series = [("rss_kib", "sidecar RSS (MiB)", 1024), ("fds", "sidecar open fds", 1),
          ("store_keys", "memory store keys", 1), ("redis_used_kib", "Redis used memory (MiB)", 1024),
          ("redis_keys", "Redis keys", 1)]
fig, axes = plt.subplots(len(series), 1, figsize=(8, 11), sharex=True)
for label in ("memory", "redis"):
    with open(f"{out}/{label}.csv") as f:
        rows = list(csv.DictReader(f))
    t = [int(r["seconds"]) / 60 for r in rows]
    for axis, (column, title, scale) in zip(axes, series):
        axis.plot(t, [float(r[column]) / scale for r in rows], label=f"--store {label}")
        axis.set_title(title, fontsize=9)
for axis in axes:
    axis.grid(alpha=0.3)
    axis.legend(fontsize=7)
axes[-1].set_xlabel("minutes")
fig.tight_layout()
fig.savefig(f"{out}/soak.png", dpi=80)
print(f"{out}/soak.png")
PY
echo "csv: $out/memory.csv $out/redis.csv" >&2
