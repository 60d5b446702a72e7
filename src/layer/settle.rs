//! What a response cost, and its charge when the body ends: the
//! [`Cost`] a handler puts in its response, and the [`Settlement`] the
//! response body carries and charges when it ends or is dropped
//! ([`CostLimitLayer`](super::CostLimitLayer)).

use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::task::{Context, Waker};

use crate::client::{Client, CostReservation};
use crate::limiter::RateLimitRequest;

/// What a response cost, in the budget's units: put a clone in the
/// response's extensions; it is read when the body ends (or is dropped),
/// so a streaming body may keep adding to it.
#[derive(Debug, Clone, Default)]
pub struct Cost(Arc<AtomicU64>);

impl Cost {
    /// A cost of `amount`.
    pub fn new(amount: u64) -> Self {
        Self(Arc::new(AtomicU64::new(amount)))
    }

    /// Adds `amount` (saturating).
    pub fn add(&self, amount: u64) {
        let _ = self
            .0
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |cost| {
                Some(cost.saturating_add(amount))
            });
    }

    pub fn set(&self, amount: u64) {
        self.0.store(amount, Ordering::Relaxed);
    }

    pub fn get(&self) -> u64 {
        self.0.load(Ordering::Relaxed)
    }
}

/// What to charge once the response is known: the request's descriptors,
/// on the client that checked them.
pub struct Settle {
    pub(super) client: Client,
    /// The request that was checked, charged at the cost (empty for a
    /// reservation: it is committed by its id).
    pub(super) charge: RateLimitRequest,
    pub(super) charge_errors: bool,
    /// The estimate reserved at admission, committed at the cost.
    pub(super) reservation: Option<CostReservation>,
    /// The trailer that says the cost, if the layer reads one.
    pub(super) trailer: Option<http::HeaderName>,
}

impl Settle {
    /// The settlement of `response`: its [`Cost`], charged when dropped.
    /// Nothing to charge: the reservation, if any, is cancelled now.
    pub(super) fn of<B>(mut self, response: &http::Response<B>) -> Option<Settlement> {
        let charged = !response.status().is_server_error() || self.charge_errors;
        let cost = match response.extensions().get::<Cost>() {
            Some(cost) => Some(cost.clone()),
            // Said by a trailer at the end of the body, if at all.
            None => self.trailer.is_some().then(Cost::default),
        };
        match cost {
            Some(cost) if charged => Some(Settlement { cost, settle: self }),
            _ => {
                if let Some(reservation) = self.reservation.take() {
                    finish(0, async move {
                        if let Err(error) = reservation.cancel().await {
                            tracing::warn!(%error, "a reservation was not cancelled");
                        }
                    });
                }
                None
            }
        }
    }
}

/// Runs `settling` to its end: within the first poll on the embedded
/// engine, else on the runtime (a sidecar's round trip).
fn finish(amount: u64, settling: impl Future<Output = ()> + Send + 'static) {
    let mut settling = Box::pin(settling);
    if settling
        .as_mut()
        .poll(&mut Context::from_waker(Waker::noop()))
        .is_ready()
    {
        return;
    }
    match tokio::runtime::Handle::try_current() {
        Ok(runtime) => {
            runtime.spawn(settling);
        }
        Err(_) => tracing::warn!(amount, "no runtime to finish a charge on: not charged"),
    }
}

/// A response's cost, charged when this is dropped: at the end of the
/// body, or with it.
pub struct Settlement {
    settle: Settle,
    cost: Cost,
}

impl Settlement {
    /// The cost a trailer states (the whole cost: it replaces what the
    /// extension counted), if the layer reads one and it is a number.
    pub(super) fn read_trailers(&self, trailers: &http::HeaderMap) {
        let Some(name) = &self.settle.trailer else {
            return;
        };
        let stated = trailers
            .get(name)
            .and_then(|value| value.to_str().ok())
            .map(|value| value.trim().parse::<u64>());
        match stated {
            Some(Ok(cost)) => self.cost.set(cost),
            Some(Err(_)) => tracing::warn!(trailer = %name, "a cost trailer that is not a number"),
            None => {}
        }
    }
}

impl Drop for Settlement {
    fn drop(&mut self) {
        let amount = self.cost.get();
        if let Some(reservation) = self.settle.reservation.take() {
            finish(amount, async move {
                if let Err(error) = reservation.commit(amount).await {
                    tracing::warn!(amount, %error, "a reservation was not committed");
                }
            });
            return;
        }
        if amount == 0 {
            return;
        }
        let mut request = std::mem::take(&mut self.settle.charge);
        for descriptor in &mut request.descriptors {
            descriptor.hits_addend = Some(amount);
        }
        // The embedded engine on the memory store charges in this call:
        // no future to box and poll.
        if let Some(charged) = self.settle.client.charge_now(&request) {
            if let Err(error) = charged {
                tracing::warn!(amount, %error, "a response's cost was not charged");
            }
            return;
        }
        let client = self.settle.client.clone();
        finish(amount, async move {
            // A charge over the limit's max_charge is refused: say so, the
            // response is long gone.
            if let Err(error) = client.charge(request).await {
                tracing::warn!(amount, %error, "a response's cost was not charged");
            }
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_cost_adds_up_and_saturates() {
        let cost = Cost::new(5);
        let clone = cost.clone();
        clone.add(7);
        assert_eq!(cost.get(), 12);
        cost.add(u64::MAX);
        assert_eq!(clone.get(), u64::MAX);
        cost.set(3);
        assert_eq!(clone.get(), 3);
    }
}
