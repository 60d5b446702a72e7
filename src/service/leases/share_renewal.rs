//! Global limits on the service (docs/design.md#global-limits): every
//! refresh interval, this server renews its own share of each `global`
//! descriptor limit as one client of the limit's lease state, asking for
//! what its requests showed it wants; the decisions read the share it was
//! granted. The server's children (other servers, through `GetCapacity`)
//! are that state's other clients, and a server with a parent apportions
//! the parent's grant ([`super::parent`]). The renewals run in the
//! service's housekeeping, never on a request's path, so a sidecar and an
//! engine embedded in a process renew alike.

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;

use crate::config::capacity::UNLIMITED_SAFE_CAPACITY;
use crate::config::global::{FASTEST_REFRESH_MS, GlobalLimit, GlobalTiming, SafeShare};
use crate::engine::capacity::{Algorithm, CapacityConfig, Want};
use crate::limiter::shares::{CLOCK_SKEW_MS, GlobalShares};
use crate::store::ResourceRef;
use crate::store::leases::{LeaseKey, LeaseSpace};

use crate::service::Service;

/// The domain a global limit's leases are kept under: one per limit.
pub const GLOBAL_DOMAIN: &str = "global";

/// What a server asks for beyond the demand it measured: its demand grows
/// by this much before the next renewal without a refusal.
const HEADROOM: f64 = 1.05;

/// The least a server that served the limit in the last `QUIET_MS` asks
/// for, whatever its demand: 1 % of the limit, at least one request, so
/// that a request after a quiet second finds a share
/// (docs/design.md#global-limits).
fn least_share(limit: f64) -> f64 {
    (limit / 100.0).max(1.0).min(limit)
}

const QUIET_MS: u64 = 60_000;

/// How much of the demand's peak is kept every `PEAK_KEPT_MS`: a rise
/// counts at once, a fall only as the peak decays. A share that shrank
/// comes back only once others have given theirs back, so a share that
/// followed every dip of a noisy demand would end up at its troughs.
const PEAK_KEPT: f64 = 0.85;
const PEAK_KEPT_MS: f64 = 500.0;

/// The demand is the rate of hits over at least this long (the renewals
/// come every refresh interval, and sooner while shares move): long enough
/// that Poisson noise moves it by a few percent (at 30 a second, the rate
/// over 10 s is within 6 % two times in three)...
const DEMAND_SPAN_MS: u64 = 10_000;

/// ...unless the rate over a recent span of at least so many ms is higher
/// than Poisson noise around the longer rate would make it by so many
/// standard deviations: then a rise counts within a renewal or a few, not
/// as it fills the longer span. A steep one (ten times the demand) counts
/// at the first renewal after it; noise that far off the rate comes about
/// once in ten thousand renewals.
const RISES: [(u64, f64); 3] = [(100, 6.0), (500, 4.0), (2_000, 4.0)];

/// ...or lower (a fall to a fifth counts within half a second). Either way
/// the longer span starts again from the recent one.
const FALLS: [(u64, f64); 1] = [(1_000, 4.0)];

/// What a server asked for stays while its demand is within this fraction
/// of it. A share that moves is capacity in transit: what one server gives
/// back is unused until another server's next round takes it, so shares
/// that followed the noise of a steady demand lost 1 % of the limit
/// (docs/performance.md).
const STEADY: f64 = 0.1;

/// A global limit as a leased capacity: its `requests_per_unit`, shared
/// fairly, the spare lent to the servers that want some; once a live grant
/// from the parent expired, its safe share (docs/design.md#global-limits, "The parent away").
pub fn global_capacity(global: &GlobalLimit, timing: GlobalTiming) -> CapacityConfig {
    let capacity = global.limit.requests_per_unit as f64;
    CapacityConfig {
        capacity,
        algorithm: Algorithm::FairShare,
        lease_ms: timing.lease_ms(),
        refresh_interval_ms: timing.refresh_ms(),
        safe_capacity: global
            .safe_share
            .unwrap_or(timing.safe_share())
            .safe_capacity(capacity),
        learning_ms: 0,
        whole_units: true,
        lends_spare: true,
    }
}

/// This server's own client id in a global limit's lease state.
fn local_client(shares: &GlobalShares) -> String {
    format!("(local) {}", shares.instance_id())
}

/// What the renewals remember between rounds, by (namespace, limit).
#[derive(Default)]
pub struct GlobalRenewals {
    limits: HashMap<(String, String), Renewed>,
}

