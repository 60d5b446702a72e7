//! Configuration over xDS (docs/envoy-compatibility.md#configuration-over-xds):
//! an Aggregated Discovery Service client, state of the world, for
//! envoyproxy/ratelimit's `RateLimitConfig` resources, as Envoy Gateway's
//! controller serves them to its rate-limit backend.
//!
//! One piece: the ADS stream, its ACKs and NACKs and the swap of what it
//! pushed are one protocol loop; the translation of a resource is in
//! `translate.rs`.
//!
//! Each response is the whole set of pushed domains. It is translated into
//! the file format (`translate`), loaded with the files and the
//! configuration API's objects, and swapped in whole
//! ([`Configuration::push`]), then ACKed with its version and nonce; or it
//! is NACKed with a message naming the resource and the problem, and the
//! last good configuration keeps serving. Decisions never wait for the
//! control plane: a stalled or lost stream only delays the next change.
//! A lost stream is reopened at once, then with backoff and jitter, and
//! the first request of a new stream carries the last ACKed version.

pub mod extensions;
pub mod translate;

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use envoy_types::pb::envoy::config::core::v3::{Node, node::UserAgentVersionType};
use envoy_types::pb::envoy::service::discovery::v3::aggregated_discovery_service_client::AggregatedDiscoveryServiceClient;
use envoy_types::pb::envoy::service::discovery::v3::{DiscoveryRequest, DiscoveryResponse};
use envoy_types::pb::google::protobuf::{Struct, Value, value::Kind};
use envoy_types::pb::google::rpc::Status;
use envoy_types::pb::ratelimit::config::ratelimit::v3::RateLimitConfig;
use prost::Message;
use tokio::sync::{mpsc, watch};
use tonic::transport::{Certificate, ClientTlsConfig, Endpoint, Identity};

use crate::config::PushedNamespace;
use crate::service::configuration::Configuration;

use super::metrics::{Metrics, ReloadResult};

/// The resource type this client asks for.
pub const RATE_LIMIT_CONFIG_TYPE: &str =
    "type.googleapis.com/ratelimit.config.ratelimit.v3.RateLimitConfig";

/// Past this, a response is not even decoded (the stream is reset): the
/// configured cap is checked below it, where a response can still be NACKed.
const DECODE_CEILING: usize = 256 * 1024 * 1024;

/// How the client reaches its control plane.
#[derive(Debug, Clone)]
pub struct XdsOptions {
    /// `host:port`, or a URL (`http://`, `https://`).
    pub server: String,
    pub node_id: String,
    pub node_metadata: Vec<(String, String)>,
    /// Sent with every stream (`CONFIG_GRPC_XDS_CLIENT_ADDITIONAL_HEADERS`).
    pub headers: Vec<(String, String)>,
    pub tls: Option<XdsTls>,
    pub backoff: Backoff,
    /// A response larger than this is NACKed.
    pub max_message_bytes: usize,
    /// Serve before the first snapshot (not ready until it arrives);
    /// otherwise the sidecar waits for it before it listens.
    pub force_start: bool,
    /// Charon's extensions for the pushed limits (`--xds-extensions`),
    /// as read at start, and their file, read again when it changes.
    pub extensions: Arc<extensions::Extensions>,
    pub extensions_path: Option<PathBuf>,
}

/// TLS to the control plane: the CA that signs its certificate, this
/// client's certificate for mutual TLS, the name the server's certificate
/// must carry (default: the host of `server`).
#[derive(Debug, Clone)]
pub struct XdsTls {
    pub ca: PathBuf,
    pub identity: Option<(PathBuf, PathBuf)>,
    pub san: Option<String>,
}

/// Waits between failed attempts: from `initial`, doubling up to `max`,
/// each spread by ±`random_factor` when `jitter` is on.
#[derive(Debug, Clone, Copy)]
pub struct Backoff {
    pub initial: Duration,
    pub max: Duration,
    pub random_factor: f64,
    pub jitter: bool,
}

