//! Reading files: parse, validate, normalize, compile. Errors are collected
//! (not stopped at the first) so that one `charon check` shows them all.

use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use serde_saphyr::{Location, Spanned};

use super::descriptors::{Glob, KeyMatchers, Leaf, Level, Node};
use super::duration::{self, FOREVER, Millis};
use crate::engine::GcraLimit;

use super::raw::{
    RawBan, RawCopies, RawDescriptor, RawFile, RawGcra, RawRate, RawResource, RawSoftLimit, RawTier,
};
use super::{
    Algorithm, Config, ConfigError, ConfigErrors, CopyGroup, CopyResource, FixedLimit, Namespace,
    Note, RatePolicy, RateResource, Resource, Settings, SoftLimit, Tier, Unit, caps,
};

/// A loaded configuration and what loading it changed.
#[derive(Debug)]
pub struct Loaded {
    pub config: Config,
    /// What normalization changed, file by file.
    pub notes: Vec<Note>,
    /// Each file as normalized, in YAML, for `charon check`.
    pub normalized: Vec<(PathBuf, String)>,
}

/// How files are combined into one configuration.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct LoadOptions {
    /// Files naming the same domain add their descriptors and resources to
    /// it (envoyproxy/ratelimit's `MERGE_DOMAIN_CONFIG`); without it, a
    /// second file for a domain is an error.
    pub merge_domains: bool,
}

/// Loads one file, or every `*.yaml`/`*.yml` file of a directory.
pub fn load_path(path: &Path) -> Result<Loaded, ConfigErrors> {
    load_path_with(path, LoadOptions::default())
}

/// [`load_path`], with files naming one domain merged if `options` say so.
pub fn load_path_with(path: &Path, options: LoadOptions) -> Result<Loaded, ConfigErrors> {
    let files = if path.is_dir() {
        yaml_files_in(path)?
    } else {
        vec![path.to_owned()]
    };
    let mut errors = Vec::new();
    let mut notes = Vec::new();
    let mut normalized = Vec::new();
    let mut namespaces: HashMap<String, Namespace> = HashMap::new();
    for file in files {
        let text = match read_capped(&file) {
            Ok(text) => text,
            Err(error) => {
                errors.push(error);
                continue;
            }
        };
        match compile_file(&text, &file) {
            Ok(compiled) => {
                let name = compiled.namespace.name.clone();
                let error = |message: String| ConfigError {
                    file: file.clone(),
                    line: compiled.domain_at.line(),
                    column: compiled.domain_at.column(),
                    message,
                };
                if let Some(first) = namespaces.get_mut(&name) {
                    if !options.merge_domains {
                        errors.push(error(format!(
                            "domain `{name}` is already defined in {} (merging files of one domain is off)",
                            first.source.display()
                        )));
                        continue;
                    }
                    if let Err(message) = merge(first, compiled.namespace) {
                        errors.push(error(message));
                        continue;
                    }
                } else {
                    namespaces.insert(name, compiled.namespace);
                }
                notes.extend(compiled.notes);
                normalized.push((file, compiled.normalized));
            }
            Err(mut file_errors) => errors.append(&mut file_errors),
        }
    }
    if !errors.is_empty() {
        return Err(ConfigErrors(errors));
    }
    let config = Config {
        namespaces: namespaces
            .into_iter()
            .map(|(name, namespace)| (name, Arc::new(namespace)))
            .collect(),
    };
    Ok(Loaded {
        config,
        notes,
        normalized,
    })
}

/// Adds a later file's namespace to the first one of the same domain: its
/// descriptors and resources must be new, and its settings the same.
fn merge(first: &mut Namespace, later: Namespace) -> Result<(), String> {
    let domain = &first.name;
    let source = first.source.display();
    if first.settings != later.settings {
        return Err(format!(
            "domain `{domain}`: these `settings` differ from those in {source}; files merged into one domain must agree"
        ));
    }
    if let Some(name) = later
        .resources
        .keys()
        .find(|name| first.resources.contains_key(*name))
    {
        return Err(format!(
            "domain `{domain}`: resource `{name}` is also defined in {source}"
        ));
    }
    first.descriptors.merge(later.descriptors).map_err(|key| {
        format!("duplicate descriptor composite key '{domain}.{key}': also defined in {source}")
    })?;
    first.resources.extend(later.resources);
    Ok(())
}

