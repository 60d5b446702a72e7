//! The compiler from parsed YAML to a [`Namespace`]: it checks every value,
//! normalizes what upstream tolerates, and records errors and notes with
//! their line and column instead of stopping at the first. Descriptor trees
//! are compiled here, a descriptor's leaf (its limit, or the resource it
//! names) in `leaf`; resources (tiers, GCRA, bans, soft limits) in
//! `resources`; each algorithm's own checks (a descriptor's `algorithm:`,
//! a resource's algorithm other than tiers) in `algorithms`; copy limits
//! in `copies`, capacities in `capacity`.

mod algorithms;
mod capacity;
mod copies;
mod leaf;
mod resources;

use std::collections::{BTreeMap, HashMap, HashSet};
use std::path::PathBuf;
use std::sync::Arc;

use serde_saphyr::{Location, Spanned};

use super::descriptors::{Glob, KeyMatchers, Leaf, Level, Node};
use super::duration::{self, Millis};

use super::global::{self, GlobalLimit};
use super::raw::{RawDescriptor, RawFile, RawLearn, RawSafeShare};
use super::{Algorithm, ConfigError, FixedLimit, Learn, Namespace, Note, Settings, caps};

/// One file's compilation: where it is, and what it found wrong or changed.
pub(in crate::config) struct Ctx {
    pub(in crate::config) file: PathBuf,
    pub(in crate::config) errors: Vec<ConfigError>,
    pub(in crate::config) notes: Vec<Note>,
}

/// Where a descriptor level is: its path as written (`key_value.key`), and
/// whether a level above (or itself) counts each request value apart.
struct Path {
    written: String,
    per_value: bool,
}

impl Path {
    fn child(&self, written: &str, per_value: bool) -> Path {
        Path {
            written: if self.written.is_empty() {
                written.to_owned()
            } else {
                format!("{}.{written}", self.written)
            },
            per_value: self.per_value || per_value,
        }
    }
}

/// What kind each resource is, for checking `resource:` leaves.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(in crate::config) enum Kind {
    Rate,
    Copies,
    Capacity,
}

impl Ctx {
    pub(super) fn error(&mut self, at: Location, message: impl Into<String>) {
        self.errors.push(ConfigError {
            file: self.file.clone(),
            line: at.line(),
            column: at.column(),
            message: message.into(),
        });
    }

    /// `cost: after_response` and its two numbers, over a fixed window;
    /// `None` after an error.
    fn after_response(
        &mut self,
        limit: &super::raw::RawRateLimit,
        algorithm: Algorithm,
        requests_per_unit: u64,
    ) -> Option<Algorithm> {
        let Some(cost) = &limit.cost else {
            for (field, name) in [
                (&limit.initial_cost, "initial_cost"),
                (&limit.max_charge, "max_charge"),
            ] {
                if let Some(field) = field {
                    self.error(
                        field.referenced,
                        format!("`{name}` applies only to `cost: after_response`"),
                    );
                    return None;
                }
            }
            return Some(algorithm);
        };
        if cost.value != "after_response" {
            self.error(
                cost.referenced,
                format!(
                    "unknown cost `{}`; the one kind is `after_response`",
                    cost.value
                ),
            );
            return None;
        }
        if algorithm != Algorithm::FixedWindow {
            self.error(
                cost.referenced,
                format!(
                    "`cost: after_response` counts in fixed windows (not with {})",
                    algorithm.as_written()
                ),
            );
            return None;
        }
        let mut number =
            |field: &Option<serde_saphyr::Spanned<i64>>, name: &str, default: u64| match field {
                None => Some(default),
                Some(value) => match self.count(value, name) {
                    Some(0) => {
                        self.error(value.referenced, format!("{name} must be at least 1"));
                        None
                    }
                    other => other,
                },
            };
        let initial_cost = number(
            &limit.initial_cost,
            "initial_cost",
            (requests_per_unit / 100).max(1),
        )?;
        let max_charge = number(&limit.max_charge, "max_charge", requests_per_unit.max(1))?;
        Some(Algorithm::AfterResponse {
            initial_cost,
            max_charge,
        })
    }

    /// Refuses a name with a control character (NUL, newline, escape…):
    /// one rule for every source of names, files and the configuration API
    /// alike, so no name can break a log line, a key or a page. True when
    /// refused.
    pub(super) fn control_character(&mut self, at: Location, what: &str, name: &str) -> bool {
        let Some((index, found)) = name.char_indices().find(|(_, c)| c.is_control()) else {
            return false;
        };
        self.error(
            at,
            format!(
                "{what} contains a control character (U+{:04X} at byte {index}); names may not",
                u32::from(found)
            ),
        );
        true
    }

