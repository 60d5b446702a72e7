//! The configuration API's core (docs/configuration-api.md): what the
//! limiter decides with is the files plus the API's objects, and this owns
//! that composition. It keeps this sidecar's view of the shared log (a
//! [`Snapshot`] at some version), catches up with the log (deltas, or the
//! whole state when too far behind), validates a write exactly as a file is
//! validated before committing it, and swaps the compiled configuration in
//! whole, so that no request sees half a change.
//!
//! Rebuilds are serialized: a file reload and a change of the log that
//! arrive together are applied one after the other, each from the latest
//! snapshot, so the last configuration swapped in is never an older one.

use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::watch;

use crate::config::overlay::{self, Overlay};
use crate::config::{ConfigErrors, LoadOptions, Note, PushedNamespace, Running};
use crate::store::config_log::{
    Change, ConfigLog, Delta, Expect, LogError, Object, ObjectPath, Snapshot, Write,
};

/// How often a sidecar asks the log for its version: a change made through
/// another sidecar is applied here within this (plus one rebuild).
pub const SYNC_PERIOD: Duration = Duration::from_millis(250);

/// What the last rebuild produced, for reading back.
#[derive(Debug, Default, Clone)]
pub struct View {
    /// The snapshot's version it was built from.
    pub version: u64,
    pub notes: Vec<Note>,
    /// Each source (file or API namespace) as normalized, in YAML.
    pub normalized: Vec<(PathBuf, String)>,
}

/// Why a write was not made.
#[derive(Debug, thiserror::Error)]
pub enum WriteError {
    /// The body (or what it makes of the configuration) is invalid.
    #[error("invalid configuration:\n{0}")]
    Invalid(ConfigErrors),
    /// The namespace is a file's: the API cannot own it.
    #[error("namespace `{0}` is defined by a file; the API cannot define it")]
    FileNamespace(String),
    #[error(transparent)]
    Log(#[from] LogError),
}

/// A write that was checked (and, unless a dry run, committed).
#[derive(Debug, Clone)]
pub struct Written {
    /// The change committed; `None` for a dry run.
    pub change: Option<Change>,
    pub notes: Vec<Note>,
    pub normalized: Vec<(PathBuf, String)>,
}

pub struct Configuration {
    path: PathBuf,
    options: LoadOptions,
    log: Box<dyn ConfigLog>,
    running: Running,
    snapshot: Mutex<Snapshot>,
    /// What a control plane (xDS) pushed last and was applied.
    pushed: Mutex<Arc<Vec<PushedNamespace>>>,
    view: Mutex<View>,
    rebuilding: tokio::sync::Mutex<()>,
}

impl Configuration {
    /// Over `running` (already holding a configuration loaded from `path`
    /// with `snapshot`'s overlay; `notes` and `normalized` are that load's).
    pub fn new(
        path: PathBuf,
        options: LoadOptions,
        log: Box<dyn ConfigLog>,
        running: Running,
        snapshot: Snapshot,
        notes: Vec<Note>,
        normalized: Vec<(PathBuf, String)>,
    ) -> Self {
        let view = View {
            version: snapshot.version,
            notes,
            normalized,
        };
        Self {
            path,
            options,
            log,
            running,
            snapshot: Mutex::new(snapshot),
            pushed: Mutex::new(Arc::default()),
            view: Mutex::new(view),
            rebuilding: tokio::sync::Mutex::new(()),
        }
    }

    /// Loads the files at `path` with the objects `log` holds (the files
    /// alone, logged, when those objects do not load), for a new running
    /// configuration: what a sidecar or an embedded engine starts from.
    pub async fn open(
        path: PathBuf,
        options: LoadOptions,
        log: Box<dyn ConfigLog>,
    ) -> Result<Self, ConfigErrors> {
        let snapshot = Self::first_snapshot(log.as_ref()).await;
        let loaded = match crate::config::load_with_overlay(
            &path,
            options,
            &[],
            &snapshot.overlay(),
        ) {
            Ok(loaded) => loaded,
            Err(errors) => {
                tracing::error!(%errors, "the configuration API's objects do not load; serving the files alone");
                crate::config::load_path_with(&path, options)?
            }
        };
        let crate::config::Loaded {
            config,
            notes,
            normalized,
        } = loaded;
        Ok(Self::new(
            path,
            options,
            log,
            Running::new(config),
            snapshot,
            notes,
            normalized,
        ))
    }

