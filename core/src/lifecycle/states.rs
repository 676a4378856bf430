//! The statig machine. Its generated `State` enum is re-exported as [`VvmState`]; each variant
//! is the state of the same name in the table above.
#![allow(missing_docs)] // statig generates the `State` enum; its variants are the states documented above.

use super::*;

impl Shared {
    fn raise(&mut self, problem: Problem, out: &mut Effects) {
        if self.problem.is_none() {
            self.problem = Some(problem);
            out.push(Effect::ProblemRaised { problem });
        }
    }

    /// Hands an event to the leadership machine and reads what it reported. A loss becomes
    /// the problem here, whatever state the lifecycle is in.
    // Always inlined, as it was before a lifecycle could hold a session's holding: the branch
    // to the holding grew it past the inliner's threshold, which cost a whole life ≈ 24
    // instructions per event (callgrind, `scripts/callgrind-core.sh`).
    #[inline(always)]
    fn forward(&mut self, event: &LeaseEvent, cx: &mut Cx<'_>) -> Notices {
        let notices = cx.lead(event);
        self.noted(notices, cx.out)
    }

    /// What the lifecycle keeps of the leadership's notices, whichever way they were produced.
    fn noted(&mut self, notices: Notices, out: &mut Effects) -> Notices {
        self.armed |= notices.acquired.is_some();
        if let Some((slot, reason)) = notices.lost {
            self.lost = true;
            self.raise(Problem::LeadershipLost { slot, reason }, out);
        }
        notices
    }

    /// The session was lost: hands the loss to the holding (only a lifecycle on a session gets
    /// here, see `Lifecycle::handle`), which loses a holding it holds (H10) or notes it for an
    /// acquire in flight (H9).
    fn session_lost(&mut self, now: Instant, reason: LossReason, cx: &mut Cx<'_>) -> Notices {
        self.lost = true;
        let notices = match &mut cx.holding {
            Some(holding) => {
                holding.handle_noting(&HoldingEvent::SessionLost { now, reason }, cx.out)
            }
            None => Notices::default(),
        };
        self.noted(notices, cx.out)
    }

    /// Forwards replies and lease timers; everything else is not for the leadership. An event
    /// the leadership already handled on the fast path (see `Lifecycle::handle`) is not
    /// handed to it again: its notices come with the context.
    fn forward_vvm(&mut self, event: &VvmEvent, cx: &mut Cx<'_>) -> Notices {
        if let Some(notices) = cx.handled.take() {
            return self.noted(notices, cx.out);
        }
        match lease_event(event) {
            Some(event) => self.forward(&event, cx),
            None => Notices::default(),
        }
    }

    fn acquire(
        &mut self,
        slot: Slot,
        until: Instant,
        round: Round,
        now: Instant,
        cx: &mut Cx<'_>,
    ) -> Outcome<State> {
        self.forward(&LeaseEvent::Acquire { now, slot }, cx);
        Transition(State::acquiring(slot, until, round))
    }

    /// Slot `slot` was not won (`left`: the refusing record's time left, if told): try the
    /// next one, start the next round, wait for it, or give up.
    fn next_slot(
        &mut self,
        slot: Slot,
        until: Instant,
        round: Round,
        left: Option<Duration>,
        now: Instant,
        cx: &mut Cx<'_>,
    ) -> Outcome<State> {
        let mut round = round;
        round.refused(now, left);
        if self.on_session && self.lost {
            // No acquire can succeed on a lost session; an own one is opened anew while the
            // acquisition lasts (V20a), a shared one is its owner's (V20).
            return self.session_gone(until, now, cx.out);
        }
        if slot.0 < self.slots {
            return self.acquire(Slot(slot.0 + 1), until, round, now, cx);
        }
        if now >= until {
            self.raise(Problem::AcquisitionFailed, cx.out);
            return Transition(State::idle());
        }
        if round.changed {
            // A record changed since the feed was subscribed, perhaps after its slot was
            // tried: look again now rather than at an expiry that may no longer exist.
            return self.acquire(Slot(1), until, Round::default(), now, cx);
        }
        self.seq += 1;
        let timer = TimerId {
            kind: TimerKind::Round,
            seq: self.seq,
        };
        let at = round.next_try(now, self.round_interval, until);
        cx.out.push(Effect::SetTimer { timer, at });
        Transition(State::round_wait(until, timer))
    }

