//! State keys. Every part is length-prefixed (`<len>:<bytes>`), so no two
//! different (namespace, descriptor) pairs can produce the same key, whatever
//! characters keys and values contain (envoyproxy/ratelimit joins parts with
//! `_`, so `a_b`+`c` and `a`+`b_c` collide there).
//!
//! Every key starts with a Redis Cluster hash tag, `{xxxxxxxx}`: eight hex
//! digits of a stable hash (FNV-1a, the same in every process and version)
//! of the parts that must live together. Keys with one tag share a cluster
//! slot, so one script can decide them atomically:
//!
//! - a fixed window: the namespace and the descriptor's first entry, so the
//!   nested descriptors of one request (`tenant`, `tenant`+`path`) share a slot;
//! - burst tiers: (namespace, resource, domain); but when the resource has a
//!   global limit, (namespace, resource) for every domain, because the global
//!   log must be updated in the same script as the domain's log to stay exact.
//!
//! - a copy-limited resource: (namespace, resource), for every key of its copy
//!   log (counts, each sidecar's contribution, staged transfers), because a
//!   reserve checks the domain, its groups and the global count at once.
//!
//! The tag is a hash, not the parts themselves, because a part may contain
//! `{` or `}`, which would move the tag Redis sees.

use crate::engine::SlotKind;

/// `--store-key-prefix`: written before every key a Redis store uses, so
/// that fleets sharing one Redis never see each other's state (the memory
/// store needs none). It has no `{` or `}`, so the hash tag that follows
/// still decides the cluster slot.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct KeyPrefix(std::sync::Arc<str>);

/// The longest `--store-key-prefix`, in bytes.
pub const MAX_PREFIX_BYTES: usize = 64;

impl KeyPrefix {
    pub fn new(prefix: &str) -> Result<Self, String> {
        if prefix.len() > MAX_PREFIX_BYTES {
            return Err(format!(
                "the key prefix is longer than {MAX_PREFIX_BYTES} bytes"
            ));
        }
        if let Some(bad) = prefix
            .chars()
            .find(|c| matches!(c, '{' | '}') || c.is_whitespace() || c.is_control())
        {
            return Err(format!(
                "the key prefix has {bad:?}: braces would move the cluster hash tag; \
                 no whitespace or control characters either"
            ));
        }
        Ok(Self(prefix.into()))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// `key` behind the prefix (borrowed as it is when there is none).
    pub fn apply<'k>(&self, key: &'k str) -> std::borrow::Cow<'k, str> {
        if self.0.is_empty() {
            std::borrow::Cow::Borrowed(key)
        } else {
            let mut prefixed = String::with_capacity(self.0.len() + key.len());
            prefixed.push_str(&self.0);
            prefixed.push_str(key);
            std::borrow::Cow::Owned(prefixed)
        }
    }

    /// Every key of a copy log behind the prefix.
    pub fn copy_keys(&self, keys: CopyKeys) -> CopyKeys {
        if self.0.is_empty() {
            return keys;
        }
        let apply = |key: String| self.apply(&key).into_owned();
        CopyKeys {
            counts: apply(keys.counts),
            contributors: apply(keys.contributors),
            reaped: apply(keys.reaped),
            transfers: apply(keys.transfers),
            staged: apply(keys.staged),
            contribution_prefix: apply(keys.contribution_prefix),
        }
    }
}

/// The hash-tag prefix of a key: `{` + 8 hex digits + `}`.
pub const TAG_LEN: usize = 10;

/// FNV-1a (32 bits) over length-prefixed parts: stable across processes, so
/// every sidecar puts a key in the same cluster slot.
fn tag_hash<'p>(parts: impl IntoIterator<Item = &'p str>) -> u32 {
    let mut hash: u32 = 0x811c_9dc5;
    let mut feed = |bytes: &[u8]| {
        for byte in bytes {
            hash ^= u32::from(*byte);
            hash = hash.wrapping_mul(0x0100_0193);
        }
    };
    for part in parts {
        feed(&(part.len() as u64).to_le_bytes());
        feed(part.as_bytes());
    }
    hash
}

fn push_tag<'p>(key: &mut String, parts: impl IntoIterator<Item = &'p str>) {
    use std::fmt::Write;
    // Writing to a String cannot fail.
    let _ = write!(key, "{{{:08x}}}", tag_hash(parts));
}

