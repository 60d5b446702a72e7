//! `/debug/learned`: limits proposed from recorded use
//! (docs/design.md#learning-a-limit), as a namespace file
//! (`text/yaml`) that `charon check` accepts. It names tenants, so it sits
//! behind the admin port's access check like the state view.

use axum::extract::{Query, State};
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde::Deserialize;

use crate::config::learned::Pick;
use crate::service::error::Kind;

use super::state::StateSources;

#[derive(Debug, Deserialize)]
pub struct LearnedQuery {
    namespace: String,
    /// `peak` (the default), `p99`, `p95` or `p50`.
    #[serde(default)]
    pick: Option<String>,
}

pub async fn proposal(
    State(sources): State<StateSources>,
    Query(query): Query<LearnedQuery>,
) -> Response {
    let Some(service) = &sources.proposals else {
        return (StatusCode::NOT_FOUND, "no proposals on this server\n").into_response();
    };
    let pick = match query.pick.as_deref() {
        None => Pick::default(),
        Some(text) => match Pick::parse(text) {
            Some(pick) => pick,
            None => {
                return (
                    StatusCode::BAD_REQUEST,
                    format!("pick `{text}`: use peak, p99, p95 or p50\n"),
                )
                    .into_response();
            }
        },
    };
    match service.proposal(&query.namespace, pick).await {
        Ok(snippet) => (
            [(header::CONTENT_TYPE, "text/yaml; charset=utf-8")],
            snippet,
        )
            .into_response(),
        Err(error) => {
            let status = match error.kind {
                Kind::UnknownResource => StatusCode::NOT_FOUND,
                Kind::WrongKind => StatusCode::CONFLICT,
                Kind::StoreUnavailable => StatusCode::SERVICE_UNAVAILABLE,
                _ => StatusCode::INTERNAL_SERVER_ERROR,
            };
            (status, format!("{}\n", error.message)).into_response()
        }
    }
}
