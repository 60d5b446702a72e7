#!/usr/bin/env bash
# Overload figures (opt-in; not part of scripts/test.sh). On two cores a load
# tool cannot offer four times what a sidecar decides in memory, so the
# sidecar is made the bottleneck the way a slow store makes it one: its
# Redis is reached through a proxy that delays every chunk by DELAY_MS each
# way (a store answering in about 2 x DELAY_MS), and --max-in-flight caps
# the decisions waiting on it. Its sustainable rate is measured closed loop
# with as many in flight as the cap (10 s); then an open-loop load at
# MULTIPLE times that rate for 20 s (`charon-load --rate`: requests sent on
# schedule whether or not earlier ones were answered; latency from the
# scheduled instant, so any queueing shows). Reports the offered and
# answered rates, latency percentiles, the sidecar's peak RSS (sampled every
# 100 ms), and how many calls were answered at once by --on-overload deny.
#
#   bash scripts/overload.sh [MULTIPLE] [MAX_IN_FLIGHT] [DELAY_MS]   (defaults 4, 100, 10)
#
# Everything on 127.0.0.1; every process stopped by PID.
set -euo pipefail
cd "$(dirname "$0")/.."
multiple="${1:-4}"
max_in_flight="${2:-100}"
delay_ms="${3:-10}"
# shellcheck source=scripts/bench-lib.sh
source scripts/bench-lib.sh

cat >"$work/overload.yaml" <<'YAML'
domain: edge
descriptors:
  - key: tenant
    rate_limit: {unit: second, requests_per_unit: 1000000}
YAML
proxy_port=$(free_port)
python3 - "$proxy_port" "$redis_port" "$delay_ms" >"$work/proxy.log" 2>&1 <<'PY' &
import asyncio, sys
listen, upstream, delay = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]) / 1000

async def pipe(reader, writer):
    loop = asyncio.get_running_loop()
    try:
        while chunk := await reader.read(65536):
            # Each chunk is written DELAY later, in order: latency, not a
            # throughput cap.
            loop.call_later(delay, writer.write, chunk)
    finally:
        loop.call_later(delay, writer.close)

async def serve(client_reader, client_writer):
    redis_reader, redis_writer = await asyncio.open_connection("127.0.0.1", upstream)
    await asyncio.gather(pipe(client_reader, redis_writer), pipe(redis_reader, client_writer))

async def main():
    server = await asyncio.start_server(serve, "127.0.0.1", listen)
    async with server:
        await server.serve_forever()

asyncio.run(main())
PY
pids+=("$!")
until (exec 3<>"/dev/tcp/127.0.0.1/$proxy_port") 2>/dev/null; do sleep 0.1; done
grpc=$(free_port)
admin=$(free_port)
taskset -c 0 target/dist/charon serve --config "$work/overload.yaml" \
    --store "redis://127.0.0.1:$proxy_port" --store-timeout 200ms \
    --max-in-flight "$max_in_flight" --on-overload deny \
    --grpc-addr "127.0.0.1:$grpc" --admin-addr "127.0.0.1:$admin" >"$work/sidecar.log" 2>&1 &
sidecar=$!
pids+=("$sidecar")
taskset -cp 1 "$redis_pid" >/dev/null
until curl -sf "http://127.0.0.1:$admin/readyz" >/dev/null; do sleep 0.1; done
load() { taskset -c 1 target/dist/charon-load --target "http://127.0.0.1:$grpc" --tenants 100000 "$@"; }

echo "== sustainable: closed loop, $((max_in_flight * 3 / 4)) in flight, 10 s (Redis ${delay_ms} ms away each way)" >&2
load --connections 4 --concurrency "$((max_in_flight * 3 / 4))" --duration 10s | tee "$work/closed.txt" | grep -E '^(answers|throughput|latency)'
sustainable=$(awk '/^throughput:/ { printf "%d", $2 }' "$work/closed.txt")
offered=$((sustainable * multiple))
overloads() { curl -sf "http://127.0.0.1:$admin/metrics" | awk '/^charon_overload_answers_total/ { s += $2 } END { print s + 0 }'; }
before=$(overloads)

echo "== ${multiple}x: open loop at $offered req/s, 20 s (--max-in-flight $max_in_flight)" >&2
peak=0
(while kill -0 "$sidecar" 2>/dev/null; do
    awk '/^VmRSS:/ { print $2 }' "/proc/$sidecar/status"
    sleep 0.1
done) >"$work/rss.txt" &
sampler=$!
pids+=("$sampler")
rss_before=$(awk '/^VmRSS:/ { print $2 }' "/proc/$sidecar/status")
load --connections 4 --rate "$offered" --duration 20s --timeout 5s | tee "$work/open.txt" |
    grep -E '^(requests|errors|answers|throughput|latency)'
kill "$sampler" 2>/dev/null || true
peak=$(sort -n "$work/rss.txt" | tail -1)
degraded=$(curl -sf "http://127.0.0.1:$admin/metrics" | awk '$1 == "charon_store_degraded_decisions_total" { print $2 }')
echo "overload answers (--on-overload deny): $(($(overloads) - before)); decided by the fallback, not Redis: $degraded"
echo "sidecar RSS: ${rss_before} KiB before, peak ${peak} KiB during"
echo "summary: multiple=$multiple delay_ms=$delay_ms sustainable=$sustainable offered=$offered max_in_flight=$max_in_flight $(grep '^summary:' "$work/open.txt" | cut -d' ' -f2-) overloads=$(($(overloads) - before)) rss_before_kib=$rss_before rss_peak_kib=$peak degraded=$degraded"
