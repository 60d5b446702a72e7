//! Recorded use in this process (docs/design.md#learning-a-limit): one
//! sidecar's, or an embedded engine's. Windows are by this store's clock;
//! a window older than the recorded period is dropped when its subject is
//! next recorded, so a subject nobody uses any more keeps at most one
//! period of windows.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};

use crate::clock::{Clock, SystemClock};
use crate::config::Learn;
use crate::config::learned::{Recorded, WindowUse};
use crate::store::learn::{LearnError, LearnLog, TopDomains, subject_record};

/// One subject's windows, by their start, all of one length: when
/// `settings.learn` changes the length (a reload), the old windows go.
#[derive(Default)]
struct Windows {
    window_ms: u64,
    by_start: BTreeMap<u64, TopDomains>,
}

pub struct MemoryLearn {
    clock: Arc<dyn Clock>,
    /// Namespace, then subject.
    record: Mutex<HashMap<String, HashMap<String, Windows>>>,
}

impl MemoryLearn {
    pub fn new() -> Self {
        Self::with_clock(Arc::new(SystemClock))
    }

    pub fn with_clock(clock: Arc<dyn Clock>) -> Self {
        Self {
            clock,
            record: Mutex::new(HashMap::new()),
        }
    }
}

impl Default for MemoryLearn {
    fn default() -> Self {
        Self::new()
    }
}

#[async_trait::async_trait]
impl LearnLog for MemoryLearn {
    fn record(&self, namespace: &str, subject: &str, domain: &str, hits: u64, learn: &Learn) {
        if hits == 0 {
            // A check: no use to record, and a domain kept for nothing.
            return;
        }
        let now = self.clock.now_ms();
        let start = learn.window_start(now);
        let mut record = self.record.lock().unwrap_or_else(|e| e.into_inner());
        let subjects = match record.get_mut(namespace) {
            Some(subjects) => subjects,
            None => record.entry(namespace.to_owned()).or_default(),
        };
        let Some(windows) = subject_record(subjects, subject) else {
            return;
        };
        if windows.window_ms != learn.window_ms {
            *windows = Windows {
                window_ms: learn.window_ms,
                by_start: BTreeMap::new(),
            };
        }
        let oldest = now.saturating_sub(learn.retention_ms());
        let by_start = &mut windows.by_start;
        while by_start
            .first_key_value()
            .is_some_and(|(&first, _)| first < oldest)
        {
            by_start.pop_first();
        }
        by_start
            .entry(start)
            .or_default()
            .add(domain, hits, learn.domains as usize);
    }

    async fn recorded(
        &self,
        namespace: &str,
        learn: &Learn,
    ) -> Result<(Vec<Recorded>, u64), LearnError> {
        let now = self.clock.now_ms();
        let period = crate::config::learned::period(learn, now);
        let record = self.record.lock().unwrap_or_else(|e| e.into_inner());
        let recorded = record
            .get(namespace)
            .into_iter()
            .flatten()
            .map(|(subject, windows)| Recorded {
                subject: subject.clone(),
                windows: windows
                    .by_start
                    .range(period.clone())
                    .filter(|_| windows.window_ms == learn.window_ms)
                    .map(|(&start_ms, top)| WindowUse {
                        start_ms,
                        domains: top.iter().map(|(d, n)| (d.to_owned(), n)).collect(),
                    })
                    .collect(),
            })
            .collect();
        Ok((recorded, now))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::clock::ManualClock;

    const LEARN: Learn = Learn {
        window_ms: 1_000,
        windows: 5,
        domains: 2,
    };

    #[tokio::test]
    async fn windows_are_by_the_clock_and_old_ones_go() {
        let clock = ManualClock::new(10_000);
        let log = MemoryLearn::with_clock(Arc::new(clock.clone()));
        for second in 10..30u64 {
            clock.set(second * 1_000 + 500);
            log.record("shop", "search", "acme", second, &LEARN);
        }
        let (recorded, now) = log.recorded("shop", &LEARN).await.expect("memory");
        assert_eq!(now, 29_500);
        let starts: Vec<u64> = recorded[0].windows.iter().map(|w| w.start_ms).collect();
        assert_eq!(starts, [24_000, 25_000, 26_000, 27_000, 28_000]);
        let kept = log.record.lock().expect("lock")["shop"]["search"]
            .by_start
            .len();
        assert!(kept <= 7, "{kept} windows kept");
    }

    #[tokio::test]
    async fn a_new_window_length_starts_the_record_again() {
        let clock = ManualClock::new(60_000);
        let log = MemoryLearn::with_clock(Arc::new(clock.clone()));
        let minutes = Learn {
            window_ms: 60_000,
            ..LEARN
        };
        log.record("shop", "search", "acme", 600, &minutes);
        clock.set(130_000);
        // Reloaded with windows of a second: a minute's count is not one.
        log.record("shop", "search", "acme", 1, &LEARN);
        let (recorded, _) = log.recorded("shop", &LEARN).await.expect("memory");
        assert!(recorded[0].windows.is_empty(), "{recorded:?}");
        clock.set(131_000);
        let (recorded, _) = log.recorded("shop", &LEARN).await.expect("memory");
        assert_eq!(recorded[0].windows.len(), 1, "{recorded:?}");
        assert_eq!(recorded[0].windows[0].domains, [("acme".to_owned(), 1)]);
        let (recorded, _) = log.recorded("shop", &minutes).await.expect("memory");
        assert!(recorded[0].windows.is_empty(), "{recorded:?}");
    }

    #[tokio::test]
    async fn a_check_of_no_hits_records_nothing() {
        let log = MemoryLearn::with_clock(Arc::new(ManualClock::new(0)));
        log.record("shop", "search", "acme", 0, &LEARN);
        assert!(log.record.lock().expect("lock").is_empty());
    }

    #[tokio::test]
    async fn past_the_bound_a_new_resource_is_not_recorded() {
        let log = MemoryLearn::with_clock(Arc::new(ManualClock::new(0)));
        for subject in 0..(Learn::SUBJECTS + 10) {
            log.record("shop", &format!("r{subject}"), "acme", 1, &LEARN);
        }
        assert_eq!(
            log.record.lock().expect("lock")["shop"].len(),
            Learn::SUBJECTS
        );
    }
}
