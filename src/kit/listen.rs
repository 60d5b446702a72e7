//! Where the gRPC port takes its connections: the TCP listener (plain, or
//! TLS with optional client certificates), and a Unix socket beside it.
//! Every connection becomes one [`GrpcConn`] on one stream for tonic, so the
//! services behind are the same whatever the wire.
//!
//! - TCP sockets get `TCP_NODELAY`: an answer is one small write that must
//!   leave at once, not wait up to 40 ms for the client's delayed ACK.
//! - TLS handshakes run off the accept loop (a slow client delays only
//!   itself), with a deadline. The certificate is re-read when its files
//!   change (a Kubernetes Secret rotation); established connections keep
//!   theirs. With a client CA, a client must present a certificate it
//!   signed, and with allowed SANs, one naming one of them.
//! - The Unix socket is created with mode 0600 unless told otherwise, and
//!   removed at exit.

use std::net::SocketAddr;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use anyhow::Context as _;
use rustls::RootCertStore;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, ServerName};
use rustls::server::WebPkiClientVerifier;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream, UnixListener, UnixStream};
use tokio::sync::mpsc;
use tokio_rustls::TlsAcceptor;
use tokio_rustls::server::TlsStream;
use tokio_stream::wrappers::ReceiverStream;
use tonic::transport::server::{Connected, TcpConnectInfo};

use crate::kit::certificate::ReloadingCert;

/// A client must finish its TLS handshake within this.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// `--grpc-tls-cert`, `--grpc-tls-key`, `--grpc-client-ca`,
/// `--grpc-allowed-san`.
#[derive(Debug, Clone)]
pub struct TlsOptions {
    pub cert: PathBuf,
    pub key: PathBuf,
    /// Require client certificates signed by this CA (mTLS).
    pub client_ca: Option<PathBuf>,
    /// With a client CA: accept only certificates naming one of these (DNS
    /// names or IP addresses). Empty: any certificate the CA signed.
    pub allowed_sans: Vec<String>,
}

/// `--grpc-uds`, `--grpc-uds-mode`.
#[derive(Debug, Clone)]
pub struct UdsOptions {
    pub path: PathBuf,
    pub mode: u32,
}

/// One gRPC connection, whatever carries it.
pub enum GrpcConn {
    Tcp(TcpStream),
    Tls(Box<TlsStream<TcpStream>>),
    Unix(UnixStream),
}

/// The TLS side of the gRPC port.
#[derive(Clone)]
pub struct Tls {
    acceptor: TlsAcceptor,
    allowed_sans: Arc<[ServerName<'static>]>,
}

impl Tls {
    /// Loads the certificate (and watches it), the client CA and the SANs.
    /// Call within the runtime.
    pub fn new(options: &TlsOptions) -> anyhow::Result<Self> {
        let certificate = ReloadingCert::watch(options.cert.clone(), options.key.clone())
            .context("--grpc-tls-cert/--grpc-tls-key")?;
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let builder = rustls::ServerConfig::builder_with_provider(provider.clone())
            .with_safe_default_protocol_versions()
            .context("TLS protocol versions")?;
        let builder = match &options.client_ca {
            None => builder.with_no_client_auth(),
            Some(path) => {
                let mut roots = RootCertStore::empty();
                for certificate in CertificateDer::pem_file_iter(path)
                    .with_context(|| format!("--grpc-client-ca {}", path.display()))?
                {
                    let certificate = certificate
                        .with_context(|| format!("--grpc-client-ca {}", path.display()))?;
                    roots
                        .add(certificate)
                        .with_context(|| format!("--grpc-client-ca {}", path.display()))?;
                }
                let verifier =
                    WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider)
                        .build()
                        .with_context(|| format!("--grpc-client-ca {}", path.display()))?;
                builder.with_client_cert_verifier(verifier)
            }
        };
        if !options.allowed_sans.is_empty() && options.client_ca.is_none() {
            anyhow::bail!("--grpc-allowed-san needs --grpc-client-ca (client certificates)");
        }
        let allowed_sans = options
            .allowed_sans
            .iter()
            .map(|san| {
                ServerName::try_from(san.clone())
                    .with_context(|| format!("--grpc-allowed-san {san:?} is not a DNS name or IP"))
            })
            .collect::<anyhow::Result<Vec<_>>>()?;
        let mut config = builder.with_cert_resolver(certificate);
        config.alpn_protocols = vec![b"h2".to_vec()];
        Ok(Self {
            acceptor: TlsAcceptor::from(Arc::new(config)),
            allowed_sans: allowed_sans.into(),
        })
    }

