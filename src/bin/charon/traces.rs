//! The trace flags of `charon serve`: where spans go, under which service,
//! how many requests (docs/operations.md#traces).

use charon::kit::otlp::TraceExport;

use crate::serve::parse_ratio;

#[derive(clap::Args, Clone, Debug)]
pub struct TraceArgs {
    /// Send traces over OTLP/gRPC to this collector (`http://collector:4317`):
    /// a span per traced ShouldRateLimit and per Redis call it makes,
    /// joined to the caller's trace by its W3C `traceparent`.
    #[arg(long, env = "CHARON_OTLP_ENDPOINT")]
    pub otlp_endpoint: Option<String>,
    /// Send traces over OTLP/HTTP (protobuf) to this collector: its base
    /// URL (`http://collector:4318`, posted to `/v1/traces`) or the full
    /// URL of its trace path. With --otlp-endpoint too, each gets every
    /// span.
    #[arg(long, env = "CHARON_OTLP_HTTP_ENDPOINT")]
    pub otlp_http_endpoint: Option<String>,
    /// The traces' `service.name`.
    #[arg(long, env = "CHARON_TRACE_SERVICE_NAME", default_value = "charon")]
    pub trace_service_name: String,
    /// The traces' `service.namespace` (none by default).
    #[arg(long, env = "CHARON_TRACE_SERVICE_NAMESPACE")]
    pub trace_service_namespace: Option<String>,
    /// The traces' `service.instance.id` (a pod's name, say); random at
    /// each start by default.
    #[arg(long, env = "CHARON_TRACE_SERVICE_INSTANCE_ID")]
    pub trace_service_instance_id: Option<String>,
    /// With an exporter: the share of requests without a `traceparent`
    /// that are traced, 0 to 1. A caller's sampled or unsampled
    /// `traceparent` decides for its own requests.
    #[arg(long, env = "CHARON_TRACE_SAMPLE_RATIO", default_value_t = 0.01, value_parser = parse_ratio)]
    pub trace_sample_ratio: f64,
}

impl TraceArgs {
    /// Where traces go (`--otlp-endpoint`, `--otlp-http-endpoint`).
    pub fn export(&self) -> TraceExport {
        TraceExport {
            grpc: self.otlp_endpoint.clone(),
            http: self.otlp_http_endpoint.clone(),
            service_name: self.trace_service_name.clone(),
            service_namespace: self.trace_service_namespace.clone(),
            service_instance_id: self.trace_service_instance_id.clone(),
        }
    }
}
