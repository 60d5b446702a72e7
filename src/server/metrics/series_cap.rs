//! A label that takes at most so many distinct values: past the cap, new
//! values are counted under `overflow` (and the folds counted), so that
//! what requests shape cannot grow the metrics without bound.

use std::sync::Arc;

use prometheus_client::metrics::counter::Counter;

use super::SharedLabel;

/// The distinct keys a label has taken, up to a cap.
pub(super) struct SeriesCap {
    keys: std::sync::RwLock<std::collections::HashSet<Arc<str>>>,
    max: usize,
}

impl SeriesCap {
    pub(super) fn new(max: usize) -> Self {
        Self {
            keys: Default::default(),
            max,
        }
    }

    /// `key` itself while it is counted (or fits under the cap), else
    /// `overflow`, with `folds` counted.
    pub(super) fn label(&self, key: &str, folds: &Counter) -> SharedLabel {
        self.admit(key, folds)
            .map_or_else(|| SharedLabel(Arc::from("overflow")), SharedLabel)
    }

    /// `key` while it is counted (or fits under the cap); `None`, with
    /// `folds` counted, past the cap.
    pub(super) fn admit(&self, key: &str, folds: &Counter) -> Option<Arc<str>> {
        let known = self
            .keys
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .get(key)
            .cloned();
        if let Some(known) = known {
            return Some(known);
        }
        let mut keys = self
            .keys
            .write()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if let Some(known) = keys.get(key) {
            return Some(known.clone());
        }
        if keys.len() < self.max {
            let key: Arc<str> = Arc::from(key);
            keys.insert(key.clone());
            Some(key)
        } else {
            folds.inc();
            None
        }
    }
}
