//! What the service is asked and what it answers, as domain types: the
//! faces parse their wire messages into these once (with the checks a
//! request can fail by itself: names, counts, groups, a ttl), so the
//! service never sees a wire type and every face gets the same errors.
//! Checks that need the configuration or the store stay in the service.

use std::time::Duration;

use crate::criticality::Criticality;
use crate::engine::TierOutcome;
use crate::engine::capacity::Lease;
use crate::engine::copies::{CopyCounts, CopyLimits, canonical_groups};
use crate::store::ResourceRef;

use crate::limiter::caps;

use super::error::{Error, Kind};

/// Copies asked for in one operation, at most.
pub const MAX_COPIES: u64 = 1_000_000_000;
/// Groups named in one release or transfer, at most.
pub const MAX_GROUPS: usize = 64;
/// The longest a transfer may stay staged.
pub const MAX_TRANSFER_TTL_MS: u64 = 24 * 60 * 60 * 1000;
/// Resources in one `GetCapacity` or `ReleaseCapacity`.
pub const MAX_RESOURCES_PER_CALL: usize = 256;

/// (namespace, resource, domain), owned: what an operation is about.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct ResourceKey {
    pub namespace: String,
    pub resource: String,
    pub domain: String,
}

impl ResourceKey {
    /// The three names as they came, unchecked.
    pub fn new(
        namespace: impl Into<String>,
        resource: impl Into<String>,
        domain: impl Into<String>,
    ) -> Self {
        Self {
            namespace: namespace.into(),
            resource: resource.into(),
            domain: domain.into(),
        }
    }

    /// As the stores take it.
    pub fn at(&self) -> ResourceRef<'_> {
        ResourceRef {
            namespace: &self.namespace,
            resource: &self.resource,
            domain: &self.domain,
        }
    }
}

/// Hits on a rate-limited resource: the largest k in `[min_hits, hits]`
/// that fits, or nothing.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RateRequest {
    pub at: ResourceKey,
    pub hits: u64,
    pub min_hits: u64,
}

impl RateRequest {
    /// `hits` unset is 1; `min_hits` unset is `hits`.
    pub fn new(at: ResourceKey, hits: Option<i64>, min_hits: Option<i64>) -> Result<Self, Error> {
        check_names(&at.namespace, &at.resource, &at.domain)?;
        let (hits, min_hits) = copies_range(hits, min_hits)?;
        Ok(Self { at, hits, min_hits })
    }
}

/// Copies of a copy-limited resource for a domain: all, or the most that
/// fit between `min_copies` and `copies`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reserve {
    pub at: ResourceKey,
    pub copies: u64,
    pub min_copies: u64,
    /// How long it may wait for copies to be released (zero: not at all).
    pub max_wait: Duration,
    /// Its place in the queue of waiting reserves.
    pub criticality: Criticality,
    /// While it waits, a release of `at` as done answers it `done`
    /// (PoolCounter's ACQ4ANY, docs/design.md#waiting-for-anyones-result).
    pub for_anyone: bool,
}

/// The longest a reserve may wait for a copy.
pub const MAX_WAIT: Duration = Duration::from_secs(60);

impl Reserve {
    pub fn new(
        at: ResourceKey,
        copies: Option<i64>,
        min_copies: Option<i64>,
    ) -> Result<Self, Error> {
        check_names(&at.namespace, &at.resource, &at.domain)?;
        let (copies, min_copies) = copies_range(copies, min_copies)?;
        Ok(Self {
            at,
            copies,
            min_copies,
            max_wait: Duration::ZERO,
            criticality: Criticality::default(),
            for_anyone: false,
        })
    }

    /// Waits for anyone's result ([`Reserve::for_anyone`]).
    pub fn for_anyone(mut self, on: bool) -> Self {
        self.for_anyone = on;
        self
    }

    /// Waits up to `max_wait_ms` (at most [`MAX_WAIT`]) for copies, in the
    /// queue's place of `criticality`.
    pub fn waiting(
        mut self,
        max_wait_ms: Option<u64>,
        criticality: Criticality,
    ) -> Result<Self, Error> {
        let max_wait = Duration::from_millis(max_wait_ms.unwrap_or(0));
        if max_wait > MAX_WAIT {
            return Err(Error::new(
                Kind::Malformed,
                format!(
                    "max_wait_ms {}: at most {} ms",
                    max_wait.as_millis(),
                    MAX_WAIT.as_millis()
                ),
            ));
        }
        self.max_wait = max_wait;
        self.criticality = criticality;
        Ok(self)
    }
}

/// Held copies of (resource, domain, groups), named as a hold set keeps
/// them: the groups sorted, none twice.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Held {
    pub at: ResourceKey,
    pub groups: Vec<String>,
}

