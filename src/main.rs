//! The `charon` binary: parses flags and hands over to the library.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;

#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

use clap::builder::BoolishValueParser;
use clap::{ArgAction, Parser, Subcommand};

#[derive(Parser)]
#[command(
    name = "charon",
    version,
    about = "Rate limits and copy limits for Envoy and Tower services"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

// Parsed once at startup: the size of the `serve` variant costs nothing.
#[allow(clippy::large_enum_variant)]
#[derive(Subcommand)]
enum Command {
    /// Run the sidecar: Envoy's RateLimitService over gRPC, admin HTTP beside it.
    Serve {
        /// A configuration file, or a directory of *.yaml files.
        #[arg(long, env = "CHARON_CONFIG")]
        config: PathBuf,
        /// Where the gRPC services (Envoy RLS, health) listen.
        #[arg(long, env = "CHARON_GRPC_ADDR", default_value = "127.0.0.1:8081")]
        grpc_addr: SocketAddr,
        /// gRPC streams in flight per connection (HTTP/2
        /// SETTINGS_MAX_CONCURRENT_STREAMS); more wait in the client.
        #[arg(long, env = "CHARON_GRPC_MAX_CONCURRENT_STREAMS", default_value_t = 1024, value_parser = clap::value_parser!(u32).range(1..))]
        grpc_max_concurrent_streams: u32,
        /// HTTP/2 pings on idle gRPC connections, to drop peers that vanished.
        #[arg(long, env = "CHARON_GRPC_KEEPALIVE", default_value = "30s", value_parser = parse_timeout)]
        grpc_keepalive: std::time::Duration,
        /// Close gRPC connections older than this, gracefully (default:
        /// never). A Charon API session ends with its connection.
        #[arg(long, env = "CHARON_GRPC_MAX_CONNECTION_AGE", value_parser = parse_timeout)]
        grpc_max_connection_age: Option<std::time::Duration>,
        /// TLS on the gRPC port: the certificate chain (PEM), re-read when
        /// the file changes.
        #[arg(long, env = "CHARON_GRPC_TLS_CERT", requires = "grpc_tls_key")]
        grpc_tls_cert: Option<PathBuf>,
        /// The certificate's private key (PEM), re-read when it changes.
        #[arg(long, env = "CHARON_GRPC_TLS_KEY", requires = "grpc_tls_cert")]
        grpc_tls_key: Option<PathBuf>,
        /// mTLS: require client certificates signed by this CA (PEM).
        #[arg(long, env = "CHARON_GRPC_CLIENT_CA", requires = "grpc_tls_cert")]
        grpc_client_ca: Option<PathBuf>,
        /// With --grpc-client-ca: accept only client certificates naming this
        /// DNS name or IP (repeat, or comma-separated).
        #[arg(
            long,
            env = "CHARON_GRPC_ALLOWED_SAN",
            value_delimiter = ',',
            requires = "grpc_client_ca"
        )]
        grpc_allowed_san: Vec<String>,
        /// Also serve gRPC on this Unix socket (Envoy reaches it as a pipe).
        #[arg(long, env = "CHARON_GRPC_UDS")]
        grpc_uds: Option<PathBuf>,
        /// The socket's file mode, octal.
        #[arg(long, env = "CHARON_GRPC_UDS_MODE", default_value = "600", value_parser = parse_mode)]
        grpc_uds_mode: u32,
        /// Where /healthz, /readyz and /metrics listen.
        #[arg(long, env = "CHARON_ADMIN_ADDR", default_value = "127.0.0.1:9102")]
        admin_addr: SocketAddr,
        /// A file holding the bearer token that `/debug/*` and the
        /// simulator's sessions require (a mounted Secret). Without one, they
        /// answer only on a loopback --admin-addr; probes and /metrics never
        /// need it.
        #[arg(long, env = "CHARON_ADMIN_TOKEN_FILE")]
        admin_token_file: Option<PathBuf>,
        /// Where state lives: `memory` (embedded), or Redis shared by several
        /// sidecars: redis://[user:password@]host:port[/db], rediss:// (TLS),
        /// redis+sentinel://[user:password@]host:port[,…]/service[/db],
        /// redis+cluster://[user:password@]host:port[,host:port…].
        #[arg(long, env = "CHARON_STORE", default_value = "memory")]
        store: String,
        /// A file holding the Redis password (a mounted Secret), so that it
        /// is neither in the URL nor on the command line. Or set
        /// CHARON_STORE_PASSWORD.
        #[arg(long, env = "CHARON_STORE_PASSWORD_FILE")]
        store_password_file: Option<PathBuf>,
        /// The Redis ACL user that the password from the file or
        /// CHARON_STORE_PASSWORD belongs to.
        #[arg(long, env = "CHARON_STORE_USER")]
        store_user: Option<String>,
        /// With redis+sentinel://: a file holding the sentinels' own
        /// password. Or set CHARON_STORE_SENTINEL_PASSWORD.
        #[arg(long, env = "CHARON_STORE_SENTINEL_PASSWORD_FILE")]
        store_sentinel_password_file: Option<PathBuf>,
        /// Written before every Redis key, so that two fleets can share one
        /// Redis without seeing each other's counts (CACHE_KEY_PREFIX).
        /// `rediss://`: the CA to trust (PEM) instead of the system's roots.
        #[arg(long, env = "CHARON_STORE_CA")]
        store_ca: Option<PathBuf>,
        /// `rediss://`: a client certificate (PEM), for a Redis that asks
        /// for one (its default, `tls-auth-clients yes`).
        #[arg(long, env = "CHARON_STORE_TLS_CERT", requires = "store_tls_key")]
        store_tls_cert: Option<PathBuf>,
        /// The client certificate's private key (PEM).
        #[arg(long, env = "CHARON_STORE_TLS_KEY", requires = "store_tls_cert")]
        store_tls_key: Option<PathBuf>,
        #[arg(long, env = "CHARON_STORE_KEY_PREFIX", default_value = "", value_parser = parse_key_prefix)]
        store_key_prefix: charon::store::keys::KeyPrefix,
        /// The deadline of one Redis decision, e.g. 50ms, 1s.
        #[arg(long, env = "CHARON_STORE_TIMEOUT", default_value = "50ms", value_parser = parse_timeout)]
        store_timeout: std::time::Duration,
        /// What to answer while Redis is unreachable: `allow`, `deny`, or
        /// `local` (decide on an in-process memory store with the same limits).
        #[arg(long, env = "CHARON_ON_STORE_ERROR", default_value = "local")]
        on_store_error: charon::store::OnStoreError,
        /// The memory store's cap on keys. At the cap, a request that needs a
        /// new key is decided as for a fresh tenant but not remembered.
        #[arg(long, env = "CHARON_MAX_KEYS", default_value_t = charon::store::DEFAULT_MAX_KEYS)]
        max_keys: usize,
        /// With Redis: how often this sidecar renews its heartbeat in the copy log.
        #[arg(long, env = "CHARON_HEARTBEAT", default_value = "1s", value_parser = parse_timeout)]
        heartbeat: std::time::Duration,
        /// With Redis: how long a heartbeat lives. A sidecar that cannot renew
        /// it for `ttl - heartbeat` resigns; one silent for `ttl` is dead and
        /// its holds are reaped.
        #[arg(long, env = "CHARON_HEARTBEAT_TTL", default_value = "5s", value_parser = parse_timeout)]
        heartbeat_ttl: std::time::Duration,
        /// With Redis: how often the reaper looks for dead sidecars and
        /// expired transfers.
        #[arg(long, env = "CHARON_REAP_INTERVAL", default_value = "1s", value_parser = parse_timeout)]
        reap_interval: std::time::Duration,
        /// Charon API sessions served at once; more are refused (RESOURCE_EXHAUSTED).
        #[arg(long, env = "CHARON_MAX_SESSIONS", default_value_t = 10_000)]
        max_sessions: usize,
        /// Files naming the same domain add their descriptors to it
        /// (envoyproxy/ratelimit's MERGE_DOMAIN_CONFIG) instead of being an error.
        #[arg(long, env = "CHARON_MERGE_DOMAIN_CONFIG", action = ArgAction::SetTrue, value_parser = BoolishValueParser::new())]
        merge_domain_config: bool,
        /// Answer OK to requests over their limits; statuses still say which
        /// descriptors are over, and each is counted (SHADOW_MODE).
        #[arg(long, env = "CHARON_SHADOW_MODE", action = ArgAction::SetTrue, value_parser = BoolishValueParser::new())]
        shadow_mode: bool,
        /// Every descriptor is a quota descriptor: a request is over only
        /// when all of them are (QUOTA_MODE).
        #[arg(long, env = "CHARON_QUOTA_MODE", action = ArgAction::SetTrue, value_parser = BoolishValueParser::new())]
        quota_mode: bool,
        /// Headers Envoy adds to the client's response: `none`, `ratelimit`
        /// (envoyproxy/ratelimit's RateLimit-Limit/-Remaining/-Reset) or `ietf`
        /// (RateLimit-Policy and RateLimit, and Retry-After when over).
        #[arg(long, env = "CHARON_RESPONSE_HEADERS", default_value = "none")]
        response_headers: HeaderMode,
        /// With `--response-headers ratelimit`: the limit header's name.
        #[arg(long, env = "CHARON_LIMIT_HEADER", default_value = "RateLimit-Limit")]
        limit_header: String,
        /// With `--response-headers ratelimit`: the remaining header's name.
        #[arg(
            long,
            env = "CHARON_REMAINING_HEADER",
            default_value = "RateLimit-Remaining"
        )]
        remaining_header: String,
        /// With `--response-headers ratelimit`: the reset header's name.
        #[arg(long, env = "CHARON_RESET_HEADER", default_value = "RateLimit-Reset")]
        reset_header: String,
        /// Return the request and the matched descriptors' `metadata` in the
        /// response's dynamic_metadata (RESPONSE_DYNAMIC_METADATA).
        #[arg(long, env = "CHARON_RESPONSE_DYNAMIC_METADATA", action = ArgAction::SetTrue, value_parser = BoolishValueParser::new())]
        response_dynamic_metadata: bool,
        /// Runtime threads: 0 for one per CPU the process may use, and a
        /// single-threaded runtime when that is one (it batches answers
        /// into fewer writes); 1 for single-threaded.
        #[arg(long, env = "CHARON_THREADS", default_value_t = 0, value_parser = clap::value_parser!(u16).range(0..=1024))]
        threads: u16,
    },
    /// Serve the Kubernetes mutating admission webhook that adds the Charon
    /// sidecar to pods annotated `charon.io/inject: "true"` (HTTPS, POST /mutate).
    Inject {
        /// Where the webhook listens (HTTPS).
        #[arg(long, default_value = "127.0.0.1:8443")]
        addr: SocketAddr,
        /// The serving certificate (PEM chain); reloaded when the file changes.
        #[arg(long)]
        tls_cert: PathBuf,
        /// The certificate's private key (PEM); reloaded when the file changes.
        #[arg(long)]
        tls_key: PathBuf,
        /// The sidecar's image.
        #[arg(long, default_value = "charon:0.1.0")]
        image: String,
        /// The sidecar's --store, unless the pod's `charon.io/store` annotation names one.
        #[arg(long, default_value = "memory")]
        store: String,
    },
    /// Run the real engine on a virtual clock for a request pattern and print
    /// the timeline: per tick, grants, rejections, tiers and retry-after.
    Simulate {
        /// A configuration file or directory (or give --rate).
        #[arg(long, conflicts_with = "rate", required_unless_present = "rate")]
        config: Option<PathBuf>,
        /// The namespace (`domain:`) in --config; needed if it has several.
        #[arg(long)]
        namespace: Option<String>,
        /// The rate-limited resource; needed if the namespace has several.
        #[arg(long)]
        resource: Option<String>,
        /// Limits inline, as a resource's `rate:` block in YAML flow style:
        /// '{tiers: [{limit: 5, window: 1s}, {limit: 20, window: 1s, active: 5s, cooldown: 10s}]}'.
        #[arg(long)]
        rate: Option<String>,
        /// The tenant the requests come from (per-domain overrides apply).
        #[arg(long, default_value = "tenant")]
        domain: String,
        /// The requests: '10/s for 3s, pause 2s, 50/s for 1s, burst 30, at 100ms 250ms'.
        #[arg(long)]
        pattern: String,
        /// The timeline's step.
        #[arg(long, default_value = "1s")]
        tick: String,
        /// Print JSON instead of a table.
        #[arg(long)]
        json: bool,
    },
    /// Validate a configuration file or directory; print it normalized, or the errors.
    Check {
        /// A configuration file, or a directory of *.yaml files.
        path: PathBuf,
        /// Merge files that name the same domain, as `serve` does with it.
        #[arg(long, env = "CHARON_MERGE_DOMAIN_CONFIG", action = ArgAction::SetTrue, value_parser = BoolishValueParser::new())]
        merge_domain_config: bool,
    },
}

