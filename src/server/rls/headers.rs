//! The quota headers Envoy adds to the client's response
//! (`response_headers_to_add`), so that Charon's resets and exact waits reach
//! HTTP clients behind Envoy: envoyproxy/ratelimit's three headers, or the
//! IETF draft's as the Tower layer writes them.

use std::fmt::Write as _;

use envoy_types::pb::envoy::config::core::v3::HeaderValue;

use crate::layer::reply::{Quota, sf_string};
use crate::limiter::{DescriptorStatus, RateLimitAnswer};

use super::{HeadersFor, ResponseHeaders};

/// Whole seconds, rounded up: Envoy reads only a Duration's seconds (its
/// `X-RateLimit-Reset`), so a reset must never reach a client early, and an
/// OVER_LIMIT status never says 0 (retry at once).
pub(super) fn whole_seconds(ms: u64, over_limit: bool) -> u64 {
    let seconds = ms.div_ceil(1_000);
    if over_limit { seconds.max(1) } else { seconds }
}

/// One header of Envoy's answer.
pub(super) fn header(key: &str, value: String) -> HeaderValue {
    HeaderValue {
        key: key.to_owned(),
        value,
        ..Default::default()
    }
}

/// The status the headers describe, as envoyproxy/ratelimit picks it: the
/// last descriptor over its limit that is not a quota descriptor; otherwise
/// the limited one with the fewest hits left (the first on ties).
pub(super) fn deciding(answer: &RateLimitAnswer) -> Option<&DescriptorStatus> {
    let limited = || answer.statuses.iter().filter(|s| s.limit.is_some());
    limited().rfind(|s| s.over_limit && !s.quota).or_else(|| {
        limited().fold(None, |best: Option<&DescriptorStatus>, s| match best {
            Some(b) if b.remaining <= s.remaining => Some(b),
            _ => Some(s),
        })
    })
}

/// Appends the headers `mode` asks for to `out`, for the descriptor that
/// decided or, with [`HeadersFor::Every`], for every descriptor that had a
/// limit.
pub(super) fn add(
    answer: &RateLimitAnswer,
    mode: &ResponseHeaders,
    scope: HeadersFor,
    out: &mut Vec<HeaderValue>,
) {
    if *mode == ResponseHeaders::None {
        return;
    }
    let Some(status) = deciding(answer) else {
        return;
    };
    let Some(limit) = &status.limit else {
        return;
    };
    let reset = whole_seconds(status.reset_after_ms.unwrap_or(0), status.over_limit);
    let limited = || answer.statuses.iter().filter(|s| s.limit.is_some());
    match mode {
        ResponseHeaders::None => {}
        ResponseHeaders::RateLimit(names) => {
            let mut value = limit.requests_per_unit.to_string();
            if scope == HeadersFor::Every {
                // As Envoy's own `X-RateLimit-Limit` lists the limits of a
                // request after the one that decided:
                // `10, 10;w=1;name="per-ip", 1000;w=3600`.
                for limit in limited().filter_map(|s| s.limit.as_ref()) {
                    let window = whole_seconds(limit.window_ms, false).max(1);
                    let _ = write!(value, ", {};w={window}", limit.requests_per_unit);
                    if let Some(name) = &limit.name {
                        value.push_str(";name=");
                        value.push_str(&sf_string(name));
                    }
                }
            }
            out.push(header(&names.limit, value));
            out.push(header(&names.remaining, status.remaining.to_string()));
            out.push(header(&names.reset, reset.to_string()));
        }
        ResponseHeaders::Ietf => {
            let every = scope == HeadersFor::Every;
            let Some(tightest) = quota(status, every) else {
                return;
            };
            let mut written = http::HeaderMap::new();
            if every {
                let quotas: Vec<Quota> = limited().filter_map(|s| quota(s, true)).collect();
                Quota::write_every(&quotas, &tightest, &mut written);
            } else {
                tightest.write(&mut written);
            }
            for (name, value) in &written {
                if let Ok(value) = value.to_str() {
                    out.push(header(name.as_str(), value.to_owned()));
                }
            }
            if answer.over_limit {
                out.push(header("retry-after", retry_after(answer).to_string()));
            }
        }
    }
}

/// A limited status as the draft's quota, named by its limit's name, else
/// `default`; `by_key`: else by its statistics key, so that the policies of
/// a request's several descriptors keep apart.
fn quota(status: &DescriptorStatus, by_key: bool) -> Option<Quota> {
    let limit = status.limit.as_ref()?;
    let key = status.stats_key.as_deref().filter(|_| by_key);
    let name = limit
        .name
        .clone()
        .or_else(|| key.map(str::to_owned))
        .unwrap_or_else(|| "default".to_owned());
    let reset = whole_seconds(status.reset_after_ms.unwrap_or(0), status.over_limit);
    Some(Quota {
        name,
        limit: limit.requests_per_unit,
        window: Some(std::time::Duration::from_millis(limit.window_ms)),
        remaining: status.remaining,
        reset: Some(std::time::Duration::from_secs(reset)),
    })
}

