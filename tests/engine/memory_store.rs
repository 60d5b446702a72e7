//! The memory store: time never goes back, memory is capped leniently, and
//! dropping state the engine says is over never changes a decision.

use crate::support;

use charon::clock::ManualClock;
use charon::engine::{self, Item, Outcome, Slot, SlotKind, TiersItem, WindowItem};
use charon::store::{Batch, MemoryStore};
use proptest::prelude::*;
use support::properties::arb_policy;

fn window_batch(key: &str, limit: u64) -> Batch<'static> {
    let mut batch = Batch::default();
    let slot = batch.slot(key.to_owned(), SlotKind::Window);
    batch.items.push(Item::Window(WindowItem {
        slot,
        limit,
        period: 60_000,
        hits: 1,
        shadow: false,
        count_rejected: false,
    }));
    batch
}

#[test]
fn a_late_request_cannot_move_a_window_back() {
    let store = MemoryStore::with_clock(ManualClock::new(0));
    let next_window = 120_000;
    // Fill the limit in the new window ...
    assert!(store.decide_at(window_batch("k", 2), next_window).granted);
    assert!(store.decide_at(window_batch("k", 2), next_window).granted);
    // ... then a request stamped earlier (it read the clock before the other
    // took the lock, or the system clock stepped back) must not reopen the
    // previous window and reset the counter.
    assert!(
        !store
            .decide_at(window_batch("k", 2), next_window - 1)
            .granted
    );
    assert!(
        !store
            .decide_at(window_batch("k", 2), next_window + 1)
            .granted
    );
}

#[test]
fn at_the_key_cap_new_keys_are_decided_but_not_remembered() {
    let store = MemoryStore::with_clock(ManualClock::new(0)).with_max_keys(10);
    for tenant in 0..20 {
        assert!(
            store
                .decide_at(window_batch(&format!("t{tenant}"), 1), 1_000)
                .granted
        );
    }
    assert_eq!(store.len(), 10);
    let stats = store.stats();
    assert_eq!((stats.keys, stats.unrecorded), (10, 10));
    // Known keys are still limited.
    assert!(!store.decide_at(window_batch("t0", 1), 1_001).granted);
    // Once state expires, sweeping makes room again.
    store.clock().set(60_000);
    assert_eq!(store.sweep(), 10);
    assert_eq!(store.stats().keys, 0);
    assert!(store.decide_at(window_batch("t15", 1), 60_001).granted);
    assert_eq!(store.stats().keys, 1);
}

#[test]
fn keys_that_come_and_go_are_swept_as_new_ones_come_without_a_timer() {
    // 40 000 keys of one-minute windows, then 40 000 others after the
    // first have expired: no timer runs here, yet the store ends holding
    // about the second lot, since a shard adding keys sweeps its dead.
    let store = MemoryStore::with_clock(ManualClock::new(0));
    for tenant in 0..40_000 {
        store.decide_at(window_batch(&format!("old{tenant}"), 5), 1_000);
    }
    assert_eq!(store.stats().keys, 40_000);
    for tenant in 0..40_000 {
        store.decide_at(window_batch(&format!("new{tenant}"), 5), 130_000);
    }
    let keys = store.stats().keys;
    assert!((40_000..44_000).contains(&keys), "{keys} keys held");
    assert_eq!(store.len(), keys);
}

#[test]
fn a_full_store_makes_room_from_expired_keys_without_a_timer() {
    let store = MemoryStore::with_clock(ManualClock::new(0)).with_max_keys(1_000);
    for tenant in 0..1_000 {
        store.decide_at(window_batch(&format!("t{tenant}"), 5), 1_000);
    }
    // All expired, but nothing has swept them: a new key is not kept until
    // its shard, full, has decided a few thousand times and is swept.
    let swept_after = (1..=10_000).find(|_| {
        store.decide_at(window_batch("newcomer", 5), 130_000);
        store.stats().keys < 1_000
    });
    let attempts = swept_after.expect("the newcomer's shard was swept");
    assert!((3_000..=4_096).contains(&attempts), "after {attempts}");
    assert_eq!(store.stats().unrecorded, attempts as u64);
    let keys = store.stats().keys;
    store.decide_at(window_batch("newcomer", 5), 130_000);
    assert_eq!(store.stats().keys, keys + 1, "now the newcomer is kept");
}

fn window_item(slot: usize, limit: u64, period: u64) -> Item<'static> {
    Item::Window(WindowItem {
        slot,
        limit,
        period,
        hits: 1,
        shadow: false,
        count_rejected: false,
    })
}