impl Held {
    pub fn new(at: ResourceKey, groups: Vec<String>) -> Result<Self, Error> {
        check_names(&at.namespace, &at.resource, &at.domain)?;
        if groups.len() > MAX_GROUPS {
            return Err(Error::malformed(format!("more than {MAX_GROUPS} groups")));
        }
        for group in &groups {
            check_name("a group name", group)?;
        }
        let sorted = canonical_groups(groups.iter().map(String::as_str));
        if sorted.windows(2).any(|pair| pair[0] == pair[1]) {
            return Err(Error::malformed("a group is named twice"));
        }
        Ok(Self { at, groups: sorted })
    }
}

/// Copies given back to the store.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Release {
    pub held: Held,
    pub copies: u64,
    /// The work the copies guarded is done: reserves waiting for anyone's
    /// result on the same (resource, domain) are answered `done`.
    pub done: bool,
}

impl Release {
    pub fn new(at: ResourceKey, groups: Vec<String>, copies: i64) -> Result<Self, Error> {
        let held = Held::new(at, groups)?;
        let copies = count("copies", copies)?;
        Ok(Self {
            held,
            copies,
            done: false,
        })
    }

    /// Releases as done ([`Release::done`]).
    pub fn done(mut self, on: bool) -> Self {
        self.done = on;
        self
    }
}

/// Held copies parked under a new transfer id for `ttl_ms`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Transfer {
    pub held: Held,
    pub copies: u64,
    pub ttl_ms: u64,
}

impl Transfer {
    pub fn new(
        at: ResourceKey,
        groups: Vec<String>,
        copies: i64,
        ttl_ms: u64,
    ) -> Result<Self, Error> {
        let held = Held::new(at, groups)?;
        let copies = count("copies", copies)?;
        if !(1..=MAX_TRANSFER_TTL_MS).contains(&ttl_ms) {
            return Err(Error::malformed(format!(
                "ttl_ms must be between 1 and {MAX_TRANSFER_TTL_MS}, not {ttl_ms}"
            )));
        }
        Ok(Self {
            held,
            copies,
            ttl_ms,
        })
    }
}

/// The copies of a transfer, moved into this session.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Seize {
    pub transfer_id: String,
}

/// One operation of a session.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Operation {
    Request(RateRequest),
    Reserve(Reserve),
    Release(Release),
    Transfer(Transfer),
    Seize(Seize),
}

impl Operation {
    /// Its name, as the metrics label it.
    pub fn name(&self) -> &'static str {
        match self {
            Operation::Request(_) => "request",
            Operation::Reserve(_) => "reserve",
            Operation::Release(_) => "release",
            Operation::Transfer(_) => "transfer",
            Operation::Seize(_) => "seize",
        }
    }
}

/// Where a rate answer's decision stands: the tier, the limits that apply,
/// what is left (docs/design.md#charon-api).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RateContext {
    pub hard_limit: Option<u64>,
    pub global_limit: Option<u64>,
    pub tier_limit: u64,
    /// One-indexed; 0 when no tier is active.
    pub tier_index: u32,
    pub tier_hits: u64,
    pub domain_hits_last_second: u64,
    pub global_hits_last_second: u64,
    pub burst: bool,
    pub limited_by_hard: bool,
    pub limited_by_global: bool,
    pub remaining: u64,
    pub tier_window_ms: u64,
    pub reset_after_ms: u64,
}

impl From<&TierOutcome> for RateContext {
    fn from(outcome: &TierOutcome) -> Self {
        let snapshot = &outcome.snapshot;
        Self {
            hard_limit: outcome.hard_limit,
            global_limit: outcome.global_limit,
            tier_limit: snapshot.tier_limit,
            tier_index: u32::try_from(snapshot.tier).unwrap_or(u32::MAX),
            tier_hits: snapshot.tier_hits,
            domain_hits_last_second: snapshot.domain_hits,
            global_hits_last_second: snapshot.resource_hits.unwrap_or(0),
            burst: outcome.burst,
            limited_by_hard: outcome.limited_by_hard,
            limited_by_global: outcome.limited_by_global,
            remaining: snapshot.remaining,
            tier_window_ms: snapshot.tier_window,
            reset_after_ms: snapshot.reset_after,
        }
    }
}

/// The answer to a [`RateRequest`].
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RateAnswer {
    pub granted: u64,
    /// Until one hit would be granted; `None`: never.
    pub retry_after_ms: Option<u64>,
    /// Decided by the failure policy, not the shared store.
    pub degraded: bool,
    pub soft_limit_exceeded: bool,
    pub context: RateContext,
}

/// A copy-limited resource's limits for a domain (none when it is no
/// longer configured) and its holds over them.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CopyContext {
    pub limits: Option<CopyLimits>,
    pub counts: CopyCounts,
}

