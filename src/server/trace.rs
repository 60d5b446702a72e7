//! Which requests are traced, and their spans. With `--otlp-endpoint`, a
//! traced `ShouldRateLimit` gets a span (namespace, outcome, degraded) whose
//! parent is the caller's W3C `traceparent`, so Charon's time shows inside
//! the request's trace in Envoy's tracer; a Redis call made for it gets a
//! child span. The sampling decision is made here, before any span exists:
//! an untraced request pays one metadata lookup and one random number, not
//! a span (docs/operations.md#traces).
//!
//! The rule is the usual parent-based one: a caller that sent a sampled
//! `traceparent` is traced, one that sent an unsampled one is not, and a
//! request without one is traced with probability `--trace-sample-ratio`.

use std::cell::Cell;

use opentelemetry::propagation::{Extractor, TextMapPropagator};
use opentelemetry_sdk::propagation::TraceContextPropagator;
use tonic::metadata::MetadataMap;
use tracing::Span;
use tracing_opentelemetry::OpenTelemetrySpanExt;

pub use crate::spans::TARGET;

/// Whether, and how often, requests are traced. The default traces nothing.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct TraceSampler {
    /// A root request is traced when a uniform `u64` falls below this; 0
    /// when nothing is traced (no exporter).
    threshold: u64,
    enabled: bool,
}

impl TraceSampler {
    /// No exporter: nothing is traced, whatever the caller sent.
    pub const fn off() -> Self {
        Self {
            threshold: 0,
            enabled: false,
        }
    }

    /// Traces callers that ask for it, and `ratio` (0 to 1) of the rest.
    pub fn new(ratio: f64) -> Self {
        Self {
            threshold: threshold(ratio),
            enabled: true,
        }
    }

    /// The span of one `ShouldRateLimit`, or [`Span::none`] when this call
    /// is not traced.
    pub fn decision_span(&self, metadata: &MetadataMap, namespace: &str) -> Span {
        let Some(parent) = self.traced(metadata) else {
            return Span::none();
        };
        let span = tracing::info_span!(
            target: TARGET,
            "envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit",
            otel.kind = "server",
            rpc.system = "grpc",
            namespace,
            outcome = tracing::field::Empty,
            degraded = tracing::field::Empty,
        );
        adopt(&span, parent);
        span
    }

    /// The span of one unary Charon API `Request`, or [`Span::none`].
    pub fn charon_request(&self, metadata: &MetadataMap, namespace: &str, resource: &str) -> Span {
        let Some(parent) = self.traced(metadata) else {
            return Span::none();
        };
        let span = tracing::info_span!(
            target: TARGET,
            "charon.v1.Charon/Request",
            otel.kind = "server",
            rpc.system = "grpc",
            namespace,
            resource,
            outcome = tracing::field::Empty,
            degraded = tracing::field::Empty,
            error = tracing::field::Empty,
        );
        adopt(&span, parent);
        span
    }

    /// `None` when this call is not traced; else the caller's metadata if it
    /// sent a `traceparent` (the span's parent), or `None` inside.
    fn traced<'m>(&self, metadata: &'m MetadataMap) -> Option<Option<&'m MetadataMap>> {
        if !self.enabled {
            return None;
        }
        let parent = metadata
            .get("traceparent")
            .and_then(|value| value.to_str().ok());
        self.sampled(parent).then(|| parent.map(|_| metadata))
    }

    fn sampled(&self, traceparent: Option<&str>) -> bool {
        match traceparent.and_then(trace_flags) {
            Some(flags) => flags & 1 == 1,
            None => self.threshold > 0 && random() < self.threshold,
        }
    }
}

/// Makes the caller's trace context (from its metadata) `span`'s parent.
fn adopt(span: &Span, parent: Option<&MetadataMap>) {
    if let Some(metadata) = parent {
        let context = TraceContextPropagator::new().extract(&Metadata(metadata));
        // Only fails once the span has started: it has not.
        let _ = span.set_parent(context);
    }
}

/// The draw of [`random`] under which a call is in a sample of `ratio`
/// (0 to 1; NaN is 0).
pub(crate) fn threshold(ratio: f64) -> u64 {
    let ratio = if ratio.is_nan() {
        0.0
    } else {
        ratio.clamp(0.0, 1.0)
    };
    // u64::MAX as f64 rounds up to 2^64; the cast back saturates.
    (ratio * u64::MAX as f64) as u64
}

/// The `trace-flags` of a W3C `traceparent` (`00-<trace>-<span>-<flags>`).
fn trace_flags(traceparent: &str) -> Option<u8> {
    let mut parts = traceparent.trim().split('-');
    let (version, trace, span, flags) =
        (parts.next()?, parts.next()?, parts.next()?, parts.next()?);
    let valid = version.len() == 2
        && version != "ff"
        && trace.len() == 32
        && span.len() == 16
        && flags.len() == 2
        && trace.bytes().any(|b| b != b'0')
        && span.bytes().any(|b| b != b'0');
    if !valid {
        return None;
    }
    u8::from_str_radix(flags, 16).ok()
}

/// A fast per-thread random number (SplitMix64), seeded from the OS once per
/// thread: sampling needs uniformity, not secrecy.
pub(crate) fn random() -> u64 {
    thread_local! {
        static STATE: Cell<u64> = Cell::new({
            let mut seed = [0u8; 8];
            // A failed seed only makes the sequence predictable.
            let _ = getrandom::fill(&mut seed);
            u64::from_le_bytes(seed)
        });
    }
    STATE.with(|state| {
        let next = state.get().wrapping_add(0x9E37_79B9_7F4A_7C15);
        state.set(next);
        let mut z = next;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    })
}

/// gRPC metadata as OpenTelemetry's propagator reads it.
struct Metadata<'a>(&'a MetadataMap);

impl Extractor for Metadata<'_> {
    fn get(&self, key: &str) -> Option<&str> {
        self.0.get(key).and_then(|value| value.to_str().ok())
    }

    fn keys(&self) -> Vec<&str> {
        self.0
            .keys()
            .filter_map(|key| match key {
                tonic::metadata::KeyRef::Ascii(key) => Some(key.as_str()),
                tonic::metadata::KeyRef::Binary(_) => None,
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_callers_sampled_flag_decides_whatever_the_ratio() {
        let none = TraceSampler::new(0.0);
        let all = TraceSampler::new(1.0);
        let sampled = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01";
        let unsampled = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-00";
        assert!(none.sampled(Some(sampled)));
        assert!(!all.sampled(Some(unsampled)));
        // No parent, or one that does not parse: the ratio decides.
        assert!(all.sampled(None));
        assert!(!none.sampled(None));
        assert!(all.sampled(Some("garbage")));
        assert!(!none.sampled(Some(
            "00-00000000000000000000000000000000-b7ad6b7169203331-01"
        )));
    }

    #[test]
    fn a_ratio_samples_about_that_share() {
        let sampler = TraceSampler::new(0.25);
        let traced = (0..100_000).filter(|_| sampler.sampled(None)).count();
        assert!((23_000..27_000).contains(&traced), "{traced}");
        assert_eq!(TraceSampler::new(f64::NAN), TraceSampler::new(0.0));
    }
}
