//! `release`: copies out of the hold set first, then back to the store, so
//! that two releases never give back the same copy.

use crate::engine::copies::CopyLimits;

use crate::service::error::Error;
use crate::service::ops::{CopyContext, Release, ReleaseAnswer};

use super::Session;

impl Session {
    pub(super) async fn release(&self, op: &Release) -> Result<ReleaseAnswer, Error> {
        let key = &op.held;
        let at = &key.at;
        let copies = op.copies;
        self.take(key, copies)?;
        let membership = match self.serving(&at.namespace, &at.resource) {
            Ok(membership) => membership,
            Err(error) => {
                self.untake(key.clone(), copies);
                return Err(error);
            }
        };
        // Done before the copies are free: a waiter woken by the release
        // sees the work done, and reads its result rather than computing.
        if op.done
            && let Err(error) = self.service.copies.mark_done(at.at()).await
        {
            self.untake(key.clone(), copies);
            return Err(self.copy_error(&membership, error));
        }
        let limits = self.limits_now(&at.namespace, &at.resource, &at.domain);
        let now_groups: Vec<&str> = limits.iter().flat_map(CopyLimits::group_names).collect();
        match self
            .service
            .copies
            .release(
                self.contributor(&membership),
                at.at(),
                &key.groups,
                copies,
                &now_groups,
            )
            .await
        {
            Ok(changed) => {
                if op.done {
                    self.service.waiting.done(at);
                }
                self.service.waiting.released(&at.namespace, &at.resource);
                Ok(ReleaseAnswer {
                    released: copies,
                    context: CopyContext {
                        limits,
                        counts: changed.counts,
                    },
                })
            }
            Err(error) => {
                self.untake(key.clone(), copies);
                Err(self.copy_error(&membership, error))
            }
        }
    }
}
