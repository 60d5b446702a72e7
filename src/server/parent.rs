//! The link to a parent server (`--parent`,
//! docs/design.md#a-hierarchy-of-servers): each round asks the parent, in
//! one `GetCapacity` call as the level's one client (`--level-id`), for what
//! the level's clients want of every `from_parent` key, and records the
//! grants; the service apportions them ([`crate::service::parent`]).
//! Rounds come at once when a key is first asked about or a lease given
//! from a grant moves, then every refresh interval the parent answers
//! (100 ms at the fastest), and every second while the parent does not
//! answer (the grants stand until they expire).

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;
use tokio::time::Instant;

use crate::api::v1::capacity_answer::Result as Answered;
use crate::api::v1::{CapacityWant, GetCapacityRequest};
use crate::client::Client;
use crate::service::Service;

/// The fastest a link asks again, whatever the parent says.
const FASTEST: Duration = Duration::from_millis(100);

/// How long a link waits after a round the parent did not answer, or one
/// with nothing to ask.
const RETRY: Duration = Duration::from_secs(1);

/// Follows the parent through `parent` as `level_id` until `shutdown`.
pub async fn follow(
    service: Arc<Service>,
    parent: Client,
    level_id: String,
    mut shutdown: watch::Receiver<bool>,
) {
    let mut next = Instant::now();
    let mut soonest = next;
    loop {
        tokio::select! {
            () = tokio::time::sleep_until(next) => {}
            () = service.parent_ask_now() => {
                // At once, but never sooner than the fastest rounds, nor
                // while an unanswered parent is left alone.
                tokio::select! {
                    () = tokio::time::sleep_until(soonest) => {}
                    _ = shutdown.changed() => return,
                }
            }
            _ = shutdown.changed() => return,
        }
        let began = Instant::now();
        let (wait, floor) = match round(&service, &parent, &level_id).await {
            Round::Answered(wait) => (wait, FASTEST),
            Round::Unanswered => (RETRY, RETRY),
            Round::Empty => (RETRY, Duration::ZERO),
        };
        service.parent_round_ended();
        next = began + wait;
        soonest = began + floor;
    }
}

/// How a round went.
enum Round {
    /// The parent answered; the next round is due after this.
    Answered(Duration),
    /// The parent did not answer.
    Unanswered,
    /// There was nothing to ask.
    Empty,
}

/// One round.
async fn round(service: &Service, parent: &Client, level_id: &str) -> Round {
    let wants = service.parent_wants().await;
    if wants.is_empty() {
        return Round::Empty;
    }
    let resources = wants
        .iter()
        .map(|want| CapacityWant {
            namespace: want.namespace.clone(),
            resource: want.resource.clone(),
            domain: want.domain.clone(),
            wants: want.wants,
            has: want.has,
            held_below: Some(want.held_below),
        })
        .collect();
    let asked = parent
        .get_capacity(GetCapacityRequest {
            client_id: level_id.to_owned(),
            resources,
        })
        .await;
    let answers = match asked {
        Ok(answer) => answer.answers,
        Err(error) => {
            tracing::warn!(%error, "the parent did not answer; the current grants stand until they expire");
            return Round::Unanswered;
        }
    };
    let mut next = RETRY;
    for (want, answer) in wants.iter().zip(answers) {
        match answer.result {
            Some(Answered::Lease(lease)) => {
                next = next.min(Duration::from_millis(lease.refresh_interval_ms));
                service.parent_granted(
                    want,
                    lease.capacity,
                    lease.expiry_ms,
                    lease.refresh_interval_ms,
                );
            }
            Some(Answered::Error(error)) => {
                tracing::warn!(message = %error.message, resource = %want.resource, "the parent refused a lease");
            }
            None => {}
        }
    }
    Round::Answered(next.max(FASTEST))
}
