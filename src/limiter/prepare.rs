//! A request's descriptors as engine batches: its hits, and its refunds in
//! a batch of their own (docs/design.md#refunds), with what the answer needs
//! to read the outcomes back.

use smallvec::SmallVec;

use crate::config::Namespace;
use crate::store::{Batch, Store};

use super::batch::{Asked, add_item, add_refund};
use super::request::Descriptor;
use super::resolve::{Resolved, resolve_all};
use super::{LimitError, Limiter, RateLimitRequest};

impl<S: Store> Limiter<S> {
    /// The engine batch of `request`'s descriptors in `namespace`, and
    /// what the answer needs to read it back.
    pub(super) fn prepare<'c>(
        &self,
        namespace: &'c Namespace,
        request: &RateLimitRequest,
        hits_of: Hits,
    ) -> Result<Prepared<'c>, LimitError> {
        let resolved = resolve_all(namespace, request, &self.shares);
        let mut batch = Batch::default();
        let mut refunds = Batch::default();
        let mut item_of: SmallVec<[Option<usize>; 4]> = SmallVec::new();
        let mut refund_of: SmallVec<[Option<usize>; 4]> = SmallVec::new();
        let quotas: SmallVec<[bool; 4]> = resolved.iter().map(|r| self.is_quota(r)).collect();
        for (index, ((descriptor, resolved), &quota)) in request
            .descriptors
            .iter()
            .zip(&resolved)
            .zip(&quotas)
            .enumerate()
        {
            let hits = hits_of.of(resolved, descriptor, request.hits_addend);
            if descriptor.refund && hits_of == Hits::Asked {
                item_of.push(None);
                refund_of.push(add_refund(
                    &mut refunds,
                    namespace,
                    descriptor,
                    resolved,
                    hits,
                    &|| self.store.local_now_ms(),
                ));
                continue;
            }
            refund_of.push(None);
            if let Some(max_charge) = resolved.max_charge()
                && hits > max_charge
            {
                return Err(LimitError::InvalidArgument(format!(
                    "descriptor {index}: a charge of {hits} is more than its limit's max_charge, {max_charge}"
                )));
            }
            // A global limit's demand is every hit asked of it, admitted or
            // not, by this process's clock (docs/design.md#global-limits).
            if let Resolved::Fixed { limit, .. } = resolved
                && let Some(share) = limit.global()
            {
                share.count(hits, self.store.local_now_ms(), limit.period());
            }
            let asked = Asked {
                hits,
                quota,
                count_rejected: self.modes.count_rejected,
                now: &|| self.store.local_now_ms(),
            };
            item_of.push(add_item(&mut batch, namespace, descriptor, resolved, asked));
        }
        Ok(Prepared {
            resolved,
            batch,
            item_of,
            refunds,
            refund_of,
            quotas,
        })
    }
}

/// What each descriptor of a request asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Hits {
    /// What it says (its own `hits_addend`, else the request's).
    Asked,
    /// Nothing: would it pass?
    Check,
}

impl Hits {
    pub(super) fn of(
        self,
        resolved: &Resolved<'_>,
        descriptor: &Descriptor,
        request_hits: u64,
    ) -> u64 {
        match self {
            Hits::Asked => resolved.hits(descriptor, request_hits),
            Hits::Check => 0,
        }
    }
}

/// A request's engine batch, and how to read its answer back.
pub(super) struct Prepared<'c> {
    pub(super) resolved: SmallVec<[Resolved<'c>; 2]>,
    pub(super) batch: Batch<'c>,
    /// Per descriptor, its item in the batch (none when not limited).
    pub(super) item_of: SmallVec<[Option<usize>; 4]>,
    /// The request's refunds, a batch of their own: always granted.
    pub(super) refunds: Batch<'c>,
    /// Per descriptor, its item in `refunds`.
    pub(super) refund_of: SmallVec<[Option<usize>; 4]>,
    pub(super) quotas: SmallVec<[bool; 4]>,
}
