#!/usr/bin/env bash
# What one decision costs Redis, in instructions (opt-in; not part of
# scripts/test.sh). Seconds on this shared VM move by 2x from one run to the
# next; instructions do not: a local redis-server runs under valgrind's
# callgrind with collection switched on only while redis-benchmark sends
# 20 000 calls of one shape (64 clients, 100 000 random keys), and the count
# is divided by the calls. Each script is called exactly as the sidecar calls
# it, beside reference commands.
#
#   bash scripts/bench-redis-instructions.sh [REV]
#
# With REV, the scripts of that revision are measured too, in the form that
# revision sent them (the batch form, for revisions before the one-item form).
set -euo pipefail
cd "$(dirname "$0")/.."
base="${1:-}"
calls="${CALLS:-20000}"

for tool in valgrind callgrind_control callgrind_annotate redis-server redis-benchmark redis-cli; do
    command -v "$tool" >/dev/null || { echo "needs $tool" >&2; exit 1; }
done
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }

work=$(mktemp -d)
pid=""
cleanup() { [ -n "$pid" ] && kill "$pid" 2>/dev/null; rm -rf "$work"; }
trap cleanup EXIT

# instructions NAME SCRIPT-FILE ARGS... (the word SHA stands for the script's
# hash; __rand_int__ is redis-benchmark's random key part)
instructions() {
    local name=$1 script=$2
    shift 2
    local port out
    port=$(free_port)
    out="$work/callgrind.out"
    valgrind --tool=callgrind --instr-atstart=no --callgrind-out-file="$out" \
        redis-server --port "$port" --bind 127.0.0.1 --save "" --appendonly no --dir "$work" \
        >"$work/valgrind.log" 2>&1 &
    pid=$!
    until redis-cli -p "$port" ping >/dev/null 2>&1; do sleep 0.2; done
    local sha args=()
    sha=$(redis-cli -p "$port" script load "$(cat "$script")")
    for arg in "$@"; do [ "$arg" = SHA ] && arg=$sha; args+=("$arg"); done
    callgrind_control -i on "$pid" >/dev/null 2>&1
    redis-benchmark -p "$port" -c 64 -n "$calls" -r 100000 "${args[@]}" >/dev/null
    callgrind_control -i off "$pid" >/dev/null 2>&1
    redis-cli -p "$port" shutdown nosave >/dev/null 2>&1 || true
    wait "$pid" 2>/dev/null || true
    pid=""
    local total
    total=$(callgrind_annotate "$out" 2>/dev/null | awk '/PROGRAM TOTALS/ && !seen { gsub(",", "", $1); print $1; seen = 1 }')
    printf '%-58s %8d\n' "$name" "$((total / calls))"
    rm -f "$out"
}

echo "return 1" >"$work/return1.lua"
key='{f05cfb93}w2:ns6:tenant7:tenant__rand_int__@1000'
bucket='{f05cfb93}a2:ns6:tenant7:tenant__rand_int__@1000'
hot='{f05cfb93}w2:ns6:tenant7:tenant0@1000'
hot_bucket='{f05cfb93}a2:ns6:tenant7:tenant0@1000'
# One window of 100 000 per second (so that the hot key is never over), one
# bucket of 100 000 per second with a burst of 100.
printf '%-58s %8s\n' "call" "instr."
instructions "GET" "$work/return1.lua" GET "$key"
instructions "SET ... PX" "$work/return1.lua" SET "$key" 1764265080000,1,1764265081000 PX 1000
instructions "EVALSHA 'return 1', the window call's key and numbers" "$work/return1.lua" EVALSHA SHA 1 "$key" 100000 1000 1 0
measure() { # label window-script bucket-script one-item-form(yes/no)
    local label=$1 window=$2 gcra=$3 one=$4
    local wargs=(100000 1000 1 0) gargs=(100000 1000 100 1 0)
    if [ "$one" = no ]; then
        wargs=(0 w 1 w 1 100000 1000 1 0)
        gargs=(0 a 1 a 1 100000 1000 100 1 0)
    fi
    instructions "$label: one window, 100 000 keys" "$window" EVALSHA SHA 1 "$key" "${wargs[@]}"
    instructions "$label: one window, one hot key" "$window" EVALSHA SHA 1 "$hot" "${wargs[@]}"
    instructions "$label: one bucket, 100 000 keys" "$gcra" EVALSHA SHA 1 "$bucket" "${gargs[@]}"
    instructions "$label: one bucket, one hot key" "$gcra" EVALSHA SHA 1 "$hot_bucket" "${gargs[@]}"
}
measure "this tree" src/store/redis/window.lua src/store/redis/gcra.lua yes
# The batch script, assembled as build.rs assembles it, with one item of a
# resource of one 60-s tier never reached (the bench-redis-kinds.sh tiers
# resource): on 100 000 domains (nearly every call a new key), and on one
# hot domain whose tier log grows by an entry a millisecond.
decide="$work/decide.lua"
for chunk in src/store/redis/decide/head.lua src/store/redis/decide/logs.lua \
    $(printf '%s\n' src/store/redis/kinds/*.lua | LC_ALL=C sort) src/store/redis/decide/batch.lua; do
    cat "$chunk"
    [ -z "$(tail -c1 "$chunk")" ] || echo
done >"$decide"
tiers='{f05cfb93}t2:ns3:api7:tenant__rand_int__'
hot_tiers='{f05cfb93}t2:ns3:api7:tenant0'
targs=(0 tta 1 t 1 0 -1 1 1 0 0 -1 1 1000000000 60000 -1 0 0 0 0 0)
instructions "this tree: one tier item, 100 000 domains" "$decide" EVALSHA SHA 1 "$tiers" "${targs[@]}"
instructions "this tree: one tier item, one hot domain" "$decide" EVALSHA SHA 1 "$hot_tiers" "${targs[@]}"
if [ -n "$base" ]; then
    git show "$base:src/store/redis/window.lua" >"$work/window-base.lua"
    git show "$base:src/store/redis/gcra.lua" >"$work/gcra-base.lua"
    one=yes
    grep -q 'local one = #ARGV' "$work/window-base.lua" || one=no
    measure "$base" "$work/window-base.lua" "$work/gcra-base.lua" "$one"
fi
