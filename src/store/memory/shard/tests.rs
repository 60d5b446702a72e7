//! Unit tests of `shard`, beside it rather than inside it.

use super::*;

#[test]
fn staggered_shares_span_a_factor_of_two() {
    let map = staggered(128);
    let mut share = [0usize; 128];
    for &shard in map.iter() {
        share[usize::from(shard)] += 1;
    }
    assert!(share.iter().all(|&s| s > 0));
    // Slices are whole: each share is within one slice of its ideal.
    let (first, last) = (share[0] as f64, share[127] as f64);
    assert!((1.8..=2.2).contains(&(last / first)), "{first} {last}");
    assert!(map.windows(2).all(|pair| pair[0] <= pair[1]));
}

#[test]
fn a_compact_state_taken_and_kept_is_written_back_in_place() {
    use crate::engine::WindowState;
    let window = |count, expires_at| {
        Slot::Window(WindowState {
            start: 1_000,
            count,
            expires_at,
        })
    };
    let mut shard = Shard::default();
    let ids: Vec<KeyId> = (1..=20).map(|i| KeyId::from_parts([i % 3, i, 5])).collect();
    for &id in &ids {
        assert_eq!(
            shard.keep(id, window(1, 2_000), false, 1_500, true),
            Kept::Added
        );
    }
    let first = ids[0];
    let taken = shard.take(first, SlotKind::Window);
    assert_eq!(taken, Some(window(1, 2_000)));
    assert_eq!(shard.len(), 20, "a compact entry stays while taken");
    assert_eq!(
        shard.keep(first, window(2, 2_000), true, 1_500, true),
        Kept::Same
    );
    assert_eq!(shard.get(first, SlotKind::Window), Some(window(2, 2_000)));
    assert_eq!(shard.len(), 20);
    // Kept past its expiry: dropped, and the others are still found.
    assert!(shard.take(first, SlotKind::Window).is_some());
    assert_eq!(
        shard.keep(first, window(2, 1_400), true, 1_500, true),
        Kept::Dropped
    );
    assert_eq!(shard.len(), 19);
    assert_eq!(shard.get(first, SlotKind::Window), None);
    for &id in &ids[1..] {
        assert_eq!(shard.get(id, SlotKind::Window), Some(window(1, 2_000)));
    }
    // A state that stops fitting while taken moves to the boxed table.
    let second = ids[1];
    assert!(shard.take(second, SlotKind::Window).is_some());
    let long = window(3, 1_000 + 365 * 86_400_000);
    assert_eq!(
        shard.keep(second, long.clone(), true, 1_500, true),
        Kept::Same
    );
    assert_eq!((shard.compact[0].len(), shard.boxed.len()), (18, 1));
    // And back: taken out of the boxed table, kept compact again.
    assert_eq!(shard.take(second, SlotKind::Window), Some(long));
    assert_eq!(
        shard.keep(second, window(4, 2_000), true, 1_500, true),
        Kept::Same
    );
    assert_eq!((shard.compact[0].len(), shard.boxed.len()), (19, 0));
}

#[test]
fn sweeps_follow_the_keys_a_shard_adds_not_its_decisions() {
    use crate::engine::WindowState;
    let window = |expires_at| {
        Slot::Window(WindowState {
            start: 0,
            count: 1,
            expires_at,
        })
    };
    let id = |i: u32| KeyId::from_parts([i.wrapping_mul(2_654_435_761), i, 3]);
    let mut shard = Shard::default();
    // Keys that stay: any number of decisions on them sweeps nothing.
    for i in 0..100 {
        assert_eq!(
            shard.keep(id(i), window(1_000), false, 10, true),
            Kept::Added
        );
    }
    for _ in 0..100_000 {
        assert!(!shard.count_decision(true));
    }
    // Keys that come: a sweep is due once the shard has added
    // `SWEEP_AFTER_ADDED` of them (it held fewer than 4 times that).
    let mut added = 100;
    while !shard.count_decision(true) {
        shard.keep(id(added), window(500), false, 10, true);
        added += 1;
    }
    assert_eq!(added, SWEEP_AFTER_ADDED as u32);
    // Those past their expiry go; the sweep restarts the count.
    assert_eq!(shard.sweep(600), SWEEP_AFTER_ADDED - 100);
    assert_eq!(shard.len(), 100);
    assert!(!shard.count_decision(true));
    // A shard that held 8 192 after its sweep waits for 2 048 more.
    for i in 0..8_092 {
        shard.keep(id(10_000 + i), window(1_000), false, 10, true);
    }
    shard.sweep(600);
    assert_eq!(shard.len(), 8_192);
    for i in 0..2_047 {
        shard.keep(id(20_000 + i), window(1_000), false, 10, true);
        assert!(!shard.count_decision(true));
    }
    shard.keep(id(30_000), window(1_000), false, 10, true);
    assert!(shard.count_decision(true));
    shard.sweep(600);
    // A full store: swept every `SWEEP_WHEN_FULL_EVERY` decisions, so
    // that keys past their expiry make room.
    let due = (1..=2 * SWEEP_WHEN_FULL_EVERY)
        .find(|_| shard.count_decision(false))
        .expect("a full store's shard is swept");
    assert_eq!(due, SWEEP_WHEN_FULL_EVERY);
}

