//! `charon serve`'s metrics flags: where the metrics listen besides the
//! admin port, and envoyproxy/ratelimit's series
//! (docs/envoy-compatibility.md#metrics), with the flags of the deciding
//! limit's name in the answer's dynamic metadata.

use std::net::SocketAddr;
use std::path::PathBuf;

use clap::ArgAction;
use clap::builder::BoolishValueParser;

#[derive(clap::Args)]
pub struct MetricsArgs {
    /// Also serve the metrics on this address, on a listener of its own
    /// (envoyproxy/ratelimit's PROMETHEUS_ADDR); they are always on the
    /// admin port's /metrics too.
    #[arg(long, env = "CHARON_METRICS_ADDR")]
    pub metrics_addr: Option<SocketAddr>,
    /// The path of the metrics on --metrics-addr (PROMETHEUS_PATH).
    #[arg(long, env = "CHARON_METRICS_PATH", default_value = "/metrics", value_parser = parse_path)]
    pub metrics_path: String,
    /// Export envoyproxy/ratelimit's series too, with its names, labels
    /// and meaning (`ratelimit_service_*`), beside Charon's own.
    #[arg(long, env = "CHARON_UPSTREAM_METRICS", action = ArgAction::SetTrue, value_parser = BoolishValueParser::new())]
    pub upstream_metrics: bool,
    /// With --upstream-metrics: the statsd_exporter mapping file an
    /// upstream deployment mounts (PROMETHEUS_MAPPER_YAML); its response
    /// time's `scale` is followed, and what else it changes is logged.
    #[arg(
        long,
        env = "CHARON_UPSTREAM_METRICS_MAPPER",
        requires = "upstream_metrics"
    )]
    pub upstream_metrics_mapper: Option<PathBuf>,
    /// With --upstream-metrics and no mapper file: the response time in
    /// milliseconds, as PROMETHEUS_RESPONSE_TIME_AS_MILLISECONDS asks.
    #[arg(long, env = "CHARON_UPSTREAM_RESPONSE_TIME_MS", action = ArgAction::SetTrue, value_parser = BoolishValueParser::new())]
    pub upstream_response_time_ms: bool,
    /// Name the limit that decided each answer in its dynamic metadata
    /// (`decidingLimit`), for Envoy's access log.
    #[arg(long, env = "CHARON_RESPONSE_DECIDING_LIMIT", action = ArgAction::SetTrue, value_parser = BoolishValueParser::new())]
    pub response_deciding_limit: bool,
}

impl MetricsArgs {
    /// The mapper to follow, when upstream's series are exported.
    pub fn upstream(&self) -> Option<charon::server::metrics::upstream::Mapper> {
        use charon::server::metrics::upstream::Mapper;
        if !self.upstream_metrics {
            return None;
        }
        Some(match &self.upstream_metrics_mapper {
            Some(path) => Mapper::read(path),
            None => Mapper::default_with(self.upstream_response_time_ms),
        })
    }
}

/// `--metrics-path`: an absolute path.
fn parse_path(text: &str) -> Result<String, String> {
    if text.starts_with('/') && !text.contains(['?', '#', '{', '}', '*']) {
        Ok(text.to_owned())
    } else {
        Err(format!(
            "{text:?}: expected an absolute path such as /metrics"
        ))
    }
}
