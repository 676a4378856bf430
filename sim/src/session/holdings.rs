//! The holdings of a process as the runtime drives them (`runtime/src/session/`): attached
//! before their acquire, the acquire sent again on an unknown outcome, services started with
//! the holding's revision as token, told to stop at the session's loss and detached only once
//! they have; a new session opened once nothing is attached.

use vvm_core::{
    FencingToken, HoldingId, SessionEffect, SessionEffects, SessionEvent, SessionId, Slot,
};

use crate::oracle::ProcessId;

use super::params::Rule;
use super::store::{Acquired, Call};
use super::{Ev, Hold, Input, SessionSim, ACQUIRE_SENDS_MAX};

impl SessionSim {
    /// After a holding was detached: a lost session with nothing attached opens anew; a
    /// stopping process closes its session once nothing is attached.
    pub(super) fn after_detach(&mut self, id: ProcessId) {
        let live = self.live(id);
        if live.session.holdings() > 0 {
            return;
        }
        if live.stopping {
            if live.holds.iter().all(|&h| h == Hold::Idle) {
                self.session_event(id, |now| SessionEvent::Close { now });
            }
        } else if live.session.is_lost() {
            self.schedule_open(id);
        }
    }

    pub(super) fn schedule_open(&mut self, id: ProcessId) {
        let round_ns = self.params.base.round_interval.as_nanos() as u64;
        let at_ns = self.now_ns + self.rng.between(0, round_ns);
        self.schedule(at_ns, Ev::Input(id, Input::Open));
    }

    pub(super) fn schedule_acquire(&mut self, id: ProcessId, slot: Slot, soon: bool) {
        let round_ns = self.params.base.round_interval.as_nanos() as u64;
        let delay_ns = if soon {
            self.rng.between(0, round_ns / 4)
        } else {
            self.rng.between(round_ns / 2, round_ns)
        };
        self.schedule(self.now_ns + delay_ns, Ev::Input(id, Input::Acquire(slot)));
    }

    /// `SessionHandle::acquire`: attach, then send the acquire.
    pub(super) fn acquire(&mut self, id: ProcessId, slot: Slot) {
        let live = self.live(id);
        let index = slot.0 as usize - 1;
        if live.stopping || live.holds[index] != Hold::Idle {
            return;
        }
        let Some(session) = live.session.liveness().map(|l| l.id) else {
            return; // the next open acquires again
        };
        let holding = HoldingId(index as u32);
        let now = self.local_now(id);
        let mut out = SessionEffects::new();
        self.live(id)
            .session
            .handle(&SessionEvent::Attach { now, holding }, &mut out);
        if out.as_slice() != [SessionEffect::Attached { holding }] {
            self.note(id, || format!("attach of slot {} refused: {out:?}", slot.0));
            return;
        }
        self.send_acquire(id, slot, session, 1);
    }

    pub(super) fn send_acquire(
        &mut self,
        id: ProcessId,
        slot: Slot,
        session: SessionId,
        sends: u8,
    ) {
        self.acquire_ops += 1;
        let op = self.acquire_ops;
        self.live(id).holds[slot.0 as usize - 1] = Hold::Acquiring {
            op,
            sends,
            id: session,
        };
        let call = Call::Acquire {
            op,
            slot,
            id: session,
        };
        self.send(id, call);
    }

    /// What the runtime's acquire does with an answer.
    pub(super) fn acquired(&mut self, id: ProcessId, slot: Slot, op: u64, acquired: Acquired) {
        let index = slot.0 as usize - 1;
        let live = self.live(id);
        let Hold::Acquiring {
            op: waited,
            sends,
            id: session,
        } = live.holds[index]
        else {
            return;
        };
        if waited != op {
            return;
        }
        match acquired {
            Acquired::Written(revision) => {
                let token = FencingToken { slot, revision };
                let alive = live.session.liveness().is_some_and(|l| l.id == session);
                live.holds[index] = Hold::Running(token);
                self.stats.acquisitions += 1;
                self.check_token_fresh(id, token);
                self.set_acting(id, slot, Some(token));
                if !alive || self.live(id).stopping {
                    // The session was lost meanwhile, or the host asked to stop: the services
                    // just handed the holding are told to stop at once.
                    self.stop_services(id, token, true);
                }
            }
            Acquired::Unknown if sends < ACQUIRE_SENDS_MAX => {
                // Idempotent per session: sent again.
                self.send_acquire(id, slot, session, sends + 1);
            }
            Acquired::Held | Acquired::SessionGone | Acquired::Failed | Acquired::Unknown => {
                live.holds[index] = Hold::Idle;
                self.detach(id, slot);
                if self.live(id).session.liveness().is_some() {
                    self.schedule_acquire(id, slot, false);
                }
                self.after_detach(id);
            }
        }
    }

    /// Tells the services acting with `token` to stop; they act until they have.
    pub(super) fn stop_services(&mut self, id: ProcessId, token: FencingToken, attached: bool) {
        let index = token.slot.0 as usize - 1;
        self.live(id).holds[index] = Hold::Stopping(token, attached);
        let slow = self.rng.chance(self.params.slow_stop_ppm);
        let delay_ns = if slow {
            self.rng.between(0, self.params.slow_stop_max_ns)
        } else {
            self.rng.between(0, self.params.base.service_delay_max_ns)
        };
        self.schedule(
            self.now_ns + delay_ns,
            Ev::Input(id, Input::Stopped(token.slot)),
        );
    }

    pub(super) fn detach(&mut self, id: ProcessId, slot: Slot) {
        let now = self.local_now(id);
        let holding = HoldingId(slot.0 - 1);
        let mut out = SessionEffects::new();
        self.live(id)
            .session
            .handle(&SessionEvent::Detach { now, holding }, &mut out);
        assert!(out.is_empty(), "detach is silent: {out:?}");
    }

    pub(super) fn set_acting(&mut self, id: ProcessId, slot: Slot, token: Option<FencingToken>) {
        let now_ns = self.now_ns;
        if let Some(token) = token {
            let index = slot.0 as usize - 1;
            if self.last_actor[index].is_some_and(|last| last != id) {
                self.stats.handovers += 1;
            }
            self.last_actor[index] = Some(id);
            self.note(id, || format!("acts on slot {} with {token:?}", slot.0));
        } else {
            self.note(id, || format!("stops acting on slot {}", slot.0));
        }
        self.oracle.observe_slot(id, slot, token, now_ns);
    }

    /// The session's one `Lost`, fanned out to every holding.
    pub(super) fn lost(&mut self, id: ProcessId) {
        self.stats.losses += 1;
        let acting = self.live(id).acting();
        self.stats.losses_while_acting += u64::from(acting);
        let detach_now = self.params.rule == Rule::DetachAtLoss;
        for index in 0..self.live(id).holds.len() {
            let slot = Slot(index as u32 + 1);
            match self.live(id).holds[index] {
                Hold::Running(token) => {
                    self.stop_services(id, token, !detach_now);
                    if detach_now {
                        // Unsound: detached before the services stopped.
                        self.detach(id, slot);
                    }
                }
                // An acquire in flight ends with its answer.
                Hold::Acquiring { .. } | Hold::Stopping(..) | Hold::Idle => {}
            }
        }
        self.after_detach(id);
    }
}