/// Loads one file's text; `origin` names it in errors.
pub fn load_str(text: &str, origin: impl AsRef<Path>) -> Result<Loaded, ConfigErrors> {
    let origin = origin.as_ref();
    let compiled = compile_file(text, origin).map_err(ConfigErrors)?;
    let mut config = Config::default();
    config.namespaces.insert(
        compiled.namespace.name.clone(),
        Arc::new(compiled.namespace),
    );
    Ok(Loaded {
        config,
        notes: compiled.notes,
        normalized: vec![(origin.to_owned(), compiled.normalized)],
    })
}

fn yaml_files_in(dir: &Path) -> Result<Vec<PathBuf>, ConfigErrors> {
    let entries = std::fs::read_dir(dir).map_err(|e| {
        ConfigErrors(vec![ConfigError::whole_file(
            dir,
            format!("cannot read directory: {e}"),
        )])
    })?;
    let mut files: Vec<PathBuf> = entries
        .filter_map(Result::ok)
        .map(|entry| entry.path())
        .filter(|path| {
            // Kubernetes ConfigMap mounts keep their data under hidden `..data`
            // directories and expose it through symlinks: skip hidden names.
            let visible = path
                .file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| !n.starts_with('.'));
            let yaml = path
                .extension()
                .and_then(|e| e.to_str())
                .is_some_and(|e| e == "yaml" || e == "yml");
            visible && yaml && path.is_file()
        })
        .collect();
    files.sort();
    if files.is_empty() {
        return Err(ConfigErrors(vec![ConfigError::whole_file(
            dir,
            "no *.yaml or *.yml file in this directory",
        )]));
    }
    Ok(files)
}

fn read_capped(file: &Path) -> Result<String, ConfigError> {
    let meta = std::fs::metadata(file)
        .map_err(|e| ConfigError::whole_file(file, format!("cannot read file: {e}")))?;
    if meta.len() > caps::MAX_FILE_BYTES {
        return Err(ConfigError::whole_file(
            file,
            format!(
                "file is {} bytes; the limit is {} bytes",
                meta.len(),
                caps::MAX_FILE_BYTES
            ),
        ));
    }
    // The file may grow between the size check and the read: read no more
    // than the cap allows.
    let mut bytes = Vec::new();
    std::fs::File::open(file)
        .and_then(|f| {
            std::io::Read::read_to_end(
                &mut std::io::Read::take(f, caps::MAX_FILE_BYTES + 1),
                &mut bytes,
            )
        })
        .map_err(|e| ConfigError::whole_file(file, format!("cannot read file: {e}")))?;
    if bytes.len() as u64 > caps::MAX_FILE_BYTES {
        return Err(ConfigError::whole_file(
            file,
            format!(
                "file is larger than the limit of {} bytes",
                caps::MAX_FILE_BYTES
            ),
        ));
    }
    String::from_utf8(bytes)
        .map_err(|e| ConfigError::whole_file(file, format!("file is not UTF-8: {e}")))
}

struct Compiled {
    namespace: Namespace,
    notes: Vec<Note>,
    normalized: String,
    domain_at: Location,
}

fn compile_file(text: &str, file: &Path) -> Result<Compiled, Vec<ConfigError>> {
    let mut options = serde_saphyr::options::Options::default();
    options.with_snippet = false;
    let mut budget = serde_saphyr::Budget::default();
    // Descriptor nesting takes two YAML levels (a list, then a map).
    budget.max_depth = 2 * caps::MAX_DESCRIPTOR_DEPTH + 4;
    budget.max_nodes = caps::MAX_YAML_NODES;
    budget.max_events = 2 * caps::MAX_YAML_NODES;
    options.budget = Some(budget);
    // Like envoyproxy/ratelimit, tolerate `---` separators around the one
    // document (empty documents are skipped).
    let documents: Vec<Option<RawFile>> =
        serde_saphyr::from_str_multiple_with_options(text, options)
            .map_err(|e| vec![parse_error(file, &e)])?;
    let mut documents: Vec<RawFile> = documents.into_iter().flatten().collect();
    if documents.len() > 1 {
        return Err(vec![ConfigError::whole_file(
            file,
            format!(
                "{} YAML documents in one file; a file holds one namespace (split them into files of a directory)",
                documents.len()
            ),
        )]);
    }
    let Some(mut raw) = documents.pop() else {
        return Err(vec![ConfigError::whole_file(
            file,
            "the file is empty; it needs at least `domain:`",
        )]);
    };
    let mut ctx = Ctx {
        file: file.to_owned(),
        errors: Vec::new(),
        notes: Vec::new(),
    };
    let namespace = ctx.namespace(&mut raw);
    if !ctx.errors.is_empty() {
        return Err(ctx.errors);
    }
    let normalized =
        serde_saphyr::to_string(&raw).unwrap_or_else(|e| format!("# cannot print: {e}\n"));
    Ok(Compiled {
        namespace,
        notes: ctx.notes,
        normalized,
        domain_at: raw.domain.referenced,
    })
}

