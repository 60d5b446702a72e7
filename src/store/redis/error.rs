//! What can go wrong between the sidecar and Redis, and how each failure
//! reads to the rest of the sidecar: a refusal (wrong credentials, missing
//! permissions) is a misconfiguration, everything else an outage.

use crate::store::StoreError;

/// What can go wrong between the sidecar and Redis.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RedisError {
    #[error("invalid Redis URL {0}")]
    Url(String),
    #[error("the Redis store must be opened inside a Tokio runtime")]
    NoRuntime,
    /// Redis refused this request (a script error, a key of another type):
    /// Redis itself is fine.
    #[error("Redis: {0}")]
    Redis(String),
    /// Redis cannot be reached or cannot serve (connection, failover, loading).
    #[error("Redis unreachable: {0}")]
    Unreachable(String),
    /// Redis refused Charon's credentials or permissions (`WRONGPASS`,
    /// `NOAUTH`, `NOPERM`): a misconfiguration, not an outage.
    #[error("Redis refused Charon's credentials: {0}")]
    Refused(String),
    /// The login worked, but the ACL user lacks a permission (`NOPERM`).
    #[error("Redis denies Charon's ACL user a permission: {0}")]
    Forbidden(String),
    #[error("Redis did not answer within {0} ms")]
    Timeout(u64),
    #[error("unexpected reply from the Charon script: {0}")]
    Reply(String),
    #[error("a key holds state Charon cannot read: {0}")]
    State(String),
    /// The Redis records a state layout newer than this build reads: a
    /// newer Charon wrote it. Deciding on it could be wrong, so nothing is.
    #[error(
        "the Redis state is format {found}, written by a newer Charon; this one reads format {known} at most: upgrade this sidecar, or give it another Redis or --store-key-prefix"
    )]
    NewerState { found: String, known: u64 },
}

impl From<redis::RedisError> for RedisError {
    fn from(error: redis::RedisError) -> Self {
        if error.kind() == redis::ErrorKind::AuthenticationFailed {
            return RedisError::Refused(error.to_string());
        }
        // Only errors about this request leave Redis counted as healthy.
        match error.code() {
            Some("ERR" | "WRONGTYPE" | "NOSCRIPT") => RedisError::Redis(error.to_string()),
            Some("WRONGPASS" | "NOAUTH") => RedisError::Refused(error.to_string()),
            Some("NOPERM") => RedisError::Forbidden(error.to_string()),
            _ => RedisError::Unreachable(error.to_string()),
        }
    }
}

impl RedisError {
    /// Whether this says Redis is away, rather than that one request failed.
    /// A login refused or a permission denied: a misconfiguration.
    pub fn is_refusal(&self) -> bool {
        matches!(
            self,
            RedisError::Refused(_) | RedisError::Forbidden(_) | RedisError::NewerState { .. }
        )
    }

    pub fn is_outage(&self) -> bool {
        matches!(self, RedisError::Unreachable(_) | RedisError::Timeout(_))
    }
}

impl From<RedisError> for StoreError {
    fn from(error: RedisError) -> Self {
        match error {
            RedisError::Timeout(ms) => StoreError::Timeout(ms),
            other => StoreError::Unavailable(other.to_string()),
        }
    }
}