    /// The session was lost while campaigning, holding nothing and with nothing in flight: ask
    /// for a fresh one while the acquisition lasts and the session is this VVM's own (V20a,
    /// V21a), end the acquisition otherwise (V20, V21).
    fn session_gone(&mut self, until: Instant, now: Instant, out: &mut Effects) -> Outcome<State> {
        if self.reopens && now < until {
            out.push(Effect::OpenSession { until });
            return Transition(State::reopening_session(until));
        }
        self.raise(Problem::AcquisitionFailed, out);
        Transition(State::idle())
    }

    /// Services are down: stop renewing once nothing is in flight, then release.
    fn stop_monitor(&mut self, now: Instant, cx: &mut Cx<'_>) -> Outcome<State> {
        cx.out.push(Effect::MonitorStopped);
        let notices = self.forward(&LeaseEvent::Release { now }, cx);
        self.releasing(notices, cx)
    }

    /// Where shutdown stands once the release was asked: finished when the leadership
    /// reported `Released`; cleaning the elections while its compare-and-delete is in
    /// flight; otherwise still waiting for the monitor's last operation (an insert or a
    /// renewal sent before the shutdown), after which the leadership releases by itself.
    fn releasing(&mut self, notices: Notices, cx: &mut Cx<'_>) -> Outcome<State> {
        if notices.released {
            return self.finish(notices.deleted, cx.out);
        }
        if cx.releasing() {
            Transition(State::cleaning_elections())
        } else {
            Transition(State::stopping_monitor())
        }
    }

    /// The services ended without being asked to (their pipeline vanished): that is a
    /// problem, and whatever they left behind cannot be vouched for.
    fn services_vanished(&mut self, out: &mut Effects) -> Outcome<State> {
        self.services_clean = false;
        self.raise(Problem::ServicesVanished, out);
        Transition(State::running())
    }

    /// Forwards a reply, a lease timer or the store's word that the record vanished while
    /// services run; a loss stops them at once (V10, V6b).
    fn forward_while_serving(&mut self, event: &VvmEvent, cx: &mut Cx<'_>) -> Outcome<State> {
        let notices = match *event {
            // A loss of the session is a loss of the holding (V22).
            VvmEvent::SessionLost { now, reason } => self.session_lost(now, reason, cx),
            _ => self.forward_vvm(event, cx),
        };
        if notices.lost.is_some() {
            // No token is valid any more and the killer ends the process at the deadline
            // anyway: stopping now gives the services the rest of the margin to stop cleanly.
            cx.out.push(Effect::StopServices);
            return Transition(State::stopping_services());
        }
        Handled
    }

    /// Shutdown in progress: a second shutdown is a no-op; a service failing while it is
    /// being stopped is still a problem. (A plain helper rather than a statig superstate:
    /// the hierarchy walk on every transition costs more than the event's own work.)
    fn while_shutting_down(&mut self, event: &VvmEvent, cx: &mut Cx<'_>) -> Outcome<State> {
        if let VvmEvent::ServiceFailed { index, .. } = *event {
            self.raise(Problem::ServiceFailed { index }, cx.out);
        }
        Handled
    }

    /// Shutdown is complete. The kill deadline is removed only when nothing of this VVM can
    /// act any more for certain: every service returned by itself and our record was deleted
    /// (a loss never deletes it, so a loss always keeps the deadline).
    ///
    /// On a session the deadline is the session's: `DisarmKiller` then says that this VVM
    /// vouches for nothing acting any more — every service returned by itself and nothing was
    /// lost — so its driver may close the session cleanly (the session disarms only once its
    /// own delete is confirmed). Whether the holding's delete was confirmed does not matter
    /// there: a holding left behind is the session's, deleted with it (V26).
    fn finish(&mut self, deleted: bool, out: &mut Effects) -> Outcome<State> {
        let clean = if self.on_session {
            self.services_clean && !self.lost
        } else {
            self.armed && deleted && self.services_clean
        };
        if clean {
            out.push(Effect::DisarmKiller);
        }
        out.push(Effect::Finished {
            problem: self.problem,
        });
        Transition(State::shutdown())
    }
}