/// `--response-headers`.
#[derive(Debug, Clone, Copy, clap::ValueEnum)]
enum HeaderMode {
    None,
    Ratelimit,
    Ietf,
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    match cli.command {
        Command::Check {
            path,
            merge_domain_config,
        } => check(
            &path,
            charon::config::LoadOptions {
                merge_domains: merge_domain_config,
            },
        ),
        Command::Simulate {
            config,
            namespace,
            resource,
            rate,
            domain,
            pattern,
            tick,
            json,
        } => {
            let source = match (&config, &rate) {
                (Some(path), _) => charon::simulate::Source::Config {
                    path,
                    namespace: namespace.as_deref(),
                    resource: resource.as_deref(),
                },
                (None, Some(rate)) => charon::simulate::Source::Inline(rate),
                (None, None) => {
                    eprintln!("error: give --config or --rate");
                    return ExitCode::FAILURE;
                }
            };
            simulate(source, &domain, &pattern, &tick, json)
        }
        Command::Inject {
            addr,
            tls_cert,
            tls_key,
            image,
            store,
        } => inject(charon::inject::InjectOptions {
            addr,
            tls_cert,
            tls_key,
            template: charon::inject::review::SidecarTemplate { image, store },
        }),
        Command::Serve {
            config,
            grpc_addr,
            grpc_max_concurrent_streams,
            grpc_keepalive,
            grpc_max_connection_age,
            grpc_tls_cert,
            grpc_tls_key,
            grpc_client_ca,
            grpc_allowed_san,
            grpc_uds,
            grpc_uds_mode,
            admin_addr,
            admin_token_file,
            store,
            store_password_file,
            store_user,
            store_sentinel_password_file,
            store_key_prefix,
            store_ca,
            store_tls_cert,
            store_tls_key,
            store_timeout,
            on_store_error,
            max_keys,
            heartbeat,
            heartbeat_ttl,
            reap_interval,
            max_sessions,
            merge_domain_config,
            shadow_mode,
            quota_mode,
            response_headers,
            limit_header,
            remaining_header,
            reset_header,
            response_dynamic_metadata,
            threads,
        } => {
            use charon::server::rls::{HeaderNames, ResponseHeaders, RlsOptions};
            let headers = match response_headers {
                HeaderMode::None => ResponseHeaders::None,
                HeaderMode::Ratelimit => ResponseHeaders::RateLimit(HeaderNames {
                    limit: limit_header,
                    remaining: remaining_header,
                    reset: reset_header,
                }),
                HeaderMode::Ietf => ResponseHeaders::Ietf,
            };
            init_tracing();
            let store = match with_store_password(store, store_password_file, store_user) {
                Ok(store) => store,
                Err(error) => {
                    eprintln!("error: {error:#}");
                    return ExitCode::FAILURE;
                }
            };
            let sentinel_password = match secret(
                store_sentinel_password_file,
                "--store-sentinel-password-file",
                "CHARON_STORE_SENTINEL_PASSWORD",
            ) {
                Ok(password) => password,
                Err(error) => {
                    eprintln!("error: {error:#}");
                    return ExitCode::FAILURE;
                }
            };
            let store_tls = match store_tls(store_ca, store_tls_cert.zip(store_tls_key)) {
                Ok(tls) => tls,
                Err(error) => {
                    eprintln!("error: {error:#}");
                    return ExitCode::FAILURE;
                }
            };
            let options = charon::server::ServeOptions {
                config,
                grpc_addr,
                admin_addr,
                admin_token_file,
                grpc: charon::server::GrpcOptions {
                    max_concurrent_streams: grpc_max_concurrent_streams,
                    keepalive_interval: grpc_keepalive,
                    max_connection_age: grpc_max_connection_age,
                    tls: grpc_tls_cert.zip(grpc_tls_key).map(|(cert, key)| {
                        charon::server::listen::TlsOptions {
                            cert,
                            key,
                            client_ca: grpc_client_ca,
                            allowed_sans: grpc_allowed_san,
                        }
                    }),
                    uds: grpc_uds.map(|path| charon::server::listen::UdsOptions {
                        path,
                        mode: grpc_uds_mode,
                    }),
                },
                store: charon::service::store::StoreOptions {
                    url: store,
                    timeout: store_timeout,
                    on_error: on_store_error,
                    max_keys,
                    key_prefix: store_key_prefix,
                    tls: store_tls,
                    sentinel_password,
                },
                copies: charon::server::CopyOptions {
                    timings: charon::store::copies::CopyTimings {
                        heartbeat,
                        ttl: heartbeat_ttl,
                        reap_interval,
                    },
                    max_sessions,
                },
                envoy: charon::server::EnvoyOptions {
                    load: charon::config::LoadOptions {
                        merge_domains: merge_domain_config,
                    },
                    modes: charon::limiter::Modes {
                        shadow: shadow_mode,
                        quota: quota_mode,
                    },
                    rls: RlsOptions {
                        headers,
                        dynamic_metadata: response_dynamic_metadata,
                    },
                },
            };
            let runtime = match charon::server::runtime::build(usize::from(threads)) {
                Ok(runtime) => runtime,
                Err(error) => {
                    eprintln!("error: cannot start the runtime: {error}");
                    return ExitCode::FAILURE;
                }
            };
            match runtime.block_on(charon::server::run(options)) {
                Ok(()) => ExitCode::SUCCESS,
                Err(error) => {
                    eprintln!("error: {error:#}");
                    ExitCode::FAILURE
                }
            }
        }
    }
}

