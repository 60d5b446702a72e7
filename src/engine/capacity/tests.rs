//! Unit tests of `capacity`, beside it rather than inside it.

use super::*;

fn config(capacity: f64, algorithm: Algorithm) -> CapacityConfig {
    CapacityConfig {
        capacity,
        algorithm,
        lease_ms: 10_000,
        refresh_interval_ms: 2_500,
        safe_capacity: None,
        learning_ms: 0,
        whole_units: false,
        lends_spare: false,
    }
}

fn grant(
    config: &CapacityConfig,
    state: &mut LeaseState,
    client: &str,
    wants: f64,
    now: u64,
) -> f64 {
    request(config, state, client, wants, 0.0, now).map_or(-1.0, |lease| lease.capacity)
}

#[test]
fn fair_share_fills_water_levels() {
    let fair = |capacity, wants: &[f64]| shares(Algorithm::FairShare, capacity, wants);
    assert_eq!(fair(100.0, &[10.0, 50.0, 80.0]), Ok(vec![10.0, 45.0, 45.0]));
    assert_eq!(fair(100.0, &[80.0, 10.0, 50.0]), Ok(vec![45.0, 10.0, 45.0]));
    assert_eq!(fair(100.0, &[10.0, 20.0, 30.0]), Ok(vec![10.0, 20.0, 30.0]));
    assert_eq!(fair(90.0, &[0.0, 100.0, 100.0]), Ok(vec![0.0, 45.0, 45.0]));
    assert_eq!(fair(100.0, &[]), Ok(vec![]));
}

/// The Charon paper's tables (§5.1): the numbers are the test.
#[test]
fn the_papers_tables() {
    let close = |got: Result<Vec<f64>, CapacityError>, want: &[f64]| {
        let got = got.unwrap_or_default();
        assert_eq!(got.len(), want.len(), "{got:?}");
        for (g, w) in got.iter().zip(want) {
            assert!((g - w).abs() < 0.05, "{got:?} != {want:?}");
        }
    };
    // ProportionalShare, capacity 90: 30 each, C leaves 20, divided
    // 70:20 between A and B.
    close(
        shares(Algorithm::ProportionalShare, 90.0, &[100.0, 50.0, 10.0]),
        &[45.6, 34.4, 10.0],
    );
    // FairShare, capacity 160: 40 each, then 10, 10, 5, then 5 for A.
    close(
        shares(Algorithm::FairShare, 160.0, &[100.0, 50.0, 45.0, 10.0]),
        &[55.0, 50.0, 45.0, 10.0],
    );
}

#[test]
fn proportional_share_divides_what_is_left_by_the_excess() {
    let prop = |capacity, wants: &[f64]| shares(Algorithm::ProportionalShare, capacity, wants);
    // Everyone wants at least an equal share: equal shares.
    let third = 100.0 / 3.0;
    assert_eq!(
        prop(100.0, &[50.0, 50.0, 100.0]),
        Ok(vec![third, third, third])
    );
    // Room for everyone: what each wants.
    assert_eq!(prop(100.0, &[10.0, 50.0, 40.0]), Ok(vec![10.0, 50.0, 40.0]));
    assert_eq!(prop(0.0, &[10.0, 30.0]), Ok(vec![0.0, 0.0]));
    assert_eq!(prop(10.0, &[f64::MAX, f64::MAX]), Ok(vec![5.0, 5.0]));
    assert_eq!(prop(10.0, &[]), Ok(vec![]));
}

#[test]
fn static_is_a_per_client_maximum() {
    // The paper's: the capacity is each client's maximum.
    let paper = Algorithm::Static { per_client: None };
    assert_eq!(
        shares(paper, 30.0, &[10.0, 50.0, 40.0]),
        Ok(vec![10.0, 30.0, 30.0])
    );
    let config = config(30.0, paper);
    let mut state = LeaseState::new(0);
    assert_eq!(grant(&config, &mut state, "a", 50.0, 0), 30.0);
    assert_eq!(grant(&config, &mut state, "b", 50.0, 1), 30.0);
    // Charon's: each at most `per_client`, all together the capacity.
    let capped = Algorithm::Static {
        per_client: Some(30.0),
    };
    assert_eq!(shares(capped, 100.0, &[10.0, 50.0]), Ok(vec![10.0, 30.0]));
    // Capped wants [30, 30, 10] do not fit 50: water-filled.
    assert_eq!(
        shares(capped, 50.0, &[40.0, 40.0, 10.0]),
        Ok(vec![20.0, 20.0, 10.0])
    );
}

#[test]
fn none_gives_each_client_what_it_wants() {
    assert_eq!(
        shares(Algorithm::None, 100.0, &[60.0, 60.0, 5.0]),
        Ok(vec![60.0, 60.0, 5.0])
    );
    let config = config(100.0, Algorithm::None);
    let mut state = LeaseState::new(0);
    assert_eq!(grant(&config, &mut state, "a", 60.0, 0), 60.0);
    // Over the capacity: "may overcommit".
    assert_eq!(grant(&config, &mut state, "b", 60.0, 1), 60.0);
    assert_eq!(live_sum(&state, 2), 120.0);
}