impl Default for Backoff {
    fn default() -> Self {
        Self {
            initial: Duration::from_secs(1),
            max: Duration::from_secs(60),
            random_factor: 0.5,
            jitter: true,
        }
    }
}

impl Backoff {
    /// The wait before attempt `failures` (1 for the first retry).
    pub fn wait(&self, failures: u32, random: f64) -> Duration {
        let doubled = self
            .initial
            .saturating_mul(1u32 << failures.saturating_sub(1).min(20));
        let base = doubled.min(self.max);
        if !self.jitter {
            return base;
        }
        let spread = 1.0 + self.random_factor.clamp(0.0, 1.0) * (2.0 * random - 1.0);
        base.mul_f64(spread.max(0.0))
    }
}

/// Why the client cannot start: a file it needs, or the server's address.
#[derive(Debug, thiserror::Error)]
pub enum XdsError {
    #[error("{flag} {path}: {reason}")]
    File {
        flag: &'static str,
        path: PathBuf,
        reason: String,
    },
    #[error("--config-xds (CONFIG_GRPC_XDS_SERVER_URL) {server}: {reason}")]
    Server { server: String, reason: String },
}

/// What the configuration source reports: whether a first snapshot was
/// applied (the readiness gate when started without one).
#[derive(Debug, Clone)]
pub struct XdsStatus {
    pub applied_first: watch::Receiver<bool>,
}

/// Checks the options (certificates read, address parsed) and starts the
/// client; it runs until `shutdown`.
pub fn spawn(
    options: XdsOptions,
    configuration: Arc<Configuration>,
    metrics: Arc<Metrics>,
    mut shutdown: watch::Receiver<bool>,
) -> Result<XdsStatus, XdsError> {
    let endpoint = endpoint(&options)?;
    let (applied_tx, applied_first) = watch::channel(false);
    let extensions = match &options.extensions_path {
        Some(path) => Some(extensions::watch(
            path.clone(),
            options.extensions.clone(),
            EXTENSIONS_EVERY,
            shutdown.clone(),
        )),
        None => None,
    };
    let mut client = Client {
        options,
        configuration,
        metrics,
        extensions,
        last: None,
        acked: None,
        applied: applied_tx,
    };
    tokio::spawn(async move {
        let mut failures = 0u32;
        loop {
            let outcome = tokio::select! {
                _ = shutdown.changed() => return,
                outcome = client.stream(&endpoint) => outcome,
            };
            match outcome {
                // A stream that answered is reopened at once.
                Ok(()) => failures = 0,
                Err(error) => {
                    failures = failures.saturating_add(1);
                    let wait = client.options.backoff.wait(failures, random_unit());
                    tracing::warn!(
                        server = %client.options.server,
                        %error,
                        retry_in = ?wait,
                        "xDS stream lost; serving the last configuration"
                    );
                    tokio::select! {
                        _ = shutdown.changed() => return,
                        _ = tokio::time::sleep(wait) => {}
                    }
                }
            }
        }
    });
    Ok(XdsStatus { applied_first })
}

struct Client {
    options: XdsOptions,
    configuration: Arc<Configuration>,
    metrics: Arc<Metrics>,
    /// The extensions as their file says now, when there is one.
    extensions: Option<watch::Receiver<Arc<extensions::Extensions>>>,
    /// The last response applied, to apply again with new extensions.
    last: Option<DiscoveryResponse>,
    /// The version of the last response ACKed.
    acked: Option<String>,
    applied: watch::Sender<bool>,
}

