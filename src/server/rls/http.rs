//! envoyproxy/ratelimit's HTTP endpoints, on the admin port: `POST /json`
//! (a `RateLimitRequest` in proto3 JSON, decided exactly as over gRPC: 200
//! when OK, 429 when over, 400 on bad input, 503 when the store failed) for
//! callers without gRPC, and `GET /rlconfig`, the loaded limits one per line.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use axum::Router;
use axum::body::Bytes;
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use envoy_types::pb::envoy::config::core::v3::HeaderValue;
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::{
    RateLimitDescriptor, rate_limit_descriptor,
};
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::{
    Code, DescriptorStatus, rate_limit::Unit as WireUnit,
};
use envoy_types::pb::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};
use envoy_types::pb::google::protobuf::{Struct, Value, value::Kind};
use serde::Deserialize;
use serde_json::{Map, Value as Json, json};

use crate::config::{Config, Leaf, Level, Node};
use crate::store::Store;

use super::RlsService;

/// The largest `/json` body accepted.
const MAX_BODY_BYTES: usize = 1 << 20;

pub fn router<S: Store>(rls: RlsService<S>) -> Router {
    Router::new()
        .route("/json", post(decide::<S>))
        .route("/rlconfig", get(dump::<S>))
        .layer(axum::extract::DefaultBodyLimit::max(MAX_BODY_BYTES))
        .with_state(rls)
}

async fn decide<S: Store>(State(rls): State<RlsService<S>>, body: Bytes) -> Response {
    let request = match parse(&body) {
        Ok(request) => request,
        Err(message) => return bad_request(&message),
    };
    match rls.decide(request).await {
        Ok(response) => {
            let status = match Code::try_from(response.overall_code) {
                Ok(Code::Ok) => StatusCode::OK,
                Ok(Code::OverLimit) => StatusCode::TOO_MANY_REQUESTS,
                _ => StatusCode::INTERNAL_SERVER_ERROR,
            };
            (status, axum::Json(response_json(&response))).into_response()
        }
        Err(status) if status.code() == tonic::Code::InvalidArgument => {
            bad_request(status.message())
        }
        Err(status) => (
            StatusCode::SERVICE_UNAVAILABLE,
            format!("{}\n", status.message()),
        )
            .into_response(),
    }
}

fn bad_request(message: &str) -> Response {
    (StatusCode::BAD_REQUEST, format!("bad request: {message}\n")).into_response()
}

