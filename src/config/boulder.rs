//! Boulder's (Let's Encrypt's) rate limit files as a namespace
//! (docs/configuration.md#boulders-limit-files): a small file in the
//! configuration directory marks the namespace and names the two files,
//! which stay as Boulder reads them.
//!
//! One piece: Boulder's format, its durations and its id formats are read
//! and translated into one namespace together, each error naming its file
//! and line; apart, each part would only make sense against the other.
//!
//! ```yaml
//! domain: acme-ca
//! format: boulder
//! defaults: boulder/defaults.yaml     # relative to this file
//! overrides: boulder/overrides.yaml   # optional
//! ```
//!
//! Each default `Name: {burst, count, period}` becomes a descriptor `key:
//! Name` with a GCRA limit (`count` per `period`, bursts of `burst`); each
//! override becomes `key: Name, value: id` beside it, with the id validated
//! for its limit's format and written canonically (IP addresses as Rust
//! prints them, IPv6 ranges as their /48 network, registration ids without
//! leading zeros, domains in lowercase, an fqdnSet's names sorted and
//! deduplicated). A caller asks with the same canonical ids. The namespace
//! is then written out in the file format and loaded like a file, so
//! everything else about it is checked by the same code.
//!
//! Overrides are read in both of Boulder's formats: the flat map
//! (`Name:id: {burst, count, period}`) and the list
//! (`- Name: {burst, count, period, ids: [{id, comment}]}`).

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use serde_saphyr::Spanned;

use super::error::ConfigError;
use super::yaml::{parse_error, parser_options};

/// Boulder's limit names, and the format of each one's override ids.
const NAMES: [(&str, IdFormat); 8] = [
    ("NewRegistrationsPerIPAddress", IdFormat::IpAddress),
    ("NewRegistrationsPerIPv6Range", IdFormat::Ipv6Range),
    ("NewOrdersPerAccount", IdFormat::RegId),
    (
        "FailedAuthorizationsPerDomainPerAccount",
        IdFormat::RegIdOrDomain,
    ),
    ("CertificatesPerDomain", IdFormat::Domain),
    ("CertificatesPerDomainPerAccount", IdFormat::RegIdOrDomain),
    ("CertificatesPerFQDNSet", IdFormat::FqdnSet),
    (
        "FailedAuthorizationsForPausingPerDomainPerAccount",
        IdFormat::RegIdOrDomain,
    ),
];

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum IdFormat {
    /// An IPv4 or IPv6 address.
    IpAddress,
    /// An IPv6 range with a /48 mask.
    Ipv6Range,
    /// An ACME registration id.
    RegId,
    /// `regId`, or `regId:domain`.
    RegIdOrDomain,
    /// A domain, or an IP address (its /32 or /64).
    Domain,
    /// Comma-separated domains (or IP addresses).
    FqdnSet,
}

/// The marker file.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Marker {
    domain: String,
    format: String,
    defaults: String,
    #[serde(default)]
    overrides: Option<String>,
}

