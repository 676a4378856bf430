//! The statig machine. Its generated `State` enum is re-exported as [`HoldingState`]; each
//! variant is the state of the same name in the table above, carrying that state's data.
#![allow(missing_docs)] // statig generates the `State` enum; its variants are the states documented above.

use super::*;

impl Shared {
    fn next_op(&mut self) -> OpId {
        self.seq += 1;
        OpId(self.seq)
    }

    fn delete(&mut self, slot: Slot, expected: Revision, cx: &mut Ctx<'_>) -> Outcome<State> {
        let op = self.next_op();
        cx.push(Effect::CompareAndDelete { op, slot, expected });
        Transition(State::releasing(slot, op))
    }

    fn not_acquired(
        &mut self,
        slot: Slot,
        refusal: Refusal,
        acquire: Acquire,
        cx: &mut Ctx<'_>,
    ) -> Outcome<State> {
        cx.notices.not_acquired = true;
        cx.push(Effect::NotAcquired { slot, refusal });
        if acquire.release {
            cx.notices.released = true;
            cx.push(Effect::Released {
                slot: Some(slot),
                deleted: false,
            });
        }
        Transition(State::idle())
    }
}

#[state_machine(
    initial = "State::idle()",
    state(derive(Clone, Copy, Debug, PartialEq, Eq, Hash))
)]
impl Shared {
    /// Nothing held, tried or in flight.
    #[state]
    fn idle(&mut self, context: &mut Ctx<'_>, event: &HoldingEvent) -> Outcome<State> {
        match *event {
            HoldingEvent::Acquire { slot, .. } => {
                let op = self.next_op();
                context.push(Effect::Insert {
                    op,
                    slot,
                    ttl: core::time::Duration::ZERO,
                });
                let acquire = Acquire {
                    op,
                    release: false,
                    lost: false,
                };
                Transition(State::acquiring(slot, acquire))
            }
            HoldingEvent::Release { .. } => {
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

    /// The session's acquire of `slot` in flight.
    #[state]
    fn acquiring(
        &mut self,
        context: &mut Ctx<'_>,
        slot: &Slot,
        acquire: &mut Acquire,
        event: &HoldingEvent,
    ) -> Outcome<State> {
        match *event {
            HoldingEvent::Release { .. } => {
                acquire.release = true;
                Handled
            }
            HoldingEvent::SessionLost { .. } => {
                acquire.lost = true;
                Handled
            }
            HoldingEvent::Reply { op, reply, .. } if op == acquire.op => match reply {
                // Nobody will act under it: delete exactly that record.
                Reply::Written(revision) if acquire.release => {
                    self.delete(*slot, revision, context)
                }
                // Written, but the session was lost meanwhile: the holding died with it, so no
                // token is handed out; the record goes with the session.
                Reply::Written(_) if acquire.lost => {
                    self.not_acquired(*slot, Refusal::StoreFailed, *acquire, context)
                }
                Reply::Written(revision) => {
                    let token = FencingToken {
                        slot: *slot,
                        revision,
                    };
                    context.notices.acquired = Some(token);
                    context.push(Effect::Acquired { token });
                    Transition(State::holding(*slot, revision))
                }
                Reply::Rejected | Reply::Held(_) => {
                    self.not_acquired(*slot, Refusal::Held, *acquire, context)
                }
                // The runtime resent an unknown acquire already (it is idempotent); whatever it
                // may have written is the session's.
                Reply::Failed | Reply::Unknown | Reply::Deleted | Reply::Found(_) => {
                    self.not_acquired(*slot, Refusal::StoreFailed, *acquire, context)
                }
            },
            _ => Handled,
        }
    }

    /// Held at `revision`: the fencing token. Nothing to renew; the session keeps it alive.
    #[state]
    fn holding(
        &mut self,
        context: &mut Ctx<'_>,
        slot: &Slot,
        revision: &Revision,
        event: &HoldingEvent,
    ) -> Outcome<State> {
        match *event {
            HoldingEvent::Release { .. } => self.delete(*slot, *revision, context),
            HoldingEvent::SessionLost { reason, .. } => {
                // The record is left to the session: it went (or goes) with the session's, and
                // services may still run until they stop or the session's killer fires.
                context.notices.lost = Some((*slot, reason));
                context.push(Effect::Lost {
                    slot: *slot,
                    reason,
                });
                Transition(State::idle())
            }
            HoldingEvent::Vanished { .. } => {
                // Removed from outside while the session lives (H15): nobody may act under
                // it any more, and there is nothing of ours left to delete.
                let reason = LossReason::Overtaken;
                context.notices.lost = Some((*slot, reason));
                context.push(Effect::Lost {
                    slot: *slot,
                    reason,
                });
                Transition(State::idle())
            }
            _ => Handled,
        }
    }

    /// The release's compare-and-delete in flight.
    #[state]
    fn releasing(
        &mut self,
        context: &mut Ctx<'_>,
        slot: &Slot,
        op: &OpId,
        event: &HoldingEvent,
    ) -> Outcome<State> {
        match *event {
            HoldingEvent::Reply {
                op: replied, reply, ..
            } if replied == *op => {
                let deleted = reply == Reply::Deleted;
                context.notices.released = true;
                context.notices.deleted = deleted;
                context.push(Effect::Released {
                    slot: Some(*slot),
                    deleted,
                });
                Transition(State::idle())
            }
            _ => Handled,
        }
    }
}
