//! The memory store's flat states (docs/performance.md#flat-logs-and-tiers):
//! a sliding log's or a tier resource's state as a few bytes of its own,
//! instead of the engine's structures (a boxed [`Slot`] as large as its
//! largest kind, a `Vec` of tiers, a `VecDeque` per log).
//!
//! Every number is a LEB128 varint, and every instant is written against
//! another: the state's expiry (written first, so that a sweep reads it
//! without decoding the rest) is the base of each log's first instant,
//! and each later instant follows the one before it. A log's instant is
//! then one to three bytes, its count one: a sliding log of one hit is
//! about a dozen bytes, a tier resource after one request about thirty.
//! Differences wrap, so any state comes back exactly, however odd its
//! numbers: decoding what [`encode`] wrote gives the same state.
//!
//! The store decodes a state into the engine's structures for each
//! decision on it and encodes what the decision leaves, which costs a
//! decision time in proportion to the instants logged. So only states of
//! at most [`MAX_INSTANTS`] instants (and [`MAX_BYTES`]) are held flat,
//! the many small keys of a flood; a larger one is boxed, where a
//! decision on it stays independent of its length.

use crate::engine::tiers::TierLog;
use crate::engine::{GcraState, HitLog, Slot, SlotKind};

/// The most instants (over all of a state's logs) a flat state holds.
pub(super) const MAX_INSTANTS: usize = 16;

/// Whether `kind`'s states are held flat.
pub(super) fn is_flat(kind: SlotKind) -> bool {
    matches!(kind, SlotKind::TimeLog | SlotKind::Tiers)
}

/// `slot`'s bytes, if its kind is held flat, it logs at most
/// [`MAX_INSTANTS`] instants and its bytes are at most [`MAX_BYTES`].
pub(super) fn encode(slot: &Slot) -> Option<Box<[u8]>> {
    write(slot).map(|bytes| Box::from(&bytes[..]))
}

/// [`encode`] on the stack: a decision whose state comes out as it went
/// in need not allocate.
pub(super) fn write(slot: &Slot) -> Option<Bytes> {
    let instants = match slot {
        Slot::TimeLog(state) => state.log.len(),
        Slot::Tiers(state) => {
            state.recent.len()
                + state
                    .tiers
                    .iter()
                    .map(|tier| tier.hits.len())
                    .sum::<usize>()
        }
        _ => return None,
    };
    if instants > MAX_INSTANTS {
        return None;
    }
    let mut out = Bytes::default();
    match slot {
        Slot::TimeLog(state) => {
            put_u64(&mut out, state.expires_at);
            put_log(&mut out, &state.log, state.expires_at);
        }
        Slot::Tiers(state) => {
            let base = state.expires_at;
            put_u64(&mut out, base);
            put(&mut out, state.bucket.tat);
            put_u64(&mut out, state.bucket.count);
            put_u64(&mut out, state.tiers.len() as u64);
            for tier in &state.tiers {
                // 0: never entered; else one more than the instant's offset.
                put(
                    &mut out,
                    tier.entered_at
                        .map_or(0, |at| u128::from(offset(at, base)) + 1),
                );
                put_log(&mut out, &tier.hits, base);
            }
            put_log(&mut out, &state.recent, base);
        }
        _ => return None,
    }
    // A state too large to write (many tiers) is not flat either.
    (out.length <= MAX_BYTES).then_some(out)
}

/// The most bytes a flat state takes.
pub(super) const MAX_BYTES: usize = 256;

/// A state's bytes as they are written, on the stack.
pub(super) struct Bytes {
    bytes: [u8; MAX_BYTES],
    /// Past `MAX_BYTES` once the state did not fit.
    length: usize,
}

impl Default for Bytes {
    fn default() -> Self {
        Bytes {
            bytes: [0; MAX_BYTES],
            length: 0,
        }
    }
}

impl std::ops::Deref for Bytes {
    type Target = [u8];

    fn deref(&self) -> &[u8] {
        &self.bytes[..self.length.min(MAX_BYTES)]
    }
}

impl Bytes {
    fn push(&mut self, byte: u8) {
        if let Some(slot) = self.bytes.get_mut(self.length) {
            *slot = byte;
        }
        self.length += 1;
    }
}

/// The state `bytes` hold, as the engine reads it (`kind`: the kind they
/// were encoded from). `None` only for bytes [`encode`] did not write.
pub(super) fn decode(bytes: &[u8], kind: SlotKind) -> Option<Slot> {
    let mut slot = Slot::new(kind);
    decode_into(bytes, &mut slot).then_some(slot)
}

