//! Resources: rate policies (burst tiers, bans, GCRA buckets, soft limits)
//! and copy limits.

use std::collections::HashMap;
use std::sync::Arc;

use serde_saphyr::{Location, Spanned};

use crate::config::duration::{self, FOREVER};

use crate::config::raw::{RawBan, RawGcra, RawRate, RawResource, RawSoftLimit, RawTier};
use crate::config::{GcraLimit, RatePolicy, RateResource, Resource, SoftLimit, Tier, caps};

use super::Ctx;

impl Ctx {
    pub(super) fn resource(
        &mut self,
        name: &str,
        resource: &mut Spanned<RawResource>,
    ) -> Option<Resource> {
        let at = resource.referenced;
        if name.is_empty() {
            self.error(at, "resource name is empty");
            return None;
        }
        if self.control_character(at, "resource name", name) {
            return None;
        }
        if name.starts_with(crate::config::global::RESOURCE_PREFIX) {
            // A global limit's shares are asked for under this prefix.
            self.error(
                at,
                format!(
                    "resource `{name}`: names starting with `{}` are kept for global limits",
                    crate::config::global::RESOURCE_PREFIX
                ),
            );
            return None;
        }
        if let Some(capacity) = &mut resource.value.capacity {
            if resource.value.rate.is_some() || resource.value.copies.is_some() {
                self.error(
                    at,
                    format!(
                        "resource `{name}` has `capacity:` and `rate:` or `copies:`; it needs exactly one"
                    ),
                );
                return None;
            }
            return self
                .capacity(name, capacity)
                .map(|c| Resource::Capacity(Arc::new(c)));
        }
        match (&mut resource.value.rate, &mut resource.value.copies) {
            (Some(_), Some(_)) => {
                self.error(
                    at,
                    format!(
                        "resource `{name}` has both `rate:` and `copies:`; it needs exactly one"
                    ),
                );
                None
            }
            (None, None) => {
                self.error(
                    at,
                    format!("resource `{name}` needs `rate:`, `copies:` or `capacity:`"),
                );
                None
            }
            (Some(rate), None) => self
                .rate(name, at, rate)
                .map(|r| Resource::Rate(Arc::new(r))),
            (None, Some(copies)) => self
                .copies(name, copies)
                .map(|c| Resource::Copies(Arc::new(c))),
        }
    }

    fn rate(&mut self, name: &str, at: Location, rate: &mut RawRate) -> Option<RateResource> {
        let errors_before = self.errors.len();
        let global_limit = rate
            .global_limit
            .as_ref()
            .and_then(|g| self.count(g, "global_limit"));
        let alternative = self.alternative(name, rate)?;
        if let Some(ban) = rate.ban.take() {
            if let Some(mode) = &ban.value.mode
                && mode.value != "prison"
            {
                self.error(
                    mode.referenced,
                    format!(
                        "unknown ban mode `{}`; use prison (the default) or cloud_armor",
                        mode.value
                    ),
                );
                return None;
            }
            if rate.tiers.is_empty() {
                self.note(
                    ban.referenced,
                    format!(
                        "resource `{name}`: ban normalized into two tiers: {} per {}, then a prison tier of {}",
                        ban.value.limit.value, ban.value.window.value, ban.value.duration.value
                    ),
                );
                rate.tiers = ban_tiers(ban.value);
            } else {
                self.error(
                    ban.referenced,
                    format!("resource `{name}` has both `ban` and `tiers`; a ban is two tiers: give one or the other"),
                );
            }
        }
        let default = self.policy(
            name,
            None,
            at,
            rate.hard_limit.as_ref(),
            &mut rate.tiers,
            rate.gcra.as_ref(),
        );
        let mut domains = HashMap::new();
        for (domain, config) in &mut rate.domains {
            if domain.is_empty() {
                self.error(config.referenced, "domain name is empty");
                continue;
            }
            if self.control_character(config.referenced, "domain name", domain) {
                continue;
            }
            let domain_at = config.referenced;
            let config = &mut config.value;
            let policy = self.policy(
                name,
                Some(domain),
                domain_at,
                config.hard_limit.as_ref(),
                &mut config.tiers,
                config.gcra.as_ref(),
            );
            domains.insert(domain.clone(), Arc::new(policy));
        }
        let soft_limit = rate
            .soft_limit
            .as_ref()
            .and_then(|soft| self.soft_limit(at, soft));
        (self.errors.len() == errors_before).then(|| RateResource {
            name: name.to_owned(),
            global_limit,
            default: Arc::new(default),
            domains,
            soft_limit,
            alternative,
        })
    }

