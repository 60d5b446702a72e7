//! The store's secrets and certificates, read from files or the environment
//! so that they never sit on the command line (`/proc/PID/cmdline`) or in a
//! pod spec.

use std::path::PathBuf;

/// A secret from `file` (one trailing newline dropped) or the environment
/// variable `env`, not both, never empty.
pub fn secret(file: Option<PathBuf>, flag: &str, env: &str) -> anyhow::Result<Option<String>> {
    let from_env = std::env::var(env).ok();
    let secret = match (file, from_env) {
        (Some(_), Some(_)) => anyhow::bail!("given twice: {flag} and {env}"),
        (Some(path), None) => {
            let text = anyhow::Context::with_context(std::fs::read_to_string(&path), || {
                format!("cannot read {flag} {}", path.display())
            })?;
            Some(text.trim_end_matches(['\n', '\r']).to_owned())
        }
        (None, from_env) => from_env,
    };
    if secret.as_deref() == Some("") {
        anyhow::bail!("{flag} (or {env}) is empty");
    }
    Ok(secret)
}

/// `--store-ca`, `--store-tls-cert` and `--store-tls-key`, read.
pub fn store_tls(
    ca: Option<PathBuf>,
    client: Option<(PathBuf, PathBuf)>,
) -> anyhow::Result<Option<charon::store::StoreTls>> {
    if ca.is_none() && client.is_none() {
        return Ok(None);
    }
    let read = |flag: &str, path: &PathBuf| {
        std::fs::read(path)
            .map_err(|error| anyhow::anyhow!("cannot read {flag} {}: {error}", path.display()))
    };
    Ok(Some(charon::store::StoreTls {
        ca: ca
            .as_ref()
            .map(|path| read("--store-ca", path))
            .transpose()?,
        client: client
            .map(|(cert, key)| -> anyhow::Result<_> {
                Ok((
                    read("--store-tls-cert", &cert)?,
                    read("--store-tls-key", &key)?,
                ))
            })
            .transpose()?,
    }))
}

/// `--store` with the password from `--store-password-file` or
/// `CHARON_STORE_PASSWORD`, if one is given.
pub fn with_store_password(
    store: String,
    file: Option<PathBuf>,
    user: Option<String>,
) -> anyhow::Result<String> {
    match secret(file, "--store-password-file", "CHARON_STORE_PASSWORD")? {
        Some(ref password) => Ok(charon::store::redis::url::with_credentials(
            &store,
            user.as_deref(),
            password,
        )?),
        None if user.is_some() => {
            anyhow::bail!("--store-user needs --store-password-file or CHARON_STORE_PASSWORD")
        }
        None => Ok(store),
    }
}
