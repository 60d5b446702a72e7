//! Charon under Envoy AI Gateway's quota feed: AI Gateway's controller
//! serves its `QuotaPolicy` budgets as one RateLimitConfig, domain
//! `ai-gateway-quota`, over ADS to node `envoy-ai-gateway-ratelimit`
//! (port 18002, plaintext), and Envoy asks twice per request: one hit when
//! it starts (no `hits_addend`), and the request's token cost
//! (`%DYNAMIC_METADATA(io.envoy.ai_gateway:quota_cost)%`) when its stream
//! is done. The test's control plane serves exactly what AI Gateway's
//! translator emits for "100 tokens an hour for model gpt-4o on backend
//! default/openai"; a real Envoy is configured as AI Gateway's extension
//! server configures it, with the metadata AI Gateway's ext_proc would set
//! put there by `set_metadata` and `header_to_metadata` instead.

use std::process::Command;
use std::time::Duration;

use envoy_types::pb::google::protobuf::Any;
use envoy_types::pb::ratelimit::config::ratelimit::v3::{
    RateLimitConfig, RateLimitDescriptor, RateLimitPolicy, RateLimitUnit,
};
use prost::Message;

use super::super::envoy_e2e::{Proc, free_ports};
use super::{ControlPlane, TYPE, ready_envoy, until_status};

/// AI Gateway's one domain for every QuotaPolicy.
const DOMAIN: &str = "ai-gateway-quota";

/// The RateLimitConfig AI Gateway's translator builds for a per-model quota
/// of `limit` tokens an hour (internal/ratelimit/translator): the backend
/// as `namespace/name`, the model under it, in quota mode.
fn quota(limit: u32) -> Any {
    Any {
        type_url: TYPE.into(),
        value: RateLimitConfig {
            name: DOMAIN.into(),
            domain: DOMAIN.into(),
            descriptors: vec![RateLimitDescriptor {
                key: "backend_name".into(),
                value: "default/openai".into(),
                descriptors: vec![RateLimitDescriptor {
                    key: "model_name_override".into(),
                    value: "gpt-4o".into(),
                    rate_limit: Some(RateLimitPolicy {
                        unit: RateLimitUnit::Hour as i32,
                        requests_per_unit: limit,
                        ..Default::default()
                    }),
                    quota_mode: true,
                    ..Default::default()
                }],
                ..Default::default()
            }],
        }
        .encode_to_vec(),
    }
}

/// Envoy as AI Gateway's extension server sets it up: the rate limit filter
/// for `ai-gateway-quota`, and per route a check when the request starts
/// and the token cost charged when its stream is done.
fn envoy_yaml(listen: u16, admin: u16, upstream: u16, grpc: u16) -> String {
    format!(
        r#"
admin:
  address: {{socket_address: {{address: 127.0.0.1, port_value: {admin}}}}}
static_resources:
  listeners:
    - name: edge
      address: {{socket_address: {{address: 127.0.0.1, port_value: {listen}}}}}
      filter_chains:
        - filters:
            - name: envoy.filters.network.http_connection_manager
              typed_config:
                "@type": type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager
                stat_prefix: edge
                route_config:
                  virtual_hosts:
                    - name: all
                      domains: ["*"]
                      routes:
                        - match: {{prefix: "/"}}
                          route: {{cluster: upstream}}
                          typed_per_filter_config:
                            envoy.filters.http.ratelimit/ai-gateway-quota:
                              "@type": type.googleapis.com/envoy.extensions.filters.http.ratelimit.v3.RateLimitPerRoute
                              domain: ai-gateway-quota
                              rate_limits:
                                - actions:
                                    - generic_key: {{descriptor_key: backend_name, descriptor_value: default/openai}}
                                    - generic_key: {{descriptor_key: model_name_override, descriptor_value: gpt-4o}}
                                - actions:
                                    - metadata: {{descriptor_key: backend_name, source: DYNAMIC, metadata_key: {{key: io.envoy.ai_gateway, path: [{{key: ai_service_backend_name}}]}}}}
                                    - metadata: {{descriptor_key: model_name_override, source: DYNAMIC, metadata_key: {{key: io.envoy.ai_gateway, path: [{{key: model_name_override}}]}}}}
                                  apply_on_stream_done: true
                                  hits_addend: {{format: "%DYNAMIC_METADATA(io.envoy.ai_gateway:quota_cost)%"}}
                http_filters:
                  - name: envoy.filters.http.set_metadata
                    typed_config:
                      "@type": type.googleapis.com/envoy.extensions.filters.http.set_metadata.v3.Config
                      metadata:
                        - metadata_namespace: io.envoy.ai_gateway
                          value: {{ai_service_backend_name: default/openai, model_name_override: gpt-4o}}
                  - name: envoy.filters.http.header_to_metadata
                    typed_config:
                      "@type": type.googleapis.com/envoy.extensions.filters.http.header_to_metadata.v3.Config
                      response_rules:
                        - header: x-quota-cost
                          on_header_present: {{metadata_namespace: io.envoy.ai_gateway, key: quota_cost, type: NUMBER}}
                  - name: envoy.filters.http.ratelimit/ai-gateway-quota
                    typed_config:
                      "@type": type.googleapis.com/envoy.extensions.filters.http.ratelimit.v3.RateLimit
                      domain: ai-gateway-quota
                      failure_mode_deny: false
                      timeout: 5s
                      enable_x_ratelimit_headers: DRAFT_VERSION_03
                      disable_x_envoy_ratelimited_header: true
                      rate_limit_service:
                        transport_api_version: V3
                        grpc_service: {{envoy_grpc: {{cluster_name: ai_gateway_ratelimit_cluster}}}}
                  - name: envoy.filters.http.router
                    typed_config:
                      "@type": type.googleapis.com/envoy.extensions.filters.http.router.v3.Router
  clusters:
    - name: upstream
      type: STATIC
      connect_timeout: 1s
      load_assignment:
        cluster_name: upstream
        endpoints: [{{lb_endpoints: [{{endpoint: {{address: {{socket_address: {{address: 127.0.0.1, port_value: {upstream}}}}}}}}}]}}]
    - name: ai_gateway_ratelimit_cluster
      type: STATIC
      connect_timeout: 1s
      typed_extension_protocol_options:
        envoy.extensions.upstreams.http.v3.HttpProtocolOptions:
          "@type": type.googleapis.com/envoy.extensions.upstreams.http.v3.HttpProtocolOptions
          explicit_http_config: {{http2_protocol_options: {{}}}}
      load_assignment:
        cluster_name: ai_gateway_ratelimit_cluster
        endpoints: [{{lb_endpoints: [{{endpoint: {{address: {{socket_address: {{address: 127.0.0.1, port_value: {grpc}}}}}}}}}]}}]
"#
    )
}