/// `--store-timeout`: a whole number of ms, s or m (at least 1 ms).
/// A secret from `file` (one trailing newline dropped) or the environment
/// variable `env`, not both, never empty.
fn secret(file: Option<PathBuf>, flag: &str, env: &str) -> anyhow::Result<Option<String>> {
    let from_env = std::env::var(env).ok();
    let secret = match (file, from_env) {
        (Some(_), Some(_)) => anyhow::bail!("given twice: {flag} and {env}"),
        (Some(path), None) => {
            let text = anyhow::Context::with_context(std::fs::read_to_string(&path), || {
                format!("cannot read {flag} {}", path.display())
            })?;
            Some(text.trim_end_matches(['\n', '\r']).to_owned())
        }
        (None, from_env) => from_env,
    };
    if secret.as_deref() == Some("") {
        anyhow::bail!("{flag} (or {env}) is empty");
    }
    Ok(secret)
}

/// `--store-ca`, `--store-tls-cert` and `--store-tls-key`, read.
fn store_tls(
    ca: Option<PathBuf>,
    client: Option<(PathBuf, PathBuf)>,
) -> anyhow::Result<Option<charon::store::StoreTls>> {
    if ca.is_none() && client.is_none() {
        return Ok(None);
    }
    let read = |flag: &str, path: &PathBuf| {
        std::fs::read(path)
            .map_err(|error| anyhow::anyhow!("cannot read {flag} {}: {error}", path.display()))
    };
    Ok(Some(charon::store::StoreTls {
        ca: ca
            .as_ref()
            .map(|path| read("--store-ca", path))
            .transpose()?,
        client: client
            .map(|(cert, key)| -> anyhow::Result<_> {
                Ok((
                    read("--store-tls-cert", &cert)?,
                    read("--store-tls-key", &key)?,
                ))
            })
            .transpose()?,
    }))
}

