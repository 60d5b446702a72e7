//! The proposal as a namespace file: each recorded resource with a tier
//! per domain, each shadow-mode descriptor limit as descriptors with a
//! limit per value, every figure behind a limit in a comment beside it.
//! Names are written double-quoted, so any name reads back as itself.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use super::{DomainUse, Learn, Level, Pick, Recorded, Subject, VALUE_SEPARATOR, summarize};
use crate::config::duration;

/// A namespace file setting, for each recorded subject, each listed
/// domain's `pick` of use per window as its limit (at least 1), and the
/// median of those for any other domain, with every domain's statistics in
/// a comment.
pub fn snippet(
    namespace: &str,
    learn: &Learn,
    recorded: &[Recorded],
    pick: Pick,
    now_ms: u64,
) -> String {
    let period = super::period(learn, now_ms);
    let mut out = String::new();
    let _ = writeln!(
        out,
        "# Proposed by charon from the use recorded per {} window from {} to {}.",
        duration::format(learn.window_ms),
        timestamp(period.start),
        timestamp(period.end)
    );
    let _ = writeln!(
        out,
        "# Each domain's limit is its {} hits per window; any other domain's, the median of those.",
        pick.as_str()
    );
    let _ = writeln!(
        out,
        "# Shadow-mode limits come back as limits: add `shadow_mode: true` to keep watching them."
    );
    let _ = writeln!(out, "domain: {}", quoted(namespace));
    let mut resources = String::new();
    let mut descriptors = Tree::default();
    for subject in recorded {
        let uses = summarize(learn, &subject.windows, now_ms);
        if uses.is_empty() {
            continue;
        }
        match Subject::decode(&subject.subject) {
            Some(Subject::Resource(name)) => resource(&mut resources, &name, &uses, learn, pick),
            Some(Subject::Limit(path)) => descriptors.limit(&path, &uses, pick),
            None => {}
        }
    }
    if resources.is_empty() && descriptors.is_empty() {
        out.push_str("# nothing recorded in a complete window yet\n");
        return out;
    }
    if !descriptors.is_empty() {
        out.push_str("descriptors:\n");
        descriptors.write(&mut out, 1, &rate_limit_unit(learn.window_ms));
    }
    if !resources.is_empty() {
        out.push_str("resources:\n");
        out.push_str(&resources);
    }
    out
}

/// One resource: a default tier and one per writable domain.
fn resource(out: &mut String, name: &str, uses: &[DomainUse], learn: &Learn, pick: Pick) {
    let uses: Vec<&DomainUse> = uses.iter().filter(|u| is_name(&u.domain)).collect();
    if uses.is_empty() {
        return;
    }
    let window = duration::format(learn.window_ms);
    let tier =
        |limit: u64| format!("tiers: [{{limit: {limit}, window: {window}, active: forever}}]");
    let _ = writeln!(out, "  {}:", quoted(name));
    let _ = writeln!(out, "    rate:");
    let _ = writeln!(out, "      {}", tier(median(uses.iter().copied(), pick)));
    let _ = writeln!(out, "      domains:");
    for usage in uses {
        let _ = writeln!(
            out,
            "        {}: {{{}}}  # {}",
            quoted(&usage.domain),
            tier(usage.pick(pick).max(1)),
            figures(usage)
        );
    }
}

/// A limit per window and the comment that explains it.
type Proposed = (u64, String);

/// Descriptors as a tree, so that limits under one entry share it (a
/// namespace may not name one entry twice).
#[derive(Default)]
struct Tree {
    children: BTreeMap<(String, Level), Branch>,
}

#[derive(Default)]
struct Branch {
    limit: Option<Proposed>,
    tree: Tree,
}

impl Tree {
    fn is_empty(&self) -> bool {
        self.children.is_empty()
    }

    fn add(&mut self, path: &[(String, Level)], limit: Proposed) {
        let Some(((key, level), rest)) = path.split_first() else {
            return;
        };
        let branch = self
            .children
            .entry((key.clone(), level.clone()))
            .or_default();
        if rest.is_empty() {
            branch.limit = Some(limit);
        } else {
            branch.tree.add(rest, limit);
        }
    }

