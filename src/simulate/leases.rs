//! `charon simulate --capacity`: capacity leases on a virtual clock
//! (docs/design.md#capacity-leases). Clients come and go and change what
//! they want; each renews every refresh interval (clients staggered evenly
//! across it, as real ones drift apart) through the real engine
//! ([`crate::engine::capacity`]); per tick, each client's lease is printed.
//! What it shows is how shares move and converge under an algorithm before
//! it is deployed.
//!
//! Clients are written `name: WANTS [from T] [until T] [then WANTS from T …]`,
//! separated by `;`: `a: 100; b: 30 from 5s; c: 100 from 10s until 20s`.

use serde::Serialize;

use crate::config::{duration, load_str};
use crate::engine::capacity::{self, CapacityConfig, LeaseState};

use super::MAX_TICKS;

/// Clients in one simulation at most.
pub const MAX_CLIENTS: usize = 64;

/// One client's demand over time.
#[derive(Debug, Clone, PartialEq)]
pub struct SimClient {
    pub name: String,
    /// (from ms, wants), in time order.
    pub wants: Vec<(u64, f64)>,
    pub until_ms: Option<u64>,
}

impl SimClient {
    fn wants_at(&self, at: u64) -> Option<f64> {
        if self.until_ms.is_some_and(|until| at >= until) {
            return None;
        }
        self.wants
            .iter()
            .rev()
            .find(|(from, _)| *from <= at)
            .map(|(_, wants)| *wants)
    }
}

/// Parses `a: 100; b: 30 from 5s; c: 100 from 10s until 20s then 50 from 15s`.
pub fn parse_clients(text: &str) -> Result<Vec<SimClient>, String> {
    let mut clients = Vec::new();
    for part in text.split(';').map(str::trim).filter(|p| !p.is_empty()) {
        let (name, rest) = part
            .split_once(':')
            .ok_or_else(|| format!("`{part}`: write `name: WANTS [from T] [until T]`"))?;
        let name = name.trim();
        if clients.len() == MAX_CLIENTS {
            return Err(format!("at most {MAX_CLIENTS} clients"));
        }
        if name.is_empty() || clients.iter().any(|c: &SimClient| c.name == name) {
            return Err(format!("`{part}`: a client needs a name of its own"));
        }
        let mut client = SimClient {
            name: name.to_owned(),
            wants: Vec::new(),
            until_ms: None,
        };
        for step in rest.split("then").map(str::trim) {
            let words: Vec<&str> = step.split_whitespace().collect();
            let wants: f64 = words
                .first()
                .and_then(|w| w.parse().ok())
                .filter(|w: &f64| w.is_finite() && *w >= 0.0)
                .ok_or_else(|| format!("`{step}`: start with what the client wants, a number"))?;
            let mut from = 0;
            let mut index = 1;
            while index < words.len() {
                let value = words
                    .get(index + 1)
                    .ok_or_else(|| format!("`{step}`: `{}` needs a time", words[index]))?;
                let ms = duration::parse(value).map_err(|e| format!("`{step}`: {e}"))?;
                match words[index] {
                    "from" => from = ms,
                    "until" => client.until_ms = Some(ms),
                    other => {
                        return Err(format!(
                            "`{step}`: unknown word `{other}` (from, until, then)"
                        ));
                    }
                }
                index += 2;
            }
            client.wants.push((from, wants));
        }
        client.wants.sort_by_key(|(from, _)| *from);
        clients.push(client);
    }
    if clients.is_empty() {
        return Err("no client: give --clients 'a: 100; b: 30 from 5s'".into());
    }
    Ok(clients)
}

/// The capacity configuration of an inline `capacity:` block.
pub fn resolve_capacity(inline: &str) -> Result<CapacityConfig, String> {
    if inline.chars().any(char::is_control) {
        return Err("write the inline capacity on one line, in YAML flow style".into());
    }
    let yaml = format!("domain: simulate\nresources:\n  inline:\n    capacity: {inline}\n");
    let loaded = load_str(&yaml, "--capacity").map_err(|e| format!("invalid --capacity:\n{e}"))?;
    match loaded
        .config
        .namespace("simulate")
        .and_then(|n| n.resources.get("inline"))
    {
        Some(crate::config::Resource::Capacity(capacity)) => Ok(capacity.default),
        _ => Err("--capacity is not a capacity block".into()),
    }
}

