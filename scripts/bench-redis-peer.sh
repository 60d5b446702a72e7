#!/usr/bin/env bash
# Charon's Redis work per decision beside Limitador's, in one run (opt-in;
# not part of scripts/test.sh). Nothing of Limitador is in this repository:
# point LIMITADOR at a limitador-server built elsewhere (its `redis`
# storage, which asks Redis on every decision).
#
#   LIMITADOR=/path/to/limitador-server bash scripts/bench-redis-peer.sh [SECONDS] [ROUNDS]
#
# One local Redis (pinned to core 1, with charon-load); per run one sidecar
# (pinned to core 0): Charon's `charon serve` with one fixed window, or
# Limitador with the same limit (namespace `edge`, the variable
# `descriptors[0]['tenant']`), never reached, so every decision writes.
# Three shapes, as in bench-redis-kinds.sh (hot: one key, 60-s windows;
# hot-100k: 100 000 keys, 60-s windows; churn: 100 000 keys, 1-s windows),
# at 1 and 64 requests in flight, the two sidecars alternated ROUNDS times
# (default 3) after a 1-s warm-up each. Per decision:
#
# - Redis CPU: /proc/PID/stat of redis-server (the scripts, the commands,
#   reading requests and writing replies), the fleet's cost;
# - commands sent: INFO commandstats over the commands a sidecar sends
#   (Charon's EVALSHA; Limitador's MGET and its script), the time Redis
#   spends inside them.
#
# Last, the floor of an atomic decision: redis-benchmark (64 clients)
# sending EVALSHA of a script of TIME, GET and SET ... PX alone, beside
# Charon's window.lua with the same key and numbers, on one hot key and on
# 100 000 keys, alternated ROUNDS times (usec_per_call of evalsha); with
# BASE=<revision>, that revision's window.lua is timed in the same rounds.
# Everything on 127.0.0.1; every process stopped by PID.
set -euo pipefail
cd "$(dirname "$0")/.."
duration="${1:-5}"
rounds="${2:-3}"
limitador="${LIMITADOR:?set LIMITADOR to a limitador-server binary}"
[ -x "$limitador" ] || { echo "not an executable: $limitador" >&2; exit 1; }
# shellcheck source=scripts/bench-lib.sh
source scripts/bench-lib.sh
taskset -pc 1 "$redis_pid" >/dev/null

charon_config() { # unit
    printf 'domain: edge\ndescriptors:\n  - key: tenant\n    rate_limit: {unit: %s, requests_per_unit: 1000000000}\n' "$1"
}
limitador_config() { # seconds
    printf -- "- namespace: edge\n  max_value: 1000000000\n  seconds: %s\n  conditions: []\n  variables: [\"descriptors[0]['tenant']\"]\n" "$1"
}

commands_usec() { # the commands a sidecar sends, in µs
    redis-cli -p "$redis_port" info commandstats |
        awk -F'[=,]' '/^cmdstat_(evalsha|eval|mget|get|incrby):/ { usec += $4 } END { printf "%d", usec }'
}

run() { # who shape inflight
    local who=$1 shape=$2 inflight=$3 unit=minute seconds=60 tenants=100000
    case "$shape" in
    hot) tenants=1 ;;
    churn) unit=second seconds=1 ;;
    esac
    redis-cli -p "$redis_port" flushall >/dev/null
    local grpc admin sidecar_pid
    grpc=$(free_port)
    admin=$(free_port)
    if [ "$who" = charon ]; then
        charon_config "$unit" >"$work/charon.yaml"
        taskset -c 0 ./target/dist/charon serve --config "$work/charon.yaml" \
            --store "redis://127.0.0.1:$redis_port" \
            --grpc-addr "127.0.0.1:$grpc" --admin-addr "127.0.0.1:$admin" 2>"$work/charon.log" &
        sidecar_pid=$!
        pids+=("$sidecar_pid")
        until curl -sf "127.0.0.1:$admin/readyz" >/dev/null; do sleep 0.1; done
    else
        limitador_config "$seconds" >"$work/limits.yaml"
        taskset -c 0 "$limitador" --rls-ip 127.0.0.1 --rls-port "$grpc" --http-ip 127.0.0.1 \
            --http-port "$admin" "$work/limits.yaml" redis "redis://127.0.0.1:$redis_port" \
            >"$work/limitador.log" 2>&1 &
        sidecar_pid=$!
        pids+=("$sidecar_pid")
        until curl -sf "127.0.0.1:$admin/status" >/dev/null; do sleep 0.1; done
    fi
    local connections=4
    [ "$inflight" = 1 ] && connections=1
    local load=(taskset -c 1 ./target/dist/charon-load --target "http://127.0.0.1:$grpc" --threads 1
        --connections "$connections" --concurrency "$inflight" --tenants "$tenants")
    "${load[@]}" --duration 1s >/dev/null
    redis-cli -p "$redis_port" config resetstat >/dev/null
    local cpu_before usec_before summary
    cpu_before=$(cpu_seconds "$redis_pid")
    usec_before=$(commands_usec)
    summary=$("${load[@]}" --duration "${duration}s" | grep '^summary:')
    local cpu usec
    cpu=$(minus "$(cpu_seconds "$redis_pid")" "$cpu_before")
    usec=$(($(commands_usec) - usec_before))
    kill "$sidecar_pid"
    wait "$sidecar_pid" 2>/dev/null || true
    echo "$summary" | awk -v who="$who" -v shape="$shape" -v inflight="$inflight" \
        -v cpu="$cpu" -v usec="$usec" '{
        for (i = 2; i <= NF; i++) { split($i, kv, "="); f[kv[1]] = kv[2] }
        answers = f["ok"] + f["over_limit"]
        printf "%s %s %s %.0f %.2f %.2f %d\n", who, shape, inflight,
            f["requests"] / f["seconds"], cpu * 1e6 / answers, usec / answers, f["errors"] + f["over_limit"]
    }'
}

