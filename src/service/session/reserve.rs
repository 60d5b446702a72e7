//! `reserve`: copies for a domain, all or the most that fit between a
//! minimum and what was asked, added to the session's hold set; with a
//! `max_wait`, in the queue of reserves waiting for copies
//! (docs/design.md#waiting-for-a-copy) until they fit or the wait is over.

use tokio::time::Instant;

use crate::engine::copies::{CopyLimits, canonical_groups};
use crate::store::copies::Reserved;

use crate::service::core::Target;
use crate::service::error::{Error, Kind};
use crate::service::ops::{CopyContext, Held, Reserve, ReserveAnswer};
use crate::service::waiting::{POLL, Place};

use super::{MAX_HOLDS, Session};

impl Session {
    pub(super) async fn reserve(&self, op: &Reserve) -> Result<ReserveAnswer, Error> {
        if op.max_wait.is_zero() {
            return self.reserve_now(op, None).await;
        }
        let deadline = Instant::now() + op.max_wait;
        let waiting = &self.service.waiting;
        let join = || {
            waiting.join(&op.at, op.criticality).map_err(|_| {
                Error::new(
                    Kind::TooMany,
                    format!(
                        "{} reserves already wait for `{}` of domain `{}`: try later",
                        crate::service::waiting::MAX_WAITERS,
                        op.at.resource,
                        op.at.domain
                    ),
                )
            })
        };
        // Waiting for anyone's result: answered `done` once the count of
        // work done on its key moves past what it is now.
        let done_before = if op.for_anyone {
            Some(self.done_count(op).await?)
        } else {
            None
        };
        // Behind those already waiting, unless it is more critical.
        let mut place: Option<Place> = None;
        if waiting.has_waiters(&op.at) {
            place = Some(join()?);
        }
        loop {
            // A session that ended leaves every queue at once: nothing is
            // granted to it, and its place goes to the next live waiter.
            if self.has_ended() {
                return Err(self.ended_error());
            }
            if place.as_ref().is_none_or(Place::is_head) {
                // The head's try answers `done` itself, atomically with the
                // grant: no release as done can fall between a look at the
                // count and the try.
                let answer = self.reserve_now(op, done_before).await?;
                if answer.done || answer.granted > 0 || Instant::now() >= deadline {
                    // Leaving the queue hands the head to the next.
                    return Ok(answer);
                }
            } else if let Some(before) = done_before
                && self.done_count(op).await? > before
            {
                return Ok(ReserveAnswer {
                    done: true,
                    ..ReserveAnswer::default()
                });
            }
            let Some(waiter) = &place else {
                place = Some(join()?);
                continue;
            };
            tokio::select! {
                () = waiter.woken() => {}
                () = tokio::time::sleep(POLL) => {}
                () = self.ended() => return Err(self.ended_error()),
                () = tokio::time::sleep_until(deadline) => {
                    drop(place);
                    // At its deadline: one last try, answered as it comes.
                    return self.reserve_now(op, done_before).await;
                }
            }
        }
    }

    async fn done_count(&self, op: &Reserve) -> Result<u64, Error> {
        let membership = self.serving(&op.at.namespace, &op.at.resource)?;
        self.service
            .copies
            .done_count(op.at.at())
            .await
            .map_err(|error| self.copy_error(&membership, error))
    }

    /// One try at the store; with `done_past`, answered `done` instead if
    /// the count of work done has moved past it.
    async fn reserve_now(
        &self,
        op: &Reserve,
        done_past: Option<u64>,
    ) -> Result<ReserveAnswer, Error> {
        let at = &op.at;
        let (limits, decide_with) = match self.service.target(&at.namespace, &at.resource)? {
            Target::Copies(namespace, resource) => {
                let limits = CopyLimits::for_domain(&resource, &at.domain);
                let decide_with = if namespace.settings.ignore_configured {
                    CopyLimits::unlimited(limits.groups.clone())
                } else {
                    limits.clone()
                };
                (Some(limits), decide_with)
            }
            Target::Rate(..) => {
                return Err(Error::new(
                    Kind::WrongKind,
                    format!(
                        "resource `{}` is rate-limited: use request, not reserve",
                        at.resource
                    ),
                ));
            }
            Target::Capacity(..) => {
                return Err(Error::new(
                    Kind::WrongKind,
                    format!(
                        "resource `{}` is a leased capacity: use GetCapacity, not reserve",
                        at.resource
                    ),
                ));
            }
            Target::Unconfigured(_) => (None, CopyLimits::unlimited(Vec::new())),
        };
        let key = Held {
            at: at.clone(),
            groups: canonical_groups(decide_with.group_names()),
        };
        {
            let holds = self.holds();
            if holds.held.len() >= MAX_HOLDS && !holds.held.contains_key(&key) {
                return Err(Error::new(
                    Kind::TooMany,
                    format!(
                        "this session already holds {MAX_HOLDS} distinct (resource, domain, groups)"
                    ),
                ));
            }
        }
        let membership = self.serving(&at.namespace, &at.resource)?;
        let reserved = self
            .service
            .copies
            .reserve(
                self.contributor(&membership),
                key.at.at(),
                &decide_with,
                op.copies,
                op.min_copies,
                done_past,
            )
            .await
            .map_err(|error| self.copy_error(&membership, error))?;
        let changed = match reserved {
            Reserved::Decided(changed) => changed,
            Reserved::Done => {
                return Ok(ReserveAnswer {
                    done: true,
                    ..ReserveAnswer::default()
                });
            }
        };
        let groups: Vec<String> = decide_with.group_names().map(str::to_owned).collect();
        if changed.copies > 0 {
            self.hold(key, changed.copies);
        }
        Ok(ReserveAnswer {
            granted: changed.copies,
            groups,
            retry_after_ms: (changed.copies > 0).then_some(0),
            context: CopyContext {
                limits,
                counts: changed.counts,
            },
            done: false,
        })
    }
}
