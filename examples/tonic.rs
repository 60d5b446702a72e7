//! Charon's rate limit in front of a tonic gRPC service (here the standard
//! health service), with the engine embedded: each `x-tenant-id` may make 5
//! calls per 10 seconds; the sixth gets `RESOURCE_EXHAUSTED` with a
//! `retry-after` in its metadata. Calls without the header share one
//! `anonymous` tenant.
//!
//! ```text
//! cargo run --example tonic           # listens on $PORT (default 50051)
//! for i in $(seq 6); do
//!   grpcurl -plaintext -H 'x-tenant-id: acme' localhost:50051 grpc.health.v1.Health/Check
//! done
//! ```

use charon::client::Client;
use charon::layer::RateLimitLayer;

const CONFIG: &str = r#"
domain: example
resources:
  health:
    rate:
      tiers:
        - {limit: 5, window: 10s, active: forever, cooldown: 0s}
"#;

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let config = charon::config::load_str(CONFIG, "example.yaml")
        .map_err(|errors| anyhow::anyhow!("{errors}"))?
        .config;
    let client = Client::embedded(config);
    let (_reporter, health) = tonic_health::server::health_reporter();

    let port = std::env::var("PORT").unwrap_or_else(|_| "50051".into());
    let address = format!("0.0.0.0:{port}").parse()?;
    println!("serving grpc.health.v1.Health on {address}");
    tonic::transport::Server::builder()
        .layer(RateLimitLayer::new(client, "example", "health"))
        .add_service(health)
        .serve(address)
        .await?;
    Ok(())
}
