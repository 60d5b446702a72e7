//! Copy-limited resources and capacity leases end to end: the real `charon`
//! binary, real gRPC sessions, on the memory store and on real `redis-server`s.

#[path = "../support/mod.rs"]
mod support;

mod anyones_result;
mod capacity_leases;
mod copies_sidecars;
mod global_edges;
mod global_limits;
mod hierarchy;
mod lease_spaces;
mod waiters_that_leave;
