//! `charon config`: the configuration API (docs/configuration-api.md) from a
//! terminal, over [`charon::server::admin::config_client`]: `apply` and
//! `diff` show a dry run's notes and diff first; `apply` then commits what
//! was shown, or nothing if the object changed since.

use std::io::{BufRead, Write as _};
use std::path::PathBuf;

use anyhow::{Context, bail};
use charon::server::admin::config_client::{self, ConfigClient, Preview};
use clap::{Args, Subcommand};
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
    let token = args
        .admin_token_file
        .as_deref()
        .map(|file| {
            std::fs::read_to_string(file)
                .map(|token| token.trim().to_owned())
                .with_context(|| format!("cannot read {}", file.display()))
        })
        .transpose()?;
    let client = ConfigClient::new(&args.admin, token)?;
    match args.command {
        ConfigCommand::Get { namespace: None } => {
            let list = client.call("GET", "/v1/namespaces", None, &[]).await?.json;
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
            let namespace = client
                .call("GET", &format!("/v1/namespaces/{name}"), None, &[])
                .await?
                .json;
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
            let log = client
                .call("GET", &format!("/v1/changes?since={since}"), None, &[])
                .await?
                .json;
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
            show(&client.preview(&change.read()?).await?);
        }
        ConfigCommand::Apply { change, yes } => {
            let change = change.read()?;
            let preview = client.preview(&change).await?;
            show(&preview);
            if preview.unchanged {
                println!("nothing to change");
                return Ok(());
            }
            if !yes && !confirm()? {
                bail!("not applied");
            }
            let etag = client.commit(&change, &preview).await?;
            println!(
                "applied: {} at version {}",
                preview.path,
                etag.unwrap_or_default()
            );
        }
    }
    Ok(())
}

impl Change {
    /// The change as the API takes it, its file read.
    fn read(self) -> anyhow::Result<config_client::Change> {
        let body = std::fs::read_to_string(&self.file)
            .with_context(|| format!("cannot read {}", self.file.display()))?;
        Ok(config_client::Change {
            body,
            namespace: self.namespace,
            resource: self.resource,
            domain: self.domain,
            actor: self.actor,
        })
    }
}

fn show(preview: &Preview) {
    print_notes(&preview.notes);
    print!("{}", preview.diff);
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
