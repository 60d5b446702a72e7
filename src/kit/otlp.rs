//! Where the spans of traced requests go: OTLP over gRPC, OTLP over HTTP
//! (protobuf), or both at once, each exporter sent every span, under the
//! service's name, namespace and instance id (docs/operations.md#traces).
//! Which requests are traced is the faces' business (`server::trace`); this module
//! only carries what was traced.
//!
//! Spans are batched by the OpenTelemetry SDK on its own thread, so a
//! collector that is slow, down or unreachable costs the decision path
//! nothing: the batch fills, then drops, and the request never waits. That
//! thread has no Tokio runtime, so the HTTP exporter's requests are run on
//! the server's runtime through a client of its own, and the gRPC exporter's
//! channel is made on it.

use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt as _, Full};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use opentelemetry::KeyValue;
use opentelemetry::trace::TracerProvider as _;
use opentelemetry_http::{HttpClient, HttpError, Request, Response};
use opentelemetry_otlp::{WithExportConfig as _, WithHttpConfig as _};
use opentelemetry_sdk::trace::SdkTracerProvider;
use tracing::Level;
use tracing_subscriber::filter::Targets;
use tracing_subscriber::{Layer, Registry};

/// The longest one export may take before it is given up (OTLP's default).
const EXPORT_TIMEOUT: Duration = Duration::from_secs(10);

/// Where traces go and under which service.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TraceExport {
    /// A collector's OTLP/gRPC endpoint (`http://collector:4317`).
    pub grpc: Option<String>,
    /// A collector's OTLP/HTTP base URL (`http://collector:4318`), or the
    /// full URL of its trace path; see [`http_traces_url`].
    pub http: Option<String>,
    /// The resource's `service.name`.
    pub service_name: String,
    /// `service.namespace`, when given.
    pub service_namespace: Option<String>,
    /// `service.instance.id`; a random one when not given, as upstream
    /// does, so that two replicas' spans never look like one process's.
    pub service_instance_id: Option<String>,
}

impl TraceExport {
    /// Whether any exporter is configured.
    pub fn is_on(&self) -> bool {
        self.grpc.is_some() || self.http.is_some()
    }
}

/// A trace exporter that cannot be built (a URL that does not parse).
#[derive(Debug, thiserror::Error)]
pub enum TraceExportError {
    #[error("--otlp-endpoint {endpoint}: {reason}")]
    Grpc { endpoint: String, reason: String },
    #[error("--otlp-http-endpoint {endpoint}: {reason}")]
    Http { endpoint: String, reason: String },
}

/// The running exporters.
pub struct Traces {
    provider: SdkTracerProvider,
}

impl Traces {
    /// Starts the exporters `export` names; `None` when it names none.
    /// Call within the runtime: the exporters send from it. The collectors
    /// need not be up: spans wait in the batch.
    pub fn start(export: &TraceExport) -> Result<Option<Self>, TraceExportError> {
        if !export.is_on() {
            return Ok(None);
        }
        let mut provider = SdkTracerProvider::builder().with_resource(resource(export));
        if let Some(endpoint) = &export.grpc {
            let exporter = opentelemetry_otlp::SpanExporter::builder()
                .with_tonic()
                .with_endpoint(endpoint)
                .with_timeout(EXPORT_TIMEOUT)
                .build()
                .map_err(|error| TraceExportError::Grpc {
                    endpoint: endpoint.clone(),
                    reason: error.to_string(),
                })?;
            provider = provider.with_batch_exporter(exporter);
        }
        if let Some(endpoint) = &export.http {
            let invalid = |reason: String| TraceExportError::Http {
                endpoint: endpoint.clone(),
                reason,
            };
            let url = http_traces_url(endpoint).map_err(invalid)?;
            let exporter = opentelemetry_otlp::SpanExporter::builder()
                .with_http()
                .with_protocol(opentelemetry_otlp::Protocol::HttpBinary)
                .with_endpoint(url)
                .with_timeout(EXPORT_TIMEOUT)
                .with_http_client(RuntimeHttp::new())
                .build()
                .map_err(|error| invalid(error.to_string()))?;
            provider = provider.with_batch_exporter(exporter);
        }
        Ok(Some(Self {
            provider: provider.build(),
        }))
    }

    /// The layer that turns the request spans (and only those) into
    /// OpenTelemetry spans.
    pub fn layer(&self) -> Box<dyn Layer<Registry> + Send + Sync> {
        tracing_opentelemetry::layer()
            .with_tracer(self.provider.tracer("charon"))
            .with_filter(Targets::new().with_target(crate::spans::TARGET, Level::TRACE))
            .boxed()
    }

