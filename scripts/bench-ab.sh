#!/usr/bin/env bash
# A/B load benchmark (opt-in; not part of scripts/test.sh): the sidecar of
# BASE_REV against the working tree's, in alternation (A B A B ...), on the
# memory store and on one local Redis, at 64 requests in flight (4
# connections, 100 000 tenants) and at 1. The sidecar is pinned to core 0
# and the load tool (one client thread, the working tree's charon-load for
# both) and Redis to core 1, so the figure that compares is CPU per
# decision: the sidecar's CPU time from /proc/PID/stat divided by the
# answers, and Redis's script time (INFO commandstats) divided by the
# answers. Throughput is bounded by the machine.
#
#   bash scripts/bench-ab.sh BASE_REV [SECONDS] [ROUNDS]   (default 10 s, 2 rounds)
#
# BENCH_CASES="memory:64 redis:1" runs only those cases; BASE_BIN=PATH takes
# that binary as the base instead of building BASE_REV (an experiment's
# variant, built by hand); NEW_BIN=PATH runs that binary in the working
# tree's place (the floor server of examples/bench/rls_floor.rs); NEW_ARGS="--flag value ..." are given to the
# working tree's sidecar only (a feature switched on, against it off or
# against the base). BENCH_CONFIG=PATH serves that configuration instead of
# examples/bench/fixed.yaml, and LOAD_ARGS="..." are given to charon-load
# (examples/bench/tiers.yaml wants LOAD_ARGS="--prefix bursty-"), and
# BENCH_TENANTS=1 sends every request for one tenant (a hot key).
#
# Prints one line per run, then per case the mean of each figure and the
# ratio working tree / base. Everything on 127.0.0.1; every process stopped
# by PID.
set -euo pipefail
cd "$(dirname "$0")/.."
base_rev="${1:?usage: bash scripts/bench-ab.sh BASE_REV [SECONDS] [ROUNDS]}"
duration="${2:-10}"
rounds="${3:-2}"
# shellcheck source=scripts/bench-lib.sh
source scripts/bench-lib.sh

base_sha=$(git rev-parse --verify "$base_rev^{commit}")
base_bin="${BASE_BIN:-target/bench-ab/$base_sha/dist/charon}"
if [ ! -x "$base_bin" ]; then
    echo "== building $base_rev ($base_sha) in the dist profile" >&2
    mkdir -p "$work/base-src" "target/bench-ab/$base_sha/dist"
    git archive "$base_sha" | tar -x -C "$work/base-src"
    CARGO_TARGET_DIR="$(pwd)/target/bench-ab/target" \
        cargo build "${dist_profile[@]}" --bins -q --manifest-path "$work/base-src/Cargo.toml"
    cp target/bench-ab/target/dist/charon "$base_bin"
fi
new_bin="${NEW_BIN:-target/dist/charon}"
load_bin=target/dist/charon-load
taskset -pc "${REDIS_CPUS:-1}" "$redis_pid" >/dev/null

redis_script_usec() {
    redis-cli -p "$redis_port" info commandstats |
        awk -F'[=,]' '/^cmdstat_(evalsha|eval):/ { usec += $4 } END { printf "%d", usec }'
}

results="$work/results"
: >"$results"

