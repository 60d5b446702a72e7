//! Where and how the binary logs: stderr, as text or JSON lines.

use std::io::IsTerminal;

use charon::kit::otlp::Traces;
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;
use tracing_subscriber::{EnvFilter, Layer, Registry};

/// How `serve` and `inject` log (to stderr).
#[derive(clap::Args, Clone)]
pub struct LogOptions {
    /// `text` (one line per event; colours only on a terminal, never with
    /// NO_COLOR) or `json` (one object per line: timestamp, level, target,
    /// fields, spans), for log collectors.
    #[arg(long, global = true, env = "CHARON_LOG_FORMAT", default_value = "text")]
    pub log_format: LogFormat,
    /// What to log: a level (`info`, `debug`…) or a filter as RUST_LOG
    /// takes it (`charon=debug,info`). Default: RUST_LOG, else `info`.
    #[arg(long, global = true, env = "CHARON_LOG_LEVEL", value_parser = parse_filter)]
    pub log_level: Option<String>,
}

#[derive(Clone, Copy, clap::ValueEnum)]
pub enum LogFormat {
    Text,
    Json,
}

/// Rejects a `--log-level` the filter cannot read, at parse time, so that a
/// typo is an error rather than a sidecar that logs less than asked.
fn parse_filter(text: &str) -> Result<String, String> {
    EnvFilter::try_new(text)
        .map(|_| text.to_owned())
        .map_err(|error| format!("{text:?} is not a level or filter: {error}"))
}

/// Installs the global subscriber: logs to stderr, and, with `traces`,
/// the request spans to the OTLP exporter. A `RUST_LOG` that cannot be read
/// falls back to `info`, as it always has.
pub fn init(options: &LogOptions, traces: Option<&Traces>) {
    let filter = options
        .log_level
        .as_deref()
        .and_then(|level| EnvFilter::try_new(level).ok())
        .or_else(|| EnvFilter::try_from_default_env().ok())
        .unwrap_or_else(|| EnvFilter::new("info"));
    let fmt = tracing_subscriber::fmt::layer().with_writer(std::io::stderr);
    let mut layers: Vec<Box<dyn Layer<Registry> + Send + Sync>> = vec![match options.log_format {
        LogFormat::Json => fmt
            .json()
            .with_current_span(true)
            .with_filter(filter)
            .boxed(),
        LogFormat::Text => {
            // Escape codes only where a person reads them: elsewhere they end
            // up as garbage in `kubectl logs` and files.
            let colours = std::io::stderr().is_terminal() && std::env::var_os("NO_COLOR").is_none();
            fmt.with_ansi(colours).with_filter(filter).boxed()
        }
    }];
    if let Some(traces) = traces {
        layers.push(traces.layer());
    }
    tracing_subscriber::registry().with(layers).init();
}
