//! Configuration reload: on a change of the file or directory (including a
//! Kubernetes ConfigMap's atomic `..data` symlink swap) and on SIGHUP. A new
//! configuration that does not load is logged and the running one is kept.
//! The configuration API's objects are applied on top of the files at every
//! reload ([`Configuration::rebuild`]), so a reload keeps them.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use notify::{RecursiveMode, Watcher};
use tokio::sync::mpsc;

use crate::service::configuration::Configuration;

use super::metrics::{Metrics, ReloadResult};

/// Editors and ConfigMap updates write in several steps: wait for quiet.
const SETTLE: Duration = Duration::from_millis(250);

/// Watches `path` and reloads into `limiter` until `shutdown` fires. The
/// returned watcher must be kept alive for file events to arrive.
pub fn spawn(
    path: PathBuf,
    configuration: Arc<Configuration>,
    metrics: Arc<Metrics>,
    mut shutdown: tokio::sync::watch::Receiver<bool>,
) -> anyhow::Result<notify::RecommendedWatcher> {
    let (tx, mut rx) = mpsc::channel::<()>(1);
    let file_events = tx.clone();
    let relevant = relevance(&path);
    let mut watcher = notify::recommended_watcher(move |event: notify::Result<notify::Event>| {
        // Reading a file (Envoy, `cat`, `charon check`) is an event too:
        // only a change to the configuration is a reason to reload.
        if let Ok(event) = event
            && !matches!(event.kind, notify::EventKind::Access(_))
            && event.paths.iter().any(|changed| relevant(changed))
        {
            // Full channel: a reload is already pending, which is enough.
            let _ = file_events.try_send(());
        }
    })?;
    // Watch the directory holding the file (or the directory itself): a
    // ConfigMap update replaces a symlink there rather than writing the file.
    let watched = watched_dir(&path);
    watcher.watch(&watched, RecursiveMode::NonRecursive)?;
    #[cfg(unix)]
    {
        let tx = tx.clone();
        let mut hangups = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup())?;
        tokio::spawn(async move {
            while hangups.recv().await.is_some() {
                tracing::info!("SIGHUP: reloading configuration");
                let _ = tx.try_send(());
            }
        });
    }
    tokio::spawn(async move {
        loop {
            tokio::select! {
                _ = shutdown.changed() => return,
                received = rx.recv() => if received.is_none() { return },
            }
            tokio::time::sleep(SETTLE).await;
            while rx.try_recv().is_ok() {}
            reload(&path, &configuration, &metrics).await;
        }
    });
    Ok(watcher)
}

/// Which changed paths concern the configuration: in a directory config,
/// anything; for a file, that file, or a ConfigMap's hidden `..data` swap.
fn relevance(config: &Path) -> impl Fn(&Path) -> bool + Send + 'static {
    let file_name = (!config.is_dir())
        .then(|| config.file_name().map(|name| name.to_owned()))
        .flatten();
    move |changed: &Path| match (&file_name, changed.file_name()) {
        (None, _) => true,
        (Some(wanted), Some(name)) => {
            name == wanted.as_os_str() || name.to_string_lossy().starts_with("..")
        }
        (Some(_), None) => false,
    }
}

fn watched_dir(path: &Path) -> PathBuf {
    if path.is_dir() {
        return path.to_owned();
    }
    match path.parent() {
        Some(parent) if !parent.as_os_str().is_empty() => parent.to_owned(),
        _ => PathBuf::from("."),
    }
}

/// Loads `path` (with the API's objects) and swaps it in, or keeps the
/// running configuration.
pub async fn reload(path: &Path, configuration: &Configuration, metrics: &Metrics) {
    match configuration.rebuild().await {
        Ok(count) => {
            metrics.reload(ReloadResult::Ok);
            metrics.set_namespaces(count);
            tracing::info!(path = %path.display(), namespaces = count, "configuration reloaded");
        }
        Err(errors) => {
            metrics.reload(ReloadResult::Rejected);
            tracing::error!(
                path = %path.display(),
                errors = %errors,
                "new configuration rejected; keeping the running one"
            );
        }
    }
}
