#!/usr/bin/env bash
# The multi-region benchmark of global limits (opt-in; not part of
# scripts/test.sh): examples/regions starts a root, three regions behind a
# proxy that delays by 100 ms, a leaf per region behind one that delays by
# 1 ms (every one the release `charon` on the memory store), loads the
# leaves with Poisson traffic (110 % of the global limit, then a 10x shift
# in one region to 200 %), cuts the root off, heals it, and prints the
# admitted share of the capacity per second, utilisation, convergence
# (per second admitted, and each leaf's share read every 50 ms), the p99 a
# global decision adds over a local one, and the cut's effects. The root
# answers the regions every 200 ms, the regions their leaves every 500 ms
# (the example's --root-refresh and --region-refresh; 0: the server's
# default, no flag). REGIONS_ROWS=1 prints the rows; REGIONS_KEEP=1 keeps
# the servers' logs (CHARON_LOG_LEVEL=charon=debug logs every renewal).
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
cargo build --profile dist -q --bin charon --example regions
target/dist/examples/regions --charon target/dist/charon \
    --capacity "$capacity" --phase "$phase" --cut "$cut"
