//! envoyproxy/ratelimit's statistics, computed as it computes them: the
//! statsd name of a limit, sanitized, turned into the `{domain, key1,
//! key2}` labels of its default mapper, and a request's hits split into
//! `total_hits`, `over_limit`, `near_limit`, `within_limit` and
//! `shadow_mode` (docs/envoy-compatibility.md#metrics).

/// The labels the default mapper gives a limit's statistics: the domain,
/// the first level and, for a limit two or more levels deep, the second;
/// deeper levels are folded into the first two, as the mapper's regular
/// expression drops them.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct StatLabels {
    pub domain: String,
    pub key1: String,
    pub key2: Option<String>,
}

impl StatLabels {
    /// The labels of Charon's statistics key (`domain.key_value…`, built
    /// as upstream builds its own), or `None` for a key the mapper would
    /// not match (no level below the domain).
    pub fn of(stats_key: &str) -> Option<Self> {
        let name = sanitize(stats_key);
        let mut parts = name.split('.');
        let domain = parts.next()?.to_owned();
        let key1 = parts.next()?.to_owned();
        let key2 = parts.next().map(str::to_owned);
        Some(Self { domain, key1, key2 })
    }
}

/// upstream's `SanitizeStatName`: `:` and `|` become `_`, and so do the
/// dots of anything shaped like an IPv4 address (`\d{1,3}(\.\d{1,3}){3}`,
/// leftmost first), so that an address stays one level of the name.
pub fn sanitize(name: &str) -> String {
    let replaced: Vec<u8> = name
        .bytes()
        .map(|b| if b == b':' || b == b'|' { b'_' } else { b })
        .collect();
    let mut out = replaced.clone();
    let mut at = 0;
    while at < replaced.len() {
        match ipv4_at(&replaced, at) {
            Some(end) => {
                for byte in &mut out[at..end] {
                    if *byte == b'.' {
                        *byte = b'_';
                    }
                }
                at = end;
            }
            None => at += 1,
        }
    }
    // Only ASCII bytes were replaced by ASCII bytes.
    String::from_utf8(out).unwrap_or_else(|_| name.to_owned())
}

/// The end of an IPv4-shaped match starting at `at`, as Go's regexp finds
/// it: three groups of 1-3 digits each followed by a dot (a group must end
/// at its dot), then 1-3 digits, as many as there are.
fn ipv4_at(bytes: &[u8], at: usize) -> Option<usize> {
    let digits = |from: usize| {
        bytes[from.min(bytes.len())..]
            .iter()
            .take_while(|b| b.is_ascii_digit())
            .count()
    };
    let mut position = at;
    for _ in 0..3 {
        let run = digits(position);
        if !(1..=3).contains(&run) || bytes.get(position + run) != Some(&b'.') {
            return None;
        }
        position += run + 1;
    }
    let last = digits(position).min(3);
    (last >= 1).then_some(position + last)
}

/// What one descriptor's hits add to each of its limit's statistics.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Split {
    pub total_hits: u64,
    pub over_limit: u64,
    pub near_limit: u64,
    pub within_limit: u64,
    pub shadow_mode: u64,
    /// Hits given back (Envoy's `is_negative_hits`), as upstream's PR
    /// #1140 counts them; nothing else of a refund counts.
    pub total_negative_hits: u64,
}

/// upstream's near-limit threshold: `floor(limit × 0.8)`, in the float32
/// arithmetic it uses (`NEAR_LIMIT_RATIO` is a float32).
pub fn near_threshold(limit: u64) -> u64 {
    let product = (limit as f32) * 0.8_f32;
    f64::from(product).floor() as u64
}

/// upstream's split (its base limiter): every hit is a `total_hit`; over
/// the limit, the hits past it are `over_limit` and, if the count was
/// under the limit before, the hits between the threshold and the limit
/// are `near_limit`; within, every hit is `within_limit` and the hits past
/// the threshold `near_limit` too; a limit in shadow mode counts its hits
/// past the limit in `shadow_mode` as well as in `over_limit`. `over` is
/// the verdict on this limit, `before` its count before these hits.
pub fn split(limit: u64, before: u64, hits: u64, over: bool, shadow: bool) -> Split {
    let after = before.saturating_add(hits);
    let near = near_threshold(limit);
    let mut split = Split {
        total_hits: hits,
        ..Split::default()
    };
    if over {
        let past = if before >= limit {
            hits
        } else {
            after.saturating_sub(limit)
        };
        split.over_limit = past;
        if before < limit {
            split.near_limit = limit.saturating_sub(near.max(before));
        }
        if shadow {
            split.shadow_mode = past;
        }
    } else {
        if after > near {
            split.near_limit = if before >= near { hits } else { after - near };
        }
        split.within_limit = hits;
    }
    split
}

#[cfg(test)]
mod tests {
    use super::*;

    fn labels(domain: &str, key1: &str, key2: Option<&str>) -> StatLabels {
        StatLabels {
            domain: domain.into(),
            key1: key1.into(),
            key2: key2.map(Into::into),
        }
    }

