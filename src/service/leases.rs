//! Capacity leases on the service (docs/design.md#capacity-leases):
//! `GetCapacity` and `ReleaseCapacity`, looked up in the running
//! configuration and apportioned by the lease store. Each resource of a
//! request is answered on its own: one unknown resource does not cost the
//! others their leases.

use crate::config::Config;
use crate::engine::capacity::{CapacityConfig, Want};
use crate::store::ResourceRef;

use super::Service;
use super::core::{Target, not_configured, target_in};
use super::error::{Error, Kind};
use super::global::global_capacity;
use super::ops::{GetCapacity, Leases, ReleaseCapacity, check_names};

impl Service {
    /// Each wanted resource's lease, or why it has none.
    pub async fn get_capacity(&self, request: &GetCapacity) -> Leases {
        // One configuration for the whole call, even if it is reloaded meanwhile.
        let config = self.config();
        let mut answers = Vec::with_capacity(request.wants.len());
        for want in &request.wants {
            let at = want.at.at();
            let answer = match self.capacity_of(&config, at) {
                Ok((config, from_parent)) => {
                    let config = if from_parent {
                        self.parent.effective(at, config)
                    } else {
                        config
                    };
                    let lease = self
                        .leases
                        .get(
                            at,
                            &config,
                            &request.client_id,
                            Want {
                                wants: want.wants,
                                has: want.has,
                                held_below: want.held_below,
                            },
                        )
                        .await;
                    if let Ok(lease) = &lease {
                        tracing::debug!(
                            client = %request.client_id,
                            resource = %at.resource,
                            wants = want.wants,
                            held_below = want.held_below,
                            capacity = config.capacity,
                            granted = lease.capacity,
                            refresh_ms = lease.refresh_interval_ms,
                            "lease given"
                        );
                        self.lease_answered(at, &config, &request.client_id, lease, from_parent)
                            .await;
                    }
                    lease.map_err(Error::from)
                }
                Err(error) => Err(error),
            };
            answers.push(answer);
        }
        answers
    }

    /// Whether each resource had a lease of this client to give back.
    pub async fn release_capacity(&self, request: &ReleaseCapacity) -> Result<Vec<bool>, Error> {
        let mut released = Vec::with_capacity(request.resources.len());
        for at in &request.resources {
            check_names(&at.namespace, &at.resource, &at.domain)?;
            released.push(self.leases.release(at.at(), &request.client_id).await?);
        }
        Ok(released)
    }

    /// The capacity configuration of `at`'s domain in `config`, and
    /// whether it is leased from the parent.
    pub(super) fn capacity_of(
        &self,
        config: &Config,
        at: ResourceRef<'_>,
    ) -> Result<(CapacityConfig, bool), Error> {
        check_names(at.namespace, at.resource, at.domain)?;
        if let Some(global) = config
            .namespace(at.namespace)
            .and_then(|namespace| namespace.globals.get(at.resource))
        {
            return Ok((
                global_capacity(&global.limit, self.global_timing),
                self.parent.is_linked(),
            ));
        }
        match target_in(config, at.namespace, at.resource)? {
            Target::Capacity(_, capacity) => {
                Ok((*capacity.config_for(at.domain), capacity.from_parent))
            }
            // Leases are only handed out for a configured capacity.
            Target::Unconfigured(_) => Err(not_configured(at.namespace, at.resource)),
            Target::Rate(..) | Target::Copies(..) => Err(Error::new(
                Kind::WrongKind,
                format!(
                    "resource `{}` is not a leased capacity: use request or reserve",
                    at.resource
                ),
            )),
        }
    }
}
