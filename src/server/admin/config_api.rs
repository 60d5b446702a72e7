//! The configuration API over HTTP (docs/configuration-api.md): namespaces
//! and per-domain overrides read and written as JSON or YAML, with ETags
//! (an object's version) for optimistic concurrency, `?dry_run=true` to see
//! the normalization without committing, and the change log. The work is
//! the service's ([`Configuration`]); this translates HTTP into it.

use std::net::SocketAddr;
use std::sync::Arc;

use axum::Router;
use axum::extract::{ConnectInfo, Path, Query, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use serde::Deserialize;
use serde_json::{Value, json};

use super::state::LimitsFrom;
use crate::config::{ConfigErrors, Note};
use crate::service::configuration::{Configuration, WriteError, Written, expectation};
use crate::store::config_log::{Change, LogError, ObjectPath, Write};

type Shared = Arc<Configuration>;

/// Where each domain's limits come from, for the state view: the API's
/// override, the API's namespace, or the file.
pub fn origins(configuration: Shared) -> super::state::Origins {
    Arc::new(move |namespace: &str, resource: &str, domain: &str| {
        // One object read, not the whole snapshot: the page asks every second.
        let from_api = |source: &'static str, path: ObjectPath| {
            configuration.object(&path).map(|object| LimitsFrom {
                source,
                path: format!("/v1/{}", path.key()),
                version: Some(object.version),
            })
        };
        from_api(
            "api override",
            ObjectPath::Override {
                namespace: namespace.to_owned(),
                resource: resource.to_owned(),
                domain: domain.to_owned(),
            },
        )
        .or_else(|| {
            from_api(
                "api namespace",
                ObjectPath::Namespace {
                    namespace: namespace.to_owned(),
                },
            )
        })
        .unwrap_or_else(|| LimitsFrom {
            source: "file",
            path: configuration
                .running()
                .load()
                .namespace(namespace)
                .map(|found| found.source.display().to_string())
                .unwrap_or_default(),
            version: None,
        })
    })
}

/// Who made a change, when the caller says (else the peer's address).
const ACTOR_HEADER: &str = "x-charon-actor";

pub fn router(configuration: Shared) -> Router {
    Router::new()
        .route("/v1/namespaces", get(list))
        .route(
            "/v1/namespaces/{namespace}",
            get(get_namespace)
                .put(put_namespace)
                .delete(delete_namespace),
        )
        .route(
            "/v1/namespaces/{namespace}/resources/{resource}/domains/{domain}",
            get(get_override).put(put_override).delete(delete_override),
        )
        .route("/v1/changes", get(changes))
        .with_state(configuration)
}

#[derive(Debug, Default, Deserialize)]
struct WriteQuery {
    #[serde(default)]
    dry_run: bool,
}

#[derive(Debug, Default, Deserialize)]
struct ChangesQuery {
    #[serde(default)]
    since: u64,
    limit: Option<usize>,
}

async fn list(State(configuration): State<Shared>) -> Response {
    let config = configuration.running().load();
    let snapshot = configuration.snapshot();
    let mut namespaces: Vec<Value> = config
        .namespaces()
        .map(|namespace| {
            let object = snapshot.object(&ObjectPath::Namespace {
                namespace: namespace.name.clone(),
            });
            json!({
                "namespace": namespace.name,
                "source": if object.is_some() { "api" } else { "file" },
                "version": object.map(|object| object.version),
            })
        })
        .collect();
    namespaces.sort_by(|a, b| a["namespace"].as_str().cmp(&b["namespace"].as_str()));
    json_response(
        StatusCode::OK,
        json!({ "version": snapshot.version, "namespaces": namespaces }),
    )
}

