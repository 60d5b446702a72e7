//! Nudges (docs/design.md#a-hierarchy-of-servers): the clients of this
//! server's leases that watch it (`WatchCapacity`, the levels of a
//! hierarchy below this one), by client id, and the push that tells one to
//! renew now: its lease must shrink before another client's can grow, or
//! the share it waits for was given back. Without it a cut waits for each
//! level's next refresh on its way down; with it, a cut reaches the leaves
//! in one round per level.
//!
//! A nudge says nothing but "ask again": the client's next `GetCapacity`
//! gets the answer, so a nudge that is lost (a client watching another
//! replica of this level, a stream that broke) costs only time.

use std::collections::HashMap;
use std::sync::{Mutex, MutexGuard, PoisonError};

use tokio::sync::watch;

use crate::engine::capacity::CapacityConfig;
use crate::store::leases::LeaseKey;

use crate::service::Service;
use crate::service::error::{Error, Kind};
use crate::service::ops::check_name;

/// The most client ids watched at once: a level has a handful of children,
/// and an id costs memory for as long as it is watched.
pub const MOST_WATCHED: usize = 10_000;

/// The watched client ids, each with the count of nudges sent to it.
#[derive(Default)]
pub struct Nudges {
    watchers: Mutex<HashMap<String, watch::Sender<u64>>>,
}

impl Nudges {
    fn lock(&self) -> MutexGuard<'_, HashMap<String, watch::Sender<u64>>> {
        // Each change leaves the map whole.
        self.watchers.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Starts watching `client`: the receiver changes at each nudge. Several
    /// watchers of one id (the replicas of a level) are all nudged.
    pub fn watch(&self, client: &str) -> Result<watch::Receiver<u64>, Error> {
        check_name("client_id", client)?;
        let mut watchers = self.lock();
        if let Some(sender) = watchers.get(client) {
            return Ok(sender.subscribe());
        }
        // Ids nobody watches any more go first.
        watchers.retain(|_, sender| sender.receiver_count() > 0);
        if watchers.len() >= MOST_WATCHED {
            return Err(Error::new(
                Kind::TooMany,
                format!("this server already has {MOST_WATCHED} clients watching it"),
            ));
        }
        let (sender, receiver) = watch::channel(0);
        watchers.insert(client.to_owned(), sender);
        Ok(receiver)
    }

    /// Whether anyone watches at all (if not, there is nothing to look up).
    pub fn any(&self) -> bool {
        !self.lock().is_empty()
    }

    /// Whether `client` is watched here (a level below, or an RLQS stream
    /// of this sidecar).
    pub fn is_watched(&self, client: &str) -> bool {
        self.lock()
            .get(client)
            .is_some_and(|sender| sender.receiver_count() > 0)
    }

    /// Tells `client`'s watchers to renew now; whether anyone watched it.
    pub fn nudge(&self, client: &str) -> bool {
        let mut watchers = self.lock();
        let Some(sender) = watchers.get(client) else {
            return false;
        };
        if sender.receiver_count() == 0 {
            watchers.remove(client);
            return false;
        }
        sender.send_modify(|sent| *sent += 1);
        true
    }
}

impl Service {
    /// After a lease of `key` moved under `config`: nudges the clients
    /// other than `except` that now hold more than their share, or wait
    /// for a share that is free ([`crate::engine::capacity::to_nudge`]).
    /// A store that cannot say nudges nobody (they renew at their refresh).
    pub(super) async fn nudge_others(
        &self,
        key: LeaseKey<'_>,
        config: &CapacityConfig,
        except: &str,
    ) {
        if !self.leases.nudges.any() {
            return;
        }
        let Ok(clients) = self.leases.store.to_nudge(key, config, except).await else {
            return;
        };
        for client in clients {
            if self.leases.nudges.nudge(&client) {
                tracing::debug!(%client, resource = %key.at.resource, "nudged");
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_nudge_reaches_every_watcher_of_an_id_while_it_is_watched() {
        let nudges = Nudges::default();
        assert!(!nudges.any());
        assert!(!nudges.nudge("region-a"));
        let (Ok(mut first), Ok(second)) = (nudges.watch("region-a"), nudges.watch("region-a"))
        else {
            panic!("watching a good id is refused");
        };
        assert!(nudges.nudge("region-a"));
        assert!(first.has_changed().unwrap_or(false));
        assert!(second.has_changed().unwrap_or(false));
        assert_eq!(*first.borrow_and_update(), 1);
        assert!(!nudges.nudge("region-b"));
        // Nobody watches any more: the id goes.
        drop((first, second));
        assert!(!nudges.nudge("region-a"));
        assert!(!nudges.any());
        assert!(nudges.watch("").is_err());
    }
}
