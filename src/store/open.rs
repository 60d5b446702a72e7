//! The stores `--store` selects, for the sidecar and the embedded engine
//! alike: every family of state opened together ([`Stores`]), on one Redis
//! client when on Redis; and the rate store ([`SidecarStore`]): the embedded
//! memory store, or Redis behind its failover (breaker and
//! `--on-store-error`), one enum so the servers are compiled once and
//! dispatch statically.

use std::time::Duration;

use std::sync::Arc;

use crate::engine::Decision;
#[cfg(feature = "redis")]
use crate::engine::Slot;
use crate::store::copies::{CopyLog, CopyTimings};
use crate::store::keys::KeyPrefix;
use crate::store::learn::LearnLog;
use crate::store::leases::LeaseLog;
use crate::store::{
    Batch, MemoryCopies, MemoryLearn, MemoryLeases, MemoryStats, MemoryStore, OnStoreError, Store,
    StoreError,
};
#[cfg(feature = "redis")]
use crate::store::{
    Failover, FailoverStats, RedisCopies, RedisError, RedisLearn, RedisLeases, RedisOptions,
    RedisStore, SlotKey,
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
    #[cfg(feature = "redis")]
    /// `rediss://` with a CA and a client certificate of our own.
    pub tls: Option<crate::store::StoreTls>,
    #[cfg(feature = "redis")]
    /// The sentinels' own password.
    pub sentinel_password: Option<String>,
    #[cfg(feature = "redis")]
    /// Told the latency of every Redis call (the sidecar's histogram).
    pub observer: Option<crate::store::redis::CallObserver>,
    #[cfg(feature = "redis")]
    /// Told of the copy log's membership events (the sidecar's counters).
    pub events: Option<crate::store::redis::EventObserver>,
}

impl std::fmt::Debug for StoreOptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let mut debug = f.debug_struct("StoreOptions");
        debug
            .field("url", &redact(&self.url))
            .field("timeout", &self.timeout)
            .field("on_error", &self.on_error)
            .field("max_keys", &self.max_keys)
            .field("key_prefix", &self.key_prefix);
        #[cfg(feature = "redis")]
        debug
            .field("tls", &self.tls)
            .field(
                "sentinel_password",
                &self.sentinel_password.as_ref().map(|_| "***"),
            )
            .field("observer", &self.observer.is_some())
            .field("events", &self.events.is_some());
        debug.finish()
    }
}

/// `url` without its password.
#[cfg(feature = "redis")]
fn redact(url: &str) -> String {
    crate::store::redis::url::redact(url)
}

/// `url` without its password: a build without Redis knows no URL but
/// `memory`, so whatever else it was given is not shown.
#[cfg(not(feature = "redis"))]
fn redact(url: &str) -> String {
    if url == "memory" { url } else { "***" }.to_owned()
}

impl Default for StoreOptions {
    fn default() -> Self {
        Self {
            url: "memory".into(),
            timeout: Duration::from_millis(50),
            on_error: OnStoreError::default(),
            max_keys: crate::store::DEFAULT_MAX_KEYS,
            key_prefix: KeyPrefix::default(),
            #[cfg(feature = "redis")]
            tls: None,
            #[cfg(feature = "redis")]
            sentinel_password: None,
            #[cfg(feature = "redis")]
            observer: None,
            #[cfg(feature = "redis")]
            events: None,
        }
    }
}

/// How long a starting sidecar waits for Redis before serving without it.
#[cfg(feature = "redis")]
const SETTLE_LIMIT: Duration = Duration::from_secs(2);

pub enum SidecarStore {
    Memory(MemoryStore),
    #[cfg(feature = "redis")]
    Redis(Failover),
}

/// What `/metrics` and `/readyz` show about the store.
#[derive(Debug, Clone)]
pub struct StoreStatus {
    /// The memory store: the store itself, or Redis's local fallback.
    pub memory: MemoryStats,
    #[cfg(feature = "redis")]
    pub redis: Option<FailoverStats>,
    pub on_error: Option<OnStoreError>,
    /// Why Redis refuses the sidecar's credentials, while it does.
    pub refusal: Option<String>,
}

/// Every family of state `--store` selects: rate limits, the copy log,
/// capacity leases and recorded use (and, for an engine on configuration
/// files, the configuration API's log, [`Stores::config_log`]). On Redis they share one
/// client and its one multiplexed connection
/// (docs/redis.md#what-each-family-keeps). Copy operations and leases have
/// no `--on-store-error` fallback: a semaphore split across sidecars would
/// overcommit, so while Redis is unreachable they answer STORE_UNAVAILABLE
/// and the client fails open (docs/design.md#failover).
pub struct Stores {
    pub rate: SidecarStore,
    pub copies: Arc<dyn CopyLog>,
    pub leases: Box<dyn LeaseLog>,
    /// Recorded use, for proposing limits (`settings.learn`).
    pub learn: Arc<dyn LearnLog>,
}

impl Stores {
    /// Every family in this process, the rate store holding at most
    /// `max_keys` keys: what `--store memory` opens.
    pub fn memory(max_keys: usize) -> Self {
        Self {
            rate: SidecarStore::Memory(MemoryStore::new().with_max_keys(max_keys)),
            copies: Arc::new(MemoryCopies::new()),
            leases: Box::new(MemoryLeases::new()),
            learn: Arc::new(MemoryLearn::new()),
        }
    }