/// Makes `slot` hold what `bytes` hold, in the room its logs already have.
/// `false` (and `slot` holding anything) for bytes [`encode`] did not
/// write or a slot of another kind than theirs.
pub(super) fn decode_into(bytes: &[u8], slot: &mut Slot) -> bool {
    read_into(&mut Reader { bytes }, slot).is_some()
}

fn read_into(reader: &mut Reader<'_>, slot: &mut Slot) -> Option<()> {
    let base = reader.u64()?;
    match slot {
        Slot::TimeLog(state) => {
            state.expires_at = base;
            reader.log_into(base, &mut state.log)?;
        }
        Slot::Tiers(state) => {
            state.expires_at = base;
            state.bucket = GcraState {
                tat: reader.u128()?,
                count: reader.u64()?,
            };
            let count = usize::try_from(reader.u64()?).ok()?;
            // Each tier takes at least two bytes: a corrupt count cannot
            // make this grow past what the bytes could hold.
            if count > reader.bytes.len() / 2 {
                return None;
            }
            state.tiers.resize_with(count, TierLog::default);
            for tier in &mut state.tiers {
                tier.entered_at = match reader.u128()? {
                    0 => None,
                    n => Some(from_offset(base, u64::try_from(n - 1).ok()?)),
                };
                reader.log_into(base, &mut tier.hits)?;
            }
            reader.log_into(base, &mut state.recent)?;
        }
        _ => return None,
    }
    reader.bytes.is_empty().then_some(())
}

/// A slot per flat kind that decisions decode into, so that the room its
/// logs grew stays for the next decision and decoding does not allocate.
pub(super) struct Scratch {
    log: Slot,
    tiers: Slot,
}

impl Default for Scratch {
    fn default() -> Self {
        Scratch {
            log: Slot::new(SlotKind::TimeLog),
            tiers: Slot::new(SlotKind::Tiers),
        }
    }
}

impl Scratch {
    fn slot(&mut self, kind: SlotKind) -> &mut Slot {
        match kind {
            SlotKind::Tiers => &mut self.tiers,
            _ => &mut self.log,
        }
    }

    /// The slot for `kind` (a flat kind), holding what `bytes` hold, or a
    /// fresh state if they hold none that matters at `now`.
    pub fn read(&mut self, kind: SlotKind, bytes: &[u8], now: u64) -> &mut Slot {
        let slot = self.slot(kind);
        // An expired state is not decoded: the decision starts afresh.
        if expires_at(bytes) <= now || slot.kind() != kind || !decode_into(bytes, slot) {
            *slot = Slot::new(kind);
        }
        slot
    }

    /// [`read`](Self::read) as an owned slot (a decision on several keys
    /// holds them all at once), with the room of the kept one; the room
    /// comes back with [`give_back`](Self::give_back).
    pub fn take(&mut self, kind: SlotKind, bytes: &[u8]) -> Slot {
        let mut slot = std::mem::replace(self.slot(kind), Slot::new(kind));
        if slot.kind() != kind || !decode_into(bytes, &mut slot) {
            slot = Slot::new(kind);
        }
        slot
    }

    /// Keeps `slot`'s room for the next decision on its kind.
    pub fn give_back(&mut self, slot: Slot) {
        let kind = slot.kind();
        if is_flat(kind) {
            *self.slot(kind) = slot;
        }
    }
}

/// When the state `bytes` hold stops mattering, without decoding the rest.
pub(super) fn expires_at(bytes: &[u8]) -> u64 {
    // What `encode` wrote always starts with the expiry; anything else is
    // taken as expired, so that a sweep drops it.
    Reader { bytes }.u64().unwrap_or(0)
}

/// `at` against `base`, zigzagged so that an instant on either side of
/// the base is small.
fn offset(at: u64, base: u64) -> u64 {
    let delta = at.wrapping_sub(base) as i64;
    ((delta << 1) ^ (delta >> 63)) as u64
}

fn from_offset(base: u64, offset: u64) -> u64 {
    let delta = (offset >> 1) as i64 ^ -((offset & 1) as i64);
    base.wrapping_add(delta as u64)
}

