//! The lease wing of the service, under one roof: every kind of lease
//! state a server keeps, each with its one owner in [`LeaseStates`], and the
//! operations over them.
//!
//! - Capacity leases (docs/design.md#capacity-leases): `GetCapacity` and
//!   `ReleaseCapacity`, looked up in the running configuration and
//!   apportioned by the lease store (this file). Each resource of a request
//!   is answered on its own: one unknown resource does not cost the others
//!   their leases.
//! - Global limits' shares among the servers of a hierarchy, renewed in the
//!   service's housekeeping ([`share_renewal`]).
//! - RLQS buckets' shares among the Envoys that report them ([`quota`]).
//! - A parent's grants, for the resources this level leases from it
//!   ([`parent`]), and the nudges pushed down to the levels below
//!   ([`nudge`]).
//!
//! Every lease state lives in the one lease store, keyed by its
//! [`LeaseSpace`]: a user's names and the server's own never meet.

pub mod nudge;
pub mod parent;
pub mod quota;
pub mod share_renewal;

use crate::config::Config;
use crate::config::global::{GlobalTiming, RESOURCE_PREFIX};
use crate::engine::capacity::{CapacityConfig, Want};
use crate::store::ResourceRef;
use crate::store::leases::{LeaseKey, LeaseLog, LeaseSpace};

use self::nudge::Nudges;
use self::parent::ParentShares;
use self::share_renewal::global_capacity;
use crate::service::Service;
use crate::service::core::{Target, not_configured, target_in};
use crate::service::error::{Error, Kind};
use crate::service::ops::{GetCapacity, Leases, ReleaseCapacity, check_names};

/// Every kind of lease state this server keeps, each with its one owner.
pub struct LeaseStates {
    /// Every client's lease of every lease state (capacity resources,
    /// global limits' shares, RLQS buckets): in the process, or on Redis
    /// for every sidecar on it.
    pub store: Box<dyn LeaseLog>,
    /// The grants of a parent server, and what to ask it for.
    pub parent: ParentShares,
    /// The levels below this one that watch their leases.
    pub nudges: Nudges,
    /// How this server leases its global limits' shares.
    pub global_timing: GlobalTiming,
    /// Per RLQS bucket: the second and the tokens of new buckets given to
    /// its Envoys in it (docs/design.md#rlqs).
    pub rlqs_new_tokens: std::sync::Mutex<std::collections::HashMap<String, (u64, u32)>>,
}

impl LeaseStates {
    pub fn new(store: Box<dyn LeaseLog>) -> Self {
        Self {
            store,
            parent: ParentShares::default(),
            nudges: Nudges::default(),
            global_timing: GlobalTiming::default(),
            rlqs_new_tokens: Default::default(),
        }
    }
}

/// How a lease of a resource named on the wire is decided.
pub(super) struct Leased<'a> {
    pub key: LeaseKey<'a>,
    pub config: CapacityConfig,
    /// Whether the capacity is leased from the parent.
    pub from_parent: bool,
}

/// The key space a resource named in `GetCapacity` or `ReleaseCapacity`
/// belongs to: a global limit's shares are asked for under their reserved
/// prefix (which no configured resource may start with), everything else
/// is a configured capacity.
fn wire_key(at: ResourceRef<'_>) -> LeaseKey<'_> {
    let space = if at.resource.starts_with(RESOURCE_PREFIX) {
        LeaseSpace::GlobalLimit
    } else {
        LeaseSpace::Capacity
    };
    LeaseKey { space, at }
}

impl Service {
    /// Each wanted resource's lease, or why it has none.
    pub async fn get_capacity(&self, request: &GetCapacity) -> Leases {
        // One configuration for the whole call, even if it is reloaded meanwhile.
        let config = self.config();
        let mut answers = Vec::with_capacity(request.wants.len());
        for want in &request.wants {
            let at = want.at.at();
            let answer = match self.capacity_of(&config, at) {
                Ok(Leased {
                    key,
                    config,
                    from_parent,
                }) => {
                    let now = self.clock.now_ms();
                    let config = match (from_parent, key.space) {
                        (false, _) => config,
                        (true, LeaseSpace::GlobalLimit) => {
                            self.global_under_parent(key.at, config, now)
                        }
                        (true, _) => self.leases.parent.effective(key.at, config, now),
                    };
                    let lease = self
                        .leases
                        .store
                        .get(
                            key,
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
                        self.lease_answered(key, &config, &request.client_id, lease, from_parent)
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
            released.push(
                self.leases
                    .store
                    .release(wire_key(at.at()), &request.client_id)
                    .await?,
            );
        }
        Ok(released)
    }

    /// How a lease of `at` is decided in `config`: its key, its capacity
    /// configuration, and whether it is leased from the parent.
    pub(super) fn capacity_of<'a>(
        &self,
        config: &Config,
        at: ResourceRef<'a>,
    ) -> Result<Leased<'a>, Error> {
        check_names(at.namespace, at.resource, at.domain)?;
        let key = wire_key(at);
        if key.space == LeaseSpace::GlobalLimit {
            let Some(global) = config
                .namespace(at.namespace)
                .and_then(|namespace| namespace.globals.get(at.resource))
            else {
                return Err(not_configured(at.namespace, at.resource));
            };
            return Ok(Leased {
                key,
                config: global_capacity(global, self.leases.global_timing),
                from_parent: self.leases.parent.is_linked(),
            });
        }
        match target_in(config, at.namespace, at.resource)? {
            Target::Capacity(_, capacity) => Ok(Leased {
                key,
                config: *capacity.config_for(at.domain),
                from_parent: capacity.from_parent,
            }),
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
