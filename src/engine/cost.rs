//! Costs known after the response (docs/design.md#costs-known-after-the-response):
//! a budget of cost units (LLM tokens, bytes) per fixed window, charged when
//! a response ends and checked before a request starts.
//!
//! One piece: a charge, an admission, a reservation and their settling all
//! move the same window's counts and the learned cost; split, one invariant
//! (`used + reserved <= limit`) would be kept in several places. Its tests
//! are in `cost/tests.rs`.
//!
//! A charge (`hits > 0`) is a fact: it is always recorded, past the limit
//! too, and it retires the oldest admission still waiting for its charge. A
//! check (`hits == 0`) is admitted only while
//! `used + reserved(pending + 1) <= limit` (and the first check of a
//! window, with nothing in flight, always), where `pending` counts the
//! admissions not yet charged and `reserved(n)` is what `n` requests are
//! predicted to cost: `n` times the learned mean cost, plus ten times the
//! learned mean deviation times `sqrt(n)`, so that the sum of the costs in
//! flight stays under it in most windows whatever their spread. The mean and
//! the deviation are running averages (weight 1/64) of the charges of this
//! key, from the configured `initial_cost` before there is any; an admission
//! never charged expires after twice the longest recent time from admission
//! to charge (10 s before any is known; 1 s to 10 min).
//!
//! Reservations are the explicit way (docs/design.md#reservations): a
//! caller that knows its estimate reserves it, and the reservation holds
//! that much of the budget until it is committed at the actual cost (the
//! difference charged or given back), cancelled, or expires; an expired
//! reservation is charged at its estimate in the window it expired in, or
//! released, as it was asked. A reservation is admitted only while
//! `used + held + reserved(pending) + amount <= limit`, so the budget is
//! exceeded by no more than the estimate errors of the reservations in
//! flight when it fills. A refund gives back part of what was charged, in
//! the window it was charged in only, and never below zero.
//!
//! Integers only, so that `decide.lua` computes the same state to the unit:
//! the mean and deviation are kept in sixteenths.

use super::window::window_start;

/// Admissions waiting for their charge, at most: past it the oldest is
/// dropped (it would have expired first).
pub const MAX_PENDING: usize = 1024;
/// Reservations held on one key at once, at most: past it a reservation is
/// refused (each one is a promise the key must keep).
pub const MAX_RESERVATIONS: usize = 1024;
/// How long a key's learned cost outlives its last use.
pub const LEARNED_TTL: u64 = 3_600_000;
/// Fixed-point scale of the mean and the deviation.
pub const SCALE: u64 = 16;
/// The time to charge assumed before one is learned.
const DEFAULT_DURATION: u64 = 10_000;
const MIN_PENDING_TTL: u64 = 1_000;
const MAX_PENDING_TTL: u64 = 600_000;

/// The cost of a key: the window's charges, what is in flight, what was
/// learned.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CostState {
    /// Start of the window `used` belongs to.
    pub start: u64,
    /// Charged in that window.
    pub used: u64,
    /// The learned cost of one request, in sixteenths; 0 before any charge.
    pub mean: u64,
    /// The learned mean absolute deviation of a charge from `mean`, in
    /// sixteenths.
    pub dev: u64,
    /// The learned time from admission to charge (ms); 0 before any.
    pub duration: u64,
    /// When each admission not yet charged was made, oldest first.
    pub pending: Vec<u64>,
    /// Reservations not yet committed, cancelled or expired, oldest first.
    pub reservations: Reservations,
    pub expires_at: u64,
}

/// A key's reservations: usually none, so boxed, keeping every memory
/// store slot (as large as its largest kind of state) 16 bytes smaller.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[expect(
    clippy::box_collection,
    reason = "one pointer in the state, not a Vec's three words"
)]
pub struct Reservations(Option<Box<Vec<Reservation>>>);

impl Reservations {
    pub const NONE: Reservations = Reservations(None);

