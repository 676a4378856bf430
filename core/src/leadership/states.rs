//! The statig machine. Its generated `State` enum is re-exported as [`LeaseState`]; each
//! variant is the state of the same name in the table above, carrying that state's data.
#![allow(missing_docs)] // statig generates the `State` enum; its variants are the states documented above.

use super::*;

impl Shared {
    fn next_op(&mut self) -> OpId {
        self.seq += 1;
        OpId(self.seq)
    }

    fn next_timer(&mut self) -> TimerId {
        self.seq += 1;
        TimerId {
            kind: TimerKind::Lease,
            seq: self.seq,
        }
    }

    /// A write was confirmed at `sent_at`: the only place the deadline moves later.
    #[allow(clippy::too_many_arguments)]
    fn confirmed(
        &mut self,
        slot: Slot,
        revision: Revision,
        pending: Pending,
        first: bool,
        now: Instant,
        out: &mut Ctx<'_>,
    ) -> Outcome<State> {
        if pending.release {
            // A release was asked before this write was confirmed: nobody acts under this
            // lease any more, so the deadline is not extended (an earlier one, if any, stays).
            return self.delete(slot, revision, true, out);
        }
        let deadline = self.lease.deadline_after(pending.sent_at);
        if now >= deadline {
            // The confirmation came too late (the process was paused): the lease it proves
            // must not be acted on any more, so no token is handed out. A won insert is left
            // to expire (less than 0.2·L); a renewed lease is given up.
            if first {
                return self.not_acquired(slot, Refusal::DeadlinePassed, pending, out);
            }
            let held = Held {
                slot,
                revision,
                anchor: pending.sent_at,
                deadline,
            };
            return self.lose(held, LossReason::DeadlinePassed, false, out);
        }
        out.push(Effect::ArmKiller { at: deadline });
        let token = FencingToken { slot, revision };
        if first {
            out.notices.acquired = Some(token);
            out.push(Effect::Acquired { token });
        } else {
            out.push(Effect::Renewed { token });
        }
        let timer = self.next_timer();
        let at = self.lease.renew_at(pending.sent_at);
        out.push(Effect::SetTimer { timer, at });
        let held = Held {
            slot,
            revision,
            anchor: pending.sent_at,
            deadline,
        };
        Transition(State::holding(held, timer))
    }

    fn delete(
        &mut self,
        slot: Slot,
        expected: Revision,
        notify: bool,
        out: &mut Ctx<'_>,
    ) -> Outcome<State> {
        let op = self.next_op();
        out.push(Effect::CompareAndDelete { op, slot, expected });
        Transition(State::releasing(slot, op, notify))
    }

    fn not_acquired(
        &mut self,
        slot: Slot,
        refusal: Refusal,
        pending: Pending,
        out: &mut Ctx<'_>,
    ) -> Outcome<State> {
        out.notices.not_acquired = true;
        out.push(Effect::NotAcquired { slot, refusal });
        if pending.release {
            out.notices.released = true;
            out.push(Effect::Released {
                slot: Some(slot),
                deleted: false,
            });
        }
        Transition(State::idle())
    }

    /// Leadership ended without a release. The record is left to expire: services may still
    /// run until they stop or the killer fires, and deleting it would let a successor start
    /// beside them. A release asked meanwhile finishes at once, having deleted nothing.
    fn lose(
        &mut self,
        held: Held,
        reason: LossReason,
        release: bool,
        out: &mut Ctx<'_>,
    ) -> Outcome<State> {
        out.notices.lost = Some((held.slot, reason));
        out.push(Effect::Lost {
            slot: held.slot,
            reason,
        });
        if release {
            out.notices.released = true;
            out.push(Effect::Released {
                slot: Some(held.slot),
                deleted: false,
            });
        }
        Transition(State::idle())
    }

