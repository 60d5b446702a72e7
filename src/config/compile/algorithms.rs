//! Every algorithm's own configuration checks, in one place: the
//! `algorithm:` a descriptor's limit names (with `burst` for a token
//! bucket), and a rate-limited resource's algorithm other than burst tiers
//! (a sliding window counter or log, hybrid, a cost budget, a Cloud Armor
//! ban), compiled into the resource's one [`ResourceLimit`]. An algorithm
//! added to the engine gets its checks here (CONTRIBUTING.md, "Adding an
//! algorithm").

use serde_saphyr::{Location, Spanned};

use crate::config::calendar::{Calendar, CalendarError, CalendarUnit};
use crate::config::duration::FOREVER;
use crate::config::raw::{RawCalendar, RawRate, RawRateLimit};
use crate::config::{Algorithm, ResourceLimit, Unit, caps};

use super::Ctx;

impl Ctx {
    /// The algorithm a descriptor's limit names (`fixed_window` when none)
    /// and, for a calendar window, its calendar, checked against its count
    /// and its window; `None` when it is wrong (reported).
    pub(super) fn algorithm(
        &mut self,
        limit: &RawRateLimit,
        requests_per_unit: u64,
        unit: Unit,
        unit_multiplier: u64,
    ) -> Option<(Algorithm, Option<Calendar>)> {
        let algorithm = self.named_algorithm(limit, requests_per_unit, unit, unit_multiplier)?;
        let Some(calendar) = &limit.calendar else {
            return Some((algorithm, None));
        };
        if algorithm != Algorithm::FixedWindow {
            self.error(
                calendar.referenced,
                format!(
                    "`calendar` makes a fixed window on the calendar, not a `{}`",
                    algorithm.name()
                ),
            );
            return None;
        }
        let calendar =
            self.calendar(&calendar.value, calendar.referenced, unit, unit_multiplier)?;
        Some((Algorithm::Calendar, Some(calendar)))
    }

    /// A calendar window's rule: one day, week, month or year in a zone.
    fn calendar(
        &mut self,
        raw: &RawCalendar,
        at: Location,
        unit: Unit,
        unit_multiplier: u64,
    ) -> Option<Calendar> {
        let unit = match unit {
            Unit::Day => CalendarUnit::Day,
            Unit::Week => CalendarUnit::Week,
            Unit::Month => CalendarUnit::Month,
            Unit::Year => CalendarUnit::Year,
            Unit::Second | Unit::Minute | Unit::Hour => {
                self.error(
                    at,
                    "a calendar window is a day, week, month or year: give `unit: day`, `week`, `month` or `year`",
                );
                return None;
            }
        };
        if unit_multiplier != 1 {
            self.error(
                at,
                format!(
                    "a calendar window is one {}: no unit_multiplier",
                    unit.name()
                ),
            );
            return None;
        }
        let zone = raw.time_zone.as_ref();
        let starts_on = raw.starts_on.as_ref();
        let name = zone.map_or("UTC", |zone| zone.value.as_str());
        match Calendar::new(unit, name, starts_on.map(|day| day.value)) {
            Ok(calendar) => Some(calendar),
            Err(error) => {
                let place = match error {
                    CalendarError::UnknownZone(_) => zone.map(|zone| zone.referenced),
                    CalendarError::StartsOn(_) | CalendarError::StartsOnNotMonth => {
                        starts_on.map(|day| day.referenced)
                    }
                };
                self.error(place.unwrap_or(at), error.to_string());
                None
            }
        }
    }

    /// The `algorithm:` a descriptor's limit names, checked.
    fn named_algorithm(
        &mut self,
        limit: &RawRateLimit,
        requests_per_unit: u64,
        unit: Unit,
        unit_multiplier: u64,
    ) -> Option<Algorithm> {
        let unit_ms = unit.millis();
        let (algorithm, at) = match &limit.algorithm {
            None => (Algorithm::FixedWindow, None),
            Some(named) => {
                let algorithm = match named.value.as_str() {
                    "fixed_window" => Algorithm::FixedWindow,
                    "gcra" => Algorithm::Gcra { burst: 0 },
                    "sliding_window" => Algorithm::SlidingWindow,
                    "sliding_log" => Algorithm::SlidingLog,
                    "hybrid" => Algorithm::Hybrid,
                    other => {
                        self.error(
                            named.referenced,
                            format!("unknown algorithm `{other}`; use fixed_window (the default), sliding_window, sliding_log, hybrid or gcra"),
                        );
                        return None;
                    }
                };
                (algorithm, Some(named.referenced))
            }
        };
        match (algorithm, &limit.burst) {
            (Algorithm::Gcra { .. }, None) => {
                return Some(Algorithm::Gcra {
                    burst: requests_per_unit,
                });
            }
            (Algorithm::Gcra { .. }, Some(burst)) => {
                return match self.count(burst, "burst")? {
                    0 => {
                        self.error(burst.referenced, "burst must be at least 1");
                        None
                    }
                    burst => Some(Algorithm::Gcra { burst }),
                };
            }
            (_, Some(burst)) => {
                self.error(
                    burst.referenced,
                    "`burst` applies only to `algorithm: gcra`",
                );
                return None;
            }
            (_, None) => {}
        }
        let Some(at) = at else {
            return Some(algorithm);
        };
        if algorithm == Algorithm::SlidingLog && requests_per_unit > caps::MAX_LOG_HITS {
            self.error(
                at,
                format!(
                    "with `algorithm: sliding_log`, requests_per_unit ({requests_per_unit}) is more than the {} hits a key's log keeps; use sliding_window for larger limits",
                    caps::MAX_LOG_HITS
                ),
            );
            return None;
        }
        // The bucket counts tokens × window in ms, exactly (the Redis
        // script's numbers are doubles).
        let period = unit_ms.saturating_mul(unit_multiplier);
        if algorithm == Algorithm::Hybrid
            && u128::from(requests_per_unit) * u128::from(period) >= 1 << 53
        {
            self.error(
                at,
                format!(
                    "with `algorithm: hybrid`, requests_per_unit ({requests_per_unit}) times the window in ms ({period}) must stay below 2^53"
                ),
            );
            return None;
        }
        Some(algorithm)
    }

