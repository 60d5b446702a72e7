//! Copy limits (docs/design.md#copy-limits): a counting semaphore per
//! resource, with a limit per domain, a global limit, and group pools
//! (bulkheads) in which one copy counts once in every group the domain is in.
//!
//! Pure: the counts before a reserve in, the number granted out. Both stores
//! call [`grantable`] (the Redis script ports it, and the sidecar checks the
//! script's answer against it), so every store decides alike.

use crate::config::CopyResource;

/// The limits one domain's reserve must respect, from the configuration.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CopyLimits {
    /// `None`: no per-domain limit (an unconfigured resource).
    pub domain_limit: Option<u64>,
    pub global_limit: Option<u64>,
    /// The groups the domain is in, in configuration order: (name, limit).
    pub groups: Vec<(String, u64)>,
}

impl CopyLimits {
    /// The limits of `domain` on `resource`: its own domain limit if it has
    /// one, else the default; every group that lists it.
    pub fn for_domain(resource: &CopyResource, domain: &str) -> Self {
        Self {
            domain_limit: Some(
                resource
                    .domains
                    .get(domain)
                    .copied()
                    .unwrap_or(resource.domain_limit),
            ),
            global_limit: resource.global_limit,
            groups: resource
                .groups
                .iter()
                .filter(|group| group.domains.contains(domain))
                .map(|group| (group.name.clone(), group.limit))
                .collect(),
        }
    }

    /// No limit at all (`allow_unconfigured`, `ignore_configured`): every
    /// reserve is granted in full, and still counted.
    pub fn unlimited(groups: Vec<(String, u64)>) -> Self {
        Self {
            domain_limit: None,
            global_limit: None,
            groups: groups
                .into_iter()
                .map(|(name, _)| (name, u64::MAX))
                .collect(),
        }
    }

    pub fn group_names(&self) -> impl Iterator<Item = &str> {
        self.groups.iter().map(|(name, _)| name.as_str())
    }
}

/// Holds before (or after) an operation, in the order of [`CopyLimits`].
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CopyCounts {
    pub domain: u64,
    pub global: u64,
    /// One per group of the limits, in the same order.
    pub groups: Vec<u64>,
}

/// The largest `k` in `[min_copies, copies]` that fits every limit, or 0 when
/// even `min_copies` does not fit (then nothing may change).
pub fn grantable(limits: &CopyLimits, counts: &CopyCounts, copies: u64, min_copies: u64) -> u64 {
    let mut room = copies;
    if let Some(limit) = limits.domain_limit {
        room = room.min(limit.saturating_sub(counts.domain));
    }
    if let Some(limit) = limits.global_limit {
        room = room.min(limit.saturating_sub(counts.global));
    }
    for (index, (_, limit)) in limits.groups.iter().enumerate() {
        let held = counts.groups.get(index).copied().unwrap_or(0);
        room = room.min(limit.saturating_sub(held));
    }
    if room < min_copies.max(1) { 0 } else { room }
}

/// A hold's groups in canonical order (sorted), as hold sets key them: a
/// release may name the groups in any order.
pub fn canonical_groups<'g>(groups: impl IntoIterator<Item = &'g str>) -> Vec<String> {
    let mut groups: Vec<String> = groups.into_iter().map(str::to_owned).collect();
    groups.sort_unstable();
    groups
}

#[cfg(test)]
mod tests {
    use super::*;

    fn limits(domain: u64, global: Option<u64>, groups: &[u64]) -> CopyLimits {
        CopyLimits {
            domain_limit: Some(domain),
            global_limit: global,
            groups: groups
                .iter()
                .enumerate()
                .map(|(i, limit)| (format!("g{i}"), *limit))
                .collect(),
        }
    }

    #[test]
    fn grants_the_most_that_fits_every_pool() {
        let limits = limits(4, Some(10), &[6, 3]);
        let counts = CopyCounts {
            domain: 1,
            global: 5,
            groups: vec![2, 1],
        };
        // domain room 3, global 5, groups 4 and 2: at most 2.
        assert_eq!(grantable(&limits, &counts, 5, 1), 2);
        assert_eq!(grantable(&limits, &counts, 5, 2), 2);
        assert_eq!(grantable(&limits, &counts, 5, 3), 0);
        assert_eq!(grantable(&limits, &counts, 1, 1), 1);
    }

    #[test]
    fn counts_above_a_lowered_limit_grant_nothing() {
        let counts = CopyCounts {
            domain: 7,
            global: 7,
            groups: vec![],
        };
        assert_eq!(grantable(&limits(4, None, &[]), &counts, 1, 1), 0);
        let unlimited = CopyLimits::unlimited(vec![]);
        assert_eq!(grantable(&unlimited, &counts, 1_000, 1_000), 1_000);
    }
}