run() { # rev binary store inflight connections
    local rev=$1 bin=$2 store=$3 inflight=$4 connections=$5
    local extra=()
    # shellcheck disable=SC2206 # NEW_ARGS is split into flags on purpose.
    [ "$rev" = new ] && extra=(${NEW_ARGS:-})
    local store_arg=memory
    if [ "$store" = redis ]; then
        store_arg="redis://127.0.0.1:$redis_port"
        redis-cli -p "$redis_port" flushall >/dev/null
        redis-cli -p "$redis_port" config resetstat >/dev/null
    fi
    local grpc admin
    grpc=$(free_port)
    admin=$(free_port)
    taskset -c 0 "$bin" serve --config "${BENCH_CONFIG:-examples/bench/fixed.yaml}" --store "$store_arg" \
        --grpc-addr "127.0.0.1:$grpc" --admin-addr "127.0.0.1:$admin" "${extra[@]}" 2>"$work/charon.log" &
    local charon_pid=$!
    pids+=("$charon_pid")
    until curl -sf "127.0.0.1:$admin/readyz" >/dev/null; do sleep 0.1; done
    # Warm up (connections, script load), then measure.
    # shellcheck disable=SC2086 # LOAD_ARGS is a list of words.
    "$load_bin" --target "http://127.0.0.1:$grpc" --threads 1 --connections "$connections" \
        --concurrency "$inflight" --duration 1s ${LOAD_ARGS:-} >/dev/null
    local cpu_before redis_before
    cpu_before=$(cpu_seconds "$charon_pid")
    redis_before=$(redis_script_usec)
    local summary
    # shellcheck disable=SC2086 # LOAD_ARGS is a list of words.
    summary=$(taskset -c 1 "$load_bin" --target "http://127.0.0.1:$grpc" --threads 1 \
        --connections "$connections" --concurrency "$inflight" --tenants "${BENCH_TENANTS:-100000}" \
        --duration "${duration}s" ${LOAD_ARGS:-} | grep '^summary:')
    local cpu_after redis_after
    cpu_after=$(cpu_seconds "$charon_pid")
    redis_after=$(redis_script_usec)
    kill "$charon_pid"
    wait "$charon_pid" 2>/dev/null || true
    # summary: requests=N ok=N over_limit=N errors=N seconds=S p50_us=N p99_us=N p999_us=N max_us=N client_cpu_s=S
    echo "$summary" | awk -v rev="$rev" -v store="$store" -v inflight="$inflight" \
        -v cpu="$(minus "$cpu_after" "$cpu_before")" -v redis="$((redis_after - redis_before))" '{
        for (i = 2; i <= NF; i++) { split($i, kv, "="); f[kv[1]] = kv[2] }
        answers = f["ok"] + f["over_limit"]
        printf "%s %s %s rps=%.0f p50_us=%d p99_us=%d p999_us=%d max_us=%d cpu_us=%.2f redis_us=%.2f errors=%d client_cpu_s=%s\n",
            store, inflight, rev, f["requests"] / f["seconds"], f["p50_us"], f["p99_us"], f["p999_us"],
            f["max_us"], cpu * 1e6 / answers, redis / answers, f["errors"], f["client_cpu_s"]
    }' | tee -a "$results"
}

echo "== base $base_rev ($base_sha) vs working tree $(git rev-parse --short HEAD)$(git diff --quiet || echo '+changes')${NEW_ARGS:+ with $NEW_ARGS}; ${duration} s per run, $rounds rounds"
echo "store inflight rev figures (cpu_us: sidecar CPU µs per decision; redis_us: Redis script µs per decision)"
for case in ${BENCH_CASES:-memory:64 memory:1 redis:64 redis:1}; do
    store=${case%%:*}
    inflight=${case##*:}
    connections=4
    [ "$inflight" = 1 ] && connections=1
    for _ in $(seq "$rounds"); do
        run base "$base_bin" "$store" "$inflight" "$connections"
        run new "$new_bin" "$store" "$inflight" "$connections"
    done
done

echo
echo "== means, and working tree / base"
awk '{
    key = $1 " " $2; rev = $3
    for (i = 4; i <= NF; i++) { split($i, kv, "="); sum[key, rev, kv[1]] += kv[2] }
    n[key, rev]++; keys[key] = 1
} END {
    split("rps p50_us p99_us p999_us max_us cpu_us redis_us", figures, " ")
    for (key in keys) {
        line = key
        for (j = 1; j <= 7; j++) {
            name = figures[j]
            b = sum[key, "base", name] / n[key, "base"]
            w = sum[key, "new", name] / n[key, "new"]
            ratio = (b > 0) ? sprintf("%.2f", w / b) : "-"
            line = line sprintf(" %s=%.1f/%.1f(x%s)", name, w, b, ratio)
        }
        print line
    }
}' "$results" | sort