    /// `soft_limit`: a count (0 or more), or a share `N%` (1 to 100).
    pub(super) fn soft_limit(&mut self, at: Location, raw: &RawSoftLimit) -> Option<SoftLimit> {
        match raw {
            RawSoftLimit::Count(count) => match u64::try_from(*count) {
                Ok(count) if count <= u64::from(u32::MAX) => Some(SoftLimit::Count(count)),
                _ => {
                    self.error(
                        at,
                        format!("soft_limit {count} must be between 0 and {}", u32::MAX),
                    );
                    None
                }
            },
            RawSoftLimit::Share(text) => {
                let percent = text
                    .trim()
                    .strip_suffix('%')
                    .and_then(|number| number.trim().parse::<u64>().ok())
                    .filter(|percent| (1..=100).contains(percent));
                match percent {
                    Some(percent) => Some(SoftLimit::Percent(percent)),
                    None => {
                        self.error(
                            at,
                            format!("soft_limit `{text}`: write a count (8) or a share from 1% to 100% (80%)"),
                        );
                        None
                    }
                }
            }
        }
    }

    fn policy(
        &mut self,
        resource: &str,
        domain: Option<&str>,
        resource_at: Location,
        hard_limit: Option<&Spanned<i64>>,
        raw_tiers: &mut Vec<Spanned<RawTier>>,
        raw_gcra: Option<&Spanned<RawGcra>>,
    ) -> RatePolicy {
        let whose = match domain {
            Some(domain) => format!("resource `{resource}`, domain `{domain}`"),
            None => format!("resource `{resource}`"),
        };
        let hard_limit = hard_limit.and_then(|h| self.count(h, "hard_limit"));
        if let Some(raw) = raw_gcra {
            if !raw_tiers.is_empty() {
                self.error(
                    raw.referenced,
                    format!("{whose} has both `gcra` and `tiers` (or `ban`): a token bucket replaces the tiers, give one or the other"),
                );
            }
            return RatePolicy {
                hard_limit,
                tiers: Vec::new(),
                gcra: self.gcra(&whose, raw),
            };
        }
        if raw_tiers.len() > caps::MAX_TIERS {
            if let Some(first) = raw_tiers.first() {
                self.error(
                    first.referenced,
                    format!(
                        "{whose} has {} tiers; the limit is {}",
                        raw_tiers.len(),
                        caps::MAX_TIERS
                    ),
                );
            }
            return RatePolicy {
                hard_limit,
                tiers: Vec::new(),
                gcra: None,
            };
        }
        let had_tiers = !raw_tiers.is_empty();
        let mut tiers = Vec::with_capacity(raw_tiers.len());
        let mut keep = Vec::with_capacity(raw_tiers.len());
        for (index, spanned) in raw_tiers.iter_mut().enumerate() {
            let at = spanned.referenced;
            let raw = &mut spanned.value;
            let number = index + 1;
            let limit = self.count(&raw.limit, "limit");
            let window = self.duration(&raw.window, "window");
            let active = self.duration(&raw.active, "active");
            let cooldown = self.duration(&raw.cooldown, "cooldown");
            let (Some(limit), Some(mut window), Some(mut active), Some(cooldown)) =
                (limit, window, active, cooldown)
            else {
                keep.push(true);
                continue;
            };
            if window == 0 {
                self.error(raw.window.referenced, "window must be longer than 0s");
                keep.push(true);
                continue;
            }
            if active == 0 {
                self.note(
                    at,
                    format!(
                        "{whose}: tier {number} has `active: 0s` and can never be entered; removed"
                    ),
                );
                keep.push(false);
                continue;
            }
            if active != FOREVER && window > active {
                self.note(
                    at,
                    format!(
                        "{whose}: tier {number}: window {} is longer than active {}; shortened to {}",
                        duration::format(window),
                        duration::format(active),
                        duration::format(active)
                    ),
                );
                window = active;
                raw.window.value = duration::format(window);
            }
            if active != FOREVER && active % window != 0 {
                let trimmed = active / window * window;
                self.note(
                    at,
                    format!(
                        "{whose}: tier {number}: active {} is not a whole number of {} windows; trimmed to {}",
                        duration::format(active),
                        duration::format(window),
                        duration::format(trimmed)
                    ),
                );
                active = trimmed;
                raw.active.value = duration::format(active);
            }
            keep.push(true);
            tiers.push(Tier {
                limit,
                window,
                active,
                cooldown,
                skippable: raw.skippable,
            });
        }
        let mut flags = keep.into_iter();
        raw_tiers.retain(|_| flags.next().unwrap_or(true));
        if tiers.is_empty() {
            let why = if had_tiers {
                "has no tier left after normalization"
            } else if domain.is_some() {
                "has no tiers (a domain configuration replaces the default whole)"
            } else {
                "has no tiers"
            };
            self.note(
                resource_at,
                format!("{whose} {why}: every request for it will be rejected"),
            );
        }
        RatePolicy {
            hard_limit,
            tiers,
            gcra: None,
        }
    }