/// The hash tag a key starts with (the whole key if it has none).
pub fn tag_of(key: &str) -> &str {
    key.get(..TAG_LEN).unwrap_or(key)
}

fn push_number(key: &mut String, n: u64) {
    key.push_str(itoa::Buffer::new().format(n));
}

fn push_part(key: &mut String, part: &str) {
    push_number(key, part.len() as u64);
    key.push(':');
    key.push_str(part);
}

/// The one key builder of every state kept per descriptor (a fixed
/// window's counter, a GCRA key's TAT, a sliding window's counters or log,
/// a hybrid key, a cost budget): namespace, entries, and the window length
/// (so a per-request `limit` override with another unit is another key),
/// typed by the state's kind. Every kind of one descriptor shares the tag of
/// its first entry, so nested descriptors still share a slot.
pub fn descriptor_key<'e>(
    kind: SlotKind,
    namespace: &str,
    entries: impl IntoIterator<Item = (&'e str, &'e str)>,
    period_ms: u64,
) -> String {
    let mut entries = entries.into_iter().peekable();
    let first = entries.peek().copied().unwrap_or(("", ""));
    let mut key = String::with_capacity(64);
    push_tag(&mut key, [namespace, first.0, first.1]);
    key.push(char::from(kind.letter()));
    push_part(&mut key, namespace);
    for (k, v) in entries {
        push_part(&mut key, k);
        push_part(&mut key, v);
    }
    key.push('@');
    push_number(&mut key, period_ms);
    key
}

/// The access log of one domain for one rate-limited resource. With a global
/// limit, every domain of the resource shares the resource's tag.
pub fn tiers_key(namespace: &str, resource: &str, domain: &str, has_global: bool) -> String {
    let mut key =
        String::with_capacity(TAG_LEN + 16 + namespace.len() + resource.len() + domain.len());
    if has_global {
        push_tag(&mut key, [namespace, resource]);
    } else {
        push_tag(&mut key, [namespace, resource, domain]);
    }
    key.push('t');
    push_part(&mut key, namespace);
    push_part(&mut key, resource);
    push_part(&mut key, domain);
    key
}

/// A domain's key on a resource of another algorithm than tiers (a Cloud
/// Armor ban, hybrid, a sliding window or log, a budget): as its tier key
/// (same tag), named by its state's kind.
pub fn resource_key(kind: SlotKind, namespace: &str, resource: &str, domain: &str) -> String {
    let mut key =
        String::with_capacity(TAG_LEN + 16 + namespace.len() + resource.len() + domain.len());
    push_tag(&mut key, [namespace, resource, domain]);
    key.push(char::from(kind.letter()));
    push_part(&mut key, namespace);
    push_part(&mut key, resource);
    push_part(&mut key, domain);
    key
}

/// The resource-wide log of the last second, for the global limit.
pub fn global_key(namespace: &str, resource: &str) -> String {
    let mut key = String::with_capacity(TAG_LEN + 12 + namespace.len() + resource.len());
    push_tag(&mut key, [namespace, resource]);
    key.push(char::from(SlotKind::Log.letter()));
    push_part(&mut key, namespace);
    push_part(&mut key, resource);
    key
}

/// The keys of one copy-limited resource's copy log, all under one tag.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CopyKeys {
    /// HASH of holds: `g` (all domains), `d:<domain>`, `p:<group>`.
    pub counts: String,
    /// SET of the sidecars with a contribution to `counts`.
    pub contributors: String,
    /// ZSET of sidecars whose contribution was reaped (score: when), which
    /// may never contribute again.
    pub reaped: String,
    /// ZSET of staged transfers' secrets by expiry.
    pub transfers: String,
    /// HASH of staged transfers: secret → the staged hold (JSON).
    pub staged: String,
    /// The prefix of a sidecar's contribution (a HASH like `counts`): append
    /// the sidecar id.
    pub contribution_prefix: String,
}

/// The copy log of one copy-limited resource.
pub fn copy_keys(namespace: &str, resource: &str) -> CopyKeys {
    let key = |kind: char| {
        let mut key = String::with_capacity(TAG_LEN + 12 + namespace.len() + resource.len());
        push_tag(&mut key, ["copies", namespace, resource]);
        key.push(kind);
        push_part(&mut key, namespace);
        push_part(&mut key, resource);
        key
    };
    let mut contribution_prefix = key('s');
    contribution_prefix.push('@');
    CopyKeys {
        counts: key('c'),
        contributors: key('m'),
        reaped: key('r'),
        transfers: key('q'),
        staged: key('x'),
        contribution_prefix,
    }
}