    /// upstream's `TestFlushCounterWithDifferentLabels`
    /// (src/stats/prom/prometheus_sink_test.go): four statsd names, three
    /// series, the deepest folded into the one above it.
    #[test]
    fn upstreams_different_labels_cases() {
        let cases = [
            ("domain1.key1_val1", 1, labels("domain1", "key1_val1", None)),
            (
                "domain1.key1_val1.key2_val2",
                2,
                labels("domain1", "key1_val1", Some("key2_val2")),
            ),
            (
                "domain1.key3_val3.key4_val4",
                1,
                labels("domain1", "key3_val3", Some("key4_val4")),
            ),
            (
                "domain1.key3_val3.key4_val4.key5_val5",
                2,
                labels("domain1", "key3_val3", Some("key4_val4")),
            ),
        ];
        let mut series = std::collections::BTreeMap::<StatLabels, u64>::new();
        for (key, value, expected) in cases {
            let got = StatLabels::of(key).expect("labels");
            assert_eq!(got, expected, "{key}");
            *series.entry(got).or_default() += value;
        }
        assert_eq!(
            series.into_iter().collect::<Vec<_>>(),
            [
                (labels("domain1", "key1_val1", None), 1),
                (labels("domain1", "key1_val1", Some("key2_val2")), 2),
                (labels("domain1", "key3_val3", Some("key4_val4")), 3),
            ]
        );
    }

    #[test]
    fn names_are_sanitized_as_upstream_does() {
        for (name, sanitized) in [
            ("a:b|c", "a_b_c"),
            (
                "gw.route_route.masked_remote_address_0.0.0.0/0",
                "gw.route_route.masked_remote_address_0_0_0_0/0",
            ),
            (
                "gw.r.masked_remote_address_invert_192.0.2.0/24",
                "gw.r.masked_remote_address_invert_192_0_2_0/24",
            ),
            ("d.remote_address_10.1.2.345", "d.remote_address_10_1_2_345"),
            // The regexp's leftmost match: 1234 is not a group of 1-3.
            ("d.v1234.5.6.7", "d.v1234_5_6_7"),
            ("d.v1.2.3", "d.v1.2.3"),
            ("d.header_x-user-id_one", "d.header_x-user-id_one"),
        ] {
            assert_eq!(sanitize(name), sanitized, "{name}");
        }
        assert_eq!(
            StatLabels::of("gw.route_route.masked_remote_address_0.0.0.0/0"),
            Some(labels(
                "gw",
                "route_route",
                Some("masked_remote_address_0_0_0_0/0")
            ))
        );
        assert_eq!(StatLabels::of("domain-only"), None);
    }

    #[test]
    fn the_threshold_is_upstreams_float32_floor() {
        for (limit, near) in [(0, 0), (1, 0), (4, 3), (5, 4), (10, 8), (7, 5), (100, 80)] {
            assert_eq!(near_threshold(limit), near, "{limit}");
        }
    }

    /// upstream's base limiter, request by request: the near-limit and
    /// over-limit splits of multi-hit requests, and shadow mode.
    #[test]
    fn hits_split_as_upstreams_base_limiter_splits_them() {
        // (limit, before, hits, over, shadow) → (over, near, within, shadow)
        let cases = [
            // Within, below the threshold (8 of 10).
            ((10, 0, 5, false, false), (0, 0, 5, 0)),
            // Within, crossing it: 7 → 9, one hit past 8.
            ((10, 7, 2, false, false), (0, 1, 2, 0)),
            // Within, all past it.
            ((10, 8, 2, false, false), (0, 2, 2, 0)),
            // Over from under: 9 → 13: 3 past the limit, 10 - max(8, 9) near.
            ((10, 9, 4, true, false), (3, 1, 0, 0)),
            // Over from below the threshold: 5 → 12: 2 over, 10 - 8 near.
            ((10, 5, 7, true, false), (2, 2, 0, 0)),
            // Already over: every hit is over, none near.
            ((10, 12, 3, true, false), (3, 0, 0, 0)),
            // At the limit before: every hit over.
            ((10, 10, 1, true, false), (1, 0, 0, 0)),
            // Shadow mode: over and shadow alike, answered OK all the same.
            ((10, 9, 4, true, true), (3, 1, 0, 3)),
            ((10, 11, 2, true, true), (2, 0, 0, 2)),
            // A check (hits_addend 0) adds nothing.
            ((10, 3, 0, false, false), (0, 0, 0, 0)),
        ];
        for ((limit, before, hits, over, shadow), (o, n, w, s)) in cases {
            let got = split(limit, before, hits, over, shadow);
            assert_eq!(
                got,
                Split {
                    total_hits: hits,
                    over_limit: o,
                    near_limit: n,
                    within_limit: w,
                    shadow_mode: s,
                    total_negative_hits: 0,
                },
                "limit {limit}, {before} before, {hits} hits"
            );
        }
    }
}
