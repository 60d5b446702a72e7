//! The Redis store and sidecars sharing Redis, on real `redis-server`
//! processes started here on free ports (standalone, Cluster, Sentinel, TLS).

#[path = "../support/mod.rs"]
mod support;

mod calendar;
mod connections;
mod cost_reservations;
mod hot_key;
mod learn;
mod redis_harness;
mod redis_nodelay;
mod redis_sidecars;
mod redis_store;
mod redis_tls;
mod refunds;
mod several_budgets;
mod state_format;