#[tokio::test(flavor = "multi_thread")]
async fn ai_gateways_quota_feed_holds_a_per_model_token_budget() {
    let dir = tempfile::tempdir().expect("temp dir");
    // The model answers with what the request cost: 40 tokens.
    let upstream = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind upstream");
    let upstream_port = upstream.local_addr().expect("addr").port();
    tokio::spawn(async move {
        let app = axum::Router::new().fallback(|| async { ([("x-quota-cost", "40")], "answer") });
        axum::serve(upstream, app).await.expect("upstream");
    });
    let [listen, envoy_admin, grpc, admin, xds] = free_ports::<5>();
    let control = ControlPlane::new();
    control.push("1", vec![quota(100)]);
    let _server = control.serve(xds, None).await;
    // As the AI Gateway e2e deploys its rate-limit service, with Charon's
    // flags: plaintext, node envoy-ai-gateway-ratelimit, and every hit
    // counted (the charge after the stream usually passes the budget).
    // No file of its own: every limit comes over xDS.
    let files = dir.path().join("limits");
    std::fs::create_dir(&files).expect("an empty configuration directory");
    let mut charon = Proc::spawn(
        "charon",
        Command::new(env!("CARGO_BIN_EXE_charon"))
            .env("NO_COLOR", "1")
            .arg("serve")
            .arg("--config")
            .arg(&files)
            .args(["--grpc-addr", &format!("127.0.0.1:{grpc}")])
            .args(["--admin-addr", &format!("127.0.0.1:{admin}")])
            .args(["--config-xds", &format!("127.0.0.1:{xds}")])
            .args(["--config-xds-node-id", "envoy-ai-gateway-ratelimit"])
            .arg("--count-rejected-hits"),
        dir.path(),
    );
    let http = reqwest::Client::builder()
        .no_proxy()
        .timeout(Duration::from_secs(10))
        .build()
        .expect("reqwest client");
    until_status(
        &http,
        &format!("http://127.0.0.1:{admin}/readyz"),
        200,
        &mut charon,
    )
    .await;
    let yaml = envoy_yaml(listen, envoy_admin, upstream_port, grpc);
    let _envoy = ready_envoy(dir.path(), yaml, envoy_admin, &http).await;
    assert!(
        control
            .seen()
            .iter()
            .all(|seen| seen.node == "envoy-ai-gateway-ratelimit" && seen.error.is_none()),
        "{:?}",
        control.seen()
    );

    // 1 + 40 a request against 100: three start (1, 42, 83 before each),
    // the third's 40 takes the count to 123, and the fourth is refused.
    let mut statuses = Vec::new();
    for _ in 0..5 {
        let reply = http
            .post(format!("http://127.0.0.1:{listen}/v1/chat/completions"))
            .send()
            .await
            .expect("Envoy answers");
        statuses.push(reply.status().as_u16());
        let _ = reply.bytes().await;
        // The charge goes out when the stream is done.
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    assert_eq!(statuses, [200, 200, 200, 429, 429]);

    // A bigger quota pushed: the same counter, more room.
    control.push("2", vec![quota(1_000)]);
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    loop {
        let reply = http
            .post(format!("http://127.0.0.1:{listen}/v1/chat/completions"))
            .send()
            .await
            .expect("Envoy answers");
        let status = reply.status().as_u16();
        let _ = reply.bytes().await;
        if status == 200 {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the new quota never applied"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}
