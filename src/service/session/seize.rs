//! `seize`: parked copies of a transfer moved into this session, on any
//! sidecar sharing the store; an id is seized once.

use crate::api::v1::error::Kind;
use crate::api::v1::{SeizeAnswer, SeizeOp};
use crate::engine::copies::{CopyLimits, canonical_groups};
use crate::store::copies::parse_transfer_id;

use crate::service::core::{ApiError, copy_context};

use super::{HoldKey, Session};

impl Session {
    pub(super) async fn seize(&self, op: &SeizeOp) -> Result<SeizeAnswer, ApiError> {
        if op.transfer_id.is_empty() || op.transfer_id.len() > 2 * (32 + 2 * 4_096) {
            return Err(ApiError::new(
                Kind::UnknownTransfer,
                "no such transfer, or it has expired",
            ));
        }
        let Some((_, namespace, resource)) = parse_transfer_id(&op.transfer_id) else {
            return Err(ApiError::new(
                Kind::UnknownTransfer,
                "no such transfer, or it has expired",
            ));
        };
        let membership = self.serving(&namespace, &resource)?;
        let seized = self
            .service
            .copies
            .seize(self.contributor(&membership), &op.transfer_id)
            .await
            .map_err(|error| self.copy_error(&membership, error))?;
        let key = HoldKey {
            namespace: seized.namespace.clone(),
            resource: seized.resource.clone(),
            domain: seized.domain.clone(),
            groups: canonical_groups(seized.groups.iter().map(String::as_str)),
        };
        self.hold(key.clone(), seized.copies);
        let limits = self.limits_now(&seized.namespace, &seized.resource, &seized.domain);
        let now_groups: Vec<&str> = limits.iter().flat_map(CopyLimits::group_names).collect();
        // The context is a second read: the seize itself is already done.
        let context = match self.service.copies.counts(key.at(), &now_groups).await {
            Ok(counts) => Some(copy_context(limits.as_ref(), &counts)),
            Err(_) => None,
        };
        Ok(SeizeAnswer {
            namespace: seized.namespace,
            resource: seized.resource,
            domain: seized.domain,
            groups: seized.groups,
            copies: seized.copies,
            context,
        })
    }
}