#[test]
fn bad_amounts_are_refused_and_change_nothing() {
    assert!(matches!(
        shares(Algorithm::FairShare, 1.0, &[f64::NAN]),
        Err(CapacityError::NotFinite { field: "wants", .. })
    ));
    assert_eq!(
        shares(Algorithm::FairShare, f64::INFINITY, &[]),
        Err(CapacityError::NotFinite {
            field: "capacity",
            value: f64::INFINITY
        })
    );
    assert_eq!(
        shares(
            Algorithm::Static {
                per_client: Some(-1.0)
            },
            1.0,
            &[]
        ),
        Err(CapacityError::Negative {
            field: "per_client",
            value: -1.0
        })
    );
    let good = config(100.0, Algorithm::FairShare);
    let mut state = LeaseState::new(0);
    let refused = request(&good, &mut state, "a", 1.0, f64::NEG_INFINITY, 0);
    assert!(matches!(
        refused,
        Err(CapacityError::NotFinite { field: "has", .. })
    ));
    assert!(state.clients.is_empty());
    let zero = CapacityConfig {
        lease_ms: 0,
        ..good
    };
    assert_eq!(
        request(&zero, &mut state, "a", 1.0, 0.0, 0),
        Err(CapacityError::ZeroLease)
    );
    let late = CapacityConfig {
        refresh_interval_ms: 20_000,
        ..good
    };
    assert!(matches!(
        late.validate(),
        Err(CapacityError::RefreshInterval { .. })
    ));
}

#[test]
fn a_lease_renews_sooner_while_it_moves() {
    let config = config(100.0, Algorithm::FairShare);
    let fast = config.refresh_interval_ms / FASTER;
    let mut state = LeaseState::new(0);
    let interval = |state: &mut LeaseState, client: &str, wants: f64, now: u64| {
        request(&config, state, client, wants, 0.0, now).map(|lease| lease.refresh_interval_ms)
    };
    // New, and granted all it wants: moving (its grant went from 0).
    assert_eq!(interval(&mut state, "a", 80.0, 0), Ok(fast));
    // The same again: settled.
    assert_eq!(interval(&mut state, "a", 80.0, 1), Ok(2_500));
    // b's share is 50 but a holds 80: b waits, moving; a must give back.
    assert_eq!(interval(&mut state, "b", 80.0, 2), Ok(fast));
    assert_eq!(interval(&mut state, "a", 80.0, 3), Ok(fast));
    // b gets its 50 now (moved), then both settle.
    assert_eq!(interval(&mut state, "b", 80.0, 4), Ok(fast));
    assert_eq!(interval(&mut state, "a", 80.0, 5), Ok(2_500));
    assert_eq!(interval(&mut state, "b", 80.0, 6), Ok(2_500));
    // A change within 2 % of the capacity or 10 % of itself is noise,
    // a larger one not.
    assert_eq!(interval(&mut state, "a", 81.5, 7), Ok(2_500));
    assert_eq!(interval(&mut state, "a", 88.0, 8), Ok(2_500));
    assert_eq!(interval(&mut state, "a", 30.0, 9), Ok(fast));
}

#[test]
fn the_clients_to_nudge_hold_past_their_share_or_wait_for_a_free_one() {
    let config = config(90.0, Algorithm::FairShare);
    let mut state = LeaseState::new(0);
    let grant = |state: &mut LeaseState, client: &str, wants: f64, now: u64| {
        request(&config, state, client, wants, 0.0, now).map(|lease| lease.capacity)
    };
    assert_eq!(grant(&mut state, "a", 60.0, 0), Ok(60.0));
    assert_eq!(grant(&mut state, "b", 30.0, 1), Ok(30.0));
    assert!(to_nudge(&config, &state, "", 2).is_empty());
    // c wants 30: each share is 30 now, a holds 60 and must give back.
    assert_eq!(grant(&mut state, "c", 30.0, 2), Ok(0.0));
    assert_eq!(to_nudge(&config, &state, "c", 3), vec!["a"]);
    // Its requester is not nudged (it has its answer), nor a client
    // within a moving bound of its share, nor an expired one.
    assert!(to_nudge(&config, &state, "a", 3).is_empty());
    assert_eq!(grant(&mut state, "a", 60.0, 4), Ok(30.0));
    // a gave back: c waits for 30 that are free now.
    assert_eq!(to_nudge(&config, &state, "a", 5), vec!["c"]);
    assert_eq!(grant(&mut state, "c", 30.0, 5), Ok(30.0));
    assert_eq!(grant(&mut state, "b", 31.0, 5), Ok(30.0));
    assert!(to_nudge(&config, &state, "c", 6).is_empty());
    assert!(to_nudge(&config, &state, "", config.lease_ms + 10).is_empty());
    // Nobody waits under an algorithm that overcommits.
    let none = CapacityConfig {
        algorithm: Algorithm::None,
        ..config
    };
    let mut state = LeaseState::new(0);
    request(&none, &mut state, "a", 80.0, 0.0, 0).ok();
    request(&none, &mut state, "b", 80.0, 0.0, 1).ok();
    assert!(to_nudge(&none, &state, "", 2).is_empty());
}

