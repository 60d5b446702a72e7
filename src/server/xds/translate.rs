//! A `RateLimitConfig` resource, envoyproxy/ratelimit's configuration as
//! xDS carries it, written out in Charon's file format (JSON, which the YAML
//! loader reads): so a pushed domain is validated and normalized by the
//! same code, with the same messages, as a file naming that domain.
//!
//! Only what the message holds is written; the loader decides what is
//! valid (a unit of `UNKNOWN`, a zero limit, an empty domain are its to
//! refuse, as they would be in a file).

use envoy_types::pb::google::protobuf::{Struct, Value, value::Kind};
use envoy_types::pb::ratelimit::config::ratelimit::v3::{
    RateLimitConfig, RateLimitDescriptor, RateLimitPolicy, RateLimitUnit,
};
use serde_json::{Map, Value as Json};

/// The file that says what `config` says.
pub fn file_text(config: &RateLimitConfig) -> String {
    // A tree of strings, numbers and booleans always serializes.
    serde_json::to_string_pretty(&file_json(config)).unwrap_or_default()
}

/// The file as a tree, for what is added to it before it is loaded.
pub fn file_json(config: &RateLimitConfig) -> Json {
    let mut file = Map::new();
    file.insert("domain".into(), config.domain.clone().into());
    if !config.descriptors.is_empty() {
        file.insert("descriptors".into(), descriptors(&config.descriptors));
    }
    Json::Object(file)
}

fn descriptors(list: &[RateLimitDescriptor]) -> Json {
    Json::Array(list.iter().map(descriptor).collect())
}

fn descriptor(descriptor: &RateLimitDescriptor) -> Json {
    let mut out = Map::new();
    out.insert("key".into(), descriptor.key.clone().into());
    if !descriptor.value.is_empty() {
        out.insert("value".into(), descriptor.value.clone().into());
    }
    if let Some(policy) = &descriptor.rate_limit {
        out.insert("rate_limit".into(), rate_limit(policy));
    }
    for (flag, on) in [
        ("shadow_mode", descriptor.shadow_mode),
        ("detailed_metric", descriptor.detailed_metric),
        ("quota_mode", descriptor.quota_mode),
    ] {
        if on {
            out.insert(flag.into(), true.into());
        }
    }
    if let Some(metadata) = &descriptor.metadata {
        out.insert("metadata".into(), structure(metadata));
    }
    if !descriptor.descriptors.is_empty() {
        out.insert("descriptors".into(), descriptors(&descriptor.descriptors));
    }
    Json::Object(out)
}

fn rate_limit(policy: &RateLimitPolicy) -> Json {
    let mut out = Map::new();
    if !policy.name.is_empty() {
        out.insert("name".into(), policy.name.clone().into());
    }
    if !policy.replaces.is_empty() {
        let replaces = policy
            .replaces
            .iter()
            .map(|replace| serde_json::json!({ "name": replace.name }))
            .collect();
        out.insert("replaces".into(), Json::Array(replaces));
    }
    if policy.unlimited {
        out.insert("unlimited".into(), true.into());
    }
    // An unlimited policy needs no unit; any other without one is the
    // loader's to refuse, by the unit's name.
    let unit = RateLimitUnit::try_from(policy.unit)
        .map(|unit| unit.as_str_name().to_ascii_lowercase())
        .unwrap_or_else(|_| format!("unit number {}", policy.unit));
    if !(policy.unlimited && policy.unit == RateLimitUnit::Unknown as i32) {
        out.insert("unit".into(), unit.into());
    }
    if !policy.unlimited || policy.requests_per_unit != 0 {
        out.insert(
            "requests_per_unit".into(),
            u64::from(policy.requests_per_unit).into(),
        );
    }
    Json::Object(out)
}

fn structure(value: &Struct) -> Json {
    Json::Object(
        value
            .fields
            .iter()
            .map(|(key, value)| (key.clone(), json(value)))
            .collect(),
    )
}

