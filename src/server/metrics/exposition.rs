//! The sidecar's scrape: its registries, the process's series and
//! envoyproxy/ratelimit's, in the format the scraper asks for
//! ([`crate::kit::scrape`]); and where the metrics are served besides the
//! admin port (`MetricsOptions`).

use super::{Metrics, upstream};
use crate::kit::scrape::render;

/// Where the metrics are served besides the admin port, and what with.
#[derive(Debug, Clone, Default)]
pub struct MetricsOptions {
    /// A listener of its own (envoyproxy/ratelimit's `PROMETHEUS_ADDR`).
    pub addr: Option<std::net::SocketAddr>,
    /// The path there (`PROMETHEUS_PATH`; `/metrics` when empty).
    pub path: String,
    /// envoyproxy/ratelimit's series, following this mapper.
    pub upstream: Option<upstream::Mapper>,
}

impl Metrics {
    /// The configuration loaded at start: upstream counts a load from
    /// files then (over xDS, it counts each snapshot as it comes).
    pub fn first_load(&self, over_xds: bool) {
        if let (Some(upstream), false) = (&self.upstream, over_xds) {
            upstream.config_load(true);
        }
    }

    /// envoyproxy/ratelimit's series, if they are exported.
    pub fn upstream(&self) -> Option<&upstream::UpstreamMetrics> {
        self.upstream.as_ref()
    }

    /// A scrape's answer: its content type and text, in the format
    /// `accept` prefers (docs/operations.md#metrics), with the process's
    /// series and, if exported, envoyproxy/ratelimit's.
    pub fn exposition(
        &self,
        config: &crate::config::Config,
        accept: Option<&str>,
    ) -> (&'static str, String) {
        render(
            &[&self.registry, &self.process],
            accept,
            |openmetrics, out| {
                if let Some(upstream) = &self.upstream {
                    upstream.encode(config, openmetrics, out);
                }
            },
        )
    }
}
