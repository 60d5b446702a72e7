//! The store's secrets and certificates, from the files `serve`'s flags
//! name or the environment ([`charon::kit::secret`]).

use std::path::PathBuf;

use charon::kit::secret::{self, SecretError};
use charon::store::StoreTls;

/// `--store-ca`, `--store-tls-cert` and `--store-tls-key`, read.
pub fn store_tls(
    ca: Option<PathBuf>,
    client: Option<(PathBuf, PathBuf)>,
) -> Result<Option<StoreTls>, SecretError> {
    if ca.is_none() && client.is_none() {
        return Ok(None);
    }
    let ca = ca.map(|path| secret::read_file("--store-ca", &path));
    let client = client.map(|(cert, key)| {
        let cert = secret::read_file("--store-tls-cert", &cert)?;
        Ok((cert, secret::read_file("--store-tls-key", &key)?))
    });
    Ok(Some(StoreTls {
        ca: ca.transpose()?,
        client: client.transpose()?,
    }))
}

/// `--store` with the password from `--store-password-file` or
/// `CHARON_STORE_PASSWORD`, if one is given.
pub fn with_store_password(
    store: String,
    file: Option<PathBuf>,
    user: Option<String>,
) -> anyhow::Result<String> {
    let flag = "--store-password-file";
    match secret::read(file.as_deref(), flag, "CHARON_STORE_PASSWORD")? {
        Some(password) => Ok(charon::store::redis::url::with_credentials(
            &store,
            user.as_deref(),
            &password,
        )?),
        None if user.is_some() => {
            anyhow::bail!("--store-user needs {flag} or CHARON_STORE_PASSWORD")
        }
        None => Ok(store),
    }
}
