//! `charon config`: the configuration API (docs/configuration-api.md) from a
//! terminal. `apply` and `diff` send the change as a dry run first, so what
//! is shown — the normalization notes and the diff against what the sidecar
//! serves — is exactly what the server would commit; `apply` then commits it
//! with `If-Match` on the version it read, so a change made meanwhile by
//! someone else is refused rather than overwritten.

use std::io::{BufRead, Write as _};
use std::path::PathBuf;

use anyhow::{Context, bail};
use clap::{Args, Subcommand};
use http_body_util::{BodyExt, Full};
use hyper::body::Bytes;
use serde_json::Value;

#[derive(Args)]
pub struct ConfigArgs {
    #[command(subcommand)]
    command: ConfigCommand,
    /// The sidecar's admin address.
    #[arg(
        long,
        env = "CHARON_ADMIN_URL",
        default_value = "http://127.0.0.1:9102",
        global = true
    )]
    admin: String,
    /// A file holding the admin bearer token (`--admin-token-file` of the sidecar).
    #[arg(long, env = "CHARON_ADMIN_TOKEN_FILE", global = true)]
    admin_token_file: Option<PathBuf>,
}

#[derive(Subcommand)]
enum ConfigCommand {
    /// Without a namespace: every namespace and its source. With one: its
    /// effective, normalized configuration, notes and overrides.
    Get { namespace: Option<String> },
    /// Show the notes and the diff of a change, then commit it (asks first
    /// unless --yes).
    Apply {
        #[command(flatten)]
        change: Change,
        /// Commit without asking.
        #[arg(long)]
        yes: bool,
    },
    /// Show the notes and the diff of a change; commit nothing.
    Diff {
        #[command(flatten)]
        change: Change,
    },
    /// The change log.
    History {
        /// Changes after this version.
        #[arg(long, default_value_t = 0)]
        since: u64,
    },
}

/// A change: a namespace file, or (with --resource and --domain) one
/// domain's override of a namespace's resource.
#[derive(Args)]
struct Change {
    /// The namespace file, or the override's body (YAML or JSON).
    #[arg(short = 'f', long)]
    file: PathBuf,
    /// For an override: the namespace (else the file's `domain:`).
    #[arg(long)]
    namespace: Option<String>,
    #[arg(long, requires = "domain")]
    resource: Option<String>,
    #[arg(long, requires = "resource")]
    domain: Option<String>,
    /// Who is making the change, for the log.
    #[arg(long, env = "USER")]
    actor: Option<String>,
}

pub async fn run(args: ConfigArgs) -> anyhow::Result<()> {
    let client = Admin::new(&args.admin, args.admin_token_file.as_deref())?;
    match args.command {
        ConfigCommand::Get { namespace: None } => {
            let (_, _, list) = client.call("GET", "/v1/namespaces", None, &[]).await?;
            for namespace in list["namespaces"].as_array().into_iter().flatten() {
                println!(
                    "{}\t{}{}",
                    namespace["namespace"].as_str().unwrap_or(""),
                    namespace["source"].as_str().unwrap_or(""),
                    namespace["version"]
                        .as_u64()
                        .map(|v| format!("\tversion {v}"))
                        .unwrap_or_default()
                );
            }
        }
        ConfigCommand::Get {
            namespace: Some(name),
        } => {
            let (_, _, namespace) = client
                .call("GET", &format!("/v1/namespaces/{name}"), None, &[])
                .await?;
            println!("# source: {}", namespace["source"].as_str().unwrap_or(""));
            print_notes(&namespace["notes"]);
            for item in namespace["overrides"].as_array().into_iter().flatten() {
                println!(
                    "# override {}/{} (version {})",
                    item["resource"].as_str().unwrap_or(""),
                    item["domain"].as_str().unwrap_or(""),
                    item["version"]
                );
            }
            print!("{}", namespace["normalized"].as_str().unwrap_or(""));
        }
        ConfigCommand::History { since } => {
            let (_, _, log) = client
                .call("GET", &format!("/v1/changes?since={since}"), None, &[])
                .await?;
            for change in log["changes"].as_array().into_iter().flatten() {
                println!(
                    "{}\t{}\t{}\t{}\t{}",
                    change["version"],
                    change["at_ms"],
                    change["who"].as_str().unwrap_or(""),
                    if change["body"].is_null() {
                        "delete"
                    } else {
                        "put"
                    },
                    change["path"].as_str().unwrap_or("")
                );
            }
        }
        ConfigCommand::Diff { change } => {
            preview(&client, &change).await?;
        }
        ConfigCommand::Apply { change, yes } => {
            let preview = preview(&client, &change).await?;
            if preview.unchanged {
                println!("nothing to change");
                return Ok(());
            }
            if !yes && !confirm()? {
                bail!("not applied");
            }
            let if_match = match preview.version {
                Some(version) => format!("\"{version}\""),
                None => "*".to_owned(),
            };
            let mut headers = vec![("if-match", if_match)];
            if preview.version.is_none() {
                headers = vec![("if-none-match", "*".to_owned())];
            }
            let (_, etag, _) = client
                .call(
                    "PUT",
                    &preview.path,
                    Some(preview.body.clone()),
                    &actor(&change, headers),
                )
                .await?;
            println!(
                "applied: {} at version {}",
                preview.path,
                etag.unwrap_or_default()
            );
        }
    }
    Ok(())
}

/// What a dry run of a change showed.
struct Preview {
    path: String,
    body: String,
    /// The object's version before the change (none: it is new).
    version: Option<u64>,
    unchanged: bool,
}

