//! Crash safety across sidecars (docs/design.md#sidecar-crashes):
//! heartbeats, resignation, and the reaper.
//!
//! - **Heartbeat.** A sidecar registers under a fresh random id with a key
//!   that expires after `ttl`, and renews it every `heartbeat` (`SET … XX`).
//! - **Resignation.** If the key is gone when it renews (Redis lost its data,
//!   or the sidecar was reaped), or if no renewal has succeeded for
//!   `ttl - heartbeat`, the sidecar resigns: its membership generation moves
//!   on, which ends every session (their holds are the reaper's now), and copy
//!   operations are refused until it has registered again under a new id.
//! - **Reaper.** Every `reap_interval`, the sidecar holding the reaper lease
//!   (`SET NX PX`, renewed by its holder) looks at the contributors of every
//!   copy-limited resource; a contributor whose heartbeat key is gone is dead:
//!   one script subtracts its contribution from the counts, deletes it and
//!   bars the id from contributing again. It also releases expired transfers.
//!
//! A SIGKILLed sidecar's holds are therefore gone within
//! `ttl + reap_interval` (plus one lease period if the dead sidecar held the
//! lease), and a sidecar that cannot reach Redis stops serving copies before
//! its heartbeat can expire.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::Instant;

use redis::Value;
use tokio::sync::watch;

use super::{Reaped, RedisCopies, array, int, millis, strings};
use crate::store::copies::ResourceList;
use crate::store::keys;
use crate::store::redis::RedisError;

impl RedisCopies {
    /// Registers, renews and resigns until `shutdown`; and, while holding
    /// the lease, reaps dead sidecars every `reap_interval`.
    pub fn spawn(self: &Arc<Self>, resources: ResourceList, shutdown: watch::Receiver<bool>) {
        tokio::spawn(self.clone().run_membership(shutdown.clone()));
        tokio::spawn(self.clone().run_reaper(resources, shutdown));
    }

    async fn run_membership(self: Arc<Self>, mut shutdown: watch::Receiver<bool>) {
        let ttl = millis(self.timings.ttl);
        loop {
            let Some((id, registered_at)) = self.register(&mut shutdown).await else {
                return;
            };
            self.membership.send_modify(|m| {
                m.generation += 1;
                m.server_id = Arc::from(id.as_str());
                m.serving = true;
            });
            tracing::info!(server_id = %id, "registered in the copy log");
            self.redis.event("registered", 1);
            let mut last_renewal = registered_at;
            let mut ticks = tokio::time::interval(self.timings.heartbeat);
            ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            ticks.tick().await;
            let reason = loop {
                let resign_at =
                    tokio::time::Instant::from_std(last_renewal + self.timings.resign_after());
                tokio::select! {
                    _ = shutdown.changed() => return,
                    () = self.resign.notified() => {
                        let request = self.resign_request.lock().ok().and_then(|mut r| r.take());
                        match request {
                            Some((server_id, reason)) if server_id == id => break reason,
                            // About an id already given up: stale.
                            _ => {}
                        }
                    }
                    // Not a renewal in time: resign before the heartbeat can
                    // expire, even while a renewal call hangs.
                    () = tokio::time::sleep_until(resign_at) => {
                        break format!("no heartbeat renewal for {:?}", last_renewal.elapsed());
                    }
                    _ = ticks.tick() => {
                        let sent = Instant::now();
                        let mut renew = redis::cmd("SET");
                        renew.arg(self.redis.key(&keys::heartbeat_key(&id)).as_ref()).arg(&id).arg("PX").arg(ttl).arg("XX");
                        // The renewal races the deadline: a call that hangs
                        // (a partition, whatever --store-timeout says) must
                        // not keep this sidecar serving copies past it.
                        tokio::select! {
                            _ = shutdown.changed() => return,
                            () = tokio::time::sleep_until(resign_at) => {
                                break format!(
                                    "no heartbeat renewal for {:?} (a renewal hung)",
                                    last_renewal.elapsed()
                                );
                            }
                            renewed = self.redis.query("heartbeat", &renew) => match renewed {
                                Ok(Value::Okay) => last_renewal = sent,
                                Ok(_) => break "its heartbeat key is gone (Redis lost its data, or the sidecar was reaped)".to_owned(),
                                Err(error) => tracing::warn!(%error, "heartbeat renewal failed"),
                            },
                        }
                    }
                }
            };
            tracing::warn!(server_id = %id, %reason, "resigning: ending every session; the other sidecars reap its holds");
            self.redis.event("resigned", 1);
            self.membership.send_modify(|m| {
                m.generation += 1;
                m.serving = false;
            });
            // Redis may have lost the copy index with everything else.
            if let Ok(mut indexed) = self.indexed.lock() {
                indexed.clear();
            }
        }
    }

    /// Registers under a fresh id; `None` on shutdown.
    async fn register(&self, shutdown: &mut watch::Receiver<bool>) -> Option<(String, Instant)> {
        let mut warned = false;
        loop {
            if *shutdown.borrow() {
                return None;
            }
            let id = match crate::store::copies::random_hex() {
                Ok(id) => id,
                Err(error) => {
                    tracing::error!(%error, "cannot make a sidecar id");
                    return None;
                }
            };
            let sent = Instant::now();
            let mut register = redis::cmd("SET");
            register
                .arg(self.redis.key(&keys::heartbeat_key(&id)).as_ref())
                .arg(&id)
                .arg("PX")
                .arg(millis(self.timings.ttl))
                .arg("NX");
            match self.redis.query("register", &register).await {
                Ok(Value::Okay) => return Some((id, sent)),
                Ok(_) => continue,
                Err(error) => {
                    if !warned {
                        tracing::warn!(%error, "cannot register in the copy log yet: copy operations are refused until then");
                        warned = true;
                    }
                    tokio::select! {
                        _ = shutdown.changed() => return None,
                        () = tokio::time::sleep(self.timings.heartbeat) => {}
                    }
                }
            }
        }
    }