    /// Whether the client's certificate names an allowed SAN (always, when
    /// no list is set).
    fn allowed(&self, stream: &TlsStream<TcpStream>) -> bool {
        if self.allowed_sans.is_empty() {
            return true;
        }
        let Some(leaf) = stream
            .get_ref()
            .1
            .peer_certificates()
            .and_then(|chain| chain.first())
        else {
            return false;
        };
        let Ok(leaf) = webpki::EndEntityCert::try_from(leaf) else {
            return false;
        };
        self.allowed_sans
            .iter()
            .any(|name| leaf.verify_is_valid_for_subject_name(name).is_ok())
    }
}

/// Binds the Unix socket: a stale socket file from a previous run is
/// replaced, anything else at `path` is an error.
pub fn bind_uds(options: &UdsOptions) -> anyhow::Result<UnixListener> {
    let path = &options.path;
    if let Ok(metadata) = std::fs::symlink_metadata(path) {
        use std::os::unix::fs::FileTypeExt;
        if !metadata.file_type().is_socket() {
            anyhow::bail!(
                "--grpc-uds {}: a file that is not a socket is there",
                path.display()
            );
        }
        std::fs::remove_file(path)
            .with_context(|| format!("cannot replace --grpc-uds {}", path.display()))?;
    }
    let listener = UnixListener::bind(path)
        .with_context(|| format!("cannot listen on --grpc-uds {}", path.display()))?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(options.mode))
        .with_context(|| format!("cannot set the mode of --grpc-uds {}", path.display()))?;
    Ok(listener)
}

/// Removes the Unix socket at exit.
pub fn remove_uds(path: &Path) {
    if let Err(error) = std::fs::remove_file(path)
        && error.kind() != std::io::ErrorKind::NotFound
    {
        tracing::warn!(%error, path = %path.display(), "cannot remove the gRPC socket");
    }
}

/// The connections of `tcp` (through `tls` when set) and of `uds`, as one
/// stream for tonic.
pub fn incoming(
    tcp: TcpListener,
    tls: Option<Tls>,
    uds: Option<UnixListener>,
) -> ReceiverStream<std::io::Result<GrpcConn>> {
    let (sender, receiver) = mpsc::channel(64);
    tokio::spawn(accept_tcp(tcp, tls, sender.clone()));
    if let Some(uds) = uds {
        tokio::spawn(async move {
            loop {
                match uds.accept().await {
                    Ok((stream, _)) => {
                        if sender.send(Ok(GrpcConn::Unix(stream))).await.is_err() {
                            return;
                        }
                    }
                    Err(error) => {
                        tracing::warn!(%error, "gRPC socket accept failed");
                        tokio::time::sleep(Duration::from_millis(50)).await;
                    }
                }
            }
        });
    }
    ReceiverStream::new(receiver)
}

