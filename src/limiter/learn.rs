//! Shadow-mode limits' use, told to whoever records it for a namespace
//! that learns (docs/design.md#learning-a-limit): each limit by the path
//! of entries that reaches it, each use by the request's values where the
//! path lets them vary (a `key` alone, or a wildcard counted per value).

use std::sync::Arc;

use crate::config::How;
use crate::config::learned::{Level, Subject, VALUE_SEPARATOR};
use crate::config::{Learn, Namespace};

use super::RateLimitRequest;
use super::prepare::Hits;
use super::resolve::Resolved;

/// Told the hits of a shadow-mode limit: namespace, subject
/// ([`Subject::encode`]), domain (the varying values), hits, and how the
/// namespace learns.
pub type Learner = Arc<dyn Fn(&str, &str, &str, u64, &Learn) + Send + Sync>;

pub(super) fn shadow_limits(
    learner: &Learner,
    learn: &Learn,
    namespace: &Namespace,
    request: &RateLimitRequest,
    resolved: &[Resolved<'_>],
    all_in_shadow_mode: bool,
) {
    for (descriptor, resolved) in request.descriptors.iter().zip(resolved) {
        let Resolved::Fixed { shadow, .. } = resolved else {
            continue;
        };
        if !(*shadow || all_in_shadow_mode) || descriptor.refund {
            continue;
        }
        let entries = descriptor
            .entries
            .iter()
            .map(|(key, value)| (key.as_str(), value.as_str()));
        let Some(found) = namespace.descriptors.find(entries) else {
            continue;
        };
        let mut path = Vec::with_capacity(found.path.len());
        let mut domain = String::new();
        for ((node, how), (key, value)) in found.path.iter().zip(&descriptor.entries) {
            let pattern = || {
                node.written
                    .strip_prefix(key.as_str())
                    .and_then(|rest| rest.strip_prefix('_'))
                    .unwrap_or("")
                    .to_owned()
            };
            let level = match how {
                How::Exact => Level::Value(value.clone()),
                How::Wildcard if node.shared_value.is_some() => Level::Shared(pattern()),
                How::Wildcard => Level::Pattern(pattern()),
                How::Any => Level::Any,
            };
            if level.varies() {
                if !domain.is_empty() {
                    domain.push(VALUE_SEPARATOR);
                }
                domain.push_str(value);
            }
            path.push((key.clone(), level));
        }
        let hits = Hits::Asked.of(resolved, descriptor, request.hits_addend);
        learner(
            &namespace.name,
            &Subject::Limit(path).encode(),
            &domain,
            hits,
            learn,
        );
    }
}
