//! What `charon throttle` is asked to do: how many requests may reach the
//! upstream, how many wait and for how long, the per-tenant limits in front,
//! and the bounds a client lives under; checked before anything listens.

use std::time::Duration;

use http::Uri;

use super::protect::Protection;

/// How many requests may reach the upstream at once.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum UpstreamSlots {
    /// At most this many.
    Fixed(usize),
    /// A limit that follows the upstream's latency, between 1 and
    /// [`ADAPTIVE_MAX`], starting at [`ADAPTIVE_START`].
    Adaptive,
    /// No limit: only the drain queue, if any, throttles.
    Unlimited,
}

/// Where the adaptive limit starts.
pub const ADAPTIVE_START: usize = 8;
/// The most the adaptive limit lets through at once.
pub const ADAPTIVE_MAX: usize = 1_000;

/// What `charon throttle` was asked to do.
#[derive(Debug, Clone)]
pub struct ProxyOptions {
    /// The upstream, `http://host:port`.
    pub upstream: Uri,
    pub slots: UpstreamSlots,
    /// How many requests may wait: for a slot, or in the drain queue.
    pub queue: usize,
    /// The longest a request waits for a slot (a shorter deadline of its
    /// own wins).
    pub max_wait: Duration,
    /// The requests-per-second form: a FIFO released at this rate.
    pub drain_rate: Option<f64>,
    /// A budget of the upstream's milliseconds per second (of CPU, as its
    /// responses report them in `cost_header`; else of latency).
    pub cpu_budget: Option<f64>,
    /// The response header in which the upstream reports a request's cost
    /// in milliseconds (CPU time): predicted per path from it.
    pub cost_header: http::HeaderName,
    /// Per-tenant limits, decided before a request queues (429).
    pub tenants: Option<TenantLimits>,
    /// The longest the upstream may take to send response headers.
    pub upstream_timeout: Duration,
    /// The longest requests in flight are awaited on shutdown.
    pub drain_timeout: Duration,
    /// The bounds a client's requests and connections live under.
    pub protection: Protection,
}

/// Per-tenant limits in front of the throttle: quota and overload in one
/// component. Each request is one descriptor of `namespace`,
/// `[(header name, its value)]`, decided by the engine in this process; a
/// request without the header is not limited.
#[derive(Debug, Clone)]
pub struct TenantLimits {
    pub config: crate::config::Config,
    pub namespace: String,
    pub header: http::HeaderName,
}

impl ProxyOptions {
    /// Whether the options make a throttle: the message names the flag that
    /// does not.
    pub fn check(&self) -> Result<(), String> {
        if self.slots == UpstreamSlots::Fixed(0) {
            return Err("--max-concurrency must be at least 1".into());
        }
        if let Some(rate) = self.drain_rate
            && !(rate.is_finite() && (1.0 / 60.0..=1e9).contains(&rate))
        {
            return Err(format!(
                "--drain-rate must be a number of requests a second, at least one a minute (0.0167), not {rate}"
            ));
        }
        if let Some(budget) = self.cpu_budget {
            if !(budget.is_finite() && budget > 0.0 && budget <= 1e9) {
                return Err(format!(
                    "--cpu-budget-ms must be a number of milliseconds a second above 0, not {budget}"
                ));
            }
            if self.slots == UpstreamSlots::Unlimited {
                return Err("--cpu-budget-ms needs --max-concurrency or --adaptive".into());
            }
        }
        if self.queue == 0 && self.drain_rate.is_some() {
            return Err("--queue must be at least 1 with --drain-rate".into());
        }
        Ok(())
    }
}

impl TenantLimits {
    /// The limits of the one namespace the file at `path` holds, keyed by
    /// `header`.
    pub fn load(path: &std::path::Path, header: &http::HeaderName) -> Result<Self, String> {
        let loaded = crate::config::load_path(path).map_err(|errors| errors.to_string())?;
        let names: Vec<String> = loaded
            .config
            .namespaces()
            .map(|namespace| namespace.name.clone())
            .collect();
        let namespace = match names.as_slice() {
            [namespace] => namespace.clone(),
            [] => return Err(format!("--config {}: no domain", path.display())),
            _ => {
                return Err(format!(
                    "--config {}: one domain, not several (one file)",
                    path.display()
                ));
            }
        };
        Ok(TenantLimits {
            config: loaded.config,
            namespace,
            header: header.clone(),
        })
    }
}
