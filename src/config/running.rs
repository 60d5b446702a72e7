//! The running configuration: one handle that every decision reads whole
//! and a reload or the configuration API swaps whole, so that no request
//! sees half a change. The limiter decides with it, the service looks
//! resources up in it, the configuration API swaps it; each holds the
//! handle, none of them holds the others for it.

use std::sync::Arc;

use arc_swap::ArcSwap;

use super::Config;

/// A shared handle to the configuration in force.
#[derive(Clone)]
pub struct Running(Arc<ArcSwap<Config>>);

impl Running {
    pub fn new(config: Config) -> Self {
        Self(Arc::new(ArcSwap::from_pointee(config)))
    }

    /// The configuration now; later swaps do not change what this returns.
    pub fn load(&self) -> Arc<Config> {
        self.0.load_full()
    }

    /// Swaps `config` in; requests in flight finish on the one they loaded.
    /// The configuration is data only: what runs beside it (a global
    /// limit's share) is kept by its owner, by name.
    pub fn replace(&self, config: Config) {
        self.0.store(Arc::new(config));
    }
}

impl std::fmt::Debug for Running {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Running").finish_non_exhaustive()
    }
}
