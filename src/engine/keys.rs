//! State keys. Every part is length-prefixed (`<len>:<bytes>`), so no two
//! different (namespace, descriptor) pairs can produce the same key, whatever
//! characters keys and values contain (envoyproxy/ratelimit joins parts with
//! `_`, so `a_b`+`c` and `a`+`b_c` collide there).

fn push_number(key: &mut String, n: u64) {
    key.push_str(itoa::Buffer::new().format(n));
}

fn push_part(key: &mut String, part: &str) {
    push_number(key, part.len() as u64);
    key.push(':');
    key.push_str(part);
}

/// The counter of a fixed window: namespace, entries, and the window length
/// (so a per-request `limit` override with another unit is another counter).
pub fn window_key<'e>(
    namespace: &str,
    entries: impl IntoIterator<Item = (&'e str, &'e str)>,
    period_ms: u64,
) -> String {
    let mut key = String::with_capacity(64);
    key.push('w');
    push_part(&mut key, namespace);
    for (k, v) in entries {
        push_part(&mut key, k);
        push_part(&mut key, v);
    }
    key.push('@');
    push_number(&mut key, period_ms);
    key
}

/// The access log of one domain for one rate-limited resource.
pub fn tiers_key(namespace: &str, resource: &str, domain: &str) -> String {
    let mut key = String::with_capacity(16 + namespace.len() + resource.len() + domain.len());
    key.push('t');
    push_part(&mut key, namespace);
    push_part(&mut key, resource);
    push_part(&mut key, domain);
    key
}

/// The resource-wide log of the last second, for the global limit.
pub fn global_key(namespace: &str, resource: &str) -> String {
    let mut key = String::with_capacity(12 + namespace.len() + resource.len());
    key.push('g');
    push_part(&mut key, namespace);
    push_part(&mut key, resource);
    key
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn separators_inside_parts_do_not_collide() {
        let a = window_key("ns", [("a_b", "c")], 1000);
        let b = window_key("ns", [("a", "b_c")], 1000);
        let c = window_key("ns_a", [("b", "c")], 1000);
        assert_ne!(a, b);
        assert_ne!(a, c);
        assert_ne!(tiers_key("a", "b:c", "d"), tiers_key("a", "b", "c:d"));
        assert_ne!(
            window_key("ns", [("k", "v")], 1000),
            window_key("ns", [("k", "v")], 60_000)
        );
    }
}
