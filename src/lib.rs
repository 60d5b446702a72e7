//! Charon: rate limits, copy limits and capacity leases, decided exactly.
//!
//! # Layout
//!
//! The path of a decision is a straight line: a server (or the Tower layer)
//! translates a wire request into a [`limiter`] call; the limiter looks the
//! limits up in the [`config`] and builds a batch of engine items; a [`store`]
//! holds the state and runs the [`engine`] on it atomically; the answer goes
//! back the same way.
//!
//! Two more paths cross the same modules. A capacity lease: a client's
//! lease limiter asks `GetCapacity` for a share of a `capacity:` resource in
//! the background, the service looks the resource up in the [`config`], and
//! a lease store runs the [`engine`]'s apportioning on the resource's leases.
//! A configuration API write: runtime overrides are checked as a file is,
//! committed to the config log in the [`store`], and the whole configuration
//! is rebuilt and swapped into the [`limiter`]. Servers can also form a
//! hierarchy: a leaf leases its capacity from a region and the region from
//! the root, with the same `GetCapacity`, each apportioning what it is
//! granted among those below it.
//! ARCHITECTURE.md walks each path step by step ("An Envoy `ShouldRateLimit`
//! call", "A copy `reserve` through the Charon API", "A capacity lease:
//! `GetCapacity`", "A configuration write through the configuration API",
//! "A lease through a hierarchy (leaf → region → root)").
//!
//! - [`clock`]: time as milliseconds from an injected clock.
//! - [`criticality`]: how much a request matters under overload, the four
//!   levels of the SRE book, and the level of the request being handled;
//!   the server throttler and the queue of reserves waiting for a copy both
//!   serve by it.
//! - [`config`]: the YAML format, validation, normalization, compiled limits;
//!   the configuration API's overlay (namespaces and per-domain overrides
//!   written into the YAML before it is compiled).
//! - [`engine`]: pure decisions — fixed windows, sliding window counters,
//!   sliding window logs, GCRA buckets, the hybrid quota-linear limiter,
//!   Cloud Armor's bans, burst tiers with hard and global limits, budgets of
//!   a cost known after the response, copy limits, and the apportioning of
//!   a leased capacity among clients — over explicit state and an explicit
//!   `now`. No I/O.
//! - [`store`]: where state lives ([`store::MemoryStore`] by default) and the
//!   atomic step that runs the engine on it; with feature `redis`, the copy
//!   log, the leases of each leased capacity and the configuration API's log
//!   (objects, versions, changes), each in the process or on Redis, where
//!   they share one connection.
//! - [`limiter`]: Envoy-style requests in, per-descriptor statuses out; one
//!   engine and one access history for every face of Charon.
//! - `service` (feature `embedded`): `Service`, the one owner of what a
//!   sidecar and an embedded engine both run — the running configuration,
//!   the stores, rate requests, sessions and their hold sets, `GetCapacity`
//!   and `ReleaseCapacity`, housekeeping; for an engine on configuration
//!   files (a sidecar's, or `Embedded::open_files`), the configuration API's
//!   core (its view of the config log, checking a write, rebuilding and
//!   swapping the configuration); capacities leased from a parent server
//!   and the nudges pushed to the levels below. Domain operations and
//!   errors in and out (`service::ops`, `service::error`): no wire type.
//! - `api` (feature `client`): the Charon API's generated code; with feature
//!   `embedded`, the conversions between its messages and the service's
//!   operations.
//! - `server` (feature `server`): the faces over the service: the Envoy
//!   RateLimitService, Envoy's Rate Limit Quota Service and the Charon API
//!   over gRPC, the admin HTTP endpoints (with the configuration API, the
//!   simulator and state pages), metrics, traces, configuration over xDS,
//!   the link to a parent server, config reload and shutdown.
//! - [`state_view`]: the recent decisions of what the state view looks at,
//!   recorded only while someone looks.
//! - [`spans`]: the spans made where the trace exporter is not visible (a
//!   Redis call's span, the degraded mark): real only inside a request the
//!   server chose to trace, a thread-local look-up anywhere else.
//! - [`simulate`]: `charon simulate`, the engine on a virtual clock fed a
//!   request pattern, summarized per tick; and capacity leases of clients
//!   whose demand changes over time.
//! - `client` (feature `client`): the Rust client of a sidecar, or of an
//!   engine embedded in the process: requests, hold guards, transfers,
//!   retries and fail-open (docs/design.md#client); capacity leases, a local
//!   lease limiter renewed in the background (docs/design.md#capacity-leases).
//! - `layer` (feature `layer`): Tower middleware — on the client, a rate
//!   limit per request, a copy held for the life of the response,
//!   Envoy-style descriptors, a budget charged the response's cost, or a
//!   lease limiter's rate with no call per request; and, asking no one, the
//!   server throttler and client-side adaptive throttling.
//! - `inject` (feature `server`): `charon inject`, the Kubernetes admission
//!   webhook that adds the sidecar to pods.
//! - `throttle` (feature `server`): `charon throttle`, the server throttler as
//!   a sidecar: a reverse proxy to one upstream with the throttler's queue,
//!   or a queue released at a fixed rate.
//! - `kit` (feature `server`): the process kit the programs share instead of
//!   borrowing each other's insides: the runtime, the stopping signals, a
//!   reloading certificate, the `process_*` series and a scrape's answer.
//!
//! The binaries hold no decision, but they are not thin. `src/bin/charon/`
//! is the `charon` command: `serve` (over sixty flags, each with its
//! environment variable, turned into `server::ServeOptions`; secrets and
//! certificates read from files or the environment, never the command
//! line; text or JSON logs and the OTLP exporter; the runtime; then
//! `server::run`), `check`, `simulate`, `inject` and `throttle` (each a library call),
//! `config` (an HTTP client of the configuration API: a dry run and a diff
//! first, then a commit with `If-Match`), and, started as `ratelimit`,
//! `serve` configured from envoyproxy/ratelimit's environment variables.
//! `tools/charon-load/src/` is the load tool of the benchmarks (loopback
//! only): Envoy requests, copy sessions, or token budgets under concurrent
//! streams, with counts and percentiles.

// The session future nests the limiter, the failover and a Redis call: the
// compiler's Send and Sync proofs of its type go deeper than the default.
#![recursion_limit = "256"]

pub mod clock;
pub mod config;
pub mod criticality;
pub mod engine;
pub mod limiter;
pub mod simulate;
pub mod spans;
pub mod state_view;
pub mod store;

#[cfg(feature = "client")]
pub mod client;
#[cfg(feature = "server")]
pub mod inject;
#[cfg(feature = "server")]
pub mod kit;
#[cfg(feature = "layer")]
pub mod layer;
#[cfg(feature = "server")]
pub mod server;
#[cfg(feature = "embedded")]
pub mod service;
#[cfg(feature = "server")]
pub mod throttle;

#[cfg(feature = "client")]
pub mod api;
