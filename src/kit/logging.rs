//! Where and how a program logs: stderr, as text or JSON lines, and the
//! request spans to the OTLP exporter when there is one.

use std::io::IsTerminal;

use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;
use tracing_subscriber::{EnvFilter, Layer, Registry};

use super::otlp::Traces;

/// How lines are written.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum LogFormat {
    /// One line per event; colours only on a terminal, never with NO_COLOR.
    Text,
    /// One object per line (timestamp, level, target, fields, spans), for
    /// log collectors.
    Json,
}

/// `level` if the filter can read it (a level, or a filter as RUST_LOG
/// takes it), so that a typo is refused at parse time rather than making a
/// program that logs less than asked.
pub fn check_filter(level: &str) -> Result<String, String> {
    EnvFilter::try_new(level)
        .map(|_| level.to_owned())
        .map_err(|error| format!("{level:?} is not a level or filter: {error}"))
}

/// Installs the global subscriber: logs to stderr filtered by `level`
/// (else RUST_LOG, else `info`; a RUST_LOG that cannot be read falls back
/// to `info`, as it always has), and, with `traces`, the request spans.
pub fn init(format: LogFormat, level: Option<&str>, traces: Option<&Traces>) {
    let filter = level
        .and_then(|level| EnvFilter::try_new(level).ok())
        .or_else(|| EnvFilter::try_from_default_env().ok())
        .unwrap_or_else(|| EnvFilter::new("info"));
    let fmt = tracing_subscriber::fmt::layer().with_writer(std::io::stderr);
    let mut layers: Vec<Box<dyn Layer<Registry> + Send + Sync>> = vec![match format {
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
