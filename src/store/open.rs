//! The stores `--store` selects, for the sidecar and the embedded engine
//! alike: every family of state opened together ([`Stores`]), on one Redis
//! client when on Redis; and the rate store ([`SidecarStore`]): the embedded
//! memory store, or Redis behind its failover (breaker and
//! `--on-store-error`), one enum so the servers are compiled once and
//! dispatch statically.

use std::time::Duration;

use std::sync::Arc;

use crate::engine::{Decision, Slot};
use crate::store::copies::{CopyStore, CopyTimings, MemoryCopies, RedisCopies};
use crate::store::keys::KeyPrefix;
use crate::store::leases::{LeaseStore, MemoryLeases, RedisLeases};
use crate::store::{
    Batch, Failover, FailoverStats, MemoryStats, MemoryStore, OnStoreError, RedisError,
    RedisOptions, RedisStore, SlotKey, Store, StoreError,
};

/// `--store`, `--store-timeout`, `--on-store-error`, `--max-keys` and the
/// store's secrets (never in `Debug`).
#[derive(Clone)]
pub struct StoreOptions {
    /// `memory` or a Redis URL.
    pub url: String,
    pub timeout: Duration,
    pub on_error: OnStoreError,
    /// The memory store's cap on keys (the fallback's, with Redis).
    pub max_keys: usize,
    /// Before every Redis key, so fleets can share one Redis.
    pub key_prefix: KeyPrefix,
    /// `rediss://` with a CA and a client certificate of our own.
    pub tls: Option<crate::store::StoreTls>,
    /// The sentinels' own password.
    pub sentinel_password: Option<String>,
    /// Told the latency of every Redis call (the sidecar's histogram).
    pub observer: Option<crate::store::redis::CallObserver>,
    /// Told of the copy log's membership events (the sidecar's counters).
    pub events: Option<crate::store::redis::EventObserver>,
}

impl std::fmt::Debug for StoreOptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StoreOptions")
            .field("url", &crate::store::redis::url::redact(&self.url))
            .field("timeout", &self.timeout)
            .field("on_error", &self.on_error)
            .field("max_keys", &self.max_keys)
            .field("key_prefix", &self.key_prefix)
            .field("tls", &self.tls)
            .field(
                "sentinel_password",
                &self.sentinel_password.as_ref().map(|_| "***"),
            )
            .field("observer", &self.observer.is_some())
            .field("events", &self.events.is_some())
            .finish()
    }
}

impl Default for StoreOptions {
    fn default() -> Self {
        Self {
            url: "memory".into(),
            timeout: Duration::from_millis(50),
            on_error: OnStoreError::default(),
            max_keys: crate::store::DEFAULT_MAX_KEYS,
            key_prefix: KeyPrefix::default(),
            tls: None,
            sentinel_password: None,
            observer: None,
            events: None,
        }
    }
}

/// How long a starting sidecar waits for Redis before serving without it.
const SETTLE_LIMIT: Duration = Duration::from_secs(2);

pub enum SidecarStore {
    Memory(MemoryStore),
    Redis(Failover),
}

/// What `/metrics` and `/readyz` show about the store.
#[derive(Debug, Clone)]
pub struct StoreStatus {
    /// The memory store: the store itself, or Redis's local fallback.
    pub memory: MemoryStats,
    pub redis: Option<FailoverStats>,
    pub on_error: Option<OnStoreError>,
    /// Why Redis refuses the sidecar's credentials, while it does.
    pub refusal: Option<String>,
}

/// Every family of state `--store` selects: rate limits, the copy log and
/// capacity leases (and, for an engine on configuration files, the
/// configuration API's log, [`Stores::config_log`]). On Redis they share one
/// client and its one multiplexed connection
/// (docs/redis.md#what-each-family-keeps). Copy operations and leases have
/// no `--on-store-error` fallback: a semaphore split across sidecars would
/// overcommit, so while Redis is unreachable they answer STORE_UNAVAILABLE
/// and the client fails open (docs/design.md#failover).
pub struct Stores {
    pub rate: SidecarStore,
    pub copies: CopyStore,
    pub leases: LeaseStore,
}

impl Stores {
    /// Opens them on `options.url` (lazily: a Redis not there yet is an
    /// error per call, not here). Call inside a Tokio runtime for Redis.
    pub fn open(options: &StoreOptions, timings: CopyTimings) -> Result<Self, RedisError> {
        let memory = MemoryStore::new().with_max_keys(options.max_keys);
        if options.url == "memory" {
            return Ok(Self {
                rate: SidecarStore::Memory(memory),
                copies: CopyStore::Memory(MemoryCopies::new()),
                leases: LeaseStore::Memory(MemoryLeases::new()),
            });
        }
        let redis = RedisStore::open(&options.url, redis_options(options))?;
        let copies = RedisCopies::on(
            redis.sharing(RedisOptions {
                events: options.events.clone(),
                ..redis_options(options)
            }),
            timings,
        );
        let leases = RedisLeases::on(redis.sharing(redis_options(options)));
        Ok(Self {
            rate: SidecarStore::Redis(Failover::new(redis, options.on_error, memory)),
            copies: CopyStore::Redis(Arc::new(copies)),
            leases: LeaseStore::Redis(Box::new(leases)),
        })
    }

