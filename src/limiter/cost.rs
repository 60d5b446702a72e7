//! Reservations on budgets of a cost known after the response
//! (docs/design.md#reservations): reserve, commit, cancel and refund on the
//! `cost: after_response` limits a request's descriptors match, all or
//! nothing, as one batch. The Envoy face only checks and charges
//! ([`Limiter::should_rate_limit`]); these are for callers that can say an
//! estimate and come back with the actual cost (the Charon API, the client,
//! the Tower layer).

use smallvec::SmallVec;

use crate::config::{Algorithm, ResourceLimit};
use crate::engine::{CostItem, CostOp, Item, SlotKind};
use crate::store::{Batch, Store, keys};

use super::Limiter;
use super::batch::{keyed_entries, tiers_item};
use super::request::{Descriptor, DescriptorStatus, LimitError, RateLimitRequest, validate};
use super::resolve::{Resolved, resolve_all};
use super::status::status;

/// The largest cost a reservation, commit or refund may name: Redis's
/// script counts in doubles, exact to 2^53.
pub const MAX_COST: u64 = (1 << 53) - 1;

/// One operation on the budgets `descriptors` match in `domain`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CostRequest {
    pub domain: String,
    pub descriptors: Vec<Descriptor>,
    pub op: CostOp,
}

/// What a [`CostRequest`] did.
#[derive(Debug, Clone, PartialEq)]
pub struct CostAnswer {
    /// Done on every budget: reserved, committed, cancelled or refunded.
    /// Not applied: a reservation that does not fit (see the statuses), or
    /// a commit or cancel of a reservation not held, or a refund after its
    /// window: nothing changed.
    pub applied: bool,
    /// One per descriptor, in request order (over: the budget refused).
    pub statuses: Vec<DescriptorStatus>,
    /// The store's time of the decision (ms since the epoch).
    pub now: u64,
    /// Answered by the store's failure policy, not by the shared state.
    pub degraded: bool,
    /// Whether any descriptor matched a budget at all.
    pub budgets: usize,
}

impl<S: Store> Limiter<S> {
    /// Reserves, commits, cancels or refunds a cost on every
    /// `cost: after_response` limit the descriptors match. A descriptor
    /// without a limit takes no part; one whose limit counts requests is an
    /// error (it has no budget to reserve from).
    pub async fn cost(&self, request: CostRequest) -> Result<CostAnswer, LimitError> {
        let invalid = |message: String| Err(LimitError::InvalidArgument(message));
        let checked = RateLimitRequest {
            domain: request.domain,
            descriptors: request.descriptors,
            hits_addend: 0,
        };
        validate(&checked)?;
        let amount = request.op.amount();
        if amount > MAX_COST {
            return invalid(format!(
                "a cost of {amount} is more than {MAX_COST}, the largest Charon counts exactly"
            ));
        }
        if let CostOp::Reserve { amount: 0, .. } = request.op {
            return invalid("a reservation of 0: reserve at least 1".into());
        }
        let config = self.config.load();
        let Some(namespace) = config.namespace(&checked.domain) else {
            return invalid(format!("namespace `{}` is not configured", checked.domain));
        };
        let resolved = resolve_all(namespace, &checked, &self.shares);
        let mut batch = Batch::default();
        let mut item_of: SmallVec<[Option<usize>; 4]> = SmallVec::new();
        for (index, (descriptor, resolved)) in checked.descriptors.iter().zip(&resolved).enumerate()
        {
            let Resolved::Fixed {
                limit,
                shared_values,
                ..
            } = resolved
            else {
                if let Resolved::Resource { rate, .. } = resolved {
                    // A resource's budget: one per domain (the entry's value).
                    let domain = descriptor.entries.last().map_or("", |(_, v)| v.as_str());
                    let max_charge = match rate.alternative {
                        Some(ResourceLimit::Budget { max_charge, .. })
                            if !rate.domains.contains_key(domain) =>
                        {
                            max_charge
                        }
                        _ => {
                            return invalid(format!(
                                "descriptor {index} names resource `{}`, which has no `budget`",
                                rate.name
                            ));
                        }
                    };
                    if amount > max_charge {
                        return invalid(format!(
                            "descriptor {index}: a cost of {amount} is more than its budget's \
                             max_charge, {max_charge}"
                        ));
                    }
                    // The budget's item as Envoy's calls build it, doing `op`
                    // (unshadowed, as below).
                    let mut item =
                        tiers_item(&mut batch, &namespace.name, rate, domain, 0, 0, false);
                    if let Item::Cost(CostItem { op, .. }) = &mut item {
                        *op = request.op;
                    }
                    batch.items.push(item);
                    item_of.push(Some(batch.items.len() - 1));
                    continue;
                }
                item_of.push(None);
                continue;
            };
            let Algorithm::AfterResponse {
                initial_cost,
                max_charge,
            } = limit.algorithm()
            else {
                return invalid(format!(
                    "descriptor {index}: its limit counts requests; reservations need \
                     `cost: after_response`"
                ));
            };
            if amount > max_charge {
                return invalid(format!(
                    "descriptor {index}: a cost of {amount} is more than its limit's \
                     max_charge, {max_charge}"
                ));
            }
            let period = limit.period();
            let key = keys::descriptor_key(
                SlotKind::Cost,
                &namespace.name,
                keyed_entries(descriptor, shared_values),
                period,
            );
            // Shadow mode is the Envoy face's: a reservation is enforced,
            // else its commit would name one that was never held.
            let slot = batch.slot(key, SlotKind::Cost);
            batch.items.push(Item::Cost(CostItem {
                slot,
                limit: limit.requests_per_unit(),
                period,
                op: request.op,
                shadow: false,
                initial_cost,
            }));
            item_of.push(Some(batch.items.len() - 1));
        }
        let budgets = batch.items.len();
        let decision = if budgets == 0 {
            None
        } else {
            Some(self.store.decide(batch).await?)
        };
        let statuses = resolved
            .iter()
            .zip(&item_of)
            .map(|(resolved, item)| {
                let outcome = item.and_then(|i| decision.as_ref().map(|d| &d.outcomes[i]));
                status(resolved, outcome, 0, false)
            })
            .collect();
        Ok(CostAnswer {
            applied: decision.as_ref().is_none_or(|d| d.granted),
            statuses,
            now: decision.as_ref().map_or(0, |d| d.now),
            degraded: decision.as_ref().is_some_and(|d| d.degraded),
            budgets,
        })
    }
}