    fn renew(
        &mut self,
        held: Held,
        failures: u8,
        now: Instant,
        out: &mut Ctx<'_>,
    ) -> Outcome<State> {
        let mut held = held;
        // The guard may only lower the deadline: an unconfirmed attempt never extends it.
        if let Some(guard) = self.lease.guarded(now, held.deadline) {
            held.deadline = guard;
            out.push(Effect::ArmKiller { at: guard });
        }
        let op = self.next_op();
        out.push(Effect::CompareAndSwap {
            op,
            slot: held.slot,
            expected: held.revision,
            ttl: self.lease.lease(),
        });
        let pending = Pending {
            op,
            sent_at: now,
            release: false,
        };
        Transition(State::renewing(held, pending, failures))
    }

    /// An attempt brought no confirmation: retry after the backoff while the retry's answer
    /// could still arrive (within its store timeout) before the kill deadline; otherwise the
    /// deadline can no longer be met and leadership is lost. `failures` counts the attempts
    /// of this streak that failed before this one.
    fn renewal_failed(
        &mut self,
        held: Held,
        pending: Pending,
        failures: u8,
        now: Instant,
        out: &mut Ctx<'_>,
    ) -> Outcome<State> {
        if pending.release {
            return self.delete(held.slot, held.revision, true, out);
        }
        let failures = failures.saturating_add(1);
        if let Some(at) = self.lease.retry_at(failures, now, held.deadline) {
            let timer = self.next_timer();
            out.push(Effect::SetTimer { timer, at });
            return Transition(State::retry_wait(held, timer, failures));
        }
        self.lose(held, LossReason::RenewalFailed, false, out)
    }

    fn get(&mut self, slot: Slot, out: &mut Ctx<'_>) -> OpId {
        let op = self.next_op();
        out.push(Effect::Get { op, slot });
        op
    }
}

#[state_machine(
    initial = "State::idle()",
    state(derive(Clone, Copy, Debug, PartialEq, Eq, Hash))
)]
impl Shared {
    /// Nothing held, tried or in flight.
    #[state]
    fn idle(&mut self, context: &mut Ctx<'_>, event: &LeaseEvent) -> Outcome<State> {
        match *event {
            LeaseEvent::Acquire { now, slot } => {
                let op = self.next_op();
                context.push(Effect::Insert {
                    op,
                    slot,
                    ttl: self.lease.lease(),
                });
                let pending = Pending {
                    op,
                    sent_at: now,
                    release: false,
                };
                Transition(State::inserting(slot, pending))
            }
            LeaseEvent::Release { .. } => {
                context.notices.released = true;
                context.push(Effect::Released {
                    slot: None,
                    deleted: false,
                });
                Handled
            }
            _ => Handled,
        }
    }

    /// Insert in flight.
    #[state]
    fn inserting(
        &mut self,
        context: &mut Ctx<'_>,
        slot: &Slot,
        pending: &mut Pending,
        event: &LeaseEvent,
    ) -> Outcome<State> {
        match *event {
            LeaseEvent::Release { .. } => {
                pending.release = true;
                Handled
            }
            LeaseEvent::Reply { now, op, reply } if op == pending.op => match reply {
                Reply::Written(revision) => {
                    self.confirmed(*slot, revision, *pending, true, now, context)
                }
                Reply::Rejected => self.not_acquired(*slot, Refusal::Held, *pending, context),
                Reply::Held(left) => {
                    // The lifecycle times its next try by the holder's expiry.
                    context.notices.left = Some(left);
                    self.not_acquired(*slot, Refusal::Held, *pending, context)
                }
                Reply::Unknown => {
                    let op = self.get(*slot, context);
                    Transition(State::insert_resolving(*slot, Pending { op, ..*pending }))
                }
                Reply::Failed | Reply::Deleted | Reply::Found(_) => {
                    self.not_acquired(*slot, Refusal::StoreFailed, *pending, context)
                }
            },
            _ => Handled,
        }
    }