/// The heartbeat of a sidecar serving copy operations.
pub fn heartbeat_key(server_id: &str) -> String {
    let mut key = String::with_capacity(TAG_LEN + 8 + server_id.len());
    push_tag(&mut key, ["heartbeat", server_id]);
    key.push('h');
    push_part(&mut key, server_id);
    key
}

/// How many times work guarded by copies of (namespace, resource, domain)
/// was released as done (a counter, in the slot of the resource's copy
/// log): reserves waiting for anyone's result watch it move.
pub fn copy_done_key(namespace: &str, resource: &str, domain: &str) -> String {
    let mut key =
        String::with_capacity(TAG_LEN + 16 + namespace.len() + resource.len() + domain.len());
    push_tag(&mut key, ["copies", namespace, resource]);
    key.push('x');
    push_part(&mut key, namespace);
    push_part(&mut key, resource);
    push_part(&mut key, domain);
    key
}

/// The version of the Redis state's layout (every key and value below, and
/// the scripts' readings of them): raised when a release writes state the
/// one before it cannot read, with the migration or mixed-fleet rule that
/// change ships (docs/releases.md#the-redis-state). Format 1: release
/// 0.9.0 and every build before it.
pub const STATE_FORMAT: u64 = 1;

/// Where a Redis records [`STATE_FORMAT`] of the sidecars that use it: set
/// by the first, checked by every one as it connects, so that a sidecar
/// never decides on state of a newer layout than it reads.
pub fn state_format_key() -> String {
    let mut key = String::with_capacity(TAG_LEN + 8);
    push_tag(&mut key, ["state-format"]);
    key.push_str("format");
    key
}

/// The lease that elects the one sidecar reaping dead sidecars' holds.
pub fn reaper_lease_key() -> String {
    let mut key = String::with_capacity(TAG_LEN + 8);
    push_tag(&mut key, ["reaper"]);
    key.push_str("lease");
    key
}

/// The SET of every copy-limited resource ever held, so that the reaper also
/// finds holds on resources no longer in its configuration.
pub fn copy_index_key() -> String {
    let mut key = String::with_capacity(TAG_LEN + 8);
    push_tag(&mut key, ["copy-index"]);
    key.push_str("copies");
    key
}

/// The lease state of one leased capacity of one domain (every client's
/// lease, one value), in the key space `space` names: `'l'` for a
/// configured capacity resource, another letter for each kind of lease the
/// server keeps for itself (`crate::store::leases::LeaseSpace`), so that no
/// name a user writes reaches one of those.
pub fn lease_key(space: char, namespace: &str, resource: &str, domain: &str) -> String {
    let mut key =
        String::with_capacity(TAG_LEN + 16 + namespace.len() + resource.len() + domain.len());
    if space == 'l' {
        // The tag a capacity's lease had before there were spaces.
        push_tag(&mut key, ["lease", namespace, resource, domain]);
    } else {
        let mut utf8 = [0u8; 4];
        let space_tag: &str = space.encode_utf8(&mut utf8);
        push_tag(&mut key, ["lease", space_tag, namespace, resource, domain]);
    }
    key.push(space);
    push_part(&mut key, namespace);
    push_part(&mut key, resource);
    push_part(&mut key, domain);
    key
}

/// The configuration API's keys (its version, objects and change log), in
/// one slot.
pub fn config_log_keys() -> [String; 3] {
    let key = |kind: &str| {
        let mut key = String::with_capacity(TAG_LEN + 16);
        push_tag(&mut key, ["config-log"]);
        key.push_str(kind);
        key
    };
    [
        key("config-version"),
        key("config-objects"),
        key("config-changes"),
    ]
}

/// A member of [`copy_index_key`]: (namespace, resource), length-prefixed.
pub fn copy_index_member(namespace: &str, resource: &str) -> String {
    let mut member = String::with_capacity(12 + namespace.len() + resource.len());
    push_part(&mut member, namespace);
    push_part(&mut member, resource);
    member
}

/// The (namespace, resource) of a [`copy_index_member`].
pub fn parse_copy_index_member(member: &str) -> Option<(&str, &str)> {
    let (namespace, rest) = take_part(member)?;
    let (resource, rest) = take_part(rest)?;
    rest.is_empty().then_some((namespace, resource))
}

