//! The statig machine. Its generated `State` enum is re-exported as [`SessionState`]; each
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

    /// Creates the record of a new session under a fresh id (S1).
    fn create(&mut self, now: Instant, out: &mut Ctx<'_>) -> Outcome<State> {
        self.sessions += 1;
        let id = SessionId(self.sessions);
        let op = self.next_op();
        out.push(SessionEffect::Create {
            op,
            id,
            ttl: self.lease.lease(),
        });
        let pending = Pending {
            op,
            sent_at: now,
            release: false,
        };
        Transition(State::opening(id, pending))
    }

    /// A write was confirmed at `pending.sent_at`: the only place the deadline moves later.
    fn confirmed(
        &mut self,
        id: SessionId,
        revision: Revision,
        pending: Pending,
        first: bool,
        now: Instant,
        out: &mut Ctx<'_>,
    ) -> Outcome<State> {
        if pending.release {
            // A close was asked before this write was confirmed: no holding is attached and
            // none may be, so the deadline is not extended.
            return self.delete(id, revision, out);
        }
        let deadline = self.lease.deadline_after(pending.sent_at);
        let live = Liveness {
            id,
            revision,
            anchor: pending.sent_at,
            deadline,
        };
        if now >= deadline {
            // Confirmed too late (the process was paused): the session it proves must not be
            // acted under any more. The record is left to expire.
            if first {
                return self.not_opened(id, OpenRefusal::DeadlinePassed, pending, out);
            }
            return self.lose(live, LossReason::DeadlinePassed, false, out);
        }
        out.push(SessionEffect::ArmKiller { at: deadline });
        out.push(if first {
            SessionEffect::Opened { id, revision }
        } else {
            SessionEffect::KeptAlive { id, revision }
        });
        let timer = self.next_timer();
        let at = self.lease.renew_at(pending.sent_at);
        out.push(SessionEffect::SetTimer { timer, at });
        Transition(State::alive(live, timer))
    }

    fn delete(&mut self, id: SessionId, expected: Revision, out: &mut Ctx<'_>) -> Outcome<State> {
        let op = self.next_op();
        out.push(SessionEffect::Delete { op, id, expected });
        Transition(State::closing(id, op))
    }

    fn not_opened(
        &mut self,
        id: SessionId,
        refusal: OpenRefusal,
        pending: Pending,
        out: &mut Ctx<'_>,
    ) -> Outcome<State> {
        out.push(SessionEffect::NotOpened { id, refusal });
        if pending.release {
            out.push(SessionEffect::Closed {
                id: Some(id),
                deleted: false,
            });
        }
        Transition(State::closed())
    }

    /// The session ended without a close, and every holding with it. The record is left to
    /// expire: the holdings' services may run until they stop or the killer fires. A close
    /// asked meanwhile (possible only without holdings) finishes at once, having deleted
    /// nothing.
    fn lose(
        &mut self,
        live: Liveness,
        reason: LossReason,
        release: bool,
        out: &mut Ctx<'_>,
    ) -> Outcome<State> {
        if out.holdings == 0 {
            // S32: nothing attached, nothing acting: no deadline to keep.
            out.push(SessionEffect::DisarmKiller);
        }
        out.push(SessionEffect::Lost {
            id: live.id,
            reason,
            holdings: out.holdings,
        });
        if release {
            out.push(SessionEffect::Closed {
                id: Some(live.id),
                deleted: false,
            });
            return Transition(State::closed());
        }
        Transition(State::lost(live.id, reason))
    }

    fn keep_alive(
        &mut self,
        live: Liveness,
        failures: u8,
        now: Instant,
        out: &mut Ctx<'_>,
    ) -> Outcome<State> {
        let mut live = live;
        if let Some(guard) = self.lease.guarded(now, live.deadline) {
            live.deadline = guard;
            out.push(SessionEffect::ArmKiller { at: guard });
        }
        let op = self.next_op();
        out.push(SessionEffect::KeepAlive {
            op,
            id: live.id,
            expected: live.revision,
            ttl: self.lease.lease(),
        });
        let pending = Pending {
            op,
            sent_at: now,
            release: false,
        };
        Transition(State::keeping_alive(live, pending, failures))
    }

    /// A keepalive brought no confirmation: retry while the retry's answer could still arrive
    /// before the kill deadline, otherwise the session is lost.
    fn keepalive_failed(
        &mut self,
        live: Liveness,
        pending: Pending,
        failures: u8,
        now: Instant,
        out: &mut Ctx<'_>,
    ) -> Outcome<State> {
        if pending.release {
            return self.delete(live.id, live.revision, out);
        }
        let failures = failures.saturating_add(1);
        if let Some(at) = self.lease.retry_at(failures, now, live.deadline) {
            let timer = self.next_timer();
            out.push(SessionEffect::SetTimer { timer, at });
            return Transition(State::retry_wait(live, timer, failures));
        }
        self.lose(live, LossReason::RenewalFailed, false, out)
    }

    fn get(&mut self, id: SessionId, out: &mut Ctx<'_>) -> OpId {
        let op = self.next_op();
        out.push(SessionEffect::Get { op, id });
        op
    }

    /// `Close` while nothing is in flight: delete the record unless holdings are attached.
    fn close(&mut self, live: Liveness, out: &mut Ctx<'_>) -> Outcome<State> {
        if out.holdings > 0 {
            return refuse_close(live.id, out);
        }
        self.delete(live.id, live.revision, out)
    }
}

