//! The envoyproxy/ratelimit descriptor tree, compiled for matching.
//!
//! Matching walks a request descriptor's entries down the tree. At each level
//! the entry matches, in this order: the child with the same key and value,
//! then the first child (in file order) whose value is a wildcard pattern that
//! matches, then the child with the key and no value. A limit applies only
//! where the descriptor ends.

use std::collections::HashMap;
use std::sync::Arc;

use smallvec::SmallVec;

use super::{FixedLimit, Unit};

/// A descriptor's `metadata:` map, as written.
pub type Metadata = std::collections::BTreeMap<String, super::raw::MetaValue>;

/// What a descriptor leaf says.
#[derive(Debug, Clone, PartialEq)]
pub enum Leaf {
    /// An intermediate node: a descriptor ending here is not limited.
    None,
    /// A fixed window, as in envoyproxy/ratelimit.
    Limit(FixedLimit),
    /// `rate_limit: {unlimited: true}`: never limited, reported as such.
    Unlimited {
        name: Option<String>,
        replaces: Vec<String>,
    },
    /// Charon's extension: the entry's value is the domain of this resource.
    Resource(String),
}

/// One node of the tree.
#[derive(Debug, Clone)]
pub struct Node {
    pub leaf: Leaf,
    pub shadow_mode: bool,
    /// Over its limit, this node alone does not reject a request: only all of
    /// a request's quota descriptors together do.
    pub quota_mode: bool,
    /// What the response's `dynamic_metadata` carries when this node's limit
    /// is matched and not over.
    pub metadata: Option<std::sync::Arc<Metadata>>,
    /// The per-limit metric key uses the request's values at every level.
    pub detailed_metric: bool,
    /// The per-limit metric key uses the request's value at this level.
    pub value_to_metric: bool,
    /// The key and value (or pattern) as written, `key` or `key_value`, for
    /// metric keys and dumps.
    pub written: String,
    /// The per-limit metric key when no request value shapes it, built once
    /// on first use (docs/envoy-compatibility.md, "Per-limit metrics").
    pub(crate) stats_key: std::sync::OnceLock<Arc<str>>,
    /// With `share_threshold` on a wildcard entry, the pattern replaces the
    /// value in the counter key so that all matching values share a counter.
    pub shared_value: Option<String>,
    /// A `global` limit: the name its shares go by
    /// (docs/design.md#global-limits).
    pub global: Option<Arc<str>>,
    pub children: Level,
}

/// The children of one node (or the top of the tree), by key.
#[derive(Debug, Clone, Default)]
pub struct Level {
    pub(crate) by_key: HashMap<String, KeyMatchers>,
}

#[derive(Debug, Clone, Default)]
pub(crate) struct KeyMatchers {
    pub(crate) exact: HashMap<String, Node>,
    pub(crate) wildcards: Vec<(Glob, Node)>,
    pub(crate) any: Option<Node>,
}

