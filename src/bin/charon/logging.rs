//! The log flags every subcommand takes, for [`charon::kit::logging`].

use charon::kit::logging::{self, LogFormat};
use charon::kit::otlp::Traces;

/// How `serve`, `throttle` and `inject` log (to stderr).
#[derive(clap::Args, Clone)]
pub struct LogOptions {
    /// `text` (one line per event; colours only on a terminal, never with
    /// NO_COLOR) or `json` (one object per line: timestamp, level, target,
    /// fields, spans), for log collectors.
    #[arg(long, global = true, env = "CHARON_LOG_FORMAT", default_value = "text")]
    pub log_format: LogFormat,
    /// What to log: a level (`info`, `debug`…) or a filter as RUST_LOG
    /// takes it (`charon=debug,info`). Default: RUST_LOG, else `info`.
    #[arg(long, global = true, env = "CHARON_LOG_LEVEL", value_parser = logging::check_filter)]
    pub log_level: Option<String>,
}

/// Logs as the flags say, and the spans to `traces`.
pub fn init(options: &LogOptions, traces: Option<&Traces>) {
    logging::init(options.log_format, options.log_level.as_deref(), traces);
}