async fn get_namespace(State(configuration): State<Shared>, Path(name): Path<String>) -> Response {
    let config = configuration.running().load();
    let Some(namespace) = config.namespace(&name) else {
        return error(StatusCode::NOT_FOUND, format!("no namespace `{name}`"));
    };
    let snapshot = configuration.snapshot();
    let view = configuration.view();
    let object = snapshot.object(&ObjectPath::Namespace {
        namespace: name.clone(),
    });
    let normalized: String = view
        .normalized
        .iter()
        .filter(|(source, _)| *source == namespace.source)
        .map(|(_, text)| text.as_str())
        .collect();
    let api_prefix = format!("api:/v1/namespaces/{name}/");
    let notes: Vec<Value> = view
        .notes
        .iter()
        .filter(|note| {
            note.file == namespace.source || note.file.to_string_lossy().starts_with(&api_prefix)
        })
        .map(note_json)
        .collect();
    let overrides: Vec<Value> = snapshot
        .objects
        .values()
        .filter_map(|object| match &object.path {
            ObjectPath::Override {
                namespace,
                resource,
                domain,
            } if *namespace == name => Some(json!({
                "resource": resource,
                "domain": domain,
                "version": object.version,
                "body": object.body,
            })),
            _ => None,
        })
        .collect();
    let mut response = json_response(
        StatusCode::OK,
        json!({
            "namespace": name,
            "source": if object.is_some() { "api".to_owned() } else { namespace.source.display().to_string() },
            "version": object.map(|object| object.version),
            "log_version": view.version,
            "normalized": normalized,
            "notes": notes,
            "overrides": overrides,
        }),
    );
    if let Some(object) = object {
        set_etag(&mut response, object.version);
    }
    response
}

async fn put_namespace(
    State(configuration): State<Shared>,
    Path(namespace): Path<String>,
    Query(query): Query<WriteQuery>,
    ConnectInfo(peer): ConnectInfo<SocketAddr>,
    headers: HeaderMap,
    body: String,
) -> Response {
    let path = ObjectPath::Namespace { namespace };
    write(&configuration, path, Some(body), &query, peer, &headers).await
}

async fn delete_namespace(
    State(configuration): State<Shared>,
    Path(namespace): Path<String>,
    Query(query): Query<WriteQuery>,
    ConnectInfo(peer): ConnectInfo<SocketAddr>,
    headers: HeaderMap,
) -> Response {
    let path = ObjectPath::Namespace { namespace };
    write(&configuration, path, None, &query, peer, &headers).await
}

async fn get_override(
    State(configuration): State<Shared>,
    Path((namespace, resource, domain)): Path<(String, String, String)>,
) -> Response {
    let path = ObjectPath::Override {
        namespace,
        resource,
        domain,
    };
    match configuration.object(&path) {
        Some(object) => {
            let mut response = json_response(
                StatusCode::OK,
                json!({ "version": object.version, "body": object.body }),
            );
            set_etag(&mut response, object.version);
            response
        }
        None => error(
            StatusCode::NOT_FOUND,
            format!("no override at {}", path.key()),
        ),
    }
}

async fn put_override(
    State(configuration): State<Shared>,
    Path((namespace, resource, domain)): Path<(String, String, String)>,
    Query(query): Query<WriteQuery>,
    ConnectInfo(peer): ConnectInfo<SocketAddr>,
    headers: HeaderMap,
    body: String,
) -> Response {
    let path = ObjectPath::Override {
        namespace,
        resource,
        domain,
    };
    write(&configuration, path, Some(body), &query, peer, &headers).await
}

async fn delete_override(
    State(configuration): State<Shared>,
    Path((namespace, resource, domain)): Path<(String, String, String)>,
    Query(query): Query<WriteQuery>,
    ConnectInfo(peer): ConnectInfo<SocketAddr>,
    headers: HeaderMap,
) -> Response {
    let path = ObjectPath::Override {
        namespace,
        resource,
        domain,
    };
    write(&configuration, path, None, &query, peer, &headers).await
}

async fn changes(
    State(configuration): State<Shared>,
    Query(query): Query<ChangesQuery>,
) -> Response {
    let limit = query.limit.unwrap_or(1_000).min(10_000);
    match configuration.log().history(query.since, limit).await {
        Ok(Some(changes)) => {
            let changes: Vec<Value> = changes.iter().map(change_json).collect();
            json_response(StatusCode::OK, json!({ "changes": changes }))
        }
        Ok(None) => error(
            StatusCode::GONE,
            format!(
                "the log no longer holds the changes after version {}; read the namespaces instead",
                query.since
            ),
        ),
        Err(log) => log_error(&log),
    }
}

