#!/usr/bin/env bash
# The multi-region benchmark of global limits (opt-in; not part of
# scripts/test.sh): examples/regions starts a root, three regions behind a
# proxy that delays by 100 ms, a leaf per region behind one that delays by
# 1 ms (every one the release `charon` on the memory store), loads the
# leaves with Poisson traffic (110 % of the global limit, then a 10x shift
# in one region to 200 %), cuts the root off, heals it, and prints the
# admitted share of the capacity per second, utilisation, convergence,
# the p99 a global decision adds over a local one, and the cut's effects.
#
#   bash scripts/bench-regions.sh [CAPACITY] [PHASE_SECONDS] [CUT_SECONDS]   (defaults 300, 20, 20)
#
# Everything on 127.0.0.1; every process is stopped by the example (by its
# child handle) when it ends.
set -euo pipefail
cd "$(dirname "$0")/.."
capacity="${1:-300}"
phase="${2:-20}"
cut="${3:-20}"
cargo build --release -q --bin charon --example regions
target/release/examples/regions --charon target/release/charon \
    --capacity "$capacity" --phase "$phase" --cut "$cut"