impl Client {
    /// One stream, from connecting to its end. `Ok` if the server answered
    /// at least once before the stream ended.
    async fn stream(&mut self, endpoint: &Endpoint) -> Result<(), String> {
        let channel = endpoint
            .connect()
            .await
            .map_err(|error| format!("cannot connect: {}", error_chain(&error)))?;
        let mut client = AggregatedDiscoveryServiceClient::new(channel)
            .max_decoding_message_size(DECODE_CEILING.max(self.options.max_message_bytes));
        let (requests, outgoing) = mpsc::channel::<DiscoveryRequest>(4);
        let first = self.request(self.acked.clone().unwrap_or_default(), String::new(), None);
        requests
            .send(first)
            .await
            .map_err(|_| "the request stream closed".to_owned())?;
        let mut request =
            tonic::Request::new(tokio_stream::wrappers::ReceiverStream::new(outgoing));
        for (name, value) in &self.options.headers {
            let name = tonic::metadata::MetadataKey::from_bytes(name.as_bytes())
                .map_err(|_| format!("header name `{name}` is not valid"))?;
            let value = value
                .parse()
                .map_err(|_| format!("header `{name}`'s value is not valid"))?;
            request.metadata_mut().insert(name, value);
        }
        let mut responses = client
            .stream_aggregated_resources(request)
            .await
            .map_err(|status| format!("the server refused the stream: {status}"))?
            .into_inner();
        tracing::info!(server = %self.options.server, node = %self.options.node_id, "xDS stream open");
        let mut answered = false;
        loop {
            let message = tokio::select! {
                message = responses.message() => message,
                () = extensions_changed(self.extensions.as_mut()) => {
                    self.reapply().await;
                    continue;
                }
            };
            let response = match message {
                Ok(Some(response)) => response,
                Ok(None) if answered => return Ok(()),
                Ok(None) => return Err("the server ended the stream".into()),
                Err(_) if answered => return Ok(()),
                Err(status) => return Err(format!("the stream failed: {status}")),
            };
            answered = true;
            let reply = self.apply(&response).await;
            if requests.send(reply).await.is_err() {
                return Ok(());
            }
        }
    }

    /// The extensions in force: the file's latest good version.
    fn extensions(&self) -> Arc<extensions::Extensions> {
        match &self.extensions {
            Some(receiver) => receiver.borrow().clone(),
            None => self.options.extensions.clone(),
        }
    }

    /// Applies the last response again, with the extensions just read.
    async fn reapply(&mut self) {
        let Some(response) = self.last.clone() else {
            return;
        };
        let extensions = self.extensions();
        let pushed = pushed_namespaces(&response, self.options.max_message_bytes, &extensions);
        let applied = match pushed {
            Ok(namespaces) => self
                .configuration
                .push(namespaces)
                .await
                .map_err(|errors| errors.to_string()),
            Err(reason) => Err(reason),
        };
        match applied {
            Ok(count) => {
                self.metrics.set_namespaces(count);
                tracing::info!(version = %response.version_info, "xDS snapshot applied again with the new extensions");
            }
            Err(reason) => tracing::error!(
                %reason,
                "the new xDS extensions do not load with the last snapshot; keeping the running configuration"
            ),
        }
    }

    /// Applies one response; the ACK or NACK to send back.
    async fn apply(&mut self, response: &DiscoveryResponse) -> DiscoveryRequest {
        let acked = self.acked.clone().unwrap_or_default();
        let nonce = response.nonce.clone();
        let extensions = self.extensions();
        let pushed = pushed_namespaces(response, self.options.max_message_bytes, &extensions);
        let refused = match pushed {
            Err(reason) => Some(reason),
            Ok(namespaces) => match self.configuration.push(namespaces).await {
                Ok(count) => {
                    self.metrics.reload(ReloadResult::Ok);
                    self.metrics.set_namespaces(count);
                    tracing::info!(
                        version = %response.version_info,
                        resources = response.resources.len(),
                        namespaces = count,
                        "xDS configuration applied"
                    );
                    None
                }
                Err(errors) => Some(format!("invalid configuration:\n{errors}")),
            },
        };
        match refused {
            None => {
                self.last = Some(response.clone());
                self.acked = Some(response.version_info.clone());
                self.applied.send_replace(true);
                self.request(response.version_info.clone(), nonce, None)
            }
            Some(reason) => {
                self.metrics.reload(ReloadResult::Rejected);
                tracing::error!(
                    version = %response.version_info,
                    %reason,
                    "xDS configuration refused (NACK); keeping the running one"
                );
                let status = Status {
                    code: tonic::Code::InvalidArgument as i32,
                    message: reason,
                    details: Vec::new(),
                };
                self.request(acked, nonce, Some(status))
            }
        }
    }