fn put_log(out: &mut Bytes, log: &HitLog, base: u64) {
    put_u64(out, log.len() as u64);
    let mut previous = None;
    for (at, hits) in log.entries() {
        let step = match previous {
            None => offset(at, base),
            // Instants only grow in a log: the step is what they grew by.
            Some(before) => at.wrapping_sub(before),
        };
        put_u64(out, step);
        put_u64(out, hits);
        previous = Some(at);
    }
}

/// `value` as an LEB128 varint: seven bits a byte, the high bit set on
/// every byte but the last.
fn put(out: &mut Bytes, value: u128) {
    match u64::try_from(value) {
        Ok(value) => put_u64(out, value),
        Err(_) => {
            let mut value = value;
            while value >= 0x80 {
                out.push(value as u8 | 0x80);
                value >>= 7;
            }
            out.push(value as u8);
        }
    }
}

/// [`put`] in the common width's arithmetic.
fn put_u64(out: &mut Bytes, mut value: u64) {
    while value >= 0x80 {
        out.push(value as u8 | 0x80);
        value >>= 7;
    }
    out.push(value as u8);
}

struct Reader<'a> {
    bytes: &'a [u8],
}

impl Reader<'_> {
    fn u128(&mut self) -> Option<u128> {
        let mut value = 0u128;
        for (index, &byte) in self.bytes.iter().enumerate() {
            let shift = 7 * index as u32;
            if shift >= 128 {
                return None;
            }
            value |= u128::from(byte & 0x7f) << shift;
            if byte & 0x80 == 0 {
                self.bytes = &self.bytes[index + 1..];
                return Some(value);
            }
        }
        None
    }

    fn u64(&mut self) -> Option<u64> {
        let mut value = 0u64;
        for (index, &byte) in self.bytes.iter().enumerate() {
            let shift = 7 * index as u32;
            let bits = u64::from(byte & 0x7f);
            // The tenth byte holds the 64th bit only.
            if shift >= 64 || (shift == 63 && bits > 1) {
                return None;
            }
            value |= bits << shift;
            if byte & 0x80 == 0 {
                self.bytes = &self.bytes[index + 1..];
                return Some(value);
            }
        }
        None
    }

    /// Refills `log` with the entries that follow.
    fn log_into(&mut self, base: u64, log: &mut HitLog) -> Option<()> {
        let count = usize::try_from(self.u64()?).ok()?;
        // Each entry takes at least two bytes.
        if count > self.bytes.len() / 2 {
            return None;
        }
        log.clear();
        let mut previous = None;
        for _ in 0..count {
            let step = self.u64()?;
            let at = match previous {
                None => from_offset(base, step),
                Some(before) => u64::wrapping_add(before, step),
            };
            log.push_entry(at, self.u64()?);
            previous = Some(at);
        }
        Some(())
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;
    use crate::engine::{LogState, TierState};

    fn log(entries: &[(u64, u64)]) -> HitLog {
        HitLog::from_entries(entries.iter().copied())
    }

    fn round_trip(slot: &Slot) -> Option<Slot> {
        let bytes = encode(slot)?;
        assert_eq!(expires_at(&bytes), slot.expires_at());
        decode(&bytes, slot.kind())
    }

    #[test]
    fn a_sliding_log_of_one_hit_is_a_dozen_bytes() {
        let now = 1_764_000_000_000;
        let slot = Slot::TimeLog(LogState {
            log: log(&[(now, 1)]),
            expires_at: now + 60_001,
        });
        let bytes = encode(&slot).expect("a sliding log is flat");
        assert!(bytes.len() <= 12, "{} bytes", bytes.len());
        assert_eq!(decode(&bytes, SlotKind::TimeLog), Some(slot));
    }

    #[test]
    fn a_tier_resource_after_one_request_is_about_thirty_bytes() {
        let now = 1_764_000_000_000;
        let mut tiers = vec![TierLog::default(); 3];
        tiers[0] = TierLog {
            entered_at: Some(now),
            hits: log(&[(now, 1)]),
        };
        let slot = Slot::Tiers(TierState {
            tiers,
            recent: log(&[(now, 1)]),
            expires_at: now + 3_600_000,
            bucket: GcraState::default(),
        });
        let bytes = encode(&slot).expect("tiers are flat");
        assert!(bytes.len() <= 32, "{} bytes", bytes.len());
        assert_eq!(decode(&bytes, SlotKind::Tiers), Some(slot));
    }

    #[test]
    fn a_state_of_more_instants_is_not_flat() {
        let entries: Vec<(u64, u64)> = (0..=MAX_INSTANTS as u64).map(|t| (t, 1)).collect();
        let long = Slot::TimeLog(LogState {
            log: log(&entries),
            expires_at: 1_000,
        });
        assert_eq!(encode(&long), None);
        let just = Slot::TimeLog(LogState {
            log: log(&entries[1..]),
            expires_at: 1_000,
        });
        assert_eq!(round_trip(&just), Some(just));
        let mut tiers = TierState {
            tiers: vec![TierLog::default(); 2],
            ..TierState::default()
        };
        tiers.tiers[1].hits = log(&entries[..MAX_INSTANTS / 2]);
        tiers.recent = log(&entries[MAX_INSTANTS / 2..]);
        assert_eq!(encode(&Slot::Tiers(tiers)), None);
        // Nor one of more bytes: here a resource of many tiers.
        let many = |count: usize| {
            Slot::Tiers(TierState {
                tiers: vec![
                    TierLog {
                        entered_at: Some(u64::MAX / 3),
                        hits: HitLog::default(),
                    };
                    count
                ],
                ..TierState::default()
            })
        };
        assert!(encode(&many(20)).is_some_and(|bytes| bytes.len() <= MAX_BYTES));
        assert_eq!(encode(&many(30)), None);
    }

    #[test]
    fn other_kinds_are_not_flat_and_garbage_is_no_state() {
        assert_eq!(encode(&Slot::new(SlotKind::Window)), None);
        assert_eq!(encode(&Slot::new(SlotKind::Log)), None);
        assert!(!is_flat(SlotKind::Cost));
        let bytes = encode(&Slot::new(SlotKind::TimeLog)).expect("flat");
        assert_eq!(decode(&bytes, SlotKind::Cost), None);
        for garbage in [&[][..], &[0x80], &[0, 5, 1], &[0xff; 40], &[1, 0, 9]] {
            assert_eq!(decode(garbage, SlotKind::TimeLog), None, "{garbage:?}");
            assert_eq!(decode(garbage, SlotKind::Tiers), None, "{garbage:?}");
        }
        assert_eq!(expires_at(&[]), 0);
    }

    fn any_log() -> impl Strategy<Value = HitLog> {
        prop::collection::vec((any::<u64>(), any::<u64>()), 0..4).prop_map(HitLog::from_entries)
    }

    proptest! {
        #[test]
        fn every_flat_state_comes_back_exactly(
            expires_at in 1..=u64::MAX,
            tat in any::<u128>(),
            count in any::<u64>(),
            tiers in prop::collection::vec((any::<Option<u64>>(), any_log()), 0..3),
            recent in any_log(),
            one in any_log(),
        ) {
            let sliding = Slot::TimeLog(LogState { log: one, expires_at });
            prop_assert_eq!(round_trip(&sliding), Some(sliding.clone()));
            let tiers = Slot::Tiers(TierState {
                tiers: tiers
                    .into_iter()
                    .map(|(entered_at, hits)| TierLog { entered_at, hits })
                    .collect(),
                recent,
                expires_at,
                bucket: GcraState { tat, count },
            });
            prop_assert_eq!(round_trip(&tiers), Some(tiers.clone()));
            // Decoded into a scratch slot that held another state: only
            // what the bytes hold.
            let mut scratch = Scratch::default();
            let bytes = encode(&tiers).expect("flat");
            let fresh = Slot::new(SlotKind::Tiers);
            prop_assert_eq!(&*scratch.read(SlotKind::Tiers, &bytes, 0), &tiers);
            prop_assert_eq!(&*scratch.read(SlotKind::Tiers, &encode(&fresh).expect("flat"), 0), &fresh);
            prop_assert_eq!(&*scratch.read(SlotKind::Tiers, &bytes, 0), &tiers);
            let sliding_bytes = encode(&sliding).expect("flat");
            prop_assert_eq!(&*scratch.read(SlotKind::TimeLog, &sliding_bytes, 0), &sliding);
        }

        #[test]
        fn any_bytes_decode_to_a_state_or_to_none_without_panicking(
            bytes in prop::collection::vec(any::<u8>(), 0..64),
        ) {
            let _ = decode(&bytes, SlotKind::TimeLog);
            let _ = decode(&bytes, SlotKind::Tiers);
            let _ = expires_at(&bytes);
            let mut scratch = Scratch::default();
            let _ = scratch.read(SlotKind::Tiers, &bytes, 0);
            let _ = scratch.read(SlotKind::TimeLog, &bytes, 0);
        }
    }
}