/// Whether `text` is a marker file (`format: boulder`).
pub(super) fn is_marker(text: &str) -> bool {
    #[derive(Deserialize)]
    struct Format {
        #[serde(default)]
        format: Option<String>,
    }
    text.contains("format")
        && serde_saphyr::from_str_with_options::<Format>(text, parser_options())
            .is_ok_and(|found| found.format.as_deref() == Some("boulder"))
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
struct Limit {
    burst: i64,
    count: i64,
    period: String,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
struct ListedLimit {
    burst: i64,
    count: i64,
    period: String,
    ids: Vec<ListedId>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
struct ListedId {
    id: String,
    #[serde(default)]
    #[allow(dead_code)]
    comment: Option<String>,
}

/// (Not an untagged enum: buffering for one would lose the locations.)
enum Overrides {
    Flat(BTreeMap<String, Spanned<Limit>>),
    Listed(Vec<BTreeMap<String, Spanned<ListedLimit>>>),
}

/// The namespace as the file format writes it.
#[derive(Debug, Serialize)]
struct File {
    domain: String,
    descriptors: Vec<Descriptor>,
}

#[derive(Debug, Serialize)]
struct Descriptor {
    key: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    value: Option<String>,
    rate_limit: RateLimit,
}

#[derive(Debug, Serialize)]
struct RateLimit {
    algorithm: &'static str,
    unit: &'static str,
    unit_multiplier: u64,
    requests_per_unit: u64,
    burst: u64,
}

/// Collects errors with the file they are in.
struct Errors<'f> {
    file: &'f Path,
    list: Vec<ConfigError>,
}

impl Errors<'_> {
    fn at<T>(&mut self, spanned: &Spanned<T>, message: String) {
        self.list.push(ConfigError {
            file: self.file.to_owned(),
            line: spanned.referenced.line(),
            column: spanned.referenced.column(),
            message,
        });
    }
}

/// The namespace a marker file at `path` describes, in the file format.
pub(super) fn translate(
    text: &str,
    path: &Path,
    read: impl Fn(&Path) -> Result<String, ConfigError>,
) -> Result<String, Vec<ConfigError>> {
    let marker: Marker = serde_saphyr::from_str_with_options(text, parser_options())
        .map_err(|error| vec![parse_error(path, &error)])?;
    if marker.format != "boulder" {
        return Err(vec![ConfigError::whole_file(
            path,
            format!("unknown format `{}`; the one is `boulder`", marker.format),
        )]);
    }
    let dir = path.parent().unwrap_or(Path::new("."));
    let defaults_path = dir.join(&marker.defaults);
    let defaults_text = read(&defaults_path).map_err(|error| vec![error])?;
    let defaults: BTreeMap<String, Spanned<Limit>> =
        serde_saphyr::from_str_with_options(&defaults_text, parser_options())
            .map_err(|error| vec![parse_error(&defaults_path, &error)])?;
    let mut descriptors = Vec::new();
    let mut errors = Errors {
        file: &defaults_path,
        list: Vec::new(),
    };
    for (name, limit) in &defaults {
        if format_of(name).is_none() {
            errors.at(limit, unknown_name(name));
            continue;
        }
        if let Some(rate_limit) = rate_limit(&mut errors, name, limit) {
            descriptors.push(Descriptor {
                key: name.clone(),
                value: None,
                rate_limit,
            });
        }
    }
    let mut all_errors = errors.list;
    if let Some(overrides) = &marker.overrides {
        let overrides_path: PathBuf = dir.join(overrides);
        let overrides_text = read(&overrides_path).map_err(|error| vec![error])?;
        // The list format starts with a `-`; the flat one with a key.
        let listed = overrides_text
            .lines()
            .map(str::trim_start)
            .find(|line| !line.is_empty() && !line.starts_with('#') && !line.starts_with("---"))
            .is_some_and(|line| line.starts_with('-'));
        let parse_failed = |error: serde_saphyr::Error| vec![parse_error(&overrides_path, &error)];
        let parsed = if listed {
            Overrides::Listed(
                serde_saphyr::from_str_with_options(&overrides_text, parser_options())
                    .map_err(parse_failed)?,
            )
        } else {
            Overrides::Flat(
                serde_saphyr::from_str_with_options(&overrides_text, parser_options())
                    .map_err(parse_failed)?,
            )
        };
        let mut errors = Errors {
            file: &overrides_path,
            list: Vec::new(),
        };
        let mut seen = BTreeMap::new();
        let mut add =
            |errors: &mut Errors<'_>, name: &str, id: &str, limit: &Spanned<Limit>, key: &str| {
                let Some(format) = format_of(name) else {
                    errors.at(limit, unknown_name(name));
                    return;
                };
                let canonical = match canonical_id(format, id) {
                    Ok(canonical) => canonical,
                    Err(why) => {
                        errors.at(limit, format!("override `{key}`: {why}"));
                        return;
                    }
                };
                if let Some(first) =
                    seen.insert((name.to_owned(), canonical.clone()), key.to_owned())
                {
                    errors.at(
                    limit,
                    format!(
                        "override `{key}` names the same bucket as `{first}` ({name}:{canonical})"
                    ),
                );
                    return;
                }
                if let Some(rate_limit) = rate_limit(errors, key, limit) {
                    descriptors.push(Descriptor {
                        key: name.to_owned(),
                        value: Some(canonical),
                        rate_limit,
                    });
                }
            };
        match &parsed {
            Overrides::Flat(map) => {
                for (key, limit) in map {
                    match key.split_once(':') {
                        Some((name, id)) if !name.is_empty() && !id.is_empty() => {
                            add(&mut errors, name, id, limit, key);
                        }
                        _ => {
                            errors.at(limit, format!("override `{key}` must be written `Name:id`"))
                        }
                    }
                }
            }
            Overrides::Listed(list) => {
                for entry in list {
                    for (name, listed) in entry {
                        let limit = Spanned {
                            value: Limit {
                                burst: listed.value.burst,
                                count: listed.value.count,
                                period: listed.value.period.clone(),
                            },
                            referenced: listed.referenced,
                            defined: listed.defined,
                        };
                        if listed.value.ids.is_empty() {
                            errors.at(listed, format!("override `{name}` has no `ids`"));
                        }
                        for id in &listed.value.ids {
                            let key = format!("{name}:{}", id.id);
                            add(&mut errors, name, &id.id, &limit, &key);
                        }
                    }
                }
            }
        }
        all_errors.extend(errors.list);
    }
    if !all_errors.is_empty() {
        return Err(all_errors);
    }
    let file = File {
        domain: marker.domain,
        descriptors,
    };
    serde_saphyr::to_string(&file).map_err(|error| {
        vec![ConfigError::whole_file(
            path,
            format!("cannot write the namespace out: {error}"),
        )]
    })
}