/// `--store` with the password from `--store-password-file` or
/// `CHARON_STORE_PASSWORD`, if one is given.
fn with_store_password(
    store: String,
    file: Option<PathBuf>,
    user: Option<String>,
) -> anyhow::Result<String> {
    match secret(file, "--store-password-file", "CHARON_STORE_PASSWORD")? {
        Some(ref password) => Ok(charon::store::redis::url::with_credentials(
            &store,
            user.as_deref(),
            password,
        )?),
        None if user.is_some() => {
            anyhow::bail!("--store-user needs --store-password-file or CHARON_STORE_PASSWORD")
        }
        None => Ok(store),
    }
}

fn parse_mode(text: &str) -> Result<u32, String> {
    match u32::from_str_radix(text, 8) {
        Ok(mode) if mode <= 0o777 => Ok(mode),
        _ => Err(format!(
            "{text:?} is not a file mode (octal, e.g. 600 or 660)"
        )),
    }
}

fn parse_key_prefix(text: &str) -> Result<charon::store::keys::KeyPrefix, String> {
    charon::store::keys::KeyPrefix::new(text)
}

fn parse_timeout(text: &str) -> Result<std::time::Duration, String> {
    let ms = charon::config::parse_duration(text)?;
    if ms == 0 || ms == charon::config::FOREVER {
        return Err(format!(
            "{text:?}: a deadline must be at least 1ms and finite"
        ));
    }
    Ok(std::time::Duration::from_millis(ms))
}

