//! The memory store's compact slots (docs/performance.md#footprint-and-growth):
//! the state of a fixed window, a GCRA bucket, a sliding window counter or a
//! hybrid key in 20 bytes beside its 12-byte [`KeyId`], so that an entry of
//! the store's tables is 32 bytes.
//!
//! A state keeps its exact numbers: where one does not fit its narrow field
//! (a window longer than 49 days, counts of sliding windows past 2^32, a
//! GCRA rate above 2^32 per period, a hybrid key's expiry more than 12 days
//! ahead), [`Packed::pack`] says no and the store keeps that key's state
//! boxed instead. Nothing is rounded.

use crate::engine::hybrid::{HybridState, Mode};
use crate::engine::{GcraState, SlidingState, Slot, SlotKind, WindowState};

use super::id::KeyId;

/// One key's state in a table of compact states.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Packed {
    pub id: KeyId,
    /// A narrow field: a span of time, a count, a mode.
    x: u32,
    a: u64,
    b: u64,
}

/// The kinds of state with a compact layout, in the order of the tables.
pub(super) const COMPACT_KINDS: [SlotKind; 4] = [
    SlotKind::Window,
    SlotKind::Gcra,
    SlotKind::Sliding,
    SlotKind::Hybrid,
];

/// The table of `kind`'s compact states, if it has a compact layout.
pub(super) fn table_of(kind: SlotKind) -> Option<usize> {
    COMPACT_KINDS.iter().position(|&compact| compact == kind)
}

const HYBRID_MODE_BITS: u32 = 2;

impl Packed {
    /// An empty entry of a table.
    pub const EMPTY: Packed = Packed {
        id: KeyId::EMPTY,
        x: 0,
        a: 0,
        b: 0,
    };

    #[cfg(test)]
    pub fn with_value_for_tests(id: KeyId, value: u64) -> Packed {
        Packed {
            id,
            x: 0,
            a: value,
            b: 0,
        }
    }

    #[cfg(test)]
    pub fn value_for_tests(&self) -> u64 {
        self.a
    }

    /// `slot` as a compact state under `id`, if its numbers fit.
    pub fn pack(id: KeyId, slot: &Slot) -> Option<Packed> {
        let (x, a, b) = match slot {
            Slot::Window(WindowState {
                start,
                count,
                expires_at,
            }) => (span(*start, *expires_at)?, *start, *count),
            Slot::Gcra(GcraState { tat, count }) => (
                u32::try_from(*count).ok()?,
                *tat as u64,
                (*tat >> 64) as u64,
            ),
            Slot::Sliding(SlidingState {
                start,
                current,
                previous,
                expires_at,
            }) => {
                let current = u64::from(u32::try_from(*current).ok()?);
                let previous = u64::from(u32::try_from(*previous).ok()?);
                (span(*start, *expires_at)?, *start, current << 32 | previous)
            }
            Slot::Hybrid(HybridState {
                mode,
                time,
                bucket,
                expires_at,
            }) => {
                let mode = match mode {
                    Mode::Fresh => 0,
                    Mode::Bursty => 1,
                    Mode::Smooth => 2,
                };
                let ahead = span(*time, *expires_at)?;
                if ahead >> (32 - HYBRID_MODE_BITS) != 0 {
                    return None;
                }
                (ahead << HYBRID_MODE_BITS | mode, *time, *bucket as u64)
            }
            _ => return None,
        };
        Some(Packed { id, x, a, b })
    }

