//! Certificates made by `openssl` (installed with the test dependencies)
//! for TLS tests: a CA, and leaves it signs for servers or clients.

use std::path::{Path, PathBuf};
use std::process::Command;

fn openssl(dir: &Path, args: &[&str]) {
    let output = Command::new("openssl")
        .args(args)
        .current_dir(dir)
        .output()
        .expect("openssl runs (scripts/test-deps.sh installs it)");
    assert!(
        output.status.success(),
        "openssl {args:?}: {}",
        String::from_utf8_lossy(&output.stderr)
    );
}

/// A CA: `<name>.pem` and `<name>.key` in `dir`.
pub fn ca(dir: &Path, name: &str) -> PathBuf {
    let (pem, key) = (format!("{name}.pem"), format!("{name}.key"));
    openssl(
        dir,
        &[
            "req",
            "-x509",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-keyout",
            &key,
            "-out",
            &pem,
            "-days",
            "2",
            "-subj",
            &format!("/CN={name}"),
        ],
    );
    dir.join(pem)
}

/// A leaf signed by CA `ca`: `<name>.pem` and `<name>.key`, with these
/// subject alternative names (`DNS:localhost,IP:127.0.0.1`) and usage
/// (`serverAuth` or `clientAuth`). Returns (certificate, key).
pub fn leaf(dir: &Path, ca: &str, name: &str, sans: &str, usage: &str) -> (PathBuf, PathBuf) {
    let ext = format!("{name}.ext");
    std::fs::write(
        dir.join(&ext),
        format!("subjectAltName={sans}\nbasicConstraints=CA:FALSE\nextendedKeyUsage={usage}\n"),
    )
    .expect("write the extensions");
    let (pem, key, csr) = (
        format!("{name}.pem"),
        format!("{name}.key"),
        format!("{name}.csr"),
    );
    openssl(
        dir,
        &[
            "req",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-keyout",
            &key,
            "-out",
            &csr,
            "-subj",
            &format!("/CN={name}"),
        ],
    );
    openssl(
        dir,
        &[
            "x509",
            "-req",
            "-in",
            &csr,
            "-CA",
            &format!("{ca}.pem"),
            "-CAkey",
            &format!("{ca}.key"),
            "-CAcreateserial",
            "-out",
            &pem,
            "-days",
            "2",
            "-extfile",
            &ext,
        ],
    );
    (dir.join(pem), dir.join(key))
}