/// `Close` with holdings attached: deleting the record would free what their services may
/// still act on.
fn refuse_close(id: SessionId, out: &mut Ctx<'_>) -> Outcome<State> {
    let holdings = out.holdings;
    out.push(SessionEffect::CloseRefused { id, holdings });
    Handled
}

/// `Close` while a call is in flight: noted, and acted on when the reply comes.
fn close_later(id: SessionId, pending: &mut Pending, out: &mut Ctx<'_>) -> Outcome<State> {
    if out.holdings > 0 {
        return refuse_close(id, out);
    }
    pending.release = true;
    Handled
}

#[state_machine(
    initial = "State::closed()",
    state(derive(Clone, Copy, Debug, PartialEq, Eq, Hash))
)]
impl Shared {
    /// No session open, tried or in flight.
    #[state]
    fn closed(&mut self, context: &mut Ctx<'_>, event: &SessionEvent) -> Outcome<State> {
        match *event {
            SessionEvent::Open { now } => self.create(now, context),
            SessionEvent::Close { .. } => {
                context.push(SessionEffect::Closed {
                    id: None,
                    deleted: false,
                });
                Handled
            }
            _ => Handled,
        }
    }

    /// Create in flight.
    #[state]
    fn opening(
        &mut self,
        context: &mut Ctx<'_>,
        id: &SessionId,
        pending: &mut Pending,
        event: &SessionEvent,
    ) -> Outcome<State> {
        match *event {
            SessionEvent::Close { .. } => close_later(*id, pending, context),
            SessionEvent::Reply { now, op, reply } if op == pending.op => match reply {
                Reply::Written(revision) => {
                    self.confirmed(*id, revision, *pending, true, now, context)
                }
                Reply::Rejected | Reply::Held(_) => {
                    self.not_opened(*id, OpenRefusal::Taken, *pending, context)
                }
                Reply::Unknown => {
                    let op = self.get(*id, context);
                    Transition(State::open_resolving(*id, Pending { op, ..*pending }))
                }
                Reply::Failed | Reply::Deleted | Reply::Found(_) => {
                    self.not_opened(*id, OpenRefusal::StoreFailed, *pending, context)
                }
            },
            _ => Handled,
        }
    }

    /// Create outcome unknown; `Get` in flight to read it back.
    #[state]
    fn open_resolving(
        &mut self,
        context: &mut Ctx<'_>,
        id: &SessionId,
        pending: &mut Pending,
        event: &SessionEvent,
    ) -> Outcome<State> {
        match *event {
            SessionEvent::Close { .. } => close_later(*id, pending, context),
            SessionEvent::Reply { now, op, reply } if op == pending.op => match reply {
                // The id is fresh and this machine sent one create for it: a record of ours
                // under it is that create's, written no earlier than it was sent.
                Reply::Found(Some(record)) if record.incarnation == self.incarnation => {
                    self.confirmed(*id, record.revision, *pending, true, now, context)
                }
                Reply::Found(Some(_)) => {
                    self.not_opened(*id, OpenRefusal::Taken, *pending, context)
                }
                _ => self.not_opened(*id, OpenRefusal::StoreFailed, *pending, context),
            },
            _ => Handled,
        }
    }

    /// Alive, waiting for the keepalive timer.
    #[state]
    fn alive(
        &mut self,
        context: &mut Ctx<'_>,
        live: &Liveness,
        timer: &TimerId,
        event: &SessionEvent,
    ) -> Outcome<State> {
        match *event {
            SessionEvent::Timer { now, timer: fired } if fired == *timer => {
                self.keep_alive(*live, 0, now, context)
            }
            SessionEvent::Close { .. } => self.close(*live, context),
            _ => Handled,
        }
    }