    /// The log's state at start, or an empty one (logged) when the log
    /// cannot be read yet: the sync task catches up once it can.
    pub async fn first_snapshot(log: &dyn ConfigLog) -> Snapshot {
        match log.snapshot().await {
            Ok(snapshot) => snapshot,
            Err(error) => {
                tracing::warn!(%error, "configuration API log unreadable at start; files only until it answers");
                Snapshot::default()
            }
        }
    }

    pub fn log(&self) -> &dyn ConfigLog {
        self.log.as_ref()
    }

    pub fn snapshot(&self) -> Snapshot {
        lock(&self.snapshot).clone()
    }

    pub fn view(&self) -> View {
        lock(&self.view).clone()
    }

    /// The configuration this swaps.
    pub fn running(&self) -> &Running {
        &self.running
    }

    /// Loads the files with the current overlay and swaps the result in
    /// (a file reload). On errors the running configuration is kept.
    pub async fn rebuild(&self) -> Result<usize, ConfigErrors> {
        let _one_at_a_time = self.rebuilding.lock().await;
        let pushed = lock(&self.pushed).clone();
        self.load_and_swap(pushed).await
    }

    /// Replaces what the control plane pushed with `namespaces`: loaded with
    /// the files and the API's objects and swapped in whole, or refused with
    /// the errors, the running configuration (and the last push) kept.
    pub async fn push(&self, namespaces: Vec<PushedNamespace>) -> Result<usize, ConfigErrors> {
        let _one_at_a_time = self.rebuilding.lock().await;
        let namespaces = Arc::new(namespaces);
        let count = self.load_and_swap(namespaces.clone()).await?;
        *lock(&self.pushed) = namespaces;
        Ok(count)
    }

    /// Under the rebuild lock: loads with `pushed` and swaps the result in.
    async fn load_and_swap(
        &self,
        pushed: Arc<Vec<PushedNamespace>>,
    ) -> Result<usize, ConfigErrors> {
        let snapshot = self.snapshot();
        let (path, options, overlay) = (self.path.clone(), self.options, snapshot.overlay());
        let loaded = tokio::task::spawn_blocking(move || {
            crate::config::load_with_overlay(&path, options, &pushed, &overlay)
        })
        .await
        .map_err(|error| {
            ConfigErrors(vec![crate::config::ConfigError::whole_file(
                &self.path,
                format!("the loader failed: {error}"),
            )])
        })??;
        let count = loaded.config.namespaces().count();
        for note in &loaded.notes {
            if is_skip(note) {
                tracing::warn!(%note, "configuration API");
            } else {
                tracing::info!(%note, "normalized");
            }
        }
        self.running.replace(loaded.config);
        *lock(&self.view) = View {
            version: snapshot.version,
            notes: loaded.notes,
            normalized: loaded.normalized,
        };
        Ok(count)
    }

    /// Catches up with the log; rebuilds if anything changed. Returns
    /// whether it did.
    pub async fn sync(&self) -> Result<bool, LogError> {
        let have = lock(&self.snapshot).version;
        let latest = self.log.version().await?;
        if latest == have {
            return Ok(false);
        }
        if latest < have {
            // A log older than our view (Redis restarted empty) is the truth too.
            *lock(&self.snapshot) = self.log.snapshot().await?;
        } else {
            match self.log.since(have).await? {
                Delta::Changes(changes) => {
                    let mut snapshot = lock(&self.snapshot);
                    for change in &changes {
                        if change.version > snapshot.version {
                            snapshot.apply(change);
                        }
                    }
                }
                Delta::Snapshot(snapshot) => *lock(&self.snapshot) = snapshot,
            }
        }
        if let Err(errors) = self.rebuild().await {
            tracing::error!(%errors, "configuration API change not applied; keeping the running configuration");
        }
        Ok(true)
    }

