//! The spans that traces are made of, where the code that makes them cannot
//! see the exporter: a Redis call's span and the degraded mark. They exist
//! only inside a request that the server chose to trace (its span has
//! target [`TARGET`]); anywhere else they are [`Span::none`] and cost a
//! thread-local look-up.

use tracing::Span;

/// The target of every span meant for the trace exporter; the exporter's
/// layer takes these and nothing else.
pub const TARGET: &str = "charon::trace";

fn in_traced_request() -> Option<Span> {
    let current = Span::current();
    current
        .metadata()
        .is_some_and(|meta| meta.target() == TARGET)
        .then_some(current)
}

/// The span of one call to Redis made for a traced request (`Span::none()`
/// otherwise): a child of the request's span.
pub fn store_call(operation: &'static str) -> Span {
    let Some(current) = in_traced_request() else {
        return Span::none();
    };
    tracing::info_span!(
        target: TARGET,
        parent: &current,
        "redis",
        otel.kind = "client",
        db.system = "redis",
        db.operation = operation,
        result = tracing::field::Empty,
    )
}

/// Marks the traced request being answered (if any) as answered by
/// `--on-store-error` instead of the shared store.
pub fn mark_degraded() {
    if let Some(current) = in_traced_request() {
        current.record("degraded", true);
    }
}
