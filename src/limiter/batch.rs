//! Engine items and store keys for resolved descriptors.

use crate::config::{Algorithm, Namespace, RateResource, ResourceLimit, duration};
use crate::engine::{
    BanItem, CalendarItem, CostItem, CostOp, GcraItem, GcraLimit, HybridItem, Item, MaxHoldItem,
    MaxHoldLimits, SlidingItem, SlidingLogItem, SlotKind, TiersItem, WindowItem,
};
use crate::store::Batch;
use crate::store::keys;

use super::request::Descriptor;
use super::resolve::Resolved;

/// The key entry that makes a global limit's counter this server's own: no
/// configured descriptor key has a control character, so none can match it.
const INSTANCE_KEY: &str = "\u{1}instance";

/// The key entry of a concurrency limit's owed refunds, beside its held
/// hits (a control character, as [`INSTANCE_KEY`]).
const OWED_KEY: &str = "\u{1}owed";

/// How a descriptor's item is asked.
#[derive(Clone, Copy)]
pub(super) struct Asked<'n> {
    pub hits: u64,
    /// A quota descriptor: decided with the others once the batch is.
    pub quota: bool,
    /// Its refused hits count too (the server's `--count-rejected`).
    pub count_rejected: bool,
    /// This process's clock, read only by the items that need it: a
    /// calendar window's boundaries are around it, the store picking among
    /// them by its own.
    pub now: &'n dyn Fn() -> u64,
}

pub(super) fn add_item<'c>(
    batch: &mut Batch<'c>,
    namespace: &Namespace,
    descriptor: &Descriptor,
    resolved: &Resolved<'c>,
    asked: Asked<'_>,
) -> Option<usize> {
    let Asked {
        hits,
        quota,
        count_rejected,
        now,
    } = asked;
    // `ignore_configured`: nothing is rejected, but what fits is counted and
    // the real state reported, exactly as for shadow-mode descriptors. A
    // quota descriptor does not reject on its own either: the limiter
    // decides over all of them together once the batch is decided.
    let ignore = namespace.settings.ignore_configured || quota;
    let item = match resolved {
        Resolved::NotLimited | Resolved::Unlimited { .. } => return None,
        Resolved::Fixed {
            limit,
            shadow,
            shared_values,
            ..
        } => {
            let period = limit.period();
            // A global limit's counter is this server's own, as its share is
            // (docs/design.md#global-limits).
            let own = limit
                .global()
                .map(|share| (INSTANCE_KEY, share.instance_id()));
            let entries = keyed_entries(descriptor, shared_values).chain(own);
            match limit.algorithm() {
                Algorithm::FixedWindow => {
                    let key =
                        keys::descriptor_key(SlotKind::Window, &namespace.name, entries, period);
                    Item::Window(WindowItem {
                        slot: batch.slot(key, SlotKind::Window),
                        limit: limit.requests_per_unit(),
                        period,
                        hits,
                        shadow: *shadow || ignore,
                        count_rejected: count_rejected || limit.count_rejected(),
                    })
                }
                Algorithm::Calendar => {
                    let key =
                        keys::descriptor_key(SlotKind::Window, &namespace.name, entries, period);
                    // A calendar limit always has its calendar; its bounds
                    // are missing only past the year 9999.
                    let bounds = limit.calendar()?.bounds(now())?;
                    Item::Calendar(CalendarItem {
                        slot: batch.slot(key, SlotKind::Window),
                        limit: limit.requests_per_unit(),
                        bounds,
                        hits,
                        shadow: *shadow || ignore,
                    })
                }
                Algorithm::AfterResponse { initial_cost, .. } => {
                    let key =
                        keys::descriptor_key(SlotKind::Cost, &namespace.name, entries, period);
                    Item::Cost(CostItem {
                        slot: batch.slot(key, SlotKind::Cost),
                        limit: limit.requests_per_unit(),
                        period,
                        op: CostOp::Hits(hits),
                        shadow: *shadow || ignore,
                        initial_cost,
                    })
                }
                Algorithm::SlidingLog => {
                    let key =
                        keys::descriptor_key(SlotKind::TimeLog, &namespace.name, entries, period);
                    Item::SlidingLog(SlidingLogItem {
                        slot: batch.slot(key, SlotKind::TimeLog),
                        limit: limit.requests_per_unit(),
                        period,
                        hits,
                        shadow: *shadow || ignore,
                        count_rejected: count_rejected || limit.count_rejected(),
                    })
                }
                Algorithm::Hybrid => {
                    let key =
                        keys::descriptor_key(SlotKind::Hybrid, &namespace.name, entries, period);
                    Item::Hybrid(HybridItem {
                        slot: batch.slot(key, SlotKind::Hybrid),
                        quota: limit.requests_per_unit(),
                        window: period,
                        hits,
                        shadow: *shadow || ignore,
                    })
                }
                Algorithm::SlidingWindow => {
                    let key =
                        keys::descriptor_key(SlotKind::Sliding, &namespace.name, entries, period);
                    Item::Sliding(SlidingItem {
                        slot: batch.slot(key, SlotKind::Sliding),
                        limit: limit.requests_per_unit(),
                        period,
                        hits,
                        shadow: *shadow || ignore,
                    })
                }
                Algorithm::MaxHold { max_hold } => {
                    let held = keyed_entries(descriptor, shared_values);
                    let owed = held.clone().chain(std::iter::once((OWED_KEY, "")));
                    Item::MaxHold(MaxHoldItem {
                        slot: batch.slot(
                            keys::descriptor_key(
                                SlotKind::TimeLog,
                                &namespace.name,
                                held,
                                max_hold,
                            ),
                            SlotKind::TimeLog,
                        ),
                        hold: MaxHoldLimits {
                            owed_slot: batch.slot(
                                keys::descriptor_key(
                                    SlotKind::Window,
                                    &namespace.name,
                                    owed,
                                    max_hold,
                                ),
                                SlotKind::Window,
                            ),
                            limit: limit.requests_per_unit(),
                            max_hold,
                        },
                        hits,
                        shadow: *shadow || ignore,
                    })
                }
                Algorithm::Gcra { burst } => {
                    let key =
                        keys::descriptor_key(SlotKind::Gcra, &namespace.name, entries, period);
                    Item::Gcra(GcraItem {
                        slot: batch.slot(key, SlotKind::Gcra),
                        limit: GcraLimit {
                            count: limit.requests_per_unit(),
                            period,
                            burst,
                        },
                        hits,
                        shadow: *shadow || ignore,
                    })
                }
            }
        }
        Resolved::Resource { rate, shadow, .. } => {
            // The domain is the value of the descriptor's last entry.
            let domain = descriptor.entries.last().map_or("", |(_, v)| v.as_str());
            tiers_item(
                batch,
                &namespace.name,
                rate,
                domain,
                hits,
                hits.max(1),
                *shadow || ignore,
            )
        }
    };
    batch.items.push(item);
    Some(batch.items.len() - 1)
}

