//! The `charon` binary: parses flags and hands over to the library. Each
//! subcommand's work is a library call; what lives here is flags, the
//! secrets read from files, and logging.

mod config;
mod logging;
mod metrics;
mod secrets;
mod serve;
mod throttle;
mod traces;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;

#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

use clap::builder::BoolishValueParser;
use clap::{ArgAction, Parser, Subcommand};

use logging::LogOptions;

/// `charon --version`: the release and the commit it was built from.
const VERSION: &str = concat!(
    env!("CARGO_PKG_VERSION"),
    " (commit ",
    env!("CHARON_COMMIT"),
    ")"
);

#[derive(Parser)]
#[command(
    name = "charon",
    version = VERSION,
    about = "Rate limits and copy limits for Envoy and Tower services"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
    #[command(flatten)]
    log: LogOptions,
}

// Parsed once at startup: the size of the `serve` variant costs nothing.
#[allow(clippy::large_enum_variant)]
#[derive(Subcommand)]
enum Command {
    /// Run the sidecar: Envoy's RateLimitService over gRPC, admin HTTP beside it.
    Serve(serve::ServeArgs),
    /// Run the throttling sidecar: a reverse proxy in front of one upstream
    /// that queues requests by criticality and sheds what would be late.
    Throttle(throttle::ThrottleArgs),
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
        #[arg(long, default_value = charon::inject::review::IMAGE)]
        image: String,
        /// The sidecar's --store, unless the pod's `charon.io/store` annotation names one.
        #[arg(long, default_value = "memory")]
        store: String,
    },
    /// Run the real engine on a virtual clock for a request pattern and print
    /// the timeline: per tick, grants, rejections, tiers and retry-after.
    Simulate {
        /// A configuration file or directory (or give --rate or --capacity).
        #[arg(long, conflicts_with_all = ["rate", "capacity"], required_unless_present_any = ["rate", "capacity"])]
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
        #[arg(long, required_unless_present = "capacity")]
        pattern: Option<String>,
        /// Capacity leases instead: a resource's `capacity:` block in YAML flow
        /// style, '{capacity: 100, algorithm: fair_share, lease: 10s, refresh_interval: 2s, learning: 0s}'.
        #[arg(long, requires = "clients", conflicts_with = "rate")]
        capacity: Option<String>,
        /// With --capacity: the clients and what they want over time,
        /// 'a: 100; b: 30 from 5s; c: 100 from 10s until 20s then 50 from 15s'.
        #[arg(long)]
        clients: Option<String>,
        /// With --capacity: how long to simulate.
        #[arg(long, default_value = "30s")]
        duration: String,
        /// The timeline's step.
        #[arg(long, default_value = "1s")]
        tick: String,
        /// Print JSON instead of a table.
        #[arg(long)]
        json: bool,
    },
    /// The configuration API of a running sidecar: get, apply, diff, history.
    Config(config::ConfigArgs),
    /// Validate a configuration file or directory; print it normalized, or the errors.
    Check {
        /// A configuration file, or a directory of *.yaml files.
        path: PathBuf,
        /// Merge files that name the same domain, as `serve` does with it.
        #[arg(long, env = "CHARON_MERGE_DOMAIN_CONFIG", action = ArgAction::SetTrue, value_parser = BoolishValueParser::new())]
        merge_domain_config: bool,
    },
}