/// One limit's renewals on this server.
#[derive(Default)]
struct Renewed {
    /// When this server's own lease ends.
    expiry_ms: u64,
    /// When a request last asked for the limit here.
    last_hit_ms: Option<u64>,
    /// The hits of the last intervals, and their lengths, oldest first:
    /// the demand is measured over the last `DEMAND_SPAN_MS` or more.
    intervals: VecDeque<(f64, u64)>,
    /// The demand's decaying peak, hits per ms.
    peak: f64,
    /// What was last asked for, per window.
    asked: Option<f64>,
    /// The shares set, and when: the first is in force at the start of the
    /// oldest window still counted.
    shares: Vec<(u64, u64)>,
}

impl Renewed {
    /// What to ask for, in requests per window of `period_ms`, after
    /// `hits` in `elapsed_ms` (`None`: the first round, the demand unknown,
    /// so the whole `limit`): the decaying peak of the rate over the last
    /// few seconds, or a recent span if the rate moved, plus the headroom;
    /// what was asked before while that is within `STEADY` of it.
    fn demand(&mut self, hits: f64, elapsed_ms: Option<u64>, period_ms: u64, limit: f64) -> f64 {
        let Some(elapsed) = elapsed_ms.map(|elapsed| elapsed.max(1)) else {
            return limit;
        };
        self.intervals.push_back((hits, elapsed));
        let mut span: u64 = self.intervals.iter().map(|&(_, ms)| ms).sum();
        while let Some(&(_, oldest)) = self.intervals.front() {
            if span - oldest < DEMAND_SPAN_MS {
                break;
            }
            span -= oldest;
            self.intervals.pop_front();
        }
        let longer = self.intervals.iter().map(|&(hits, _)| hits).sum::<f64>() / span as f64;
        let mut rate = longer;
        // How many of the newest intervals to keep when the rate moved.
        let mut moved = None;
        for (least_ms, sigmas) in RISES {
            if let Some((recent, count)) = self.beyond_noise(longer, least_ms, sigmas)
                && recent > rate
            {
                rate = recent;
                moved = Some(count);
            }
        }
        for (least_ms, sigmas) in FALLS {
            if moved.is_none()
                && let Some((recent, count)) = self.beyond_noise(longer, least_ms, -sigmas)
            {
                rate = recent;
                moved = Some(count);
            }
        }
        if let Some(count) = moved {
            let older = self.intervals.len().saturating_sub(count);
            self.intervals.drain(..older);
        }
        let kept = PEAK_KEPT.powf(elapsed as f64 / PEAK_KEPT_MS);
        self.peak = rate.max(self.peak * kept);
        let demand = self.peak * period_ms as f64 * HEADROOM;
        match self.asked {
            Some(asked) if (demand - asked).abs() <= STEADY * asked => asked,
            _ => {
                self.asked = Some(demand);
                demand
            }
        }
    }

    /// The rate over the newest intervals that span `least_ms` or more (or
    /// all of them), and how many they are, if it is further from `longer`
    /// than Poisson noise would make it by `sigmas` standard deviations:
    /// above it for positive `sigmas`, below it for negative ones.
    fn beyond_noise(&self, longer: f64, least_ms: u64, sigmas: f64) -> Option<(f64, usize)> {
        let (mut hits, mut ms, mut count) = (0.0, 0, 0);
        for &(interval_hits, interval_ms) in self.intervals.iter().rev() {
            if ms >= least_ms {
                break;
            }
            hits += interval_hits;
            ms += interval_ms;
            count += 1;
        }
        let expected = longer * ms as f64;
        let bound = expected + sigmas * expected.sqrt() + sigmas.signum();
        let beyond = if sigmas > 0.0 {
            hits > bound
        } else {
            hits < bound
        };
        beyond.then(|| (hits / ms.max(1) as f64, count))
    }

    /// The largest share in force at any time since `since_ms`: what the
    /// windows still counted may have admitted under.
    fn held_since(&self, since_ms: u64) -> Option<u64> {
        let first = self
            .shares
            .iter()
            .rposition(|&(at, _)| at <= since_ms)
            .unwrap_or(0);
        self.shares[first..].iter().map(|&(_, share)| share).max()
    }

    fn record(&mut self, now_ms: u64, share: u64, since_ms: u64) {
        if let Some(first) = self.shares.iter().rposition(|&(at, _)| at <= since_ms) {
            self.shares.drain(..first);
        }
        self.shares.push((now_ms, share));
    }
}

/// How often a server with a parent renews between the link's rounds.
const BETWEEN_ROUNDS: Duration = Duration::from_millis(FASTEST_REFRESH_MS);

/// How long a server with a parent waits for the parent's first answer
/// before it decides with what it has (the safe share: the whole limit).
const FIRST_ANSWER: Duration = Duration::from_secs(2);

