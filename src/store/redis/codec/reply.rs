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
    let mut fields = text.splitn(3, |&byte| byte == b' ');
    let (Some(granted), Some(clock), Some(value)) = (fields.next(), fields.next(), fields.next())
    else {
        return Err(malformed());
    };
    let granted = match granted {
        b"1" => true,
        b"0" => false,
        _ => return Err(malformed()),
    };
    let clock = std::str::from_utf8(clock).map_err(|_| malformed())?;
    let now = match clock.split_once('.') {
        Some((seconds, micros)) => {
            let seconds: u64 = seconds.parse().map_err(|_| malformed())?;
            let micros: u64 = micros.parse().map_err(|_| malformed())?;
            seconds
                .checked_mul(1000)
                .and_then(|ms| ms.checked_add(micros / 1000))
                .ok_or_else(malformed)?
        }
        None => clock.parse().map_err(|_| malformed())?,
    };
    let before = (!value.is_empty()).then(|| value.to_vec());
    Ok(Reply {
        now,
        granted,
        before: vec![before],
    })
}