    /// Removes this sidecar's heartbeat on a clean shutdown (after its
    /// sessions released their holds), so nothing waits for it to expire.
    pub(super) async fn remove_heartbeat(&self) {
        let id = self.membership.borrow().server_id.clone();
        if id.is_empty() {
            return;
        }
        let mut delete = redis::cmd("DEL");
        delete.arg(self.redis.key(&keys::heartbeat_key(&id)).as_ref());
        if let Err(error) = self.redis.query("deregister", &delete).await {
            tracing::warn!(%error, "cannot remove the heartbeat; it expires on its own");
        }
    }

    async fn run_reaper(
        self: Arc<Self>,
        resources: ResourceList,
        mut shutdown: watch::Receiver<bool>,
    ) {
        let mut ticks = tokio::time::interval(self.timings.reap_interval);
        ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = shutdown.changed() => return,
                _ = ticks.tick() => {}
            }
            let membership = self.membership.borrow().clone();
            if !membership.serving {
                continue;
            }
            match self.hold_lease(&membership.server_id).await {
                Ok(true) => {}
                Ok(false) => continue,
                Err(error) => {
                    tracing::debug!(%error, "reaper lease");
                    continue;
                }
            }
            match self.reap_once(&membership.server_id, resources()).await {
                Ok(reaped) => {
                    for (server, copies) in &reaped.servers {
                        tracing::warn!(dead = %server, copies, "reaped the holds of a sidecar whose heartbeat expired");
                        self.redis.event("reaped_sidecars", 1);
                        self.redis.event("reaped_copies", *copies);
                    }
                    if reaped.expired_transfers > 0 {
                        self.redis
                            .event("expired_transfers", reaped.expired_transfers);
                    }
                }
                Err(error) => tracing::debug!(%error, "reaper pass failed; next pass retries"),
            }
        }
    }

    async fn hold_lease(&self, id: &str) -> Result<bool, RedisError> {
        let lease = self.redis.key(&keys::reaper_lease_key()).into_owned();
        let ms = millis(self.timings.lease());
        let mut take = redis::cmd("SET");
        take.arg(&lease).arg(id).arg("NX").arg("PX").arg(ms);
        if self.redis.query("reaper_lease", &take).await? == Value::Okay {
            return Ok(true);
        }
        let mut get = redis::cmd("GET");
        get.arg(&lease);
        let holder = self.redis.query("reaper_lease", &get).await?;
        if !matches!(&holder, Value::BulkString(bytes) if bytes == id.as_bytes()) {
            return Ok(false);
        }
        // Two reapers for a moment are harmless: each reap is one atomic
        // script that deletes what it subtracts.
        let mut extend = redis::cmd("PEXPIRE");
        extend.arg(&lease).arg(ms);
        self.redis.query("reaper_lease", &extend).await?;
        Ok(true)
    }

    /// One reaper pass over `configured` and every resource ever held.
    pub async fn reap_once(
        &self,
        own_id: &str,
        configured: Vec<(String, String)>,
    ) -> Result<Reaped, RedisError> {
        let mut resources: HashSet<(String, String)> = configured.into_iter().collect();
        let mut members = redis::cmd("SMEMBERS");
        members.arg(self.redis.key(&keys::copy_index_key()).as_ref());
        for member in strings(self.redis.query("reap_scan", &members).await?) {
            if let Some((namespace, resource)) = keys::parse_copy_index_member(&member) {
                resources.insert((namespace.to_owned(), resource.to_owned()));
            }
        }
        let mut alive: HashMap<String, bool> = HashMap::new();
        let mut reaped = Reaped::default();
        for (namespace, resource) in resources {
            let keys = self.redis.copy_keys(&namespace, &resource);
            let mut contributors = redis::cmd("SMEMBERS");
            contributors.arg(&keys.contributors);
            for member in strings(self.redis.query("reap_scan", &contributors).await?) {
                // `<sidecar id>.<session>`: alive while its sidecar is.
                let server = member
                    .split_once('.')
                    .map_or(member.as_str(), |(server, _)| server)
                    .to_owned();
                if server == own_id {
                    continue;
                }
                let is_alive = match alive.get(&server) {
                    Some(known) => *known,
                    None => {
                        let mut exists = redis::cmd("EXISTS");
                        exists.arg(self.redis.key(&keys::heartbeat_key(&server)).as_ref());
                        let known = self.redis.query("reap_scan", &exists).await? != Value::Int(0);
                        alive.insert(server.clone(), known);
                        known
                    }
                };
                if is_alive {
                    continue;
                }
                let mut invocation = self.invocation(&keys, &member, "reap");
                invocation.arg(member.as_str()).arg(server.as_str());
                let reply = array(self.redis.invoke("reap", &invocation).await?)
                    .map_err(|e| RedisError::Reply(e.to_string()))?;
                let copies = int(reply.get(1)).unwrap_or(0);
                match reaped.servers.iter_mut().find(|(id, _)| *id == server) {
                    Some((_, total)) => *total += copies,
                    None => reaped.servers.push((server, copies)),
                }
            }
            let invocation = self.invocation(&keys, "", "expire");
            let reply = array(self.redis.invoke("expire", &invocation).await?)
                .map_err(|e| RedisError::Reply(e.to_string()))?;
            reaped.expired_transfers += int(reply.get(1)).unwrap_or(0);
        }
        Ok(reaped)
    }
}