/// A match: the node where the descriptor ended, and for each entry the value
/// to use in the counter key.
#[derive(Debug)]
pub struct Match<'c> {
    pub node: &'c Node,
    /// One per entry: `None` means "the request's own value".
    pub shared_values: SmallVec<[Option<&'c str>; 4]>,
    /// One per entry: the node it matched and how.
    pub path: SmallVec<[(&'c Node, How); 4]>,
}

/// How an entry matched its node.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum How {
    /// The same key and value.
    Exact,
    /// A wildcard value.
    Wildcard,
    /// The key, with no value.
    Any,
}

impl Match<'_> {
    /// envoyproxy/ratelimit's statistics key for this match: the domain and
    /// the path as configured (`shop.tenant.path_/api/*`); with
    /// `detailed_metric` on the leaf, the request's own keys and values at
    /// every level; with `value_to_metric` on a level, that level's request
    /// value (a `share_threshold` pattern stays a pattern).
    pub fn stats_key(&self, domain: &str, entries: &[(String, String)]) -> Arc<str> {
        let detailed = self.node.detailed_metric;
        let valued = self.path.iter().any(|(node, _)| node.value_to_metric);
        if !detailed && !valued {
            return self
                .node
                .stats_key
                .get_or_init(|| {
                    let mut key = domain.to_owned();
                    for (node, _) in &self.path {
                        key.push('.');
                        key.push_str(&node.written);
                    }
                    Arc::from(key)
                })
                .clone();
        }
        let mut key = domain.to_owned();
        for ((node, how), (entry_key, value)) in self.path.iter().zip(entries) {
            key.push('.');
            key.push_str(entry_key);
            let shown: &str = if detailed {
                match &node.shared_value {
                    Some(pattern) => pattern,
                    None => {
                        key.push('_');
                        value
                    }
                }
            } else {
                match how {
                    How::Exact => value,
                    How::Any if node.value_to_metric => value,
                    How::Any => "",
                    How::Wildcard => match &node.shared_value {
                        Some(pattern) => pattern,
                        None if node.value_to_metric => value,
                        None => node
                            .written
                            .strip_prefix(entry_key.as_str())
                            .and_then(|rest| rest.strip_prefix('_'))
                            .unwrap_or(""),
                    },
                }
            };
            if detailed && node.shared_value.is_none() {
                key.push_str(shown);
            } else if !shown.is_empty() {
                key.push('_');
                key.push_str(shown);
            }
        }
        Arc::from(key)
    }
}

impl Level {
    /// Every node of this level (not their children), in no set order.
    pub fn nodes(&self) -> impl Iterator<Item = &Node> {
        self.by_key.values().flat_map(|matchers| {
            matchers
                .exact
                .values()
                .chain(matchers.wildcards.iter().map(|(_, node)| node))
                .chain(matchers.any.as_ref())
        })
    }

    /// Every node at and under this level, each with its statistics key
    /// (`prefix.key_value…`, as envoyproxy/ratelimit names a limit), in no
    /// set order.
    pub fn each_node(&self, prefix: &str, visit: &mut dyn FnMut(&str, &Node)) {
        for node in self.nodes() {
            let key = format!("{prefix}.{}", node.written);
            visit(&key, node);
            node.children.each_node(&key, visit);
        }
    }

    /// Adds `other`'s descriptors to this level (files of one domain merged):
    /// the composite key (`key` or `key_value`) of the first descriptor both
    /// define, if any, and then nothing is added.
    pub fn merge(&mut self, other: Level) -> Result<(), String> {
        for (key, theirs) in &other.by_key {
            let Some(ours) = self.by_key.get(key) else {
                continue;
            };
            if ours.any.is_some() && theirs.any.is_some() {
                return Err(key.clone());
            }
            if let Some(value) = theirs.exact.keys().find(|v| ours.exact.contains_key(*v)) {
                return Err(format!("{key}_{value}"));
            }
            if let Some((glob, _)) = theirs
                .wildcards
                .iter()
                .find(|(glob, _)| ours.wildcards.iter().any(|(g, _)| g == glob))
            {
                return Err(format!("{key}_{}", glob.pattern));
            }
        }
        for (key, theirs) in other.by_key {
            let ours = self.by_key.entry(key).or_default();
            ours.exact.extend(theirs.exact);
            ours.wildcards.extend(theirs.wildcards);
            if theirs.any.is_some() {
                ours.any = theirs.any;
            }
        }
        Ok(())
    }

    /// Finds the node a descriptor's entries lead to, if any.
    pub fn find<'c, 'e>(
        &'c self,
        entries: impl IntoIterator<Item = (&'e str, &'e str)>,
    ) -> Option<Match<'c>> {
        let mut level = self;
        let mut found: Option<&Node> = None;
        let mut shared_values = SmallVec::new();
        let mut path = SmallVec::new();
        for (key, value) in entries {
            let matchers = level.by_key.get(key)?;
            let (node, how) = matchers
                .exact
                .get(value)
                .map(|node| (node, How::Exact))
                .or_else(|| {
                    matchers
                        .wildcards
                        .iter()
                        .find(|(glob, _)| glob.matches(value))
                        .map(|(_, node)| (node, How::Wildcard))
                })
                .or(matchers.any.as_ref().map(|node| (node, How::Any)))?;
            shared_values.push(node.shared_value.as_deref());
            path.push((node, how));
            level = &node.children;
            found = Some(node);
        }
        found.map(|node| Match {
            node,
            shared_values,
            path,
        })
    }
}