    /// Checks `write` against the files and every other object, then (unless
    /// `dry_run`) commits it to the log and applies it here.
    pub async fn write(&self, write: Write, dry_run: bool) -> Result<Written, WriteError> {
        // Validate against the latest state, not a stale view.
        self.sync().await?;
        let mut candidate: Overlay = self.snapshot().overlay();
        match &write.path {
            ObjectPath::Namespace { namespace } => {
                let owned_by_api = candidate.namespaces.contains_key(namespace);
                if !owned_by_api && self.running.load().namespace(namespace).is_some() {
                    return Err(WriteError::FileNamespace(namespace.clone()));
                }
                match &write.body {
                    Some(body) => candidate.namespaces.insert(namespace.clone(), body.clone()),
                    None => candidate.namespaces.remove(namespace),
                };
            }
            ObjectPath::Override {
                namespace,
                resource,
                domain,
            } => candidate.set_override(namespace, resource, domain, write.body.clone()),
        }
        let (path, options, target) = (self.path.clone(), self.options, write.path.clone());
        let pushed = lock(&self.pushed).clone();
        let loaded = tokio::task::spawn_blocking(move || {
            crate::config::check_write(&path, options, &pushed, &candidate, checked(&target))
        })
        .await
        .map_err(|error| WriteError::Log(LogError::Unavailable(error.to_string())))?
        .map_err(WriteError::Invalid)?;
        if dry_run {
            return Ok(Written {
                change: None,
                notes: loaded.notes,
                normalized: loaded.normalized,
            });
        }
        let change = self.log.write(write).await?;
        {
            let mut snapshot = lock(&self.snapshot);
            if change.version == snapshot.version + 1 {
                snapshot.apply(&change);
            }
        }
        // Catch up on anything written in between, and apply.
        if let Err(error) = self.sync().await {
            tracing::warn!(%error, "configuration API: applied later by the sync task");
        }
        if lock(&self.view).version < change.version
            && let Err(errors) = self.rebuild().await
        {
            tracing::error!(%errors, "configuration API change not applied");
        }
        Ok(Written {
            change: Some(change),
            notes: loaded.notes,
            normalized: loaded.normalized,
        })
    }

    /// The object at `path` in this sidecar's view.
    pub fn object(&self, path: &ObjectPath) -> Option<Object> {
        lock(&self.snapshot).object(path).cloned()
    }

    /// Polls the log every [`SYNC_PERIOD`] until `shutdown`.
    pub fn spawn_sync(self: Arc<Self>, mut shutdown: watch::Receiver<bool>) {
        tokio::spawn(async move {
            let mut ticks = tokio::time::interval(SYNC_PERIOD);
            ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            let mut failing = false;
            loop {
                tokio::select! {
                    _ = shutdown.changed() => return,
                    _ = ticks.tick() => {}
                }
                match self.sync().await {
                    Ok(_) if failing => {
                        failing = false;
                        tracing::info!("configuration API log reachable again");
                    }
                    Ok(_) => {}
                    Err(error) if !failing => {
                        failing = true;
                        tracing::warn!(%error, "configuration API log unreachable; serving the last configuration");
                    }
                    Err(_) => {}
                }
            }
        });
    }
}

/// Whether a note says an API object was skipped.
fn is_skip(note: &Note) -> bool {
    note.message.starts_with("skipped:") || note.message.starts_with("override skipped:")
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    // Every holder replaces the value whole: a poisoned lock's is intact.
    mutex
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// What the loader checks strictly for a write at `path`.
fn checked(path: &ObjectPath) -> overlay::Write<'_> {
    match path {
        ObjectPath::Namespace { namespace } => overlay::Write::Namespace(namespace),
        ObjectPath::Override {
            namespace,
            resource,
            domain,
        } => overlay::Write::Override {
            namespace,
            resource,
            domain,
        },
    }
}

/// The expectation an `If-Match` (or `If-None-Match: *`) header sets.
pub fn expectation(if_match: Option<&str>, if_none_match: Option<&str>) -> Result<Expect, String> {
    if if_none_match.map(str::trim) == Some("*") {
        return Ok(Expect::Version(0));
    }
    match if_match.map(str::trim) {
        None | Some("*") => Ok(Expect::Any),
        Some(tag) => tag
            .trim_start_matches("W/")
            .trim_matches('"')
            .parse()
            .map(Expect::Version)
            .map_err(|_| format!("If-Match `{tag}` is not a version this API gave (\"N\")")),
    }
}