    /// `gcra: {burst, count, period}`: count and burst at least 1, a period
    /// longer than 0s.
    fn gcra(&mut self, whose: &str, raw: &Spanned<RawGcra>) -> Option<GcraLimit> {
        let count = self.count(&raw.value.count, "gcra count");
        let burst = match &raw.value.burst {
            Some(burst) => self.count(burst, "gcra burst"),
            None => count,
        };
        let period = self.duration(&raw.value.period, "gcra period");
        let (Some(count), Some(burst), Some(period)) = (count, burst, period) else {
            return None;
        };
        if count == 0 || burst == 0 || period == 0 || period == FOREVER {
            self.error(
                raw.referenced,
                format!("{whose}: gcra count and burst must be at least 1, and period a duration longer than 0s"),
            );
            return None;
        }
        Some(GcraLimit {
            count,
            period,
            burst,
        })
    }
}

/// A ban as burst tiers: `limit` per `window` for ever; the request that
/// bursts out of it enters a prison tier (limit 1: that request) that stays
/// current for `duration`, so nothing more passes until it ends.
fn ban_tiers(ban: RawBan) -> Vec<Spanned<RawTier>> {
    let text = |value: &str, like: &Spanned<String>| Spanned {
        value: value.to_owned(),
        referenced: like.referenced,
        defined: like.defined,
    };
    let tier = |limit: Spanned<i64>, window: Spanned<String>, active: Spanned<String>| {
        let cooldown = text("0s", &window);
        Spanned {
            referenced: limit.referenced,
            defined: limit.defined,
            value: RawTier {
                limit,
                window,
                active,
                cooldown,
                skippable: false,
            },
        }
    };
    let normal = tier(
        Spanned {
            value: ban.limit.value,
            referenced: ban.limit.referenced,
            defined: ban.limit.defined,
        },
        text(&ban.window.value, &ban.window),
        text("forever", &ban.window),
    );
    let prison = tier(
        Spanned {
            value: 1,
            referenced: ban.duration.referenced,
            defined: ban.duration.defined,
        },
        text(&ban.duration.value, &ban.duration),
        text(&ban.duration.value, &ban.duration),
    );
    vec![normal, prison]
}
