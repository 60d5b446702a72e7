//! Where recorded use lives (docs/design.md#learning-a-limit): for each
//! namespace with `settings.learn`, per subject and per window, the hits
//! of its heaviest domains, within a fixed bound. In the process for one
//! sidecar, or in Redis so that every sidecar on it adds to one record and
//! any of them can propose a limit from the whole fleet's use.
//!
//! The bound: at most [`Learn::SUBJECTS`] subjects per namespace, each
//! with `windows` windows of at most `domains` domains. Within a window the
//! domains are kept by Space-Saving (Metwally, Agrawal and El Abbadi,
//! 2005): a domain not in a full table replaces the lightest one and
//! inherits its count. So every domain with more than 1/`domains` of a
//! window's hits is kept, a kept domain's count is over its true count by
//! at most the lightest count it replaced, and memory stays flat however
//! many domains there are.

use std::collections::{BTreeSet, HashMap};

use crate::config::Learn;
use crate::config::learned::Recorded;

#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum LearnError {
    #[error("the learning record is unavailable: {0}")]
    Unavailable(String),
}

/// A store of recorded use. Recording never waits and never fails a
/// decision: it is a record for a person, not an answer to a caller.
#[async_trait::async_trait]
pub trait LearnLog: Send + Sync {
    /// Adds `hits` of `domain` on `subject` to the window the store's
    /// time falls in.
    fn record(&self, namespace: &str, subject: &str, domain: &str, hits: u64, learn: &Learn);

    /// Every subject's recorded windows in `namespace`, and the store's
    /// time (what the recorded period ends at).
    async fn recorded(
        &self,
        namespace: &str,
        learn: &Learn,
    ) -> Result<(Vec<Recorded>, u64), LearnError>;
}

/// The record of `subject` among a namespace's `subjects`, made if there is
/// room: past [`Learn::SUBJECTS`] a new subject is not recorded. Both
/// stores keep their subjects so, and look up without allocating a name.
pub(crate) fn subject_record<'m, V: Default>(
    subjects: &'m mut HashMap<String, V>,
    subject: &str,
) -> Option<&'m mut V> {
    if !subjects.contains_key(subject) {
        if subjects.len() >= Learn::SUBJECTS {
            return None;
        }
        subjects.insert(subject.to_owned(), V::default());
    }
    subjects.get_mut(subject)
}

/// The heaviest domains of one window, at most `capacity` of them
/// (Space-Saving).
#[derive(Debug, Clone, Default)]
pub struct TopDomains {
    counts: HashMap<String, u64>,
    /// The same counts, lightest first, to find the one to replace.
    order: BTreeSet<(u64, String)>,
}

impl TopDomains {
    pub fn add(&mut self, domain: &str, hits: u64, capacity: usize) {
        if let Some(count) = self.counts.get_mut(domain) {
            self.order.remove(&(*count, domain.to_owned()));
            *count = count.saturating_add(hits);
            self.order.insert((*count, domain.to_owned()));
            return;
        }
        let mut count = hits;
        if self.counts.len() >= capacity.max(1)
            && let Some((lightest, replaced)) = self.order.pop_first()
        {
            self.counts.remove(&replaced);
            count = count.saturating_add(lightest);
        }
        self.counts.insert(domain.to_owned(), count);
        self.order.insert((count, domain.to_owned()));
    }

    pub fn len(&self) -> usize {
        self.counts.len()
    }

    pub fn is_empty(&self) -> bool {
        self.counts.is_empty()
    }

    /// Every kept domain and its count.
    pub fn drain(self) -> impl Iterator<Item = (String, u64)> {
        self.counts.into_iter()
    }

    pub fn iter(&self) -> impl Iterator<Item = (&str, u64)> {
        self.counts
            .iter()
            .map(|(domain, count)| (domain.as_str(), *count))
    }
}

#[cfg(test)]
mod tests {
    use super::TopDomains;

    #[test]
    fn a_full_table_keeps_the_heaviest_and_stays_full() {
        let mut top = TopDomains::default();
        // Two heavy domains among 10 000 that come once each.
        for round in 0..10_000u64 {
            top.add("heavy", 3, 10);
            top.add("second", 2, 10);
            top.add(&format!("once-{round}"), 1, 10);
        }
        assert_eq!(top.len(), 10);
        let counts: std::collections::HashMap<&str, u64> = top.iter().collect();
        // Never replaced (always heavier than the lightest): exact.
        assert_eq!(counts["heavy"], 30_000);
        assert_eq!(counts["second"], 20_000);
    }

    #[test]
    fn a_domain_already_kept_only_grows() {
        let mut top = TopDomains::default();
        top.add("a", 5, 2);
        top.add("b", 1, 2);
        top.add("c", 1, 2);
        // `c` replaced `b` and inherited its count.
        let counts: std::collections::HashMap<&str, u64> = top.iter().collect();
        assert_eq!(counts, [("a", 5), ("c", 2)].into_iter().collect());
    }
}