/// A `RateLimitRequest` in proto3 JSON: field names in lowerCamelCase or as
/// in the proto, 64-bit numbers as numbers or strings, enums by name.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct JsonRequest {
    #[serde(default)]
    domain: String,
    #[serde(default)]
    descriptors: Vec<JsonDescriptor>,
    #[serde(default, alias = "hits_addend", rename = "hitsAddend")]
    hits_addend: Option<JsonNumber>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct JsonDescriptor {
    #[serde(default)]
    entries: Vec<JsonEntry>,
    #[serde(default)]
    limit: Option<JsonLimit>,
    #[serde(default, alias = "hits_addend", rename = "hitsAddend")]
    hits_addend: Option<JsonNumber>,
    /// Envoy 1.38's refund (docs/design.md#refunds).
    #[serde(default, alias = "is_negative_hits", rename = "isNegativeHits")]
    is_negative_hits: bool,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct JsonEntry {
    #[serde(default)]
    key: String,
    #[serde(default)]
    value: String,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct JsonLimit {
    #[serde(default, alias = "requests_per_unit", rename = "requestsPerUnit")]
    requests_per_unit: Option<JsonNumber>,
    #[serde(default)]
    unit: Option<String>,
}

/// proto3 JSON writes 64-bit integers as strings; either is accepted.
#[derive(Deserialize)]
#[serde(untagged)]
enum JsonNumber {
    Number(u64),
    Text(String),
}

impl JsonNumber {
    fn value(&self, what: &str) -> Result<u64, String> {
        match self {
            JsonNumber::Number(n) => Ok(*n),
            JsonNumber::Text(text) => text
                .parse()
                .map_err(|_| format!("{what} is not a whole number: {text:?}")),
        }
    }
}

fn parse(body: &[u8]) -> Result<RateLimitRequest, String> {
    let request: JsonRequest =
        serde_json::from_slice(body).map_err(|error| format!("not a RateLimitRequest: {error}"))?;
    let descriptors = request
        .descriptors
        .into_iter()
        .enumerate()
        .map(|(index, descriptor)| {
            let limit = match descriptor.limit {
                None => None,
                Some(limit) => {
                    let requests_per_unit = match limit.requests_per_unit {
                        Some(n) => n.value("requestsPerUnit")?,
                        None => 0,
                    };
                    let unit = limit.unit.as_deref().unwrap_or("UNKNOWN");
                    let unit = WireUnit::from_str_name(&unit.to_ascii_uppercase())
                        .ok_or_else(|| format!("descriptor {index}: unknown unit {unit:?}"))?;
                    Some(rate_limit_descriptor::RateLimitOverride {
                        requests_per_unit: u32::try_from(requests_per_unit).map_err(|_| {
                            format!("descriptor {index}: requestsPerUnit is above 2^32 - 1")
                        })?,
                        unit: unit as i32,
                    })
                }
            };
            let hits_addend = descriptor
                .hits_addend
                .map(|n| n.value("hitsAddend"))
                .transpose()?
                .map(|value| envoy_types::pb::google::protobuf::UInt64Value { value });
            Ok(RateLimitDescriptor {
                entries: descriptor
                    .entries
                    .into_iter()
                    .map(|entry| rate_limit_descriptor::Entry {
                        key: entry.key,
                        value: entry.value,
                    })
                    .collect(),
                limit,
                hits_addend,
                is_negative_hits: descriptor.is_negative_hits,
            })
        })
        .collect::<Result<Vec<_>, String>>()?;
    let hits_addend = match request.hits_addend {
        Some(n) => u32::try_from(n.value("hitsAddend")?)
            .map_err(|_| "hitsAddend is above 2^32 - 1".to_owned())?,
        None => 0,
    };
    Ok(RateLimitRequest {
        domain: request.domain,
        descriptors,
        hits_addend,
    })
}

/// The response in proto3 JSON, as upstream writes it: lowerCamelCase,
/// enums by name, durations as `"58s"`, default values left out.
fn response_json(response: &RateLimitResponse) -> Json {
    let mut out = Map::new();
    let code = |code: i32| Code::try_from(code).unwrap_or(Code::Unknown).as_str_name();
    if response.overall_code != 0 {
        out.insert("overallCode".into(), json!(code(response.overall_code)));
    }
    if !response.statuses.is_empty() {
        let statuses = response
            .statuses
            .iter()
            .map(|status| status_json(status, code(status.code)))
            .collect();
        out.insert("statuses".into(), Json::Array(statuses));
    }
    if !response.response_headers_to_add.is_empty() {
        out.insert(
            "responseHeadersToAdd".into(),
            headers_json(&response.response_headers_to_add),
        );
    }
    if let Some(metadata) = &response.dynamic_metadata {
        out.insert("dynamicMetadata".into(), struct_json(metadata));
    }
    Json::Object(out)
}

fn status_json(status: &DescriptorStatus, code: &str) -> Json {
    let mut out = Map::new();
    if status.code != 0 {
        out.insert("code".into(), json!(code));
    }
    if let Some(limit) = &status.current_limit {
        let mut current = Map::new();
        if !limit.name.is_empty() {
            current.insert("name".into(), json!(limit.name));
        }
        if limit.requests_per_unit != 0 {
            current.insert("requestsPerUnit".into(), json!(limit.requests_per_unit));
        }
        let unit = WireUnit::try_from(limit.unit).unwrap_or(WireUnit::Unknown);
        if unit != WireUnit::Unknown {
            current.insert("unit".into(), json!(unit.as_str_name()));
        }
        out.insert("currentLimit".into(), Json::Object(current));
    }
    if status.limit_remaining != 0 {
        out.insert("limitRemaining".into(), json!(status.limit_remaining));
    }
    if let Some(reset) = &status.duration_until_reset {
        out.insert(
            "durationUntilReset".into(),
            json!(format!("{}s", reset.seconds)),
        );
    }
    Json::Object(out)
}

fn headers_json(headers: &[HeaderValue]) -> Json {
    Json::Array(
        headers
            .iter()
            .map(|h| json!({"key": h.key, "value": h.value}))
            .collect(),
    )
}

fn struct_json(value: &Struct) -> Json {
    let fields: BTreeMap<&String, Json> = value
        .fields
        .iter()
        .map(|(key, value)| (key, value_json(value)))
        .collect();
    json!(fields)
}

fn value_json(value: &Value) -> Json {
    match &value.kind {
        None | Some(Kind::NullValue(_)) => Json::Null,
        Some(Kind::BoolValue(b)) => json!(b),
        Some(Kind::NumberValue(n)) => json!(n),
        Some(Kind::StringValue(s)) => json!(s),
        Some(Kind::ListValue(list)) => Json::Array(list.values.iter().map(value_json).collect()),
        Some(Kind::StructValue(inner)) => struct_json(inner),
    }
}

async fn dump<S: Store>(State(rls): State<RlsService<S>>) -> Response {
    (
        [(header::CONTENT_TYPE, "text/plain; charset=utf-8")],
        rlconfig(&rls.limiter().config()),
    )
        .into_response()
}

/// One line per limit, as envoyproxy/ratelimit's `/rlconfig` writes them
/// (`<domain>.<key_value>…: unit=MINUTE requests_per_unit=10, shadow_mode:
/// false, quota_mode: false`), in a stable order; a descriptor decided by a
/// Charon resource says so instead of a unit.
pub fn rlconfig(config: &Config) -> String {
    let mut namespaces: Vec<_> = config.namespaces().collect();
    namespaces.sort_by(|a, b| a.name.cmp(&b.name));
    let mut out = String::new();
    for namespace in namespaces {
        dump_level(&namespace.descriptors, &namespace.name, &mut out);
    }
    out
}

fn dump_level(level: &Level, prefix: &str, out: &mut String) {
    let mut nodes: Vec<&Node> = level.nodes().collect();
    nodes.sort_by(|a, b| a.written.cmp(&b.written));
    for node in nodes {
        let key = format!("{prefix}.{}", node.written);
        let modes = format!(
            "shadow_mode: {}, quota_mode: {}",
            node.shadow_mode, node.quota_mode
        );
        let _ = match &node.leaf {
            Leaf::None => Ok(()),
            Leaf::Limit(limit) => writeln!(
                out,
                "{key}: unit={} requests_per_unit={}, {modes}",
                limit.unit.as_upper(),
                limit.requests_per_unit
            ),
            Leaf::Unlimited { .. } => {
                writeln!(out, "{key}: unit=UNKNOWN requests_per_unit=0, {modes}")
            }
            Leaf::Resource(resource) => writeln!(out, "{key}: resource={resource}, {modes}"),
        };
        dump_level(&node.children, &key, out);
    }
}
