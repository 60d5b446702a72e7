//! Quota for Envoy's Rate Limit Quota Service (RLQS, docs/design.md#rlqs):
//! a bucket reported by an Envoy is a descriptor of a namespace, and the
//! descriptor's limit is apportioned among the Envoys that report the
//! bucket, as a capacity lease each (fair share), on the service's lease
//! store: in the process, or in Redis for every sidecar on it.
//!
//! - The report's domain is the namespace.
//! - The bucket id's entries, sorted by key, are the descriptor: one entry
//!   `tenant: acme` is the descriptor `[(tenant, acme)]`, matched in the
//!   namespace's `descriptors:` tree as Envoy's `ShouldRateLimit` is.
//! - An Envoy's demand is what it reported, allowed and denied, per second
//!   since its previous report (by this server's clock: Envoy's
//!   `time_elapsed` is whole seconds), with a fiftieth more so growth
//!   shows;
//!   before it has reported over a time (its first report comes with its
//!   first request), the whole limit.
//! - Its share is a token bucket that refills at its lease per second and
//!   holds a tenth of a second's share.
//! - When one Envoy's share moves, the others that report the bucket to
//!   this server are decided again and nudged ([`Service::settle_quota`]),
//!   through the same nudges as `WatchCapacity`: one push path for every
//!   consumer of a lease.

use std::time::Duration;

use crate::config::Leaf;
use crate::engine::capacity::{Algorithm, CapacityConfig, Want};
use crate::store::ResourceRef;
use crate::store::leases::{LeaseKey, LeaseSpace};

use crate::service::Service;
use crate::service::error::{Error, Kind};

/// The resource name the leases of RLQS buckets are kept under, in their
/// own key space.
const BUCKETS: &str = "rlqs";

/// The lease state of `bucket` in `namespace`.
fn bucket_key<'a>(namespace: &'a str, bucket: &'a Bucket) -> LeaseKey<'a> {
    LeaseKey {
        space: LeaseSpace::RlqsBucket,
        at: ResourceRef {
            namespace,
            resource: BUCKETS,
            domain: &bucket.name,
        },
    }
}

/// How long an Envoy's share lasts unrenewed: a stream that stops
/// reporting gives its share back after this.
pub const LEASE: Duration = Duration::from_secs(10);

/// How often Envoys are expected to report (the lease engine's refresh).
const REFRESH: Duration = Duration::from_secs(1);

/// What an Envoy is asked for beyond its measured demand: enough that a
/// steady demand is not refused, little enough that what small Envoys hold
/// and do not use costs the others little. Measured with four Envoys on a
/// bucket of 100, three offering 12 a second and one 114: with a tenth
/// more, 96 % of the limit admitted; with a twentieth, 98 % (the big Envoy
/// 97 % of its max-min fair share); with a fiftieth, 99.2 % (98.75 %). A
/// demand that grows shows in the denials Envoy reports, which count as
/// demand, and a burst within a report's interval is the bucket's to take.
const HEADROOM: f64 = 1.02;

/// `requests` counted in one report, as the demand to ask for: a
/// fiftieth more, and at least a request and a half more. A count is
/// whole: a steady 3 a second shows as 14, 15 or 16 in 5 s as the window's
/// edges fall, and asking for 14, or for 15 over a report a millisecond
/// late, would refuse one each window. Past 75 requests a report, the
/// fiftieth is the larger.
fn with_headroom(requests: u64) -> f64 {
    let counted = requests as f64;
    match requests {
        0 => 0.0,
        _ => (counted * HEADROOM).max(counted + 1.5),
    }
}

/// How long a fill of an assigned token bucket is: Envoy refills its bucket
/// continuously at `tokens_per_fill` per whole second of the interval, so a
/// longer interval says a rate to a tenth of a request a second. Always the
/// same, because Envoy keeps a bucket whose `max_tokens` and
/// `tokens_per_fill` did not change even if the interval's seconds did.
const FILL_INTERVAL: Duration = Duration::from_secs(10);

/// How much of a second's share an Envoy's bucket may hold (its
/// `max_tokens`), at least `LEAST_BURST` tokens. Envoy starts every new
/// bucket full, so in any second an Envoy admits at most its bucket and
/// its rate: the Envoys of a bucket together at most the limit and a tenth
/// of it (or two tokens each), the first second included
/// (docs/design.md#rlqs). Not one token: a bucket of one loses what
/// accrues between a token's arrival and the next request's (measured:
/// 4.6 a second admitted of a share of 5, requests every 33 ms).
const BURST: f64 = 0.1;
const LEAST_BURST: f64 = 2.0;

