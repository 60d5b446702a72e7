//! Refunds (docs/design.md#refunds): hits given back, as Envoy's
//! `is_negative_hits` asks. A refund is never over its limit and never
//! credits past it: a count never goes below 0, a bucket never holds more
//! than its burst. Each algorithm gives back in its own file (its `Kind::refund`);
//! this one says what every refund answers: the state after, never over.
//!
//! A refund is applied with its batch, so that the Redis script and the
//! engine agree without replaying anything; the limiter puts a request's
//! refunds in a batch of their own, which is always granted.

use super::Outcome;

/// A refund's answer: whatever the state after, it passed.
pub(super) fn never_over(outcome: Outcome) -> Outcome {
    match outcome {
        Outcome::Window(mut w) => {
            w.over = false;
            w.wait = Some(0);
            Outcome::Window(w)
        }
        Outcome::Gcra(mut g) => {
            g.over = false;
            g.wait = Some(0);
            Outcome::Gcra(g)
        }
        Outcome::Tiers(mut t) => {
            t.over = false;
            t.wait = Some(0);
            Outcome::Tiers(t)
        }
    }
}
