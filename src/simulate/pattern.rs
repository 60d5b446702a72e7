//! Request patterns for `charon simulate`: `10/s for 3s, pause 2s, 50/s for
//! 1s, burst 30, at 100ms 250ms` — segments run one after another from time
//! 0. `N/s for D` (also `/m`, `/h`) spreads N requests per unit evenly over D;
//! `pause D` sends nothing for D; `burst N` sends N at once; `at T…` sends one
//! request at each offset T from the start of the pattern.

use crate::config::duration;

/// At most this many requests in one simulation: bounded work and memory.
pub const MAX_REQUESTS: u64 = 1_000_000;
/// At most this long a simulation (one week).
pub const MAX_SPAN_MS: u64 = 7 * 24 * 3_600_000;

/// Requests at these instants (ms from the start), in order; several at one
/// instant are one entry with a count.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Pattern {
    pub requests: Vec<(u64, u64)>,
    /// When the pattern ends (its last segment's end).
    pub span_ms: u64,
}

impl Pattern {
    pub fn total(&self) -> u64 {
        self.requests.iter().map(|(_, n)| n).sum()
    }
}

/// Parses a pattern, refusing one that is malformed, over [`MAX_REQUESTS`]
/// or over [`MAX_SPAN_MS`], before generating anything.
pub fn parse(text: &str) -> Result<Pattern, String> {
    let mut pattern = Pattern::default();
    let mut now: u64 = 0;
    let mut total: u64 = 0;
    let mut at = Vec::new();
    for segment in text.split(',').map(str::trim) {
        if segment.is_empty() {
            return Err(format!("empty segment in pattern `{text}`"));
        }
        let words: Vec<&str> = segment.split_whitespace().collect();
        match words.as_slice() {
            ["pause", span] => now = advance(now, duration_of(span)?)?,
            ["burst", count] => {
                let count = count_of(count)?;
                total = add_requests(total, count)?;
                pattern.requests.push((now, count));
            }
            ["at", offsets @ ..] if !offsets.is_empty() => {
                for offset in offsets {
                    let offset = duration_of(offset.trim_end_matches(','))?;
                    if offset > MAX_SPAN_MS {
                        return Err(span_error());
                    }
                    total = add_requests(total, 1)?;
                    at.push((offset, 1));
                    now = now.max(offset);
                }
            }
            [rate, "for", span] => {
                let (per, unit_ms) = rate_of(rate)?;
                let span = duration_of(span)?;
                let count = u64::try_from(u128::from(per) * u128::from(span) / u128::from(unit_ms))
                    .map_err(|_| too_many())?;
                total = add_requests(total, count)?;
                for k in 0..count {
                    let offset =
                        u64::try_from(u128::from(k) * u128::from(unit_ms) / u128::from(per))
                            .map_err(|_| span_error())?;
                    pattern.requests.push((now + offset, 1));
                }
                now = advance(now, span)?;
            }
            _ => {
                return Err(format!(
                    "cannot read `{segment}`: write `10/s for 3s`, `pause 2s`, `burst 30` or `at 0ms 250ms 1s`"
                ));
            }
        }
    }
    pattern.requests.extend(at);
    pattern.requests.sort_unstable_by_key(|(t, _)| *t);
    merge_instants(&mut pattern.requests);
    pattern.span_ms = now.max(pattern.requests.last().map_or(0, |(t, _)| t + 1));
    Ok(pattern)
}

fn merge_instants(requests: &mut Vec<(u64, u64)>) {
    let mut merged: Vec<(u64, u64)> = Vec::with_capacity(requests.len());
    for &(t, n) in requests.iter() {
        match merged.last_mut() {
            Some((last, count)) if *last == t => *count += n,
            _ => merged.push((t, n)),
        }
    }
    *requests = merged;
}

fn advance(now: u64, span: u64) -> Result<u64, String> {
    match now.checked_add(span) {
        Some(end) if end <= MAX_SPAN_MS => Ok(end),
        _ => Err(span_error()),
    }
}

fn add_requests(total: u64, more: u64) -> Result<u64, String> {
    match total.checked_add(more) {
        Some(sum) if sum <= MAX_REQUESTS => Ok(sum),
        _ => Err(too_many()),
    }
}

fn too_many() -> String {
    format!("the pattern has more than {MAX_REQUESTS} requests; simulate a shorter or slower one")
}

fn span_error() -> String {
    format!(
        "the pattern lasts longer than {}; simulate a shorter one",
        duration::format(MAX_SPAN_MS)
    )
}

fn duration_of(text: &str) -> Result<u64, String> {
    match duration::parse(text) {
        Ok(ms) if ms == duration::FOREVER => {
            Err(format!("`{text}`: a pattern cannot last forever"))
        }
        Ok(ms) => Ok(ms),
        Err(message) => Err(format!("`{text}`: {message}")),
    }
}

fn count_of(text: &str) -> Result<u64, String> {
    match text.parse::<u64>() {
        Ok(count) if count > MAX_REQUESTS => Err(too_many()),
        Ok(count) => Ok(count),
        Err(_) => Err(format!("`{text}` is not a number of requests")),
    }
}

/// `10/s` → (10, 1000): requests per unit, and the unit in ms.
fn rate_of(text: &str) -> Result<(u64, u64), String> {
    let (count, unit) = text
        .split_once('/')
        .ok_or_else(|| format!("`{text}` is not a rate: write `10/s`"))?;
    let per = count_of(count)?;
    let unit_ms = match unit {
        "ms" => 1,
        "s" => 1_000,
        "m" | "min" => 60_000,
        "h" => 3_600_000,
        other => return Err(format!("`{other}` is not a unit: write /ms, /s, /m or /h")),
    };
    if per == 0 {
        return Err(format!(
            "`{text}`: a rate of 0 sends nothing; write `pause`"
        ));
    }
    Ok((per, unit_ms))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn segments_run_one_after_another() {
        let pattern = parse("2/s for 2s, pause 1s, burst 3, at 100ms 5s").unwrap();
        assert_eq!(
            pattern.requests,
            [
                (0, 1),
                (100, 1),
                (500, 1),
                (1_000, 1),
                (1_500, 1),
                (3_000, 3),
                (5_000, 1)
            ]
        );
        assert_eq!(pattern.total(), 9);
        assert_eq!(pattern.span_ms, 5_001);
    }

    #[test]
    fn nonsense_and_huge_patterns_are_refused_before_any_work() {
        for (bad, expected) in [
            ("", "empty segment"),
            ("10/s", "cannot read"),
            ("10/s for", "cannot read"),
            ("ten/s for 1s", "not a number"),
            ("10/fortnight for 1s", "not a unit"),
            ("0/s for 1s", "rate of 0"),
            ("10/s for soon", "soon"),
            ("10/s for forever", "forever"),
            ("10000000/s for 1s", "more than"),
            ("1000000/s for 2s", "more than"),
            ("burst 99999999999", "more than"),
            ("pause 8d", "longer than"),
            ("at 30d", "longer than"),
        ] {
            let error = parse(bad).unwrap_err();
            assert!(error.contains(expected), "{bad}: {error}");
        }
    }
}