/// This request's own wait, whole seconds: it passes once every descriptor
/// over its limit would, so the longest of their waits.
fn retry_after(answer: &RateLimitAnswer) -> u64 {
    let wait = answer
        .statuses
        .iter()
        .filter(|s| s.over_limit)
        .filter_map(|s| s.reset_after_ms)
        .max()
        .unwrap_or(0);
    whole_seconds(wait, true)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Unit;
    use crate::limiter::CurrentLimit;

    fn status(remaining: u64, over: bool, quota: bool) -> DescriptorStatus {
        DescriptorStatus {
            over_limit: over,
            limit: Some(CurrentLimit {
                name: Some(format!("r{remaining}")),
                requests_per_unit: 10,
                unit: Unit::Minute,
                window_ms: 60_000,
            }),
            remaining,
            reset_after_ms: Some(1_500),
            tiers: None,
            soft_limit_exceeded: false,
            quota,
            metadata: None,
            hits: 1,
            shadowed: false,
            refund: false,
            unreturned: 0,
            before: 0,
            stats_key: None,
        }
    }

    fn answer(statuses: Vec<DescriptorStatus>) -> RateLimitAnswer {
        RateLimitAnswer {
            over_limit: statuses.iter().any(|s| s.over_limit && !s.quota),
            shadowed: false,
            statuses,
            namespace_known: true,
        }
    }

    #[test]
    fn the_last_rejection_that_is_not_a_quota_decides() {
        let a = answer(vec![
            status(0, true, false),
            status(0, true, true),
            status(3, false, false),
        ]);
        let picked = deciding(&a).and_then(|s| s.limit.as_ref()?.name.clone());
        assert_eq!(picked.as_deref(), Some("r0"));
        let mut last_over = vec![status(0, true, false), status(0, true, false)];
        if let Some(limit) = last_over[1].limit.as_mut() {
            limit.name = Some("second".into());
        }
        let a = answer(last_over);
        let picked = deciding(&a).and_then(|s| s.limit.as_ref()?.name.clone());
        assert_eq!(picked.as_deref(), Some("second"));
    }

    #[test]
    fn otherwise_the_fewest_left_first_on_ties() {
        let a = answer(vec![status(5, false, false), status(2, false, false), {
            let mut s = status(2, false, false);
            if let Some(limit) = s.limit.as_mut() {
                limit.name = Some("tie".into());
            }
            s
        }]);
        let picked = deciding(&a).and_then(|s| s.limit.as_ref()?.name.clone());
        assert_eq!(picked.as_deref(), Some("r2"));
    }

    /// Asserts the headers `mode` adds for `answer`, as (name, value) pairs.
    fn assert_written(answer: &RateLimitAnswer, mode: &ResponseHeaders, expected: &[(&str, &str)]) {
        let mut out = Vec::new();
        add(answer, mode, HeadersFor::Deciding, &mut out);
        let pairs: Vec<(&str, &str)> = out
            .iter()
            .map(|h| (h.key.as_str(), h.value.as_str()))
            .collect();
        assert_eq!(pairs, expected);
    }

    #[test]
    fn upstream_headers_and_ietf_headers() {
        let a = answer(vec![status(0, true, false)]);
        assert_written(
            &a,
            &ResponseHeaders::RateLimit(Default::default()),
            &[
                ("RateLimit-Limit", "10"),
                ("RateLimit-Remaining", "0"),
                ("RateLimit-Reset", "2"),
            ],
        );
        assert_written(
            &a,
            &ResponseHeaders::Ietf,
            &[
                ("ratelimit-policy", r#""r0";q=10;w=60"#),
                ("ratelimit", r#""r0";r=0;t=2"#),
                ("retry-after", "2"),
            ],
        );
        let mut out = Vec::new();
        add(&a, &ResponseHeaders::None, HeadersFor::Deciding, &mut out);
        assert!(out.is_empty());
    }

    /// Two descriptors, 10 a minute (3 left) and 1 000 an hour (900 left,
    /// unnamed): the first decides.
    fn two_limits() -> RateLimitAnswer {
        let mut hourly = status(900, false, false);
        if let Some(limit) = hourly.limit.as_mut() {
            limit.name = None;
            limit.requests_per_unit = 1_000;
            limit.unit = Unit::Hour;
            limit.window_ms = 3_600_000;
        }
        hourly.stats_key = Some("edge.user_acme".into());
        hourly.reset_after_ms = Some(1_800_000);
        answer(vec![status(3, false, false), hourly])
    }

    #[test]
    fn every_descriptor_gets_its_policy_and_the_deciding_one_its_state() {
        let a = two_limits();
        let mut out = Vec::new();
        add(&a, &ResponseHeaders::Ietf, HeadersFor::Every, &mut out);
        let pairs: Vec<(&str, &str)> = out
            .iter()
            .map(|h| (h.key.as_str(), h.value.as_str()))
            .collect();
        assert_eq!(
            pairs,
            [
                (
                    "ratelimit-policy",
                    r#""r3";q=10;w=60, "edge.user_acme";q=1000;w=3600"#
                ),
                ("ratelimit", r#""r3";r=3;t=2"#),
            ]
        );
        // Envoy's own list after the deciding limit; the rest unchanged.
        let mut out = Vec::new();
        add(
            &a,
            &ResponseHeaders::RateLimit(Default::default()),
            HeadersFor::Every,
            &mut out,
        );
        let pairs: Vec<(&str, &str)> = out
            .iter()
            .map(|h| (h.key.as_str(), h.value.as_str()))
            .collect();
        assert_eq!(
            pairs,
            [
                ("RateLimit-Limit", r#"10, 10;w=60;name="r3", 1000;w=3600"#),
                ("RateLimit-Remaining", "3"),
                ("RateLimit-Reset", "2"),
            ]
        );
        // The default is upstream's: the deciding descriptor alone, an
        // unnamed limit's policy named `default` as before.
        let mut out = Vec::new();
        add(&a, &ResponseHeaders::Ietf, HeadersFor::Deciding, &mut out);
        assert_eq!(out[0].value, r#""r3";q=10;w=60"#);
    }
}