    /// Sends what is batched and stops. Off the runtime's threads: the
    /// flush waits on the exporters, which send from the runtime.
    pub async fn shutdown(self) {
        let provider = self.provider;
        match tokio::task::spawn_blocking(move || provider.shutdown()).await {
            Ok(Ok(())) => {}
            Ok(Err(error)) => tracing::warn!(%error, "the trace exporter did not flush"),
            Err(error) => tracing::warn!(%error, "the trace exporter did not stop"),
        }
    }
}

fn resource(export: &TraceExport) -> opentelemetry_sdk::Resource {
    let instance = export
        .service_instance_id
        .clone()
        .unwrap_or_else(random_instance_id);
    let mut attributes = vec![KeyValue::new("service.instance.id", instance)];
    if let Some(namespace) = &export.service_namespace {
        attributes.push(KeyValue::new("service.namespace", namespace.clone()));
    }
    opentelemetry_sdk::Resource::builder()
        .with_service_name(export.service_name.clone())
        .with_attributes(attributes)
        .build()
}

/// 128 random bits in hex, as a UUID would carry.
fn random_instance_id() -> String {
    let mut bytes = [0u8; 16];
    // A failed draw leaves zeros: an id that is only less unique.
    let _ = getrandom::fill(&mut bytes);
    bytes.iter().map(|byte| format!("{byte:02x}")).collect()
}

/// The URL spans are posted to: OTLP/HTTP's rule for a base endpoint
/// (`OTEL_EXPORTER_OTLP_ENDPOINT`) is to add `/v1/traces`; a URL that
/// already has a path is taken as the trace path itself. Only `http`: the
/// exporter speaks no TLS.
pub fn http_traces_url(endpoint: &str) -> Result<String, String> {
    let uri: http::Uri = endpoint
        .parse()
        .map_err(|error| format!("not a URL: {error}"))?;
    match uri.scheme_str() {
        Some("http") => {}
        Some("https") => return Err("https is not supported; use http".into()),
        _ => return Err("expected http://HOST:PORT".into()),
    }
    if uri.host().is_none_or(str::is_empty) {
        return Err("expected http://HOST:PORT".into());
    }
    let path = uri.path();
    if path.is_empty() || path == "/" {
        Ok(format!("{}/v1/traces", endpoint.trim_end_matches('/')))
    } else {
        Ok(endpoint.to_owned())
    }
}

/// An HTTP/1 client whose requests run on the runtime it was made in: the
/// SDK's batch thread, which calls it, has none.
#[derive(Debug)]
struct RuntimeHttp {
    runtime: tokio::runtime::Handle,
    client: Client<HttpConnector, Full<Bytes>>,
}

impl RuntimeHttp {
    /// Must be called within the runtime.
    fn new() -> Self {
        Self {
            runtime: tokio::runtime::Handle::current(),
            client: Client::builder(TokioExecutor::new()).build_http(),
        }
    }
}

#[async_trait::async_trait]
impl HttpClient for RuntimeHttp {
    async fn send_bytes(&self, request: Request<Bytes>) -> Result<Response<Bytes>, HttpError> {
        let client = self.client.clone();
        let sent = self.runtime.spawn(async move {
            let (parts, body) = request.into_parts();
            let request = Request::from_parts(parts, Full::new(body));
            let exchange = async {
                let response = client.request(request).await?;
                let (parts, body) = response.into_parts();
                let body = body.collect().await?.to_bytes();
                Ok::<_, HttpError>(Response::from_parts(parts, body))
            };
            match tokio::time::timeout(EXPORT_TIMEOUT, exchange).await {
                Ok(answer) => answer,
                Err(_) => Err("the collector did not answer in time".into()),
            }
        });
        sent.await?
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_base_endpoint_gets_the_trace_path_and_a_full_one_is_kept() {
        assert_eq!(
            http_traces_url("http://collector:4318").as_deref(),
            Ok("http://collector:4318/v1/traces")
        );
        assert_eq!(
            http_traces_url("http://collector:4318/").as_deref(),
            Ok("http://collector:4318/v1/traces")
        );
        assert_eq!(
            http_traces_url("http://collector:4318/otlp/v1/traces").as_deref(),
            Ok("http://collector:4318/otlp/v1/traces")
        );
        assert!(http_traces_url("https://collector:4318").is_err());
        assert!(http_traces_url("collector:4318").is_err());
        assert!(http_traces_url("").is_err());
    }
}
