//! A hot key's queue: single decisions on a key that already has a call in
//! Redis wait for it, then go together as one call (for the kinds whose own
//! script has a queue form: fixed windows, `window.lua`, and GCRA buckets,
//! `gcra.lua`).
//!
//! Every decision is a script call, and Redis runs one at a time, so a hot
//! key's decisions are decided one after another whatever the sidecar
//! sends. Sent one call each, every one pays for its call (`EVALSHA`, `TIME`,
//! `GET`, `SET`, reading and answering the request); queued behind the call
//! in flight, the ones that arrive meanwhile go as one call of their
//! script's queue form, which decides each in turn at one instant with
//! one `GET` and one `SET` and answers a verdict per decision
//! (docs/redis.md#a-hot-key). The answers are the ones the calls made one by
//! one would have given at that instant, in that order: the sidecar reruns
//! the engine on the state the script read, one decision after another,
//! and checks each verdict. A decision never waits for a timer, only for the
//! call already in flight on its key, so one request at a time goes as
//! before.
//!
//! Who sends the next call: the decision whose call returns (or whose
//! caller gave up) hands the key on to the first one queued, which sends its
//! own decision and those behind it, up to [`MOST_PER_CALL`]. The key stays
//! marked in flight while a [`Baton`] for it lives, so a dropped baton
//! (its holder cancelled) hands on in its `Drop`, and no key is left with
//! decisions queued and no call.

use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Instant;

use foldhash::fast::RandomState;
use hashbrown::HashMap;
use hashbrown::hash_map::EntryRef;

use smallvec::SmallVec;
use tokio::sync::oneshot;

use crate::engine::{self, Decision, Item, Slot};
use crate::store::SlotKey;

use super::{RedisError, RedisStore, codec, kinds};

/// The most decisions one queued call carries: the rest wait for the next.
pub const MOST_PER_CALL: usize = 64;

/// The keys with a call in flight, and the decisions queued on each.
/// (Every decision of a queueable kind passes here, so the map hashes
/// with foldhash and allocates a key only for a key not yet in flight.)
#[derive(Default)]
pub(super) struct Queues {
    waiting: Mutex<Waiting>,
}

type Waiting = HashMap<Arc<str>, Vec<Waiter>, RandomState>;

/// A decision queued on a key.
struct Waiter {
    item: Item<'static>,
    turn: oneshot::Sender<Turn>,
}

/// What a queued decision gets.
enum Turn {
    Answer(Result<Decision, RedisError>),
    /// Its turn to send the next call: its own decision first, then these.
    Lead(Baton),
}

/// The right to send a key's next call. Dropped, it hands the key on to the
/// next decision queued (first putting back any it carried and did not
/// send), or marks the key idle.
struct Baton {
    queues: Arc<Queues>,
    key: Arc<str>,
    group: Vec<Waiter>,
    /// Whether dropping it hands the key on (not when it comes back
    /// undelivered to [`Queues::hand_on`], which holds the lock).
    armed: bool,
}

impl Drop for Baton {
    fn drop(&mut self) {
        if self.armed {
            let unsent = std::mem::take(&mut self.group);
            self.queues.hand_on(&self.key, unsent);
        }
    }
}

/// Where a decision stands once queued.
enum Joined {
    /// No call in flight on the key: send one.
    Lead(Baton),
    Wait(oneshot::Receiver<Turn>),
}

impl Queues {
    fn lock(&self) -> MutexGuard<'_, Waiting> {
        // A panic while holding it left a map of plain values: still whole.
        self.waiting
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    fn join(self: &Arc<Self>, key: &str, item: Item<'static>) -> Joined {
        let mut waiting = self.lock();
        match waiting.entry_ref(key) {
            EntryRef::Occupied(mut queue) => {
                let (turn, receiver) = oneshot::channel();
                queue.get_mut().push(Waiter { item, turn });
                Joined::Wait(receiver)
            }
            EntryRef::Vacant(vacant) => {
                let key = vacant.insert_entry(Vec::new()).key().clone();
                Joined::Lead(Baton {
                    queues: self.clone(),
                    key,
                    group: Vec::new(),
                    armed: true,
                })
            }
        }
    }