/// The id a caller sends for limit `name` (a Boulder limit name): written
/// as the overrides are keyed, so that `2001:0DB8::1` finds the override
/// written `2001:db8::1`.
pub fn canonical_id_for(name: &str, id: &str) -> Result<String, String> {
    let format = format_of(name).ok_or_else(|| unknown_name(name))?;
    canonical_id(format, id)
}

fn format_of(name: &str) -> Option<IdFormat> {
    NAMES
        .iter()
        .find(|(known, _)| *known == name)
        .map(|(_, format)| *format)
}

fn unknown_name(name: &str) -> String {
    let names: Vec<&str> = NAMES.iter().map(|(name, _)| *name).collect();
    format!(
        "unknown limit name `{name}`; Boulder's are {}",
        names.join(", ")
    )
}

/// `limit` as a GCRA limit: `count` per `period`, bursts of `burst`.
fn rate_limit(errors: &mut Errors<'_>, key: &str, limit: &Spanned<Limit>) -> Option<RateLimit> {
    let Limit {
        burst,
        count,
        period,
    } = &limit.value;
    let positive = |value: i64, field: &str, errors: &mut Errors<'_>| match u64::try_from(value) {
        Ok(value) if value > 0 => Some(value),
        _ => {
            errors.at(
                limit,
                format!("`{key}`: {field} must be more than 0, not {value}"),
            );
            None
        }
    };
    let burst = positive(*burst, "burst", errors);
    let count = positive(*count, "count", errors);
    let period_ms = match go_duration_ms(period) {
        Ok(0) => {
            errors.at(limit, format!("`{key}`: period must be more than 0"));
            None
        }
        Ok(ms) if ms % 1_000 != 0 => {
            errors.at(
                limit,
                format!("`{key}`: period {period} is not a whole number of seconds, which Charon's units need"),
            );
            None
        }
        Ok(ms) => Some(ms / 1_000),
        Err(why) => {
            errors.at(limit, format!("`{key}`: period {period:?}: {why}"));
            None
        }
    };
    let (burst, count, seconds) = (burst?, count?, period_ms?);
    let (unit, unit_multiplier) = [("day", 86_400), ("hour", 3_600), ("minute", 60)]
        .into_iter()
        .find(|(_, size)| seconds % size == 0)
        .map_or(("second", seconds), |(unit, size)| (unit, seconds / size));
    Some(RateLimit {
        algorithm: "gcra",
        unit,
        unit_multiplier,
        requests_per_unit: count,
        burst,
    })
}

/// A Go duration (`1s`, `180m`, `1h30m`, `1.5h`) in milliseconds.
fn go_duration_ms(text: &str) -> Result<u64, String> {
    let mut rest = text.trim();
    if rest.is_empty() {
        return Err("empty".into());
    }
    if rest == "0" {
        return Ok(0);
    }
    let mut total = 0f64;
    while !rest.is_empty() {
        let number_end = rest
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .ok_or("a number without a unit (ns, us, ms, s, m, h)")?;
        let number: f64 = rest[..number_end]
            .parse()
            .map_err(|_| format!("`{}` is not a number", &rest[..number_end]))?;
        rest = &rest[number_end..];
        let unit_end = rest
            .find(|c: char| c.is_ascii_digit() || c == '.')
            .unwrap_or(rest.len());
        let scale = match &rest[..unit_end] {
            "ns" => 1e-6,
            "us" | "µs" => 1e-3,
            "ms" => 1.0,
            "s" => 1e3,
            "m" => 6e4,
            "h" => 3.6e6,
            unit => return Err(format!("unknown unit `{unit}` (ns, us, ms, s, m, h)")),
        };
        total += number * scale;
        rest = &rest[unit_end..];
    }
    if total.fract() != 0.0 || !(0.0..1e15).contains(&total) {
        return Err("not a whole number of milliseconds, or too long".into());
    }
    Ok(total as u64)
}

/// `id` validated for `format` and written canonically.
fn canonical_id(format: IdFormat, id: &str) -> Result<String, String> {
    match format {
        IdFormat::IpAddress => id
            .parse::<IpAddr>()
            .map(|ip| ip.to_string())
            .map_err(|_| format!("{id:?} is not an IP address")),
        IdFormat::Ipv6Range => ipv6_range(id),
        IdFormat::RegId => reg_id(id),
        IdFormat::RegIdOrDomain => match id.split_once(':') {
            None => reg_id(id),
            Some((reg, domain)) => Ok(format!("{}:{}", reg_id(reg)?, domain_name(domain)?)),
        },
        IdFormat::Domain => match id.parse::<IpAddr>() {
            Ok(ip) => Ok(covering_prefix(ip)),
            Err(_) => domain_name(id),
        },
        IdFormat::FqdnSet => {
            let mut names = id
                .split(',')
                .map(|name| match name.trim().parse::<IpAddr>() {
                    Ok(ip) => Ok(ip.to_string()),
                    Err(_) => domain_name(name.trim()),
                })
                .collect::<Result<Vec<_>, _>>()?;
            names.sort();
            names.dedup();
            Ok(names.join(","))
        }
    }
}

