//! `charon serve` as a whole process: its runtime, the span exporter, then
//! logging (which needs the exporter to send spans to it), served until a
//! signal stops it, and the exporter flushed on the way out, so that the
//! last spans of a stopping sidecar are not lost.

use anyhow::Context as _;

use crate::kit::otlp::{TraceExport, Traces};

use super::ServeOptions;

/// Runs the sidecar on a runtime of `threads` (0: the kit's choice,
/// `kit::runtime`), exporting spans as `export` says; `init_logs` installs
/// logging once the exporter is up, and `notes` (what the start could not
/// honour) are logged once it is.
pub fn run_process(
    options: ServeOptions,
    threads: usize,
    export: &TraceExport,
    init_logs: impl FnOnce(Option<&Traces>),
    notes: &[String],
) -> anyhow::Result<()> {
    let runtime = crate::kit::runtime::build(threads).context("cannot start the runtime")?;
    runtime.block_on(async {
        let traces = Traces::start(export)?;
        init_logs(traces.as_ref());
        for note in notes {
            tracing::warn!("{note}");
        }
        let served = super::run(options).await;
        if let Some(traces) = traces {
            traces.shutdown().await;
        }
        served
    })
}
