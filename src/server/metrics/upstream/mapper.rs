//! `PROMETHEUS_MAPPER_YAML`: the statsd_exporter mapping file an
//! envoyproxy/ratelimit deployment mounts. Charon has no statsd names to
//! map; it exports the families upstream's default mapper
//! (`default_mapper.yaml`, a copy of upstream's) gives, and reads a file
//! only to learn what a deployment changed in it: the response time's
//! `scale` (upstream's has `0.001`, seconds; Envoy Gateway's copy has none,
//! milliseconds under the `_seconds` name), and every other difference,
//! which it says it does not follow (docs/envoy-compatibility.md#metrics).

use serde_json::Value;

/// upstream's default mapper, which Charon's upstream families follow.
const DEFAULT_MAPPER: &str = include_str!("default_mapper.yaml");

/// The mapping whose `scale` sets the response time's unit.
const RESPONSE_TIME: &str = "ratelimit_service_response_time_seconds";

/// The largest mapping file read (statsd_exporter's are a few KiB).
const MAX_MAPPER_BYTES: u64 = 1 << 20;

/// What a mapping file says Charon should do, and what it does not follow.
#[derive(Debug, Clone, PartialEq)]
pub struct Mapper {
    /// Milliseconds times this is the exported response time.
    pub response_time_scale: f64,
    /// One sentence per difference from upstream's default not followed.
    pub notes: Vec<String>,
}

impl Mapper {
    /// upstream's defaults without a file: seconds, or milliseconds with
    /// `PROMETHEUS_RESPONSE_TIME_AS_MILLISECONDS` (which a file overrides,
    /// as upstream reads one or the other).
    pub fn default_with(milliseconds: bool) -> Self {
        Self {
            response_time_scale: if milliseconds { 1.0 } else { 0.001 },
            notes: Vec::new(),
        }
    }

    /// The file at `path`; one that cannot be read or parsed leaves
    /// upstream's defaults, said in a note.
    pub fn read(path: &std::path::Path) -> Self {
        let text = std::fs::File::open(path).and_then(|file| {
            let mut text = String::new();
            std::io::Read::read_to_string(
                &mut std::io::Read::take(file, MAX_MAPPER_BYTES),
                &mut text,
            )?;
            Ok(text)
        });
        match text {
            Ok(text) => Self::parse(&text).unwrap_or_else(|error| Self {
                notes: vec![format!(
                    "{}: {error}; upstream's default mapper is followed",
                    path.display()
                )],
                ..Self::default_with(false)
            }),
            Err(error) => Self {
                notes: vec![format!(
                    "{}: cannot read it ({error}); upstream's default mapper is followed",
                    path.display()
                )],
                ..Self::default_with(false)
            },
        }
    }

    /// A mapping file's text.
    pub fn parse(text: &str) -> Result<Self, String> {
        let file = mappings(text)?;
        let known = mappings(DEFAULT_MAPPER)?;
        let mut notes = Vec::new();
        let mut scale = 1.0;
        for mapping in &file.mappings {
            let (pattern, name) = (field(mapping, "match"), field(mapping, "name"));
            let Some(upstream) = known
                .mappings
                .iter()
                .find(|k| field(k, "match") == pattern && field(k, "name") == name)
            else {
                notes.push(format!(
                    "mapping {pattern:?} → {name:?} is not upstream's: not followed"
                ));
                continue;
            };
            if name == RESPONSE_TIME {
                scale = mapping.get("scale").and_then(Value::as_f64).unwrap_or(1.0);
            }
            let differs: Vec<&str> = keys(mapping, upstream)
                .into_iter()
                .filter(|key| *key != "scale" && mapping.get(*key) != upstream.get(*key))
                .collect();
            if !differs.is_empty() {
                notes.push(format!(
                    "mapping {pattern:?} differs from upstream's in {}: upstream's is followed",
                    differs.join(", ")
                ));
            }
        }
        for upstream in &known.mappings {
            let (pattern, name) = (field(upstream, "match"), field(upstream, "name"));
            let present = file
                .mappings
                .iter()
                .any(|m| field(m, "match") == pattern && field(m, "name") == name);
            if !present {
                notes.push(format!(
                    "upstream's mapping {pattern:?} → {name:?} is not in the file: exported all the same"
                ));
            }
        }
        for key in file.other {
            notes.push(format!("{key:?} in the mapping file is not followed"));
        }
        Ok(Self {
            response_time_scale: scale,
            notes,
        })
    }
}

