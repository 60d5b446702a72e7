//! The process kit: what every program of the `charon` binary runs on, so
//! that `charon serve` (`server`), `charon throttle` (`throttle`) and
//! `charon inject` (`inject`) share it instead of borrowing each other's
//! insides: the runtime, the signals that stop a program, a certificate
//! re-read when its files change, the `process_*` series, a scrape's
//! answer in the format the scraper asks for, the admin skeleton
//! (`/healthz`, `/readyz`, `/metrics`) each program fills, the listeners of
//! a gRPC port (TCP, TLS, a Unix socket), the resident memory given back
//! after start, and where traced spans are exported. Nothing here knows a
//! face, a limit or a store.

pub mod admin;
pub mod certificate;
pub mod listen;
pub mod logging;
pub mod otlp;
pub mod process;
pub mod resident;
pub mod runtime;
pub mod scrape;
pub mod secret;
mod signal;

pub(crate) use self::signal::shutdown_signal;
