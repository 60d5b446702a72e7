//! `transfer`: held copies parked under a fresh transfer id, still counted
//! against every limit, until a session seizes them or the ttl runs out.

use crate::service::error::{Error, Kind};
use crate::service::ops::{Transfer, TransferAnswer};

use super::Session;

impl Session {
    pub(super) async fn transfer(&self, op: &Transfer) -> Result<TransferAnswer, Error> {
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
        match self
            .service
            .copies
            .transfer(
                self.contributor(&membership),
                at.at(),
                &key.groups,
                copies,
                op.ttl_ms,
            )
            .await
        {
            // The log held none of them for this session (a store failure
            // lost them): nothing was staged.
            Ok(staged) if staged.changed.copies == 0 => Err(Error::new(
                Kind::NotHeld,
                "the copy log holds none of these copies for this session any more (lost in a store failure); nothing was staged",
            )),
            Ok(staged) => Ok(TransferAnswer {
                transfer_id: staged.transfer_id,
                copies: staged.changed.copies,
            }),
            Err(error) => {
                self.untake(key.clone(), copies);
                Err(self.copy_error(&membership, error))
            }
        }
    }
}
