//! Key identities: the memory store keeps a 96-bit keyed hash of a key's
//! kind and name instead of the name itself, so that an entry of its tables
//! is a fixed 32 bytes whatever the key's length
//! (docs/performance.md#footprint-and-growth).
//!
//! The hash is SipHash-1-3 with 128 bits of output under a key drawn at
//! random for each store, so a tenant cannot choose names that collide.
//! Two different keys share an identity with probability 2^-96: with `n`
//! keys held, a new key is taken for one of them with probability
//! n / 2^96, about 2.5·10^-23 at the default cap of 2·10^6 keys (10^15
//! new keys would meet one such confusion with probability 2.5·10^-8). The
//! collision would make two keys share one state, never lose or corrupt it.

use std::hash::{BuildHasher, Hasher};

use siphasher::sip128::{Hasher128, SipHasher13};

use crate::engine::SlotKind;

/// A key's identity in the store: 96 bits of its keyed hash.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(super) struct KeyId([u32; 3]);

impl KeyId {
    /// No key's identity: what an empty entry of a table holds. A key
    /// whose hash is all zeros is given `[0, 0, 1]` instead, which makes
    /// that one identity twice as likely as any other (still 2^-95).
    pub const EMPTY: KeyId = KeyId([0; 3]);

    #[cfg(test)]
    pub const fn from_parts(parts: [u32; 3]) -> Self {
        Self(parts)
    }

    /// The hash the tables place it by.
    pub fn table_hash(self) -> u64 {
        u64::from(self.0[0]) | u64::from(self.0[1]) << 32
    }

    /// Bits independent of [`table_hash`](Self::table_hash), for choosing
    /// a shard.
    pub fn shard_bits(self) -> u32 {
        self.0[2]
    }
}

/// Computes identities under one store's secret key.
pub(super) struct KeyHasher {
    keys: (u64, u64),
}

impl KeyHasher {
    /// A hasher with a fresh random key.
    pub fn random() -> Self {
        // The standard library's RandomState is seeded from the OS.
        let seed = std::collections::hash_map::RandomState::new();
        Self {
            keys: (seed.hash_one(0x6b30_u64), seed.hash_one(0x6b31_u64)),
        }
    }

    pub fn id(&self, kind: SlotKind, key: &str) -> KeyId {
        let mut hasher = SipHasher13::new_with_keys(self.keys.0, self.keys.1);
        hasher.write_u8(kind.letter());
        hasher.write(key.as_bytes());
        let hash = hasher.finish128().as_u128();
        match KeyId([hash as u32, (hash >> 32) as u32, (hash >> 64) as u32]) {
            KeyId::EMPTY => KeyId([0, 0, 1]),
            id => id,
        }
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashSet;

    use super::*;

    #[test]
    fn a_key_has_one_identity_per_kind_and_store() {
        let hasher = KeyHasher::random();
        let id = hasher.id(SlotKind::Window, "{abc}w5:tenant@1000");
        assert_eq!(id, hasher.id(SlotKind::Window, "{abc}w5:tenant@1000"));
        assert_ne!(id, hasher.id(SlotKind::Gcra, "{abc}w5:tenant@1000"));
        assert_ne!(id, hasher.id(SlotKind::Window, "{abc}w5:tenant@1001"));
        // Another store's secret key: another identity.
        assert_ne!(
            id,
            KeyHasher::random().id(SlotKind::Window, "{abc}w5:tenant@1000")
        );
    }

    #[test]
    fn a_million_similar_keys_have_a_million_identities() {
        // Collisions happen with probability about 10^12 / 2^97 here: one
        // would be a broken hash, not bad luck.
        let hasher = KeyHasher::random();
        let ids: HashSet<KeyId> = (0..1_000_000u32)
            .map(|n| hasher.id(SlotKind::Window, &format!("10.0.{}.{}", n >> 8, n & 255)))
            .collect();
        assert_eq!(ids.len(), 1_000_000);
        // The bits that pick a shard and the table's hash vary independently.
        let shards: HashSet<u32> = ids.iter().map(|id| id.shard_bits() >> 24).collect();
        assert_eq!(shards.len(), 256);
    }
}
