//! `charon serve`: its flags, and the sidecar's options built from them.
//!
//! One piece: every flag of `charon serve`, with its environment variable,
//! its default and its check, sits beside the option it sets: split, a flag
//! and its meaning would be read in two places.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;

use charon::server::xds::extensions::Extensions;
use clap::ArgAction;
use clap::builder::BoolishValueParser;

use crate::logging::{self, LogOptions};
use crate::secrets::{store_tls, with_store_password};
use crate::traces::TraceArgs;

/// Run the sidecar: Envoy's RateLimitService over gRPC, admin HTTP beside it.
#[derive(clap::Args)]
pub struct ServeArgs {
    /// A configuration file, or a directory of *.yaml files.
    #[arg(long, env = "CHARON_CONFIG")]
    pub config: PathBuf,
    /// Where the gRPC services (Envoy RLS, health) listen.
    #[arg(long, env = "CHARON_GRPC_ADDR", default_value = "127.0.0.1:8081")]
    pub grpc_addr: SocketAddr,
    /// gRPC streams in flight per connection (HTTP/2
    /// SETTINGS_MAX_CONCURRENT_STREAMS); more wait in the client.
    #[arg(long, env = "CHARON_GRPC_MAX_CONCURRENT_STREAMS", default_value_t = 1024, value_parser = clap::value_parser!(u32).range(1..))]
    pub grpc_max_concurrent_streams: u32,
    /// HTTP/2 pings on idle gRPC connections, to drop peers that vanished.
    #[arg(long, env = "CHARON_GRPC_KEEPALIVE", default_value = "30s", value_parser = parse_timeout)]
    pub grpc_keepalive: std::time::Duration,
    /// Close gRPC connections older than this, gracefully (default:
    /// never). A Charon API session ends with its connection.
    #[arg(long, env = "CHARON_GRPC_MAX_CONNECTION_AGE", value_parser = parse_timeout)]
    pub grpc_max_connection_age: Option<std::time::Duration>,
    /// TLS on the gRPC port: the certificate chain (PEM), re-read when
    /// the file changes.
    #[arg(long, env = "CHARON_GRPC_TLS_CERT", requires = "grpc_tls_key")]
    pub grpc_tls_cert: Option<PathBuf>,
    /// The certificate's private key (PEM), re-read when it changes.
    #[arg(long, env = "CHARON_GRPC_TLS_KEY", requires = "grpc_tls_cert")]
    pub grpc_tls_key: Option<PathBuf>,
    /// mTLS: require client certificates signed by this CA (PEM).
    #[arg(long, env = "CHARON_GRPC_CLIENT_CA", requires = "grpc_tls_cert")]
    pub grpc_client_ca: Option<PathBuf>,
    /// With --grpc-client-ca: accept only client certificates naming this
    /// DNS name or IP (repeat, or comma-separated).
    #[arg(
        long,
        env = "CHARON_GRPC_ALLOWED_SAN",
        value_delimiter = ',',
        requires = "grpc_client_ca"
    )]
    pub grpc_allowed_san: Vec<String>,
    /// Also serve gRPC on this Unix socket (Envoy reaches it as a pipe).
    #[arg(long, env = "CHARON_GRPC_UDS")]
    pub grpc_uds: Option<PathBuf>,
    /// The socket's file mode, octal.
    #[arg(long, env = "CHARON_GRPC_UDS_MODE", default_value = "600", value_parser = parse_mode)]
    pub grpc_uds_mode: u32,
    /// Where /healthz, /readyz and /metrics listen.
    #[arg(long, env = "CHARON_ADMIN_ADDR", default_value = "127.0.0.1:9102")]
    pub admin_addr: SocketAddr,
    /// A file holding the bearer token that `/debug/*` and the
    /// simulator's sessions require (a mounted Secret). Without one, they
    /// answer only on a loopback --admin-addr; probes and /metrics never
    /// need it.
    #[arg(long, env = "CHARON_ADMIN_TOKEN_FILE")]
    pub admin_token_file: Option<PathBuf>,
    /// After SIGTERM, go on answering this long while /readyz and gRPC
    /// health say not ready, before the gRPC port stops taking calls: for a
    /// central Deployment behind a Service, whose endpoint removal is
    /// asynchronous. A native sidecar needs none (default 0s).
    #[arg(long, env = "CHARON_SHUTDOWN_DELAY", default_value = "0s", value_parser = parse_shutdown_delay)]
    pub shutdown_delay: std::time::Duration,
    /// On the memory store: the file where the configuration API's changes
    /// are kept across restarts (written atomically). Without it they last
    /// as long as the process. On Redis they live in Redis.
    #[arg(long, env = "CHARON_CONFIG_STATE")]
    pub config_state: Option<PathBuf>,
    /// Where state lives: `memory` (embedded), or Redis shared by several
    /// sidecars: redis://[user:password@]host:port[/db], rediss:// (TLS),
    /// redis+sentinel://[user:password@]host:port[,…]/service[/db],
    /// redis+cluster://[user:password@]host:port[,host:port…].
    #[arg(long, env = "CHARON_STORE", default_value = "memory")]
    pub store: String,
    /// A file holding the Redis password (a mounted Secret), so that it
    /// is neither in the URL nor on the command line. Or set
    /// CHARON_STORE_PASSWORD.
    #[arg(long, env = "CHARON_STORE_PASSWORD_FILE")]
    pub store_password_file: Option<PathBuf>,
    /// The Redis ACL user that the password from the file or
    /// CHARON_STORE_PASSWORD belongs to.
    #[arg(long, env = "CHARON_STORE_USER")]
    pub store_user: Option<String>,
    /// With redis+sentinel://: a file holding the sentinels' own
    /// password. Or set CHARON_STORE_SENTINEL_PASSWORD.
    #[arg(long, env = "CHARON_STORE_SENTINEL_PASSWORD_FILE")]
    pub store_sentinel_password_file: Option<PathBuf>,
    /// `rediss://`: the CA to trust (PEM) instead of the system's roots.
    #[arg(long, env = "CHARON_STORE_CA")]
    pub store_ca: Option<PathBuf>,
    /// `rediss://`: a client certificate (PEM), for a Redis that asks
    /// for one (its default, `tls-auth-clients yes`).
    #[arg(long, env = "CHARON_STORE_TLS_CERT", requires = "store_tls_key")]
    pub store_tls_cert: Option<PathBuf>,
    /// The client certificate's private key (PEM).
    #[arg(long, env = "CHARON_STORE_TLS_KEY", requires = "store_tls_cert")]
    pub store_tls_key: Option<PathBuf>,
    /// Written before every Redis key, so that two fleets can share one
    /// Redis without seeing each other's counts (CACHE_KEY_PREFIX).
    #[arg(long, env = "CHARON_STORE_KEY_PREFIX", default_value = "", value_parser = charon::store::keys::KeyPrefix::new)]
    pub store_key_prefix: charon::store::keys::KeyPrefix,
    /// The deadline of one Redis decision, e.g. 50ms, 1s.
    #[arg(long, env = "CHARON_STORE_TIMEOUT", default_value = "50ms", value_parser = parse_timeout)]
    pub store_timeout: std::time::Duration,
    /// What to answer while Redis is unreachable: `allow`, `deny`, or
    /// `local` (decide on an in-process memory store with the same limits).
    #[arg(long, env = "CHARON_ON_STORE_ERROR", default_value = "local")]
    pub on_store_error: charon::store::OnStoreError,
    /// The memory store's cap on keys. At the cap, a request that needs a
    /// new key is decided as for a fresh tenant but not remembered.
    #[arg(long, env = "CHARON_MAX_KEYS", default_value_t = charon::store::DEFAULT_MAX_KEYS)]
    pub max_keys: usize,
    /// With Redis: how often this sidecar renews its heartbeat in the copy log.
    #[arg(long, env = "CHARON_HEARTBEAT", default_value = "1s", value_parser = parse_timeout)]
    pub heartbeat: std::time::Duration,
    /// With Redis: how long a heartbeat lives. A sidecar that cannot renew
    /// it for `ttl - heartbeat` resigns; one silent for `ttl` is dead and
    /// its holds are reaped.
    #[arg(long, env = "CHARON_HEARTBEAT_TTL", default_value = "5s", value_parser = parse_timeout)]
    pub heartbeat_ttl: std::time::Duration,
    /// With Redis: how often the reaper looks for dead sidecars and
    /// expired transfers.
    #[arg(long, env = "CHARON_REAP_INTERVAL", default_value = "1s", value_parser = parse_timeout)]
    pub reap_interval: std::time::Duration,
    /// Charon API sessions served at once; more are refused (RESOURCE_EXHAUSTED).
    #[arg(long, env = "CHARON_MAX_SESSIONS", default_value_t = 10_000)]
    pub max_sessions: usize,
    /// The parent Charon's gRPC URL: `capacity:` resources marked
    /// `from_parent` take their capacity from it as a lease
    /// (docs/design.md#a-hierarchy-of-servers).
    #[arg(long, env = "CHARON_PARENT", requires = "level_id")]
    pub parent: Option<String>,
    /// Who this level is to its parent: the same for the replicas of one
    /// level, different for the levels that share a parent.
    #[arg(long, env = "CHARON_LEVEL_ID", requires = "parent")]
    pub level_id: Option<String>,
    /// How often a global limit's shares are renewed, this server's own and
    /// its children's (docs/design.md#global-limits); at least 100ms.
    #[arg(long, env = "CHARON_GLOBAL_REFRESH_INTERVAL", default_value = "500ms", value_parser = parse_timeout)]
    pub global_refresh_interval: std::time::Duration,
    /// How long a share of a global limit lasts without a renewal: how long
    /// the shares stand when the parent is away; at least twice the refresh
    /// interval.
    #[arg(long, env = "CHARON_GLOBAL_LEASE", default_value = "10s", value_parser = parse_timeout)]
    pub global_lease: std::time::Duration,
    /// What this server admits of a global limit while its parent is away,
    /// once its last share expired, for the limits without a `safe_share`
    /// of their own: `last` (its last grant, kept: the servers below a
    /// missing parent admit its share together, split as the demand last
    /// was), `split` (the parent's equal split among them), `whole` (the
    /// whole limit each), a count, or a percentage (`25%`)
    /// (docs/design.md#global-limits, "The parent away").
    #[arg(long, env = "CHARON_GLOBAL_SAFE_SHARE", default_value = "last", value_parser = charon::config::global::SafeShare::parse)]
    pub global_safe_share: charon::config::global::SafeShare,
    /// Files naming the same domain add their descriptors to it
    /// (envoyproxy/ratelimit's MERGE_DOMAIN_CONFIG) instead of being an error.
    #[arg(long, env = "CHARON_MERGE_DOMAIN_CONFIG", action = ArgAction::SetTrue, value_parser = BoolishValueParser::new())]
    pub merge_domain_config: bool,
    /// Answer OK to requests over their limits; statuses still say which
    /// descriptors are over, and each is counted (SHADOW_MODE).
    #[arg(long, env = "CHARON_SHADOW_MODE", action = ArgAction::SetTrue, value_parser = BoolishValueParser::new())]
    pub shadow_mode: bool,
    /// Every descriptor is a quota descriptor: a request is over only
    /// when all of them are (QUOTA_MODE).
    #[arg(long, env = "CHARON_QUOTA_MODE", action = ArgAction::SetTrue, value_parser = BoolishValueParser::new())]
    pub quota_mode: bool,
    /// Count every fixed-window hit, rejected or not, as envoyproxy/ratelimit
    /// does: a cost charged after the response then stops the next checks
    /// once it passes the budget. By default a rejected request consumes
    /// nothing (docs/configuration.md#counting-rejected-hits).
    #[arg(long, env = "CHARON_COUNT_REJECTED_HITS", action = ArgAction::SetTrue, value_parser = BoolishValueParser::new())]
    pub count_rejected_hits: bool,
    /// Headers Envoy adds to the client's response: `none`, `ratelimit`
    /// (envoyproxy/ratelimit's RateLimit-Limit/-Remaining/-Reset) or `ietf`
    /// (RateLimit-Policy and RateLimit, and Retry-After when over).
    #[arg(long, env = "CHARON_RESPONSE_HEADERS", default_value = "none")]
    pub response_headers: HeaderMode,
    /// Which descriptors those headers describe: `deciding` (the one that
    /// decided, envoyproxy/ratelimit's choice) or `every` (every descriptor
    /// that had a limit: each its own policy with `ietf`, every limit in the
    /// limit header with `ratelimit`).
    #[arg(long, env = "CHARON_RESPONSE_HEADERS_FOR", default_value = "deciding")]
    pub response_headers_for: HeadersForMode,
    /// With `--response-headers ratelimit`: the limit header's name.
    #[arg(long, env = "CHARON_LIMIT_HEADER", default_value = "RateLimit-Limit")]
    pub limit_header: String,
    /// With `--response-headers ratelimit`: the remaining header's name.
    #[arg(
        long,
        env = "CHARON_REMAINING_HEADER",
        default_value = "RateLimit-Remaining"
    )]
    pub remaining_header: String,
    /// With `--response-headers ratelimit`: the reset header's name.
    #[arg(long, env = "CHARON_RESET_HEADER", default_value = "RateLimit-Reset")]
    pub reset_header: String,
    /// Return the request and the matched descriptors' `metadata` in the
    /// response's dynamic_metadata (RESPONSE_DYNAMIC_METADATA).
    #[arg(long, env = "CHARON_RESPONSE_DYNAMIC_METADATA", action = ArgAction::SetTrue, value_parser = BoolishValueParser::new())]
    pub response_dynamic_metadata: bool,
    /// Runtime threads: 0 for one per CPU the process may use, and a
    /// single-threaded runtime when that is one (it batches answers
    /// into fewer writes); 1 for single-threaded.
    #[arg(long, env = "CHARON_THREADS", default_value_t = 0, value_parser = clap::value_parser!(u16).range(0..=1024))]
    pub threads: u16,
    #[command(flatten)]
    pub traces: TraceArgs,
    /// Log this share of ShouldRateLimit decisions (0 to 1; 0, the default,
    /// logs none) as structured events with target `charon::decision`.
    #[arg(long, env = "CHARON_DECISION_LOG_SAMPLE", default_value_t = 0.0, value_parser = parse_ratio)]
    pub decision_log_sample: f64,
    /// At most this many decision-log events a second; more are counted
    /// and said once a second.
    #[arg(
        long,
        env = "CHARON_DECISION_LOG_MAX_PER_SECOND",
        default_value_t = 100
    )]
    pub decision_log_max_per_second: u32,
    /// ShouldRateLimit calls decided at once, across connections; past it,
    /// calls are answered at once by --on-overload (0: no bound).
    #[arg(long, env = "CHARON_MAX_IN_FLIGHT", default_value_t = charon::server::rls::overload::DEFAULT_MAX_IN_FLIGHT)]
    pub max_in_flight: usize,
    /// What to answer past --max-in-flight: `allow` (OK, as Envoy's
    /// fail-open) or `deny` (OVER_LIMIT).
    #[arg(long, env = "CHARON_ON_OVERLOAD", default_value = "allow")]
    pub on_overload: charon::server::rls::overload::OnOverload,
    #[command(flatten)]
    pub xds: XdsArgs,
    #[command(flatten)]
    pub metrics: crate::metrics::MetricsArgs,
}

