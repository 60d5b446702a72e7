//! The tree keeps its own rules: modules import each other in one direction
//! and down the descent of the layers (`imports`); ARCHITECTURE.md's map
//! names every file under `src/`, `scripts/` and `examples/`, nothing that
//! does not exist, and the crate doc every public module (`map`); file
//! sizes, gRPC clients, runtime state and clocks stay where they belong
//! (`rules`); every kind of state is handled by the Redis script and its
//! codec (`kinds`).

mod imports;
mod kinds;
mod map;
mod rules;
