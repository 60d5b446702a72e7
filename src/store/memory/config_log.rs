//! The configuration log in the process: for one sidecar on the memory
//! store. With a state file, every change is written to it before it is
//! acknowledged (a temporary file renamed over the old one, so a crash
//! leaves the old state or the new, never half of one), and read back at
//! start; without one, changes last as long as the process.

use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::{SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Serialize};

use crate::store::config_log::{
    Change, ConfigLog, Delta, LogError, MAX_CHANGES, Snapshot, Write, check,
};

#[derive(Debug, Default, Clone, Serialize, Deserialize)]
struct State {
    snapshot: Snapshot,
    changes: Vec<Change>,
}

pub struct MemoryLog {
    state: Mutex<State>,
    file: Option<PathBuf>,
}

impl MemoryLog {
    /// A log kept in memory only.
    pub fn new() -> Self {
        Self {
            state: Mutex::new(State::default()),
            file: None,
        }
    }

    /// A log kept in `file` too, starting from what it holds (nothing if it
    /// does not exist yet).
    pub fn with_file(file: &Path) -> Result<Self, LogError> {
        let state = match std::fs::read(file) {
            Ok(bytes) => serde_json::from_slice(&bytes)
                .map_err(|error| LogError::Corrupt(format!("{}: {error}", file.display())))?,
            Err(error) if error.kind() == std::io::ErrorKind::NotFound => State::default(),
            Err(error) => {
                return Err(LogError::Unavailable(format!(
                    "cannot read {}: {error}",
                    file.display()
                )));
            }
        };
        Ok(Self {
            state: Mutex::new(state),
            file: Some(file.to_owned()),
        })
    }

    pub fn is_durable(&self) -> bool {
        self.file.is_some()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        // A panic while holding the lock cannot leave the state half-changed
        // (every change is applied to a copy first), so a poisoned lock is
        // still good.
        self.state
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    pub fn version(&self) -> u64 {
        self.lock().snapshot.version
    }

    pub fn snapshot(&self) -> Snapshot {
        self.lock().snapshot.clone()
    }

    pub fn since(&self, version: u64) -> Delta {
        let state = self.lock();
        let oldest = state
            .changes
            .first()
            .map_or(state.snapshot.version + 1, |c| c.version);
        if version + 1 < oldest {
            return Delta::Snapshot(state.snapshot.clone());
        }
        Delta::Changes(
            state
                .changes
                .iter()
                .filter(|change| change.version > version)
                .cloned()
                .collect(),
        )
    }

    pub fn write(&self, write: Write) -> Result<Change, LogError> {
        let mut state = self.lock();
        check(
            write.expect,
            state.snapshot.object(&write.path),
            write.body.is_none(),
        )?;
        let change = Change {
            version: state.snapshot.version + 1,
            at_ms: SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .map_or(0, |since| {
                    u64::try_from(since.as_millis()).unwrap_or(u64::MAX)
                }),
            who: write.who,
            path: write.path,
            body: write.body,
        };
        let mut next = state.clone();
        next.snapshot.apply(&change);
        next.changes.push(change.clone());
        let excess = next.changes.len().saturating_sub(MAX_CHANGES as usize);
        next.changes.drain(..excess);
        if let Some(file) = &self.file {
            persist(file, &next)?;
        }
        *state = next;
        Ok(change)
    }
}

/// The process's log: every call answered under its lock, at once.
#[async_trait::async_trait]
impl ConfigLog for MemoryLog {
    async fn version(&self) -> Result<u64, LogError> {
        Ok(MemoryLog::version(self))
    }

    async fn snapshot(&self) -> Result<Snapshot, LogError> {
        Ok(MemoryLog::snapshot(self))
    }

    async fn since(&self, version: u64) -> Result<Delta, LogError> {
        Ok(MemoryLog::since(self, version))
    }

    async fn write(&self, write: Write) -> Result<Change, LogError> {
        MemoryLog::write(self, write)
    }

    fn is_durable(&self) -> bool {
        MemoryLog::is_durable(self)
    }
}

impl Default for MemoryLog {
    fn default() -> Self {
        Self::new()
    }
}

/// Writes `state` to a temporary file beside `file`, then renames it over.
fn persist(file: &Path, state: &State) -> Result<(), LogError> {
    let unavailable = |error: std::io::Error| {
        LogError::Unavailable(format!("cannot write {}: {error}", file.display()))
    };
    let bytes = serde_json::to_vec(state).map_err(|error| LogError::Corrupt(error.to_string()))?;
    let mut temporary = file.as_os_str().to_owned();
    temporary.push(".tmp");
    let temporary = PathBuf::from(temporary);
    {
        use std::io::Write as _;
        let mut out = std::fs::File::create(&temporary).map_err(unavailable)?;
        out.write_all(&bytes).map_err(unavailable)?;
        out.sync_all().map_err(unavailable)?;
    }
    std::fs::rename(&temporary, file).map_err(unavailable)
}