/// Configuration over xDS (docs/envoy-compatibility.md#configuration-over-xds):
/// the flags take envoyproxy/ratelimit's variable names as their
/// environment; only `--config-xds` turns the client on.
#[derive(clap::Args)]
pub struct XdsArgs {
    /// Also take namespaces from this xDS server (`host:port` or a URL):
    /// RateLimitConfig resources over ADS, state of the world. The files
    /// at --config may then be absent.
    #[arg(long = "config-xds", env = "CHARON_CONFIG_XDS")]
    pub server: Option<String>,
    /// The node id the control plane knows this sidecar by.
    #[arg(
        long = "config-xds-node-id",
        env = "CONFIG_GRPC_XDS_NODE_ID",
        default_value = "default"
    )]
    pub node_id: String,
    /// Node metadata, `key:value` or `key=value`, comma-separated.
    #[arg(long = "config-xds-node-metadata", env = "CONFIG_GRPC_XDS_NODE_METADATA", value_parser = parse_pairs, default_value = "")]
    pub node_metadata: Pairs,
    /// Headers sent on the stream, `name:value`, comma-separated.
    #[arg(long = "config-xds-headers", env = "CONFIG_GRPC_XDS_CLIENT_ADDITIONAL_HEADERS", value_parser = parse_pairs, default_value = "")]
    pub headers: Pairs,
    /// TLS to the xDS server (needs --config-xds-ca).
    #[arg(long = "config-xds-tls", env = "CONFIG_GRPC_XDS_SERVER_USE_TLS", action = ArgAction::SetTrue, value_parser = BoolishValueParser::new())]
    pub tls: bool,
    /// The CA that signs the xDS server's certificate (PEM).
    #[arg(long = "config-xds-ca", env = "CONFIG_GRPC_XDS_SERVER_TLS_CACERT")]
    pub ca: Option<PathBuf>,
    /// This sidecar's client certificate, for mutual TLS (PEM).
    #[arg(
        long = "config-xds-cert",
        env = "CONFIG_GRPC_XDS_CLIENT_TLS_CERT",
        requires = "key"
    )]
    pub cert: Option<PathBuf>,
    /// The client certificate's private key (PEM).
    #[arg(
        long = "config-xds-key",
        env = "CONFIG_GRPC_XDS_CLIENT_TLS_KEY",
        requires = "cert"
    )]
    pub key: Option<PathBuf>,
    /// The name the server's certificate must carry (default: its host).
    #[arg(long = "config-xds-san", env = "CONFIG_GRPC_XDS_SERVER_TLS_SAN")]
    pub san: Option<String>,
    /// The first wait after a failed connection or stream; it doubles.
    #[arg(long = "config-xds-backoff-initial", env = "XDS_CLIENT_BACKOFF_INITIAL_INTERVAL", default_value = "1s", value_parser = parse_timeout)]
    pub backoff_initial: std::time::Duration,
    /// The longest wait between attempts.
    #[arg(long = "config-xds-backoff-max", env = "XDS_CLIENT_BACKOFF_MAX_INTERVAL", default_value = "60s", value_parser = parse_timeout)]
    pub backoff_max: std::time::Duration,
    /// Each wait is spread by up to this share either way, 0 to 1.
    #[arg(long = "config-xds-backoff-random-factor", env = "XDS_CLIENT_BACKOFF_RANDOM_FACTOR", default_value_t = 0.5, value_parser = parse_ratio)]
    pub backoff_random_factor: f64,
    /// Spread the waits (`false`: exact doubling).
    #[arg(long = "config-xds-backoff-jitter", env = "XDS_CLIENT_BACKOFF_JITTER", default_value = "true", value_parser = BoolishValueParser::new())]
    pub backoff_jitter: bool,
    /// A response larger than this is refused (NACK).
    #[arg(long = "config-xds-max-message-bytes", env = "XDS_CLIENT_MAX_MSG_SIZE_IN_BYTES", default_value_t = 4 * 1024 * 1024, value_parser = clap::value_parser!(u32).range(1..))]
    pub max_message_bytes: u32,
    /// Serve before the first snapshot, reporting not ready until it
    /// arrives; without it, the sidecar waits for it before listening.
    #[arg(long = "config-xds-force-start", env = "FORCE_START_WITHOUT_INITIAL_CONFIG", action = ArgAction::SetTrue, value_parser = BoolishValueParser::new())]
    pub force_start: bool,
    /// Charon's algorithms and options for limits pushed over xDS, named by
    /// domain and descriptor path (docs/envoy-compatibility.md#charons-extensions-for-xds-fed-limits).
    #[arg(
        long = "xds-extensions",
        env = "CHARON_XDS_EXTENSIONS",
        requires = "server"
    )]
    pub extensions: Option<PathBuf>,
}