fn take_part(text: &str) -> Option<(&str, &str)> {
    let (len, rest) = text.split_once(':')?;
    let len: usize = len.parse().ok()?;
    let part = rest.get(..len)?;
    Some((part, &rest[len..]))
}

/// The subjects (resources, shadow-mode limits) a namespace has recorded
/// use of (docs/design.md#learning-a-limit), in the one slot of everything
/// the namespace records.
pub fn learn_subjects_key(namespace: &str) -> String {
    let mut key = String::with_capacity(TAG_LEN + 8 + namespace.len());
    push_tag(&mut key, ["learn", namespace]);
    key.push_str("Ls");
    push_part(&mut key, namespace);
    key
}

/// One window's recorded use of one subject: its heaviest domains' hits.
/// The window's length is part of the key, so that windows of a length a
/// reload replaced are never read as windows of the new one.
pub fn learn_window_key(namespace: &str, subject: &str, window_ms: u64, start_ms: u64) -> String {
    let mut key = String::with_capacity(TAG_LEN + 48 + namespace.len() + subject.len());
    push_tag(&mut key, ["learn", namespace]);
    key.push_str("Lw");
    push_part(&mut key, namespace);
    push_part(&mut key, subject);
    push_number(&mut key, window_ms);
    key.push(':');
    push_number(&mut key, start_ms);
    key
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn separators_inside_parts_do_not_collide() {
        let a = descriptor_key(SlotKind::Window, "ns", [("a_b", "c")], 1000);
        let b = descriptor_key(SlotKind::Window, "ns", [("a", "b_c")], 1000);
        let c = descriptor_key(SlotKind::Window, "ns_a", [("b", "c")], 1000);
        assert_ne!(a, b);
        assert_ne!(a, c);
        assert_ne!(
            tiers_key("a", "b:c", "d", false),
            tiers_key("a", "b", "c:d", false)
        );
        assert_ne!(
            descriptor_key(SlotKind::Window, "ns", [("k", "v")], 1000),
            descriptor_key(SlotKind::Window, "ns", [("k", "v")], 60_000)
        );
    }

    #[test]
    fn keys_that_must_be_decided_together_share_a_tag() {
        let tenant = descriptor_key(SlotKind::Window, "ns", [("tenant", "a")], 1000);
        let nested = descriptor_key(
            SlotKind::Window,
            "ns",
            [("tenant", "a"), ("path", "/x")],
            60_000,
        );
        assert_eq!(tag_of(&tenant), tag_of(&nested));
        let other = descriptor_key(SlotKind::Window, "ns", [("tenant", "b")], 1000);
        assert_ne!(tag_of(&tenant), tag_of(&other));

        let global = global_key("ns", "api");
        assert_eq!(tag_of(&tiers_key("ns", "api", "a", true)), tag_of(&global));
        assert_eq!(tag_of(&tiers_key("ns", "api", "b", true)), tag_of(&global));
        assert_ne!(
            tag_of(&tiers_key("ns", "api", "a", false)),
            tag_of(&tiers_key("ns", "api", "b", false))
        );
    }

    #[test]
    fn the_tag_is_what_redis_cluster_hashes() {
        // Braces inside a part cannot move the tag: it is the first `{...}`.
        let key = tiers_key("n{s}", "r}", "{d", false);
        assert!(key.starts_with('{'));
        assert_eq!(key.find('}'), Some(TAG_LEN - 1));
        assert!(
            tag_of(&key)[1..TAG_LEN - 1]
                .chars()
                .all(|c| c.is_ascii_hexdigit())
        );
    }

    #[test]
    fn copy_keys_share_a_tag_and_index_members_round_trip() {
        let keys = copy_keys("ns", "pool");
        for key in [
            &keys.contributors,
            &keys.reaped,
            &keys.transfers,
            &keys.staged,
            &keys.contribution_prefix,
        ] {
            assert_eq!(tag_of(key), tag_of(&keys.counts));
            assert_ne!(key, &keys.counts);
        }
        assert_ne!(copy_keys("ns", "a:b").counts, copy_keys("ns:a", "b").counts);
        let member = copy_index_member("n:s", "3:x");
        assert_eq!(parse_copy_index_member(&member), Some(("n:s", "3:x")));
        assert_eq!(parse_copy_index_member("9:ab"), None);
    }
}