#[state_machine(
    initial = "State::provided()",
    state(derive(Clone, Copy, Debug, PartialEq, Eq, Hash))
)]
impl Shared {
    /// Not launched.
    #[state]
    fn provided(&mut self, context: &mut Cx<'_>, event: &VvmEvent) -> Outcome<State> {
        match *event {
            VvmEvent::Launch { now } => {
                let until = now + self.acquisition;
                self.acquire(Slot(1), until, Round::default(), now, context)
            }
            _ => Handled,
        }
    }

    /// Trying `slot`; acquisition ends at `until`; `round` is what this round learned.
    #[state]
    fn acquiring(
        &mut self,
        context: &mut Cx<'_>,
        slot: &Slot,
        until: &Instant,
        round: &mut Round,
        event: &VvmEvent,
    ) -> Outcome<State> {
        match *event {
            VvmEvent::Shutdown { now } => self.stop_monitor(now, context),
            // The insert in flight stays the only one; the round ends with a fresh one (V4a).
            VvmEvent::SlotChanged { .. } => {
                round.changed = true;
                Handled
            }
            // The acquire in flight wins nothing any more; its reply ends acquisition (V19, V20).
            VvmEvent::SessionLost { now, reason } => {
                self.session_lost(now, reason, context);
                Handled
            }
            _ => {
                let notices = self.forward_vvm(event, context);
                if let Some(token) = notices.acquired {
                    context.out.push(Effect::StartServices { token });
                    return Transition(State::starting_services(token));
                }
                if notices.not_acquired {
                    let now = event.now();
                    return self.next_slot(*slot, *until, *round, notices.left, now, context);
                }
                Handled
            }
        }
    }

    /// Every slot was tried; waiting for the next round.
    #[state]
    fn round_wait(
        &mut self,
        context: &mut Cx<'_>,
        until: &Instant,
        timer: &TimerId,
        event: &VvmEvent,
    ) -> Outcome<State> {
        match *event {
            VvmEvent::Shutdown { now } => self.stop_monitor(now, context),
            VvmEvent::Timer { now, timer: fired } if fired == *timer => {
                self.acquire(Slot(1), *until, Round::default(), now, context)
            }
            // A slot's record changed: try again now rather than at the round timer, whose
            // later firing no longer matches a state and is ignored.
            VvmEvent::SlotChanged { now } => {
                self.acquire(Slot(1), *until, Round::default(), now, context)
            }
            // Nothing in flight and nothing held: a fresh session, or the end (V21a, V21).
            VvmEvent::SessionLost { now, reason } => {
                self.session_lost(now, reason, context);
                self.session_gone(*until, now, context.out)
            }
            _ => Handled,
        }
    }

    /// The own session was lost while campaigning; the driver opens a fresh one until `until`.
    #[state]
    fn reopening_session(
        &mut self,
        context: &mut Cx<'_>,
        until: &Instant,
        event: &VvmEvent,
    ) -> Outcome<State> {
        match *event {
            // Nothing held, nothing in flight (V29).
            VvmEvent::Shutdown { now } => self.stop_monitor(now, context),
            // A fresh session: the loss was the old one's (V27).
            VvmEvent::SessionOpened { now } => {
                self.lost = false;
                self.acquire(Slot(1), *until, Round::default(), now, context)
            }
            // None opened in time (V28).
            VvmEvent::SessionLost { .. } => {
                self.raise(Problem::AcquisitionFailed, context.out);
                Transition(State::idle())
            }
            _ => Handled,
        }
    }

