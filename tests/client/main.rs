//! The Rust client and the Tower layers end to end, against a real sidecar
//! and the embedded engine, and the tonic example run as a user runs it.

#[path = "../support/mod.rs"]
mod support;

mod adaptive;
mod client;
mod client_ip;
mod configuration;
mod cost_layer;
mod example_tonic;
mod exceed;
mod layer;
mod leases;
mod throttle;
mod waiting;