#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ReserveAnswer {
    pub granted: u64,
    /// The groups to name when releasing these copies.
    pub groups: Vec<String>,
    pub retry_after_ms: Option<u64>,
    pub context: CopyContext,
    /// Waiting for anyone's result, it was released as done (nothing
    /// granted).
    pub done: bool,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReleaseAnswer {
    pub released: u64,
    pub context: CopyContext,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TransferAnswer {
    pub transfer_id: String,
    pub copies: u64,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SeizeAnswer {
    pub at: ResourceKey,
    pub groups: Vec<String>,
    pub copies: u64,
    /// Read after the seize; `None` when that read failed.
    pub context: Option<CopyContext>,
}

/// The answer to an [`Operation`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Answer {
    Request(RateAnswer),
    Reserve(ReserveAnswer),
    Release(ReleaseAnswer),
    Transfer(TransferAnswer),
    Seize(SeizeAnswer),
}

/// One resource a client wants a lease of. The names are checked when the
/// lease is decided: a bad one is that resource's error, not the call's.
#[derive(Debug, Clone, PartialEq)]
pub struct CapacityWant {
    pub at: ResourceKey,
    pub wants: f64,
    pub has: f64,
    /// From a server leasing for its own clients: what they hold of it.
    pub held_below: Option<f64>,
}

/// `GetCapacity`: leases of several resources for one client.
#[derive(Debug, Clone, PartialEq)]
pub struct GetCapacity {
    pub client_id: String,
    pub wants: Vec<CapacityWant>,
}

impl GetCapacity {
    pub fn new(client_id: String, wants: Vec<CapacityWant>) -> Result<Self, Error> {
        check_call(&client_id, wants.len())?;
        Ok(Self { client_id, wants })
    }
}

/// `ReleaseCapacity`: leases given back.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReleaseCapacity {
    pub client_id: String,
    pub resources: Vec<ResourceKey>,
}

impl ReleaseCapacity {
    /// The resources' names are checked as each is released, so those
    /// before a bad one are released.
    pub fn new(client_id: String, resources: Vec<ResourceKey>) -> Result<Self, Error> {
        check_call(&client_id, resources.len())?;
        Ok(Self {
            client_id,
            resources,
        })
    }
}

/// Each resource's lease, or why it has none, in the order asked.
pub type Leases = Vec<Result<Lease, Error>>;

pub fn check_names(namespace: &str, resource: &str, domain: &str) -> Result<(), Error> {
    for (what, value) in [
        ("namespace", namespace),
        ("resource", resource),
        ("domain", domain),
    ] {
        check_name(what, value)?;
    }
    Ok(())
}

pub fn check_name(what: &str, value: &str) -> Result<(), Error> {
    if value.is_empty() {
        return Err(Error::malformed(format!("{what} is empty")));
    }
    if value.len() > caps::MAX_STRING_BYTES {
        return Err(Error::malformed(format!(
            "{what} is longer than {} bytes",
            caps::MAX_STRING_BYTES
        )));
    }
    Ok(())
}

/// `copies` (unset: 1) and `min_copies` (unset: `copies`), checked.
pub fn copies_range(copies: Option<i64>, min_copies: Option<i64>) -> Result<(u64, u64), Error> {
    let copies = count("copies", copies.unwrap_or(1))?;
    let min_copies = match min_copies {
        Some(min) => count("min_copies", min)?,
        None => copies,
    };
    if min_copies > copies {
        return Err(Error::malformed(format!(
            "min_copies ({min_copies}) is more than copies ({copies})"
        )));
    }
    Ok((copies, min_copies))
}

/// A count of copies: between 1 and [`MAX_COPIES`].
pub fn count(what: &str, value: i64) -> Result<u64, Error> {
    match u64::try_from(value) {
        Ok(value) if (1..=MAX_COPIES).contains(&value) => Ok(value),
        _ => Err(Error::malformed(format!(
            "{what} must be between 1 and {MAX_COPIES}, not {value}"
        ))),
    }
}

/// What a whole call must be: a client id, and not too many resources.
fn check_call(client_id: &str, resources: usize) -> Result<(), Error> {
    check_name("client_id", client_id)?;
    if resources > MAX_RESOURCES_PER_CALL {
        return Err(Error::new(
            Kind::TooMany,
            format!("{resources} resources in one call; at most {MAX_RESOURCES_PER_CALL}"),
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn copies_are_checked() {
        assert_eq!(copies_range(None, None), Ok((1, 1)));
        assert_eq!(copies_range(Some(5), None), Ok((5, 5)));
        assert_eq!(copies_range(Some(5), Some(2)), Ok((5, 2)));
        for (copies, min) in [
            (Some(-1), None),
            (Some(0), None),
            (Some(5), Some(6)),
            (Some(5), Some(0)),
            (Some(i64::MAX), None),
        ] {
            let error = copies_range(copies, min).unwrap_err();
            assert_eq!(error.kind, Kind::Malformed, "{copies:?} {min:?}");
        }
    }
}