    pub fn iter(&self) -> std::slice::Iter<'_, Reservation> {
        self.0.as_deref().map_or([].iter(), |list| list.iter())
    }

    fn push(&mut self, reservation: Reservation) {
        self.0.get_or_insert_default().push(reservation);
    }

    fn retain(&mut self, keep: impl FnMut(&Reservation) -> bool) {
        if let Some(list) = &mut self.0 {
            list.retain(keep);
            if list.is_empty() {
                self.0 = None;
            }
        }
    }
}

impl FromIterator<Reservation> for Reservations {
    fn from_iter<I: IntoIterator<Item = Reservation>>(iter: I) -> Self {
        let list: Vec<Reservation> = iter.into_iter().collect();
        Reservations((!list.is_empty()).then(|| Box::new(list)))
    }
}

/// Part of a budget held for a request whose cost will be known later.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Reservation {
    /// Chosen by the caller (the service draws it at random): the same id
    /// names the reservation on every key of one request.
    pub id: u64,
    pub amount: u64,
    pub expires_at: u64,
    /// Expired, it is charged at `amount` (else released).
    pub charge_on_expiry: bool,
}

/// What a cost item does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CostOp {
    /// 0 checks (admitted: one more request in flight, predicted); more
    /// charges, a fact recorded whatever the verdict.
    Hits(u64),
    /// Holds `amount` for `ttl` ms, if it fits.
    Reserve {
        id: u64,
        amount: u64,
        ttl: u64,
        charge_on_expiry: bool,
    },
    /// Settles reservation `id` at `actual`: refused (changing nothing) if
    /// it is not held.
    Commit { id: u64, actual: u64 },
    /// Releases reservation `id` unspent: refused if it is not held.
    Cancel { id: u64 },
    /// Gives back `amount` charged at `charged_at`: refused once that
    /// instant's window is over.
    Refund { amount: u64, charged_at: u64 },
}

impl CostOp {
    /// The cost it asks for: what a local rejection would need.
    pub fn amount(&self) -> u64 {
        match *self {
            CostOp::Hits(amount)
            | CostOp::Reserve { amount, .. }
            | CostOp::Commit { actual: amount, .. }
            | CostOp::Refund { amount, .. } => amount,
            CostOp::Cancel { .. } => 0,
        }
    }
}

impl CostState {
    /// A key nothing was charged to or admitted on.
    pub const FRESH: CostState = CostState {
        start: 0,
        used: 0,
        mean: 0,
        dev: 0,
        duration: 0,
        pending: Vec::new(),
        reservations: Reservations::NONE,
        expires_at: 0,
    };
}

/// What a check or charge sees at `now`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CostCheck {
    pub over: bool,
    /// Charged in the current window.
    pub used: u64,
    /// Predicted for the admissions in flight (not expired).
    pub reserved: u64,
    /// Held by live reservations.
    pub held: u64,
    pub window_end: u64,
}

impl CostCheck {
    /// What the budget counts as spent: charged, predicted and held.
    pub fn spent(&self) -> u64 {
        self.used
            .saturating_add(self.reserved)
            .saturating_add(self.held)
    }
}

/// The deviation guessed from a first mean (the configured `initial_cost`,
/// or a first charge) before any is learned: 3/20 of it, so that a first
/// prediction's spread is 1.5 times the mean (what it was when the spread
/// was three deviations and the guess half the mean).
fn first_dev(mean: u64) -> u64 {
    mean.saturating_mul(3) / 20
}

/// The mean and deviation to predict with, in sixteenths.
fn estimate(state: &CostState, initial_cost: u64) -> (u64, u64) {
    if state.mean == 0 && state.dev == 0 {
        let mean = initial_cost.saturating_mul(SCALE);
        (mean, first_dev(mean))
    } else {
        (state.mean, state.dev)
    }
}

/// How many learned deviations (mean absolute deviations, about half a
/// standard deviation for a long-tailed cost) the prediction of `n`
/// requests adds, times `sqrt(n)`: docs/design.md#costs-known-after-the-response
/// says why ten.
pub const SPREAD: f64 = 10.0;

