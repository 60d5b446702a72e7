//! How the Redis store behaves: its deadline, local rejection, key prefix
//! and TLS material. Secrets never reach `Debug`.

use std::sync::Arc;
use std::time::Duration;

use crate::clock::Clock;

/// How the Redis store behaves.
#[derive(Clone)]
pub struct RedisOptions {
    /// The deadline of one decision, connection included.
    pub timeout: Duration,
    /// Reject locally keys known to be over (on by default).
    pub local_rejections: bool,
    /// Tests only: decide at this clock's time instead of Redis `TIME`.
    pub injected_clock: Option<Arc<dyn Clock>>,
    /// Tests only: this process's own clock, for what it computes before
    /// asking (a calendar window's boundaries), when it is not the store's
    /// (sidecars whose clocks differ from Redis's and from each other).
    pub local_clock: Option<Arc<dyn Clock>>,
    /// Before every key (`--store-key-prefix`).
    pub key_prefix: crate::store::keys::KeyPrefix,
    /// `rediss://`: a CA and a client certificate of our own.
    pub tls: Option<StoreTls>,
    /// The sentinels' own password (`requirepass` or the `default` ACL user
    /// of the sentinels), for `redis+sentinel://`.
    pub sentinel_password: Option<String>,
    /// Told how long each call to Redis took (the sidecar's latency
    /// histogram); `None` costs nothing.
    pub observer: Option<CallObserver>,
    /// Told of the copy log's membership events (the sidecar's counters).
    pub events: Option<EventObserver>,
}

/// Told, after each call to Redis, which operation it was (`decide`,
/// `reserve`, `heartbeat`…), how long it took, and whether it succeeded.
pub type CallObserver = Arc<dyn Fn(&'static str, Duration, bool) + Send + Sync>;

/// Told of the copy log's membership events and how many: `registered`,
/// `resigned`, `reaped_sidecars`, `reaped_copies`, `expired_transfers`.
pub type EventObserver = Arc<dyn Fn(&'static str, u64) + Send + Sync>;

/// `--store-ca`, `--store-tls-cert`, `--store-tls-key`: for `rediss://`, the
/// CA to trust instead of the system's roots, and a client certificate for
/// a Redis that asks for one (`tls-auth-clients yes`, its default). PEM.
#[derive(Clone, Default)]
pub struct StoreTls {
    pub ca: Option<Vec<u8>>,
    /// (certificate chain, private key).
    pub client: Option<(Vec<u8>, Vec<u8>)>,
}

impl std::fmt::Debug for StoreTls {
    // Never the key itself.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StoreTls")
            .field("ca", &self.ca.is_some())
            .field("client", &self.client.is_some())
            .finish()
    }
}

impl StoreTls {
    pub(super) fn certificates(&self) -> redis::TlsCertificates {
        redis::TlsCertificates {
            client_tls: self
                .client
                .as_ref()
                .map(|(cert, key)| redis::ClientTlsConfig {
                    client_cert: cert.clone(),
                    client_key: key.clone(),
                }),
            root_cert: self.ca.clone(),
        }
    }
}

impl Default for RedisOptions {
    fn default() -> Self {
        Self {
            timeout: Duration::from_millis(50),
            local_rejections: true,
            injected_clock: None,
            local_clock: None,
            key_prefix: crate::store::keys::KeyPrefix::default(),
            tls: None,
            sentinel_password: None,
            observer: None,
            events: None,
        }
    }
}

impl std::fmt::Debug for RedisOptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisOptions")
            .field("timeout", &self.timeout)
            .field("local_rejections", &self.local_rejections)
            .field("injected_clock", &self.injected_clock.is_some())
            .field("key_prefix", &self.key_prefix.as_str())
            .field("tls", &self.tls.is_some())
            .field("sentinel_password", &self.sentinel_password.is_some())
            .field("observer", &self.observer.is_some())
            .field("events", &self.events.is_some())
            .finish()
    }
}
