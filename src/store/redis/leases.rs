//! Leases on Redis: the engine decides in the sidecar on the state Redis
//! holds, at Redis's time, and the result is written back only if the state
//! did not change in between (`leases.lua`); on a conflict the step is run
//! again on the new state, after a short random pause. So every sidecar on
//! one Redis apportions one pool, and no two steps interleave. Within one
//! sidecar steps take turns (renewals are rare: one per client per refresh
//! interval), so conflicts only come from other sidecars.

use redis::Value;

use crate::engine::capacity::{self, CapacityConfig, Lease, LeaseState, Want};
use crate::store::keys;
use crate::store::leases::{LeaseError, LeaseKey, LeaseLog, LeaseSpace, LiveClient, Usage};
use crate::store::redis::{RedisError, RedisStore};

const SCRIPT: &str = include_str!("leases.lua");

/// Steps retried on conflicting writes before giving up (each conflict is
/// another sidecar's step succeeding, so this is contention, not an outage).
const ATTEMPTS: usize = 32;

pub struct RedisLeases {
    redis: RedisStore,
    script: redis::Script,
    /// One step at a time from this sidecar.
    turns: tokio::sync::Mutex<()>,
}

impl From<RedisError> for LeaseError {
    fn from(error: RedisError) -> Self {
        LeaseError::Unavailable(error.to_string())
    }
}

impl RedisLeases {
    /// On `redis` (a store sharing another's connection, see
    /// [`RedisStore::sharing`]).
    pub fn on(redis: RedisStore) -> Self {
        Self {
            redis,
            script: redis::Script::new(SCRIPT),
            turns: tokio::sync::Mutex::new(()),
        }
    }

    fn key(&self, at: LeaseKey<'_>) -> String {
        self.redis.key(&redis_key(at)).into_owned()
    }

    /// The state of `key` as read (`""` when none), parsed, and Redis's time.
    async fn load(&self, key: &str) -> Result<(String, Option<LeaseState>, u64), LeaseError> {
        let mut load = self.script.prepare_invoke();
        load.key(key).arg("load");
        let (read, now) = match self.redis.invoke("lease_load", &load).await? {
            Value::Array(items) => match items.as_slice() {
                [Value::BulkString(bytes), Value::Int(now)] => (
                    String::from_utf8_lossy(bytes).into_owned(),
                    u64::try_from(*now).unwrap_or(0),
                ),
                other => return Err(unexpected(other)),
            },
            other => return Err(unexpected(&other)),
        };
        let state = if read.is_empty() {
            None
        } else {
            Some(serde_json::from_str(&read).map_err(|error| {
                LeaseError::Unavailable(format!("unreadable lease state: {error}"))
            })?)
        };
        Ok((read, state, now))
    }

    /// Reads the state and Redis's time, runs `decide`, and writes its
    /// result back (`None`: delete) if nothing changed meanwhile.
    async fn step(
        &self,
        at: LeaseKey<'_>,
        ttl_ms: u64,
        mut decide: impl FnMut(Option<LeaseState>, u64) -> Result<Option<LeaseState>, LeaseError>,
    ) -> Result<(), LeaseError> {
        let key = self.key(at);
        let _turn = self.turns.lock().await;
        for attempt in 0..ATTEMPTS {
            if attempt > 0 {
                // Another sidecar wrote first: let it finish its turn.
                let mut jitter = [0u8; 1];
                let _ = getrandom::fill(&mut jitter);
                tokio::time::sleep(std::time::Duration::from_micros(
                    200 + u64::from(jitter[0]) * 8,
                ))
                .await;
            }
            let (read, state, now) = self.load(&key).await?;
            let next = decide(state, now)?;
            let written = match &next {
                Some(state) => serde_json::to_string(state)
                    .map_err(|error| LeaseError::Unavailable(error.to_string()))?,
                None => String::new(),
            };
            let mut store = self.script.prepare_invoke();
            store
                .key(key.as_str())
                .arg("store")
                .arg(read.as_str())
                .arg(written.as_str())
                .arg(ttl_ms.max(1));
            match self.redis.invoke("lease_store", &store).await? {
                Value::Int(1) => return Ok(()),
                Value::Int(_) => continue,
                other => return Err(unexpected(&other)),
            }
        }
        Err(LeaseError::Unavailable(format!(
            "the lease state kept changing: {ATTEMPTS} attempts conflicted"
        )))
    }
}

