//! How many of one connection's requests may be in the queue or at the
//! upstream at once: its credit (docs/design.md#the-throttling-sidecar).
//! A new connection starts with [`FIRST_CREDIT`]; each request answered
//! adds one, up to the connection's stream cap; each cancelled takes one
//! away, never under one. Requests past the credit wait on their connection,
//! holding a stream but neither a place in the queue nor a slot.
//!
//! Why: HTTP/2 lets one connection open a hundred streams and reset each a
//! millisecond later, once the proxy has taken it. Every such request
//! would take a place in the queue, equal with honest ones of its level,
//! for the millisecond it lived, and a client doing it as fast as it can
//! keeps the queue full. A client whose requests are answered earns
//! room, as fast as its answers come (doubling each round trip); one that
//! only cancels keeps a single request past its connection. A cancel
//! takes back one, not half: Envoy multiplexing a whole service's traffic
//! on one connection cancels some requests on its own timeouts, and only
//! a connection whose cancels outnumber its answers loses its room.

use std::sync::{Mutex, PoisonError};

use tokio::sync::Notify;

/// What a new connection may have past it at once.
pub const FIRST_CREDIT: u32 = 4;

/// One connection's credit.
#[derive(Debug)]
pub struct Credit {
    state: Mutex<State>,
    freed: Notify,
    max: u32,
}

#[derive(Debug)]
struct State {
    credit: u32,
    past: u32,
}

impl Credit {
    /// Credit for a connection that may have `max` requests at once.
    pub fn new(max: u32) -> Self {
        let max = max.max(1);
        Self {
            state: Mutex::new(State {
                credit: FIRST_CREDIT.min(max),
                past: 0,
            }),
            freed: Notify::new(),
            max,
        }
    }

    /// Waits until one more of this connection's requests may go on.
    pub async fn turn(&self) -> Turn<'_> {
        loop {
            let freed = self.freed.notified();
            tokio::pin!(freed);
            // Registered before the check, so a release between the two
            // still wakes this waiter.
            freed.as_mut().enable();
            {
                let mut state = self.lock();
                if state.past < state.credit {
                    state.past += 1;
                    return Turn {
                        credit: self,
                        answered: false,
                    };
                }
            }
            freed.await;
        }
    }

    /// The credit now, and how much of it is used.
    pub fn now(&self) -> (u32, u32) {
        let state = self.lock();
        (state.credit, state.past)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// One request's place past its connection, given back when dropped.
#[derive(Debug)]
pub struct Turn<'a> {
    credit: &'a Credit,
    answered: bool,
}

impl Turn<'_> {
    /// Its answer came: the connection earns one more.
    pub fn answered(mut self) {
        self.answered = true;
    }
}

impl Drop for Turn<'_> {
    fn drop(&mut self) {
        let freed = {
            let mut state = self.credit.lock();
            state.past -= 1;
            state.credit = if self.answered {
                state.credit.saturating_add(1).min(self.credit.max)
            } else {
                state.credit.saturating_sub(1).max(1)
            };
            state.credit.saturating_sub(state.past)
        };
        // As many waiters as there is room now (one, or two when the
        // credit grew); a waiter woken and gone passes its wake on.
        for _ in 0..freed.min(2) {
            self.credit.freed.notify_one();
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[tokio::test]
    async fn answers_earn_room_and_cancels_take_it_back() {
        let credit = Credit::new(100);
        let turns: Vec<_> = futures_util::future::join_all((0..4).map(|_| credit.turn())).await;
        assert_eq!(credit.now(), (4, 4));
        // A fifth waits on its connection.
        assert!(
            tokio::time::timeout(Duration::from_millis(20), credit.turn())
                .await
                .is_err()
        );
        for turn in turns {
            turn.answered();
        }
        assert_eq!(credit.now(), (8, 0));
        let turn = credit.turn().await;
        drop(turn);
        assert_eq!(credit.now(), (7, 0));
        for _ in 0..10 {
            drop(credit.turn().await);
        }
        assert_eq!(credit.now(), (1, 0), "never under one");
    }

    #[tokio::test]
    async fn a_waiter_goes_on_when_a_turn_ends_and_the_cap_holds() {
        let credit = std::sync::Arc::new(Credit::new(2));
        let first = credit.turn().await;
        let second = credit.turn().await;
        let waiting = tokio::spawn({
            let credit = credit.clone();
            async move {
                credit.turn().await.answered();
            }
        });
        tokio::time::sleep(Duration::from_millis(10)).await;
        assert!(!waiting.is_finished());
        first.answered();
        tokio::time::timeout(Duration::from_secs(5), waiting)
            .await
            .expect("woken")
            .expect("ran");
        second.answered();
        assert_eq!(credit.now(), (2, 0), "capped at the stream cap");
    }
}