/// `key:value` (or `key=value`) pairs, comma-separated.
pub type Pairs = Vec<(String, String)>;

fn parse_pairs(text: &str) -> Result<Pairs, String> {
    text.split(',')
        .map(str::trim)
        .filter(|pair| !pair.is_empty())
        .map(|pair| {
            let split = pair
                .find([':', '='])
                .ok_or_else(|| format!("{pair:?} is not `key:value` or `key=value`"))?;
            let (key, value) = (pair[..split].trim(), pair[split + 1..].trim());
            if key.is_empty() {
                return Err(format!("{pair:?} has no key"));
            }
            Ok((key.to_owned(), value.to_owned()))
        })
        .collect()
}

impl XdsArgs {
    fn into_options(self) -> anyhow::Result<Option<charon::server::xds::XdsOptions>> {
        let Some(server) = self.server else {
            return Ok(None);
        };
        let tls = match (self.tls, self.ca) {
            (false, _) => None,
            (true, None) => anyhow::bail!(
                "--config-xds-tls (CONFIG_GRPC_XDS_SERVER_USE_TLS) needs --config-xds-ca \
                 (CONFIG_GRPC_XDS_SERVER_TLS_CACERT): the CA of the xDS server's certificate"
            ),
            (true, Some(ca)) => Some(charon::server::xds::XdsTls {
                ca,
                identity: self.cert.zip(self.key),
                san: self.san,
            }),
        };
        Ok(Some(charon::server::xds::XdsOptions {
            server,
            node_id: self.node_id,
            node_metadata: self.node_metadata,
            headers: self.headers,
            tls,
            backoff: charon::server::xds::Backoff {
                initial: self.backoff_initial,
                max: self.backoff_max.max(self.backoff_initial),
                random_factor: self.backoff_random_factor,
                jitter: self.backoff_jitter,
            },
            max_message_bytes: self.max_message_bytes as usize,
            force_start: self.force_start,
            extensions: Arc::new(Extensions::load_flag(self.extensions.as_deref())?),
            extensions_path: self.extensions,
        }))
    }
}