    /// Leadership held; services starting.
    #[state]
    fn starting_services(
        &mut self,
        context: &mut Cx<'_>,
        token: &FencingToken,
        event: &VvmEvent,
    ) -> Outcome<State> {
        match *event {
            VvmEvent::ServicesStarted { .. } => {
                // The tenure may have moved on (renewals) while services started; if it was
                // lost meanwhile, the problem is already raised and launch is not "running".
                let _ = token;
                if let Some(token) = context.token() {
                    context.out.push(Effect::Running { token });
                }
                Transition(State::running())
            }
            VvmEvent::ServiceFailed { index, .. } => {
                self.raise(Problem::ServiceStartFailed { index }, context.out);
                Transition(State::running())
            }
            VvmEvent::Shutdown { .. } => {
                context.out.push(Effect::StopServices);
                Transition(State::stopping_services())
            }
            VvmEvent::ServicesStopped { .. } => self.services_vanished(context.out),
            _ => self.forward_while_serving(event, context),
        }
    }

    /// Services started (or failed to start: see the problem).
    #[state]
    fn running(&mut self, context: &mut Cx<'_>, event: &VvmEvent) -> Outcome<State> {
        match *event {
            VvmEvent::ServiceFailed { index, .. } => {
                self.raise(Problem::ServiceFailed { index }, context.out);
                Handled
            }
            VvmEvent::Shutdown { .. } => {
                context.out.push(Effect::StopServices);
                Transition(State::stopping_services())
            }
            VvmEvent::ServicesStopped { .. } => self.services_vanished(context.out),
            _ => self.forward_while_serving(event, context),
        }
    }

    /// Launch ended without leadership; nothing runs.
    #[state]
    fn idle(&mut self, context: &mut Cx<'_>, event: &VvmEvent) -> Outcome<State> {
        match *event {
            VvmEvent::Shutdown { now } => self.stop_monitor(now, context),
            VvmEvent::SessionLost { now, reason } => {
                self.session_lost(now, reason, context);
                Handled
            }
            _ => {
                self.forward_vvm(event, context);
                Handled
            }
        }
    }

    /// Waiting for the services to stop.
    #[state]
    fn stopping_services(&mut self, context: &mut Cx<'_>, event: &VvmEvent) -> Outcome<State> {
        match *event {
            VvmEvent::ServicesStopped { now, clean } => {
                self.services_clean &= clean;
                self.stop_monitor(now, context)
            }
            // A loss while the services stop is noted (V10a, V6e); they are stopping already.
            VvmEvent::Reply { .. } | VvmEvent::Timer { .. } | VvmEvent::RecordVanished { .. } => {
                self.forward_vvm(event, context);
                Handled
            }
            VvmEvent::SessionLost { now, reason } => {
                self.session_lost(now, reason, context);
                Handled
            }
            _ => self.while_shutting_down(event, context),
        }
    }

    /// The monitor is stopped (no new renewal will be sent) but an operation it sent before
    /// is still in flight; the release follows its reply.
    #[state]
    fn stopping_monitor(&mut self, context: &mut Cx<'_>, event: &VvmEvent) -> Outcome<State> {
        match *event {
            VvmEvent::Reply { .. } | VvmEvent::Timer { .. } => {
                let notices = self.forward_vvm(event, context);
                self.releasing(notices, context)
            }
            // Only noted: the acquire in flight is released after its reply (H9, H4).
            VvmEvent::SessionLost { now, reason } => {
                self.session_lost(now, reason, context);
                Handled
            }
            _ => self.while_shutting_down(event, context),
        }
    }

    /// Compare-and-delete of our record in flight.
    #[state]
    fn cleaning_elections(&mut self, context: &mut Cx<'_>, event: &VvmEvent) -> Outcome<State> {
        match *event {
            VvmEvent::Reply { .. } => {
                let notices = self.forward_vvm(event, context);
                self.releasing(notices, context)
            }
            // The delete in flight finishes (H13); the loss is noted for the finish.
            VvmEvent::SessionLost { now, reason } => {
                self.session_lost(now, reason, context);
                Handled
            }
            _ => self.while_shutting_down(event, context),
        }
    }

    /// Done; every event is ignored.
    #[state]
    fn shutdown(event: &VvmEvent) -> Outcome<State> {
        let _ = event;
        Handled
    }
}
