//! The floor under a sidecar's CPU per decision: an Envoy rate limit service
//! that decides nothing. It answers every `ShouldRateLimit` with OK, through
//! the same stack as `charon serve` (tonic's server on hyper and h2, Nagle
//! off, a single-threaded runtime, mimalloc, the release profile), and with
//! `--store redis://…` first runs one trivial script per request through
//! redis-rs on a multiplexed connection, as the Redis store does. What it
//! costs per request is what any decision on this stack costs before Charon
//! does anything (docs/performance.md#the-floor-under-a-decision).
//!
//! It takes `charon serve`'s flags so `scripts/bench-ab.sh` can run it in
//! the sidecar's place (`NEW_BIN`); only `--grpc-addr`, `--admin-addr` and
//! `--store` mean anything, and the admin port answers `GET /readyz` only.
//!
//! ```text
//! cargo build --release --example rls_floor
//! NEW_BIN=target/release/examples/rls_floor bash scripts/bench-ab.sh a6cc302
//! ```

use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::Code;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_server::{
    RateLimitService, RateLimitServiceServer,
};
use envoy_types::pb::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};
use tonic::{Request, Response, Status};

#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// Answers OK, after one script call when there is a Redis.
struct Floor {
    redis: Option<redis::aio::ConnectionManager>,
    script: redis::Script,
}

#[tonic::async_trait]
impl RateLimitService for Floor {
    async fn should_rate_limit(
        &self,
        request: Request<RateLimitRequest>,
    ) -> Result<Response<RateLimitResponse>, Status> {
        if let Some(redis) = &self.redis {
            // One key and the arguments of a one-window decision, as the
            // Redis store sends them; the script only answers.
            let request = request.get_ref();
            let key = request
                .descriptors
                .first()
                .and_then(|d| d.entries.first())
                .map_or("floor", |entry| entry.value.as_str());
            let mut invocation = self.script.key(key);
            invocation.arg(0).arg("w").arg(1).arg("w").arg(1);
            invocation.arg(1000).arg(1000).arg(1).arg("0");
            let _: redis::Value = invocation
                .invoke_async(&mut redis.clone())
                .await
                .map_err(|error| Status::unavailable(error.to_string()))?;
        }
        Ok(Response::new(RateLimitResponse {
            overall_code: Code::Ok as i32,
            ..Default::default()
        }))
    }
}

fn flag(args: &[String], name: &str) -> Option<String> {
    args.iter()
        .position(|arg| arg == name)
        .and_then(|at| args.get(at + 1).cloned())
}

fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().collect();
    let grpc = flag(&args, "--grpc-addr").unwrap_or_else(|| "127.0.0.1:8081".into());
    let admin = flag(&args, "--admin-addr").unwrap_or_else(|| "127.0.0.1:8080".into());
    let store = flag(&args, "--store").unwrap_or_else(|| "memory".into());
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    runtime.block_on(async move {
        let redis = if store.starts_with("redis://") {
            use redis::IntoConnectionInfo;
            let info = store
                .as_str()
                .into_connection_info()?
                .set_tcp_settings(redis::io::tcp::TcpSettings::default().set_nodelay(true));
            Some(redis::Client::open(info)?.get_connection_manager().await?)
        } else {
            None
        };
        let floor = Floor {
            redis,
            script: redis::Script::new("return {0, 1, false}"),
        };
        let admin_listener = tokio::net::TcpListener::bind(&admin).await?;
        let ready = axum::Router::new().route("/readyz", axum::routing::get(|| async { "ready" }));
        tokio::spawn(async move { axum::serve(admin_listener, ready).await });
        tonic::transport::Server::builder()
            .tcp_nodelay(true)
            .add_service(RateLimitServiceServer::new(floor))
            .serve(grpc.parse()?)
            .await?;
        Ok(())
    })
}