    /// Insert outcome unknown; `Get` in flight to read it back.
    #[state]
    fn insert_resolving(
        &mut self,
        context: &mut Ctx<'_>,
        slot: &Slot,
        pending: &mut Pending,
        event: &LeaseEvent,
    ) -> Outcome<State> {
        match *event {
            LeaseEvent::Release { .. } => {
                pending.release = true;
                Handled
            }
            LeaseEvent::Reply { now, op, reply } if op == pending.op => match reply {
                // Ours, but not necessarily from this attempt: an earlier insert of this
                // process may have landed late, earlier than this one was sent, and so expire
                // earlier. Claim it with a compare-and-swap and count from that send.
                Reply::Found(Some(record)) if record.incarnation == self.incarnation => {
                    if pending.release {
                        // Nobody will act under it: delete exactly that record.
                        return self.delete(*slot, record.revision, true, context);
                    }
                    let op = self.next_op();
                    context.push(Effect::CompareAndSwap {
                        op,
                        slot: *slot,
                        expected: record.revision,
                        ttl: self.lease.lease(),
                    });
                    let claim = Pending {
                        op,
                        sent_at: now,
                        release: false,
                    };
                    Transition(State::claiming(*slot, record.revision, claim))
                }
                Reply::Found(Some(_)) => self.not_acquired(*slot, Refusal::Held, *pending, context),
                _ => self.not_acquired(*slot, Refusal::StoreFailed, *pending, context),
            },
            _ => Handled,
        }
    }

    /// Insert read back as ours: compare-and-swap in flight to claim it.
    #[state]
    fn claiming(
        &mut self,
        context: &mut Ctx<'_>,
        slot: &Slot,
        found: &Revision,
        pending: &mut Pending,
        event: &LeaseEvent,
    ) -> Outcome<State> {
        match *event {
            LeaseEvent::Release { .. } => {
                pending.release = true;
                Handled
            }
            LeaseEvent::Reply { now, op, reply } if op == pending.op => match reply {
                Reply::Written(revision) if revision > *found => {
                    self.confirmed(*slot, revision, *pending, true, now, context)
                }
                Reply::Rejected => self.not_acquired(*slot, Refusal::Held, *pending, context),
                // Failed, unknown again, or a store breaking its contract: give up this try;
                // a record of ours, if any, expires by itself.
                _ => self.not_acquired(*slot, Refusal::StoreFailed, *pending, context),
            },
            _ => Handled,
        }
    }

    /// Leading, waiting for the renew timer.
    #[state]
    fn holding(
        &mut self,
        context: &mut Ctx<'_>,
        held: &Held,
        timer: &TimerId,
        event: &LeaseEvent,
    ) -> Outcome<State> {
        match *event {
            LeaseEvent::Timer { now, timer: fired } if fired == *timer => {
                self.renew(*held, 0, now, context)
            }
            // Nothing in flight: a release deletes our record at once.
            LeaseEvent::Release { .. } => self.delete(held.slot, held.revision, true, context),
            // The record is gone or another's: no renewal can succeed (L26).
            LeaseEvent::Vanished { .. } => self.lose(*held, LossReason::Overtaken, false, context),
            _ => Handled,
        }
    }