    fn request(&self, version: String, nonce: String, error: Option<Status>) -> DiscoveryRequest {
        DiscoveryRequest {
            version_info: version,
            node: Some(node(&self.options)),
            resource_names: Vec::new(),
            type_url: RATE_LIMIT_CONFIG_TYPE.to_owned(),
            response_nonce: nonce,
            error_detail: error,
            ..Default::default()
        }
    }
}

/// How often the extensions' file is looked at for a change.
const EXTENSIONS_EVERY: Duration = Duration::from_secs(2);

/// Resolves when `extensions` changed; never without a file to watch (or
/// once its watcher stopped, at shutdown).
async fn extensions_changed(extensions: Option<&mut watch::Receiver<Arc<extensions::Extensions>>>) {
    let changed = match extensions {
        Some(receiver) => receiver.changed().await.is_ok(),
        None => false,
    };
    if !changed {
        std::future::pending::<()>().await;
    }
}

/// The response's resources as namespaces in the file format, or why it
/// cannot be applied, naming the resource.
pub fn pushed_namespaces(
    response: &DiscoveryResponse,
    max_bytes: usize,
    extensions: &extensions::Extensions,
) -> Result<Vec<PushedNamespace>, String> {
    let size = response.encoded_len();
    if size > max_bytes {
        return Err(format!(
            "the response is {size} bytes; the limit is {max_bytes} (XDS_CLIENT_MAX_MSG_SIZE_IN_BYTES)"
        ));
    }
    if response.type_url != RATE_LIMIT_CONFIG_TYPE {
        return Err(format!(
            "the response is of type `{}`; this client asks for `{RATE_LIMIT_CONFIG_TYPE}`",
            response.type_url
        ));
    }
    let mut domains: Vec<(String, String)> = Vec::new();
    let mut namespaces = Vec::new();
    let mut matched = vec![false; extensions.len()];
    for (index, resource) in response.resources.iter().enumerate() {
        if resource.type_url != RATE_LIMIT_CONFIG_TYPE {
            return Err(format!(
                "resource #{index} is a `{}`, not a RateLimitConfig",
                resource.type_url
            ));
        }
        let config = RateLimitConfig::decode(resource.value.as_slice())
            .map_err(|error| format!("resource #{index} does not decode: {error}"))?;
        let name = if config.name.is_empty() {
            format!("#{index}")
        } else {
            config.name.clone()
        };
        if let Some((first, _)) = domains.iter().find(|(_, domain)| *domain == config.domain) {
            return Err(format!(
                "resources `{first}` and `{name}` both configure domain `{}`",
                config.domain
            ));
        }
        domains.push((name.clone(), config.domain.clone()));
        let mut file = translate::file_json(&config);
        extensions.apply(&mut file, &mut matched);
        namespaces.push(PushedNamespace {
            origin: PathBuf::from(format!("xds:{name}")),
            // A tree of strings, numbers and booleans always serializes.
            text: serde_json::to_string_pretty(&file).unwrap_or_default(),
        });
    }
    for place in extensions.unmatched(&matched) {
        tracing::warn!(
            extension = place,
            "an xDS extension matches no pushed limit"
        );
    }
    Ok(namespaces)
}

fn node(options: &XdsOptions) -> Node {
    let metadata = (!options.node_metadata.is_empty()).then(|| Struct {
        fields: options
            .node_metadata
            .iter()
            .map(|(key, value)| {
                (
                    key.clone(),
                    Value {
                        kind: Some(Kind::StringValue(value.clone())),
                    },
                )
            })
            .collect(),
    });
    Node {
        id: options.node_id.clone(),
        metadata,
        user_agent_name: "charon".to_owned(),
        user_agent_version_type: Some(UserAgentVersionType::UserAgentVersion(
            env!("CARGO_PKG_VERSION").to_owned(),
        )),
        ..Default::default()
    }
}

