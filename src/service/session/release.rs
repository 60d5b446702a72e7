//! `release`: copies out of the hold set first, then back to the store, so
//! that two releases never give back the same copy.

use crate::api::v1::{ReleaseAnswer, ReleaseOp};
use crate::engine::copies::CopyLimits;

use crate::service::core::{ApiError, copy_context, count};

use super::Session;

impl Session {
    pub(super) async fn release(&self, op: &ReleaseOp) -> Result<ReleaseAnswer, ApiError> {
        let key = self.hold_key(&op.namespace, &op.resource, &op.domain, &op.groups)?;
        let copies = count("copies", op.copies)?;
        self.take(&key, copies)?;
        let membership = match self.serving(&op.namespace, &op.resource) {
            Ok(membership) => membership,
            Err(error) => {
                self.untake(key, copies);
                return Err(error);
            }
        };
        let limits = self.limits_now(&op.namespace, &op.resource, &op.domain);
        let now_groups: Vec<&str> = limits.iter().flat_map(CopyLimits::group_names).collect();
        match self
            .service
            .copies
            .release(
                self.contributor(&membership),
                key.at(),
                &key.groups,
                copies,
                &now_groups,
            )
            .await
        {
            Ok(changed) => Ok(ReleaseAnswer {
                released: copies,
                context: Some(copy_context(limits.as_ref(), &changed.counts)),
            }),
            Err(error) => {
                self.untake(key, copies);
                Err(self.copy_error(&membership, error))
            }
        }
    }
}
