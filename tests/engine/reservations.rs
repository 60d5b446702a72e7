//! Reservations on a budget of a cost known after the response, on the
//! engine: concurrent clients reserve an estimate and commit the actual
//! cost, some cancel, some never come back; the budget is exceeded by no
//! more than the estimate errors of the reservations in flight when it
//! filled, refunds stay in their window, and reservations expire.

use charon::engine::{self, CostItem, CostOp, CostState, Item, Slot, SlotKind};
use proptest::prelude::*;

const LIMIT: u64 = 10_000;
const PERIOD: u64 = 60_000;

fn item(op: CostOp) -> Item<'static> {
    Item::Cost(CostItem {
        slot: 0,
        limit: LIMIT,
        period: PERIOD,
        op,
        shadow: false,
        initial_cost: 100,
    })
}

fn state(slots: &[Slot]) -> &CostState {
    match &slots[0] {
        Slot::Cost(state) => state,
        other => panic!("a cost slot, not {other:?}"),
    }
}

/// What one client does with its reservation when its request ends.
#[derive(Debug, Clone, Copy)]
enum End {
    /// Commits the estimate plus this (clamped at 0).
    Commit(i64),
    Cancel,
    /// Never comes back: the reservation expires.
    Vanish,
}

fn arb_end() -> impl Strategy<Value = End> {
    prop_oneof![
        8 => (-400i64..400).prop_map(End::Commit),
        1 => Just(End::Cancel),
        1 => Just(End::Vanish),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]

    /// `used` never exceeds the limit by more than the sum of the `clients`
    /// largest positive errors committed in the window: once the budget is
    /// full nothing more is admitted, so only the reservations already in
    /// flight can push past it.
    #[test]
    fn reserve_commit_overshoots_by_the_errors_in_flight_at_most(
        clients in 1usize..8,
        estimates in prop::collection::vec(50u64..800, 200),
        ends in prop::collection::vec(arb_end(), 200),
        durations in prop::collection::vec(1u64..4_000, 200),
        charge_on_expiry in any::<bool>(),
    ) {
        let mut slots = vec![Slot::new(SlotKind::Cost)];
        // Per client: (reservation id, estimate, when it ends) or idle.
        let mut running: Vec<Option<(u64, u64, u64)>> = vec![None; clients];
        let mut next = 0usize;
        let mut errors_in_window: Vec<u64> = Vec::new();
        let mut window = 0u64;
        let mut now = 1_700_000_000_000u64;
        for _ in 0..2_000 {
            now += 7;
            if now / PERIOD != window {
                window = now / PERIOD;
                errors_in_window.clear();
            }
            for slot in running.iter_mut() {
                match *slot {
                    None => {
                        let i = next % estimates.len();
                        let id = next as u64 + 1;
                        let reserve = item(CostOp::Reserve {
                            id,
                            amount: estimates[i],
                            ttl: 10_000,
                            charge_on_expiry,
                        });
                        if engine::decide(&[reserve], &mut slots, now).granted {
                            *slot = Some((id, estimates[i], now + durations[i]));
                            next += 1;
                        }
                    }
                    Some((id, estimate, ends_at)) if ends_at <= now => {
                        let end = ends[(id as usize - 1) % ends.len()];
                        let op = match end {
                            End::Commit(error) => {
                                let actual = (estimate as i64 + error).max(0) as u64;
                                errors_in_window.push(actual.saturating_sub(estimate));
                                CostOp::Commit { id, actual }
                            }
                            End::Cancel => CostOp::Cancel { id },
                            End::Vanish => {
                                *slot = None;
                                continue;
                            }
                        };
                        let settled = engine::decide(&[item(op)], &mut slots, now);
                        prop_assert!(settled.granted, "a held reservation settles: {op:?}");
                        *slot = None;
                    }
                    Some(_) => {}
                }
            }
            let mut largest = errors_in_window.clone();
            largest.sort_unstable_by(|a, b| b.cmp(a));
            let slack: u64 = largest.iter().take(clients).sum();
            let checked = engine::cost::check(state(&slots), LIMIT, PERIOD, 100, CostOp::Hits(0), now);
            prop_assert!(
                checked.used <= LIMIT + slack,
                "used {} over {} + {} (errors of {} clients)",
                checked.used, LIMIT, slack, clients
            );
        }
    }

    /// A refund gives back at most what the window charged, never below
    /// zero, and only in the window it names.
    #[test]
    fn refunds_stay_in_their_window_and_above_zero(
        charged in 0u64..5_000,
        refund in 0u64..8_000,
        later in 0u64..(2 * PERIOD),
    ) {
        let mut slots = vec![Slot::new(SlotKind::Cost)];
        let start = 1_700_000_040_000u64;
        engine::decide(&[item(CostOp::Hits(charged))], &mut slots, start);
        let now = start + later;
        let window = start - start % PERIOD;
        let before = state(&slots).clone();
        let answer = engine::decide(
            &[item(CostOp::Refund { amount: refund, charged_at: start })],
            &mut slots,
            now,
        );
        let used = engine::cost::check(state(&slots), LIMIT, PERIOD, 100, CostOp::Hits(0), now).used;
        if now - now % PERIOD == window {
            prop_assert!(answer.granted);
            prop_assert_eq!(used, charged.saturating_sub(refund));
        } else {
            prop_assert!(!answer.granted, "the window is over");
            prop_assert_eq!(state(&slots), &before, "a refund refused changes nothing");
            prop_assert_eq!(used, 0);
        }
    }
}

