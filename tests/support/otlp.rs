//! An OTLP collector's trace service for the trace tests: it listens on a
//! free loopback port and keeps every span Charon (or Envoy) sends it.

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
