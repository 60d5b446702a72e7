//! The limiter: one engine and one access history behind every face of
//! Charon. It holds the current configuration (swapped atomically on reload)
//! and a store; it turns an Envoy-style request (namespace + descriptors) into
//! an engine batch, and the decision into per-descriptor statuses
//! (docs/design.md#envoy-answers).
//!
//! `request` holds what comes in and goes out, and its validation;
//! `resolve` matches descriptors to the configuration; `batch` turns the
//! matches into engine items and keys; `prepare` makes a request's batch of
//! hits and its batch of refunds (negative hits, given back); `status`
//! turns outcomes into statuses; `cost` reserves, commits, cancels and
//! refunds on `cost: after_response` budgets for the callers that can say
//! an estimate first; [`shares`] keeps this server's shares of its global
//! limits, the runtime state the configuration does not carry.
//!
//! ```rust
//! # tokio_test_block_on(async {
//! use charon::limiter::{Limiter, RateLimitRequest, Descriptor};
//! let yaml = "domain: shop\ndescriptors:\n  - key: tenant\n    rate_limit: {unit: minute, requests_per_unit: 1}\n";
//! let config = charon::config::load_str(yaml, "shop.yaml").unwrap().config;
//! let limiter = Limiter::new(config, charon::store::MemoryStore::new());
//! let request = RateLimitRequest::new("shop", vec![Descriptor::new([("tenant", "acme")])]);
//! assert!(!limiter.should_rate_limit(request.clone()).await.unwrap().over_limit);
//! assert!(limiter.should_rate_limit(request).await.unwrap().over_limit);
//! # });
//! # fn tokio_test_block_on<F: std::future::Future>(f: F) -> F::Output {
//! #     let mut f = std::pin::pin!(f);
//! #     let waker = std::task::Waker::noop();
//! #     let mut cx = std::task::Context::from_waker(&waker);
//! #     loop { if let std::task::Poll::Ready(v) = f.as_mut().poll(&mut cx) { return v; } }
//! # }
//! ```

mod batch;
mod cost;
mod learn;
mod prepare;
mod request;
mod resolve;
pub mod shares;
mod status;

use std::sync::Arc;

use crate::config::{Config, Namespace, RateResource, Running};
use crate::engine::{Decision, Outcome, TierOutcome};
use crate::state_view::{Recent, Watch};
use crate::store::{Batch, Store, StoreError};

use self::batch::tiers_item;
use self::prepare::{Hits, Prepared};
use self::request::validate;
use self::resolve::Resolved;
use self::shares::GlobalShares;
use self::status::status;

pub use self::cost::{CostAnswer, CostRequest, MAX_COST};
pub use self::learn::Learner;
pub use self::request::{
    CurrentLimit, Descriptor, DescriptorStatus, LimitError, LimitOverride, Modes, RateLimitAnswer,
    RateLimitRequest, caps,
};

/// Decides requests against the current configuration and a store.
pub struct Limiter<S> {
    config: Running,
    /// This server's shares of the global limits: runtime state beside the
    /// configuration, found by name.
    shares: Arc<GlobalShares>,
    store: S,
    watch: Watch,
    modes: Modes,
    /// Told shadow-mode limits' use in namespaces that learn.
    learner: Option<Learner>,
}

impl<S: Store> Limiter<S> {
    pub fn new(config: Config, store: S) -> Self {
        Self::on(Running::new(config), store)
    }

    /// Deciding with `config`, a handle others may swap.
    pub fn on(config: Running, store: S) -> Self {
        Self {
            config,
            shares: Arc::default(),
            store,
            watch: Watch::default(),
            modes: Modes::default(),
            learner: None,
        }
    }

    /// This server's shares of its global limits.
    pub fn global_shares(&self) -> &Arc<GlobalShares> {
        &self.shares
    }

    /// The same limiter with process-wide `modes`.
    pub fn with_modes(mut self, modes: Modes) -> Self {
        self.modes = modes;
        self
    }

    /// The same limiter, telling `learner` the use of shadow-mode limits
    /// in namespaces with `settings.learn`.
    pub fn with_learner(mut self, learner: Learner) -> Self {
        self.learner = Some(learner);
        self
    }

    /// Replaces the configuration; requests in flight finish on the old one.
    pub fn replace_config(&self, config: Config) {
        self.config.replace(config);
    }

    pub fn config(&self) -> Arc<Config> {
        self.config.load()
    }

    /// The handle of the configuration this limiter decides with.
    pub fn running(&self) -> &Running {
        &self.config
    }

    pub fn store(&self) -> &S {
        &self.store
    }

    /// The recent decisions of what the state view looks at.
    pub fn watch(&self) -> &Watch {
        &self.watch
    }

    /// Envoy's `ShouldRateLimit`, with Charon's semantics
    /// (docs/design.md#envoy-answers).
    pub async fn should_rate_limit(
        &self,
        request: RateLimitRequest,
    ) -> Result<RateLimitAnswer, LimitError> {
        self.answer(&request, Hits::Asked).await
    }