    /// A shadow-mode limit at `path`: with one level whose value varies, a
    /// limit per value and the median for any other; otherwise one limit.
    fn limit(&mut self, path: &[(String, Level)], uses: &[DomainUse], pick: Pick) {
        let varying: Vec<usize> = (0..path.len()).filter(|&i| path[i].1.varies()).collect();
        match varying.as_slice() {
            [] => {
                let usage = &uses[0];
                self.add(path, (usage.pick(pick).max(1), figures(usage)));
            }
            [at] => {
                let writable: Vec<&DomainUse> =
                    uses.iter().filter(|u| is_exact_value(&u.domain)).collect();
                let default = if writable.is_empty() {
                    median(uses, pick)
                } else {
                    median(writable.iter().copied(), pick)
                };
                self.add(
                    path,
                    (
                        default,
                        format!("any other value: the median of the {} recorded", uses.len()),
                    ),
                );
                for usage in writable {
                    let mut own = path.to_vec();
                    own[*at].1 = Level::Value(usage.domain.clone());
                    self.add(&own, (usage.pick(pick).max(1), figures(usage)));
                }
            }
            _ => {
                self.add(
                    path,
                    (
                        median(uses, pick),
                        format!(
                            "the median of {} combinations of values; none written apart",
                            uses.len()
                        ),
                    ),
                );
            }
        }
    }

    fn write(&self, out: &mut String, depth: usize, unit: &str) {
        let pad = "  ".repeat(depth);
        for ((key, level), branch) in &self.children {
            let _ = writeln!(out, "{pad}- key: {}", quoted(key));
            if let Level::Value(value) | Level::Pattern(value) | Level::Shared(value) = level {
                let _ = writeln!(out, "{pad}  value: {}", quoted(value));
            }
            if let Level::Shared(_) = level {
                let _ = writeln!(out, "{pad}  share_threshold: true");
            }
            if let Some((limit, why)) = &branch.limit {
                let _ = writeln!(
                    out,
                    "{pad}  rate_limit: {{{unit}, requests_per_unit: {limit}}}  # {why}"
                );
            }
            if !branch.tree.is_empty() {
                let _ = writeln!(out, "{pad}  descriptors:");
                branch.tree.write(out, depth + 2, unit);
            }
        }
    }
}

/// `unit` (and `unit_multiplier`) of a window: the largest unit that
/// divides it.
fn rate_limit_unit(window_ms: u64) -> String {
    let (name, unit_ms) = [
        ("day", 86_400_000),
        ("hour", 3_600_000),
        ("minute", 60_000),
        ("second", 1_000),
    ]
    .into_iter()
    .find(|(_, unit_ms)| window_ms.is_multiple_of(*unit_ms))
    .unwrap_or(("second", 1_000));
    match window_ms / unit_ms {
        1 => format!("unit: {name}"),
        multiplier => format!("unit: {name}, unit_multiplier: {multiplier}"),
    }
}

/// The median of the domains' picks, at least 1: what a typical domain
/// uses, for one not listed.
fn median<'u>(uses: impl IntoIterator<Item = &'u DomainUse>, pick: Pick) -> u64 {
    let mut picked: Vec<u64> = uses.into_iter().map(|usage| usage.pick(pick)).collect();
    picked.sort_unstable();
    super::nearest_rank(&picked, 50).max(1)
}

fn figures(usage: &DomainUse) -> String {
    format!(
        "peak {}, p99 {}, p95 {}, p50 {}; used in {} of {} windows",
        usage.peak, usage.p99, usage.p95, usage.p50, usage.seen, usage.windows
    )
}

fn timestamp(ms: u64) -> String {
    i64::try_from(ms)
        .ok()
        .and_then(|ms| jiff::Timestamp::from_millisecond(ms).ok())
        .map_or_else(|| format!("{ms} ms"), |at| at.to_string())
}

/// A name as YAML reads it back exactly: double-quoted, with its quotes
/// and backslashes escaped (names hold no control characters).
fn quoted(name: &str) -> String {
    format!("\"{}\"", name.replace('\\', "\\\\").replace('"', "\\\""))
}

/// Whether a configuration may name this domain (never empty, no control
/// characters): others are left out of the proposal rather than make it
/// fail to load.
fn is_name(domain: &str) -> bool {
    !domain.is_empty() && !domain.chars().any(char::is_control)
}

/// Whether a descriptor may match this value exactly: a name, one value
/// (not several joined), and no `*`, which would make it a wildcard.
fn is_exact_value(value: &str) -> bool {
    is_name(value) && !value.contains(VALUE_SEPARATOR) && !value.contains('*')
}
