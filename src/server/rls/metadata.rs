//! `dynamic_metadata` (envoyproxy/ratelimit's `RESPONSE_DYNAMIC_METADATA`):
//! the request echoed back, and the `metadata:` of every descriptor that
//! matched a limit and is not over it, merged, so that Envoy's later filters
//! and access logs can read what applied. The shape is upstream's:
//! `{domain, descriptors: [{entries: ["k=v"], hitsAddend?, limit?}],
//! hitsAddend?, metadata?}`. With `--response-deciding-limit`, Charon adds
//! `decidingLimit`: the limit the answer's headers describe (the one over,
//! else the one with the fewest hits left), by name, statistics key,
//! requests per unit and unit, so that Envoy's access log can say which
//! limit fired (docs/operations.md#which-limit-fired).

use std::collections::HashMap;

use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitRequest;
use envoy_types::pb::google::protobuf::{ListValue, Struct, Value, value::Kind};

use crate::config::{MetaValue, Metadata};
use crate::limiter::RateLimitAnswer;

/// What the response echoes of the request, taken before it is consumed.
pub(super) struct Echo {
    domain: String,
    descriptors: Vec<Value>,
    hits_addend: u32,
}

impl Echo {
    pub(super) fn of(request: &RateLimitRequest) -> Self {
        let descriptors = request
            .descriptors
            .iter()
            .map(|descriptor| {
                let mut fields = HashMap::new();
                let entries = descriptor
                    .entries
                    .iter()
                    .map(|entry| string(format!("{}={}", entry.key, entry.value)))
                    .collect();
                fields.insert("entries".to_owned(), list(entries));
                if let Some(limit) = &descriptor.limit {
                    fields.insert(
                        "limit".to_owned(),
                        string(format!(
                            "requests_per_unit:{} unit:{}",
                            limit.requests_per_unit,
                            limit.unit().as_str_name()
                        )),
                    );
                }
                if let Some(hits) = &descriptor.hits_addend {
                    fields.insert("hitsAddend".to_owned(), number(hits.value as f64));
                }
                structure(fields)
            })
            .collect();
        Self {
            domain: request.domain.clone(),
            descriptors,
            hits_addend: request.hits_addend,
        }
    }

    pub(super) fn into_struct(self, answer: &RateLimitAnswer) -> Struct {
        let mut fields = HashMap::new();
        fields.insert("domain".to_owned(), string(self.domain));
        fields.insert("descriptors".to_owned(), list(self.descriptors));
        if self.hits_addend != 0 {
            fields.insert("hitsAddend".to_owned(), number(f64::from(self.hits_addend)));
        }
        let mut merged = Struct::default();
        for status in &answer.statuses {
            if status.over_limit || status.limit.is_none() {
                continue;
            }
            if let Some(metadata) = &status.metadata {
                merge(&mut merged, to_struct(metadata));
            }
        }
        if !merged.fields.is_empty() {
            fields.insert(
                "metadata".to_owned(),
                Value {
                    kind: Some(Kind::StructValue(merged)),
                },
            );
        }
        Struct { fields }
    }
}

/// `decidingLimit`: the limit that decided `answer`, if any was matched.
pub(super) fn deciding_limit(answer: &RateLimitAnswer) -> Option<Value> {
    let status = super::headers::deciding(answer)?;
    let limit = status.limit.as_ref()?;
    let mut fields = HashMap::new();
    if let Some(name) = &limit.name {
        fields.insert("name".to_owned(), string(name.clone()));
    }
    if let Some(key) = &status.stats_key {
        fields.insert("key".to_owned(), string(key.to_string()));
    }
    fields.insert(
        "requestsPerUnit".to_owned(),
        number(limit.requests_per_unit as f64),
    );
    fields.insert("unit".to_owned(), string(limit.unit.as_upper().to_owned()));
    fields.insert(
        "overLimit".to_owned(),
        Value {
            kind: Some(Kind::BoolValue(status.over_limit)),
        },
    );
    fields.insert("remaining".to_owned(), number(status.remaining as f64));
    Some(structure(fields))
}

/// Adds `later`'s keys that `into` lacks; two maps under one key merge the
/// same way; otherwise the first value stays (upstream's rule).
fn merge(into: &mut Struct, later: Struct) {
    for (key, value) in later.fields {
        match into.fields.get_mut(&key) {
            None => {
                into.fields.insert(key, value);
            }
            Some(Value {
                kind: Some(Kind::StructValue(ours)),
            }) => {
                if let Some(Kind::StructValue(theirs)) = value.kind {
                    merge(ours, theirs);
                }
            }
            Some(_) => {}
        }
    }
}

fn to_struct(metadata: &Metadata) -> Struct {
    Struct {
        fields: metadata
            .iter()
            .map(|(key, value)| (key.clone(), to_value(value)))
            .collect(),
    }
}

fn to_value(value: &MetaValue) -> Value {
    let kind = match value {
        MetaValue::Null => Kind::NullValue(0),
        MetaValue::Bool(b) => Kind::BoolValue(*b),
        MetaValue::Number(n) => Kind::NumberValue(*n),
        MetaValue::String(s) => Kind::StringValue(s.clone()),
        MetaValue::List(items) => Kind::ListValue(ListValue {
            values: items.iter().map(to_value).collect(),
        }),
        MetaValue::Map(map) => Kind::StructValue(to_struct(map)),
    };
    Value { kind: Some(kind) }
}

fn string(text: String) -> Value {
    Value {
        kind: Some(Kind::StringValue(text)),
    }
}

fn number(n: f64) -> Value {
    Value {
        kind: Some(Kind::NumberValue(n)),
    }
}

fn list(values: Vec<Value>) -> Value {
    Value {
        kind: Some(Kind::ListValue(ListValue { values })),
    }
}

fn structure(fields: HashMap<String, Value>) -> Value {
    Value {
        kind: Some(Kind::StructValue(Struct { fields })),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn map(pairs: &[(&str, MetaValue)]) -> Struct {
        to_struct(
            &pairs
                .iter()
                .map(|(k, v)| ((*k).to_owned(), v.clone()))
                .collect(),
        )
    }

    #[test]
    fn the_first_value_stays_and_maps_merge() {
        let mut merged = map(&[
            ("name", MetaValue::String("first".into())),
            (
                "nested",
                MetaValue::Map([("a".to_owned(), MetaValue::Number(1.0))].into()),
            ),
        ]);
        merge(
            &mut merged,
            map(&[
                ("name", MetaValue::String("second".into())),
                ("other", MetaValue::Bool(true)),
                (
                    "nested",
                    MetaValue::Map(
                        [
                            ("a".to_owned(), MetaValue::Number(2.0)),
                            ("b".to_owned(), MetaValue::Null),
                        ]
                        .into(),
                    ),
                ),
            ]),
        );
        assert_eq!(
            merged.fields["name"].kind,
            Some(Kind::StringValue("first".into()))
        );
        assert_eq!(merged.fields["other"].kind, Some(Kind::BoolValue(true)));
        let Some(Kind::StructValue(nested)) = &merged.fields["nested"].kind else {
            panic!("nested is a map");
        };
        assert_eq!(nested.fields["a"].kind, Some(Kind::NumberValue(1.0)));
        assert_eq!(nested.fields["b"].kind, Some(Kind::NullValue(0)));
    }
}