echo "== $(git rev-parse --short HEAD)$(git diff --quiet || echo '+changes'), Redis $(redis-server --version | awk '{print $3}'), ${duration} s per run, $rounds rounds"
for shape in ${BENCH_SHAPES:-hot hot-100k churn}; do
    for inflight in 1 64; do
        for _ in $(seq "$rounds"); do
            run charon "$shape" "$inflight"
            run limitador "$shape" "$inflight"
        done
    done
done >"$work/runs"
echo "runs (who shape in-flight decisions/s redis-cpu-us commands-us errors):"
cat "$work/runs"
echo
echo "| shape | in flight | decisions/s, Charon / Limitador | Redis CPU µs/decision, Charon / Limitador | ratio | commands sent µs/decision, Charon / Limitador | ratio |"
echo "| --- | --- | --- | --- | --- | --- | --- |"
awk '{ k = $2 " " $3; n[$1, k]++; rate[$1, k] += $4; cpu[$1, k] += $5; cmd[$1, k] += $6; if (!(k in seen)) { seen[k] = 1; order[++keys] = k } }
    END {
        for (i = 1; i <= keys; i++) {
            k = order[i]; split(k, p, " "); c = n["charon", k]; l = n["limitador", k]
            printf "| %s | %s | %.0f / %.0f | %.2f / %.2f | ×%.2f | %.2f / %.2f | ×%.2f |\n", p[1], p[2],
                rate["charon", k] / c, rate["limitador", k] / l, cpu["charon", k] / c, cpu["limitador", k] / l,
                (cpu["charon", k] / c) / (cpu["limitador", k] / l), cmd["charon", k] / c, cmd["limitador", k] / l,
                (cmd["charon", k] / c) / (cmd["limitador", k] / l)
        }
    }' "$work/runs"

# The floor: TIME, GET and SET ... PX in one script, beside window.lua.
cat >"$work/floor.lua" <<'LUA'
redis.call('TIME')
redis.call('GET', KEYS[1])
redis.call('SET', KEYS[1], '1764265080000,1,1764265140000', 'PX', 60000)
return 1
LUA
evalsha_usec_per_call() { # script key: redis-benchmark, then usec_per_call
    local sha
    redis-cli -p "$redis_port" flushall >/dev/null
    sha=$(redis-cli -p "$redis_port" script load "$(cat "$1")")
    redis-cli -p "$redis_port" config resetstat >/dev/null
    taskset -c 1 redis-benchmark -p "$redis_port" -c 64 -n "${FLOOR_CALLS:-200000}" -r 100000 \
        EVALSHA "$sha" 1 "$2" 1000000000 60000 1 0 >/dev/null
    redis-cli -p "$redis_port" info commandstats | awk -F'[=,]' '/^cmdstat_evalsha:/ { print $6 }'
}
hot='{f05cfb93}w2:ns4:edge6:tenant7:tenant0@60000'
many='{f05cfb93}w2:ns4:edge6:tenant7:tenant__rand_int__@60000'
base_window=""
if [ -n "${BASE:-}" ]; then
    base_window="$work/window-base.lua"
    git show "$BASE:src/store/redis/window.lua" >"$base_window"
fi
echo
if [ -n "$base_window" ]; then
    echo "| keys | floor (TIME, GET, SET) µs/call | window.lua µs/call | ratio | window.lua of $BASE µs/call | ratio |"
    echo "| --- | --- | --- | --- | --- | --- |"
else
    echo "| keys | floor (TIME, GET, SET) µs/call | window.lua µs/call | ratio |"
    echo "| --- | --- | --- | --- |"
fi
add() { awk -v a="$1" -v b="$2" 'BEGIN { print a + b }'; }
for keys in hot many; do
    key=$hot
    [ "$keys" = many ] && key=$many
    floor=0 window=0 base=0
    for _ in $(seq "$rounds"); do
        floor=$(add "$floor" "$(evalsha_usec_per_call "$work/floor.lua" "$key")")
        window=$(add "$window" "$(evalsha_usec_per_call src/store/redis/window.lua "$key")")
        if [ -n "$base_window" ]; then
            base=$(add "$base" "$(evalsha_usec_per_call "$base_window" "$key")")
        fi
    done
    if [ -n "$base_window" ]; then
        awk -v k="$keys" -v f="$floor" -v w="$window" -v b="$base" -v r="$rounds" \
            'BEGIN { printf "| %s | %.2f | %.2f | ×%.2f | %.2f | ×%.2f |\n", k, f / r, w / r, w / f, b / r, b / f }'
    else
        awk -v k="$keys" -v f="$floor" -v w="$window" -v r="$rounds" \
            'BEGIN { printf "| %s | %.2f | %.2f | ×%.2f |\n", k, f / r, w / r, w / f }'
    fi
done