fn json(value: &Value) -> Json {
    match &value.kind {
        None | Some(Kind::NullValue(_)) => Json::Null,
        Some(Kind::BoolValue(on)) => Json::Bool(*on),
        Some(Kind::NumberValue(number)) => serde_json::Number::from_f64(*number)
            .map(Json::Number)
            .unwrap_or(Json::Null),
        Some(Kind::StringValue(text)) => Json::String(text.clone()),
        Some(Kind::ListValue(list)) => Json::Array(list.values.iter().map(json).collect()),
        Some(Kind::StructValue(inner)) => structure(inner),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use envoy_types::pb::ratelimit::config::ratelimit::v3::RateLimitReplace;

    fn policy(unit: RateLimitUnit, requests_per_unit: u32) -> Option<RateLimitPolicy> {
        Some(RateLimitPolicy {
            unit: unit as i32,
            requests_per_unit,
            ..Default::default()
        })
    }

    fn load(
        config: &RateLimitConfig,
    ) -> Result<crate::config::Loaded, crate::config::ConfigErrors> {
        crate::config::load_str(&file_text(config), "xds:test")
    }

    #[test]
    fn every_field_of_the_message_reaches_the_loader() {
        let config = RateLimitConfig {
            name: "gateway".into(),
            domain: "gateway".into(),
            descriptors: vec![RateLimitDescriptor {
                key: "tenant".into(),
                descriptors: vec![
                    RateLimitDescriptor {
                        key: "path".into(),
                        value: "/chat".into(),
                        rate_limit: Some(RateLimitPolicy {
                            name: "chat".into(),
                            replaces: vec![RateLimitReplace {
                                name: "tenant-wide".into(),
                            }],
                            ..policy(RateLimitUnit::Minute, 10).unwrap_or_default()
                        }),
                        shadow_mode: true,
                        detailed_metric: true,
                        quota_mode: true,
                        metadata: Some(Struct {
                            fields: [(
                                "tier".to_owned(),
                                Value {
                                    kind: Some(Kind::StringValue("gold".into())),
                                },
                            )]
                            .into(),
                        }),
                        descriptors: vec![],
                    },
                    RateLimitDescriptor {
                        key: "free".into(),
                        rate_limit: Some(RateLimitPolicy {
                            unlimited: true,
                            ..Default::default()
                        }),
                        ..Default::default()
                    },
                ],
                rate_limit: Some(RateLimitPolicy {
                    name: "tenant-wide".into(),
                    ..policy(RateLimitUnit::Hour, 1000).unwrap_or_default()
                }),
                ..Default::default()
            }],
        };
        let text = file_text(&config);
        let loaded = load(&config).unwrap_or_else(|errors| panic!("{errors}\n{text}"));
        let normalized = &loaded.normalized[0].1;
        for expected in [
            "domain: gateway",
            "unit: minute",
            "requests_per_unit: 10",
            "shadow_mode: true",
            "detailed_metric: true",
            "quota_mode: true",
            "tier: gold",
            "unlimited: true",
            "- name: tenant-wide",
        ] {
            assert!(
                normalized.contains(expected),
                "`{expected}` in\n{normalized}"
            );
        }
    }

    #[test]
    fn what_a_file_could_not_say_is_refused_as_in_a_file() {
        for (config, named) in [
            (
                RateLimitConfig {
                    domain: "d".into(),
                    descriptors: vec![RateLimitDescriptor {
                        key: "k".into(),
                        rate_limit: policy(RateLimitUnit::Unknown, 5),
                        ..Default::default()
                    }],
                    ..Default::default()
                },
                "invalid rate limit unit `unknown`",
            ),
            (
                RateLimitConfig {
                    domain: "d".into(),
                    descriptors: vec![RateLimitDescriptor {
                        key: "k".into(),
                        rate_limit: Some(RateLimitPolicy {
                            unit: 42,
                            requests_per_unit: 5,
                            ..Default::default()
                        }),
                        ..Default::default()
                    }],
                    ..Default::default()
                },
                "unit number 42",
            ),
            (
                RateLimitConfig {
                    domain: "d\u{0}".into(),
                    ..Default::default()
                },
                "control character",
            ),
        ] {
            let errors = load(&config).expect_err("refused").to_string();
            assert!(errors.contains(named), "`{named}` in {errors}");
        }
    }
}