    /// The state this holds, as the engine reads it (`kind`: its table's).
    pub fn unpack(&self, kind: SlotKind) -> Slot {
        let Packed { x, a, b, .. } = *self;
        let x64 = u64::from(x);
        match kind {
            SlotKind::Gcra => Slot::Gcra(GcraState {
                tat: u128::from(b) << 64 | u128::from(a),
                count: x64,
            }),
            SlotKind::Sliding => Slot::Sliding(SlidingState {
                start: a,
                current: b >> 32,
                previous: b & u64::from(u32::MAX),
                expires_at: a + x64,
            }),
            SlotKind::Hybrid => Slot::Hybrid(HybridState {
                mode: match x & ((1 << HYBRID_MODE_BITS) - 1) {
                    1 => Mode::Bursty,
                    2 => Mode::Smooth,
                    _ => Mode::Fresh,
                },
                time: a,
                bucket: b as i64,
                expires_at: a + (x64 >> HYBRID_MODE_BITS),
            }),
            // Only the four compact kinds have tables; a window is the rest.
            _ => Slot::Window(WindowState {
                start: a,
                count: b,
                expires_at: a + x64,
            }),
        }
    }

    /// When the state stops mattering, without unpacking all of it.
    pub fn expires_at(&self, kind: SlotKind) -> u64 {
        match kind {
            SlotKind::Gcra => GcraState {
                tat: u128::from(self.b) << 64 | u128::from(self.a),
                count: u64::from(self.x),
            }
            .expires_at(),
            SlotKind::Hybrid => self.a + u64::from(self.x >> HYBRID_MODE_BITS),
            _ => self.a + u64::from(self.x),
        }
    }
}

/// `end - start`, if `end` is not before `start` and the span fits 32 bits.
fn span(start: u64, end: u64) -> Option<u32> {
    u32::try_from(end.checked_sub(start)?).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    const ID: KeyId = KeyId::from_parts([1, 2, 3]);

    fn round_trip(slot: Slot) -> Option<Slot> {
        let kind = slot.kind();
        let packed = Packed::pack(ID, &slot)?;
        assert_eq!(packed.expires_at(kind), slot.expires_at());
        Some(packed.unpack(kind))
    }

    #[test]
    fn an_entry_is_32_bytes() {
        assert_eq!(std::mem::size_of::<Packed>(), 32);
    }

    #[test]
    fn states_that_fit_come_back_exactly() {
        let day = 86_400_000;
        let now = 1_764_000_000_000;
        for slot in [
            Slot::Window(WindowState::default()),
            Slot::Window(WindowState {
                start: now,
                count: u64::MAX,
                expires_at: now + 31 * day,
            }),
            Slot::Gcra(GcraState::default()),
            Slot::Gcra(GcraState {
                tat: u128::from(now) * u128::from(u32::MAX) + 7,
                count: u64::from(u32::MAX),
            }),
            Slot::Sliding(SlidingState {
                start: now,
                current: u64::from(u32::MAX),
                previous: 3,
                expires_at: now + 2 * day,
            }),
            Slot::Hybrid(HybridState {
                mode: Mode::Smooth,
                time: now,
                bucket: -5_000_000_000,
                expires_at: now + 12 * day,
            }),
            Slot::Hybrid(HybridState {
                mode: Mode::Bursty,
                time: now,
                bucket: i64::MAX,
                expires_at: now,
            }),
            Slot::Hybrid(HybridState::default()),
        ] {
            assert_eq!(round_trip(slot.clone()), Some(slot));
        }
    }

    #[test]
    fn states_that_do_not_fit_are_refused_not_rounded() {
        let now = 1_764_000_000_000;
        let year = 365 * 86_400_000;
        for slot in [
            Slot::Window(WindowState {
                start: now,
                count: 1,
                expires_at: now + year,
            }),
            Slot::Gcra(GcraState {
                tat: 1,
                count: u64::from(u32::MAX) + 1,
            }),
            Slot::Sliding(SlidingState {
                start: now,
                current: 1,
                previous: u64::from(u32::MAX) + 1,
                expires_at: now + 1,
            }),
            Slot::Hybrid(HybridState {
                mode: Mode::Bursty,
                time: now,
                bucket: 1,
                expires_at: now + 13 * 86_400_000,
            }),
            // Never: an expiry before the start.
            Slot::Window(WindowState {
                start: now,
                count: 1,
                expires_at: now - 1,
            }),
            Slot::Tiers(Default::default()),
        ] {
            assert_eq!(round_trip(slot), None);
        }
    }
}
