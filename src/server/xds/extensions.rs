//! Charon's extensions for limits that arrive over xDS
//! (docs/envoy-compatibility.md#charons-extensions-for-xds-fed-limits): a
//! `RateLimitConfig` carries a unit and a count, so a gateway's limits are
//! fixed windows. An operator's file (`--xds-extensions`) names limits by
//! domain and descriptor path and adds what a Charon file could say of
//! them (an algorithm, a burst, a calendar, `max_hold`, a cost known after
//! the response…), without touching the gateway's resources:
//!
//! ```yaml
//! extensions:
//!   - domain: "default/eg/*"          # exact, or a prefix and `*`
//!     descriptors: [generic_key=per-user, user]   # `key` or `key=value`
//!     rate_limit: {algorithm: sliding_window}
//! ```
//!
//! The file is checked when it is read: its own errors, and each
//! `rate_limit` compiled on a probe limit, at their line and column. Each
//! snapshot's domains are extended before they are loaded (so a pushed
//! limit with an extension is checked like a file), and an extension that
//! matched no limit of the snapshot is logged as a warning with its place.
//! A changed file (or SIGHUP) is read again and the last snapshot applied
//! with it at once; one that does not check is logged, the last good kept.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use serde::Deserialize;
use serde_json::{Map, Value as Json};
use serde_saphyr::{Location, Spanned};

use crate::config::ConfigError;

/// What xDS says of a limit, which an extension may not change.
const FROM_XDS: &[&str] = &[
    "unit",
    "requests_per_unit",
    "unit_multiplier",
    "name",
    "unlimited",
    "replaces",
];

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawFile {
    extensions: Vec<Spanned<RawExtension>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawExtension {
    domain: Spanned<String>,
    #[serde(default)]
    descriptors: Vec<Spanned<String>>,
    rate_limit: Spanned<Map<String, Json>>,
}

/// One extension: where it applies and what it adds.
#[derive(Debug, Clone, PartialEq)]
struct Extension {
    domain: String,
    /// Each step down the descriptor tree: a key, and a value if named.
    path: Vec<(String, Option<String>)>,
    fields: Map<String, Json>,
    /// `file:line:column` of the extension, for what is logged of it.
    place: String,
}

/// The operator's extensions, checked.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Extensions {
    list: Vec<Extension>,
}

impl Extensions {
    /// Reads and checks the file at `path`: every error with its place.
    pub fn load(path: &Path) -> Result<Self, Vec<ConfigError>> {
        let text = std::fs::read_to_string(path).map_err(|error| {
            vec![ConfigError::whole_file(
                path,
                format!("cannot read: {error}"),
            )]
        })?;
        Self::parse(&text, path)
    }

    /// The extensions of the file a flag names, none without one.
    pub fn load_flag(path: Option<&Path>) -> Result<Self, crate::config::ConfigErrors> {
        path.map_or(Ok(Self::default()), |path| {
            Self::load(path).map_err(crate::config::ConfigErrors)
        })
    }

    /// Checks `text`, as read from `origin`.
    pub fn parse(text: &str, origin: &Path) -> Result<Self, Vec<ConfigError>> {
        let raw: RawFile = crate::config::parse_yaml(text, origin).map_err(|error| vec![error])?;
        let mut errors = Vec::new();
        let mut list = Vec::new();
        for extension in raw.extensions {
            let at = extension.referenced;
            let extension = extension.value;
            let error = |errors: &mut Vec<ConfigError>, at: Location, message: String| {
                errors.push(ConfigError {
                    file: origin.to_owned(),
                    line: at.line(),
                    column: at.column(),
                    message,
                });
            };
            if extension.domain.value.is_empty() {
                error(
                    &mut errors,
                    extension.domain.referenced,
                    "an empty domain names no limit".into(),
                );
                continue;
            }
            let mut path = Vec::new();
            for step in &extension.descriptors {
                match step.value.split_once('=') {
                    Some(("", _)) => {
                        error(
                            &mut errors,
                            step.referenced,
                            format!("`{}` has no key", step.value),
                        );
                    }
                    Some((key, value)) => path.push((key.to_owned(), Some(value.to_owned()))),
                    None if step.value.is_empty() => {
                        error(
                            &mut errors,
                            step.referenced,
                            "an empty step names no descriptor".into(),
                        );
                    }
                    None => path.push((step.value.clone(), None)),
                }
            }
            if path.is_empty() {
                error(
                    &mut errors,
                    at,
                    "name the limit's descriptors: `descriptors: [key, key=value, …]`".into(),
                );
                continue;
            }
            let fields = extension.rate_limit.value;
            if let Some(owned) = fields.keys().find(|key| FROM_XDS.contains(&key.as_str())) {
                error(
                    &mut errors,
                    extension.rate_limit.referenced,
                    format!("`{owned}` comes from xDS; an extension adds what xDS cannot say"),
                );
                continue;
            }
            if let Err(message) = probe(&fields) {
                error(&mut errors, extension.rate_limit.referenced, message);
                continue;
            }
            list.push(Extension {
                domain: extension.domain.value,
                path,
                fields,
                place: format!("{}:{}:{}", origin.display(), at.line(), at.column()),
            });
        }
        if errors.is_empty() {
            Ok(Self { list })
        } else {
            Err(errors)
        }
    }