#[test]
fn a_state_that_stops_fitting_moves_to_the_boxed_table_and_back_out() {
    use crate::engine::WindowState;
    let id = KeyId::from_parts([7, 8, 9]);
    let mut shard = Shard::default();
    let window = |count| {
        Slot::Window(WindowState {
            start: 1_000,
            count,
            expires_at: 2_000,
        })
    };
    assert_eq!(shard.keep(id, window(1), false, 1_500, true), Kept::Added);
    assert_eq!(shard.compact[0].len(), 1);
    // A year-long window does not fit 32 bits of span: boxed, same key.
    let (_, kept) = shard.decide(id, SlotKind::Window, 1_500, true, |slot| {
        *slot = Slot::Window(WindowState {
            start: 1_000,
            count: 2,
            expires_at: 1_000 + 365 * 86_400_000,
        });
    });
    assert_eq!(kept, Kept::Same);
    assert_eq!((shard.compact[0].len(), shard.boxed.len()), (0, 1));
    assert_eq!(
        shard.get(id, SlotKind::Window).map(|s| s.expires_at()),
        Some(1_000 + 365 * 86_400_000)
    );
    assert_eq!(
        shard.take(id, SlotKind::Window).map(|s| s.expires_at()),
        Some(1_000 + 365 * 86_400_000)
    );
    assert_eq!(shard.len(), 0);
    assert_eq!(shard.keep(id, window(3), false, 1_500, true), Kept::Added);
    assert_eq!(shard.sweep(2_000), 1);
    // Full: a new key's state is not kept.
    assert_eq!(
        shard.keep(id, window(3), false, 1_500, false),
        Kept::Unrecorded
    );
    assert_eq!(shard.len(), 0);
}

#[test]
fn logs_that_grew_past_the_flat_form_leave_no_room_behind() {
    use crate::store::memory::flat::MAX_INSTANTS;
    let mut shard = Shard::default();
    let kind = SlotKind::TimeLog;
    let keys = 4_096u32;
    let record = |shard: &mut Shard, key: u32, now: u64| {
        shard.decide(KeyId::from_parts([key, 0, 0]), kind, now, true, |slot| {
            if let Slot::TimeLog(state) = slot {
                crate::engine::sliding_log::record(state, 1_000, 60_000, 1, now);
            }
        })
    };
    for now in 0..MAX_INSTANTS as u64 {
        for key in 0..keys {
            record(&mut shard, key, now);
        }
    }
    let flat_room = shard.flat.capacity();
    assert!(flat_room >= keys as usize, "{flat_room}");
    // One instant more: every log moves to the boxed table.
    for key in 0..keys {
        record(&mut shard, key, MAX_INSTANTS as u64);
    }
    assert_eq!((shard.flat.len(), shard.boxed.len()), (0, keys as usize));
    assert!(
        shard.flat.capacity() < SHRINK_FROM,
        "{}",
        shard.flat.capacity()
    );
    // And the boxed table's room follows them back when they expire.
    assert_eq!(shard.sweep(60_000 + MAX_INSTANTS as u64 + 1), keys as usize);
    assert!(
        shard.boxed.capacity() < SHRINK_FROM,
        "{}",
        shard.boxed.capacity()
    );
}

