//! A limit proposed from recorded use (docs/design.md#learning-a-limit):
//! from what a namespace with `settings.learn` recorded per window and
//! domain, each domain's peak and high percentiles of use per window over
//! the recorded period, and a namespace file that sets the chosen one as
//! each domain's limit. Pure: the stores keep the record, the admin port
//! asks for the proposal; `charon check` accepts what this writes.

use std::fmt::Write as _;

use super::Learn;
use super::duration;

/// One window's record of one resource: the heaviest domains' hits.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WindowUse {
    pub start_ms: u64,
    pub domains: Vec<(String, u64)>,
}

/// What was recorded of one resource of the namespace.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Recorded {
    pub resource: String,
    pub windows: Vec<WindowUse>,
}

/// Which statistic of a domain's use becomes its proposed limit.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Pick {
    /// The busiest window: no window of the recorded period would have
    /// been refused anything.
    #[default]
    Peak,
    P99,
    P95,
    P50,
}

impl Pick {
    pub fn parse(text: &str) -> Option<Self> {
        match text {
            "peak" => Some(Self::Peak),
            "p99" => Some(Self::P99),
            "p95" => Some(Self::P95),
            "p50" => Some(Self::P50),
            _ => None,
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Self::Peak => "peak",
            Self::P99 => "p99",
            Self::P95 => "p95",
            Self::P50 => "p50",
        }
    }
}

/// One domain's use per window over the recorded period.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DomainUse {
    pub domain: String,
    pub peak: u64,
    pub p50: u64,
    pub p95: u64,
    pub p99: u64,
    /// The windows it was recorded in, of those the statistics are over.
    pub seen: usize,
}

impl DomainUse {
    pub fn pick(&self, pick: Pick) -> u64 {
        match pick {
            Pick::Peak => self.peak,
            Pick::P99 => self.p99,
            Pick::P95 => self.p95,
            Pick::P50 => self.p50,
        }
    }
}

/// The complete windows a proposal is made from at `now_ms`: the
/// recorded period, without the window still running (its count is not
/// final).
pub fn period(learn: &Learn, now_ms: u64) -> std::ops::Range<u64> {
    let current = learn.window_start(now_ms);
    let span = learn.window_ms.saturating_mul(u64::from(learn.windows));
    current.saturating_sub(span)..current
}

/// Each domain's use per window, heaviest peak first: over the complete
/// windows of the period from the first in which the resource was used (a
/// resource first used ten minutes ago is judged on ten minutes), a window
/// without the domain counting as no use.
pub fn summarize(learn: &Learn, windows: &[WindowUse], now_ms: u64) -> Vec<DomainUse> {
    let period = period(learn, now_ms);
    let complete: Vec<&WindowUse> = windows
        .iter()
        .filter(|window| period.contains(&window.start_ms))
        .collect();
    let Some(first) = complete.iter().map(|window| window.start_ms).min() else {
        return Vec::new();
    };
    let count = usize::try_from((period.end - first) / learn.window_ms).unwrap_or(usize::MAX);
    let mut per_domain: std::collections::HashMap<&str, Vec<u64>> = Default::default();
    for window in &complete {
        for (domain, hits) in &window.domains {
            per_domain.entry(domain).or_default().push(*hits);
        }
    }
    let mut uses: Vec<DomainUse> = per_domain
        .into_iter()
        .map(|(domain, mut hits)| {
            let seen = hits.len();
            hits.resize(count.max(seen), 0);
            hits.sort_unstable();
            DomainUse {
                domain: domain.to_owned(),
                peak: hits.last().copied().unwrap_or(0),
                p50: nearest_rank(&hits, 50),
                p95: nearest_rank(&hits, 95),
                p99: nearest_rank(&hits, 99),
                seen,
            }
        })
        .collect();
    uses.sort_by(|a, b| b.peak.cmp(&a.peak).then_with(|| a.domain.cmp(&b.domain)));
    uses
}

/// The `percent`th percentile of sorted `values` by nearest rank: a value
/// that was recorded, never an interpolation.
fn nearest_rank(sorted: &[u64], percent: usize) -> u64 {
    if sorted.is_empty() {
        return 0;
    }
    let rank = (percent * sorted.len()).div_ceil(100).max(1);
    sorted[rank - 1]
}

/// The limit proposed for a domain not listed: the median of the listed
/// domains' proposals, so that a new tenant gets what a typical one uses.
fn default_limit(uses: &[DomainUse], pick: Pick) -> u64 {
    let mut picked: Vec<u64> = uses.iter().map(|usage| usage.pick(pick)).collect();
    picked.sort_unstable();
    nearest_rank(&picked, 50).max(1)
}

/// A namespace file setting, for each recorded resource, each listed
/// domain's `pick` as its limit per window (at least 1), the median of
/// those as the default, with every domain's statistics in a comment.
pub fn snippet(
    namespace: &str,
    learn: &Learn,
    recorded: &[Recorded],
    pick: Pick,
    now_ms: u64,
) -> String {
    let window = duration::format(learn.window_ms);
    let period = period(learn, now_ms);
    let mut out = String::new();
    let _ = writeln!(
        out,
        "# Proposed by charon from use recorded per {window} window, {} windows before {} ms since the epoch;",
        learn.windows, period.end
    );
    let _ = writeln!(
        out,
        "# each domain's limit is its {} hits per window; the default is the median of those.",
        pick.as_str()
    );
    let _ = writeln!(out, "domain: {}", quoted(namespace));
    let mut resources = String::new();
    for resource in recorded {
        let uses: Vec<DomainUse> = summarize(learn, &resource.windows, now_ms)
            .into_iter()
            .filter(|usage| is_writable(&usage.domain))
            .collect();
        if uses.is_empty() {
            continue;
        }
        let _ = writeln!(resources, "  {}:", quoted(&resource.resource));
        let _ = writeln!(resources, "    rate:");
        let _ = writeln!(
            resources,
            "      tiers: [{{limit: {}, window: {window}, active: forever}}]",
            default_limit(&uses, pick)
        );
        let _ = writeln!(resources, "      domains:");
        for usage in &uses {
            let _ = writeln!(
                resources,
                "        {}: {{tiers: [{{limit: {}, window: {window}, active: forever}}]}}  # peak {}, p99 {}, p95 {}, p50 {}; used in {} windows",
                quoted(&usage.domain),
                usage.pick(pick).max(1),
                usage.peak,
                usage.p99,
                usage.p95,
                usage.p50,
                usage.seen
            );
        }
    }
    if resources.is_empty() {
        out.push_str("# nothing recorded in a complete window yet\n");
    } else {
        out.push_str("resources:\n");
        out.push_str(&resources);
    }
    out
}

/// A name as YAML reads it back exactly: double-quoted, with its quotes
/// and backslashes escaped (names hold no control characters).
fn quoted(name: &str) -> String {
    format!("\"{}\"", name.replace('\\', "\\\\").replace('"', "\\\""))
}

/// Whether a configuration may name this domain (never empty, no control
/// characters): others are left out of the proposal rather than make it
/// fail to load.
fn is_writable(domain: &str) -> bool {
    !domain.is_empty() && !domain.chars().any(char::is_control)
}

#[cfg(test)]
mod tests;
