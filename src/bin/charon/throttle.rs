//! `charon throttle`: the flags of the throttling sidecar, handed to
//! [`charon::throttle::run`].

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use charon::throttle::protect::Protection;
use charon::throttle::{ProxyOptions, TenantLimits, UpstreamSlots};

use crate::logging::{self, LogOptions};

#[derive(clap::Args)]
pub struct ThrottleArgs {
    /// Where the proxy listens (HTTP/1.1 and h2c).
    #[arg(long, default_value = "127.0.0.1:8090")]
    listen: SocketAddr,
    /// The one upstream, `http://host:port`.
    #[arg(long)]
    upstream: http::Uri,
    /// At most this many requests reach the upstream at once.
    #[arg(long, conflicts_with = "adaptive")]
    max_concurrency: Option<usize>,
    /// A concurrency limit that follows the upstream's latency (the
    /// default, unless --max-concurrency or --drain-rate alone is given).
    #[arg(long)]
    adaptive: bool,
    /// How many requests may wait: for a slot, or in the drain queue.
    #[arg(long, default_value_t = 100)]
    queue: usize,
    /// The requests-per-second form: a queue released at this rate
    /// (requests a second); a full queue refuses.
    #[arg(long)]
    drain_rate: Option<f64>,
    /// A budget of the upstream's time, in milliseconds a second: of CPU as
    /// its responses report it in --cost-header, else of latency. A request
    /// starts only while the budget is not in debt, at its predicted cost.
    #[arg(long)]
    cpu_budget_ms: Option<f64>,
    /// The response header in which the upstream reports a request's CPU
    /// time in milliseconds; costs are predicted per path from it.
    #[arg(long, default_value = "x-cpu-ms")]
    cost_header: http::HeaderName,
    /// The longest a request waits for a slot, in milliseconds (its own
    /// `grpc-timeout` or `x-envoy-expected-rq-timeout-ms` wins if shorter).
    #[arg(long, default_value_t = 1_000)]
    max_wait_ms: u64,
    /// The longest the upstream may take to send response headers, in
    /// milliseconds (then 504).
    #[arg(long, default_value_t = 30_000)]
    upstream_timeout_ms: u64,
    /// The longest requests in flight are awaited on SIGTERM, in
    /// milliseconds.
    #[arg(long, default_value_t = 10_000)]
    drain_timeout_ms: u64,
    /// Per-tenant limits before the queue (429 over them): a limits file
    /// (envoyproxy/ratelimit or Charon format) whose one domain has a
    /// descriptor keyed by --domain-header's name.
    #[arg(long, requires = "domain_header")]
    config: Option<PathBuf>,
    /// The header naming a request's tenant: its descriptor is
    /// `[(NAME, value)]` in the --config file's domain; a request without
    /// it is not limited.
    #[arg(long, requires = "config")]
    domain_header: Option<http::HeaderName>,
    /// Where `/readyz` (alias `/ready`), `/healthz`, `/stats` and `/metrics`
    /// are served.
    #[arg(long, default_value = "127.0.0.1:9103")]
    admin_addr: SocketAddr,
    #[command(flatten)]
    protection: ProtectionArgs,
}

/// The bounds against hostile clients
/// (docs/operations.md#charon-throttle-against-hostile-clients).
#[derive(clap::Args)]
struct ProtectionArgs {
    /// The most of a request body read before the request queues (larger:
    /// 413), and of an answer read ahead of its client (larger: the rest
    /// streams at the client's pace, without its slot), in bytes.
    #[arg(long, default_value_t = 1 << 20)]
    max_buffered_body: usize,
    /// The longest a request body may take to arrive whole, in
    /// milliseconds (then 408).
    #[arg(long, default_value_t = 30_000)]
    request_body_timeout_ms: u64,
    /// The longest a client may take to send a request's headers (or, on
    /// a new or idle connection, its first byte), in milliseconds; then
    /// the connection closes.
    #[arg(long, default_value_t = 10_000)]
    header_read_timeout_ms: u64,
    /// The longest a write to a client may make no progress, in
    /// milliseconds; then the connection closes.
    #[arg(long, default_value_t = 30_000)]
    response_write_timeout_ms: u64,
    /// The most client connections open at once (default: half the
    /// descriptor limit, raised to its hard limit at start, less 64). At
    /// the cap, the connection idle longest is closed for a new one.
    #[arg(long)]
    max_connections: Option<usize>,
    /// The listen backlog (the kernel caps it at net.core.somaxconn).
    #[arg(long, default_value_t = 1_024)]
    listen_backlog: u32,
    /// The most HTTP/2 streams open at once on one connection.
    #[arg(long, default_value_t = 100)]
    max_streams_per_connection: u32,
    /// The most requests one connection may cancel (RST_STREAM, or gone
    /// before its answer) in 10 s; then it is closed.
    #[arg(long, default_value_t = 100)]
    max_resets_per_connection: u32,
}

impl ProtectionArgs {
    fn protection(&self) -> Result<Protection, String> {
        if self.max_buffered_body == 0 {
            return Err("--max-buffered-body must be at least 1".into());
        }
        if self.max_connections == Some(0) {
            return Err("--max-connections must be at least 1".into());
        }
        if self.max_streams_per_connection == 0 {
            return Err("--max-streams-per-connection must be at least 1".into());
        }
        let millis = |ms: u64| Duration::from_millis(ms.max(1));
        Ok(Protection {
            max_buffered_body: self.max_buffered_body,
            request_body_timeout: millis(self.request_body_timeout_ms),
            header_read_timeout: millis(self.header_read_timeout_ms),
            response_write_timeout: millis(self.response_write_timeout_ms),
            max_connections: self.max_connections,
            listen_backlog: self.listen_backlog.max(1),
            max_streams_per_connection: self.max_streams_per_connection,
            max_resets_per_connection: self.max_resets_per_connection,
        })
    }
}

impl ThrottleArgs {
    fn options(&self) -> Result<ProxyOptions, String> {
        let slots = match (self.max_concurrency, self.adaptive, self.drain_rate) {
            (Some(limit), _, _) => UpstreamSlots::Fixed(limit),
            (None, false, Some(_)) => UpstreamSlots::Unlimited,
            (None, _, _) => UpstreamSlots::Adaptive,
        };
        let tenants = match (&self.config, &self.domain_header) {
            (Some(path), Some(header)) => Some(TenantLimits::load(path, header)?),
            _ => None,
        };
        let options = ProxyOptions {
            tenants,
            upstream: self.upstream.clone(),
            slots,
            queue: self.queue,
            max_wait: Duration::from_millis(self.max_wait_ms),
            drain_rate: self.drain_rate,
            cpu_budget: self.cpu_budget_ms,
            cost_header: self.cost_header.clone(),
            upstream_timeout: Duration::from_millis(self.upstream_timeout_ms.max(1)),
            drain_timeout: Duration::from_millis(self.drain_timeout_ms),
            protection: self.protection.protection()?,
        };
        options.check()?;
        Ok(options)
    }
}

pub fn run(args: ThrottleArgs, log: &LogOptions) -> ExitCode {
    let options = match args.options() {
        Ok(options) => options,
        Err(error) => {
            eprintln!("error: {error}");
            return ExitCode::FAILURE;
        }
    };
    logging::init(log, None);
    crate::run_to_end(charon::throttle::run(
        args.listen,
        Some(args.admin_addr),
        options,
    ))
}
