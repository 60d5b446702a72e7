//! Charon's Tower layers on an axum service, with no sidecar: the engine is
//! embedded in the process (memory store). Each `x-tenant-id` may make 5
//! requests per 10 seconds on `GET /`; `GET /report` runs at most 2 at once
//! per tenant (it takes 2 seconds).
//!
//! ```text
//! cargo run --example axum            # listens on $PORT (default 3000)
//! for i in $(seq 6); do curl -si -H 'x-tenant-id: acme' localhost:3000/ | head -1; done
//! curl -si -H 'x-tenant-id: acme' localhost:3000/     # 429, Retry-After, RateLimit headers
//! ```
//!
//! To use a sidecar instead, replace `Client::embedded(config)` with
//! `Client::sidecar("http://127.0.0.1:8081")?`.

use std::time::Duration;

use axum::{Router, routing::get};
use charon::client::Client;
use charon::layer::{ConcurrencyLayer, RateLimitLayer};

const CONFIG: &str = r#"
domain: example
resources:
  root:
    rate:
      tiers:
        - {limit: 5, window: 10s, active: forever, cooldown: 0s}
  reports:
    copies: {domain_limit: 2}
"#;

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let config = charon::config::load_str(CONFIG, "example.yaml")
        .map_err(|errors| anyhow::anyhow!("{errors}"))?
        .config;
    let client = Client::embedded(config);

    let app = Router::new()
        .route("/", get(|| async { "hello\n" }))
        .layer(RateLimitLayer::new(client.clone(), "example", "root"))
        .merge(
            Router::new()
                .route("/report", get(report))
                .layer(ConcurrencyLayer::new(client, "example", "reports")),
        );

    let port = std::env::var("PORT").unwrap_or_else(|_| "3000".into());
    let listener = tokio::net::TcpListener::bind(format!("0.0.0.0:{port}")).await?;
    println!("listening on http://{}", listener.local_addr()?);
    axum::serve(listener, app).await?;
    Ok(())
}

async fn report() -> &'static str {
    tokio::time::sleep(Duration::from_secs(2)).await;
    "report\n"
}