#[test]
fn a_log_is_flat_while_short_boxed_while_long_and_flat_again() {
    use crate::engine::{HitLog, LogState};
    use crate::store::memory::flat::MAX_INSTANTS;
    let id = KeyId::from_parts([4, 5, 6]);
    let mut shard = Shard::default();
    let kind = SlotKind::TimeLog;
    let record = |shard: &mut Shard, now: u64| {
        shard.decide(id, kind, now, true, |slot| {
            if let Slot::TimeLog(state) = slot {
                crate::engine::sliding_log::record(state, 1_000, 100, 1, now);
            }
        })
    };
    assert_eq!(record(&mut shard, 1_000).1, Kept::Added);
    assert_eq!((shard.flat.len(), shard.boxed.len()), (1, 0));
    for now in 1_001..1_000 + MAX_INSTANTS as u64 {
        assert_eq!(record(&mut shard, now).1, Kept::Same);
    }
    assert_eq!((shard.flat.len(), shard.boxed.len()), (1, 0));
    // One instant more than a flat state holds: boxed, nothing lost.
    let last = 1_000 + MAX_INSTANTS as u64;
    assert_eq!(record(&mut shard, last).1, Kept::Same);
    assert_eq!((shard.flat.len(), shard.boxed.len()), (0, 1));
    let expected = HitLog::from_entries((1_000..=last).map(|t| (t, 1)));
    assert_eq!(
        shard.get(id, kind),
        Some(Slot::TimeLog(LogState {
            log: expected.clone(),
            expires_at: last + 101,
        }))
    );
    // Taken and kept (a request of several keys) stays boxed.
    let taken = shard.take(id, kind);
    assert_eq!(shard.len(), 0);
    assert_eq!(
        shard.keep(id, taken.clone().expect("held"), true, last, true),
        Kept::Same
    );
    assert_eq!((shard.flat.len(), shard.boxed.len()), (0, 1));
    assert_eq!(shard.get(id, kind), taken);
    // Once the oldest hits leave the window, flat again.
    assert_eq!(record(&mut shard, 1_110).1, Kept::Same);
    assert_eq!((shard.flat.len(), shard.boxed.len()), (1, 0));
    let Some(Slot::TimeLog(state)) = shard.get(id, kind) else {
        panic!("the log is held");
    };
    assert_eq!(state.log.entries().next(), Some((1_010, 1)));
    // And swept once its last hit has left.
    assert_eq!(shard.sweep(1_110 + 100), 0);
    assert_eq!(shard.sweep(1_110 + 101), 1);
    assert_eq!(shard.len(), 0);
}

#[test]
fn a_flat_state_taken_and_kept_is_written_back_in_place() {
    use crate::engine::{HitLog, LogState};
    let kind = SlotKind::TimeLog;
    let log = |hits: &[(u64, u64)], expires_at| {
        Slot::TimeLog(LogState {
            log: HitLog::from_entries(hits.iter().copied()),
            expires_at,
        })
    };
    let (id, other) = (KeyId::from_parts([1, 1, 1]), KeyId::from_parts([2, 2, 2]));
    let mut shard = Shard::default();
    assert_eq!(
        shard.keep(id, log(&[(10, 1)], 111), false, 10, true),
        Kept::Added
    );
    assert_eq!(
        shard.keep(other, log(&[(10, 2)], 111), false, 10, true),
        Kept::Added
    );
    // Taken, the entry stays; kept, it holds the new state.
    assert_eq!(shard.take(id, kind), Some(log(&[(10, 1)], 111)));
    assert_eq!(shard.len(), 2);
    let longer = log(&[(10, 1), (20, 3)], 121);
    assert_eq!(shard.keep(id, longer.clone(), true, 20, true), Kept::Same);
    assert_eq!(shard.get(id, kind), Some(longer));
    // The room the scratch slot kept does not leak into another key.
    assert_eq!(shard.take(other, kind), Some(log(&[(10, 2)], 111)));
    assert_eq!(
        shard.keep(other, log(&[], 0), true, 20, true),
        Kept::Dropped
    );
    assert_eq!(shard.len(), 1);
    assert_eq!(shard.get(other, kind), None);
    assert_eq!(shard.get(id, kind), Some(log(&[(10, 1), (20, 3)], 121)));
}
