//! A limit proposed from recorded use (docs/design.md#learning-a-limit):
//! from what a namespace with `settings.learn` recorded per window and
//! domain, each domain's peak and high percentiles of use per window over
//! the recorded period ([`summarize`]), and a namespace file that sets the
//! chosen one as each domain's limit ([`snippet`], in `write.rs`). What is
//! recorded is a [`Subject`]: a resource, or a shadow-mode descriptor
//! limit. Pure: the stores keep the record, the admin port asks for the
//! proposal; `charon check` accepts what this writes.

mod subject;
mod write;

use super::Learn;

pub use self::subject::{Level, Subject, VALUE_SEPARATOR};
pub use self::write::snippet;

/// One window's record of one subject: the heaviest domains' hits.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WindowUse {
    pub start_ms: u64,
    pub domains: Vec<(String, u64)>,
}

/// What was recorded of one subject of the namespace.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Recorded {
    /// [`Subject::encode`]'s string.
    pub subject: String,
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
    /// The windows it was recorded in, of the `windows` the statistics
    /// are over.
    pub seen: usize,
    pub windows: usize,
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
                windows: count.max(seen),
            }
        })
        .collect();
    uses.sort_by(|a, b| b.peak.cmp(&a.peak).then_with(|| a.domain.cmp(&b.domain)));
    uses
}

/// The `percent`th percentile of sorted `values` by nearest rank: a value
/// that was recorded, never an interpolation.
pub(crate) fn nearest_rank(sorted: &[u64], percent: usize) -> u64 {
    if sorted.is_empty() {
        return 0;
    }
    let rank = (percent * sorted.len()).div_ceil(100).max(1);
    sorted[rank - 1]
}

#[cfg(test)]
mod tests;
