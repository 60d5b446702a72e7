//! `charon simulate`: the real engine on a virtual clock, fed a request
//! pattern, summarized per tick — what a configuration will do before it is
//! deployed. Each request is one `engine::decide` call on the same state a
//! store would keep, at its instant; after each tick the tiers are read back
//! (phase, window fill, current tier, `retry_after`) exactly as the engine
//! sees them. Work and memory are bounded by the pattern's caps
//! ([`pattern::MAX_REQUESTS`], [`pattern::MAX_SPAN_MS`]) and [`MAX_TICKS`].

pub mod costs;
pub mod leases;
pub mod pattern;
mod timeline;

use std::collections::VecDeque;
use std::path::Path;
use std::sync::Arc;

use serde::Serialize;

use crate::config::{FOREVER, RateResource, Resource, duration, load_path, load_str};
use crate::engine::{self, Item, Outcome, Slot, SlotKind, TiersItem};

pub use pattern::{MAX_REQUESTS, MAX_SPAN_MS, Pattern, parse as parse_pattern};
pub use timeline::{PhaseName, Tick, TierConfig, TierView, Timeline, read_back, tier_configs};

/// At most this many ticks in a timeline.
pub const MAX_TICKS: u64 = 100_000;
/// The virtual clock's epoch: a realistic instant, so nothing sits at 0.
const EPOCH: u64 = 1_700_000_000_000;

/// Where the limits come from: a configuration file or directory (and which
/// namespace and resource in it), or an inline `rate:` block in YAML flow
/// style (`{tiers: [{limit: 5, window: 1s}], hard_limit: 8}`).
pub enum Source<'a> {
    Config {
        path: &'a Path,
        namespace: Option<&'a str>,
        resource: Option<&'a str>,
    },
    Inline(&'a str),
}

/// The rate-limited resource `source` names, validated as `charon serve`
/// would; a namespace or resource may be left out when there is only one.
pub fn resolve(source: Source<'_>) -> Result<Arc<RateResource>, String> {
    let rate = resolve_any(source)?;
    if rate.alternative.is_some() {
        return Err(format!(
            "resource `{}` is a ban in cloud_armor mode, a hybrid limiter or a sliding window: simulate shows burst tiers and token buckets",
            rate.name
        ));
    }
    Ok(rate)
}

fn resolve_any(source: Source<'_>) -> Result<Arc<RateResource>, String> {
    let (loaded, namespace, resource) = match source {
        Source::Config {
            path,
            namespace,
            resource,
        } => (load_path(path), namespace, resource),
        Source::Inline(rate) => {
            if rate.chars().any(char::is_control) {
                return Err("write the inline rate on one line, in YAML flow style: {tiers: [{limit: 5, window: 1s}]}".into());
            }
            let yaml = format!("domain: simulate\nresources:\n  inline:\n    rate: {rate}\n");
            (load_str(&yaml, "--rate"), None, None)
        }
    };
    let config = loaded
        .map_err(|errors| format!("invalid configuration:\n{errors}"))?
        .config;
    let namespaces: Vec<_> = config.namespaces().collect();
    let found = match namespace {
        Some(name) => config
            .namespace(name)
            .ok_or_else(|| format!("no namespace `{name}` in the configuration"))?,
        None => match namespaces.as_slice() {
            [only] => *only,
            _ => {
                return Err(
                    "the configuration has several namespaces: name one with --namespace".into(),
                );
            }
        },
    };
    let rates: Vec<(&String, &Arc<RateResource>)> = found
        .resources
        .iter()
        .filter_map(|(name, resource)| match resource {
            Resource::Rate(rate) => Some((name, rate)),
            Resource::Copies(_) | Resource::Capacity(_) => None,
        })
        .collect();
    match resource {
        Some(name) => match found.resources.get(name) {
            Some(Resource::Rate(rate)) => Ok(rate.clone()),
            Some(Resource::Copies(_)) => Err(format!(
                "resource `{name}` is copy-limited: simulate shows rate limits (tiers and buckets)"
            )),
            Some(Resource::Capacity(_)) => Err(format!(
                "resource `{name}` is a leased capacity: simulate shows rate limits (tiers and buckets)"
            )),
            None => Err(format!(
                "no resource `{name}` in namespace `{}`",
                found.name
            )),
        },
        None => match rates.as_slice() {
            [(_, rate)] => Ok((*rate).clone()),
            [] => Err(format!(
                "namespace `{}` has no rate-limited resource",
                found.name
            )),
            _ => Err(format!(
                "namespace `{}` has several rate-limited resources: name one with --resource",
                found.name
            )),
        },
    }
}