/// A value pattern where `*` matches any run of characters (including none).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Glob {
    pattern: String,
}

impl Glob {
    pub fn new(pattern: &str) -> Self {
        Self {
            pattern: pattern.to_owned(),
        }
    }

    /// Whether `value` matches: iterative, linear-ish, never recursive, so a
    /// hostile pattern or value cannot blow the stack.
    pub fn matches(&self, value: &str) -> bool {
        let pattern = self.pattern.as_bytes();
        let value = value.as_bytes();
        let (mut p, mut v) = (0, 0);
        let mut backtrack: Option<(usize, usize)> = None;
        while v < value.len() {
            if p < pattern.len() && pattern[p] == b'*' {
                backtrack = Some((p, v));
                p += 1;
            } else if p < pattern.len() && pattern[p] == value[v] {
                p += 1;
                v += 1;
            } else if let Some((star, matched)) = backtrack {
                p = star + 1;
                v = matched + 1;
                backtrack = Some((star, matched + 1));
            } else {
                return false;
            }
        }
        pattern[p..].iter().all(|&b| b == b'*')
    }
}

impl Unit {
    /// The unit's length in milliseconds (a month is 30 days and a year 365,
    /// as in envoyproxy/ratelimit).
    pub fn millis(self) -> u64 {
        1_000
            * match self {
                Unit::Second => 1,
                Unit::Minute => 60,
                Unit::Hour => 3_600,
                Unit::Day => 86_400,
                Unit::Week => 604_800,
                Unit::Month => 2_592_000,
                Unit::Year => 31_536_000,
            }
    }

    /// The smallest unit at least as long as `ms` (a year if none is).
    pub fn covering(ms: u64) -> Unit {
        [
            Unit::Second,
            Unit::Minute,
            Unit::Hour,
            Unit::Day,
            Unit::Week,
            Unit::Month,
        ]
        .into_iter()
        .find(|unit| unit.millis() >= ms)
        .unwrap_or(Unit::Year)
    }

    /// The name as the YAML spells it (`minute`).
    pub fn as_lower(self) -> &'static str {
        match self {
            Unit::Second => "second",
            Unit::Minute => "minute",
            Unit::Hour => "hour",
            Unit::Day => "day",
            Unit::Week => "week",
            Unit::Month => "month",
            Unit::Year => "year",
        }
    }

    /// The name as Envoy's enum spells it (`MINUTE`).
    pub fn as_upper(self) -> &'static str {
        match self {
            Unit::Second => "SECOND",
            Unit::Minute => "MINUTE",
            Unit::Hour => "HOUR",
            Unit::Day => "DAY",
            Unit::Week => "WEEK",
            Unit::Month => "MONTH",
            Unit::Year => "YEAR",
        }
    }

    pub fn parse(text: &str) -> Option<Unit> {
        Some(match text.to_ascii_lowercase().as_str() {
            "second" => Unit::Second,
            "minute" => Unit::Minute,
            "hour" => Unit::Hour,
            "day" => Unit::Day,
            "week" => Unit::Week,
            "month" => Unit::Month,
            "year" => Unit::Year,
            _ => return None,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn glob_matches_runs_anywhere() {
        let cases = [
            ("foo*", "foobar", true),
            ("foo*", "foo", true),
            ("foo*", "fo", false),
            ("*bar", "foobar", true),
            ("a*b*c", "axxbyyc", true),
            ("a*b*c", "axxbyy", false),
            ("*", "", true),
            ("é*", "été", true),
            ("exact", "exact", true),
            ("exact", "exactly", false),
        ];
        for (pattern, value, expected) in cases {
            assert_eq!(
                Glob::new(pattern).matches(value),
                expected,
                "{pattern} ~ {value}"
            );
        }
    }

    #[test]
    fn glob_is_fast_on_hostile_input() {
        let pattern = "*a".repeat(50);
        let value = "a".repeat(10_000) + "b";
        assert!(!Glob::new(&pattern).matches(&value));
    }
}