/// `--response-headers`.
#[derive(Debug, Clone, Copy, clap::ValueEnum)]
pub enum HeaderMode {
    None,
    Ratelimit,
    Ietf,
}

/// `--response-headers-for`.
#[derive(Debug, Clone, Copy, clap::ValueEnum)]
pub enum HeadersForMode {
    Deciding,
    Every,
}

/// Serves until stopped; `notes` are logged once logging is up (what the
/// `ratelimit` invocation did not take from the environment).
pub fn run(args: ServeArgs, log: &LogOptions, notes: &[String]) -> ExitCode {
    let threads = usize::from(args.threads);
    let export = args.traces.export();
    let served = args.into_options().and_then(|options| {
        let init_logs = |traces: Option<&_>| logging::init(log, traces);
        charon::server::run_process(options, threads, &export, init_logs, notes)
    });
    match served {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("error: {error:#}");
            ExitCode::FAILURE
        }
    }
}

impl ServeArgs {
    /// The sidecar's options, with the secrets and certificates read.
    fn into_options(self) -> anyhow::Result<charon::server::ServeOptions> {
        use charon::server::rls::{HeaderNames, HeadersFor, ResponseHeaders, RlsOptions};
        use charon::server::trace::TraceSampler;
        let tracing = self.traces.export().is_on();
        let headers = match self.response_headers {
            HeaderMode::None => ResponseHeaders::None,
            HeaderMode::Ratelimit => ResponseHeaders::RateLimit(HeaderNames {
                limit: self.limit_header,
                remaining: self.remaining_header,
                reset: self.reset_header,
            }),
            HeaderMode::Ietf => ResponseHeaders::Ietf,
        };
        let store = with_store_password(self.store, self.store_password_file, self.store_user)?;
        let sentinel_password = charon::kit::secret::read(
            self.store_sentinel_password_file.as_deref(),
            "--store-sentinel-password-file",
            "CHARON_STORE_SENTINEL_PASSWORD",
        )?;
        let store_tls = store_tls(self.store_ca, self.store_tls_cert.zip(self.store_tls_key))?;
        let files_optional = self.xds.server.is_some();
        let xds = self.xds.into_options()?;
        let parent = match (self.parent, self.level_id) {
            (Some(url), Some(level_id)) => Some(charon::server::ParentOptions { url, level_id }),
            _ => None,
        };
        let global_timing = charon::config::global::GlobalTiming::new(
            u64::try_from(self.global_refresh_interval.as_millis()).unwrap_or(u64::MAX),
            u64::try_from(self.global_lease.as_millis()).unwrap_or(u64::MAX),
        )?
        .with_safe_share(self.global_safe_share);
        Ok(charon::server::ServeOptions {
            xds,
            parent,
            global_timing,
            config: self.config,
            grpc_addr: self.grpc_addr,
            admin_addr: self.admin_addr,
            admin_token_file: self.admin_token_file,
            metrics: charon::server::metrics::MetricsOptions {
                upstream: self.metrics.upstream(),
                addr: self.metrics.metrics_addr,
                path: self.metrics.metrics_path,
            },
            shutdown_delay: self.shutdown_delay,
            config_state: self.config_state,
            grpc: charon::server::GrpcOptions {
                max_concurrent_streams: self.grpc_max_concurrent_streams,
                keepalive_interval: self.grpc_keepalive,
                max_connection_age: self.grpc_max_connection_age,
                tls: self
                    .grpc_tls_cert
                    .zip(self.grpc_tls_key)
                    .map(|(cert, key)| charon::kit::listen::TlsOptions {
                        cert,
                        key,
                        client_ca: self.grpc_client_ca,
                        allowed_sans: self.grpc_allowed_san,
                    }),
                uds: self.grpc_uds.map(|path| charon::kit::listen::UdsOptions {
                    path,
                    mode: self.grpc_uds_mode,
                }),
            },
            store: charon::store::open::StoreOptions {
                url: store,
                timeout: self.store_timeout,
                on_error: self.on_store_error,
                max_keys: self.max_keys,
                key_prefix: self.store_key_prefix,
                tls: store_tls,
                sentinel_password,
                // The sidecar's metrics fill these in.
                observer: None,
                events: None,
            },
            copies: charon::server::CopyOptions {
                timings: charon::store::copies::CopyTimings {
                    heartbeat: self.heartbeat,
                    ttl: self.heartbeat_ttl,
                    reap_interval: self.reap_interval,
                },
                max_sessions: self.max_sessions,
            },
            envoy: charon::server::EnvoyOptions {
                load: charon::config::LoadOptions {
                    merge_domains: self.merge_domain_config,
                    files_optional,
                },
                modes: charon::limiter::Modes {
                    shadow: self.shadow_mode,
                    quota: self.quota_mode,
                    count_rejected: self.count_rejected_hits,
                },
                rls: RlsOptions {
                    headers,
                    headers_for: match self.response_headers_for {
                        HeadersForMode::Deciding => HeadersFor::Deciding,
                        HeadersForMode::Every => HeadersFor::Every,
                    },
                    dynamic_metadata: self.response_dynamic_metadata,
                    deciding_limit: self.metrics.response_deciding_limit,
                    traces: match tracing {
                        true => TraceSampler::new(self.traces.trace_sample_ratio),
                        false => TraceSampler::off(),
                    },
                    decision_log: charon::server::decision_log::DecisionLogOptions::new(
                        self.decision_log_sample,
                        self.decision_log_max_per_second,
                    ),
                    overload: charon::server::rls::overload::OverloadOptions {
                        max_in_flight: self.max_in_flight,
                        policy: self.on_overload,
                    },
                },
            },
        })
    }
}

