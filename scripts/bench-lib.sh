# Shared by the opt-in load benchmarks (bench-redis.sh, bench-copies.sh):
# builds the binaries in the dist profile (fat LTO, one codegen unit: what
# the image ships, docs/performance.md#build-profiles), and starts one local
# Redis (persistence off)
# on a free port in a temporary directory. Every process added to `pids` is
# stopped by PID on exit, and the directory removed. Sourced, not run.
#
# Sets: work (the directory), pids, redis_port, redis_pid.
# Defines: free_port, minus A B, cpu_seconds PID.
# The dist profile, spelled out for revisions whose Cargo.toml does not
# have it (bench-ab.sh builds its base with the same flags), so that both
# sides of a comparison are built alike.
dist_profile=(--profile dist
    --config 'profile.dist.inherits="release"' --config 'profile.dist.lto="fat"'
    --config 'profile.dist.codegen-units=1' --config 'profile.dist.debug=1')
cargo build "${dist_profile[@]}" --workspace --bins -q

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
minus() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.2f", a - b }'; }
cpu_seconds() { awk '{ printf "%.2f", ($14 + $15) / 100 }' "/proc/$1/stat"; }

work=$(mktemp -d)
pids=()
cleanup() { for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; done; rm -rf "$work"; }
trap cleanup EXIT

redis_port=$(free_port)
redis-server --port "$redis_port" --bind 127.0.0.1 --save "" --appendonly no --dir "$work" \
    --loglevel warning >"$work/redis.log" 2>&1 &
redis_pid=$!
pids+=("$redis_pid")
until redis-cli -p "$redis_port" ping >/dev/null 2>&1; do sleep 0.1; done
