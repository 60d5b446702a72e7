//! Costs known after the response, drawn as the token-budget benchmark
//! draws them (docs/performance.md#token-budgets-under-concurrency): a
//! log-normal cost (median 500, p95 about 2 500, as LLM token counts go)
//! and a time to the response's end from 0.2 to 3 s. Seeded, so a replay in
//! virtual time draws the same every run.

/// A seeded source of costs and durations (xorshift64*).
#[derive(Debug, Clone)]
pub struct CostDraws(u64);

impl CostDraws {
    /// Draws from `seed` (any value; 0 is replaced).
    pub fn new(seed: u64) -> Self {
        Self(seed | 1)
    }

    /// Uniform in (0, 1).
    pub fn unit(&mut self) -> f64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        let bits = self.0.wrapping_mul(0x2545_F491_4F6C_DD1D) >> 11;
        (bits as f64 + 0.5) / (1u64 << 53) as f64
    }

    /// Log-normal, median 500 and p95 ≈ 2 500 (σ = ln 5 / 1.645), at least 1.
    pub fn cost(&mut self) -> u64 {
        let normal =
            (-2.0 * self.unit().ln()).sqrt() * (2.0 * std::f64::consts::PI * self.unit()).cos();
        let sigma = 5f64.ln() / 1.644_853_6;
        (500.0 * (sigma * normal).exp()).round().max(1.0) as u64
    }

    /// From the check to the charge: 200 to 3 000 ms.
    pub fn duration_ms(&mut self) -> u64 {
        200 + (self.unit() * 2_800.0) as u64
    }
}

/// The `max_tokens` a caller asks for a request that will cost `cost`:
/// the smallest power of two it fits in, at least 256 (an upper bound
/// within twice the cost, as callers pick one).
pub fn max_tokens(cost: u64) -> u64 {
    cost.max(256).next_power_of_two()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn costs_have_the_median_and_tail_they_claim() {
        let mut draws = CostDraws::new(7);
        let mut costs: Vec<u64> = (0..20_000).map(|_| draws.cost()).collect();
        costs.sort_unstable();
        let (median, p95) = (costs[10_000], costs[19_000]);
        assert!((470..=530).contains(&median), "median {median}");
        assert!((2_300..=2_700).contains(&p95), "p95 {p95}");
        assert!((0..1_000).all(|_| (200..3_000).contains(&draws.duration_ms())));
    }
}
