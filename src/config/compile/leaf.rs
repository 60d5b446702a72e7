//! A descriptor's leaf: its `rate_limit` (every algorithm, `unlimited`,
//! the per-descriptor options) or the `resource` it names, checked against
//! the kinds of the namespace's resources.

use std::collections::HashMap;

use crate::config::descriptors::Leaf;
use crate::config::raw::RawDescriptor;
use serde_saphyr::Spanned;

use crate::config::{Algorithm, FOREVER, FixedLimit, Unit, caps};

use super::{Ctx, Kind};

impl Ctx {
    pub(super) fn leaf(&mut self, raw: &RawDescriptor, kinds: &HashMap<String, Kind>) -> Leaf {
        match (&raw.rate_limit, &raw.resource) {
            (Some(limit), Some(_)) => {
                self.error(
                    limit.referenced,
                    "a descriptor has either `rate_limit` or `resource`, not both",
                );
                Leaf::None
            }
            (None, None) => Leaf::None,
            (None, Some(resource)) => match kinds.get(&resource.value) {
                Some(Kind::Rate) => Leaf::Resource(resource.value.clone()),
                Some(Kind::Copies) => {
                    self.error(
                        resource.referenced,
                        format!(
                            "resource `{}` is copy-limited; a descriptor can only name a rate-limited resource",
                            resource.value
                        ),
                    );
                    Leaf::None
                }
                Some(Kind::Capacity) => {
                    self.error(
                        resource.referenced,
                        format!(
                            "resource `{}` is a leased capacity; a descriptor can only name a rate-limited resource",
                            resource.value
                        ),
                    );
                    Leaf::None
                }
                None => {
                    self.error(
                        resource.referenced,
                        format!(
                            "resource `{}` is not defined under `resources:`",
                            resource.value
                        ),
                    );
                    Leaf::None
                }
            },
            (Some(limit), None) => {
                let at = limit.referenced;
                let limit = &limit.value;
                for replaced in &limit.replaces {
                    if replaced.name.is_empty() {
                        self.error(at, "`replaces` has an empty name");
                    } else if limit.name.as_deref() == Some(replaced.name.as_str()) {
                        self.error(at, format!("the limit `{}` replaces itself", replaced.name));
                    }
                }
                let replaces = limit.replaces.iter().map(|r| r.name.clone()).collect();
                let unit = match &limit.unit {
                    None => None,
                    Some(unit) => match Unit::parse(&unit.value) {
                        Some(parsed) => Some(parsed),
                        None => {
                            self.error(
                                unit.referenced,
                                format!(
                                    "invalid rate limit unit `{}`; use second, minute, hour, day, week, month or year",
                                    unit.value
                                ),
                            );
                            return Leaf::None;
                        }
                    },
                };
                if limit.unlimited {
                    if unit.is_some() {
                        self.error(at, "an unlimited rate_limit must not have a unit");
                    }
                    return Leaf::Unlimited {
                        name: limit.name.clone(),
                        replaces,
                    };
                }
                let Some(unit) = unit else {
                    self.error(at, "rate_limit needs a `unit` (or `unlimited: true`)");
                    return Leaf::None;
                };
                let unit_multiplier = match &limit.unit_multiplier {
                    None => 1,
                    Some(multiplier) => match self.count(multiplier, "unit_multiplier") {
                        Some(0) => {
                            self.error(multiplier.referenced, "unit_multiplier must be at least 1");
                            return Leaf::None;
                        }
                        Some(multiplier) => multiplier,
                        None => return Leaf::None,
                    },
                };
                let requests = match &limit.requests_per_unit {
                    Some(requests) => self.count(requests, "requests_per_unit"),
                    None => {
                        // envoyproxy/ratelimit reads a missing count as 0.
                        self.note(at, "rate_limit has no `requests_per_unit`: 0, so every request is over the limit");
                        Some(0)
                    }
                };
                let Some(requests_per_unit) = requests else {
                    return Leaf::None;
                };
                let Some((algorithm, calendar)) =
                    self.algorithm(limit, requests_per_unit, unit, unit_multiplier)
                else {
                    return Leaf::None;
                };
                let soft_limit = match &limit.soft_limit {
                    None => None,
                    Some(soft) => match self.soft_limit(at, soft) {
                        Some(soft) => Some(soft),
                        None => return Leaf::None,
                    },
                };
                let algorithm = match self.after_response(limit, algorithm, requests_per_unit) {
                    Some(algorithm) => algorithm,
                    None => return Leaf::None,
                };
                let count_rejected = match &limit.count_rejected {
                    Some(count)
                        if count.value && matches!(algorithm, Algorithm::AfterResponse { .. }) =>
                    {
                        self.error(
                            count.referenced,
                            "`count_rejected` is implied by `cost: after_response`: its charges are always recorded",
                        );
                        return Leaf::None;
                    }
                    Some(count) if count.value && !algorithm.may_count_rejected() => {
                        self.error(
                            count.referenced,
                            format!(
                                "`count_rejected` applies only to fixed windows and sliding logs (not to {})",
                                algorithm.as_written()
                            ),
                        );
                        return Leaf::None;
                    }
                    Some(count) => count.value,
                    None => false,
                };
                let global = match &limit.global {
                    Some(global) if global.value && !algorithm.may_be_global() => {
                        self.error(
                            global.referenced,
                            format!(
                                "`global` applies only to fixed and sliding windows (not to {})",
                                algorithm.as_written()
                            ),
                        );
                        return Leaf::None;
                    }
                    Some(global) => global.value,
                    None => false,
                };
                let algorithm = match &limit.max_hold {
                    None => algorithm,
                    Some(hold) => match self.max_hold(
                        hold,
                        algorithm,
                        requests_per_unit,
                        count_rejected,
                        global,
                    ) {
                        Some(algorithm) => algorithm,
                        None => return Leaf::None,
                    },
                };
                Leaf::Limit(FixedLimit {
                    requests_per_unit,
                    unit,
                    unit_multiplier,
                    name: limit.name.clone(),
                    replaces,
                    algorithm,
                    soft_limit,
                    count_rejected,
                    global,
                    calendar,
                })
            }
        }
    }

