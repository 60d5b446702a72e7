#!/usr/bin/env bash
# The overload benchmark (opt-in; not part of scripts/test.sh): the app of
# examples/overload on core 0, its load (examples/overload_load) on core 1.
# For each mode (throttle: behind ThrottleLayer; none: the same app without
# it; sidecar: the app without it behind `charon throttle --adaptive` with
# its defaults, on the app's core as a pod's sidecar shares its CPU), the
# load measures the app's capacity, then offers 1x that capacity
# and steps to MULTIPLE x, critical requests at half the capacity and the
# rest sheddable, and prints goodput, p50/p99 and rejections per
# criticality, the CPU spent on requests that ended rejected, the time the
# step took to settle, and the layer's prediction error.
#
#   bash scripts/bench-overload.sh [MULTIPLE] [PHASE_SECONDS] [CPU_MS]   (defaults 4, 10, 10)
#   MODES="sidecar none" bash scripts/bench-overload.sh                 (default: throttle none)
#
# Everything on 127.0.0.1; every process stopped by PID.
set -euo pipefail
cd "$(dirname "$0")/.."
multiple="${1:-4}"
phase="${2:-10}"
cpu_ms="${3:-10}"
cargo build --profile dist -q --example overload --example overload_load
case " ${MODES:-} " in *" sidecar "*) cargo build --profile dist -q --bin charon ;; esac

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
app_pid=""
proxy_pid=""
cleanup() {
    [ -n "$app_pid" ] && kill "$app_pid" 2>/dev/null || true
    [ -n "$proxy_pid" ] && kill "$proxy_pid" 2>/dev/null || true
}
trap cleanup EXIT

for mode in ${MODES:-throttle none}; do
    port=$(free_port)
    app_mode="$mode"
    [ "$mode" = sidecar ] && app_mode=none
    taskset -c 0 target/dist/examples/overload --addr "127.0.0.1:$port" --mode "$app_mode" >/dev/null &
    app_pid=$!
    until curl -sf "http://127.0.0.1:$port/stats" >/dev/null; do sleep 0.1; done
    target="$port"
    if [ "$mode" = sidecar ]; then
        target=$(free_port)
        admin=$(free_port)
        taskset -c 0 target/dist/charon throttle --listen "127.0.0.1:$target" \
            --upstream "http://127.0.0.1:$port" --adaptive --admin-addr "127.0.0.1:$admin" 2>/dev/null &
        proxy_pid=$!
        until curl -sf "http://127.0.0.1:$admin/ready" >/dev/null; do sleep 0.1; done
    fi
    echo "== mode $mode (app pid $app_pid${proxy_pid:+, charon throttle pid $proxy_pid} on core 0; load on core 1)"
    taskset -c 1 target/dist/examples/overload_load --addr "127.0.0.1:$target" \
        --multiple "$multiple" --phase "$phase" --cpu-ms "$cpu_ms"
    if [ -n "$proxy_pid" ]; then
        curl -s "http://127.0.0.1:$admin/stats"; echo
        # utime + stime, in clock ticks.
        ticks=$(awk '{print $14 + $15}' "/proc/$proxy_pid/stat")
        echo "charon throttle CPU: $((ticks * 1000 / $(getconf CLK_TCK))) ms over the run"
        kill "$proxy_pid"
        wait "$proxy_pid" 2>/dev/null || true
        proxy_pid=""
    fi
    kill "$app_pid"
    wait "$app_pid" 2>/dev/null || true
    app_pid=""
done
