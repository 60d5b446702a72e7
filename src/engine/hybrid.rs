//! The hybrid quota-linear limiter (docs/design.md#hybrid-quota-linear):
//! `quota` requests per `window`, in two modes. Bursty: a fixed window that
//! starts at a client's first request and holds a whole quota, so a quiet
//! client may burst. Smooth: entered when a client spends its last token,
//! with a negative bucket that keeps it under quota until that window would
//! have ended; from then tokens come back at `quota / window`, and a full
//! quota of them returns the client to bursty mode.
//!
//! The bucket is kept in token-milliseconds (tokens × `window`), so that
//! smooth mode's fractional tokens are whole numbers: `rate × elapsed`
//! tokens is `quota × elapsed` units. The configuration keeps
//! `quota × window` below 2^53, so `decide.lua` computes the same state.

use super::{Kind, Outcome, Slot, Step, WindowOutcome};

/// Whether a key is in bursty or smooth mode.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum Mode {
    /// No state: a new client (or one whose state expired).
    #[default]
    Fresh,
    Bursty,
    Smooth,
}

/// One key's state: its mode, time and bucket.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct HybridState {
    pub mode: Mode,
    /// Bursty: when the window started. Smooth: the last request.
    pub time: u64,
    /// Tokens × window (negative after the switch to smooth mode).
    pub bucket: i64,
    /// After it the state decides nothing a fresh one would not: a bursty
    /// window's end, or when a smooth bucket holds a whole quota again.
    pub expires_at: u64,
}

/// What a decision of `hits` at `now` finds and leaves.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HybridOutcome {
    pub over: bool,
    /// The state after the request (unchanged when over, or a check).
    pub after: HybridState,
    /// Whole tokens left after the request.
    pub remaining: u64,
    /// Until the client holds a whole quota again (bursty mode anew).
    pub reset_after: u64,
    /// Until one more hit would pass; `None`: never.
    pub retry_after: Option<u64>,
    /// Until this request's hits would pass (0 when granted); `None`: never.
    pub wait: Option<u64>,
}

impl HybridState {
    fn expiring(mut self, quota: u64, window: u64) -> Self {
        self.expires_at = match self.mode {
            Mode::Fresh => 0,
            Mode::Bursty => self.time.saturating_add(window),
            Mode::Smooth => self
                .time
                .saturating_add(refill_ms(self.bucket, quota, window)),
        };
        self
    }
}

/// Milliseconds of smooth mode until `bucket` holds a whole quota.
fn refill_ms(bucket: i64, quota: u64, window: u64) -> u64 {
    until_tokens(bucket, quota, quota, window)
}

/// Milliseconds of smooth mode until `bucket` holds `tokens` whole tokens.
fn until_tokens(bucket: i64, tokens: u64, quota: u64, window: u64) -> u64 {
    let needed = i128::from(tokens) * i128::from(window) - i128::from(bucket);
    if needed <= 0 {
        return 0;
    }
    let quota = i128::from(quota.max(1));
    u64::try_from((needed + quota - 1) / quota).unwrap_or(u64::MAX)
}

/// A client starting afresh: a bursty window from `now`, holding a whole
/// quota (before this request takes its share).
fn reset(quota: u64, window: u64, now: u64) -> HybridState {
    HybridState {
        mode: Mode::Bursty,
        time: now,
        bucket: full(quota, window),
        expires_at: 0,
    }
}

/// A whole quota, in bucket units.
fn full(quota: u64, window: u64) -> i64 {
    i64::try_from(quota.saturating_mul(window)).unwrap_or(i64::MAX)
}