/// A refund of `hits` to `resolved`'s limit, added to `batch` (which holds
/// refunds only); `None` when it is not limited, or is of a kind that cannot
/// take hits back (burst tiers, bans, the hybrid limiter), which is then
/// left alone (docs/design.md#refunds).
pub(super) fn add_refund<'c>(
    batch: &mut Batch<'c>,
    namespace: &Namespace,
    descriptor: &Descriptor,
    resolved: &Resolved<'c>,
    hits: u64,
    now: &dyn Fn() -> u64,
) -> Option<usize> {
    let asked = Asked {
        hits,
        quota: false,
        count_rejected: false,
        now,
    };
    let index = add_item(batch, namespace, descriptor, resolved, asked)?;
    let refund = batch.items.get(index).copied()?.refund_of(hits);
    match refund {
        Some(refund) => {
            batch.items[index] = refund;
            Some(index)
        }
        None => {
            batch.items.pop();
            None
        }
    }
}

/// A descriptor's entries as its key names them: a value shared by
/// `shared_values` (a wildcard's) replaces the request's.
pub(super) fn keyed_entries<'d>(
    descriptor: &'d Descriptor,
    shared_values: &'d [Option<&'d str>],
) -> impl Iterator<Item = (&'d str, &'d str)> + Clone {
    descriptor.entries.iter().enumerate().map(|(i, (k, v))| {
        let value = shared_values
            .get(i)
            .copied()
            .flatten()
            .unwrap_or(v.as_str());
        (k.as_str(), value)
    })
}

/// A burst-tier item for `domain` of `rate`, its keys added to `batch`:
/// `hits` (0: only check whether one more would pass), at least `min_hits`
/// of them or none.
pub(super) fn tiers_item<'c>(
    batch: &mut Batch<'c>,
    namespace: &str,
    rate: &'c RateResource,
    domain: &str,
    hits: u64,
    min_hits: u64,
    shadow: bool,
) -> Item<'c> {
    if let Some(alternative) = rate.alternative
        && !rate.domains.contains_key(domain)
    {
        // All or nothing (`min_hits` aside): these have no partial grant.
        let mut slot = |kind: SlotKind| {
            batch.slot(
                keys::resource_key(kind, namespace, &rate.name, domain),
                kind,
            )
        };
        return match alternative {
            ResourceLimit::Ban(limit) => Item::Ban(BanItem {
                slot: slot(SlotKind::Ban),
                limit,
                hits,
                shadow,
            }),
            ResourceLimit::Hybrid { quota, window } => Item::Hybrid(HybridItem {
                slot: slot(SlotKind::Hybrid),
                quota,
                window,
                hits,
                shadow,
            }),
            ResourceLimit::SlidingWindow { limit, window } => Item::Sliding(SlidingItem {
                slot: slot(SlotKind::Sliding),
                limit,
                period: window,
                hits,
                shadow,
            }),
            ResourceLimit::Budget {
                limit,
                window,
                initial_cost,
                ..
            } => Item::Cost(CostItem {
                slot: slot(SlotKind::Cost),
                limit,
                period: window,
                op: CostOp::Hits(hits),
                shadow,
                initial_cost,
            }),
            ResourceLimit::SlidingLog {
                limit,
                window,
                count_rejected,
            } => Item::SlidingLog(SlidingLogItem {
                slot: slot(SlotKind::TimeLog),
                limit,
                period: window,
                hits,
                shadow,
                count_rejected,
            }),
        };
    }
    let has_global = rate.global_limit.is_some();
    let slot = batch.slot(
        keys::tiers_key(namespace, &rate.name, domain, has_global),
        SlotKind::Tiers,
    );
    let global_slot = rate
        .global_limit
        .map(|_| batch.slot(keys::global_key(namespace, &rate.name), SlotKind::Log));
    Item::Tiers(TiersItem {
        slot,
        global_slot,
        policy: rate.policy_for(domain),
        global_limit: rate.global_limit,
        copies: hits.max(1),
        min_copies: min_hits.max(1),
        check_only: hits == 0,
        shadow,
    })
}

/// `<resource>/tier<N>/<window>`: Envoy's units cannot say "10 s", so the
/// name carries the tier's real window (Envoy shows it in X-RateLimit-Limit).
pub(super) fn tier_name(resource: &str, tier: usize, window: u64) -> String {
    let mut name = String::with_capacity(resource.len() + 16);
    name.push_str(resource);
    name.push_str("/tier");
    name.push_str(itoa::Buffer::new().format(tier));
    name.push('/');
    duration::write(&mut name, window);
    name
}