    /// `max_hold` makes a fixed window a concurrency limit
    /// (docs/design.md#concurrency-limits); `None` (an error said) when it
    /// cannot.
    fn max_hold(
        &mut self,
        hold: &Spanned<String>,
        algorithm: Algorithm,
        requests_per_unit: u64,
        count_rejected: bool,
        global: bool,
    ) -> Option<Algorithm> {
        let at = hold.referenced;
        let refuse = |this: &mut Self, message: String| {
            this.error(at, message);
            None
        };
        match algorithm {
            Algorithm::FixedWindow => {}
            Algorithm::AfterResponse { .. } => {
                return refuse(
                    self,
                    "`max_hold` makes a concurrency limit, which cannot also be `cost: after_response`".into(),
                );
            }
            other => {
                return refuse(
                    self,
                    format!(
                        "`max_hold` makes a concurrency limit, which cannot also be {}",
                        other.as_written()
                    ),
                );
            }
        }
        if count_rejected {
            return refuse(
                self,
                "`count_rejected` cannot be combined with `max_hold`: a concurrency limit already pairs each refused hit with its refund".into(),
            );
        }
        if global {
            return refuse(self, "`global` cannot be combined with `max_hold`: a concurrency limit is not shared by a hierarchy".into());
        }
        if requests_per_unit > caps::MAX_LOG_HITS {
            return refuse(
                self,
                format!(
                    "with `max_hold`, requests_per_unit ({requests_per_unit}) is more than the {} hits a concurrency limit holds",
                    caps::MAX_LOG_HITS
                ),
            );
        }
        let max_hold = self.duration(hold, "max_hold")?;
        if max_hold == 0 || max_hold == FOREVER {
            return refuse(
                self,
                "max_hold must be a duration longer than 0 and not `forever`: it bounds how long a hit that is never given back is held".into(),
            );
        }
        Some(Algorithm::MaxHold { max_hold })
    }
}