    /// Adds what applies to `namespace` (a pushed domain in the file
    /// format); `matched[i]` set when the `i`-th extension applied.
    pub fn apply(&self, namespace: &mut Json, matched: &mut [bool]) {
        let Some(domain) = namespace
            .get("domain")
            .and_then(Json::as_str)
            .map(str::to_owned)
        else {
            return;
        };
        for (index, extension) in self.list.iter().enumerate() {
            if !domain_matches(&extension.domain, &domain) {
                continue;
            }
            if let Some(descriptors) = namespace.get_mut("descriptors") {
                let applied = extend(descriptors, &extension.path, &extension.fields);
                if let Some(flag) = matched.get_mut(index) {
                    *flag |= applied;
                }
            }
        }
    }

    /// How many extensions there are.
    pub fn len(&self) -> usize {
        self.list.len()
    }

    pub fn is_empty(&self) -> bool {
        self.list.is_empty()
    }

    /// The places of the extensions `matched` says applied to nothing.
    pub fn unmatched(&self, matched: &[bool]) -> Vec<&str> {
        self.list
            .iter()
            .zip(matched)
            .filter(|(_, matched)| !**matched)
            .map(|(extension, _)| extension.place.as_str())
            .collect()
    }
}

/// Re-reads the file at `path` when it changes (looked at every `every`,
/// so a ConfigMap's update is seen) and on SIGHUP, until `shutdown`: each
/// version that checks is sent; one that does not is logged with its
/// errors, and the last good one stays.
pub fn watch(
    path: PathBuf,
    initial: Arc<Extensions>,
    every: Duration,
    mut shutdown: tokio::sync::watch::Receiver<bool>,
) -> tokio::sync::watch::Receiver<Arc<Extensions>> {
    let (sender, receiver) = tokio::sync::watch::channel(initial);
    tokio::spawn(async move {
        let mut last = std::fs::read_to_string(&path).ok();
        let mut hangups =
            tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup()).ok();
        loop {
            let hangup = async {
                match hangups.as_mut() {
                    Some(signal) => signal.recv().await,
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                _ = shutdown.changed() => return,
                _ = hangup => {}
                () = tokio::time::sleep(every) => {}
            }
            let text = std::fs::read_to_string(&path).ok();
            if text == last {
                continue;
            }
            last = text;
            match Extensions::load(&path) {
                Ok(extensions) => {
                    tracing::info!(path = %path.display(), extensions = extensions.len(), "xDS extensions reloaded");
                    sender.send_replace(Arc::new(extensions));
                }
                Err(errors) => tracing::error!(
                    errors = %crate::config::ConfigErrors(errors),
                    "xDS extensions do not load; keeping the last good ones"
                ),
            }
        }
    });
    receiver
}

/// `pattern` is the domain, or a prefix of it followed by `*`.
fn domain_matches(pattern: &str, domain: &str) -> bool {
    match pattern.strip_suffix('*') {
        Some(prefix) => domain.starts_with(prefix),
        None => pattern == domain,
    }
}

/// Adds `fields` to the limits at the end of `path` below `descriptors`;
/// whether any was there.
fn extend(
    descriptors: &mut Json,
    path: &[(String, Option<String>)],
    fields: &Map<String, Json>,
) -> bool {
    let Some(((key, value), rest)) = path.split_first() else {
        return false;
    };
    let Some(list) = descriptors.as_array_mut() else {
        return false;
    };
    let mut applied = false;
    for node in list {
        let key_matches = node.get("key").and_then(Json::as_str) == Some(key.as_str());
        let value_matches = match value {
            None => true,
            Some(value) => node.get("value").and_then(Json::as_str) == Some(value.as_str()),
        };
        if !(key_matches && value_matches) {
            continue;
        }
        if rest.is_empty() {
            if let Some(Json::Object(limit)) = node.get_mut("rate_limit") {
                for (field, setting) in fields {
                    limit.insert(field.clone(), setting.clone());
                }
                applied = true;
            }
        } else if let Some(children) = node.get_mut("descriptors") {
            applied |= extend(children, rest, fields);
        }
    }
    applied
}

