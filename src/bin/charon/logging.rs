//! Where and how the binary logs: stderr, as text or JSON lines.

use std::io::IsTerminal;

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
    tracing_subscriber::EnvFilter::try_new(text)
        .map(|_| text.to_owned())
        .map_err(|error| format!("{text:?} is not a level or filter: {error}"))
}

/// Installs the global subscriber. A `RUST_LOG` that cannot be read falls
/// back to `info`, as it always has.
pub fn init(options: &LogOptions) {
    let filter = options
        .log_level
        .as_deref()
        .and_then(|level| tracing_subscriber::EnvFilter::try_new(level).ok())
        .or_else(|| tracing_subscriber::EnvFilter::try_from_default_env().ok())
        .unwrap_or_else(|| tracing_subscriber::EnvFilter::new("info"));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    match options.log_format {
        LogFormat::Json => builder.json().with_current_span(true).init(),
        LogFormat::Text => {
            // Escape codes only where a person reads them: elsewhere they end
            // up as garbage in `kubectl logs` and files.
            let colours = std::io::stderr().is_terminal() && std::env::var_os("NO_COLOR").is_none();
            builder.with_ansi(colours).init();
        }
    }
}
