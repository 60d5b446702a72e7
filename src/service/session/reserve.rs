//! `reserve`: copies for a domain, all or the most that fit between a
//! minimum and what was asked, added to the session's hold set.

use crate::engine::copies::{CopyLimits, canonical_groups};

use crate::service::core::Target;
use crate::service::error::{Error, Kind};
use crate::service::ops::{CopyContext, Held, Reserve, ReserveAnswer};

use super::{MAX_HOLDS, Session};

impl Session {
    pub(super) async fn reserve(&self, op: &Reserve) -> Result<ReserveAnswer, Error> {
        let at = &op.at;
        let (limits, decide_with) = match self.service.target(&at.namespace, &at.resource)? {
            Target::Copies(namespace, resource) => {
                let limits = CopyLimits::for_domain(&resource, &at.domain);
                let decide_with = if namespace.settings.ignore_configured {
                    CopyLimits::unlimited(limits.groups.clone())
                } else {
                    limits.clone()
                };
                (Some(limits), decide_with)
            }
            Target::Rate(..) => {
                return Err(Error::new(
                    Kind::WrongKind,
                    format!(
                        "resource `{}` is rate-limited: use request, not reserve",
                        at.resource
                    ),
                ));
            }
            Target::Capacity(..) => {
                return Err(Error::new(
                    Kind::WrongKind,
                    format!(
                        "resource `{}` is a leased capacity: use GetCapacity, not reserve",
                        at.resource
                    ),
                ));
            }
            Target::Unconfigured(_) => (None, CopyLimits::unlimited(Vec::new())),
        };
        let key = Held {
            at: at.clone(),
            groups: canonical_groups(decide_with.group_names()),
        };
        {
            let holds = self.holds();
            if holds.held.len() >= MAX_HOLDS && !holds.held.contains_key(&key) {
                return Err(Error::new(
                    Kind::TooMany,
                    format!(
                        "this session already holds {MAX_HOLDS} distinct (resource, domain, groups)"
                    ),
                ));
            }
        }
        let membership = self.serving(&at.namespace, &at.resource)?;
        let changed = self
            .service
            .copies
            .reserve(
                self.contributor(&membership),
                key.at.at(),
                &decide_with,
                op.copies,
                op.min_copies,
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
            context: CopyContext {
                limits,
                counts: changed.counts,
            },
        })
    }
}