#[test]
fn an_expired_reservation_is_charged_at_its_estimate_or_released() {
    for charge_on_expiry in [true, false] {
        let mut slots = vec![Slot::new(SlotKind::Cost)];
        let now = 1_700_000_040_000u64;
        let reserve = item(CostOp::Reserve {
            id: 7,
            amount: 600,
            ttl: 2_000,
            charge_on_expiry,
        });
        assert!(engine::decide(&[reserve], &mut slots, now).granted);
        let held = engine::cost::check(
            state(&slots),
            LIMIT,
            PERIOD,
            100,
            CostOp::Hits(0),
            now + 1_999,
        );
        assert_eq!((held.used, held.held), (0, 600));
        let after = engine::cost::check(
            state(&slots),
            LIMIT,
            PERIOD,
            100,
            CostOp::Hits(0),
            now + 2_000,
        );
        assert_eq!(after.held, 0, "expired at its ttl, to the millisecond");
        assert_eq!(after.used, if charge_on_expiry { 600 } else { 0 });
        // Its commit comes too late: refused, nothing changes.
        let late = engine::decide(
            &[item(CostOp::Commit { id: 7, actual: 10 })],
            &mut slots,
            now + 2_000,
        );
        assert!(!late.granted);
        let seen = engine::cost::check(
            state(&slots),
            LIMIT,
            PERIOD,
            100,
            CostOp::Hits(0),
            now + 2_001,
        );
        assert_eq!(seen.used, if charge_on_expiry { 600 } else { 0 });
    }
}

#[test]
fn a_reservation_is_settled_once() {
    let mut slots = vec![Slot::new(SlotKind::Cost)];
    let now = 1_700_000_040_000u64;
    let reserve = |id, amount| {
        item(CostOp::Reserve {
            id,
            amount,
            ttl: 10_000,
            charge_on_expiry: true,
        })
    };
    assert!(engine::decide(&[reserve(1, 9_000)], &mut slots, now).granted);
    assert!(
        !engine::decide(&[reserve(2, 1_001)], &mut slots, now).granted,
        "does not fit"
    );
    assert!(
        !engine::decide(&[reserve(1, 10)], &mut slots, now).granted,
        "the id is taken"
    );
    assert!(
        engine::decide(
            &[item(CostOp::Commit {
                id: 1,
                actual: 9_500
            })],
            &mut slots,
            now + 1
        )
        .granted
    );
    for op in [
        CostOp::Commit { id: 1, actual: 1 },
        CostOp::Cancel { id: 1 },
    ] {
        let again = engine::decide(&[item(op)], &mut slots, now + 2);
        assert!(!again.granted, "{op:?} of a settled reservation");
        assert!(again.outcomes[0].over());
    }
    let seen = engine::cost::check(state(&slots), LIMIT, PERIOD, 100, CostOp::Hits(0), now + 3);
    assert_eq!((seen.used, seen.held), (9_500, 0));
}