fn reg_id(id: &str) -> Result<String, String> {
    id.parse::<u64>()
        .map(|reg| reg.to_string())
        .map_err(|_| format!("{id:?} is not an ACME registration id (a whole number)"))
}

/// An IPv6 range with a /48 mask, as its network.
fn ipv6_range(id: &str) -> Result<String, String> {
    let (address, bits) = id
        .split_once('/')
        .ok_or_else(|| format!("{id:?} is not an IPv6 range (address/48)"))?;
    let address: std::net::Ipv6Addr = address
        .parse()
        .map_err(|_| format!("{id:?} is not an IPv6 range"))?;
    if bits != "48" {
        return Err(format!("{id:?} must be a /48"));
    }
    let network = u128::from(address) & !(u128::MAX >> 48);
    Ok(format!("{}/48", std::net::Ipv6Addr::from(network)))
}

/// An IP address as the prefix Boulder counts it under: /32 or /64.
fn covering_prefix(ip: IpAddr) -> String {
    match ip {
        IpAddr::V4(v4) => format!("{v4}/32"),
        IpAddr::V6(v6) => {
            let network = u128::from(v6) & !(u128::MAX >> 64);
            format!("{}/64", std::net::Ipv6Addr::from(network))
        }
    }
}

/// A DNS name in lowercase: labels of letters, digits and inner hyphens,
/// at least two of them, 253 bytes in all.
fn domain_name(name: &str) -> Result<String, String> {
    let lower = name.to_ascii_lowercase();
    let labels: Vec<&str> = lower.split('.').collect();
    let valid = !lower.is_empty()
        && lower.len() <= 253
        && labels.len() >= 2
        && labels.iter().all(|label| {
            !label.is_empty()
                && label.len() <= 63
                && !label.starts_with('-')
                && !label.ends_with('-')
                && label
                    .bytes()
                    .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        });
    if valid {
        Ok(lower)
    } else {
        Err(format!("{name:?} is not a domain name"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_are_checked_and_written_canonically() {
        let ok = |format, id| canonical_id(format, id).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(
            ok(
                IdFormat::IpAddress,
                "2001:0db8:0000:0000:0000:ff00:0042:8329"
            ),
            "2001:db8::ff00:42:8329"
        );
        assert_eq!(
            ok(IdFormat::Ipv6Range, "2001:0db8:0000:1234::/48"),
            "2001:db8::/48"
        );
        assert_eq!(ok(IdFormat::RegId, "0012345678"), "12345678");
        assert_eq!(
            ok(IdFormat::RegIdOrDomain, "12345678:Example.COM"),
            "12345678:example.com"
        );
        assert_eq!(ok(IdFormat::Domain, "10.0.0.1"), "10.0.0.1/32");
        assert_eq!(ok(IdFormat::Domain, "2001:db8::1"), "2001:db8::/64");
        assert_eq!(
            ok(IdFormat::FqdnSet, "example.org,Example.com,example.org"),
            "example.com,example.org"
        );
        for (format, id) in [
            (IdFormat::IpAddress, "10.0.0"),
            (IdFormat::IpAddress, "fe80::1%eth0"),
            (IdFormat::Ipv6Range, "2001:db8::/56"),
            (IdFormat::Ipv6Range, "10.0.0.0/48"),
            (IdFormat::RegId, "-5"),
            (IdFormat::RegIdOrDomain, "12:not a domain"),
            (IdFormat::Domain, "localhost"),
            (IdFormat::FqdnSet, "example.com,"),
        ] {
            assert!(canonical_id(format, id).is_err(), "{id:?}");
        }
    }

    #[test]
    fn go_durations() {
        assert_eq!(go_duration_ms("1s"), Ok(1_000));
        assert_eq!(go_duration_ms("180m"), Ok(10_800_000));
        assert_eq!(go_duration_ms("1h30m"), Ok(5_400_000));
        assert_eq!(go_duration_ms("1.5h"), Ok(5_400_000));
        assert_eq!(go_duration_ms("250ms"), Ok(250));
        assert!(go_duration_ms("5").is_err());
        assert!(go_duration_ms("5d").is_err());
        assert!(go_duration_ms("").is_err());
    }
}