    /// The algorithm other than tiers a rate names, if any: a ban in
    /// cloud_armor mode, `hybrid`, `sliding_window`, `sliding_log` or a
    /// `budget`,
    /// checked. `Err` when it is wrong (reported); it stands alone.
    pub(super) fn alternative(
        &mut self,
        name: &str,
        rate: &mut RawRate,
    ) -> Option<Option<ResourceLimit>> {
        let cloud_armor = rate.ban.take_if(|ban| {
            ban.value
                .mode
                .as_ref()
                .is_some_and(|mode| mode.value == "cloud_armor")
        });
        let named: Vec<(&str, Location)> = [
            cloud_armor
                .as_ref()
                .map(|b| ("ban (cloud_armor)", b.referenced)),
            rate.hybrid.as_ref().map(|h| ("hybrid", h.referenced)),
            rate.sliding_window
                .as_ref()
                .map(|s| ("sliding_window", s.referenced)),
            rate.sliding_log
                .as_ref()
                .map(|s| ("sliding_log", s.referenced)),
            rate.budget.as_ref().map(|b| ("budget", b.referenced)),
        ]
        .into_iter()
        .flatten()
        .collect();
        let Some(&(which, at)) = named.first() else {
            return Some(None);
        };
        if named.len() > 1
            || !rate.tiers.is_empty()
            || rate.ban.is_some()
            || rate.gcra.is_some()
            || rate.hard_limit.is_some()
            || rate.global_limit.is_some()
        {
            self.error(
                at,
                format!("resource `{name}`: `{which}` stands alone: no tiers, ban, gcra, hybrid, sliding window, hard_limit or global_limit beside it"),
            );
            return None;
        }
        let window_of = |ctx: &mut Self, window: &Spanned<String>| -> Option<u64> {
            let ms = ctx.duration(window, "window")?;
            if ms == 0 || ms == FOREVER {
                ctx.error(
                    window.referenced,
                    "window must be longer than 0s, and finite",
                );
                return None;
            }
            Some(ms)
        };
        if let Some(ban) = cloud_armor {
            let limit = self.count(&ban.value.limit, "limit");
            let window = window_of(self, &ban.value.window);
            let duration = self.duration(&ban.value.duration, "duration");
            let (limit, window, duration) = (limit?, window?, duration?);
            if duration == FOREVER {
                self.error(
                    ban.value.duration.referenced,
                    "a ban's duration must be finite",
                );
                return None;
            }
            return Some(Some(ResourceLimit::Ban(crate::config::BanLimit {
                limit,
                window,
                duration,
            })));
        }
        if let Some(hybrid) = &rate.hybrid {
            let quota = self.count(&hybrid.value.quota, "quota");
            let window = window_of(self, &hybrid.value.window);
            let (quota, window) = (quota?, window?);
            if u128::from(quota) * u128::from(window) >= 1 << 53 {
                self.error(
                    hybrid.referenced,
                    format!("resource `{name}`: hybrid quota ({quota}) times the window in ms ({window}) must stay below 2^53"),
                );
                return None;
            }
            return Some(Some(ResourceLimit::Hybrid { quota, window }));
        }
        if let Some(sliding) = &rate.sliding_window {
            if let Some(count) = &sliding.value.count_rejected {
                self.error(
                    count.referenced,
                    "`count_rejected` applies to sliding_log, not sliding_window",
                );
                return None;
            }
            let limit = self.count(&sliding.value.limit, "limit");
            let window = window_of(self, &sliding.value.window);
            return Some(Some(ResourceLimit::SlidingWindow {
                limit: limit?,
                window: window?,
            }));
        }
        if let Some(budget) = &rate.budget {
            let limit = self.count(&budget.value.limit, "limit");
            let window = window_of(self, &budget.value.window);
            let (limit, window) = (limit?, window?);
            let mut optional = |field: &Option<Spanned<i64>>, name: &str, default: u64| match field
            {
                None => Some(default),
                Some(value) => match self.count(value, name) {
                    Some(0) => {
                        self.error(value.referenced, format!("{name} must be at least 1"));
                        None
                    }
                    counted => counted,
                },
            };
            // As on a descriptor: one request is 1% of the budget before any
            // was charged, and a charge may be the whole budget.
            let initial_cost = optional(
                &budget.value.initial_cost,
                "initial_cost",
                (limit / 100).max(1),
            );
            let max_charge = optional(&budget.value.max_charge, "max_charge", limit.max(1));
            return Some(Some(ResourceLimit::Budget {
                limit,
                window,
                initial_cost: initial_cost?,
                max_charge: max_charge?,
            }));
        }
        let log = rate.sliding_log.as_ref()?;
        let limit = self.count(&log.value.limit, "limit");
        let window = window_of(self, &log.value.window);
        let (limit, window) = (limit?, window?);
        if limit > caps::MAX_LOG_HITS {
            self.error(
                log.referenced,
                format!(
                    "resource `{name}`: a sliding_log keeps at most {} hits per domain, not {limit}",
                    caps::MAX_LOG_HITS
                ),
            );
            return None;
        }
        Some(Some(ResourceLimit::SlidingLog {
            limit,
            window,
            count_rejected: log.value.count_rejected.as_ref().is_some_and(|c| c.value),
        }))
    }
}
