//! Capacity leases for the Charon API (docs/design.md#capacity-leases):
//! `GetCapacity` and `ReleaseCapacity`, checked and looked up in the running
//! configuration, apportioned by the lease store. Each resource of a request
//! is answered on its own: one unknown resource does not cost the others
//! their leases.

use crate::api::v1::capacity_answer::Result as Answered;
use crate::api::v1::error::Kind;
use crate::api::v1::{
    CapacityAnswer, CapacityLease, GetCapacityRequest, GetCapacityResponse, ReleaseCapacityRequest,
    ReleaseCapacityResponse,
};
use crate::config::Config;
use crate::engine::capacity::CapacityConfig;
use crate::store::ResourceRef;
use crate::store::leases::LeaseError;

use super::Service;
use super::core::{ApiError, Target, check_name, check_names, not_configured, target_in};

/// Resources in one `GetCapacity` or `ReleaseCapacity`.
pub const MAX_RESOURCES_PER_CALL: usize = 256;

impl From<LeaseError> for ApiError {
    fn from(error: LeaseError) -> Self {
        let kind = match &error {
            LeaseError::Invalid(_) => Kind::Malformed,
            LeaseError::Unavailable(_) => Kind::StoreUnavailable,
        };
        ApiError::new(kind, error.to_string())
    }
}

impl Service {
    pub async fn get_capacity(
        &self,
        request: &GetCapacityRequest,
    ) -> Result<GetCapacityResponse, ApiError> {
        check_call(&request.client_id, request.resources.len())?;
        // One configuration for the whole call, even if it is reloaded meanwhile.
        let config = self.config();
        let mut answers = Vec::with_capacity(request.resources.len());
        for want in &request.resources {
            let at = ResourceRef {
                namespace: &want.namespace,
                resource: &want.resource,
                domain: &want.domain,
            };
            let result = match Self::capacity_of(&config, at) {
                Ok(config) => self
                    .leases
                    .get(at, &config, &request.client_id, want.wants, want.has)
                    .await
                    .map(|lease| {
                        Answered::Lease(CapacityLease {
                            capacity: lease.capacity,
                            expiry_ms: lease.expiry_ms,
                            refresh_interval_ms: lease.refresh_interval_ms,
                            safe_capacity: lease.safe_capacity,
                        })
                    })
                    .map_err(ApiError::from),
                Err(error) => Err(error),
            };
            answers.push(CapacityAnswer {
                result: Some(result.unwrap_or_else(|error| Answered::Error(error.into_wire()))),
            });
        }
        Ok(GetCapacityResponse { answers })
    }

    pub async fn release_capacity(
        &self,
        request: &ReleaseCapacityRequest,
    ) -> Result<ReleaseCapacityResponse, ApiError> {
        check_call(&request.client_id, request.resources.len())?;
        let mut released = Vec::with_capacity(request.resources.len());
        for resource in &request.resources {
            let at = ResourceRef {
                namespace: &resource.namespace,
                resource: &resource.resource,
                domain: &resource.domain,
            };
            check_names(at.namespace, at.resource, at.domain)?;
            released.push(self.leases.release(at, &request.client_id).await?);
        }
        Ok(ReleaseCapacityResponse { released })
    }

    /// The capacity configuration of `at`'s domain in `config`.
    fn capacity_of(config: &Config, at: ResourceRef<'_>) -> Result<CapacityConfig, ApiError> {
        check_names(at.namespace, at.resource, at.domain)?;
        match target_in(config, at.namespace, at.resource)? {
            Target::Capacity(_, capacity) => Ok(*capacity.config_for(at.domain)),
            // Leases are only handed out for a configured capacity.
            Target::Unconfigured(_) => Err(not_configured(at.namespace, at.resource)),
            Target::Rate(..) | Target::Copies(..) => Err(ApiError::new(
                Kind::WrongKind,
                format!(
                    "resource `{}` is not a leased capacity: use request or reserve",
                    at.resource
                ),
            )),
        }
    }
}

fn check_call(client_id: &str, resources: usize) -> Result<(), ApiError> {
    check_name("client_id", client_id)?;
    if resources > MAX_RESOURCES_PER_CALL {
        return Err(ApiError::new(
            Kind::TooMany,
            format!("{resources} resources in one call; at most {MAX_RESOURCES_PER_CALL}"),
        ));
    }
    Ok(())
}