#[test]
fn long_windows_and_large_counts_are_kept_exactly() {
    // A year-long window does not fit the compact layout (its length is
    // kept in 32 bits of ms): the store keeps it whole, not rounded.
    let year = 365 * 86_400_000;
    let store = MemoryStore::with_clock(ManualClock::new(0));
    let decide = |at| {
        let mut batch = Batch::default();
        let slot = batch.slot("yearly".into(), SlotKind::Window);
        batch.items.push(window_item(slot, 3, year));
        store.decide_at(batch, at).granted
    };
    assert!(decide(1_000));
    assert!(decide(year / 2));
    assert!(decide(year - 1));
    assert!(!decide(year - 1));
    assert!(decide(year));
    let (slots, _) = store.peek(&[charon::store::SlotKey {
        key: "yearly".into(),
        kind: SlotKind::Window,
    }]);
    assert_eq!(slots[0].expires_at(), 2 * year);
}

#[test]
fn a_batch_of_compact_and_boxed_kinds_is_decided_as_one() {
    let store = MemoryStore::with_clock(ManualClock::new(0));
    let year = 365 * 86_400_000;
    let decide = |at| {
        let mut batch = Batch::default();
        let minute = batch.slot("minute".into(), SlotKind::Window);
        let yearly = batch.slot("yearly".into(), SlotKind::Window);
        batch.items.push(window_item(minute, 2, 60_000));
        batch.items.push(window_item(yearly, 3, year));
        store.decide_at(batch, at).granted
    };
    assert!(decide(1));
    assert!(decide(2));
    // The minute is full: all or nothing, the yearly window counts nothing.
    assert!(!decide(3));
    assert!(decide(60_000));
    // The yearly window holds 3 now; the minute has room, the batch does not.
    assert!(!decide(120_000));
    // The minute's state from the window before is over and the rejected
    // batch recorded nothing in it: dropped. The yearly window stays.
    assert_eq!(store.len(), 1);
}

#[test]
fn a_key_of_another_kind_starts_fresh() {
    let store = MemoryStore::with_clock(ManualClock::new(0));
    assert!(store.decide_at(window_batch("k", 1), 1_000).granted);
    assert!(!store.decide_at(window_batch("k", 1), 1_001).granted);
    // The same name read as a GCRA bucket: nothing of the window's.
    let (slots, _) = store.peek(&[charon::store::SlotKey {
        key: "k".into(),
        kind: SlotKind::Gcra,
    }]);
    assert_eq!(slots[0], Slot::new(SlotKind::Gcra));
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(300))]

    /// The memory store, sweeping after every step, decides exactly as the
    /// engine does on state that is never dropped.
    #[test]
    fn dropping_expired_state_never_changes_a_decision(
        (policy, global) in arb_policy(1..4, 1..12, 1..16),
        ops in prop::collection::vec((prop_oneof![Just(0u64), 1u64..200, 200u64..4000, 4000u64..20000], 0usize..3, 1u64..5), 1..80),
    ) {
        let clock = ManualClock::new(1_000_000);
        let store = MemoryStore::with_clock(clock.clone());
        let mut kept: Vec<Slot> = (0..3).map(|_| Slot::new(SlotKind::Tiers)).collect();
        kept.push(Slot::new(SlotKind::Log));
        let mut now = 1_000_000;
        for (advance, domain, copies) in ops {
            now += advance;
            clock.set(now);
            let item = |slot, global_slot| Item::Tiers(TiersItem {
                slot,
                global_slot,
                policy: &policy,
                global_limit: global,
                copies,
                min_copies: 1,
                check_only: false,
                shadow: false,
            });
            let expected = engine::decide(&[item(domain, Some(3))], &mut kept, now);
            let mut batch = Batch::default();
            let slot = batch.slot(format!("d{domain}"), SlotKind::Tiers);
            let global_slot = batch.slot("global".into(), SlotKind::Log);
            batch.items.push(item(slot, Some(global_slot)));
            let got = store.decide_at(batch, now);
            store.sweep();
            let (Outcome::Tiers(e), Outcome::Tiers(g)) = (expected.outcomes[0], got.outcomes[0]) else {
                unreachable!()
            };
            prop_assert_eq!(g.granted, e.granted, "at {}", now);
            prop_assert_eq!(g.over, e.over);
            prop_assert_eq!(g.retry_after, e.retry_after);
            prop_assert_eq!(g.snapshot.remaining, e.snapshot.remaining);
        }
    }
}