async fn write(
    configuration: &Configuration,
    path: ObjectPath,
    body: Option<String>,
    query: &WriteQuery,
    peer: SocketAddr,
    headers: &HeaderMap,
) -> Response {
    let header_text = |name: header::HeaderName| {
        headers
            .get(name)
            .and_then(|value| value.to_str().ok())
            .map(str::to_owned)
    };
    let expect = match expectation(
        header_text(header::IF_MATCH).as_deref(),
        header_text(header::IF_NONE_MATCH).as_deref(),
    ) {
        Ok(expect) => expect,
        Err(message) => return error(StatusCode::BAD_REQUEST, message),
    };
    if let Some(empty) = empty_segment(&path) {
        return error(StatusCode::BAD_REQUEST, format!("the {empty} is empty"));
    }
    let who = headers
        .get(ACTOR_HEADER)
        .and_then(|value| value.to_str().ok())
        .filter(|who| !who.trim().is_empty() && who.len() <= 256)
        .map_or_else(|| peer.to_string(), str::to_owned);
    let write = Write {
        path,
        body,
        expect,
        who,
    };
    match configuration.write(write, query.dry_run).await {
        Ok(written) => written_response(written, query.dry_run),
        Err(WriteError::Invalid(errors)) => invalid(&errors),
        Err(WriteError::FileNamespace(name)) => error(
            StatusCode::CONFLICT,
            format!("namespace `{name}` is defined by a file; the API cannot also define it"),
        ),
        Err(WriteError::Log(log)) => log_error(&log),
    }
}

fn empty_segment(path: &ObjectPath) -> Option<&'static str> {
    match path {
        ObjectPath::Namespace { namespace } if namespace.is_empty() => Some("namespace"),
        ObjectPath::Override {
            namespace,
            resource,
            domain,
        } => [
            (namespace, "namespace"),
            (resource, "resource"),
            (domain, "domain"),
        ]
        .into_iter()
        .find_map(|(part, name)| part.is_empty().then_some(name)),
        ObjectPath::Namespace { .. } => None,
    }
}

fn written_response(written: Written, dry_run: bool) -> Response {
    let notes: Vec<Value> = written.notes.iter().map(note_json).collect();
    match written.change {
        Some(change) => {
            let version = change.version;
            let mut response = json_response(
                StatusCode::OK,
                json!({ "change": change_json(&change), "notes": notes }),
            );
            if change.body.is_some() {
                set_etag(&mut response, version);
            }
            response
        }
        None => json_response(
            StatusCode::OK,
            json!({
                "dry_run": dry_run,
                "notes": notes,
                "normalized": written
                    .normalized
                    .iter()
                    .map(|(source, text)| json!({ "source": source.display().to_string(), "yaml": text }))
                    .collect::<Vec<_>>(),
            }),
        ),
    }
}

fn invalid(errors: &ConfigErrors) -> Response {
    let list: Vec<Value> = errors
        .0
        .iter()
        .map(|error| {
            json!({
                "source": error.file.display().to_string(),
                "line": error.line,
                "column": error.column,
                "message": error.message,
                "text": error.to_string(),
            })
        })
        .collect();
    json_response(
        StatusCode::BAD_REQUEST,
        json!({ "error": "invalid configuration; nothing was changed", "errors": list }),
    )
}

fn log_error(failure: &LogError) -> Response {
    match failure {
        LogError::Stale { current } => json_response(
            StatusCode::PRECONDITION_FAILED,
            json!({
                "error": format!("the object is at version {current}; read it again and retry with If-Match: \"{current}\""),
                "current_version": current,
            }),
        ),
        LogError::Missing => error(StatusCode::NOT_FOUND, "no such object".to_owned()),
        LogError::Unavailable(_) => error(StatusCode::SERVICE_UNAVAILABLE, failure.to_string()),
        LogError::Corrupt(_) => error(StatusCode::INTERNAL_SERVER_ERROR, failure.to_string()),
    }
}

fn change_json(change: &Change) -> Value {
    json!({
        "version": change.version,
        "at_ms": change.at_ms,
        "who": change.who,
        "path": change.path.key(),
        "body": change.body,
    })
}

fn note_json(note: &Note) -> Value {
    json!({
        "source": note.file.display().to_string(),
        "line": note.line,
        "column": note.column,
        "message": note.message,
    })
}

fn json_response(status: StatusCode, body: Value) -> Response {
    (status, axum::Json(body)).into_response()
}

fn error(status: StatusCode, message: String) -> Response {
    json_response(status, json!({ "error": message }))
}

fn set_etag(response: &mut Response, version: u64) {
    if let Ok(value) = header::HeaderValue::from_str(&format!("\"{version}\"")) {
        response.headers_mut().insert(header::ETAG, value);
    }
}