/// The tokens of new buckets a bucket's Envoys may be given in one second,
/// as a part of the limit: Envoy starts every new bucket full, so this is
/// what assignments add to a second beyond the limit. An Envoy's first
/// bucket holds one token, and a bucket that grows waits for a second with
/// room: two Envoys on a limit of 10 admit at most 12 in any second, the
/// first included.
const NEW_TOKENS: f64 = 0.2;

/// The longest key or value of a bucket id, and the most entries: a
/// longer id is refused (counted, no assignment) and the stream goes on.
pub const MAX_BUCKET_ID_BYTES: usize = 1_024;
pub const MAX_BUCKET_ID_ENTRIES: usize = 16;

/// What a bucket's descriptor makes of it.
enum BucketLimit {
    /// A rate leased among the Envoys that report the bucket.
    Leased(CapacityConfig),
    /// No lease: `unlimited`, or no limit applies.
    Answered(BucketAssignment),
}

/// What an Envoy wants of a bucket.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Demand {
    /// Not known yet: as much as the limit.
    Unknown,
    /// `requests` (allowed and denied) over `elapsed`.
    Measured { requests: u64, elapsed: Duration },
    /// A rate already worked out (per second), as [`Service::quota`]
    /// returned it.
    Wants(f64),
}

/// Reports over less than this say nothing of a rate.
const SHORTEST_REPORT: Duration = Duration::from_millis(100);

/// What an Envoy is told for a bucket.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum BucketAssignment {
    /// A token bucket: `tokens_per_fill` every `fill_interval`, at most
    /// `max_tokens` saved; valid for `ttl`. Zero tokens: deny everything.
    Assigned {
        max_tokens: u32,
        tokens_per_fill: u32,
        fill_interval: Duration,
        ttl: Duration,
    },
    /// The descriptor is `unlimited`: allow everything for `ttl`.
    Unlimited { ttl: Duration },
    /// No limit applies to the bucket: Envoy's own no-assignment behaviour.
    NotLimited,
}

impl BucketAssignment {
    /// The requests a second a token bucket refills at (`None` for a
    /// blanket rule).
    pub fn per_second(self) -> Option<f64> {
        match self {
            BucketAssignment::Assigned {
                tokens_per_fill,
                fill_interval,
                ..
            } => Some(f64::from(tokens_per_fill) / fill_interval.as_secs_f64().max(1.0)),
            BucketAssignment::Unlimited { .. } | BucketAssignment::NotLimited => None,
        }
    }
}

/// One bucket, as its lease is named.
#[derive(Debug, Clone)]
pub struct Bucket {
    /// The bucket id's entries, sorted by key.
    pub entries: Vec<(String, String)>,
    /// The entries as one name: `key=value` joined by `&`, `%`-escaped.
    pub name: String,
}

impl Bucket {
    pub fn new(entries: impl IntoIterator<Item = (String, String)>) -> Self {
        let mut entries: Vec<(String, String)> = entries.into_iter().collect();
        entries.sort();
        let name = entries
            .iter()
            .map(|(key, value)| format!("{}={}", escape(key), escape(value)))
            .collect::<Vec<_>>()
            .join("&");
        Self { entries, name }
    }
}

fn escape(text: &str) -> String {
    let mut escaped = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '%' => escaped.push_str("%25"),
            '=' => escaped.push_str("%3D"),
            '&' => escaped.push_str("%26"),
            c => escaped.push(c),
        }
    }
    escaped
}

impl Service {
    /// `client`'s share of `bucket` in `namespace` for its `demand`, and
    /// the demand to ask with again (`Unknown` until it was measured).
    pub async fn quota(
        &self,
        namespace: &str,
        bucket: &Bucket,
        client: &str,
        demand: Demand,
    ) -> Result<(BucketAssignment, Demand), Error> {
        let capacity = match self.bucket_limit(namespace, bucket)? {
            BucketLimit::Leased(capacity) => capacity,
            BucketLimit::Answered(quota) => return Ok((quota, Demand::Unknown)),
        };
        let demand = match demand {
            Demand::Measured { requests, elapsed } if elapsed >= SHORTEST_REPORT => {
                Demand::Wants(with_headroom(requests) / elapsed.as_secs_f64())
            }
            Demand::Measured { .. } | Demand::Unknown => Demand::Unknown,
            wants @ Demand::Wants(_) => wants,
        };
        let wants = match demand {
            Demand::Wants(wants) => wants,
            _ => capacity.capacity,
        };
        let granted = self
            .bucket_lease(namespace, bucket, &capacity, client, wants)
            .await?;
        Ok((token_bucket(granted, LEAST_BURST), demand))
    }

