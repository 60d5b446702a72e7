//! The apportioning arithmetic of capacity leases: each algorithm's
//! target allocation ([`apportion`]), the spare lent on top of it, and
//! whole units. Pure functions of the capacity and the wants.

use super::{Algorithm, CapacityConfig, most_of};

/// What [`CapacityConfig::whole_units`] forgives of a floating-point sum.
pub(super) const UNIT_EPSILON: f64 = 1e-9;

/// `config`'s target allocation among clients wanting `wants` (already
/// validated), in whole units if it says so.
pub(super) fn targets(config: &CapacityConfig, wants: &[f64]) -> Vec<f64> {
    let mut shares = apportion(config.algorithm, config.capacity, wants);
    if config.lends_spare && !config.algorithm.overcommits() {
        lend_spare(config.capacity, wants, &mut shares);
    }
    if config.whole_units {
        let most: Vec<f64> = wants.iter().map(|&want| most_of(config, want)).collect();
        in_whole_units(shares, &most)
    } else {
        shares
    }
}

/// Lends what `shares` leave of `capacity` to the clients that want some,
/// an equal part each (docs/design.md#global-limits, "Spare capacity lent"). An equal part,
/// not one in proportion to the wants: a small demand is the noisiest for
/// its size, and the part it is lent is what absorbs the noise.
fn lend_spare(capacity: f64, wants: &[f64], shares: &mut [f64]) {
    let spare = capacity - shares.iter().sum::<f64>();
    let wanting = wants.iter().filter(|&&want| want > 0.0).count();
    if spare <= 0.0 || wanting == 0 {
        return;
    }
    let part = spare / wanting as f64;
    for (share, &want) in shares.iter_mut().zip(wants) {
        if want > 0.0 {
            *share += part;
        }
    }
}

/// `shares` of whole `wants` rounded to whole units, keeping their sum:
/// each rounded down, then the units that leaves go one each to the
/// largest remainders (the first client on a tie). A share below its want
/// rounds up to at most that want; the sum is the shares' own, rounded
/// to a unit.
fn in_whole_units(shares: Vec<f64>, wants: &[f64]) -> Vec<f64> {
    let total = shares.iter().sum::<f64>();
    let mut whole: Vec<f64> = shares
        .iter()
        .map(|share| (share + UNIT_EPSILON).floor())
        .collect();
    let mut left = ((total + UNIT_EPSILON).floor() - whole.iter().sum::<f64>()).max(0.0);
    let mut order: Vec<usize> = (0..shares.len()).collect();
    order.sort_by(|&a, &b| (shares[b] - whole[b]).total_cmp(&(shares[a] - whole[a])));
    for index in order {
        if left < 1.0 {
            break;
        }
        let want = wants.get(index).copied().unwrap_or(0.0);
        if whole[index] + 1.0 <= want + UNIT_EPSILON && shares[index] > whole[index] {
            whole[index] += 1.0;
            left -= 1.0;
        }
    }
    whole
}

pub(super) fn apportion(algorithm: Algorithm, capacity: f64, wants: &[f64]) -> Vec<f64> {
    match algorithm {
        Algorithm::None => wants.to_vec(),
        Algorithm::Static { per_client: None } => {
            wants.iter().map(|want| want.min(capacity)).collect()
        }
        Algorithm::Static {
            per_client: Some(per_client),
        } => {
            let capped: Vec<f64> = wants.iter().map(|want| want.min(per_client)).collect();
            water_fill(capacity, &capped)
        }
        Algorithm::ProportionalShare => proportional(capacity, wants),
        Algorithm::FairShare => water_fill(capacity, wants),
    }
}

/// Max-min fairness: the smallest wants first, each getting at most an
/// equal part of what is left; what it does not take stays for the rest.
fn water_fill(capacity: f64, wants: &[f64]) -> Vec<f64> {
    let mut order: Vec<(usize, f64)> = wants.iter().copied().enumerate().collect();
    order.sort_by(|a, b| a.1.total_cmp(&b.1));
    let mut shares = vec![0.0; wants.len()];
    let mut left = capacity;
    let count = order.len();
    for (done, (index, want)) in order.into_iter().enumerate() {
        let give = want.min(left / (count - done) as f64);
        if let Some(share) = shares.get_mut(index) {
            *share = give;
        }
        left = (left - give).max(0.0);
    }
    shares
}

/// The paper's ProportionalShare: an equal share each, at most its want;
/// what that leaves is divided in proportion to each client's want beyond
/// its equal share (never past its want).
fn proportional(capacity: f64, wants: &[f64]) -> Vec<f64> {
    if wants.is_empty() {
        return Vec::new();
    }
    let equal = capacity / wants.len() as f64;
    let mut shares: Vec<f64> = wants.iter().map(|want| want.min(equal)).collect();
    let left = (capacity - shares.iter().sum::<f64>()).max(0.0);
    let excess: Vec<f64> = wants
        .iter()
        .zip(&shares)
        .map(|(want, share)| want - share)
        .collect();
    // Dividing by the largest excess first keeps the sum finite however
    // large the wants.
    let largest = excess.iter().copied().fold(0.0, f64::max);
    if left <= 0.0 || largest <= 0.0 {
        return shares;
    }
    let scaled: f64 = excess.iter().map(|e| e / largest).sum();
    for (share, more) in shares.iter_mut().zip(&excess) {
        *share += (left * (more / largest) / scaled).min(*more);
    }
    shares
}