    pub(super) fn note(&mut self, at: Location, message: impl Into<String>) {
        self.notes.push(Note {
            file: self.file.clone(),
            line: at.line(),
            column: at.column(),
            message: message.into(),
        });
    }

    /// A count: a whole number in `0..=u32::MAX`.
    pub(super) fn count(&mut self, value: &Spanned<i64>, what: &str) -> Option<u64> {
        match u32::try_from(value.value) {
            Ok(n) => Some(u64::from(n)),
            Err(_) => {
                self.error(
                    value.referenced,
                    format!(
                        "{what} must be between 0 and {}, got {}",
                        u32::MAX,
                        value.value
                    ),
                );
                None
            }
        }
    }

    pub(super) fn duration(&mut self, value: &Spanned<String>, what: &str) -> Option<Millis> {
        match duration::parse(&value.value) {
            Ok(ms) => Some(ms),
            Err(message) => {
                self.error(value.referenced, format!("{what}: {message}"));
                None
            }
        }
    }

    /// `settings.learn`, each field within its bounds.
    fn learn(&mut self, raw: &Spanned<RawLearn>) -> Option<Learn> {
        let mut learn = Learn::DEFAULT;
        let mut valid = true;
        if let Some(window) = &raw.value.window {
            match self.duration(window, "learn.window") {
                Some(ms) if Learn::WINDOW_MS.contains(&ms) && ms % 1_000 == 0 => {
                    learn.window_ms = ms;
                }
                Some(_) => {
                    self.error(
                        window.referenced,
                        format!(
                            "learn.window must be whole seconds from 1s to 1d, got `{}`",
                            window.value
                        ),
                    );
                    valid = false;
                }
                None => valid = false,
            }
        }
        for (field, value, bounds, into) in [
            (
                "windows",
                &raw.value.windows,
                Learn::WINDOWS,
                &mut learn.windows,
            ),
            (
                "domains",
                &raw.value.domains,
                Learn::DOMAINS,
                &mut learn.domains,
            ),
        ] {
            let Some(value) = value else { continue };
            match u32::try_from(value.value) {
                Ok(n) if bounds.contains(&n) => *into = n,
                _ => {
                    self.error(
                        value.referenced,
                        format!(
                            "learn.{field} must be from {} to {}, got {}",
                            bounds.start(),
                            bounds.end(),
                            value.value
                        ),
                    );
                    valid = false;
                }
            }
        }
        if valid && u64::from(learn.windows) * u64::from(learn.domains) > Learn::ENTRIES {
            self.error(
                raw.referenced,
                format!(
                    "learn.windows x learn.domains is {} entries per resource, over {}: the record's memory is that bound times 100 resources",
                    u64::from(learn.windows) * u64::from(learn.domains),
                    Learn::ENTRIES
                ),
            );
            valid = false;
        }
        valid.then_some(learn)
    }

    pub(in crate::config) fn namespace(&mut self, raw: &mut RawFile) -> Namespace {
        let name = raw.domain.value.clone();
        if name.is_empty() {
            self.error(raw.domain.referenced, "domain is empty");
        }
        self.control_character(raw.domain.referenced, "domain", &name);
        let settings = raw
            .settings
            .as_ref()
            .map(|s| Settings {
                ignore_configured: s.ignore_configured,
                allow_unconfigured: s.allow_unconfigured,
                learn: s.learn.as_ref().and_then(|learn| self.learn(learn)),
            })
            .unwrap_or_default();
        let kinds: HashMap<String, Kind> = raw
            .resources
            .iter()
            .map(|(name, resource)| {
                let kind = if resource.value.capacity.is_some() {
                    Kind::Capacity
                } else if resource.value.copies.is_some() && resource.value.rate.is_none() {
                    Kind::Copies
                } else {
                    Kind::Rate
                };
                (name.clone(), kind)
            })
            .collect();
        let mut globals = BTreeMap::new();
        let top = Path {
            written: String::new(),
            per_value: false,
        };
        let descriptors = self.level(&raw.descriptors, 1, &kinds, &top, &mut globals);
        let mut resources = HashMap::new();
        for (name, resource) in &mut raw.resources {
            if let Some(compiled) = self.resource(name, resource) {
                resources.insert(name.clone(), compiled);
            }
        }
        Namespace {
            name,
            source: self.file.clone(),
            settings,
            descriptors,
            resources,
            globals,
        }
    }

