//! The configuration API from the other end (docs/configuration-api.md):
//! what `charon config` sends to a sidecar's admin port. A change is first
//! sent as a dry run, so what is shown (the normalization notes and the diff
//! against what the sidecar serves) is exactly what the server would
//! commit; the commit then carries `If-Match` on the version read, so a
//! change made meanwhile by someone else is refused rather than overwritten.

use http_body_util::{BodyExt as _, Full};
use hyper::body::Bytes;
use serde_json::Value;

/// Why a call to the configuration API did not succeed.
#[derive(Debug, thiserror::Error)]
pub enum ConfigClientError {
    #[error("--admin {url}: {why}")]
    Url { url: String, why: &'static str },
    #[error("cannot reach the admin port {address}: {source}")]
    Unreachable {
        address: String,
        source: std::io::Error,
    },
    #[error("the admin port: {0}")]
    Http(#[from] hyper::Error),
    #[error("a request to the admin port: {0}")]
    Request(#[from] http::Error),
    #[error("{method} {path}: {status}: {message}")]
    Refused {
        method: String,
        path: String,
        status: u16,
        message: String,
    },
    #[error("an override needs --namespace")]
    NoNamespace,
    #[error("no `domain:` in the file")]
    NoDomain,
}

/// An answer: its status, its `ETag` (unquoted), its JSON body (a string
/// when the body is not JSON).
#[derive(Debug)]
pub struct Answer {
    pub status: u16,
    pub etag: Option<String>,
    pub json: Value,
}

/// A change to make: a namespace file, or (with `resource` and `domain`)
/// one domain's override of a namespace's resource.
#[derive(Debug, Clone, Default)]
pub struct Change {
    /// The namespace file, or the override's body (YAML or JSON).
    pub body: String,
    /// For an override: the namespace (else the file's `domain:`).
    pub namespace: Option<String>,
    pub resource: Option<String>,
    pub domain: Option<String>,
    /// Who makes the change, for the change log.
    pub actor: Option<String>,
}

/// What a dry run of a change showed.
#[derive(Debug)]
pub struct Preview {
    /// The object's path on the API.
    pub path: String,
    /// The object's version before the change (none: it is new).
    pub version: Option<u64>,
    /// The dry run's notes, as the API lists them.
    pub notes: Value,
    /// A unified diff of what is served against what is proposed.
    pub diff: String,
    pub unchanged: bool,
}

/// An HTTP/1 client of a sidecar's admin port.
#[derive(Debug, Clone)]
pub struct ConfigClient {
    host: String,
    port: u16,
    token: Option<String>,
}

impl ConfigClient {
    /// A client of the admin port at `url` (plain `http://`), with the
    /// admin bearer token if the port wants one.
    pub fn new(url: &str, token: Option<String>) -> Result<Self, ConfigClientError> {
        let refused = |why| ConfigClientError::Url {
            url: url.to_owned(),
            why,
        };
        let uri: hyper::Uri = url.parse().map_err(|_| refused("not a URL"))?;
        if uri.scheme_str().is_some_and(|scheme| scheme != "http") {
            return Err(refused("the admin port speaks plain http://"));
        }
        let host = uri
            .host()
            .ok_or_else(|| refused("no host"))?
            .trim_matches(['[', ']'])
            .to_owned();
        Ok(Self {
            host,
            port: uri.port_u16().unwrap_or(80),
            token,
        })
    }

    /// A request whose answer must be a success.
    pub async fn call(
        &self,
        method: &str,
        path: &str,
        body: Option<String>,
        headers: &[(&str, String)],
    ) -> Result<Answer, ConfigClientError> {
        let answer = self.call_status(method, path, body, headers).await?;
        if !(200..300).contains(&answer.status) {
            let mut message = answer.json["error"].as_str().unwrap_or("").to_owned();
            for error in answer.json["errors"].as_array().into_iter().flatten() {
                message.push_str("\n  ");
                message.push_str(error["text"].as_str().unwrap_or(""));
            }
            return Err(ConfigClientError::Refused {
                method: method.to_owned(),
                path: path.to_owned(),
                status: answer.status,
                message,
            });
        }
        Ok(answer)
    }

    /// A request, whatever its answer's status.
    pub async fn call_status(
        &self,
        method: &str,
        path: &str,
        body: Option<String>,
        headers: &[(&str, String)],
    ) -> Result<Answer, ConfigClientError> {
        let stream = tokio::net::TcpStream::connect((self.host.as_str(), self.port))
            .await
            .map_err(|source| ConfigClientError::Unreachable {
                address: format!("{}:{}", self.host, self.port),
                source,
            })?;
        let (mut sender, connection) =
            hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(stream)).await?;
        tokio::spawn(connection);
        let mut request = hyper::Request::builder()
            .method(method)
            .uri(path)
            .header(hyper::header::HOST, format!("{}:{}", self.host, self.port));
        if let Some(token) = &self.token {
            request = request.header(hyper::header::AUTHORIZATION, format!("Bearer {token}"));
        }
        for (name, value) in headers {
            request = request.header(*name, value);
        }
        let request = request.body(Full::new(Bytes::from(body.unwrap_or_default())))?;
        let response = sender.send_request(request).await?;
        let status = response.status().as_u16();
        let etag = response
            .headers()
            .get(hyper::header::ETAG)
            .and_then(|value| value.to_str().ok())
            .map(|tag| tag.trim_matches('"').to_owned());
        let bytes = response.into_body().collect().await?.to_bytes();
        let json = serde_json::from_slice(&bytes)
            .unwrap_or_else(|_| Value::String(String::from_utf8_lossy(&bytes).into_owned()));
        Ok(Answer { status, etag, json })
    }

    /// Sends `change` as a dry run: its notes, and its diff against what
    /// the sidecar serves.
    pub async fn preview(&self, change: &Change) -> Result<Preview, ConfigClientError> {
        let (path, field) = match (&change.resource, &change.domain) {
            (Some(resource), Some(domain)) => {
                let namespace = change
                    .namespace
                    .as_ref()
                    .ok_or(ConfigClientError::NoNamespace)?;
                let path =
                    format!("/v1/namespaces/{namespace}/resources/{resource}/domains/{domain}");
                (path, "body")
            }
            _ => {
                let namespace = match &change.namespace {
                    Some(namespace) => namespace.clone(),
                    None => domain_of(&change.body)?,
                };
                (format!("/v1/namespaces/{namespace}"), "normalized")
            }
        };
        let served = self.call_status("GET", &path, None, &[]).await?;
        let current = match served.status {
            200 => served.json[field].as_str().unwrap_or("").to_owned(),
            _ => String::new(),
        };
        let version = served.json["version"].as_u64();
        let dry = self
            .call(
                "PUT",
                &format!("{path}?dry_run=true"),
                Some(change.body.clone()),
                &actor(change, Vec::new()),
            )
            .await?;
        let proposed = if change.resource.is_some() {
            change.body.clone()
        } else {
            let origin = format!("api:{path}");
            dry.json["normalized"]
                .as_array()
                .into_iter()
                .flatten()
                .find(|item| item["source"].as_str() == Some(origin.as_str()))
                .and_then(|item| item["yaml"].as_str())
                .unwrap_or("")
                .to_owned()
        };
        let diff = similar::TextDiff::from_lines(&current, &proposed)
            .unified_diff()
            .context_radius(3)
            .header(&format!("{path} (served)"), &format!("{path} (proposed)"))
            .to_string();
        Ok(Preview {
            unchanged: current == proposed,
            path,
            version,
            notes: dry.json["notes"].clone(),
            diff,
        })
    }

    /// Commits `change` as `preview` saw it: refused if the object changed
    /// since. The new version's `ETag`.
    pub async fn commit(
        &self,
        change: &Change,
        preview: &Preview,
    ) -> Result<Option<String>, ConfigClientError> {
        let condition = match preview.version {
            Some(version) => ("if-match", format!("\"{version}\"")),
            None => ("if-none-match", "*".to_owned()),
        };
        let answer = self
            .call(
                "PUT",
                &preview.path,
                Some(change.body.clone()),
                &actor(change, vec![condition]),
            )
            .await?;
        Ok(answer.etag)
    }
}

fn actor(change: &Change, mut headers: Vec<(&'static str, String)>) -> Vec<(&'static str, String)> {
    if let Some(actor) = &change.actor {
        headers.push(("x-charon-actor", actor.clone()));
    }
    headers
}

/// The `domain:` of a namespace file: only that is read here; the server
/// checks the rest.
fn domain_of(text: &str) -> Result<String, ConfigClientError> {
    #[derive(serde::Deserialize)]
    struct Domain {
        domain: String,
    }
    let mut options = serde_saphyr::options::Options::default();
    options.with_snippet = false;
    if let Ok(parsed) = serde_saphyr::from_str_with_options::<Domain>(text, options) {
        return Ok(parsed.domain);
    }
    text.lines()
        .find_map(|line| line.strip_prefix("domain:"))
        .map(|domain| domain.trim().trim_matches(['"', '\'']).to_owned())
        .ok_or(ConfigClientError::NoDomain)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_namespace_files_domain_is_read_even_when_the_rest_does_not_parse() {
        assert_eq!(
            domain_of("domain: edge\ndescriptors: []\n").ok(),
            Some("edge".into())
        );
        assert_eq!(
            domain_of("domain: 'edge'\n  bad: [").ok(),
            Some("edge".into())
        );
        assert!(matches!(
            domain_of("descriptors: []\n"),
            Err(ConfigClientError::NoDomain)
        ));
    }

    #[test]
    fn the_admin_url_must_be_plain_http_with_a_host() {
        assert!(ConfigClient::new("http://127.0.0.1:9102", None).is_ok());
        assert!(ConfigClient::new("https://127.0.0.1:9102", None).is_err());
        assert!(ConfigClient::new("not a url", None).is_err());
        assert_eq!(
            ConfigClient::new("http://[::1]:9102", None)
                .map(|c| c.host)
                .ok(),
            Some("::1".into())
        );
    }
}