/// `--trace-sample-ratio`: a share, 0 to 1.
pub(crate) fn parse_ratio(text: &str) -> Result<f64, String> {
    match text.parse::<f64>() {
        Ok(ratio) if (0.0..=1.0).contains(&ratio) => Ok(ratio),
        _ => Err(format!("{text:?} is not a share from 0 to 1")),
    }
}

/// `--grpc-uds-mode`: octal, at most 777.
fn parse_mode(text: &str) -> Result<u32, String> {
    match u32::from_str_radix(text, 8) {
        Ok(mode) if mode <= 0o777 => Ok(mode),
        _ => Err(format!(
            "{text:?} is not a file mode (octal, e.g. 600 or 660)"
        )),
    }
}

/// `--store-timeout` and the other deadlines: a whole number of ms, s or m
/// (at least 1 ms, finite).
fn parse_timeout(text: &str) -> Result<std::time::Duration, String> {
    let ms = charon::config::parse_duration(text)?;
    if ms == 0 || ms == charon::config::FOREVER {
        return Err(format!(
            "{text:?}: a deadline must be at least 1ms and finite"
        ));
    }
    Ok(std::time::Duration::from_millis(ms))
}

/// `--shutdown-delay`: none, or a whole number of ms, s or m up to 5 min
/// (longer would outlast any termination grace period).
fn parse_shutdown_delay(text: &str) -> Result<std::time::Duration, String> {
    let ms = charon::config::parse_duration(text)?;
    if ms > 300_000 {
        return Err(format!("{text:?}: a shutdown delay is at most 5m"));
    }
    Ok(std::time::Duration::from_millis(ms))
}
