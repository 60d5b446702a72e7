//! An OTLP collector's trace service for the trace tests, over gRPC
//! (`Collector`) and over HTTP (`HttpCollector`, a wiremock server: no
//! collector installs here): each listens on a free loopback port and keeps
//! every span Charon (or Envoy) sends it.

use std::sync::{Arc, Mutex};

/// An OTLP collector's trace service, started by the test: keeps every span
/// it is sent.
#[derive(Clone, Default)]
pub struct Collector(Arc<Mutex<Vec<opentelemetry_proto::tonic::trace::v1::Span>>>);

#[tonic::async_trait]
impl opentelemetry_proto::tonic::collector::trace::v1::trace_service_server::TraceService
    for Collector
{
    async fn export(
        &self,
        request: tonic::Request<
            opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest,
        >,
    ) -> Result<
        tonic::Response<
            opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceResponse,
        >,
        tonic::Status,
    > {
        let mut spans = self.0.lock().expect("the span list");
        for resource in request.into_inner().resource_spans {
            for scope in resource.scope_spans {
                spans.extend(scope.spans);
            }
        }
        Ok(tonic::Response::new(Default::default()))
    }
}

impl Collector {
    /// Serves on a free loopback port; returns the endpoint to give Charon.
    pub async fn start(&self) -> String {
        use opentelemetry_proto::tonic::collector::trace::v1::trace_service_server::TraceServiceServer;
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("a port for the collector");
        let endpoint = format!("http://{}", listener.local_addr().expect("its address"));
        let service = TraceServiceServer::new(self.clone());
        tokio::spawn(
            tonic::transport::Server::builder()
                .add_service(service)
                .serve_with_incoming(tokio_stream::wrappers::TcpListenerStream::new(listener)),
        );
        endpoint
    }

    pub fn spans(&self) -> Vec<opentelemetry_proto::tonic::trace::v1::Span> {
        self.0.lock().expect("the span list").clone()
    }
}

/// An OTLP/HTTP collector: answers every POST to `/v1/traces` and decodes
/// what it was sent.
pub struct HttpCollector(wiremock::MockServer);

/// A span as a collector files it: under its resource's attributes.
#[derive(Debug, Clone)]
pub struct Received {
    pub resource: std::collections::BTreeMap<String, String>,
    pub span: opentelemetry_proto::tonic::trace::v1::Span,
}

impl HttpCollector {
    pub async fn start() -> HttpCollector {
        use wiremock::matchers::{method, path};
        let server = wiremock::MockServer::start().await;
        wiremock::Mock::given(method("POST"))
            .and(path("/v1/traces"))
            .respond_with(
                wiremock::ResponseTemplate::new(200)
                    .insert_header("content-type", "application/x-protobuf"),
            )
            .mount(&server)
            .await;
        HttpCollector(server)
    }

    /// Its base URL, as `OTEL_EXPORTER_OTLP_ENDPOINT` takes it.
    pub fn endpoint(&self) -> String {
        self.0.uri()
    }

    /// Every span received so far; a body that is not OTLP protobuf fails
    /// the test.
    pub async fn received(&self) -> Vec<Received> {
        use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
        use prost::Message as _;
        let mut out = Vec::new();
        for request in self.0.received_requests().await.unwrap_or_default() {
            assert_eq!(
                request
                    .headers
                    .get("content-type")
                    .and_then(|value| value.to_str().ok()),
                Some("application/x-protobuf"),
                "OTLP/HTTP protobuf"
            );
            let export = ExportTraceServiceRequest::decode(request.body.as_slice())
                .expect("an OTLP export request");
            for resource in export.resource_spans {
                let attributes = resource
                    .resource
                    .map(|resource| resource.attributes)
                    .unwrap_or_default()
                    .into_iter()
                    .filter_map(|kv| {
                        use opentelemetry_proto::tonic::common::v1::any_value::Value;
                        match kv.value?.value? {
                            Value::StringValue(text) => Some((kv.key, text)),
                            _ => None,
                        }
                    })
                    .collect::<std::collections::BTreeMap<_, _>>();
                for scope in resource.scope_spans {
                    for span in scope.spans {
                        out.push(Received {
                            resource: attributes.clone(),
                            span,
                        });
                    }
                }
            }
        }
        out
    }
}

pub fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// A span's string (or bool, as text) attribute.
pub fn attribute(span: &opentelemetry_proto::tonic::trace::v1::Span, key: &str) -> Option<String> {
    use opentelemetry_proto::tonic::common::v1::any_value::Value;
    let value = span
        .attributes
        .iter()
        .find(|kv| kv.key == key)?
        .value
        .as_ref()?;
    match value.value.as_ref()? {
        Value::StringValue(text) => Some(text.clone()),
        Value::BoolValue(flag) => Some(flag.to_string()),
        other => Some(format!("{other:?}")),
    }
}