    /// Opens them on `options.url` (lazily: a Redis not there yet is an
    /// error per call, not here). Call inside a Tokio runtime for Redis.
    pub fn open(options: &StoreOptions, timings: CopyTimings) -> Result<Self, OpenError> {
        if options.url == "memory" {
            return Ok(Self::memory(options.max_keys));
        }
        #[cfg(not(feature = "redis"))]
        {
            let _ = timings;
            Err(OpenError::NoRedis(redact(&options.url)))
        }
        #[cfg(feature = "redis")]
        Ok(Self::redis(options, timings)?)
    }

    /// Every family on the Redis `options.url` names, sharing one client.
    #[cfg(feature = "redis")]
    fn redis(options: &StoreOptions, timings: CopyTimings) -> Result<Self, RedisError> {
        let memory = MemoryStore::new().with_max_keys(options.max_keys);
        let redis = RedisStore::open(&options.url, redis_options(options))?;
        let copies = RedisCopies::on(
            redis.sharing(RedisOptions {
                events: options.events.clone(),
                ..redis_options(options)
            }),
            timings,
        );
        let leases = RedisLeases::on(redis.sharing(redis_options(options)));
        let learn = RedisLearn::on(redis.sharing(redis_options(options)));
        Ok(Self {
            rate: SidecarStore::Redis(Failover::new(redis, options.on_error, memory)),
            copies: Arc::new(copies),
            leases: Box::new(leases),
            learn: Arc::new(learn),
        })
    }

    /// The configuration API's log on the same store: in this process (kept
    /// in `state_file` when one is given), or on the rate store's Redis
    /// connection.
    pub fn config_log(
        &self,
        options: &StoreOptions,
        state_file: Option<&std::path::Path>,
    ) -> Result<Box<dyn crate::store::config_log::ConfigLog>, ConfigLogError> {
        use crate::store::MemoryLog;
        #[cfg(not(feature = "redis"))]
        let _ = options;
        match &self.rate {
            SidecarStore::Memory(_) => Ok(Box::new(match state_file {
                Some(file) => MemoryLog::with_file(file)?,
                None => MemoryLog::new(),
            })),
            #[cfg(feature = "redis")]
            SidecarStore::Redis(_) if state_file.is_some() => {
                Err(ConfigLogError::StateFileWithRedis)
            }
            #[cfg(feature = "redis")]
            SidecarStore::Redis(failover) => Ok(Box::new(crate::store::RedisLog::on(
                failover.redis().sharing(redis_options(options)),
            ))),
        }
    }
}

#[cfg(feature = "redis")]
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

/// Why `--store` cannot be opened.
#[derive(Debug, thiserror::Error)]
pub enum OpenError {
    #[cfg(feature = "redis")]
    #[error(transparent)]
    Redis(#[from] RedisError),
    /// Not `memory`, in a build without the Redis store.
    #[error(
        "--store {0}: this build has no Redis store (the `redis` feature is off); use `memory`"
    )]
    NoRedis(String),
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
    #[cfg(feature = "redis")]
    #[error(transparent)]
    Redis(#[from] RedisError),
}

impl SidecarStore {
    /// Gives Redis a moment to answer before the sidecar says it is ready;
    /// past it, the sidecar serves by its policy until Redis answers.
    pub async fn settle(&self) {
        #[cfg(feature = "redis")]
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
            #[cfg(feature = "redis")]
            SidecarStore::Redis(failover) => failover.local(),
        }
    }

    /// The state of `keys` now, without changing it, and that "now". While
    /// Redis is unreachable with `--on-store-error local`, the in-process
    /// store the sidecar decides on then is read (`true`: the fallback's).
    #[cfg(feature = "redis")]
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
        let status = StoreStatus {
            memory: self.memory().stats(),
            #[cfg(feature = "redis")]
            redis: None,
            on_error: None,
            refusal: None,
        };
        match self {
            SidecarStore::Memory(_) => status,
            #[cfg(feature = "redis")]
            SidecarStore::Redis(failover) => StoreStatus {
                redis: Some(failover.stats()),
                on_error: Some(failover.policy()),
                refusal: failover.refusal(),
                ..status
            },
        }
    }
}

impl Store for SidecarStore {
    async fn decide(&self, batch: Batch<'_>) -> Result<Decision, StoreError> {
        match self {
            SidecarStore::Memory(memory) => memory.decide(batch).await,
            // Boxed: the Redis path's future is large, and every memory
            // decision would otherwise move it around.
            #[cfg(feature = "redis")]
            SidecarStore::Redis(failover) => Box::pin(failover.decide(batch)).await,
        }
    }

    fn name(&self) -> &'static str {
        match self {
            SidecarStore::Memory(memory) => memory.name(),
            #[cfg(feature = "redis")]
            SidecarStore::Redis(failover) => failover.name(),
        }
    }

    fn local_now_ms(&self) -> u64 {
        match self {
            SidecarStore::Memory(memory) => memory.local_now_ms(),
            #[cfg(feature = "redis")]
            SidecarStore::Redis(failover) => failover.local_now_ms(),
        }
    }

    fn decides_now(&self) -> bool {
        matches!(self, SidecarStore::Memory(_))
    }

    fn decide_now(&self, batch: Batch<'_>) -> Option<Decision> {
        match self {
            SidecarStore::Memory(memory) => memory.decide_now(batch),
            #[cfg(feature = "redis")]
            SidecarStore::Redis(_) => None,
        }
    }
}
