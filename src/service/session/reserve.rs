//! `reserve`: copies for a domain, all or the most that fit between a
//! minimum and what was asked, added to the session's hold set.

use crate::api::v1::error::Kind;
use crate::api::v1::{ReserveAnswer, ReserveOp};
use crate::engine::copies::{CopyLimits, canonical_groups};

use crate::service::core::{ApiError, Target, check_names, copies_range, copy_context};

use super::{HoldKey, MAX_HOLDS, Session};

impl Session {
    pub(super) async fn reserve(&self, op: &ReserveOp) -> Result<ReserveAnswer, ApiError> {
        check_names(&op.namespace, &op.resource, &op.domain)?;
        let (copies, min_copies) = copies_range(op.copies, op.min_copies)?;
        let (limits, decide_with) = match self.service.target(&op.namespace, &op.resource)? {
            Target::Copies(namespace, resource) => {
                let limits = CopyLimits::for_domain(&resource, &op.domain);
                let decide_with = if namespace.settings.ignore_configured {
                    CopyLimits::unlimited(limits.groups.clone())
                } else {
                    limits.clone()
                };
                (Some(limits), decide_with)
            }
            Target::Rate(..) => {
                return Err(ApiError::new(
                    Kind::WrongKind,
                    format!(
                        "resource `{}` is rate-limited: use request, not reserve",
                        op.resource
                    ),
                ));
            }
            Target::Capacity(..) => {
                return Err(ApiError::new(
                    Kind::WrongKind,
                    format!(
                        "resource `{}` is a leased capacity: use GetCapacity, not reserve",
                        op.resource
                    ),
                ));
            }
            Target::Unconfigured(_) => (None, CopyLimits::unlimited(Vec::new())),
        };
        let key = HoldKey {
            namespace: op.namespace.clone(),
            resource: op.resource.clone(),
            domain: op.domain.clone(),
            groups: canonical_groups(decide_with.group_names()),
        };
        {
            let holds = self.holds();
            if holds.held.len() >= MAX_HOLDS && !holds.held.contains_key(&key) {
                return Err(ApiError::new(
                    Kind::TooMany,
                    format!(
                        "this session already holds {MAX_HOLDS} distinct (resource, domain, groups)"
                    ),
                ));
            }
        }
        let membership = self.serving(&op.namespace, &op.resource)?;
        let changed = self
            .service
            .copies
            .reserve(
                self.contributor(&membership),
                key.at(),
                &decide_with,
                copies,
                min_copies,
            )
            .await
            .map_err(|error| self.copy_error(&membership, error))?;
        let groups: Vec<String> = decide_with.group_names().map(str::to_owned).collect();
        if changed.copies > 0 {
            self.hold(key, changed.copies);
        }
        Ok(ReserveAnswer {
            granted: changed.copies,
            groups,
            retry_after_ms: (changed.copies > 0).then_some(0),
            degraded: false,
            context: Some(copy_context(limits.as_ref(), &changed.counts)),
        })
    }
}
