//! The link to a parent server (`--parent`,
//! docs/design.md#a-hierarchy-of-servers): each round asks the parent, in
//! one `GetCapacity` call as the level's one client (`--level-id`), for what
//! the level's clients want of every `from_parent` key, and records the
//! grants; the service apportions them ([`crate::service::leases::parent`]).
//! Rounds come at once when a key is first asked about or a lease given
//! from a grant moves (20 ms after the previous one at the soonest), then
//! every refresh interval the parent answers (100 ms at the fastest), and
//! every second while the parent does not answer (the grants stand until
//! they expire). Beside the rounds, a `WatchCapacity` stream carries the
//! parent's nudges: a grant that must shrink is asked about at once, so a
//! cut comes down without waiting for the round. Both go through the one
//! renewer a leaf's client uses ([`crate::client::renewal`]).

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;
use tokio::time::Instant;

use tokio_stream::StreamExt;

use crate::client::renewal::{self, LeaseWant, Renewed};
use crate::client::{Client, ClientError};
use crate::service::Service;
use crate::service::leases::parent::{ParentGrant, ParentWant};

/// The fastest a link asks again at its own pace, whatever the parent
/// says.
const FASTEST: Duration = Duration::from_millis(100);

/// The fastest a link asks again when something changed (a lease it gave
/// moved, a nudge): a share given back below must reach the parent before
/// the level's next round leaves, or it waits a round trip more
/// (docs/design.md#a-hierarchy-of-servers).
const FASTEST_CHANGE: Duration = Duration::from_millis(20);

/// How long a link waits after a round the parent did not answer, or one
/// with nothing to ask.
const RETRY: Duration = Duration::from_secs(1);

/// How long a link waits before watching again a parent that does not
/// know `WatchCapacity` (an older Charon): its cuts come with the rounds.
const UNWATCHED: Duration = Duration::from_secs(60);

/// Follows the parent through `parent` (its rounds and its nudges) as
/// `level_id` until `shutdown`.
pub async fn follow(
    service: Arc<Service>,
    parent: Client,
    level_id: String,
    mut shutdown: watch::Receiver<bool>,
) {
    tokio::spawn(watch_nudges(
        service.clone(),
        parent.clone(),
        level_id.clone(),
        shutdown.clone(),
    ));
    let mut next = Instant::now();
    let mut soonest = next;
    loop {
        tokio::select! {
            () = tokio::time::sleep_until(next) => {}
            () = service.parent_ask_now() => {
                // At once, but never sooner than `FASTEST_CHANGE`, nor
                // while an unanswered parent is left alone.
                tokio::select! {
                    () = tokio::time::sleep_until(soonest) => {}
                    _ = shutdown.changed() => return,
                }
            }
            _ = shutdown.changed() => return,
        }
        let began = Instant::now();
        let (round, granted) = round(&service, &parent, &level_id).await;
        let (wait, floor) = match round {
            Round::Answered(wait) => (wait, FASTEST_CHANGE),
            Round::Unanswered => (RETRY, RETRY),
            Round::Empty => (RETRY, Duration::ZERO),
        };
        service.parent_round(&granted).await;
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

/// One round: how it went, and what the parent granted.
async fn round(
    service: &Service,
    parent: &Client,
    level_id: &str,
) -> (Round, Vec<(ParentWant, ParentGrant)>) {
    let wants = service.parent_wants().await;
    if wants.is_empty() {
        return (Round::Empty, Vec::new());
    }
    let asked: Vec<LeaseWant> = wants
        .iter()
        .map(|want| LeaseWant {
            namespace: want.namespace.clone(),
            resource: want.resource.clone(),
            domain: want.domain.clone(),
            wants: want.wants,
            has: want.has,
            held_below: Some(want.held_below),
        })
        .collect();
    let answers = match renewal::renew(parent, level_id, &asked).await {
        Ok(answers) => answers,
        Err(error) => {
            tracing::warn!(%error, "the parent did not answer; the current grants stand until they expire");
            return (Round::Unanswered, Vec::new());
        }
    };
    let mut next = RETRY;
    let mut granted = Vec::with_capacity(wants.len());
    for (want, answer) in wants.into_iter().zip(answers) {
        match answer {
            Renewed::Lease(lease) => {
                next = next.min(Duration::from_millis(lease.refresh_interval_ms));
                granted.push((
                    want,
                    ParentGrant {
                        capacity: lease.capacity,
                        expiry_ms: lease.expiry_ms,
                        refresh_interval_ms: lease.refresh_interval_ms,
                        safe_capacity: lease.safe_capacity,
                    },
                ));
            }
            Renewed::Refused(message) => {
                tracing::warn!(%message, resource = %want.resource, "the parent refused a lease");
            }
            Renewed::Unanswered => {}
        }
    }
    (Round::Answered(next.max(FASTEST)), granted)
}

/// Keeps a `WatchCapacity` stream open to the parent as `level_id` until
/// `shutdown`: each nudge makes the link ask at once. A broken stream is
/// opened again after a second; the rounds go on meanwhile.
async fn watch_nudges(
    service: Arc<Service>,
    parent: Client,
    level_id: String,
    mut shutdown: watch::Receiver<bool>,
) {
    loop {
        let wait = match parent.watch_capacity(&level_id).await {
            Ok(mut nudges) => {
                loop {
                    tokio::select! {
                        nudge = nudges.next() => match nudge {
                            Some(Ok(())) => service.parent_nudged(),
                            Some(Err(_)) | None => break,
                        },
                        _ = shutdown.changed() => return,
                    }
                }
                RETRY
            }
            Err(ClientError::Unsupported(_)) => UNWATCHED,
            Err(_) => RETRY,
        };
        tokio::select! {
            () = tokio::time::sleep(wait) => {}
            _ = shutdown.changed() => return,
        }
    }
}