    /// Whether `request`'s descriptors would pass, counting nothing: each
    /// asks for 0 hits, whatever it says (the check before a cost known
    /// after the response). The request stays the caller's, to be charged
    /// later.
    pub async fn check(&self, request: &RateLimitRequest) -> Result<RateLimitAnswer, LimitError> {
        self.answer(request, Hits::Check).await
    }

    async fn answer(
        &self,
        request: &RateLimitRequest,
        hits_of: Hits,
    ) -> Result<RateLimitAnswer, LimitError> {
        validate(request)?;
        let config = self.config.load();
        let Some(namespace) = config.namespace(&request.domain) else {
            return Ok(RateLimitAnswer {
                over_limit: false,
                statuses: request
                    .descriptors
                    .iter()
                    .map(|_| DescriptorStatus::unlimited(0))
                    .collect(),
                namespace_known: false,
                shadowed: false,
            });
        };
        let Prepared {
            resolved,
            batch,
            item_of,
            refunds,
            refund_of,
            quotas,
        } = self.prepare(namespace, request, hits_of)?;
        // Hits given back first: a request's refunds make room, never take it.
        let refunded = if refunds.items.is_empty() {
            None
        } else {
            Some(self.store.decide(refunds).await?)
        };
        let decision = if batch.items.is_empty() {
            None
        } else {
            Some(self.store.decide(batch).await?)
        };

        if let Some(decision) = &decision
            && self.watch.is_open()
        {
            self.record_resources(namespace, request, &resolved, &item_of, decision, hits_of);
        }
        if let (Some(learner), Some(learn), Hits::Asked) =
            (&self.learner, &namespace.settings.learn, hits_of)
        {
            // The process's shadow mode and `ignore_configured` put every
            // limit in shadow mode.
            let all = self.modes.shadow || namespace.settings.ignore_configured;
            learn::shadow_limits(learner, learn, namespace, request, &resolved, all);
        }
        let ignore = namespace.settings.ignore_configured;
        let statuses: Vec<DescriptorStatus> = request
            .descriptors
            .iter()
            .zip(&resolved)
            .zip(item_of.iter().zip(&refund_of))
            .zip(&quotas)
            .map(|(((descriptor, resolved), (item, refund)), &quota)| {
                let outcome = match (item, refund) {
                    (Some(i), _) => decision.as_ref().and_then(|d| d.outcomes.get(*i)),
                    (_, Some(i)) => refunded.as_ref().and_then(|d| d.outcomes.get(*i)),
                    _ => None,
                };
                let hits = hits_of.of(resolved, descriptor, request.hits_addend);
                let mut status = status(resolved, outcome, hits, ignore);
                status.refund = descriptor.refund && hits_of == Hits::Asked;
                if let Some(Outcome::Window(w)) = outcome {
                    status.unreturned = w.unreturned;
                }
                status.quota = quota;
                status.metadata = resolved.node().and_then(|node| node.metadata.clone());
                status.hits = hits;
                status.stats_key = resolved.stats().cloned();
                status
            })
            .collect();
        let over_limit = !ignore && over_limit(&resolved, &statuses);
        Ok(RateLimitAnswer {
            over_limit: over_limit && !self.modes.shadow,
            shadowed: over_limit && self.modes.shadow,
            statuses,
            namespace_known: true,
        })
    }

    /// Records a request whose answer nobody reads (a cost charged after
    /// the response): the same decision as
    /// [`should_rate_limit`](Self::should_rate_limit), without building
    /// the statuses. Whether it was over its limits.
    pub async fn record(&self, request: RateLimitRequest) -> Result<bool, LimitError> {
        let config = self.config.load();
        let Some((batch, refunds)) = self.to_record(&config, &request)? else {
            return Ok(false);
        };
        if !refunds.items.is_empty() {
            self.store.decide(refunds).await?;
        }
        if batch.items.is_empty() {
            return Ok(false);
        }
        Ok(!self.store.decide(batch).await?.granted)
    }

    /// [`record`](Self::record) within this call, when the store decides
    /// in the process; `None` (nothing done) when it cannot.
    pub fn record_now(&self, request: &RateLimitRequest) -> Option<Result<bool, LimitError>> {
        if !self.store.decides_now() {
            return None;
        }
        let config = self.config.load();
        match self.to_record(&config, request) {
            Ok(Some((batch, refunds))) => {
                if !refunds.items.is_empty() {
                    self.store.decide_now(refunds)?;
                }
                if batch.items.is_empty() {
                    return Some(Ok(false));
                }
                self.store
                    .decide_now(batch)
                    .map(|decision| Ok(!decision.granted))
            }
            Ok(None) => Some(Ok(false)),
            Err(error) => Some(Err(error)),
        }
    }

