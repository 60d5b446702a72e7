//! Unit tests of `cost`, beside it rather than inside it.

use super::*;

const MINUTE: u64 = 60_000;

#[test]
fn a_check_leaves_room_for_what_is_in_flight() {
    let mut state = CostState::default();
    // Before any charge: 100 predicted per request (deviation 50).
    let first = check(&state, 1_000, MINUTE, 100, CostOp::Hits(0), 0);
    assert_eq!(first.reserved, 0);
    assert!(!first.over);
    let mut admitted = 0;
    while !check(&state, 1_000, MINUTE, 100, CostOp::Hits(0), 1).over {
        admit(&mut state, MINUTE, 1);
        admitted += 1;
    }
    // n·100 + 3·50·sqrt(n) ≤ 1000: n = 6 (600 + 368), not 7 (700 + 397).
    assert_eq!(admitted, 6);
    assert_eq!(
        check(&state, 1_000, MINUTE, 100, CostOp::Hits(0), 1).reserved,
        968
    );
    // Charges retire admissions and teach the cost.
    for _ in 0..6 {
        charge(&mut state, MINUTE, 40, 2);
    }
    assert!(state.pending.is_empty());
    assert_eq!(state.used, 240);
    assert!(
        (8_000..10_000).contains(&state.duration),
        "falls slowly from 10 s: {}",
        state.duration
    );
    assert!(state.mean < 100 * SCALE && state.mean >= 40 * SCALE);
    assert!(!check(&state, 1_000, MINUTE, 100, CostOp::Hits(0), 3).over);
}

#[test]
fn charges_are_facts_past_the_limit_and_the_next_window_starts_afresh() {
    let mut state = CostState::default();
    charge(&mut state, MINUTE, 5_000, 10);
    let seen = check(&state, 1_000, MINUTE, 100, CostOp::Hits(0), 20);
    assert_eq!((seen.used, seen.over), (5_000, true));
    assert!(
        !check(&state, 1_000, MINUTE, 100, CostOp::Hits(7), 20).over,
        "a charge is never over"
    );
    // The learned cost is kept across windows: 5 000 a request now.
    let next = check(&state, 10_000, MINUTE, 100, CostOp::Hits(0), MINUTE + 1);
    assert_eq!(next.used, 0);
    assert!(!next.over);
    // Predicted above a budget of 4 000: admitted while nothing is in
    // flight (else it would never open again), and only that one.
    assert!(!check(&state, 4_000, MINUTE, 100, CostOp::Hits(0), MINUTE + 1).over);
    admit(&mut state, MINUTE, MINUTE + 1);
    assert!(check(&state, 4_000, MINUTE, 100, CostOp::Hits(0), MINUTE + 2).over);
}

#[test]
fn admissions_never_charged_expire() {
    let mut state = CostState::default();
    for now in 0..5 {
        admit(&mut state, MINUTE, now);
    }
    assert_eq!(
        check(&state, 10_000, MINUTE, 100, CostOp::Hits(0), 9_000).reserved,
        reserved(5, 1600, 1600 * 3 / 20)
    );
    // Twice 10 s without a learned duration.
    assert_eq!(
        check(&state, 10_000, MINUTE, 100, CostOp::Hits(0), 20_005).reserved,
        0
    );
    // A charge 15 s after its admission: longer than assumed, taken.
    for now in 0..5 {
        admit(&mut state, MINUTE, 100_000 + now);
    }
    charge(&mut state, MINUTE, 100, 115_000);
    assert_eq!(pending_ttl(&state), 30_000);
    assert!(state.expires_at >= 300 + LEARNED_TTL);
}
