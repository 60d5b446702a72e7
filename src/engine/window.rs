//! The envoyproxy/ratelimit fixed window: a counter per window aligned to the
//! Unix epoch, reset when the next window starts.

/// The counter of the current window.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct WindowState {
    /// Start of the window `count` belongs to (ms since the epoch).
    pub start: u64,
    pub count: u64,
    /// The window's end: after it this counter means nothing.
    pub expires_at: u64,
}

/// What a fixed-window check says at `now`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WindowCheck {
    pub over: bool,
    /// Hits already counted in the current window.
    pub count: u64,
    pub window_end: u64,
}

pub fn window_start(now: u64, period: u64) -> u64 {
    now - now % period.max(1)
}

/// Checks `hits` against `limit` (0 hits: would the next hit pass?).
pub fn check(state: &WindowState, limit: u64, period: u64, hits: u64, now: u64) -> WindowCheck {
    let start = window_start(now, period);
    let count = if state.start == start { state.count } else { 0 };
    let asked = hits.max(1);
    WindowCheck {
        over: count.saturating_add(asked) > limit,
        count,
        window_end: start.saturating_add(period),
    }
}

/// Records `hits` granted at `now`.
pub fn record(state: &mut WindowState, period: u64, hits: u64, now: u64) {
    let start = window_start(now, period);
    if state.start != start {
        *state = WindowState {
            start,
            count: 0,
            expires_at: start.saturating_add(period),
        };
    }
    state.count = state.count.saturating_add(hits);
}

/// When a one-hit request would pass: now if there is room, at the next
/// window otherwise, never if the limit is 0.
pub fn retry_after(check: &WindowCheck, limit: u64, now: u64) -> Option<u64> {
    if limit == 0 {
        None
    } else if check.count < limit {
        Some(0)
    } else {
        Some(check.window_end - now)
    }
}
