//! Envoy's face: what a user migrating from envoyproxy/ratelimit relies on,
//! and a real Envoy in front of the real `charon` binary.

#[path = "../support/mod.rs"]
mod support;

mod central;
mod client_ip;
mod concurrency;
mod envoy_dropin;
mod envoy_e2e;
mod rlqs;
mod tcp;
mod token_budget;
mod token_budget_exact;
mod token_budget_several;
mod xds;