/// The whole simulation from its text arguments, as `charon simulate
/// --capacity C --clients L --duration D --tick T` and the simulator page
/// give them: one code path, so the page shows what the command prints.
pub fn run(
    capacity: &str,
    clients: &str,
    span: &str,
    tick: &str,
    max_ticks: u64,
) -> Result<LeaseTimeline, String> {
    let config = resolve_capacity(capacity)?;
    let clients = parse_clients(clients)?;
    let span = duration::parse(span).map_err(|e| format!("--duration: {e}"))?;
    let tick = duration::parse(tick).map_err(|e| format!("--tick: {e}"))?;
    if span == crate::config::FOREVER {
        return Err("--duration: give a finite duration".into());
    }
    if tick == 0 || span / tick > max_ticks.min(MAX_TICKS) {
        return Err(format!(
            "at most {} ticks: a longer --tick or a shorter --duration",
            max_ticks.min(MAX_TICKS)
        ));
    }
    simulate_leases(&config, &clients, span, tick)
}

/// One tick: each client's lease (`None`: not there).
#[derive(Debug, Clone, Serialize)]
pub struct LeaseTick {
    pub at_ms: u64,
    pub leases: Vec<Option<f64>>,
    pub total: f64,
}

#[derive(Debug, Clone, Serialize)]
pub struct LeaseTimeline {
    pub capacity: f64,
    pub clients: Vec<String>,
    pub ticks: Vec<LeaseTick>,
}

/// Runs `clients` for `span_ms`, printing every `tick_ms`.
pub fn simulate_leases(
    config: &CapacityConfig,
    clients: &[SimClient],
    span_ms: u64,
    tick_ms: u64,
) -> Result<LeaseTimeline, String> {
    if tick_ms == 0 || span_ms / tick_ms > MAX_TICKS {
        return Err(format!(
            "at most {MAX_TICKS} ticks: a longer --tick or a shorter --duration"
        ));
    }
    let refresh = config.refresh_interval_ms.max(1);
    let count = clients.len() as u64;
    // Client i renews at i * refresh / count + k * refresh.
    let offset = |i: usize| (i as u64) * refresh / count.max(1);
    let mut state = LeaseState::new(0);
    let mut held: Vec<Option<f64>> = vec![None; clients.len()];
    let mut next: Vec<u64> = (0..clients.len()).map(offset).collect();
    let mut ticks = Vec::new();
    let mut at = 0;
    while at <= span_ms {
        // Every renewal due up to this tick, in time order.
        while let Some((index, when)) = next
            .iter()
            .enumerate()
            .filter(|(_, when)| **when <= at)
            .min_by_key(|(_, when)| **when)
            .map(|(i, w)| (i, *w))
        {
            let client = &clients[index];
            match client.wants_at(when) {
                Some(wants) => {
                    let has = held[index].unwrap_or(0.0);
                    let lease =
                        capacity::request(config, &mut state, &client.name, wants, has, when)
                            .map_err(|e| e.to_string())?;
                    held[index] = Some(lease.capacity);
                }
                None => {
                    if held[index].take().is_some() {
                        capacity::release(&mut state, &client.name);
                    }
                }
            }
            next[index] = when + refresh;
        }
        capacity::expire(&mut state, at);
        let leases: Vec<Option<f64>> = clients
            .iter()
            .enumerate()
            .map(|(i, c)| held[i].filter(|_| state.clients.contains_key(&c.name)))
            .collect();
        let total = leases.iter().flatten().sum();
        ticks.push(LeaseTick {
            at_ms: at,
            leases,
            total,
        });
        at += tick_ms;
    }
    Ok(LeaseTimeline {
        capacity: config.capacity,
        clients: clients.iter().map(|c| c.name.clone()).collect(),
        ticks,
    })
}

impl LeaseTimeline {
    /// A table: one row per tick, one column per client.
    pub fn to_text(&self) -> String {
        let mut out = format!("{:>8}", "t");
        for name in &self.clients {
            out.push_str(&format!(" {name:>10}"));
        }
        out.push_str(&format!(" {:>10}\n", format!("sum/{}", self.capacity)));
        for tick in &self.ticks {
            out.push_str(&format!("{:>7.1}s", tick.at_ms as f64 / 1000.0));
            for lease in &tick.leases {
                match lease {
                    Some(lease) => out.push_str(&format!(" {lease:>10.2}")),
                    None => out.push_str(&format!(" {:>10}", "-")),
                }
            }
            out.push_str(&format!(" {:>10.2}\n", tick.total));
        }
        out
    }
}
