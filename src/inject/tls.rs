//! TLS for the webhook: a certificate reloaded from its files whenever they
//! change (a renewed Secret, cert-manager's rotation), without a restart, and
//! a listener that does TLS handshakes off the accept loop.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use arc_swap::ArcSwap;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::server::{ClientHello, ResolvesServerCert};
use rustls::sign::CertifiedKey;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;
use tokio_rustls::TlsAcceptor;
use tokio_rustls::server::TlsStream;

use super::InjectError;

/// How often the certificate files are looked at.
const RELOAD_POLL: Duration = Duration::from_secs(1);
/// A client must finish its TLS handshake within this.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

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
pub fn load(cert: &Path, key: &Path) -> Result<CertifiedKey, InjectError> {
    let bad =
        |path: &Path, why: String| InjectError::Certificate(format!("{}: {why}", path.display()));
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
    /// Loads the files now (an error stops the webhook from starting), then
    /// watches them: a change that loads replaces the certificate; one that
    /// does not is logged and the previous certificate kept.
    pub fn watch(cert: PathBuf, key: PathBuf) -> Result<Arc<Self>, InjectError> {
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

/// TLS connections, handshaken concurrently, for `axum::serve`.
pub struct TlsListener {
    accepted: mpsc::Receiver<(TlsStream<TcpStream>, SocketAddr)>,
    local: SocketAddr,
}

impl TlsListener {
    pub fn new(
        listener: TcpListener,
        certificate: Arc<ReloadingCert>,
    ) -> Result<Self, InjectError> {
        let local = listener
            .local_addr()
            .map_err(|e| InjectError::Listen(e.to_string()))?;
        let mut config = rustls::ServerConfig::builder_with_provider(Arc::new(
            rustls::crypto::ring::default_provider(),
        ))
        .with_safe_default_protocol_versions()
        .map_err(|e| InjectError::Certificate(e.to_string()))?
        .with_no_client_auth()
        .with_cert_resolver(certificate);
        config.alpn_protocols = vec![b"http/1.1".to_vec()];
        let acceptor = TlsAcceptor::from(Arc::new(config));
        let (sender, accepted) = mpsc::channel(64);
        tokio::spawn(async move {
            loop {
                let (tcp, peer) = match listener.accept().await {
                    Ok(accepted) => accepted,
                    Err(error) => {
                        tracing::warn!(%error, "accept failed");
                        tokio::time::sleep(Duration::from_millis(50)).await;
                        continue;
                    }
                };
                let acceptor = acceptor.clone();
                let sender = sender.clone();
                tokio::spawn(async move {
                    match tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(tcp)).await {
                        Ok(Ok(tls)) => {
                            let _ = sender.send((tls, peer)).await;
                        }
                        Ok(Err(error)) => tracing::debug!(%peer, %error, "TLS handshake failed"),
                        Err(_) => tracing::debug!(%peer, "TLS handshake timed out"),
                    }
                });
            }
        });
        Ok(Self { accepted, local })
    }
}

impl axum::serve::Listener for TlsListener {
    type Io = TlsStream<TcpStream>;
    type Addr = SocketAddr;

    async fn accept(&mut self) -> (Self::Io, Self::Addr) {
        match self.accepted.recv().await {
            Some(accepted) => accepted,
            // The accept task lives as long as the runtime.
            None => std::future::pending().await,
        }
    }

    fn local_addr(&self) -> std::io::Result<Self::Addr> {
        Ok(self.local)
    }
}
