//! The memory store: time never goes back, memory is capped leniently, and
//! dropping state the engine says is over never changes a decision.

use crate::support;

use charon::clock::ManualClock;
use charon::engine::{self, Item, Outcome, Slot, SlotKind};
use charon::store::{Batch, MemoryStore};
use proptest::prelude::*;
use support::properties::arb_policy;

fn window_batch(key: &str, limit: u64) -> Batch<'static> {
    let mut batch = Batch::default();
    let slot = batch.slot(key.to_owned(), SlotKind::Window);
    batch.items.push(Item::Window {
        slot,
        limit,
        period: 60_000,
        hits: 1,
        shadow: false,
        count_rejected: false,
    });
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
            let item = |slot, global_slot| Item::Tiers {
                slot,
                global_slot,
                policy: &policy,
                global_limit: global,
                copies,
                min_copies: 1,
                check_only: false,
                shadow: false,
            };
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