/// The channel to the control plane, with the certificates read now so
/// that a missing or mismatched file stops the start.
fn endpoint(options: &XdsOptions) -> Result<Endpoint, XdsError> {
    let server_error = |reason: String| XdsError::Server {
        server: options.server.clone(),
        reason,
    };
    let scheme = if options.tls.is_some() {
        "https"
    } else {
        "http"
    };
    let url = if options.server.contains("://") {
        options.server.clone()
    } else {
        format!("{scheme}://{}", options.server)
    };
    let uri: http::Uri = url
        .parse()
        .map_err(|error| server_error(format!("not an address: {error}")))?;
    let host = uri
        .host()
        .ok_or_else(|| server_error("no host".into()))?
        .trim_start_matches('[')
        .trim_end_matches(']')
        .to_owned();
    let mut endpoint = Endpoint::from(uri)
        .connect_timeout(Duration::from_secs(5))
        .http2_keep_alive_interval(Duration::from_secs(30))
        .keep_alive_timeout(Duration::from_secs(10));
    if let Some(tls) = &options.tls {
        let ca = read(
            &tls.ca,
            "--config-xds-ca (CONFIG_GRPC_XDS_SERVER_TLS_CACERT)",
        )?;
        check_ca(&tls.ca)?;
        let mut config = ClientTlsConfig::new()
            .ca_certificate(Certificate::from_pem(ca))
            .domain_name(tls.san.clone().unwrap_or(host));
        if let Some((cert, key)) = &tls.identity {
            let cert_pem = read(cert, "--config-xds-cert (CONFIG_GRPC_XDS_CLIENT_TLS_CERT)")?;
            let key_pem = read(key, "--config-xds-key (CONFIG_GRPC_XDS_CLIENT_TLS_KEY)")?;
            crate::kit::certificate::load(cert, key).map_err(|error| XdsError::File {
                flag: "--config-xds-cert (CONFIG_GRPC_XDS_CLIENT_TLS_CERT)",
                path: cert.clone(),
                reason: error.to_string(),
            })?;
            config = config.identity(Identity::from_pem(cert_pem, key_pem));
        }
        endpoint = endpoint
            .tls_config(config)
            .map_err(|error| server_error(format!("TLS: {error}")))?;
    }
    Ok(endpoint)
}

fn read(path: &Path, flag: &'static str) -> Result<Vec<u8>, XdsError> {
    std::fs::read(path).map_err(|error| XdsError::File {
        flag,
        path: path.to_owned(),
        reason: format!("cannot read: {error}"),
    })
}

/// The CA file holds at least one certificate, all of them readable.
fn check_ca(path: &Path) -> Result<(), XdsError> {
    use rustls::pki_types::CertificateDer;
    use rustls::pki_types::pem::PemObject;
    let bad = |reason: String| XdsError::File {
        flag: "--config-xds-ca (CONFIG_GRPC_XDS_SERVER_TLS_CACERT)",
        path: path.to_owned(),
        reason,
    };
    let certificates = CertificateDer::pem_file_iter(path)
        .map_err(|error| bad(error.to_string()))?
        .collect::<Result<Vec<_>, _>>()
        .map_err(|error| bad(error.to_string()))?;
    if certificates.is_empty() {
        return Err(bad("no certificate in the file".into()));
    }
    Ok(())
}

fn error_chain(error: &dyn std::error::Error) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        text.push_str(": ");
        text.push_str(&cause.to_string());
        source = cause.source();
    }
    text
}

/// A number in [0, 1) for jitter.
fn random_unit() -> f64 {
    let mut bytes = [0u8; 8];
    if getrandom::fill(&mut bytes).is_err() {
        return 0.5;
    }
    (u64::from_le_bytes(bytes) >> 11) as f64 / (1u64 << 53) as f64
}

#[cfg(test)]
mod tests;
