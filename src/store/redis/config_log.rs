//! The configuration log on Redis: one script (`config_log.lua`) per call,
//! on keys that share one hash tag, so that every sidecar on the store sees
//! one ordered log and each write checks its object's version atomically.

use redis::Value;

use crate::store::config_log::{
    Change, ConfigLog, Delta, Expect, LogError, MAX_CHANGES, Object, Snapshot, Write,
};
use crate::store::keys;
use crate::store::redis::{RedisError, RedisStore};

const SCRIPT: &str = include_str!("config_log.lua");

pub struct RedisLog {
    redis: RedisStore,
    script: redis::Script,
    keys: [String; 3],
}

impl From<RedisError> for LogError {
    fn from(error: RedisError) -> Self {
        LogError::Unavailable(error.to_string())
    }
}

impl RedisLog {
    /// On `redis` (a store sharing another's connection, see
    /// [`RedisStore::sharing`]).
    pub fn on(redis: RedisStore) -> Self {
        let keys = keys::config_log_keys().map(|key| redis.key(&key).into_owned());
        Self {
            redis,
            script: redis::Script::new(SCRIPT),
            keys,
        }
    }

    async fn call(&self, operation: &'static str, args: &[&str]) -> Result<Value, LogError> {
        let mut invocation = self.script.prepare_invoke();
        for key in &self.keys {
            invocation.key(key.as_str());
        }
        invocation.arg(operation);
        for arg in args {
            invocation.arg(*arg);
        }
        Ok(self.redis.invoke("config_log", &invocation).await?)
    }
}

#[async_trait::async_trait]
impl ConfigLog for RedisLog {
    async fn version(&self) -> Result<u64, LogError> {
        match self.call("version", &[]).await? {
            Value::Int(version) => Ok(u64::try_from(version).unwrap_or(0)),
            other => Err(unexpected(&other)),
        }
    }

    async fn snapshot(&self) -> Result<Snapshot, LogError> {
        let items = array(self.call("snapshot", &[]).await?)?;
        let mut items = items.into_iter();
        let version = match items.next() {
            Some(Value::Int(version)) => u64::try_from(version).unwrap_or(0),
            other => {
                return Err(LogError::Corrupt(format!(
                    "a snapshot began with {other:?}"
                )));
            }
        };
        let mut snapshot = Snapshot {
            version,
            ..Snapshot::default()
        };
        for item in items {
            let object: Object = decode(&item)?;
            snapshot.objects.insert(object.path.key(), object);
        }
        Ok(snapshot)
    }

    async fn since(&self, version: u64) -> Result<Delta, LogError> {
        let have = version.to_string();
        let items = array(self.call("since", &[&have]).await?)?;
        let mut items = items.into_iter();
        match items.next().as_ref().map(text) {
            Some(Ok(status)) if status == "changes" => Ok(Delta::Changes(
                items.map(|item| decode(&item)).collect::<Result<_, _>>()?,
            )),
            Some(Ok(status)) if status == "snapshot" => Ok(Delta::Snapshot(self.snapshot().await?)),
            other => Err(LogError::Corrupt(format!("`since` answered {other:?}"))),
        }
    }

    async fn write(&self, write: Write) -> Result<Change, LogError> {
        let path = serde_json::to_string(&write.path)
            .map_err(|error| LogError::Corrupt(error.to_string()))?;
        let expect = match write.expect {
            Expect::Any => String::new(),
            Expect::Version(version) => version.to_string(),
        };
        let keep = MAX_CHANGES.to_string();
        let key = write.path.key();
        let has_body = if write.body.is_some() { "1" } else { "0" };
        let body = write.body.as_deref().unwrap_or("");
        let reply = array(
            self.call(
                "write",
                &[&key, &path, &expect, has_body, body, &write.who, &keep],
            )
            .await?,
        )?;
        match reply.first().map(text) {
            Some(Ok(status)) if status == "ok" => match reply.get(1) {
                Some(change) => decode(change),
                None => Err(LogError::Corrupt("a write answered no change".into())),
            },
            Some(Ok(status)) if status == "stale" => match reply.get(1) {
                Some(Value::Int(current)) => Err(LogError::Stale {
                    current: u64::try_from(*current).unwrap_or(0),
                }),
                other => Err(LogError::Corrupt(format!(
                    "a stale write answered {other:?}"
                ))),
            },
            Some(Ok(status)) if status == "missing" => Err(LogError::Missing),
            other => Err(LogError::Corrupt(format!("a write answered {other:?}"))),
        }
    }

    fn is_durable(&self) -> bool {
        true
    }

    fn is_shared(&self) -> bool {
        true
    }
}

fn array(value: Value) -> Result<Vec<Value>, LogError> {
    match value {
        Value::Array(items) => Ok(items),
        other => Err(unexpected(&other)),
    }
}

fn text(value: &Value) -> Result<String, LogError> {
    match value {
        Value::BulkString(bytes) => {
            String::from_utf8(bytes.clone()).map_err(|error| LogError::Corrupt(error.to_string()))
        }
        Value::SimpleString(text) => Ok(text.clone()),
        other => Err(unexpected(other)),
    }
}

fn decode<T: serde::de::DeserializeOwned>(value: &Value) -> Result<T, LogError> {
    serde_json::from_str(&text(value)?).map_err(|error| LogError::Corrupt(error.to_string()))
}

fn unexpected(value: &Value) -> LogError {
    LogError::Corrupt(format!("unexpected reply {value:?}"))
}
