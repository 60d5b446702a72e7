//! Stopping the sidecar: wait for SIGTERM or SIGINT (or a server that stops
//! on its own), then stop being ready, tell health checks, go on serving
//! for the shutdown delay (while a Service drops the endpoint), let
//! requests in flight finish, give sessions time to release their holds,
//! and leave the copy log's membership.

use std::sync::atomic::Ordering;
use std::time::Duration;

use anyhow::Context;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_server::RateLimitServiceServer;
use tokio::sync::watch;

use crate::api::v1::charon_server::CharonServer;
use crate::kit::shutdown_signal;
use crate::store::open::SidecarStore;

use super::Serving;
use super::api::ApiService;
use super::rls::RlsService;

/// How long a stopping sidecar waits for its gRPC clients to go.
const DRAIN_LIMIT: Duration = Duration::from_secs(10);

/// How long a stopping sidecar waits for its sessions to release their holds.
const RELEASE_ON_SHUTDOWN: Duration = Duration::from_secs(5);

/// Until a signal, or until a server stops on its own: then the process must
/// not stay alive looking ready, and the error says which.
pub(super) async fn until_signal(serving: &mut Serving) -> anyhow::Result<()> {
    tokio::select! {
        () = shutdown_signal() => Ok(()),
        ended = &mut serving.grpc_task => {
            serving.ready.store(false, Ordering::SeqCst);
            ended?.context("gRPC server failed")?;
            anyhow::bail!("gRPC server stopped unexpectedly");
        }
        ended = &mut serving.admin_task => {
            serving.ready.store(false, Ordering::SeqCst);
            ended?.context("admin server failed")?;
            anyhow::bail!("admin server stopped unexpectedly");
        }
    }
}

/// Stops serving, in the order that loses nothing: not ready, not serving
/// (health), still answering for `delay`, requests in flight drained (up to
/// a limit), sessions' holds released, membership left.
pub(super) async fn stop(serving: Serving, delay: Duration) -> anyhow::Result<()> {
    let Serving {
        mut grpc_task,
        admin_task,
        ready,
        health,
        open_sessions,
        copies,
        shutdown_tx,
        _watcher,
    } = serving;
    tracing::info!("shutting down: finishing requests in flight");
    ready.store(false, Ordering::SeqCst);
    health
        .set_service_status("", tonic_health::ServingStatus::NotServing)
        .await;
    health
        .set_not_serving::<RateLimitServiceServer<RlsService<SidecarStore>>>()
        .await;
    health.set_not_serving::<CharonServer<ApiService>>().await;
    if !delay.is_zero() {
        // Endpoint removal is asynchronous: calls still arrive for a while,
        // and are answered rather than refused. A second signal cuts it.
        tracing::info!(
            ?delay,
            "not ready; still answering until the shutdown delay is over"
        );
        tokio::select! {
            () = tokio::time::sleep(delay) => {}
            () = shutdown_signal() => {}
        }
    }
    let _ = shutdown_tx.send(true);
    // A client that never reads its closed stream must not hold the process.
    match tokio::time::timeout(DRAIN_LIMIT, &mut grpc_task).await {
        Ok(ended) => ended?.context("gRPC server failed")?,
        Err(_) => {
            tracing::warn!(limit = ?DRAIN_LIMIT, "gRPC connections still open after the drain limit: closing them");
            grpc_task.abort();
        }
    }
    admin_task.await?.context("admin server failed")?;
    // Sessions end on the shutdown signal and release what they hold.
    let waiting = tokio::time::Instant::now();
    while open_sessions.load(Ordering::SeqCst) > 0 && waiting.elapsed() < RELEASE_ON_SHUTDOWN {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    copies.deregister().await;
    tracing::info!("stopped");
    Ok(())
}

/// Resolves once the shutdown flag is up.
pub(super) async fn wait_for(mut shutdown: watch::Receiver<bool>) {
    let _ = shutdown.wait_for(|stop| *stop).await;
}
