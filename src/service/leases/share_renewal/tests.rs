use super::*;

/// Renews `renewed` every 100 ms for `ms`, with `hits(i)` hits in the
/// i-th interval; the last demand, in requests per 1-s window.
fn renew_for(renewed: &mut Renewed, ms: u64, hits: impl Fn(u64) -> f64) -> f64 {
    let mut demand = 0.0;
    for i in 0..ms / 100 {
        demand = renewed.demand(hits(i), Some(100), 1_000, 1_000.0);
    }
    demand
}

/// Poisson-distributed hits with mean `mean`, from a fixed seed.
fn poisson_hits(mean: f64) -> impl FnMut() -> f64 {
    let mut state: u64 = 0x2545_F491_4F6C_DD1D;
    move || {
        // Knuth's method over a xorshift generator.
        let limit = (-mean).exp();
        let (mut count, mut product) = (0.0, 1.0);
        loop {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            product *= (state >> 11) as f64 / (1u64 << 53) as f64;
            if product <= limit {
                return count;
            }
            count += 1.0;
        }
    }
}

#[test]
fn a_steady_demand_moves_its_share_seldom_whatever_its_noise() {
    for per_second in [30.0, 150.0] {
        let mut renewed = Renewed::default();
        let mut hits = poisson_hits(per_second / 10.0);
        let mut asked = vec![];
        for _ in 0..600 {
            asked.push(renewed.demand(hits(), Some(100), 1_000, 1_000.0));
        }
        // After the first 10 s, 50 s of renewals change what they ask
        // for at most four times (once every 10 s or so), each time
        // within 15 % of the demand plus headroom.
        let mut distinct: Vec<f64> = asked[100..].to_vec();
        distinct.dedup();
        assert!(distinct.len() <= 5, "{per_second}/s: {distinct:?}");
        for amount in distinct {
            let ratio = amount / (per_second * HEADROOM);
            assert!((0.85..=1.15).contains(&ratio), "{per_second}/s: {amount}");
        }
    }
}

#[test]
fn a_steep_rise_counts_at_once_a_smaller_one_soon_and_noise_not() {
    let mut renewed = Renewed::default();
    // 30 a second, unevenly: 2 and 4 hits a 100 ms.
    let steady = renew_for(&mut renewed, 5_000, |i| if i % 2 == 0 { 2.0 } else { 4.0 });
    assert!((30.0..=33.0).contains(&steady), "{steady}");
    // Ten times that: at the first renewal the demand is the new rate,
    // where the rate over 2 s would say 43.
    let mut sudden = Renewed::default();
    renew_for(&mut sudden, 5_000, |i| if i % 2 == 0 { 2.0 } else { 4.0 });
    let risen = renew_for(&mut sudden, 100, |_| 30.0);
    assert!(risen >= 300.0, "{risen}");
    // At 150 a second, a blip of twice that for 100 ms is noise; twice
    // that for good counts within three renewals, over the longer span.
    let mut busy = Renewed::default();
    renew_for(&mut busy, 5_000, |_| 15.0);
    let blip = renew_for(&mut busy, 100, |_| 30.0);
    assert!(blip <= 170.0, "{blip}");
    renew_for(&mut busy, 1_000, |_| 15.0);
    let doubled = renew_for(&mut busy, 300, |_| 30.0);
    assert!(doubled > 200.0, "{doubled}");
    // A fall to a fifth counts within a few seconds (as the peak
    // decays), not as it fills the longer span.
    renew_for(&mut busy, 10_000, |_| 15.0);
    let fallen = renew_for(&mut busy, 4_000, |_| 3.0);
    assert!(fallen < 50.0, "{fallen}");
    // The first renewal of a quiet server: the whole limit.
    assert_eq!(Renewed::default().demand(0.0, None, 1_000, 300.0), 300.0);
}