/// Whether `fields` make a limit: compiled on a probe of one a day (a
/// month when they name a billing day), the message of the first error if
/// not.
fn probe(fields: &Map<String, Json>) -> Result<(), String> {
    let mut limit = fields.clone();
    let billing = fields
        .get("calendar")
        .is_some_and(|calendar| calendar.get("starts_on").is_some());
    let unit = if billing { "month" } else { "day" };
    limit.insert("unit".into(), unit.into());
    limit.insert("requests_per_unit".into(), 1.into());
    let namespace = serde_json::json!({
        "domain": "probe",
        "descriptors": [{"key": "probe", "rate_limit": limit}],
    });
    let origin = PathBuf::from("extension");
    match crate::config::load_str(&namespace.to_string(), &origin) {
        Ok(_) => Ok(()),
        Err(errors) => Err(errors
            .0
            .into_iter()
            .next()
            .map(|error| error.message)
            .unwrap_or_else(|| "this rate_limit does not load".into())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parsed(text: &str) -> Result<Extensions, Vec<String>> {
        Extensions::parse(text, Path::new("ext.yaml"))
            .map_err(|errors| errors.into_iter().map(|error| error.to_string()).collect())
    }

    fn gateway_domain() -> Json {
        serde_json::json!({
            "domain": "default/eg/http",
            "descriptors": [{
                "key": "rule",
                "value": "per-user",
                "descriptors": [{
                    "key": "user",
                    "rate_limit": {"unit": "second", "requests_per_unit": 5}
                }]
            }, {
                "key": "rule",
                "value": "other",
                "rate_limit": {"unit": "minute", "requests_per_unit": 10}
            }]
        })
    }

    #[test]
    fn an_extension_adds_its_fields_to_the_limits_on_its_path() {
        let extensions = parsed(
            "extensions:\n  - domain: 'default/eg/*'\n    descriptors: [rule=per-user, user]\n    rate_limit: {algorithm: sliding_window}\n  - domain: other\n    descriptors: [rule]\n    rate_limit: {algorithm: gcra, burst: 3}\n",
        )
        .expect("valid");
        let mut domain = gateway_domain();
        let mut matched = vec![false; extensions.len()];
        extensions.apply(&mut domain, &mut matched);
        assert_eq!(
            domain["descriptors"][0]["descriptors"][0]["rate_limit"],
            serde_json::json!({"unit": "second", "requests_per_unit": 5, "algorithm": "sliding_window"})
        );
        assert_eq!(
            domain["descriptors"][1]["rate_limit"],
            serde_json::json!({"unit": "minute", "requests_per_unit": 10})
        );
        assert_eq!(matched, [true, false]);
        assert_eq!(extensions.unmatched(&matched), ["ext.yaml:5:5"]);
    }

    #[test]
    fn the_example_file_loads() {
        let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/envoy/xds-extensions.yaml");
        let extensions = Extensions::load(&path).expect("the example loads");
        assert_eq!(extensions.len(), 3);
    }

    #[test]
    fn a_wrong_extension_is_refused_at_its_place() {
        let errors = parsed("extensions:\n  - domain: d\n    descriptors: [k]\n    rate_limit: {algorithm: sliding}\n")
            .expect_err("an unknown algorithm");
        assert_eq!(errors.len(), 1);
        assert!(
            errors[0].starts_with("ext.yaml:4:17: unknown algorithm `sliding`"),
            "{errors:?}"
        );
        let errors = parsed("extensions:\n  - domain: d\n    descriptors: [k]\n    rate_limit: {requests_per_unit: 9}\n")
            .expect_err("a count is xDS's");
        assert!(
            errors[0].contains("`requests_per_unit` comes from xDS"),
            "{errors:?}"
        );
        let errors = parsed("extensions:\n  - domain: d\n    rate_limit: {algorithm: gcra}\n")
            .expect_err("no path");
        assert!(
            errors[0].starts_with("ext.yaml:2:5: name the limit's descriptors"),
            "{errors:?}"
        );
        let errors =
            parsed("extensions:\n  - domain: d\n    descriptor: [k]\n    rate_limit: {}\n")
                .expect_err("a misspelt field");
        assert!(
            errors[0].contains("unknown field `descriptor`"),
            "{errors:?}"
        );
        let errors = parsed("extensions:\n  - domain: d\n    descriptors: [k]\n    rate_limit: {calendar: {time_zone: Nowhere}}\n")
            .expect_err("an unknown zone");
        assert!(
            errors[0].contains("unknown time zone `Nowhere`"),
            "{errors:?}"
        );
    }
}