async fn accept_tcp(
    tcp: TcpListener,
    tls: Option<Tls>,
    sender: mpsc::Sender<std::io::Result<GrpcConn>>,
) {
    loop {
        let (stream, peer) = match tcp.accept().await {
            Ok(accepted) => accepted,
            Err(error) => {
                tracing::warn!(%error, "gRPC accept failed");
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        if let Err(error) = stream.set_nodelay(true) {
            tracing::debug!(%error, "cannot set TCP_NODELAY");
        }
        let Some(tls) = tls.clone() else {
            if sender.send(Ok(GrpcConn::Tcp(stream))).await.is_err() {
                return;
            }
            continue;
        };
        let sender = sender.clone();
        tokio::spawn(async move {
            match tokio::time::timeout(HANDSHAKE_TIMEOUT, tls.acceptor.accept(stream)).await {
                Ok(Ok(stream)) if tls.allowed(&stream) => {
                    let _ = sender.send(Ok(GrpcConn::Tls(Box::new(stream)))).await;
                }
                Ok(Ok(_)) => tracing::warn!(%peer, "client certificate names no allowed SAN"),
                Ok(Err(error)) => tracing::debug!(%peer, %error, "TLS handshake failed"),
                Err(_) => tracing::debug!(%peer, "TLS handshake timed out"),
            }
        });
    }
}

impl Connected for GrpcConn {
    type ConnectInfo = TcpConnectInfo;

    fn connect_info(&self) -> TcpConnectInfo {
        let tcp = match self {
            GrpcConn::Tcp(stream) => Some(stream),
            GrpcConn::Tls(stream) => Some(stream.get_ref().0),
            GrpcConn::Unix(_) => None,
        };
        TcpConnectInfo {
            local_addr: tcp.and_then(|s| s.local_addr().ok()),
            remote_addr: tcp.and_then(|s| s.peer_addr().ok()),
        }
    }
}

impl AsyncRead for GrpcConn {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        match self.get_mut() {
            GrpcConn::Tcp(stream) => Pin::new(stream).poll_read(cx, buf),
            GrpcConn::Tls(stream) => Pin::new(stream.as_mut()).poll_read(cx, buf),
            GrpcConn::Unix(stream) => Pin::new(stream).poll_read(cx, buf),
        }
    }
}

impl AsyncWrite for GrpcConn {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        match self.get_mut() {
            GrpcConn::Tcp(stream) => Pin::new(stream).poll_write(cx, buf),
            GrpcConn::Tls(stream) => Pin::new(stream.as_mut()).poll_write(cx, buf),
            GrpcConn::Unix(stream) => Pin::new(stream).poll_write(cx, buf),
        }
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        match self.get_mut() {
            GrpcConn::Tcp(stream) => Pin::new(stream).poll_write_vectored(cx, bufs),
            GrpcConn::Tls(stream) => Pin::new(stream.as_mut()).poll_write_vectored(cx, bufs),
            GrpcConn::Unix(stream) => Pin::new(stream).poll_write_vectored(cx, bufs),
        }
    }

    fn is_write_vectored(&self) -> bool {
        match self {
            GrpcConn::Tcp(stream) => stream.is_write_vectored(),
            GrpcConn::Tls(stream) => stream.is_write_vectored(),
            GrpcConn::Unix(stream) => stream.is_write_vectored(),
        }
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        match self.get_mut() {
            GrpcConn::Tcp(stream) => Pin::new(stream).poll_flush(cx),
            GrpcConn::Tls(stream) => Pin::new(stream.as_mut()).poll_flush(cx),
            GrpcConn::Unix(stream) => Pin::new(stream).poll_flush(cx),
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        match self.get_mut() {
            GrpcConn::Tcp(stream) => Pin::new(stream).poll_shutdown(cx),
            GrpcConn::Tls(stream) => Pin::new(stream.as_mut()).poll_shutdown(cx),
            GrpcConn::Unix(stream) => Pin::new(stream).poll_shutdown(cx),
        }
    }
}

/// The address the gRPC port answers on, for the startup log.
pub fn describe(tcp: SocketAddr, tls: bool, uds: Option<&UdsOptions>) -> String {
    let scheme = if tls { "https" } else { "http" };
    match uds {
        Some(uds) => format!("{scheme}://{tcp} and unix:{}", uds.path.display()),
        None => format!("{scheme}://{tcp}"),
    }
}

#[cfg(test)]
mod tests {
    use tokio_stream::StreamExt;

    use super::*;

    #[tokio::test]
    async fn tcp_connections_have_nagle_off() {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("a port");
        let address = listener.local_addr().expect("an address");
        let mut incoming = incoming(listener, None, None);
        let _client = TcpStream::connect(address).await.expect("connects");
        let accepted = incoming
            .next()
            .await
            .expect("a connection")
            .expect("accepted");
        let GrpcConn::Tcp(stream) = accepted else {
            panic!("a plain TCP connection");
        };
        assert!(stream.nodelay().expect("readable"), "TCP_NODELAY is set");
    }
}
