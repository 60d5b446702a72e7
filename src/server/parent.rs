//! The link to a parent server (`--parent`,
//! docs/design.md#a-hierarchy-of-servers): each round asks the parent, in
//! one `GetCapacity` call as the level's one client (`--level-id`), for what
//! the level's clients want of every `from_parent` key, and records the
//! grants; the service apportions them ([`crate::service::parent`]).
//! Rounds come at once when a key is first asked about, then every refresh
//! interval the parent answers (100 ms at the fastest), and every second
//! while the parent does not answer (the grants stand until they expire).

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;

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
    let mut wait = Duration::ZERO;
    loop {
        tokio::select! {
            () = tokio::time::sleep(wait) => {}
            () = service.parent_key_added() => {}
            _ = shutdown.changed() => return,
        }
        wait = round(&service, &parent, &level_id).await;
        service.parent_round_ended();
    }
}

/// One round; how long to wait before the next.
async fn round(service: &Service, parent: &Client, level_id: &str) -> Duration {
    let wants = service.parent_wants().await;
    if wants.is_empty() {
        return RETRY;
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
            return RETRY;
        }
    };
    let mut next = RETRY;
    for (want, answer) in wants.iter().zip(answers) {
        match answer.result {
            Some(Answered::Lease(lease)) => {
                next = next.min(Duration::from_millis(lease.refresh_interval_ms));
                service.parent_granted(want, lease.capacity, lease.expiry_ms);
            }
            Some(Answered::Error(error)) => {
                tracing::warn!(message = %error.message, resource = %want.resource, "the parent refused a lease");
            }
            None => {}
        }
    }
    next.max(FASTEST)
}