/// Decides `hits` (0: would one pass? nothing recorded) at `now`: all of
/// them or none, each taken as the clauses take one request.
pub fn decide(state: &HybridState, quota: u64, window: u64, hits: u64, now: u64) -> HybridOutcome {
    let asked = hits.max(1);
    let w = i64::try_from(window).unwrap_or(i64::MAX).max(1);
    let q = i64::try_from(quota).unwrap_or(i64::MAX);
    // The state as of `now`, before this request takes anything: a bursty
    // window that ended, or a smooth bucket that refilled, starts afresh.
    let mut seen = *state;
    if seen.mode == Mode::Smooth {
        let elapsed = now.saturating_sub(seen.time);
        seen.bucket = seen
            .bucket
            .saturating_add(i64::try_from(elapsed).unwrap_or(i64::MAX).saturating_mul(q));
        seen.time = now.max(seen.time);
    }
    let fresh = match seen.mode {
        Mode::Fresh => true,
        Mode::Bursty => seen.time.saturating_add(window) <= now,
        Mode::Smooth => seen.bucket >= full(quota, window),
    };
    if fresh {
        seen = reset(quota, window, now);
    }
    // Whole tokens to spend, and what spending the last one leads to.
    let tokens = (seen.bucket.max(0) / w) as u64;
    let over = asked > tokens || quota == 0;
    let mut after = seen;
    if !over {
        after.bucket -= asked as i64 * w;
        if after.mode == Mode::Bursty && after.bucket == 0 && !(fresh && asked == 1) {
            // The last token of a bursty window: smooth mode, owing what
            // the rest of the window would have given, plus the one token
            // that lets the next request in when the window ends.
            let remaining = seen.time.saturating_add(window).saturating_sub(now);
            after.bucket = w - i64::try_from(remaining)
                .unwrap_or(i64::MAX)
                .saturating_mul(q);
            after.time = now;
            after.mode = Mode::Smooth;
        }
    }
    // A request that records nothing leaves the state as it was: a refused
    // one in smooth mode moves no tokens that time would not move anyway.
    let (recorded, left) = if over || hits == 0 {
        (*state, seen)
    } else {
        (after.expiring(quota, window), after)
    };
    let remaining = (left.bucket.max(0) / w) as u64;
    let reset_after = match left.mode {
        Mode::Smooth => refill_ms(left.bucket, quota, window),
        _ => left.time.saturating_add(window).saturating_sub(now),
    };
    let wait_for = |tokens: u64| -> Option<u64> {
        if tokens > quota || quota == 0 {
            return None;
        }
        if tokens <= remaining {
            return Some(0);
        }
        Some(match left.mode {
            Mode::Smooth => until_tokens(left.bucket, tokens, quota, window),
            _ => reset_after,
        })
    };
    HybridOutcome {
        over,
        after: recorded,
        remaining,
        reset_after,
        retry_after: wait_for(1),
        wait: if over { wait_for(asked) } else { Some(0) },
    }
}

/// The hybrid quota-linear limiter in a batch: `quota` per `window`.
/// `hits == 0` only checks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HybridItem {
    pub slot: usize,
    pub quota: u64,
    pub window: u64,
    pub hits: u64,
    pub shadow: bool,
}

impl Kind for HybridItem {
    super::one_slot!();

    /// Whether a hybrid limiter's item is over its limit at `now`.
    fn is_over(&self, slots: &[Slot], now: u64) -> bool {
        let state = state_in(slots, self.slot);
        decide(&state, self.quota, self.window, self.hits, now).over
    }

    /// Decides a hybrid limiter's item and, committing, records what passes (and what
    /// counts whatever the verdict).
    fn run(&self, step: Step<'_>) -> Outcome {
        let (slot, quota, window, hits) = (self.slot, self.quota, self.window, self.hits);
        let Step { slots, now, commit } = step;
        let seen = decide(&state_in(slots, slot), quota, window, hits, now);
        if commit
            && !seen.over
            && hits > 0
            && let Some(entry) = slots.get_mut(slot)
        {
            *entry = Slot::Hybrid(seen.after);
        }
        Outcome::Window(WindowOutcome {
            over: seen.over,
            limit: quota,
            period: window,
            remaining: seen.remaining,
            // Its tokens, not a count: what the quota had spent before.
            before: quota
                .saturating_sub(seen.remaining)
                .saturating_sub(if seen.over { 0 } else { hits }),
            reset_after: seen.reset_after,
            wait: seen.wait,
            retry_after: seen.retry_after,
            unreturned: 0,
        })
    }
}

/// The hybrid state in `slots[index]`, or a fresh one.
fn state_in(slots: &[Slot], index: usize) -> HybridState {
    match slots.get(index) {
        Some(Slot::Hybrid(state)) => *state,
        _ => HybridState::default(),
    }
}