    /// The call on `key` is done: the first decision still queued sends the
    /// next, with those behind it; none queued, the key is idle.
    fn hand_on(self: &Arc<Self>, key: &Arc<str>, unsent: Vec<Waiter>) {
        let mut waiting = self.lock();
        let EntryRef::Occupied(mut entry) = waiting.entry_ref(&**key) else {
            return;
        };
        let queue = entry.get_mut();
        if !unsent.is_empty() {
            queue.splice(0..0, unsent);
        }
        loop {
            // A decision whose caller left needs no answer, nor a call.
            queue.retain(|waiter| !waiter.turn.is_closed());
            if queue.is_empty() {
                entry.remove();
                return;
            }
            let mut group: Vec<Waiter> = queue.drain(..queue.len().min(MOST_PER_CALL)).collect();
            let first = group.remove(0);
            let baton = Baton {
                queues: self.clone(),
                key: key.clone(),
                group,
                armed: true,
            };
            match first.turn.send(Turn::Lead(baton)) {
                Ok(()) => return,
                // It left in between: the baton comes back, and must not
                // hand on from inside this lock.
                Err(Turn::Lead(mut baton)) => {
                    baton.armed = false;
                    queue.splice(0..0, std::mem::take(&mut baton.group));
                }
                Err(Turn::Answer(_)) => {}
            }
        }
    }
}

impl RedisStore {
    /// Decides one queueable item on `key`: at once if no call is in flight on
    /// it, else queued behind that call (the module's head says how).
    pub(super) async fn decide_queued(
        &self,
        key: &SlotKey,
        item: Item<'static>,
    ) -> Result<Decision, RedisError> {
        let mut baton = match self.queues.join(&key.key, item) {
            Joined::Lead(baton) => baton,
            Joined::Wait(turn) => match turn.await {
                Ok(Turn::Answer(answer)) => return answer,
                Ok(Turn::Lead(baton)) => baton,
                // The call that carried it was dropped with its caller:
                // whether Redis ran it is unknown, as on a deadline.
                Err(_) => return Err(RedisError::Timeout(super::millis(self.options.timeout))),
            },
        };
        if baton.group.is_empty() {
            let result = self.run_script(&[key], &[item]).await;
            drop(baton);
            return result;
        }
        let group = std::mem::take(&mut baton.group);
        let mut items: SmallVec<[Item<'static>; 8]> = SmallVec::with_capacity(group.len() + 1);
        items.push(item);
        items.extend(group.iter().map(|waiter| waiter.item));
        let decided = self.run_queue(key, &items).await;
        // The next call may go while these answers are handed out.
        drop(baton);
        match decided {
            Ok(decisions) => {
                let mut decisions = decisions.into_iter();
                let own = decisions.next();
                for (waiter, decision) in group.into_iter().zip(decisions) {
                    // A caller that left needs no answer.
                    let _ = waiter.turn.send(Turn::Answer(Ok(decision)));
                }
                own.ok_or_else(|| RedisError::Reply("no verdict for the first decision".into()))
            }
            Err(error) => {
                for waiter in group {
                    let _ = waiter.turn.send(Turn::Answer(Err(error.clone())));
                }
                Err(error)
            }
        }
    }

    /// One call of the queue form of `items`' script, all on `key`, and
    /// the engine's decision for each, in turn, on the state it read.
    async fn run_queue(
        &self,
        key: &SlotKey,
        items: &[Item<'static>],
    ) -> Result<Vec<Decision>, RedisError> {
        let injected = self.injected_now_ms();
        let mut invocation = self.scripts.for_items(items).prepare_invoke();
        invocation.key(self.key(&key.key).as_ref());
        invocation.arg(injected).arg("q");
        for item in items {
            kinds::own_arguments(&mut invocation, item);
        }
        // Observed on its own (`decide_queue`): each decision it carries is
        // observed as a `decide`, its wait in the queue included.
        let started = self.options.observer.as_ref().map(|_| Instant::now());
        let value = self.connection.invoke(&invocation).await;
        self.observe("decide_queue", started, value.is_ok());
        let reply = codec::queue_reply(value?)?;
        if reply.granted.len() != items.len() {
            return Err(RedisError::Reply(format!(
                "{} verdicts for {} queued decisions",
                reply.granted.len(),
                items.len()
            )));
        }
        let mut state: [Slot; 1] = [codec::slot(key.kind, reply.before.as_deref(), reply.now)?];
        items
            .iter()
            .zip(reply.granted)
            .map(|(item, granted)| {
                let decision = engine::decide(std::slice::from_ref(item), &mut state, reply.now);
                if decision.granted == granted {
                    Ok(decision)
                } else {
                    tracing::error!(
                        script = granted,
                        engine = decision.granted,
                        "the Redis script and the engine decided a queued decision differently"
                    );
                    Err(RedisError::Reply("script and engine disagree".into()))
                }
            })
            .collect()
    }
}

/// The one item of a batch that may wait in its key's queue: the batch's
/// only item, on its only key, of a kind whose script has a queue form.
pub(super) fn queueable<'b>(
    slots: &'b [SlotKey],
    items: &[Item<'_>],
) -> Option<(&'b SlotKey, Item<'static>)> {
    match (slots, items) {
        ([key], [item]) if item.slot() == 0 => Some((key, kinds::queued(item)?)),
        _ => None,
    }
}