/// What `n` requests are predicted to cost, in cost units (rounded up).
pub fn reserved(n: u64, mean: u64, dev: u64) -> u64 {
    if n == 0 {
        return 0;
    }
    let spread = (SPREAD * dev as f64 * (n as f64).sqrt()).ceil() as u64;
    n.saturating_mul(mean)
        .saturating_add(spread)
        .div_ceil(SCALE)
}

/// The learned time from admission to charge, or the default before any.
fn duration(state: &CostState) -> u64 {
    if state.duration == 0 {
        DEFAULT_DURATION
    } else {
        state.duration
    }
}

/// How long an admission waits for its charge before it no longer counts:
/// twice the learned time to charge, 1 s to 10 min.
pub fn pending_ttl(state: &CostState) -> u64 {
    duration(state)
        .saturating_mul(2)
        .clamp(MIN_PENDING_TTL, MAX_PENDING_TTL)
}

/// Admissions still in flight at `now`.
fn live(state: &CostState, now: u64) -> u64 {
    let ttl = pending_ttl(state);
    state
        .pending
        .iter()
        .filter(|&&admitted| admitted.saturating_add(ttl) > now)
        .count() as u64
}

/// Reservations held at `now`, and the sum of their amounts.
fn held(state: &CostState, now: u64) -> (usize, u64) {
    state
        .reservations
        .iter()
        .filter(|r| r.expires_at > now)
        .fold((0, 0), |(n, sum), r| (n + 1, sum.saturating_add(r.amount)))
}

/// What expired reservations charge to the window starting at `start`.
fn expired_charges(state: &CostState, period: u64, start: u64, now: u64) -> u64 {
    state
        .reservations
        .iter()
        .filter(|r| {
            r.expires_at <= now && r.charge_on_expiry && window_start(r.expires_at, period) == start
        })
        .fold(0, |sum, r| sum.saturating_add(r.amount))
}

fn is_held(state: &CostState, id: u64, now: u64) -> bool {
    state
        .reservations
        .iter()
        .any(|r| r.id == id && r.expires_at > now)
}

/// Checks `op` at `now`: a charge is never over; a check, a reservation,
/// a commit, a cancel and a refund are over when they cannot apply.
pub fn check(
    state: &CostState,
    limit: u64,
    period: u64,
    initial_cost: u64,
    op: CostOp,
    now: u64,
) -> CostCheck {
    let start = window_start(now, period);
    let used = if state.start == start { state.used } else { 0 }
        .saturating_add(expired_charges(state, period, start, now));
    let (mean, dev) = estimate(state, initial_cost);
    let in_flight = live(state, now);
    let (holding, held) = held(state, now);
    let over = match op {
        CostOp::Hits(0) => {
            // The first check of a window passes: else a learned cost
            // above the budget would shut it for good.
            used.saturating_add(held)
                .saturating_add(reserved(in_flight + 1, mean, dev))
                > limit
                && !(in_flight == 0 && used == 0 && held == 0)
        }
        CostOp::Hits(_) => false,
        CostOp::Reserve { id, amount, .. } => {
            used.saturating_add(held)
                .saturating_add(reserved(in_flight, mean, dev))
                .saturating_add(amount)
                > limit
                || holding >= MAX_RESERVATIONS
                || state.reservations.iter().any(|r| r.id == id)
        }
        CostOp::Commit { id, .. } | CostOp::Cancel { id } => !is_held(state, id, now),
        CostOp::Refund { charged_at, .. } => window_start(charged_at, period) != start,
    };
    CostCheck {
        over,
        used,
        reserved: reserved(in_flight, mean, dev),
        held,
        window_end: start.saturating_add(period),
    }
}