/// A file's mappings, and its other top-level keys.
struct Mappings {
    mappings: Vec<serde_json::Map<String, Value>>,
    other: Vec<String>,
}

fn mappings(text: &str) -> Result<Mappings, String> {
    let value: Value = serde_saphyr::from_str(text).map_err(|error| error.to_string())?;
    let Value::Object(top) = value else {
        return Err("not a map of mappings".into());
    };
    let mut out = Mappings {
        mappings: Vec::new(),
        other: Vec::new(),
    };
    for (key, value) in top {
        match (key.as_str(), value) {
            ("mappings", Value::Array(items)) => {
                for item in items {
                    match item {
                        Value::Object(mapping) => out.mappings.push(mapping),
                        _ => return Err("a mapping that is not a map".into()),
                    }
                }
            }
            ("mappings", Value::Null) => {}
            ("mappings", _) => return Err("`mappings` is not a list".into()),
            _ => out.other.push(key),
        }
    }
    Ok(out)
}

fn field<'m>(mapping: &'m serde_json::Map<String, Value>, key: &str) -> &'m str {
    mapping.get(key).and_then(Value::as_str).unwrap_or("")
}

fn keys<'m>(
    a: &'m serde_json::Map<String, Value>,
    b: &'m serde_json::Map<String, Value>,
) -> Vec<&'m str> {
    let mut keys: Vec<&str> = a.keys().chain(b.keys()).map(String::as_str).collect();
    keys.sort_unstable();
    keys.dedup();
    keys
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn upstreams_default_is_seconds_and_followed_whole() {
        let mapper = Mapper::parse(DEFAULT_MAPPER).expect("parses");
        assert_eq!(mapper.response_time_scale, 0.001);
        assert!(mapper.notes.is_empty(), "{:?}", mapper.notes);
    }

    #[test]
    fn envoy_gateways_copy_is_milliseconds_and_followed_whole() {
        let text = include_str!("../../../../tests/fixtures/envoy-gateway/statsd_conf.yaml");
        let mapper = Mapper::parse(text).expect("parses");
        assert_eq!(mapper.response_time_scale, 1.0);
        assert!(mapper.notes.is_empty(), "{:?}", mapper.notes);
    }

    #[test]
    fn another_mapper_says_what_is_not_followed() {
        let text = DEFAULT_MAPPER
            .replace("      key2: \"$3\"\n", "      key2: \"$3\"\n      key3: \"$4\"\n")
            .replace(
                "  - match: \"ratelimit.service.config_load_error\"",
                "  - match: \"ratelimit.service.*.domain_not_found\"\n    name: \"not_found\"\n  - match: \"ratelimit.service.config_load_error\"",
            )
            + "defaults:\n  ttl: 1m\n";
        let mapper = Mapper::parse(&text).expect("parses");
        let notes = mapper.notes.join("\n");
        assert!(
            notes.contains("differs from upstream's in labels"),
            "{notes}"
        );
        assert!(notes.contains("\"not_found\" is not upstream's"), "{notes}");
        assert!(notes.contains("\"defaults\""), "{notes}");
        assert!(Mapper::parse("mappings: 3").is_err());
    }

    #[test]
    fn without_a_file_the_unit_follows_the_variable() {
        assert_eq!(Mapper::default_with(false).response_time_scale, 0.001);
        assert_eq!(Mapper::default_with(true).response_time_scale, 1.0);
    }
}
