//! The tools `scripts/test-deps.sh` installs into `target/envoy-venv`
//! (kubectl, kubernetes-validate, PyYAML's python).

use std::path::{Path, PathBuf};

/// `<venv>/bin/<name>`; the venv is `$CHARON_VENV` or `target/envoy-venv`.
pub fn tool(name: &str) -> PathBuf {
    let venv = std::env::var("CHARON_VENV")
        .map(PathBuf::from)
        .unwrap_or_else(|_| Path::new(env!("CARGO_MANIFEST_DIR")).join("target/envoy-venv"));
    let path = venv.join("bin").join(name);
    assert!(
        path.exists(),
        "{} is missing: run `bash scripts/test-deps.sh` (or set CHARON_VENV)",
        path.display()
    );
    path
}