    /// The batches [`record`](Self::record) decides, its hits and its
    /// refunds; `None` when nothing in `request` is limited.
    fn to_record<'c>(
        &self,
        config: &'c Config,
        request: &RateLimitRequest,
    ) -> Result<Option<(Batch<'c>, Batch<'c>)>, LimitError> {
        validate(request)?;
        let Some(namespace) = config.namespace(&request.domain) else {
            return Ok(None);
        };
        let prepared = self.prepare(namespace, request, Hits::Asked)?;
        Ok(
            (!prepared.batch.items.is_empty() || !prepared.refunds.items.is_empty())
                .then_some((prepared.batch, prepared.refunds)),
        )
    }

    /// Whether a descriptor is a quota descriptor: its node says so, or the
    /// process does for every descriptor that is not unlimited.
    fn is_quota(&self, resolved: &Resolved<'_>) -> bool {
        match resolved {
            Resolved::Unlimited { .. } => false,
            _ => self.modes.quota || resolved.node().is_some_and(|node| node.quota_mode),
        }
    }
}

/// envoyproxy/ratelimit's overall code: over when a descriptor that is not a
/// quota descriptor is over, or when there are quota descriptors and every
/// one is over. Unlimited descriptors take no part; with the process-wide
/// quota mode, a descriptor without a limit is a quota descriptor that
/// passed.
fn over_limit(resolved: &[Resolved<'_>], statuses: &[DescriptorStatus]) -> bool {
    let (mut quotas, mut quotas_over) = (0usize, 0usize);
    for (resolved, status) in resolved.iter().zip(statuses) {
        if matches!(resolved, Resolved::Unlimited { .. }) {
            continue;
        }
        if !status.quota {
            if status.over_limit {
                return true;
            }
            continue;
        }
        quotas += 1;
        if status.over_limit {
            quotas_over += 1;
        }
    }
    quotas > 0 && quotas == quotas_over
}

impl<S: Store> Limiter<S> {
    /// Envoy's decisions on resources, for the state view's watches.
    fn record_resources(
        &self,
        namespace: &Namespace,
        request: &RateLimitRequest,
        resolved: &[Resolved<'_>],
        item_of: &[Option<usize>],
        decision: &Decision,
        hits_of: Hits,
    ) {
        let default_hits = if request.hits_addend == 0 {
            1
        } else {
            request.hits_addend
        };
        for ((descriptor, resolved), item) in request.descriptors.iter().zip(resolved).zip(item_of)
        {
            let hits = match hits_of {
                Hits::Asked => descriptor.hits_addend.unwrap_or(default_hits),
                Hits::Check => 0,
            };
            if let (Resolved::Resource { rate, .. }, Some(item)) = (resolved, item)
                && let Some(outcome) = resource_outcome(decision.outcomes.get(*item), hits)
            {
                let domain = descriptor.entries.last().map_or("", |(_, v)| v.as_str());
                self.watch.record(&namespace.name, &rate.name, domain, || {
                    recent(decision.now, "envoy", &outcome, hits)
                });
            }
        }
    }

    /// Hits on one rate-limited resource for one domain (the Charon API's
    /// `request`): the largest `k` in `[min_hits, hits]`, or nothing.
    /// `ignore_configured` grants and still counts what fits.
    pub async fn request_hits(
        &self,
        namespace: &Namespace,
        rate: &RateResource,
        domain: &str,
        hits: u64,
        min_hits: u64,
    ) -> Result<(TierOutcome, bool), StoreError> {
        let mut batch = Batch::default();
        let item = tiers_item(
            &mut batch,
            &namespace.name,
            rate,
            domain,
            hits,
            min_hits,
            namespace.settings.ignore_configured,
        );
        batch.items.push(item);
        let decision = self.store.decide(batch).await?;
        match resource_outcome(decision.outcomes.first(), hits).as_ref() {
            Some(outcome) => {
                self.watch.record(&namespace.name, &rate.name, domain, || {
                    recent(decision.now, "request", outcome, hits)
                });
                Ok((*outcome, decision.degraded))
            }
            _ => Err(StoreError::Unavailable(
                "the store answered another kind of decision".into(),
            )),
        }
    }
}

/// A resource's answer: its tiers', or another algorithm's window shown as
/// tier 1.
pub(super) fn resource_outcome(outcome: Option<&Outcome>, hits: u64) -> Option<TierOutcome> {
    match outcome? {
        Outcome::Tiers(outcome) => Some(*outcome),
        Outcome::Window(window) => Some(TierOutcome::from_window(window, hits)),
        Outcome::Gcra(_) => None,
    }
}

/// A decision on a resource as the state view shows it: asking for 0 hits
/// is a check (granted: it would fit); a rejection shows the hits asked.
fn recent(at_ms: u64, op: &'static str, outcome: &TierOutcome, asked: u64) -> Recent {
    let check = asked == 0;
    Recent {
        at_ms,
        op: if check { "check" } else { op },
        granted: if check {
            !outcome.over
        } else {
            outcome.granted > 0
        },
        copies: if outcome.granted > 0 {
            outcome.granted
        } else {
            asked
        },
        tier: outcome.snapshot.tier,
    }
}