/// Runs `pattern` for `domain` against `rate`, summarized every `tick_ms`.
pub fn simulate(
    rate: &Arc<RateResource>,
    domain: &str,
    pattern: &Pattern,
    tick_ms: u64,
) -> Result<Timeline, String> {
    let mut simulation = Simulation::new(rate.clone(), domain, tick_ms)?;
    let ticks = pattern.span_ms.div_ceil(tick_ms).max(1);
    if ticks > MAX_TICKS {
        return Err(format!(
            "{ticks} ticks of {}: at most {MAX_TICKS}; choose a longer tick",
            duration::format(tick_ms)
        ));
    }
    let mut closed = Closed::unbounded();
    for &(at, count) in &pattern.requests {
        simulation.request(at, count, &mut closed)?;
    }
    // The last tick may end past the week a pattern is held to.
    simulation.close_until(ticks, &mut closed);
    let mut timeline = simulation.describe();
    timeline.ticks = closed.ticks.into();
    Ok(timeline)
}

/// A simulation fed as it goes: requests at instants that never go back, and
/// ticks closed (read back) as the clock passes their end. `simulate` runs a
/// whole pattern through one; the admin's simulator page keeps one per open
/// page. Its memory is the engine's state of one domain: it does not grow
/// with the requests or the time fed.
pub struct Simulation {
    rate: Arc<RateResource>,
    domain: String,
    tick_ms: u64,
    slots: [Slot; 2],
    /// The latest instant fed (ms from the start).
    clock_ms: u64,
    /// The open tick's index: every earlier tick is closed.
    open_tick: u64,
    /// The open tick's grants, rejections and warnings.
    open: Totals,
    totals: Totals,
}

/// Counts of decisions.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct Totals {
    pub granted: u64,
    pub rejected: u64,
    pub warned: u64,
}

impl Totals {
    pub fn add(&mut self, other: Totals) {
        self.granted += other.granted;
        self.rejected += other.rejected;
        self.warned += other.warned;
    }
}

/// Where closed ticks go. A bounded sink keeps the latest `cap` ticks: a
/// long run of empty ticks is not even read back but its earliest part
/// skipped, so a page back after hours costs `cap` read-backs; the ticks
/// left out are counted.
pub struct Closed {
    pub ticks: VecDeque<Tick>,
    /// Ticks closed but left out.
    pub skipped: u64,
    cap: u64,
}

impl Closed {
    pub fn unbounded() -> Self {
        Self::at_most(u64::MAX)
    }

    pub fn at_most(cap: u64) -> Self {
        Self {
            ticks: VecDeque::new(),
            skipped: 0,
            cap: cap.max(1),
        }
    }
}

impl Simulation {
    /// A simulation of `rate` for `domain`, read back every `tick_ms`.
    pub fn new(rate: Arc<RateResource>, domain: &str, tick_ms: u64) -> Result<Self, String> {
        if tick_ms == 0 || tick_ms == FOREVER {
            return Err("the tick must be a duration longer than 0ms".into());
        }
        Ok(Self {
            rate,
            domain: domain.to_owned(),
            tick_ms,
            slots: [Slot::new(SlotKind::Tiers), Slot::new(SlotKind::Log)],
            clock_ms: 0,
            open_tick: 0,
            open: Totals::default(),
            totals: Totals::default(),
        })
    }