    /// Alive, keepalive in flight.
    #[state]
    fn keeping_alive(
        &mut self,
        context: &mut Ctx<'_>,
        live: &Liveness,
        pending: &mut Pending,
        failures: &u8,
        event: &SessionEvent,
    ) -> Outcome<State> {
        match *event {
            SessionEvent::Close { .. } => close_later(live.id, pending, context),
            SessionEvent::Reply { now, op, reply } if op == pending.op => match reply {
                // Not above ours is allowed: a store may keep the record's revision across a
                // keepalive (etcd's lease keepalive writes no key).
                Reply::Written(revision) if revision >= live.revision => {
                    self.confirmed(live.id, revision, *pending, false, now, context)
                }
                Reply::Rejected => {
                    self.lose(*live, LossReason::Overtaken, pending.release, context)
                }
                Reply::Unknown => {
                    let op = self.get(live.id, context);
                    Transition(State::keep_resolving(
                        *live,
                        Pending { op, ..*pending },
                        *failures,
                    ))
                }
                // A revision below ours breaks the store's contract: a failed attempt.
                Reply::Written(_)
                | Reply::Failed
                | Reply::Deleted
                | Reply::Found(_)
                | Reply::Held(_) => self.keepalive_failed(*live, *pending, *failures, now, context),
            },
            _ => Handled,
        }
    }

    /// Alive, keepalive outcome unknown; `Get` in flight to read it back.
    #[state]
    fn keep_resolving(
        &mut self,
        context: &mut Ctx<'_>,
        live: &Liveness,
        pending: &mut Pending,
        failures: &u8,
        event: &SessionEvent,
    ) -> Outcome<State> {
        match *event {
            SessionEvent::Close { .. } => close_later(live.id, pending, context),
            SessionEvent::Reply { now, op, reply } if op == pending.op => match reply {
                Reply::Found(Some(record)) if record.incarnation == self.incarnation => {
                    // A keepalive of ours committed, but which one and when is unknown: an
                    // earlier attempt may have landed late. Nothing is confirmed; the retry
                    // swaps from the revision found.
                    let live = Liveness {
                        revision: live.revision.max(record.revision),
                        ..*live
                    };
                    self.keepalive_failed(live, *pending, *failures, now, context)
                }
                Reply::Found(_) => {
                    self.lose(*live, LossReason::Overtaken, pending.release, context)
                }
                _ => self.keepalive_failed(*live, *pending, *failures, now, context),
            },
            _ => Handled,
        }
    }

    /// Alive, waiting to retry a failed keepalive.
    #[state]
    fn retry_wait(
        &mut self,
        context: &mut Ctx<'_>,
        live: &Liveness,
        timer: &TimerId,
        failures: &u8,
        event: &SessionEvent,
    ) -> Outcome<State> {
        match *event {
            SessionEvent::Timer { now, timer: fired } if fired == *timer => {
                self.keep_alive(*live, *failures, now, context)
            }
            SessionEvent::Close { .. } => self.close(*live, context),
            _ => Handled,
        }
    }

    /// Delete of our record in flight.
    #[state]
    fn closing(
        &mut self,
        context: &mut Ctx<'_>,
        id: &SessionId,
        op: &OpId,
        event: &SessionEvent,
    ) -> Outcome<State> {
        match *event {
            SessionEvent::Reply {
                op: replied, reply, ..
            } if replied == *op => {
                let deleted = reply == Reply::Deleted;
                if deleted {
                    context.push(SessionEffect::DisarmKiller);
                }
                context.push(SessionEffect::Closed {
                    id: Some(*id),
                    deleted,
                });
                Transition(State::closed())
            }
            _ => Handled,
        }
    }

    /// Lost; the record is left to expire, holdings are detached one by one as their services
    /// stop.
    #[state]
    fn lost(
        &mut self,
        context: &mut Ctx<'_>,
        id: &SessionId,
        reason: &LossReason,
        event: &SessionEvent,
    ) -> Outcome<State> {
        // Kept for inspection through `state()`.
        let _ = reason;
        match *event {
            SessionEvent::Open { now } => {
                if context.holdings > 0 {
                    context.push(SessionEffect::NotOpened {
                        id: *id,
                        refusal: OpenRefusal::HoldingsRemain,
                    });
                    return Handled;
                }
                self.create(now, context)
            }
            SessionEvent::Close { .. } => {
                if context.holdings > 0 {
                    return refuse_close(*id, context);
                }
                context.push(SessionEffect::Closed {
                    id: Some(*id),
                    deleted: false,
                });
                Transition(State::closed())
            }
            _ => Handled,
        }
    }
}
