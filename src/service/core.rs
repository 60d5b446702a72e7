//! The Charon API's rate requests on the [`Service`], whatever carries them
//! (the gRPC service or the embedded client), and what a (namespace,
//! resource) names in the running configuration.

use std::sync::Arc;

use crate::config::learned::Subject;
use crate::config::{CapacityResource, Config, CopyResource, Namespace, RateResource, Resource};
use crate::engine::TierOutcome;

use super::Service;
use super::error::{Error, Kind};
use super::ops::{RateAnswer, RateContext, RateRequest};

/// What a (namespace, resource) names in the running configuration.
pub enum Target {
    Rate(Arc<Namespace>, Arc<RateResource>),
    Copies(Arc<Namespace>, Arc<CopyResource>),
    Capacity(Arc<Namespace>, Arc<CapacityResource>),
    /// Not configured, but the namespace has `allow_unconfigured`.
    Unconfigured(Arc<Namespace>),
}

/// `resource` of `namespace` in `config`, or the typed error saying which of
/// the two is not configured.
pub fn target_in(config: &Config, namespace: &str, resource: &str) -> Result<Target, Error> {
    let Some(found) = config.namespace(namespace) else {
        return Err(Error::new(
            Kind::UnknownResource,
            format!("namespace `{namespace}` is not configured"),
        ));
    };
    match found.resources.get(resource) {
        Some(Resource::Rate(rate)) => Ok(Target::Rate(found.clone(), rate.clone())),
        Some(Resource::Copies(copies)) => Ok(Target::Copies(found.clone(), copies.clone())),
        Some(Resource::Capacity(capacity)) => Ok(Target::Capacity(found.clone(), capacity.clone())),
        None if found.settings.allow_unconfigured => Ok(Target::Unconfigured(found.clone())),
        None => Err(not_configured(namespace, resource)),
    }
}

/// `resource` is not in `namespace`.
pub fn not_configured(namespace: &str, resource: &str) -> Error {
    Error::new(
        Kind::UnknownResource,
        format!("resource `{resource}` is not configured in namespace `{namespace}`"),
    )
}

impl Service {
    pub fn target(&self, namespace: &str, resource: &str) -> Result<Target, Error> {
        target_in(&self.limiter.config(), namespace, resource)
    }

    /// The unary `Request`, and `request` in a session.
    pub async fn request(&self, op: &RateRequest) -> Result<RateAnswer, Error> {
        let at = &op.at;
        match self.target(&at.namespace, &at.resource)? {
            Target::Rate(_, rate)
                if matches!(
                    rate.alternative,
                    Some(crate::config::ResourceLimit::Budget { .. })
                ) =>
            {
                Err(Error::new(
                    Kind::WrongKind,
                    format!(
                        "resource `{}` is a budget of a cost known after the response: use Cost (reserve and commit), or Envoy's check and charge",
                        at.resource
                    ),
                ))
            }
            Target::Rate(namespace, rate) => {
                let (outcome, degraded) = self
                    .limiter
                    .request_hits(&namespace, &rate, &at.domain, op.hits, op.min_hits)
                    .await
                    .map_err(|error| Error::new(Kind::StoreUnavailable, error.to_string()))?;
                let mut answer = rate_answer(
                    &outcome,
                    degraded,
                    namespace.settings.ignore_configured,
                    op.hits,
                );
                answer.soft_limit_exceeded = !outcome.over
                    && rate.soft_limit.is_some_and(|soft| {
                        soft.exceeded(outcome.snapshot.tier_hits, outcome.snapshot.tier_limit)
                    });
                self.observer.rate_request(
                    &namespace.name,
                    &rate.name,
                    op.hits,
                    rate_outcome(&outcome, namespace.settings.ignore_configured),
                );
                Ok(answer)
            }
            Target::Copies(..) => Err(Error::new(
                Kind::WrongKind,
                format!(
                    "resource `{}` is copy-limited: use reserve and release, not request",
                    at.resource
                ),
            )),
            Target::Capacity(..) => Err(Error::new(
                Kind::WrongKind,
                format!(
                    "resource `{}` is a leased capacity: use GetCapacity, not request",
                    at.resource
                ),
            )),
            Target::Unconfigured(namespace) => {
                self.observer
                    .unconfigured_request(&namespace.name, &at.resource, op.hits);
                if let Some(learn) = &namespace.settings.learn {
                    let subject = Subject::Resource(at.resource.clone()).encode();
                    self.learn
                        .record(&namespace.name, &subject, &at.domain, op.hits, learn);
                }
                Ok(RateAnswer {
                    granted: op.hits,
                    retry_after_ms: Some(0),
                    degraded: false,
                    soft_limit_exceeded: false,
                    context: RateContext::default(),
                })
            }
        }
    }
}

/// A decided rate request as the metrics see it.
fn rate_outcome(outcome: &TierOutcome, ignore: bool) -> super::RateOutcome {
    let snapshot = &outcome.snapshot;
    let used = snapshot.tier_limit.saturating_sub(snapshot.remaining);
    super::RateOutcome {
        over: outcome.over,
        shadow: outcome.over && ignore,
        near: !outcome.over && used.saturating_mul(5) > snapshot.tier_limit.saturating_mul(4),
        tier: snapshot.tier,
        limited_by: outcome.limited_by(),
    }
}

fn rate_answer(outcome: &TierOutcome, degraded: bool, ignore: bool, hits: u64) -> RateAnswer {
    let granted = if ignore && outcome.granted == 0 {
        // `ignore_configured`: granted whatever the limits say.
        hits
    } else {
        outcome.granted
    };
    RateAnswer {
        granted,
        retry_after_ms: outcome.retry_after,
        degraded,
        soft_limit_exceeded: false,
        context: RateContext::from(outcome),
    }
}
