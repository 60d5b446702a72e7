//! What every face reports of its decisions beyond the counters of
//! `ShouldRateLimit`: the Charon API's operations per domain (a view whose
//! domains are capped, as per-limit series are), and the decision log's
//! events of the Charon API, cost calls, RLQS assignments and global
//! limits' share moves (docs/operations.md#decision-log).

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::registry::Registry;

use crate::service::OperationEvent;

use super::series_cap::SeriesCap;
use super::{Metrics, SharedLabel};

/// Distinct (namespace, domain) pairs the per-domain view keeps before new
/// ones fold into `domain="overflow"`: clients name domains.
pub const MAX_DOMAIN_SERIES: usize = 1_000;

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct DomainLabels {
    namespace: String,
    domain: SharedLabel,
    operation: &'static str,
    outcome: &'static str,
}

/// The Charon API's operations per namespace and domain.
pub(super) struct DomainView {
    operations: Family<DomainLabels, Counter>,
    keys: SeriesCap,
    folds: Counter,
}

impl DomainView {
    pub(super) fn register(registry: &mut Registry) -> Self {
        let operations = Family::<DomainLabels, Counter>::default();
        registry.register(
            "domain_operations",
            "Charon API operations by namespace, domain (the first 1 000 pairs; later ones as overflow), operation and outcome (ok, rejected, done, or the error kind)",
            operations.clone(),
        );
        let folds = Counter::default();
        registry.register(
            "domain_series_folded",
            "Charon API operations counted under domain=\"overflow\" because the per-domain view had reached its cap of distinct domains",
            folds.clone(),
        );
        Self {
            operations,
            keys: SeriesCap::new(MAX_DOMAIN_SERIES),
            folds,
        }
    }

    fn count(&self, event: &OperationEvent<'_>) {
        // The pair is what is capped: one domain name in two namespaces is
        // two tenants.
        let key = format!("{}\u{0}{}", event.namespace, event.domain);
        let domain = match self.keys.admit(&key, &self.folds) {
            Some(_) => SharedLabel(event.domain.into()),
            None => SharedLabel("overflow".into()),
        };
        self.operations
            .get_or_create(&DomainLabels {
                namespace: event.namespace.to_owned(),
                domain,
                operation: event.operation,
                outcome: event.outcome,
            })
            .inc();
    }
}

impl Metrics {
    /// A Charon API operation was answered: counted per domain, and drawn
    /// for the decision log.
    pub fn operation_answered(&self, event: &OperationEvent<'_>) {
        if !event.domain.is_empty() {
            self.domains.count(event);
        }
        if self.decision_log.draw() {
            self.decision_log.event("charon_api", event);
        }
    }

    /// An RLQS bucket's assignment to an Envoy changed: drawn for the
    /// decision log.
    pub fn rlqs_assignment(
        &self,
        namespace: &str,
        bucket: &str,
        envoy: &str,
        outcome: &'static str,
        per_second: u64,
    ) {
        if self.decision_log.draw() {
            self.decision_log.event(
                "rlqs",
                &OperationEvent {
                    operation: "assign",
                    namespace,
                    resource: bucket,
                    domain: envoy,
                    outcome,
                    amount: per_second,
                },
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn domains_past_the_cap_fold_into_overflow() {
        let metrics = Metrics::new();
        fn event(domain: &str) -> OperationEvent<'_> {
            OperationEvent {
                operation: "request",
                namespace: "edge",
                resource: "api",
                domain,
                outcome: "ok",
                amount: 1,
            }
        }
        for n in 0..MAX_DOMAIN_SERIES {
            metrics.operation_answered(&event(&format!("tenant-{n}")));
        }
        // Known domains keep their series; new ones fold.
        metrics.operation_answered(&event("tenant-0"));
        metrics.operation_answered(&event("latecomer"));
        metrics.operation_answered(&event("another"));
        let text = metrics.encode();
        assert!(text.contains(r#"domain="tenant-0",operation="request",outcome="ok"} 2"#));
        assert!(text.contains(r#"domain="overflow",operation="request",outcome="ok"} 2"#));
        assert!(!text.contains("latecomer"));
        assert!(text.contains("charon_domain_series_folded_total 2"));
    }

    #[test]
    fn limit_labels_past_the_cap_fold_into_overflow() {
        let metrics = Metrics::new();
        for n in 0..super::super::MAX_LIMIT_SERIES {
            let key: std::sync::Arc<str> = std::sync::Arc::from(format!("ns.key_{n}"));
            metrics.limit_hits("ns", &key, super::super::LimitOutcome::WithinLimit, 1);
        }
        let known: std::sync::Arc<str> = std::sync::Arc::from("ns.key_0");
        let late: std::sync::Arc<str> = std::sync::Arc::from("ns.late");
        metrics.limit_hits("ns", &known, super::super::LimitOutcome::OverLimit, 2);
        metrics.limit_hits("ns", &late, super::super::LimitOutcome::WithinLimit, 3);
        let text = metrics.encode();
        assert!(text.contains(
            "charon_limit_hits_total{namespace=\"ns\",limit=\"ns.key_0\",outcome=\"over_limit\"} 2"
        ));
        assert!(text.contains(
            "charon_limit_hits_total{namespace=\"ns\",limit=\"overflow\",outcome=\"within_limit\"} 3"
        ));
        assert!(!text.contains("ns.late"));
        assert!(text.contains("charon_limit_series_folded_total 1"));
    }
}