/// Parser messages that speak of Rust types or library options, said the way
/// a configuration's author would understand them.
fn plain_words(message: &str) -> String {
    let replacements: [(&str, &str); 10] = [
        (
            "missing field `domain`",
            "missing field `domain`: every config file needs a non-empty `domain`",
        ),
        (
            "missing field `key`",
            "missing field `key`: every descriptor needs a non-empty `key`",
        ),
        (
            "expected mapping start",
            "expected a mapping (`field: value` lines) here, not a single value or a list",
        ),
        (
            "expected sequence start",
            "expected a list (`- item` lines) here",
        ),
        ("expected string scalar", "expected a text value here"),
        (
            "invalid i64",
            "expected a whole number between 0 and 4294967295",
        ),
        (
            "invalid u32",
            "expected a whole number between 0 and 4294967295",
        ),
        (
            "cannot deserialize null into string; use Option<String>",
            "a value is required here",
        ),
        (", set DuplicateKeyPolicy in Options if acceptable", ""),
        (
            "; use from_str_multiple or from_str_multiple_with_options",
            "",
        ),
    ];
    let mut message = message.to_owned();
    for (from, to) in replacements {
        message = message.replace(from, to);
    }
    if message.starts_with("budget breached: Depth") {
        return format!(
            "nested deeper than the maximum depth of {} YAML levels ({} levels of descriptors)",
            2 * caps::MAX_DESCRIPTOR_DEPTH + 4,
            caps::MAX_DESCRIPTOR_DEPTH
        );
    }
    if message.starts_with("budget breached: Nodes")
        || message.starts_with("budget breached: Events")
    {
        return format!(
            "the file has too many YAML nodes (the limit is {})",
            caps::MAX_YAML_NODES
        );
    }
    message
}

fn parse_error(file: &Path, error: &serde_saphyr::Error) -> ConfigError {
    let text = plain_words(&error.to_string());
    match error.location() {
        Some(at) => {
            // The parser appends " at line L, column C"; we print the location
            // first, compiler style, so strip it from the message.
            let message = text
                .rsplit_once(" at line ")
                .map_or(text.as_str(), |(message, _)| message)
                .to_owned();
            ConfigError {
                file: file.to_owned(),
                line: at.line(),
                column: at.column(),
                message,
            }
        }
        None => ConfigError::whole_file(file, text),
    }
}

struct Ctx {
    file: PathBuf,
    errors: Vec<ConfigError>,
    notes: Vec<Note>,
}

/// What kind each resource is, for checking `resource:` leaves.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Kind {
    Rate,
    Copies,
}

impl Ctx {
    fn error(&mut self, at: Location, message: impl Into<String>) {
        self.errors.push(ConfigError {
            file: self.file.clone(),
            line: at.line(),
            column: at.column(),
            message: message.into(),
        });
    }

    fn note(&mut self, at: Location, message: impl Into<String>) {
        self.notes.push(Note {
            file: self.file.clone(),
            line: at.line(),
            column: at.column(),
            message: message.into(),
        });
    }

    /// A count: a whole number in `0..=u32::MAX`.
    fn count(&mut self, value: &Spanned<i64>, what: &str) -> Option<u64> {
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

    fn duration(&mut self, value: &Spanned<String>, what: &str) -> Option<Millis> {
        match duration::parse(&value.value) {
            Ok(ms) => Some(ms),
            Err(message) => {
                self.error(value.referenced, format!("{what}: {message}"));
                None
            }
        }
    }

    fn namespace(&mut self, raw: &mut RawFile) -> Namespace {
        let name = raw.domain.value.clone();
        if name.is_empty() {
            self.error(raw.domain.referenced, "domain is empty");
        }
        let settings = raw
            .settings
            .as_ref()
            .map(|s| Settings {
                ignore_configured: s.ignore_configured,
                allow_unconfigured: s.allow_unconfigured,
            })
            .unwrap_or_default();
        let kinds: HashMap<String, Kind> = raw
            .resources
            .iter()
            .map(|(name, resource)| {
                let kind = if resource.value.copies.is_some() && resource.value.rate.is_none() {
                    Kind::Copies
                } else {
                    Kind::Rate
                };
                (name.clone(), kind)
            })
            .collect();
        let descriptors = self.level(&raw.descriptors, 1, &kinds);
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
        }
    }

