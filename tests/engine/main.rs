//! Decisions in the process, no network: the engine's properties against
//! reference models, the memory store, the limiter's Envoy semantics, capacity
//! apportioning, the cookbook's patterns, `charon simulate`, and hostile input
//! (the RLQS target serves its face on a loopback socket of the process).

#[path = "../support/mod.rs"]
mod support;

mod budget_sim;
mod budgets;
mod capacity_properties;
mod cookbook;
mod cookbook_copies;
mod engine_properties;
mod fuzz;
mod fuzz_parsers;
mod hierarchy_properties;
mod hybrid;
mod limiter;
mod memory_store;
mod reservations;
mod reset_property;
mod resource_algorithms;
mod simulate;
mod sliding;
mod sliding_log;
