//! Secrets and certificates read from files or the environment, so that
//! they never sit on the command line (`/proc/PID/cmdline`) or in a pod
//! spec: each error names the flag that gave the file.

use std::path::{Path, PathBuf};

/// A secret or a certificate that could not be read.
#[derive(Debug, thiserror::Error)]
pub enum SecretError {
    #[error("given twice: {flag} and {env}")]
    Twice { flag: String, env: String },
    #[error("cannot read {flag} {}: {source}", path.display())]
    Unreadable {
        flag: String,
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{flag} (or {env}) is empty")]
    Empty { flag: String, env: String },
}

/// A secret from `file` (given by `flag`; one trailing newline dropped) or
/// the environment variable `env`, not both, never empty.
pub fn read(file: Option<&Path>, flag: &str, env: &str) -> Result<Option<String>, SecretError> {
    let secret = match (file, std::env::var(env).ok()) {
        (Some(_), Some(_)) => {
            return Err(SecretError::Twice {
                flag: flag.to_owned(),
                env: env.to_owned(),
            });
        }
        (Some(path), None) => {
            let text = std::fs::read_to_string(path).map_err(|source| SecretError::Unreadable {
                flag: flag.to_owned(),
                path: path.to_owned(),
                source,
            })?;
            Some(text.trim_end_matches(['\n', '\r']).to_owned())
        }
        (None, from_env) => from_env,
    };
    if secret.as_deref() == Some("") {
        return Err(SecretError::Empty {
            flag: flag.to_owned(),
            env: env.to_owned(),
        });
    }
    Ok(secret)
}

/// The bytes of the file `flag` names (a certificate, a key).
pub fn read_file(flag: &str, path: &Path) -> Result<Vec<u8>, SecretError> {
    std::fs::read(path).map_err(|source| SecretError::Unreadable {
        flag: flag.to_owned(),
        path: path.to_owned(),
        source,
    })
}
