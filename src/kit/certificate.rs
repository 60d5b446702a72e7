//! A TLS certificate read from its files and re-read whenever they change (a
//! renewed Kubernetes Secret, cert-manager's rotation), without a restart:
//! new handshakes get the new certificate, established connections keep
//! theirs. The gRPC port and the admission webhook both serve one.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use arc_swap::ArcSwap;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::server::{ClientHello, ResolvesServerCert};
use rustls::sign::CertifiedKey;

/// How often the certificate files are looked at.
const RELOAD_POLL: Duration = Duration::from_secs(1);

/// A certificate chain or key that does not load, with the file named.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct CertificateError(String);

/// The current certificate, swapped when the files change.
#[derive(Debug)]
pub struct ReloadingCert {
    current: ArcSwap<CertifiedKey>,
}

impl ResolvesServerCert for ReloadingCert {
    fn resolve(&self, _hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        Some(self.current.load_full())
    }
}

/// Reads a PEM certificate chain and private key.
pub fn load(cert: &Path, key: &Path) -> Result<CertifiedKey, CertificateError> {
    let bad = |path: &Path, why: String| CertificateError(format!("{}: {why}", path.display()));
    let chain = CertificateDer::pem_file_iter(cert)
        .map_err(|error| bad(cert, error.to_string()))?
        .collect::<Result<Vec<_>, _>>()
        .map_err(|error| bad(cert, error.to_string()))?;
    if chain.is_empty() {
        return Err(bad(cert, "no certificate in the file".into()));
    }
    let private = PrivateKeyDer::from_pem_file(key).map_err(|error| bad(key, error.to_string()))?;
    let signing = rustls::crypto::ring::sign::any_supported_type(&private)
        .map_err(|error| bad(key, error.to_string()))?;
    let certified = CertifiedKey::new(chain, signing);
    certified
        .keys_match()
        .map_err(|error| bad(key, format!("does not match the certificate: {error}")))?;
    Ok(certified)
}

fn stamp(path: &Path) -> Option<(SystemTime, u64)> {
    let metadata = std::fs::metadata(path).ok()?;
    Some((metadata.modified().ok()?, metadata.len()))
}

impl ReloadingCert {
    /// Loads the files now (an error stops the server from starting), then
    /// watches them: a change that loads replaces the certificate; one that
    /// does not is logged and the previous certificate kept.
    pub fn watch(cert: PathBuf, key: PathBuf) -> Result<Arc<Self>, CertificateError> {
        let reloading = Arc::new(Self {
            current: ArcSwap::from_pointee(load(&cert, &key)?),
        });
        let weak = Arc::downgrade(&reloading);
        tokio::spawn(async move {
            let mut seen = (stamp(&cert), stamp(&key));
            loop {
                tokio::time::sleep(RELOAD_POLL).await;
                let Some(this) = weak.upgrade() else { return };
                let now = (stamp(&cert), stamp(&key));
                if now == seen {
                    continue;
                }
                seen = now;
                match load(&cert, &key) {
                    Ok(certified) => {
                        this.current.store(Arc::new(certified));
                        tracing::info!(cert = %cert.display(), "reloaded the TLS certificate");
                    }
                    Err(error) => {
                        tracing::warn!(%error, "the new TLS certificate does not load; keeping the previous one");
                    }
                }
            }
        });
        Ok(reloading)
    }
}
