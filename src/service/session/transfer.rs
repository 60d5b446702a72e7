//! `transfer`: held copies parked under a fresh transfer id, still counted
//! against every limit, until a session seizes them or the ttl runs out.

use crate::api::v1::error::Kind;
use crate::api::v1::{TransferAnswer, TransferOp};

use crate::service::core::{ApiError, MAX_TRANSFER_TTL_MS, count};

use super::Session;

impl Session {
    pub(super) async fn transfer(&self, op: &TransferOp) -> Result<TransferAnswer, ApiError> {
        let key = self.hold_key(&op.namespace, &op.resource, &op.domain, &op.groups)?;
        let copies = count("copies", op.copies)?;
        if !(1..=MAX_TRANSFER_TTL_MS).contains(&op.ttl_ms) {
            return Err(ApiError::malformed(format!(
                "ttl_ms must be between 1 and {MAX_TRANSFER_TTL_MS}, not {}",
                op.ttl_ms
            )));
        }
        self.take(&key, copies)?;
        let membership = match self.serving(&op.namespace, &op.resource) {
            Ok(membership) => membership,
            Err(error) => {
                self.untake(key, copies);
                return Err(error);
            }
        };
        match self
            .service
            .copies
            .transfer(
                self.contributor(&membership),
                key.at(),
                &key.groups,
                copies,
                op.ttl_ms,
            )
            .await
        {
            // The log held none of them for this session (a store failure
            // lost them): nothing was staged.
            Ok(staged) if staged.changed.copies == 0 => Err(ApiError::new(
                Kind::NotHeld,
                "the copy log holds none of these copies for this session any more (lost in a store failure); nothing was staged",
            )),
            Ok(staged) => Ok(TransferAnswer {
                transfer_id: staged.transfer_id,
                copies: staged.changed.copies,
            }),
            Err(error) => {
                self.untake(key, copies);
                Err(self.copy_error(&membership, error))
            }
        }
    }
}
