//! Black-box tests of configuration loading (docs/configuration.md,
//! docs/design.md#matching):
//! `charon::config::{load_str, load_path}` and `charon check`.
//!
//! 1. envoyproxy/ratelimit files load unchanged (fixtures in
//!    `tests/fixtures/config/envoy/`, after the examples of its README);
//! 2. descriptor matching order;
//! 3. errors: `file:line:column`, what is wrong, the whole file rejected;
//! 4. normalization and the notes it leaves;
//! 5. directories (including a Kubernetes ConfigMap mount);
//! 6. the `charon check` binary;
//! 7. regressions: upstream compatibility gaps and unclear messages found and
//!    fixed (empty lists, `---`, `unit_multiplier`, large files, depth,
//!    `replaces`, plain-language parser messages).

mod boulder;
mod check;
mod directories;
mod envoy_files;
mod errors;
mod helpers;
mod matching;
mod normalization;
mod regressions;
mod upstream_config;