#[test]
fn whole_units_leave_nothing_to_rounding() {
    // A global limit of 300 a second among three servers that want
    // 157.5, 157.5 and 34.6: rounded down by each server, 132.43 and
    // 34.6 would admit 132 + 132 + 34 = 298.
    let config = CapacityConfig {
        whole_units: true,
        lends_spare: false,
        ..config(300.0, Algorithm::FairShare)
    };
    let mut state = LeaseState::new(0);
    let mut grant = |client: &str, wants: f64, now: u64| {
        request(&config, &mut state, client, wants, 0.0, now).map(|lease| lease.capacity)
    };
    assert_eq!(grant("a", 157.5, 0), Ok(158.0));
    assert_eq!(grant("b", 157.5, 1), Ok(142.0));
    assert_eq!(grant("c", 34.6, 2), Ok(0.0));
    // Shares 132.5, 132.5 and 35: the unit left over goes to the first.
    assert_eq!(grant("a", 157.5, 3), Ok(133.0));
    assert_eq!(grant("b", 157.5, 4), Ok(132.0));
    assert_eq!(grant("c", 34.6, 5), Ok(35.0));
    assert_eq!(live_sum(&state, 6), 300.0);
}

#[test]
fn a_level_renews_its_clients_as_often_as_its_parent_while_its_grant_moves() {
    let config = config(100.0, Algorithm::FairShare);
    let grant = |refresh_interval_ms| Grant {
        capacity: 40.0,
        expiry_ms: 10_000,
        refresh_interval_ms,
        moving: true,
        safe_capacity: 50.0,
    };
    let under = |grant| under_grant(&config, Some(grant), 0).refresh_interval_ms;
    assert_eq!(under(grant(500)), 500);
    assert_eq!(under(grant(5_000)), 2_500);
    // A parent that renews the level often when nothing moves does not
    // make the level renew its clients as often.
    let settled = Grant {
        moving: false,
        ..grant(500)
    };
    assert_eq!(under(settled), 2_500);
    // Never after the grant ends.
    let ending = Grant {
        expiry_ms: 300,
        ..grant(5_000)
    };
    assert_eq!(under(ending), 300);
}

fn lending(capacity: f64) -> CapacityConfig {
    CapacityConfig {
        lends_spare: true,
        whole_units: true,
        ..config(capacity, Algorithm::FairShare)
    }
}

#[test]
fn spare_capacity_is_lent_to_the_clients_that_want_some() {
    let config = lending(100.0);
    let mut state = LeaseState::new(0);
    // Alone and wanting a fifth: the whole limit, lent.
    let a = request(&config, &mut state, "a", 21.0, 0.0, 0).map(|lease| lease.capacity);
    assert_eq!(a, Ok(100.0));
    // A client that wants nothing is lent nothing.
    let idle = request(&config, &mut state, "idle", 0.0, 0.0, 1).map(|lease| lease.capacity);
    assert_eq!(idle, Ok(0.0));
    // A second that wants some: its share is free only once a gives back
    // what it was lent; a is over its new target and is nudged.
    let b = request(&config, &mut state, "b", 3.0, 0.0, 2).map(|lease| lease.capacity);
    assert_eq!(b, Ok(0.0));
    assert_eq!(to_nudge(&config, &state, "b", 3), vec!["a"]);
    // The spare (100 - 21 - 3) goes in equal parts: 21 + 38, 3 + 38.
    let a = request(&config, &mut state, "a", 21.0, 100.0, 4).map(|lease| lease.capacity);
    let b = request(&config, &mut state, "b", 3.0, 0.0, 5).map(|lease| lease.capacity);
    assert_eq!((a, b), (Ok(59.0), Ok(41.0)));
    assert_eq!(live_sum(&state, 6), 100.0);
    // b's demand grows past its lent share: a gives back first, and once
    // both renewed their shares are their fair shares and nothing is lent.
    request(&config, &mut state, "b", 80.0, 41.0, 7).ok();
    request(&config, &mut state, "a", 40.0, 59.0, 8).ok();
    let b = request(&config, &mut state, "b", 80.0, 41.0, 9).map(|lease| lease.capacity);
    let a = request(&config, &mut state, "a", 40.0, 40.0, 10).map(|lease| lease.capacity);
    assert_eq!((a, b), (Ok(40.0), Ok(60.0)));
    assert!(live_sum(&state, 11) <= 100.0);
}

#[test]
fn the_safe_capacity_is_the_split_among_the_clients_that_want_some() {
    let config = config(90.0, Algorithm::FairShare);
    let mut state = LeaseState::new(0);
    request(&config, &mut state, "root", 0.0, 0.0, 0).ok();
    request(&config, &mut state, "a", 10.0, 0.0, 1).ok();
    let b = request(&config, &mut state, "b", 5.0, 0.0, 2).map(|lease| lease.safe_capacity);
    assert_eq!(b, Ok(45.0));
    let root = request(&config, &mut state, "root", 0.0, 0.0, 3).map(|lease| lease.safe_capacity);
    assert_eq!(root, Ok(30.0));
}
