//! A cost known after the response on the wire: `c slot limit period
//! amount shadow initial_cost op id extra on_expiry`; its state
//! `start,used,mean,dev,duration,expires_at|pending|reservations`.

use redis::ScriptInvocation;

use crate::engine::{CostItem, CostOp, CostState, Reservation};
use crate::store::redis::RedisError;

use super::{Wire, flag, number, numbers};

/// Never blocked locally: its charges must always reach Redis.
impl Wire for CostItem {
    fn arguments(&self, invocation: &mut ScriptInvocation<'_>) {
        // `op amount id extra flag`: the id as text (Lua's numbers are
        // doubles), `extra` a reservation's ttl or when a refund's charge
        // was made.
        let (code, id, extra, on_expiry) = match self.op {
            CostOp::Hits(_) => ("h", 0, 0, false),
            CostOp::Reserve {
                id,
                ttl,
                charge_on_expiry,
                ..
            } => ("r", id, ttl, charge_on_expiry),
            CostOp::Commit { id, .. } => ("m", id, 0, false),
            CostOp::Cancel { id } => ("x", id, 0, false),
            CostOp::Refund { charged_at, .. } => ("f", 0, charged_at, false),
        };
        invocation
            .arg("c")
            .arg(self.slot + 1)
            .arg(self.limit)
            .arg(self.period)
            .arg(self.op.amount())
            .arg(flag(self.shadow))
            .arg(self.initial_cost)
            .arg(code)
            .arg(id)
            .arg(extra)
            .arg(flag(on_expiry));
    }

    fn refund(&self) -> (&'static str, u64, u64, u64) {
        ("c", self.limit, self.period, self.initial_cost)
    }

    const CHUNKS: &'static str = "c";
}

/// `start,used,mean,dev,duration,expires_at|t,t,...|reservations` (the
/// admissions in flight, oldest first).
pub fn cost(text: &str) -> Result<CostState, RedisError> {
    let mut parts = text.splitn(3, '|');
    let head = parts.next().unwrap_or("");
    let pending = parts.next().unwrap_or("");
    let reservations = parts.next().unwrap_or("");
    let mut next = numbers(head);
    Ok(CostState {
        start: next()?,
        used: next()?,
        mean: next()?,
        dev: next()?,
        duration: next()?,
        expires_at: next()?,
        pending: pending
            .split(',')
            .filter(|t| !t.is_empty())
            .map(number)
            .collect::<Result<_, _>>()?,
        reservations: reservations
            .split(',')
            .filter(|r| !r.is_empty())
            .map(reservation)
            .collect::<Result<_, _>>()?,
    })
}

/// `id:amount:expires_at:charge_on_expiry` (0 or 1).
fn reservation(text: &str) -> Result<Reservation, RedisError> {
    let mut fields = text.split(':');
    let mut next = || number(fields.next().unwrap_or(""));
    Ok(Reservation {
        id: next()?,
        amount: next()?,
        expires_at: next()?,
        charge_on_expiry: next()? == 1,
    })
}