    /// Takes `tokens` of the new buckets `bucket`'s Envoys of this server
    /// may be given in the current second (a fifth of the limit,
    /// docs/design.md#rlqs), and says how many it took: all if they fit;
    /// otherwise, with `partial`, what was left, else none.
    pub fn new_bucket_tokens(
        &self,
        namespace: &str,
        bucket: &Bucket,
        tokens: u32,
        partial: bool,
    ) -> u32 {
        let Ok(BucketLimit::Leased(capacity)) = self.bucket_limit(namespace, bucket) else {
            return tokens;
        };
        let allowed = (capacity.capacity * NEW_TOKENS).floor().max(1.0) as u32;
        let second = self.clock.now_ms() / 1_000;
        let mut spent = self
            .leases
            .rlqs_new_tokens
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if spent.len() > 100_000 {
            spent.retain(|_, (at, _)| *at == second);
        }
        let entry = spent
            .entry(format!("{namespace}\u{0}{}", bucket.name))
            .or_insert((second, 0));
        if entry.0 != second {
            *entry = (second, 0);
        }
        let left = allowed.saturating_sub(entry.1);
        let taken = if tokens <= left {
            tokens
        } else if partial {
            left
        } else {
            0
        };
        entry.1 += taken;
        taken
    }

    /// What `bucket`'s descriptor in `namespace` makes of it: a capacity
    /// leased among the Envoys that report it, or an answer without one.
    fn bucket_limit(&self, namespace: &str, bucket: &Bucket) -> Result<BucketLimit, Error> {
        let config = self.config();
        let Some(space) = config.namespace(namespace) else {
            return Err(Error::new(
                Kind::UnknownResource,
                format!("no namespace `{namespace}`"),
            ));
        };
        if bucket.entries.is_empty() || bucket.name.is_empty() {
            return Err(Error::malformed("a bucket id without entries"));
        }
        let found = space.descriptors.find(
            bucket
                .entries
                .iter()
                .map(|(key, value)| (key.as_str(), value.as_str())),
        );
        let limit = match found.map(|found| &found.node.leaf) {
            Some(Leaf::Limit(limit)) => limit,
            Some(Leaf::Unlimited { .. }) => {
                return Ok(BucketLimit::Answered(BucketAssignment::Unlimited {
                    ttl: LEASE,
                }));
            }
            Some(Leaf::None | Leaf::Resource(_)) | None => {
                return Ok(BucketLimit::Answered(BucketAssignment::NotLimited));
            }
        };
        let window = Duration::from_millis(
            limit
                .unit
                .millis()
                .saturating_mul(limit.unit_multiplier.max(1)),
        );
        Ok(BucketLimit::Leased(CapacityConfig {
            capacity: limit.requests_per_unit as f64 / window.as_secs_f64(),
            algorithm: Algorithm::FairShare,
            lease_ms: LEASE.as_millis() as u64,
            refresh_interval_ms: REFRESH.as_millis() as u64,
            safe_capacity: None,
            learning_ms: 0,
            whole_units: false,
            lends_spare: true,
        }))
    }

    /// `client`'s lease of `bucket` under `capacity`, wanting `wants`: the
    /// rate granted.
    async fn bucket_lease(
        &self,
        namespace: &str,
        bucket: &Bucket,
        capacity: &CapacityConfig,
        client: &str,
        wants: f64,
    ) -> Result<f64, Error> {
        let lease = self
            .leases
            .store
            .get(
                bucket_key(namespace, bucket),
                capacity,
                client,
                Want {
                    wants,
                    ..Want::default()
                },
            )
            .await
            .map_err(Error::from)?;
        Ok(lease.capacity)
    }

    /// `client` no longer reports `bucket`: its share goes to the others,
    /// and those that report it here are told at once.
    pub async fn quota_gone(&self, namespace: &str, bucket: &Bucket, client: &str) {
        if let Err(error) = self
            .leases
            .store
            .release(bucket_key(namespace, bucket), client)
            .await
        {
            tracing::debug!(%error, "an RLQS share was not given back; it expires");
        }
        self.settle_quota(namespace, bucket, client).await;
    }

