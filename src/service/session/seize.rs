//! `seize`: parked copies of a transfer moved into this session, on any
//! sidecar sharing the store; an id is seized once.

use crate::engine::copies::{CopyLimits, canonical_groups};
use crate::store::copies::parse_transfer_id;

use crate::service::error::{Error, Kind};
use crate::service::ops::{CopyContext, Held, ResourceKey, Seize, SeizeAnswer};

use super::Session;

impl Session {
    pub(super) async fn seize(&self, op: &Seize) -> Result<SeizeAnswer, Error> {
        if op.transfer_id.is_empty() || op.transfer_id.len() > 2 * (32 + 2 * 4_096) {
            return Err(Error::new(
                Kind::UnknownTransfer,
                "no such transfer, or it has expired",
            ));
        }
        let Some((_, namespace, resource)) = parse_transfer_id(&op.transfer_id) else {
            return Err(Error::new(
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
        let at = ResourceKey::new(seized.namespace, seized.resource, seized.domain);
        let key = Held {
            at: at.clone(),
            groups: canonical_groups(seized.groups.iter().map(String::as_str)),
        };
        self.hold(key.clone(), seized.copies);
        let limits = self.limits_now(&at.namespace, &at.resource, &at.domain);
        let now_groups: Vec<&str> = limits.iter().flat_map(CopyLimits::group_names).collect();
        // The context is a second read: the seize itself is already done.
        let context = match self.service.copies.counts(key.at.at(), &now_groups).await {
            Ok(counts) => Some(CopyContext { limits, counts }),
            Err(_) => None,
        };
        Ok(SeizeAnswer {
            at,
            groups: seized.groups,
            copies: seized.copies,
            context,
        })
    }
}