    /// The limits simulated, and the totals so far (no ticks).
    pub fn describe(&self) -> Timeline {
        let policy = self.rate.policy_for(&self.domain);
        Timeline {
            resource: self.rate.name.clone(),
            domain: self.domain.clone(),
            tick_ms: self.tick_ms,
            hard_limit: policy.hard_limit,
            global_limit: self.rate.global_limit,
            tiers: tier_configs(&self.rate, &self.domain),
            granted: self.totals.granted,
            rejected: self.totals.rejected,
            warned: self.totals.warned,
            ticks: Vec::new(),
        }
    }

    pub fn clock_ms(&self) -> u64 {
        self.clock_ms
    }

    pub fn totals(&self) -> Totals {
        self.totals
    }

    /// Decides `count` requests at `at_ms`, after closing the ticks that end
    /// by then. Refuses an instant before the clock or past a week.
    pub fn request(
        &mut self,
        at_ms: u64,
        count: u64,
        closed: &mut Closed,
    ) -> Result<Totals, String> {
        self.advance(at_ms, closed)?;
        let policy = self.rate.policy_for(&self.domain);
        let global_limit = self.rate.global_limit;
        let item = Item::Tiers(TiersItem {
            slot: 0,
            global_slot: global_limit.map(|_| 1),
            policy,
            global_limit,
            copies: 1,
            min_copies: 1,
            check_only: false,
            shadow: false,
        });
        let mut decided = Totals::default();
        for _ in 0..count {
            let decision = engine::decide(&[item], &mut self.slots, EPOCH + at_ms);
            match decision.outcomes.first() {
                Some(Outcome::Tiers(outcome)) if outcome.granted > 0 => {
                    decided.granted += 1;
                    let snapshot = &outcome.snapshot;
                    if self
                        .rate
                        .soft_limit
                        .is_some_and(|soft| soft.exceeded(snapshot.tier_hits, snapshot.tier_limit))
                    {
                        decided.warned += 1;
                    }
                }
                _ => decided.rejected += 1,
            }
        }
        self.open.add(decided);
        self.totals.add(decided);
        Ok(decided)
    }

    /// Moves the clock to `until_ms`, closing every tick that ends by then.
    pub fn advance(&mut self, until_ms: u64, closed: &mut Closed) -> Result<(), String> {
        if until_ms < self.clock_ms {
            return Err(format!(
                "time only goes forward: {} is before the simulation's clock, {}",
                duration::format(until_ms),
                duration::format(self.clock_ms)
            ));
        }
        if until_ms > MAX_SPAN_MS {
            return Err(format!(
                "a simulation lasts at most {}; start a new one",
                duration::format(MAX_SPAN_MS)
            ));
        }
        self.clock_ms = until_ms;
        // Tick k ends at (k + 1) * tick: closed once the clock reaches it.
        self.close_until(until_ms / self.tick_ms, closed);
        Ok(())
    }

    /// Closes every tick before tick `target`.
    fn close_until(&mut self, target: u64, closed: &mut Closed) {
        if self.open_tick < target {
            self.close_open_tick(closed);
        }
        // The rest had no request: only the latest `cap` are worth reading.
        let empty = target.saturating_sub(self.open_tick);
        if empty > closed.cap {
            closed.skipped += empty - closed.cap;
            self.open_tick += empty - closed.cap;
        }
        while self.open_tick < target {
            self.close_open_tick(closed);
        }
    }

    fn close_open_tick(&mut self, closed: &mut Closed) {
        let start = self.open_tick * self.tick_ms;
        let end = start + self.tick_ms;
        let mut tick = read_back(
            &self.rate,
            &self.domain,
            &self.slots,
            EPOCH + end - 1,
            start,
        );
        (tick.granted, tick.rejected, tick.warned) =
            (self.open.granted, self.open.rejected, self.open.warned);
        self.open = Totals::default();
        self.open_tick += 1;
        if closed.ticks.len() as u64 >= closed.cap {
            closed.ticks.pop_front();
            closed.skipped += 1;
        }
        closed.ticks.push_back(tick);
    }
}