    fn level(
        &mut self,
        raws: &[RawDescriptor],
        depth: usize,
        kinds: &HashMap<String, Kind>,
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
                children: self.level(&raw.descriptors, depth + 1, kinds),
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

    fn leaf(&mut self, raw: &RawDescriptor, kinds: &HashMap<String, Kind>) -> Leaf {
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
                let algorithm = match limit
                    .algorithm
                    .as_ref()
                    .map(|a| (a.value.as_str(), a.referenced))
                {
                    None | Some(("fixed_window", _)) => {
                        if let Some(burst) = &limit.burst {
                            self.error(
                                burst.referenced,
                                "`burst` applies only to `algorithm: gcra`",
                            );
                            return Leaf::None;
                        }
                        Algorithm::FixedWindow
                    }
                    Some(("gcra", _)) => {
                        let burst = match &limit.burst {
                            None => requests_per_unit,
                            Some(burst) => match self.count(burst, "burst") {
                                Some(0) => {
                                    self.error(burst.referenced, "burst must be at least 1");
                                    return Leaf::None;
                                }
                                Some(burst) => burst,
                                None => return Leaf::None,
                            },
                        };
                        Algorithm::Gcra { burst }
                    }
                    Some((other, at)) => {
                        self.error(
                            at,
                            format!("unknown algorithm `{other}`; use fixed_window (the default) or gcra"),
                        );
                        return Leaf::None;
                    }
                };
                let soft_limit = match &limit.soft_limit {
                    None => None,
                    Some(soft) => match self.soft_limit(at, soft) {
                        Some(soft) => Some(soft),
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
                })
            }
        }
    }

    fn resource(&mut self, name: &str, resource: &mut Spanned<RawResource>) -> Option<Resource> {
        let at = resource.referenced;
        if name.is_empty() {
            self.error(at, "resource name is empty");
            return None;
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
                self.error(at, format!("resource `{name}` needs `rate:` or `copies:`"));
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
        if let Some(ban) = rate.ban.take() {
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
        })
    }

    /// `soft_limit`: a count (0 or more), or a share `N%` (1 to 100).
    fn soft_limit(&mut self, at: Location, raw: &RawSoftLimit) -> Option<SoftLimit> {
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

    fn copies(&mut self, name: &str, copies: &mut RawCopies) -> Option<CopyResource> {
        let errors_before = self.errors.len();
        let global_limit = copies
            .global_limit
            .as_ref()
            .and_then(|g| self.count(g, "global_limit"));
        let domain_limit = self.count(&copies.domain_limit, "domain_limit");
        let lowered = |ctx: &mut Ctx,
                       value: &mut Spanned<i64>,
                       count: Option<u64>,
                       what: String|
         -> u64 {
            let count = count.unwrap_or(0);
            match global_limit {
                Some(global) if count > global => {
                    ctx.note(
                        value.referenced,
                        format!("resource `{name}`: {what} {count} is above global_limit {global}; lowered to {global}"),
                    );
                    value.value = i64::try_from(global).unwrap_or(i64::MAX);
                    global
                }
                _ => count,
            }
        };
        let domain_limit = lowered(
            self,
            &mut copies.domain_limit,
            domain_limit,
            "domain_limit".into(),
        );
        let mut domains = HashMap::new();
        for (domain, limit) in &mut copies.domains {
            let count = self.count(limit, "domain limit");
            let count = lowered(self, limit, count, format!("limit of domain `{domain}`"));
            domains.insert(domain.clone(), count);
        }
        let mut groups = Vec::new();
        let mut group_names = HashSet::new();
        for group in &mut copies.groups {
            let group = &mut group.value;
            let group_name = group.name.value.clone();
            if group_name.is_empty() {
                self.error(group.name.referenced, "group name is empty");
                continue;
            }
            if !group_names.insert(group_name.clone()) {
                self.error(
                    group.name.referenced,
                    format!("duplicate group `{group_name}`"),
                );
                continue;
            }
            let count = self.count(&group.limit, "group limit");
            let limit = lowered(
                self,
                &mut group.limit,
                count,
                format!("limit of group `{group_name}`"),
            );
            groups.push(CopyGroup {
                name: group_name,
                limit,
                domains: group.domains.iter().cloned().collect(),
            });
        }
        (self.errors.len() == errors_before).then(|| CopyResource {
            name: name.to_owned(),
            domain_limit,
            global_limit,
            domains,
            groups,
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
