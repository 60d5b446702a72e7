//! The renewals of this server's shares of its global limits
//! (docs/design.md#global-limits): a background task, never on a
//! request's path, that runs [`Service::renew_global_shares`] every
//! refresh interval until shutdown.

use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::sync::watch;

use crate::config::global::FASTEST_REFRESH_MS;
use crate::service::Service;
use crate::service::global::GlobalRenewals;

/// How often a server with a parent renews between the link's rounds.
const BETWEEN_ROUNDS: Duration = Duration::from_millis(FASTEST_REFRESH_MS);

/// How long a server with a parent waits for the parent's first answer
/// before it decides with what it has (the safe share: the whole limit).
const FIRST_ANSWER: Duration = Duration::from_secs(2);

/// Renews until `shutdown`: every refresh interval, or on a server with a
/// parent, right after each round of the parent link (so that a new grant
/// is applied at once) and every 100 ms between them.
pub async fn renew(service: Arc<Service>, mut shutdown: watch::Receiver<bool>) {
    let mut renewals = GlobalRenewals::default();
    let linked = service.parent.is_linked();
    let mut rounds = service.parent.rounds();
    if linked {
        // Ask first, so that the link asks the parent; then decide with its
        // answer.
        service
            .renew_global_shares(&mut renewals, None, false)
            .await;
        tokio::select! {
            _ = tokio::time::timeout(FIRST_ANSWER, rounds.changed()) => {}
            _ = shutdown.changed() => return,
        }
    }
    service.renew_global_shares(&mut renewals, None, true).await;
    let mut last = Instant::now();
    let period = Duration::from_millis(service.global_timing.refresh_ms());
    let mut every = tokio::time::interval_at(tokio::time::Instant::now() + period, period);
    every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        if linked {
            // Right after each round of the link, and every 100 ms between
            // them, so that a change of demand is seen (and climbs, the
            // lease moving) at once rather than at the next round.
            tokio::select! {
                _ = rounds.changed() => {}
                () = tokio::time::sleep(BETWEEN_ROUNDS) => {}
                _ = shutdown.changed() => return,
            }
        } else {
            tokio::select! {
                _ = every.tick() => {}
                _ = shutdown.changed() => return,
            }
        }
        let elapsed = u64::try_from(last.elapsed().as_millis()).unwrap_or(u64::MAX);
        last = Instant::now();
        service
            .renew_global_shares(&mut renewals, Some(elapsed), true)
            .await;
    }
}
