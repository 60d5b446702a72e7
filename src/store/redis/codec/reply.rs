//! The script's reply back into a [`Reply`]: the table `{now, granted,
//! before...}` of `decide.lua` and the batch forms, or the one-item form's
//! string (`codec.rs` says why it has one).

use redis::Value;

use super::super::RedisError;

/// What the script answered.
#[derive(Debug)]
pub struct Reply {
    pub now: u64,
    pub granted: bool,
    /// The state each key held before the decision, as the script read it.
    pub before: Vec<Option<Vec<u8>>>,
}

fn integer(value: &Value) -> Result<i64, RedisError> {
    match value {
        Value::Int(n) => Ok(*n),
        other => Err(RedisError::Reply(format!(
            "expected an integer, got {other:?}"
        ))),
    }
}

/// Parses `{now, granted, before...}`, or the one-item form's
/// `"granted clock value"`.
pub fn reply(value: Value, keys: usize) -> Result<Reply, RedisError> {
    if let Value::BulkString(text) = &value
        && keys == 1
    {
        return one_item_reply(text);
    }
    let Value::Array(values) = value else {
        return Err(RedisError::Reply(format!(
            "expected an array, got {value:?}"
        )));
    };
    if values.len() != keys + 2 {
        return Err(RedisError::Reply(format!(
            "expected {} values, got {}",
            keys + 2,
            values.len()
        )));
    }
    let mut values = values.into_iter();
    let mut next = || values.next().unwrap_or(Value::Nil);
    let now =
        u64::try_from(integer(&next())?).map_err(|_| RedisError::Reply("negative time".into()))?;
    let granted = integer(&next())? == 1;
    let before = (0..keys)
        .map(|_| match next() {
            Value::Nil => Ok(None),
            Value::BulkString(bytes) => Ok(Some(bytes)),
            Value::SimpleString(text) => Ok(Some(text.into_bytes())),
            other => Err(RedisError::Reply(format!(
                "expected a value, got {other:?}"
            ))),
        })
        .collect::<Result<_, _>>()?;
    Ok(Reply {
        now,
        granted,
        before,
    })
}

/// `"granted clock value"`: granted `1` or `0`; the clock Redis `TIME`'s
/// `seconds.micros` (now is its millisecond, as the script counts it) or an
/// injected time in ms; the value the key held, empty for none.
fn one_item_reply(text: &[u8]) -> Result<Reply, RedisError> {
    let malformed = || {
        RedisError::Reply(format!(
            "expected \"granted clock value\", got {:?}",
            String::from_utf8_lossy(text)
        ))
    };
    let Fields {
        verdicts: granted,
        now,
        before,
    } = verdicts_clock_value(text).ok_or_else(malformed)?;
    let granted = match granted {
        b"1" => true,
        b"0" => false,
        _ => return Err(malformed()),
    };
    Ok(Reply {
        now,
        granted,
        before: vec![before],
    })
}

/// What the queue form of `window.lua` answered: decisions queued on one
/// key, decided in turn.
#[derive(Debug)]
pub struct QueueReply {
    pub now: u64,
    /// One per decision, in order.
    pub granted: Vec<bool>,
    /// The state the key held before the first of them.
    pub before: Option<Vec<u8>>,
}

/// Parses the queue form's `"verdicts clock value"`: a `1` or `0` per
/// decision, then the clock and the value as in the one-item form.
pub fn queue_reply(value: Value) -> Result<QueueReply, RedisError> {
    let text = match value {
        Value::BulkString(text) => text,
        other => {
            return Err(RedisError::Reply(format!(
                "expected \"verdicts clock value\", got {other:?}"
            )));
        }
    };
    let malformed = || {
        RedisError::Reply(format!(
            "expected \"verdicts clock value\", got {:?}",
            String::from_utf8_lossy(&text)
        ))
    };
    let Fields {
        verdicts,
        now,
        before,
    } = verdicts_clock_value(&text).ok_or_else(malformed)?;
    let granted = verdicts
        .iter()
        .map(|verdict| match verdict {
            b'1' => Some(true),
            b'0' => Some(false),
            _ => None,
        })
        .collect::<Option<Vec<bool>>>()
        .ok_or_else(malformed)?;
    Ok(QueueReply {
        now,
        granted,
        before,
    })
}

/// Splits `"verdicts clock value"`: the clock is Redis `TIME`'s
/// `seconds.micros` (now is its millisecond, as the scripts count it) or
/// an injected time in ms; an empty value is none.
fn verdicts_clock_value(text: &[u8]) -> Option<Fields<'_>> {
    let mut fields = text.splitn(3, |&byte| byte == b' ');
    let (verdicts, clock, value) = (fields.next()?, fields.next()?, fields.next()?);
    let clock = std::str::from_utf8(clock).ok()?;
    let now = match clock.split_once('.') {
        Some((seconds, micros)) => {
            let seconds: u64 = seconds.parse().ok()?;
            let micros: u64 = micros.parse().ok()?;
            seconds.checked_mul(1000)?.checked_add(micros / 1000)?
        }
        None => clock.parse().ok()?,
    };
    Some(Fields {
        verdicts,
        now,
        before: (!value.is_empty()).then(|| value.to_vec()),
    })
}

/// A string reply's fields.
struct Fields<'t> {
    verdicts: &'t [u8],
    now: u64,
    before: Option<Vec<u8>>,
}
