//! What the rest of the sidecar reports to the metrics through: the
//! observers the Redis store and the copy log call, the service's
//! [`Observer`](crate::service::Observer), and the copy log's holds read at
//! each scrape.

use std::sync::Arc;

use crate::store::open::StoreStatus;

use super::*;

impl Metrics {
    /// What the Redis store calls after each call: observes its latency.
    pub fn store_call_observer(&self) -> crate::store::redis::CallObserver {
        let calls = self.store_calls.clone();
        Arc::new(move |operation, elapsed, ok| {
            let result = if ok { "ok" } else { "error" };
            calls
                .get_or_create(&StoreCallLabels { operation, result })
                .observe(elapsed.as_secs_f64());
        })
    }

    /// What the copy log calls on its membership events: counts them.
    pub fn copy_log_event_observer(&self) -> crate::store::redis::EventObserver {
        let events = self.copy_log_events.clone();
        Arc::new(move |event, count| {
            events
                .get_or_create(&CopyLogEventLabels { event })
                .inc_by(count);
        })
    }

    pub fn set_store(&self, status: StoreStatus) {
        let gauge = |n: u64| i64::try_from(n).unwrap_or(i64::MAX);
        let stats = status.memory;
        self.store_keys.set(gauge(stats.keys as u64));
        self.store_max_keys.set(gauge(stats.max_keys as u64));
        self.store_unrecorded.set(gauge(stats.unrecorded));
        // Without Redis the memory store is the store, always reachable.
        let redis = status.redis.unwrap_or_default();
        self.store_reachable
            .set(i64::from(status.redis.is_none() || redis.reachable));
        // Totals kept by the store, copied at each scrape.
        let ordering = std::sync::atomic::Ordering::Relaxed;
        self.store_degraded.inner().store(redis.degraded, ordering);
        self.store_errors.inner().store(redis.errors, ordering);
        self.store_outages.inner().store(redis.opened, ordering);
    }

    /// Replaces the gauge of configured limits with `config`'s: each
    /// fixed-window limit's requests per unit, by namespace and statistics
    /// key, at most as many as the per-limit series keep.
    pub fn set_configured_limits(&self, config: &crate::config::Config) {
        self.configured_limits.clear();
        let mut room = MAX_LIMIT_SERIES;
        for namespace in config.namespaces() {
            namespace
                .descriptors
                .each_node(&namespace.name, &mut |key, node| {
                    if let crate::config::Leaf::Limit(limit) = &node.leaf
                        && room > 0
                    {
                        room -= 1;
                        self.configured_limits
                            .get_or_create(&ConfiguredLimitLabels {
                                namespace: namespace.name.clone(),
                                limit: SharedLabel(Arc::from(key)),
                                unit: limit.unit.as_lower(),
                            })
                            .set(i64::try_from(limit.requests_per_unit).unwrap_or(i64::MAX));
                    }
                });
        }
    }

    /// Each global limit's share on this server, read at each scrape.
    pub fn set_global_shares(
        &self,
        config: &crate::config::Config,
        shares: &crate::limiter::shares::GlobalShares,
    ) {
        self.global_shares.clear();
        self.global_shares_lent.clear();
        self.global_on_safe_share.clear();
        for namespace in config.namespaces() {
            for (name, global) in &namespace.globals {
                let labels = CopyResourceLabels {
                    namespace: namespace.name.clone(),
                    resource: name.clone(),
                };
                let share = shares.share(&namespace.name, name, &global.limit);
                self.global_shares
                    .get_or_create(&labels)
                    .set(i64::try_from(share.requests_per_unit()).unwrap_or(i64::MAX));
                self.global_shares_lent
                    .get_or_create(&labels)
                    .set(i64::try_from(share.lent()).unwrap_or(i64::MAX));
                self.global_on_safe_share
                    .get_or_create(&labels)
                    .set(i64::from(share.on_safe_share()));
            }
        }
    }

    /// Replaces the copy-hold gauges with what the copy log says now
    /// (resources no longer configured disappear).
    pub fn set_copy_holds(&self, holds: &[crate::server::admin::state::ResourceHolds]) {
        self.copies_held.clear();
        self.copies_held_by_group.clear();
        self.transfers_staged.clear();
        for resource in holds {
            self.transfers_staged
                .get_or_create(&CopyResourceLabels {
                    namespace: resource.namespace.clone(),
                    resource: resource.resource.clone(),
                })
                .set(i64::try_from(resource.staged).unwrap_or(i64::MAX));
            self.copies_held
                .get_or_create(&CopyResourceLabels {
                    namespace: resource.namespace.clone(),
                    resource: resource.resource.clone(),
                })
                .set(i64::try_from(resource.held).unwrap_or(i64::MAX));
            for (group, held) in &resource.groups {
                self.copies_held_by_group
                    .get_or_create(&CopyGroupLabels {
                        namespace: resource.namespace.clone(),
                        resource: resource.resource.clone(),
                        group: group.clone(),
                    })
                    .set(i64::try_from(*held).unwrap_or(i64::MAX));
            }
        }
    }
}

impl crate::service::Observer for Metrics {
    fn copy_operation(&self, operation: &'static str, result: &'static str) {
        self.session_operation(operation, result);
    }

    fn rate_request(
        &self,
        namespace: &str,
        resource: &str,
        hits: u64,
        outcome: crate::service::RateOutcome,
    ) {
        let main = LimitOutcome::of(outcome.over, outcome.shadow);
        self.limit_hits(namespace, resource, main, hits);
        if outcome.near {
            self.limit_hits(namespace, resource, LimitOutcome::NearLimit, hits);
        }
        self.tier_hits(
            namespace,
            resource,
            main,
            (outcome.tier, outcome.limited_by),
            hits,
        );
    }

    fn operation(&self, event: &crate::service::OperationEvent<'_>) {
        self.operation_answered(event);
    }

    fn global_share_moved(&self, namespace: &str, limit: &str, share: u64, on_safe_share: bool) {
        // Rare (at most once a refresh per limit): logged whenever the log
        // is on, within its budget, not drawn.
        self.decision_log.event(
            "global",
            &crate::service::OperationEvent {
                operation: "share",
                namespace,
                resource: limit,
                domain: "",
                outcome: if on_safe_share { "safe_share" } else { "moved" },
                amount: share,
            },
        );
    }

    fn unconfigured_request(&self, namespace: &str, resource: &str, hits: u64) {
        self.unconfigured_hits
            .get_or_create(&ResourceLabels {
                namespace: namespace.to_owned(),
                resource: self
                    .unconfigured_keys
                    .label(resource, &self.unconfigured_folds),
            })
            .inc_by(hits);
    }
}
