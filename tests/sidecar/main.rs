//! The sidecar as users run it: the real `charon` binary on real sockets
//! (startup, answers, health, metrics, reload, shutdown), its gRPC port under
//! TLS, the admin pages, the configuration API, `charon inject`, the
//! Kubernetes manifests, and the do-nothing server of the benchmarks.

#[path = "../support/mod.rs"]
mod support;

mod bench_floor;
mod config_api;
mod deploy_manifests;
mod events;
mod grpc_tls;
mod inject_webhook;
mod rlqs;
mod server;
mod throttle;
mod throttle_attacks;
mod throttle_load;
mod traces;
mod ui;