impl Service {
    /// Renews this server's global shares until `shutdown`: every refresh
    /// interval, or on a server with a parent, right after each round of
    /// the parent link (so that a new grant is applied at once) and every
    /// 100 ms between them.
    pub(in crate::service) async fn renew_global_shares_until(
        self: Arc<Self>,
        mut shutdown: watch::Receiver<bool>,
    ) {
        let mut renewals = GlobalRenewals::default();
        let linked = self.leases.parent.is_linked();
        let mut rounds = self.leases.parent.rounds();
        if linked {
            // Ask first, so that the link asks the parent; then decide with
            // its answer.
            self.renew_global_shares(&mut renewals, None, false).await;
            tokio::select! {
                _ = tokio::time::timeout(FIRST_ANSWER, rounds.changed()) => {}
                _ = shutdown.changed() => return,
            }
        }
        self.renew_global_shares(&mut renewals, None, true).await;
        let mut last = self.clock.now_ms();
        let period = Duration::from_millis(self.leases.global_timing.refresh_ms());
        let mut every = tokio::time::interval_at(tokio::time::Instant::now() + period, period);
        every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            if linked {
                // Right after each round of the link, and every 100 ms
                // between them, so that a change of demand is seen (and
                // climbs, the lease moving) at once rather than at the next
                // round.
                tokio::select! {
                    _ = rounds.changed() => {}
                    () = tokio::time::sleep(BETWEEN_ROUNDS) => {}
                    _ = shutdown.changed() => return,
                }
            } else {
                tokio::select! {
                    _ = every.tick() => {}
                    _ = shutdown.changed() => return,
                }
            }
            let now = self.clock.now_ms();
            let elapsed = now.saturating_sub(last);
            last = now;
            self.renew_global_shares(&mut renewals, Some(elapsed), true)
                .await;
        }
    }

    /// Renews this server's share of every global limit, `elapsed_ms` after
    /// the previous round (`None`: the first, its demand unknown, so it
    /// asks for the whole limit). With `apply` false, the lease is asked
    /// for (and so the parent link asks for it) but the share stays. A
    /// limit whose lease store cannot answer keeps its share until the next
    /// round.
    async fn renew_global_shares(
        &self,
        renewals: &mut GlobalRenewals,
        elapsed_ms: Option<u64>,
        apply: bool,
    ) {
        let config = self.config();
        let linked = self.leases.parent.is_linked();
        let shares = self.limiter.global_shares();
        shares.retain(&config);
        let client = local_client(shares);
        let mut live = HashMap::new();
        for namespace in config.namespaces() {
            for (name, global) in &namespace.globals {
                let share = shares.share(&namespace.name, name, &global.limit);
                let key = (namespace.name.clone(), name.clone());
                let at = LeaseKey {
                    space: LeaseSpace::GlobalLimit,
                    at: ResourceRef {
                        namespace: &namespace.name,
                        resource: name,
                        domain: GLOBAL_DOMAIN,
                    },
                };
                let limit = global_capacity(global, self.leases.global_timing);
                let hits = share.take_hits() as f64;
                let period_ms = global.limit.period().max(1);
                let now = self.clock.now_ms();
                let mut renewed = renewals.limits.remove(&key).unwrap_or_default();
                let demand = renewed.demand(hits, elapsed_ms, period_ms, limit.capacity);
                if hits > 0.0 {
                    renewed.last_hit_ms = Some(now);
                }
                // Sporadic requests still find a share; a server that serves
                // none of them (a region, a root) wants none.
                let least = match renewed.last_hit_ms {
                    Some(at) if now.saturating_sub(at) < QUIET_MS => least_share(limit.capacity),
                    _ => 0.0,
                };
                let own_lease_live = now < renewed.expiry_ms;
                // A share that shrinks mid-window has already admitted under
                // the larger one: it counts as held until the windows that
                // did are over (a sliding window counts the previous one too).
                let window_start = now - now % period_ms;
                let previous_start = window_start.saturating_sub(period_ms);
                let now_share = share.requests_per_unit();
                let held_since = |since| renewed.held_since(since).unwrap_or(now_share);
                let held = match global.limit.algorithm {
                    crate::config::Algorithm::SlidingWindow => held_since(previous_start),
                    // In a window's first moments the store's clock (Redis's)
                    // may still be in the previous window.
                    _ if now - window_start < CLOCK_SKEW_MS => held_since(previous_start),
                    // A fixed window admitted no more than it was asked for,
                    // so a share that shrank early in it is given back at once.
                    _ => now_share
                        .max(held_since(window_start).min(share.asked_in_window(now, period_ms))),
                };
                let wants = if linked {
                    demand.max(least)
                } else {
                    // The root alone keeps the whole limit; with children it
                    // is one client among them, by demand.
                    let usage = self.leases.store.usage(at).await.unwrap_or_default();
                    let others = usage.clients - usize::from(own_lease_live).min(usage.clients);
                    if others == 0 {
                        limit.capacity
                    } else {
                        demand.max(least)
                    }
                };
                let config = if linked {
                    self.global_under_parent(at.at, limit, now)
                } else {
                    limit
                };
                let want = Want {
                    wants,
                    has: share.requests_per_unit() as f64,
                    held_below: Some(held as f64),
                };
                match self.leases.store.get(at, &config, &client, want).await {
                    Ok(lease) => {
                        self.lease_answered(at, &config, &client, &lease, linked)
                            .await;
                        // Whole requests: a share never rounds up past the
                        // grant (a tiny epsilon forgives the sum's rounding).
                        let granted = (lease.capacity + 1e-9).floor() as u64;
                        renewed.expiry_ms = lease.expiry_ms;
                        tracing::debug!(
                            limit = %name,
                            wants,
                            held,
                            granted = lease.capacity,
                            refresh_ms = lease.refresh_interval_ms,
                            "global share renewed"
                        );
                        if apply {
                            let before = share.requests_per_unit();
                            // What it asked for, in whole requests, is its own; the rest is lent.
                            let own = (wants - 1e-9).ceil().max(0.0) as u64;
                            let on_safe = linked
                                && self
                                    .leases
                                    .parent
                                    .grant(at.at)
                                    .is_some_and(|grant| now >= grant.expiry_ms);
                            if on_safe != share.on_safe_share() {
                                if on_safe {
                                    tracing::warn!(limit = %name, share = granted, "the parent's grant expired: deciding on the safe share");
                                } else {
                                    tracing::info!(limit = %name, share = granted, "the parent answers again: back on its grant");
                                }
                            }
                            share.set_requests_per_unit(granted);
                            if granted != before || on_safe != share.on_safe_share() {
                                self.observer.global_share_moved(
                                    at.at.namespace,
                                    name,
                                    granted,
                                    on_safe,
                                );
                            }
                            share.set_provenance(granted.saturating_sub(own), on_safe);
                            // Kept back to the previous window, for the store whose clock is behind.
                            renewed.record(now, granted, previous_start);
                        }
                    }
                    Err(error) => {
                        tracing::warn!(%error, limit = %name, "a global limit's share was not renewed");
                    }
                }
                live.insert(key, renewed);
            }
        }
        renewals.limits = live;
    }

    /// The configuration a server with a parent leases a global limit's
    /// shares with at `now_ms`: the parent's grant, or once it expired the
    /// safe share (by default that last grant, kept). A parent that never answered leaves the whole limit: a
    /// server that starts while its parent is away decides as if the limit
    /// were its own (docs/design.md#global-limits, "The parent away").
    pub(in crate::service) fn global_under_parent(
        &self,
        at: ResourceRef<'_>,
        limit: CapacityConfig,
        now_ms: u64,
    ) -> CapacityConfig {
        let effective = self.leases.parent.effective(at, limit, now_ms);
        let grant = match self.leases.parent.grant(at) {
            None => return limit,
            Some(grant) if now_ms < grant.expiry_ms => return effective,
            Some(grant) => grant,
        };
        let config = self.config();
        let policy = config
            .namespace(at.namespace)
            .and_then(|namespace| namespace.globals.get(at.resource))
            .and_then(|global| global.safe_share)
            .unwrap_or(self.leases.global_timing.safe_share());
        let safe = match policy {
            // The parent's last allocation: what it granted this level last.
            SafeShare::Last => grant.capacity,
            // Its equal split, as it said it with that grant.
            SafeShare::Split if grant.safe_capacity == UNLIMITED_SAFE_CAPACITY => limit.capacity,
            SafeShare::Split => grant.safe_capacity,
            // A configured safe share: the effective configuration has it.
            SafeShare::Whole | SafeShare::Requests(_) | SafeShare::Percent(_) => {
                return effective;
            }
        };
        CapacityConfig {
            capacity: safe.clamp(0.0, limit.capacity),
            ..effective
        }
    }

    /// On a server with a parent, no global limit admits anything until
    /// the parent has been asked for its share (docs/design.md#global-limits).
    pub fn close_global_shares(&self) {
        for namespace in self.config().namespaces() {
            for (name, global) in &namespace.globals {
                self.limiter
                    .global_shares()
                    .share(&namespace.name, name, &global.limit)
                    .set_requests_per_unit(0);
            }
        }
    }
}

#[cfg(test)]
mod tests;