fn main() -> ExitCode {
    // Invoked as `ratelimit`: envoyproxy/ratelimit's environment, read as
    // upstream's container is started.
    let invoked_as = std::env::args_os()
        .next()
        .and_then(|arg0| PathBuf::from(arg0).file_name().map(|name| name.to_owned()));
    if invoked_as.as_deref() == Some(std::ffi::OsStr::new("ratelimit")) {
        return as_ratelimit();
    }
    let cli = Cli::parse();
    match cli.command {
        Command::Check {
            path,
            merge_domain_config,
        } => check(
            &path,
            charon::config::LoadOptions {
                merge_domains: merge_domain_config,
                ..Default::default()
            },
        ),
        Command::Simulate {
            config,
            namespace,
            resource,
            rate,
            domain,
            pattern,
            capacity,
            clients,
            duration,
            tick,
            json,
        } => {
            if let (Some(capacity), Some(clients)) = (&capacity, &clients) {
                return simulate_leases(capacity, clients, &duration, &tick, json);
            }
            let Some(pattern) = pattern else {
                eprintln!("error: give --pattern");
                return ExitCode::FAILURE;
            };
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
        } => inject(
            charon::inject::InjectOptions {
                addr,
                tls_cert,
                tls_key,
                template: charon::inject::review::SidecarTemplate { image, store },
            },
            &cli.log,
        ),
        Command::Serve(args) => serve::run(args, &cli.log, &[]),
        Command::Throttle(args) => throttle::run(args, &cli.log),
        Command::Config(args) => run_to_end(config::run(args)),
    }
}

/// `charon serve` from upstream's environment variables (see `upstream`).
fn as_ratelimit() -> ExitCode {
    let translated =
        match charon::server::upstream_env::serve_args(&|name| std::env::var(name).ok()) {
            Ok(translated) => translated,
            Err(error) => {
                eprintln!("error: {error}");
                return ExitCode::FAILURE;
            }
        };
    let argv = ["charon".to_owned(), "serve".to_owned()]
        .into_iter()
        .chain(translated.args);
    let cli = match Cli::try_parse_from(argv) {
        Ok(cli) => cli,
        Err(error) => {
            // A value clap refuses names Charon's flag; say which variable
            // it came from.
            let variable = variable_of(&error)
                .map(|name| format!(" ({name})"))
                .unwrap_or_default();
            eprintln!(
                "error: a variable of envoyproxy/ratelimit's environment{variable} does not parse (see docs/envoy-compatibility.md#every-upstream-variable):\n{error}"
            );
            return ExitCode::FAILURE;
        }
    };
    match cli.command {
        Command::Serve(args) => serve::run(args, &cli.log, &translated.notes),
        _ => ExitCode::FAILURE,
    }
}

/// The environment variable behind the `serve` flag a parse error names.
fn variable_of(error: &clap::Error) -> Option<String> {
    use clap::CommandFactory;
    use clap::error::{ContextKind, ContextValue};
    let Some(ContextValue::String(named)) = error.get(ContextKind::InvalidArg) else {
        return None;
    };
    let command = Cli::command();
    let serve = command.find_subcommand("serve")?;
    serve
        .get_arguments()
        .find(|arg| {
            arg.get_long().is_some_and(|long| {
                named.starts_with(&format!("--{long} ")) || *named == format!("--{long}")
            })
        })
        .and_then(|arg| arg.get_env())
        .map(|env| env.to_string_lossy().into_owned())
}

fn inject(options: charon::inject::InjectOptions, log: &LogOptions) -> ExitCode {
    logging::init(log, None);
    run_to_end(charon::inject::run(options))
}

/// Runs a future on a multi-threaded runtime until it ends: its error, if
/// any, on stderr (with its causes).
fn run_to_end<E: std::fmt::Display>(
    served: impl std::future::Future<Output = Result<(), E>>,
) -> ExitCode {
    let runtime = match tokio::runtime::Runtime::new() {
        Ok(runtime) => runtime,
        Err(error) => {
            eprintln!("error: cannot start the runtime: {error}");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(served) {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("error: {error:#}");
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
    print_or_fail(run())
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

fn simulate_leases(capacity: &str, clients: &str, span: &str, tick: &str, json: bool) -> ExitCode {
    use charon::simulate::leases;
    let run = || -> Result<String, String> {
        let timeline = leases::run(capacity, clients, span, tick, charon::simulate::MAX_TICKS)?;
        if json {
            serde_json::to_string_pretty(&timeline).map_err(|error| error.to_string())
        } else {
            Ok(timeline.to_text())
        }
    };
    print_or_fail(run())
}

/// Prints a simulation's output, or its error, and says how it went.
fn print_or_fail(output: Result<String, String>) -> ExitCode {
    match output {
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