async fn preview(client: &Admin, change: &Change) -> anyhow::Result<Preview> {
    let body = std::fs::read_to_string(&change.file)
        .with_context(|| format!("cannot read {}", change.file.display()))?;
    let (path, current, version) = match (&change.resource, &change.domain) {
        (Some(resource), Some(domain)) => {
            let namespace = change
                .namespace
                .clone()
                .context("an override needs --namespace")?;
            let path = format!("/v1/namespaces/{namespace}/resources/{resource}/domains/{domain}");
            let (status, _, object) = client.call_status("GET", &path, None, &[]).await?;
            let current = (status == 200).then(|| object["body"].as_str().unwrap_or("").to_owned());
            (
                path,
                current.unwrap_or_default(),
                object["version"].as_u64(),
            )
        }
        _ => {
            let namespace = match &change.namespace {
                Some(namespace) => namespace.clone(),
                None => domain_of(&body)?,
            };
            let path = format!("/v1/namespaces/{namespace}");
            let (status, _, object) = client.call_status("GET", &path, None, &[]).await?;
            let current =
                (status == 200).then(|| object["normalized"].as_str().unwrap_or("").to_owned());
            (
                path,
                current.unwrap_or_default(),
                object["version"].as_u64(),
            )
        }
    };
    let (_, _, dry) = client
        .call(
            "PUT",
            &format!("{path}?dry_run=true"),
            Some(body.clone()),
            &actor(change, Vec::new()),
        )
        .await?;
    print_notes(&dry["notes"]);
    let proposed = if change.resource.is_some() {
        body.clone()
    } else {
        let origin = format!("api:{path}");
        dry["normalized"]
            .as_array()
            .into_iter()
            .flatten()
            .find(|item| item["source"].as_str() == Some(origin.as_str()))
            .and_then(|item| item["yaml"].as_str())
            .unwrap_or("")
            .to_owned()
    };
    let diff = similar::TextDiff::from_lines(&current, &proposed);
    let unchanged = diff.ratio() == 1.0 && current == proposed;
    print!(
        "{}",
        diff.unified_diff()
            .context_radius(3)
            .header(&format!("{path} (served)"), &format!("{path} (proposed)"))
    );
    Ok(Preview {
        path,
        body,
        version,
        unchanged,
    })
}

fn actor(change: &Change, mut headers: Vec<(&'static str, String)>) -> Vec<(&'static str, String)> {
    if let Some(actor) = &change.actor {
        headers.push(("x-charon-actor", actor.clone()));
    }
    headers
}

/// The `domain:` of a namespace file.
fn domain_of(text: &str) -> anyhow::Result<String> {
    #[derive(serde::Deserialize)]
    struct Domain {
        domain: String,
    }
    let mut options = serde_saphyr::options::Options::default();
    options.with_snippet = false;
    // Only `domain` is read here; the server validates the rest.
    let parsed: Domain = serde_saphyr::from_str_with_options(text, options).or_else(|_| {
        text.lines()
            .find_map(|line| line.strip_prefix("domain:"))
            .map(|domain| Domain {
                domain: domain.trim().trim_matches(['"', '\'']).to_owned(),
            })
            .context("no `domain:` in the file")
    })?;
    Ok(parsed.domain)
}

fn print_notes(notes: &Value) {
    for note in notes.as_array().into_iter().flatten() {
        println!(
            "# note: {}:{}:{}: {}",
            note["source"].as_str().unwrap_or(""),
            note["line"],
            note["column"],
            note["message"].as_str().unwrap_or("")
        );
    }
}

fn confirm() -> anyhow::Result<bool> {
    print!("apply this change? [y/N] ");
    std::io::stdout().flush()?;
    let mut answer = String::new();
    std::io::stdin().lock().read_line(&mut answer)?;
    Ok(matches!(answer.trim(), "y" | "Y" | "yes"))
}

/// An HTTP/1 client of the admin port.
struct Admin {
    host: String,
    port: u16,
    token: Option<String>,
}

impl Admin {
    fn new(url: &str, token_file: Option<&std::path::Path>) -> anyhow::Result<Self> {
        let uri: hyper::Uri = url
            .parse()
            .with_context(|| format!("--admin {url}: not a URL"))?;
        if uri.scheme_str().is_some_and(|scheme| scheme != "http") {
            bail!("--admin {url}: the admin port speaks plain http://");
        }
        let host = uri
            .host()
            .with_context(|| format!("--admin {url}: no host"))?
            .trim_matches(['[', ']'])
            .to_owned();
        let token = token_file
            .map(|file| {
                std::fs::read_to_string(file)
                    .map(|token| token.trim().to_owned())
                    .with_context(|| format!("cannot read {}", file.display()))
            })
            .transpose()?;
        Ok(Self {
            host,
            port: uri.port_u16().unwrap_or(80),
            token,
        })
    }

    /// A request whose answer must be a success.
    async fn call(
        &self,
        method: &str,
        path: &str,
        body: Option<String>,
        headers: &[(&str, String)],
    ) -> anyhow::Result<(u16, Option<String>, Value)> {
        let (status, etag, json) = self.call_status(method, path, body, headers).await?;
        if !(200..300).contains(&status) {
            let mut message = json["error"].as_str().unwrap_or("").to_owned();
            for error in json["errors"].as_array().into_iter().flatten() {
                message.push_str(&format!("\n  {}", error["text"].as_str().unwrap_or("")));
            }
            bail!("{method} {path}: {status}: {message}");
        }
        Ok((status, etag, json))
    }

    async fn call_status(
        &self,
        method: &str,
        path: &str,
        body: Option<String>,
        headers: &[(&str, String)],
    ) -> anyhow::Result<(u16, Option<String>, Value)> {
        let stream = tokio::net::TcpStream::connect((self.host.as_str(), self.port))
            .await
            .with_context(|| format!("cannot reach the admin port {}:{}", self.host, self.port))?;
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
        Ok((status, etag, json))
    }
}