fn inject(options: charon::inject::InjectOptions) -> ExitCode {
    init_tracing();
    let runtime = match tokio::runtime::Runtime::new() {
        Ok(runtime) => runtime,
        Err(error) => {
            eprintln!("error: cannot start the runtime: {error}");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(charon::inject::run(options)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("error: {error}");
            ExitCode::FAILURE
        }
    }
}

fn simulate(
    source: charon::simulate::Source<'_>,
    domain: &str,
    pattern: &str,
    tick: &str,
    json: bool,
) -> ExitCode {
    let run = || -> Result<String, String> {
        let rate = charon::simulate::resolve(source)?;
        let pattern = charon::simulate::parse_pattern(pattern)?;
        let tick =
            charon::config::parse_duration(tick).map_err(|error| format!("--tick: {error}"))?;
        let timeline = charon::simulate::simulate(&rate, domain, &pattern, tick)?;
        if json {
            serde_json::to_string_pretty(&timeline).map_err(|error| error.to_string())
        } else {
            Ok(timeline.to_text())
        }
    };
    match run() {
        Ok(output) => {
            println!("{output}");
            ExitCode::SUCCESS
        }
        Err(error) => {
            eprintln!("error: {error}");
            ExitCode::FAILURE
        }
    }
}

fn check(path: &std::path::Path, options: charon::config::LoadOptions) -> ExitCode {
    match charon::config::load_path_with(path, options) {
        Ok(loaded) => {
            for note in &loaded.notes {
                eprintln!("note: {note}");
            }
            for (file, yaml) in &loaded.normalized {
                println!("# {}", file.display());
                println!("{yaml}");
            }
            ExitCode::SUCCESS
        }
        Err(errors) => {
            for error in &errors.0 {
                eprintln!("error: {error}");
            }
            ExitCode::FAILURE
        }
    }
}

fn init_tracing() {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .init();
}