    /// The configuration API's log on the same store: in this process (kept
    /// in `state_file` when one is given), or on the rate store's Redis
    /// connection.
    pub fn config_log(
        &self,
        options: &StoreOptions,
        state_file: Option<&std::path::Path>,
    ) -> Result<crate::store::config_log::ConfigLog, ConfigLogError> {
        use crate::store::config_log::{ConfigLog, MemoryLog, RedisLog};
        match &self.rate {
            SidecarStore::Memory(_) => Ok(ConfigLog::Memory(match state_file {
                Some(file) => MemoryLog::with_file(file)?,
                None => MemoryLog::new(),
            })),
            SidecarStore::Redis(_) if state_file.is_some() => {
                Err(ConfigLogError::StateFileWithRedis)
            }
            SidecarStore::Redis(failover) => Ok(ConfigLog::Redis(Box::new(RedisLog::on(
                failover.redis().sharing(redis_options(options)),
            )))),
        }
    }
}

fn redis_options(options: &StoreOptions) -> RedisOptions {
    RedisOptions {
        timeout: options.timeout,
        key_prefix: options.key_prefix.clone(),
        tls: options.tls.clone(),
        sentinel_password: options.sentinel_password.clone(),
        observer: options.observer.clone(),
        ..RedisOptions::default()
    }
}

/// Why the configuration API's log cannot be opened.
#[derive(Debug, thiserror::Error)]
pub enum ConfigLogError {
    #[error(
        "--config-state is for the memory store; on Redis the configuration API's changes live in Redis"
    )]
    StateFileWithRedis,
    #[error(transparent)]
    Log(#[from] crate::store::config_log::LogError),
    #[error(transparent)]
    Redis(#[from] RedisError),
}

impl SidecarStore {
    /// Gives Redis a moment to answer before the sidecar says it is ready;
    /// past it, the sidecar serves by its policy until Redis answers.
    pub async fn settle(&self) {
        if let SidecarStore::Redis(failover) = self
            && !failover.wait_reachable(SETTLE_LIMIT).await
            // A refusal has said so itself, as an error.
            && failover.refusal().is_none()
        {
            tracing::warn!(
                policy = failover.policy().as_str(),
                "store not reachable yet: answering by policy until it is"
            );
        }
    }

    /// The in-process store, to sweep.
    pub fn memory(&self) -> &MemoryStore {
        match self {
            SidecarStore::Memory(memory) => memory,
            SidecarStore::Redis(failover) => failover.local(),
        }
    }

    /// The state of `keys` now, without changing it, and that "now". While
    /// Redis is unreachable with `--on-store-error local`, the in-process
    /// store the sidecar decides on then is read (`true`: the fallback's).
    pub async fn peek(&self, keys: &[SlotKey]) -> Result<(Vec<Slot>, u64, bool), RedisError> {
        match self {
            SidecarStore::Memory(memory) => {
                let (slots, now) = memory.peek(keys);
                Ok((slots, now, false))
            }
            SidecarStore::Redis(failover) => {
                let local = failover.policy() == OnStoreError::Local;
                // While the breaker is open, decisions are local: show those.
                if local && !failover.stats().reachable {
                    let (slots, now) = failover.local().peek(keys);
                    return Ok((slots, now, true));
                }
                match failover.redis().peek(keys).await {
                    Ok((slots, now)) => Ok((slots, now, false)),
                    Err(error) if local && error.is_outage() => {
                        let (slots, now) = failover.local().peek(keys);
                        Ok((slots, now, true))
                    }
                    Err(error) => Err(error),
                }
            }
        }
    }

    pub fn status(&self) -> StoreStatus {
        let (redis, on_error, refusal) = match self {
            SidecarStore::Memory(_) => (None, None, None),
            SidecarStore::Redis(failover) => (
                Some(failover.stats()),
                Some(failover.policy()),
                failover.refusal(),
            ),
        };
        StoreStatus {
            memory: self.memory().stats(),
            redis,
            on_error,
            refusal,
        }
    }
}

impl Store for SidecarStore {
    async fn decide(&self, batch: Batch<'_>) -> Result<Decision, StoreError> {
        match self {
            SidecarStore::Memory(memory) => memory.decide(batch).await,
            // Boxed: the Redis path's future is large, and every memory
            // decision would otherwise move it around.
            SidecarStore::Redis(failover) => Box::pin(failover.decide(batch)).await,
        }
    }

    fn name(&self) -> &'static str {
        match self {
            SidecarStore::Memory(memory) => memory.name(),
            SidecarStore::Redis(failover) => failover.name(),
        }
    }

    fn local_now_ms(&self) -> u64 {
        match self {
            SidecarStore::Memory(memory) => memory.local_now_ms(),
            SidecarStore::Redis(failover) => failover.local_now_ms(),
        }
    }

    fn decides_now(&self) -> bool {
        matches!(self, SidecarStore::Memory(_))
    }

    fn decide_now(&self, batch: Batch<'_>) -> Option<Decision> {
        match self {
            SidecarStore::Memory(memory) => memory.decide_now(batch),
            SidecarStore::Redis(_) => None,
        }
    }
}