    fn level(
        &mut self,
        raws: &[RawDescriptor],
        depth: usize,
        kinds: &HashMap<String, Kind>,
        parent: &Path,
        globals: &mut BTreeMap<String, GlobalLimit>,
    ) -> Level {
        let mut level = Level::default();
        let mut seen: HashSet<(&str, &str)> = HashSet::new();
        for raw in raws {
            let at = raw.key.referenced;
            let key = raw.key.value.as_str();
            if key.is_empty() {
                self.error(at, "descriptor key is empty");
                continue;
            }
            if self.control_character(at, "descriptor key", key) {
                continue;
            }
            if depth > caps::MAX_DESCRIPTOR_DEPTH {
                self.error(
                    at,
                    format!(
                        "descriptors are nested deeper than {}",
                        caps::MAX_DESCRIPTOR_DEPTH
                    ),
                );
                return level;
            }
            let value = raw.value.as_ref().map_or("", |v| v.value.as_str());
            if let Some(written) = &raw.value
                && self.control_character(written.referenced, "descriptor value", value)
            {
                continue;
            }
            if !seen.insert((key, value)) {
                let shown = if value.is_empty() {
                    format!("`{key}`")
                } else {
                    format!("`{key}` = `{value}`")
                };
                self.error(at, format!("duplicate descriptor {shown} at this level"));
                continue;
            }
            let leaf = self.leaf(raw, kinds);
            let is_wildcard = value.contains('*');
            let shared_value = if raw.share_threshold {
                if !is_wildcard {
                    self.error(at, "share_threshold needs a wildcard value (one with `*`)");
                }
                Some(value.to_owned())
            } else {
                None
            };
            let written = if value.is_empty() {
                key.to_owned()
            } else {
                format!("{key}_{value}")
            };
            // Each value of the request has its own counter here.
            let per_value = value.is_empty() || (is_wildcard && shared_value.is_none());
            let path = parent.child(&written, per_value);
            let written_safe = raw
                .rate_limit
                .as_ref()
                .and_then(|written| written.value.safe_share.as_ref());
            let global = match &leaf {
                Leaf::Limit(limit) if limit.global => {
                    let global_at = raw
                        .rate_limit
                        .as_ref()
                        .and_then(|written| written.value.global.as_ref())
                        .map_or(at, |global| global.referenced);
                    let safe_share = written_safe.and_then(|safe| self.safe_share(safe));
                    self.global(global_at, limit, safe_share, &path, globals)
                }
                _ => {
                    if let Some(safe) = written_safe {
                        self.error(
                            safe.referenced,
                            "`safe_share` applies only to a limit marked `global: true`",
                        );
                    }
                    None
                }
            };
            let node = Node {
                leaf,
                shadow_mode: raw.shadow_mode,
                quota_mode: raw.quota_mode,
                metadata: raw
                    .metadata
                    .as_ref()
                    .filter(|m| !m.is_empty())
                    .map(|m| Arc::new(m.clone())),
                detailed_metric: raw.detailed_metric,
                value_to_metric: raw.value_to_metric,
                written,
                stats_key: Default::default(),
                shared_value,
                global,
                children: self.level(&raw.descriptors, depth + 1, kinds, &path, globals),
            };
            let matchers: &mut KeyMatchers = level.by_key.entry(key.to_owned()).or_default();
            if value.is_empty() {
                matchers.any = Some(node);
            } else if is_wildcard {
                matchers.wildcards.push((Glob::new(value), node));
            } else {
                matchers.exact.insert(value.to_owned(), node);
            }
        }
        level
    }

    /// Registers a `global` limit at `path`; the name its shares go by.
    /// A `safe_share:` as written; `None` (an error said) if it cannot be read.
    fn safe_share(&mut self, written: &Spanned<RawSafeShare>) -> Option<global::SafeShare> {
        let parsed = match &written.value {
            RawSafeShare::Count(count) => u64::try_from(*count)
                .map(global::SafeShare::Requests)
                .map_err(|_| count.to_string()),
            RawSafeShare::Word(word) => global::SafeShare::parse(word).map_err(|_| word.clone()),
        };
        match parsed {
            Ok(safe) => Some(safe),
            Err(text) => {
                self.error(
                    written.referenced,
                    format!(
                        "`safe_share` is `last`, `split`, `whole`, a count of requests or a percentage of the limit (`25%`), got `{text}`"
                    ),
                );
                None
            }
        }
    }

    fn global(
        &mut self,
        at: Location,
        limit: &FixedLimit,
        safe_share: Option<global::SafeShare>,
        path: &Path,
        globals: &mut BTreeMap<String, GlobalLimit>,
    ) -> Option<Arc<str>> {
        if path.per_value {
            self.error(
                at,
                "a `global` limit needs every level of its descriptor to name one value (or a wildcard with share_threshold): each value would be a limit of its own",
            );
            return None;
        }
        let name = format!("{}{}", global::RESOURCE_PREFIX, path.written);
        globals.insert(
            name.clone(),
            GlobalLimit {
                limit: limit.clone(),
                safe_share,
            },
        );
        Some(Arc::from(name))
    }
}