    /// Leading, compare-and-swap in flight.
    #[state]
    fn renewing(
        &mut self,
        context: &mut Ctx<'_>,
        held: &Held,
        pending: &mut Pending,
        failures: &u8,
        event: &LeaseEvent,
    ) -> Outcome<State> {
        match *event {
            LeaseEvent::Release { .. } => {
                pending.release = true;
                Handled
            }
            // The swap in flight cannot succeed on a record that is gone or another's; its
            // reply is stale from now on (L26). A release asked finishes by that reply (L26a).
            LeaseEvent::Vanished { .. } if !pending.release => {
                self.lose(*held, LossReason::Overtaken, false, context)
            }
            LeaseEvent::Reply { now, op, reply } if op == pending.op => match reply {
                Reply::Written(revision) if revision > held.revision => {
                    self.confirmed(held.slot, revision, *pending, false, now, context)
                }
                Reply::Rejected => {
                    self.lose(*held, LossReason::Overtaken, pending.release, context)
                }
                Reply::Unknown => {
                    let op = self.get(held.slot, context);
                    Transition(State::renew_resolving(
                        *held,
                        Pending { op, ..*pending },
                        *failures,
                    ))
                }
                // A store that returns a revision not above ours broke its contract: nothing
                // about the write can be trusted, so it counts as a failed attempt.
                Reply::Written(_)
                | Reply::Failed
                | Reply::Deleted
                | Reply::Found(_)
                | Reply::Held(_) => self.renewal_failed(*held, *pending, *failures, now, context),
            },
            _ => Handled,
        }
    }

    /// Leading, renewal outcome unknown; `Get` in flight to read it back.
    #[state]
    fn renew_resolving(
        &mut self,
        context: &mut Ctx<'_>,
        held: &Held,
        pending: &mut Pending,
        failures: &u8,
        event: &LeaseEvent,
    ) -> Outcome<State> {
        match *event {
            LeaseEvent::Release { .. } => {
                pending.release = true;
                Handled
            }
            LeaseEvent::Vanished { .. } if !pending.release => {
                self.lose(*held, LossReason::Overtaken, false, context)
            }
            LeaseEvent::Reply { now, op, reply } if op == pending.op => match reply {
                Reply::Found(Some(record)) if record.incarnation == self.incarnation => {
                    if record.revision > held.revision {
                        // A renewal of ours committed, but which one and when is unknown: an
                        // earlier attempt may have landed late. Nothing is confirmed; the
                        // next attempt (after the backoff, like any failed one) swaps from
                        // the revision found.
                        let held = Held {
                            revision: record.revision,
                            ..*held
                        };
                        self.renewal_failed(held, *pending, *failures, now, context)
                    } else {
                        self.renewal_failed(*held, *pending, *failures, now, context)
                    }
                }
                Reply::Found(_) => {
                    self.lose(*held, LossReason::Overtaken, pending.release, context)
                }
                _ => self.renewal_failed(*held, *pending, *failures, now, context),
            },
            _ => Handled,
        }
    }

    /// Leading, waiting to retry a failed renewal.
    #[state]
    fn retry_wait(
        &mut self,
        context: &mut Ctx<'_>,
        held: &Held,
        timer: &TimerId,
        failures: &u8,
        event: &LeaseEvent,
    ) -> Outcome<State> {
        match *event {
            LeaseEvent::Timer { now, timer: fired } if fired == *timer => {
                self.renew(*held, *failures, now, context)
            }
            // Nothing in flight: a release deletes our record at once.
            LeaseEvent::Release { .. } => self.delete(held.slot, held.revision, true, context),
            LeaseEvent::Vanished { .. } => self.lose(*held, LossReason::Overtaken, false, context),
            _ => Handled,
        }
    }

    /// Compare-and-delete of our record in flight: a release, asked after every service stopped.
    #[state]
    fn releasing(
        &mut self,
        context: &mut Ctx<'_>,
        slot: &Slot,
        op: &OpId,
        notify: &mut bool,
        event: &LeaseEvent,
    ) -> Outcome<State> {
        match *event {
            LeaseEvent::Release { .. } => {
                *notify = true;
                Handled
            }
            LeaseEvent::Reply {
                op: replied, reply, ..
            } if replied == *op => {
                if *notify {
                    context.notices.released = true;
                    context.notices.deleted = reply == Reply::Deleted;
                    context.push(Effect::Released {
                        slot: Some(*slot),
                        deleted: reply == Reply::Deleted,
                    });
                }
                Transition(State::idle())
            }
            _ => Handled,
        }
    }
}