#[async_trait::async_trait]
impl LeaseLog for RedisLeases {
    async fn get(
        &self,
        at: LeaseKey<'_>,
        config: &CapacityConfig,
        client: &str,
        want: Want,
    ) -> Result<Lease, LeaseError> {
        let mut answer = None;
        self.step(at, ttl(config), |state, now| {
            let mut state = state.unwrap_or_else(|| LeaseState::new(now));
            answer = Some(capacity::request_want(
                config, &mut state, client, want, now,
            )?);
            Ok(Some(state))
        })
        .await?;
        answer.ok_or_else(|| LeaseError::Unavailable("no lease was decided".into()))
    }

    async fn release(&self, at: LeaseKey<'_>, client: &str) -> Result<bool, LeaseError> {
        let mut released = false;
        // What is left keeps the time to live it had been given (a day at
        // most is plenty: leases expire long before).
        self.step(at, DAY_MS, |state, now| {
            let Some(mut state) = state else {
                released = false;
                return Ok(None);
            };
            released = capacity::release(&mut state, client);
            capacity::expire(&mut state, now);
            Ok((!state.clients.is_empty()).then_some(state))
        })
        .await?;
        Ok(released)
    }

    /// The clients other than `except` to nudge about `at` under `config`
    /// ([`capacity::to_nudge`]): one read.
    async fn to_nudge(
        &self,
        at: LeaseKey<'_>,
        config: &CapacityConfig,
        except: &str,
    ) -> Result<Vec<String>, LeaseError> {
        let (_, state, now) = self.load(&self.key(at)).await?;
        Ok(state.map_or_else(Vec::new, |state| {
            capacity::to_nudge(config, &state, except, now)
                .into_iter()
                .map(str::to_owned)
                .collect()
        }))
    }

    /// The clients with a live lease of `at`: one read, nothing written.
    async fn clients(&self, at: LeaseKey<'_>) -> Result<Vec<LiveClient>, LeaseError> {
        let (_, state, now) = self.load(&self.key(at)).await?;
        Ok(state.map_or_else(Vec::new, |state| {
            crate::store::leases::live_clients(&state, now)
        }))
    }

    /// What the live leases of `at` want and hold, in all: one read,
    /// nothing written.
    async fn usage(&self, at: LeaseKey<'_>) -> Result<Usage, LeaseError> {
        let (_, state, now) = self.load(&self.key(at)).await?;
        Ok(state.map_or(Usage::default(), |state| Usage::of(&state, now)))
    }
}

const DAY_MS: u64 = 86_400_000;

/// How long a state outlives its last step: every lease in it has expired
/// by then, and a client returning later is in a new learning period.
fn ttl(config: &CapacityConfig) -> u64 {
    config
        .lease_ms
        .saturating_mul(2)
        .saturating_add(config.learning_ms)
        .min(DAY_MS)
}

fn unexpected(value: &(impl std::fmt::Debug + ?Sized)) -> LeaseError {
    LeaseError::Unavailable(format!("unexpected reply {value:?}"))
}

/// The Redis key of a lease state (before the store's prefix), typed by
/// its space's letter. A capacity's is the one every lease had before there
/// were spaces, so that its state on Redis survives an upgrade.
fn redis_key(key: LeaseKey<'_>) -> String {
    let letter = match key.space {
        LeaseSpace::Capacity => 'l',
        LeaseSpace::GlobalLimit => 'G',
        LeaseSpace::RlqsBucket => 'Q',
    };
    keys::lease_key(letter, key.at.namespace, key.at.resource, key.at.domain)
}
