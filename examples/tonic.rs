//! Charon's rate limit in front of a tonic gRPC service (here the standard
//! health service), with the engine embedded: each `x-tenant-id` may make 5
//! calls per 10 seconds; the sixth gets `RESOURCE_EXHAUSTED` with a
//! `retry-after` in its metadata. Calls without the header share one
//! `anonymous` tenant. gRPC reflection is served beside it (so grpcurl needs
//! no proto files) and is not limited: its calls ask for resource
//! `reflection`, which the configuration leaves out, and the namespace lets
//! unconfigured resources through.
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
settings: {allow_unconfigured: true}
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
    let reflection = tonic_reflection::server::Builder::configure()
        .register_encoded_file_descriptor_set(tonic_health::pb::FILE_DESCRIPTOR_SET)
        .build_v1()?;
    let reflection_alpha = tonic_reflection::server::Builder::configure()
        .register_encoded_file_descriptor_set(tonic_health::pb::FILE_DESCRIPTOR_SET)
        .build_v1alpha()?;

    let port = std::env::var("PORT").unwrap_or_else(|_| "50051".into());
    let address = format!("0.0.0.0:{port}").parse()?;
    println!("serving grpc.health.v1.Health on {address}");
    tonic::transport::Server::builder()
        .layer(RateLimitLayer::new(client, "example", "health").resource(
            |request: &http::Request<tonic::body::Body>| {
                if request.uri().path().starts_with("/grpc.reflection.") {
                    "reflection".to_owned()
                } else {
                    "health".to_owned()
                }
            },
        ))
        .add_service(health)
        .add_service(reflection)
        .add_service(reflection_alpha)
        .serve(address)
        .await?;
    Ok(())
}
