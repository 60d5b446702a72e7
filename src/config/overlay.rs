//! What the configuration API adds to the files (docs/configuration-api.md):
//! whole namespaces it owns, and per-domain overrides of a resource's limits
//! on any namespace, file-defined ones included.
//!
//! An overlay is applied to the raw YAML tree of each namespace before it is
//! compiled, as if its overrides had been written in the namespace's
//! `domains:` entries: so an API change is validated and normalized by the
//! same code, with the same messages, as a file. Loading files with an
//! overlay never fails because of the overlay: an override whose resource a
//! file has since removed or changed kind is skipped, with a note, so a file
//! reload always keeps what the API still can apply.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use serde_saphyr::Spanned;

use super::raw::{RawDomainRate, RawFile};
use super::{ConfigError, Note};

/// Namespaces and per-domain overrides set through the API. Bodies are kept
/// as the text that was sent (YAML or JSON, which is YAML too).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Overlay {
    /// Namespace name → the namespace in the file format.
    #[serde(default)]
    pub namespaces: BTreeMap<String, String>,
    /// Namespace → resource → domain → the domain's entry.
    #[serde(default)]
    pub overrides: BTreeMap<String, BTreeMap<String, BTreeMap<String, String>>>,
}

/// A copy resource's per-domain override: its limit, and (when given) the
/// groups it belongs to, replacing the memberships the files give it.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct CopyOverride {
    domain_limit: Spanned<i64>,
    #[serde(default)]
    groups: Option<Vec<String>>,
}

/// Where an API namespace's errors and notes point.
pub fn namespace_origin(namespace: &str) -> PathBuf {
    PathBuf::from(format!("api:/v1/namespaces/{namespace}"))
}

/// Where an override's errors and notes point.
pub fn override_origin(namespace: &str, resource: &str, domain: &str) -> PathBuf {
    PathBuf::from(format!(
        "api:/v1/namespaces/{namespace}/resources/{resource}/domains/{domain}"
    ))
}

impl Overlay {
    /// The override of (`namespace`, `resource`, `domain`), if any.
    pub fn override_of(&self, namespace: &str, resource: &str, domain: &str) -> Option<&String> {
        self.overrides.get(namespace)?.get(resource)?.get(domain)
    }

    /// Sets (or, with `None`, removes) one override, dropping empty maps.
    pub fn set_override(
        &mut self,
        namespace: &str,
        resource: &str,
        domain: &str,
        body: Option<String>,
    ) {
        let resources = self.overrides.entry(namespace.to_owned()).or_default();
        let domains = resources.entry(resource.to_owned()).or_default();
        match body {
            Some(body) => {
                domains.insert(domain.to_owned(), body);
            }
            None => {
                domains.remove(domain);
            }
        }
        if domains.is_empty() {
            resources.remove(resource);
        }
        if resources.is_empty() {
            self.overrides.remove(namespace);
        }
    }

    /// Writes this namespace's overrides into its raw tree. Each override
    /// that cannot apply is skipped with a note, or, when `strict` names it,
    /// is an error.
    pub(super) fn apply(
        &self,
        raw: &mut RawFile,
        strict: Option<(&str, &str)>,
        notes: &mut Vec<Note>,
        errors: &mut Vec<ConfigError>,
    ) {
        let namespace = raw.domain.value.clone();
        let Some(resources) = self.overrides.get(&namespace) else {
            return;
        };
        for (resource, domains) in resources {
            for (domain, body) in domains {
                let origin = override_origin(&namespace, resource, domain);
                let is_strict = strict == Some((resource.as_str(), domain.as_str()));
                if let Err(error) = apply_one(raw, resource, domain, body, &origin) {
                    if is_strict {
                        errors.push(error);
                    } else {
                        notes.push(Note {
                            file: origin,
                            line: 0,
                            column: 0,
                            message: format!("override skipped: {}", error.message),
                        });
                    }
                }
            }
        }
    }
}

fn apply_one(
    raw: &mut RawFile,
    resource: &str,
    domain: &str,
    body: &str,
    origin: &Path,
) -> Result<(), ConfigError> {
    let whole = |message: String| ConfigError::whole_file(origin, message);
    let Some(target) = raw.resources.get_mut(resource) else {
        return Err(whole(format!(
            "namespace `{}` has no resource `{resource}`",
            raw.domain.value
        )));
    };
    if domain.is_empty() {
        return Err(whole("the domain is empty".to_owned()));
    }
    if let Some(rate) = target.value.rate.as_mut() {
        let entry: Spanned<RawDomainRate> = parse(body, origin)?;
        rate.domains.insert(domain.to_owned(), entry);
        return Ok(());
    }
    if let Some(copies) = target.value.copies.as_mut() {
        let entry: CopyOverride = parse(body, origin)?;
        copies.domains.insert(domain.to_owned(), entry.domain_limit);
        if let Some(groups) = entry.groups {
            if let Some(unknown) = groups
                .iter()
                .find(|name| !copies.groups.iter().any(|g| &g.value.name.value == *name))
            {
                return Err(whole(format!(
                    "resource `{resource}` has no group `{unknown}`"
                )));
            }
            for group in &mut copies.groups {
                group.value.domains.retain(|member| member != domain);
                if groups.contains(&group.value.name.value) {
                    group.value.domains.push(domain.to_owned());
                }
            }
        }
        return Ok(());
    }
    Err(whole(format!(
        "resource `{resource}` has neither `rate` nor `copies`"
    )))
}

/// Parses an API body (YAML or JSON) with the file loader's caps.
pub(super) fn parse<T: serde::de::DeserializeOwned>(
    body: &str,
    origin: &Path,
) -> Result<T, ConfigError> {
    if body.len() as u64 > super::caps::MAX_FILE_BYTES {
        return Err(ConfigError::whole_file(
            origin,
            format!(
                "the body is {} bytes; the limit is {} bytes",
                body.len(),
                super::caps::MAX_FILE_BYTES
            ),
        ));
    }
    serde_saphyr::from_str_with_options(body, super::yaml::parser_options())
        .map_err(|error| super::yaml::parse_error(origin, &error))
}

/// A change being checked by [`check_write`](super::load::check_write).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Write<'a> {
    Namespace(&'a str),
    Override {
        namespace: &'a str,
        resource: &'a str,
        domain: &'a str,
    },
}
