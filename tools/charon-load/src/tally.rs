//! What the workers saw: counts and latencies, their percentiles, and the
//! load tool's own CPU time (so a run shows what the tool itself cost).

use std::collections::BTreeMap;

/// What one worker saw.
#[derive(Default)]
pub(crate) struct Tally {
    pub(crate) ok: u64,
    pub(crate) over_limit: u64,
    /// Answers with another overall code (UNKNOWN).
    pub(crate) other: u64,
    /// gRPC errors by code name, and timeouts.
    pub(crate) errors: BTreeMap<String, u64>,
    /// Latency of every answered or failed request, in nanoseconds.
    pub(crate) latencies: Vec<u64>,
}

impl Tally {
    pub(crate) fn error(&mut self, what: String) {
        *self.errors.entry(what).or_default() += 1;
    }

    pub(crate) fn merge(&mut self, other: Tally) {
        self.ok += other.ok;
        self.over_limit += other.over_limit;
        self.other += other.other;
        for (what, count) in other.errors {
            *self.errors.entry(what).or_default() += count;
        }
        self.latencies.extend(other.latencies);
    }

    pub(crate) fn error_count(&self) -> u64 {
        self.errors.values().sum()
    }
}

/// The `p`-th percentile (0 < p <= 1) of sorted values, nearest rank.
pub(crate) fn percentile(sorted: &[u64], p: f64) -> u64 {
    if sorted.is_empty() {
        return 0;
    }
    let rank = (p * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

/// This process's CPU time (user + system), from `/proc/self/stat` (Linux).
pub(crate) fn own_cpu_seconds() -> Option<f64> {
    let stat = std::fs::read_to_string("/proc/self/stat").ok()?;
    // Fields after the command name, which is in parentheses.
    let rest = stat.rsplit_once(')')?.1;
    let fields: Vec<&str> = rest.split_whitespace().collect();
    // utime and stime are fields 14 and 15 of the line: 12 and 13 here.
    let ticks: f64 = fields.get(11)?.parse::<f64>().ok()? + fields.get(12)?.parse::<f64>().ok()?;
    Some(ticks / 100.0)
}

pub(crate) fn ms(nanos: u64) -> String {
    format!("{:.3} ms", nanos as f64 / 1e6)
}