/// Drops the admissions that expired, starts a new window if one began,
/// and charges the expired reservations that charge to it.
fn settle(state: &mut CostState, period: u64, now: u64) {
    let ttl = pending_ttl(state);
    state
        .pending
        .retain(|&admitted| admitted.saturating_add(ttl) > now);
    let start = window_start(now, period);
    if state.start != start {
        state.start = start;
        state.used = 0;
    }
    let expired = expired_charges(state, period, start, now);
    state.used = state.used.saturating_add(expired);
    state.reservations.retain(|r| r.expires_at > now);
}

/// `value` moved 1/64 of the way to `sample` (rounded down, as Lua's
/// floor): slow, because a cost's distribution has a long tail, and a
/// faster average spends most of its time below the mean.
fn towards(value: u64, sample: u64) -> u64 {
    let (value, sample) = (value as i128, sample as i128);
    (value + (sample - value).div_euclid(64)).max(0) as u64
}

fn touch(state: &mut CostState, period: u64, now: u64) {
    let window_end = window_start(now, period).saturating_add(period);
    let last_pending = state
        .pending
        .last()
        .map_or(0, |&admitted| admitted.saturating_add(pending_ttl(state)));
    // A reservation that expires charged must find its window.
    let last_reservation = state
        .reservations
        .iter()
        .map(|r| r.expires_at.saturating_add(period))
        .max()
        .unwrap_or(0);
    state.expires_at = window_end
        .max(last_pending)
        .max(last_reservation)
        .max(now.saturating_add(LEARNED_TTL));
}

/// Records a charge of `hits` at `now`: always, past the limit too.
pub fn charge(state: &mut CostState, period: u64, hits: u64, now: u64) {
    settle(state, period, now);
    state.used = state.used.saturating_add(hits);
    if !state.pending.is_empty() {
        // The longest recent time to charge, not the mean: an admission
        // must not stop counting while its request still runs. It follows
        // a longer time at once and a shorter one slowly.
        let took = now.saturating_sub(state.pending.remove(0));
        let known = duration(state);
        state.duration = if took > known {
            took
        } else {
            known - (known - took) / 64
        }
        .max(1);
    }
    learn(state, hits);
    touch(state, period, now);
}

/// Moves the learned mean and deviation towards a charge of `hits`.
fn learn(state: &mut CostState, hits: u64) {
    let sample = hits.saturating_mul(SCALE);
    if state.mean == 0 && state.dev == 0 {
        state.mean = sample;
        state.dev = first_dev(sample);
    } else {
        let deviation = sample.abs_diff(state.mean);
        state.mean = towards(state.mean, sample);
        state.dev = towards(state.dev, deviation);
    }
}

/// Records an admitted check at `now`: one more request in flight.
pub fn admit(state: &mut CostState, period: u64, now: u64) {
    settle(state, period, now);
    if state.pending.len() >= MAX_PENDING {
        state.pending.remove(0);
    }
    if state.pending.capacity() == 0 {
        // One request in flight is the common case of a store of many keys.
        state.pending.reserve_exact(1);
    }
    state.pending.push(now);
    touch(state, period, now);
}

/// Applies a reservation, commit, cancel or refund that [`check`] found
/// not over (a check or a charge goes to [`admit`] or [`charge`]).
pub fn apply(state: &mut CostState, period: u64, op: CostOp, now: u64) {
    settle(state, period, now);
    match op {
        CostOp::Hits(_) => {}
        CostOp::Reserve {
            id,
            amount,
            ttl,
            charge_on_expiry,
        } => state.reservations.push(Reservation {
            id,
            amount,
            expires_at: now.saturating_add(ttl.max(1)),
            charge_on_expiry,
        }),
        CostOp::Commit { id, actual } => {
            state.reservations.retain(|r| r.id != id);
            state.used = state.used.saturating_add(actual);
            if actual > 0 {
                learn(state, actual);
            }
        }
        CostOp::Cancel { id } => state.reservations.retain(|r| r.id != id),
        CostOp::Refund { amount, .. } => state.used = state.used.saturating_sub(amount),
    }
    touch(state, period, now);
}

mod item;
pub use item::CostItem;

#[cfg(test)]
mod tests;