    /// `except`'s share of `bucket` moved (or it is new to the bucket):
    /// the bucket's other Envoys that report it to this server are decided
    /// again now, from what they last wanted, and nudged to tell their
    /// Envoy, so that what they give back is free before `except` asks
    /// again. Envoys of other servers on the same Redis follow at their
    /// next report: shrinking them here would let both admit the larger
    /// share until theirs hears of it. How many shares moved.
    pub async fn settle_quota(&self, namespace: &str, bucket: &Bucket, except: &str) -> usize {
        let Ok(BucketLimit::Leased(capacity)) = self.bucket_limit(namespace, bucket) else {
            return 0;
        };
        let Ok(clients) = self
            .leases
            .store
            .clients(bucket_key(namespace, bucket))
            .await
        else {
            return 0;
        };
        let mut moved = 0;
        for client in clients {
            if client.id == except || !self.leases.nudges.is_watched(&client.id) {
                continue;
            }
            let granted = self
                .bucket_lease(namespace, bucket, &capacity, &client.id, client.wants)
                .await;
            // A share that stayed costs its stream nothing.
            if granted.is_ok_and(|granted| granted != client.has) {
                moved += 1;
                self.leases.nudges.nudge(&client.id);
            }
        }
        moved
    }
}

/// A share of `per_second` as a token bucket that never grants more: whole
/// tokens every [`FILL_INTERVAL`] (every few intervals' worth of seconds for
/// a share under one token an interval), holding at most [`BURST`] of a
/// second's share.
fn token_bucket(per_second: f64, least_burst: f64) -> BucketAssignment {
    let deny = BucketAssignment::Assigned {
        max_tokens: 0,
        tokens_per_fill: 0,
        fill_interval: FILL_INTERVAL,
        ttl: LEASE,
    };
    if !(per_second.is_finite() && per_second > 0.0) {
        return deny;
    }
    let interval_seconds = (1.0 / per_second)
        .ceil()
        .max(FILL_INTERVAL.as_secs_f64())
        .min(86_400.0);
    let tokens = (per_second * interval_seconds)
        .floor()
        .min(f64::from(u32::MAX)) as u32;
    if tokens == 0 {
        return deny;
    }
    let burst = (per_second * BURST)
        .floor()
        .clamp(least_burst, f64::from(u32::MAX)) as u32;
    BucketAssignment::Assigned {
        max_tokens: burst,
        tokens_per_fill: tokens,
        fill_interval: Duration::from_secs_f64(interval_seconds),
        ttl: LEASE,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bucket(quota: BucketAssignment) -> (u32, u32, Duration) {
        match quota {
            BucketAssignment::Assigned {
                max_tokens,
                tokens_per_fill,
                fill_interval,
                ..
            } => (max_tokens, tokens_per_fill, fill_interval),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn a_share_becomes_whole_tokens_never_more() {
        let ten = Duration::from_secs(10);
        // A rate to a tenth of a request a second; a bucket of a tenth of
        // a second's share, at least two tokens.
        assert_eq!(bucket(token_bucket(10.0, LEAST_BURST)), (2, 100, ten));
        assert_eq!(bucket(token_bucket(7.95, LEAST_BURST)), (2, 79, ten));
        assert_eq!(bucket(token_bucket(250.0, LEAST_BURST)), (25, 2_500, ten));
        assert_eq!(bucket(token_bucket(0.4, LEAST_BURST)), (2, 4, ten));
        // Under one a fill: one token every so many seconds.
        assert_eq!(
            bucket(token_bucket(0.04, LEAST_BURST)),
            (2, 1, Duration::from_secs(25))
        );
        assert_eq!(bucket(token_bucket(0.0, LEAST_BURST)), (0, 0, ten));
        assert_eq!(bucket(token_bucket(f64::NAN, LEAST_BURST)), (0, 0, ten));
        assert_eq!(bucket(token_bucket(1e-9, LEAST_BURST)), (0, 0, ten));
    }

    #[test]
    fn a_small_steady_demand_is_never_asked_for_under_its_rate() {
        // 3 a second, seen as 14 or 15 in a report 50 µs late: still 30
        // tokens in 10 s.
        for requests in [14, 15] {
            let rate = with_headroom(requests) / 5.000_05;
            assert_eq!(
                bucket(token_bucket(rate, LEAST_BURST)).1 / 10,
                3,
                "{requests}"
            );
        }
        assert_eq!(with_headroom(0), 0.0);
        assert_eq!(with_headroom(600), 612.0);
    }

    #[test]
    fn bucket_names_are_sorted_and_escaped() {
        let named = Bucket::new([
            ("tenant".to_owned(), "a=b&c".to_owned()),
            ("path".to_owned(), "/x%".to_owned()),
        ]);
        assert_eq!(named.name, "path=/x%25&tenant=a%3Db%26c");
        assert_eq!(named.entries[0].0, "path");
    }
}
