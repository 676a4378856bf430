//! The lifecycle of one VVM: acquisition over slots `1..=N`, services, the write-once problem
//! and the fixed shutdown order. It embeds a [`Leadership`] and forwards store replies and lease
//! timers to it. The table is the same as in `specs/lifecycle.md`.
//!
//! | # | state | event | guard | next | effects |
//! |---|---|---|---|---|---|
//! | V1 | Provided | Launch | | Acquiring(1) | Insert(1) |
//! | V2 | Acquiring(k) | reply → Acquired(token) | | StartingServices | …, StartServices(token) |
//! | V3 | Acquiring(k) | reply → NotAcquired | k < N | Acquiring(k+1) | NotAcquired, Insert(k+1) |
//! | V4 | Acquiring(N) | reply → NotAcquired | now < until | RoundWait | NotAcquired, SetTimer(Round, min(now+round, until)) |
//! | V5 | Acquiring(N) | reply → NotAcquired | now ≥ until | Idle | NotAcquired, ProblemRaised(AcquisitionFailed) |
//! | V6 | RoundWait | Timer(Round) | | Acquiring(1) | Insert(1) |
//! | V7 | StartingServices | ServicesStarted | | Running | Running(token) if still leading |
//! | V8 | StartingServices | ServiceFailed(i) | | Running | ProblemRaised(ServiceStartFailed(i)) |
//! | V9 | Running | ServiceFailed(i) | | Running | ProblemRaised(ServiceFailed(i)) |
//! | V10 | any launched | reply / lease timer → Lost | | same | Lost, CompareAndDelete, ProblemRaised(LeadershipLost) (first problem only) |
//! | V11 | StartingServices, Running | Shutdown | | StoppingServices | StopServices |
//! | V12 | Acquiring, RoundWait, Idle | Shutdown | | as V13 / V14 / V15 | |
//! | V13 | StoppingServices | ServicesStopped | lease held, nothing in flight | CleaningElections | MonitorStopped, CompareAndDelete |
//! | V14 | StoppingServices | ServicesStopped | nothing held, nothing in flight | Shutdown | MonitorStopped, Released, Finished(problem) |
//! | V15 | StoppingServices | ServicesStopped | store op in flight | StoppingMonitor | MonitorStopped (the leadership releases after the reply) |
//! | V16 | StoppingMonitor | reply | | CleaningElections, or Shutdown | the leadership's release: CompareAndDelete, or Released + Finished(problem) |
//! | V17 | CleaningElections | reply → Released | | Shutdown | Released, Finished(problem) |
//! | V18 | ShuttingDown, Shutdown | Shutdown | | same | — |
//!
//! Only the first problem is kept ([`Problem`] is write-once); services keep running after a
//! loss until the host shuts the VVM down — the killer ends the process at the deadline anyway.

use core::time::Duration;

use statig::prelude::*;

use crate::config::VvmConfig;
use crate::effect::{
    Effect, Effects, FencingToken, Incarnation, OpId, Problem, Reply, Slot, TimerId, TimerKind,
};
use crate::leadership::{Leadership, LeaseEvent, LeaseState, Notices};
use crate::time::Instant;

/// An input of [`Lifecycle`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum VvmEvent {
    /// Start acquiring leadership. Only the first is acted on.
    Launch {
        /// Current time.
        now: Instant,
    },
    /// Shut down: services, then the leadership monitor, then the release.
    Shutdown {
        /// Current time.
        now: Instant,
    },
    /// A timer set by [`Effect::SetTimer`] fired.
    Timer {
        /// Current time.
        now: Instant,
        /// Which timer.
        timer: TimerId,
    },
    /// A store operation finished.
    Reply {
        /// Current time.
        now: Instant,
        /// The operation.
        op: OpId,
        /// Its outcome.
        reply: Reply,
    },
    /// Every service started and reported ready.
    ServicesStarted {
        /// Current time.
        now: Instant,
    },
    /// Service `index` (in start order) failed, while starting or later.
    ServiceFailed {
        /// Current time.
        now: Instant,
        /// Position in the start order.
        index: u16,
    },
    /// Every service has stopped.
    ServicesStopped {
        /// Current time.
        now: Instant,
    },
}

impl VvmEvent {
    /// The time the event carries.
    pub const fn now(&self) -> Instant {
        match *self {
            VvmEvent::Launch { now }
            | VvmEvent::Shutdown { now }
            | VvmEvent::Timer { now, .. }
            | VvmEvent::Reply { now, .. }
            | VvmEvent::ServicesStarted { now }
            | VvmEvent::ServiceFailed { now, .. }
            | VvmEvent::ServicesStopped { now } => now,
        }
    }
}

/// Where a VVM is in its life, for callers that only need a summary.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Phase {
    /// Not launched.
    Provided,
    /// Walking the slots (or waiting between rounds).
    AcquiringLeadership,
    /// Leadership held; services starting.
    StartingServices,
    /// Leadership held (or lost, see the problem) and services started.
    Running,
    /// Launch ended without services (acquisition failed).
    Idle,
    /// Shutdown: waiting for the services to stop.
    StoppingServices,
    /// Shutdown: waiting for an in-flight lease operation before releasing.
    StoppingMonitor,
    /// Shutdown: compare-and-delete of our record in flight.
    CleaningElections,
    /// Done.
    Shutdown,
}

/// Shared storage of the statig machine.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Shared {
    slots: u32,
    acquisition: Duration,
    round_interval: Duration,
    leadership: Leadership,
    problem: Option<Problem>,
    seq: u64,
}

/// The lifecycle of one VVM. Pure: feed it [`VvmEvent`]s, execute the [`Effect`]s it writes.
///
/// ```
/// use vvm_core::*;
///
/// let config = VvmConfig::builder("10.0.0.1:7000").build().unwrap();
/// let mut vvm = Lifecycle::new(&config, Incarnation(3));
/// let mut out = Effects::new();
/// vvm.handle(&VvmEvent::Launch { now: Instant::ZERO }, &mut out);
/// out.clear();
/// vvm.handle(&VvmEvent::Shutdown { now: Instant::ZERO }, &mut out);
/// // The insert is still in flight: the release waits for its reply.
/// assert_eq!(vvm.phase(), Phase::StoppingMonitor);
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Lifecycle {
    machine: InitializedStateMachine<Shared>,
}

// Model checkers fingerprint states by hash; equal machines (same shared data, same state) hash
// equally, which is all `Hash` must agree with `Eq` on.
impl core::hash::Hash for Lifecycle {
    fn hash<H: core::hash::Hasher>(&self, state: &mut H) {
        self.machine.inner().hash(state);
        self.machine.state().hash(state);
    }
}

impl Lifecycle {
    /// A provided, not yet launched VVM of `incarnation`.
    pub fn new(config: &VvmConfig, incarnation: Incarnation) -> Self {
        let shared = Shared {
            slots: config.slots(),
            acquisition: config.acquisition(),
            round_interval: config.round_interval(),
            leadership: Leadership::new(*config.lease(), incarnation),
            problem: None,
            seq: 0,
        };
        let machine = shared
            .uninitialized_state_machine()
            .init_with_context(&mut Effects::new());
        Lifecycle { machine }
    }

    /// Handles one event, appending the resulting effects to `out`.
    // Never inlined: one copy of the machine, and a clear boundary for instruction counts.
    #[inline(never)]
    pub fn handle(&mut self, event: &VvmEvent, out: &mut Effects) {
        let problem_before = self.problem();
        self.machine.handle_with_context(event, out);
        // Write-once: a problem, once set, never changes.
        debug_assert!(problem_before.is_none() || problem_before == self.problem());
    }

    /// The first problem, if any.
    pub fn problem(&self) -> Option<Problem> {
        self.machine.inner().problem
    }

    /// The embedded leadership machine.
    pub fn leadership(&self) -> &Leadership {
        &self.machine.inner().leadership
    }

    /// The current fencing token, while leading.
    pub fn token(&self) -> Option<FencingToken> {
        self.leadership().token()
    }

    /// The current state.
    pub fn state(&self) -> &VvmState {
        self.machine.state()
    }

    /// A summary of the current state.
    pub fn phase(&self) -> Phase {
        match self.machine.state() {
            State::Provided {} => Phase::Provided,
            State::Acquiring { .. } | State::RoundWait { .. } => Phase::AcquiringLeadership,
            State::StartingServices { .. } => Phase::StartingServices,
            State::Running {} => Phase::Running,
            State::Idle {} => Phase::Idle,
            State::StoppingServices {} => Phase::StoppingServices,
            State::StoppingMonitor {} => Phase::StoppingMonitor,
            State::CleaningElections {} => Phase::CleaningElections,
            State::Shutdown {} => Phase::Shutdown,
        }
    }
}

/// The statig machine. Its generated `State` enum is re-exported as [`VvmState`]; each variant
/// is the state of the same name in the table above.
mod states {
    #![allow(missing_docs)]
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
        fn forward(&mut self, event: &LeaseEvent, out: &mut Effects) -> Notices {
            let notices = self.leadership.handle_noting(event, out);
            if let Some((slot, reason)) = notices.lost {
                self.raise(Problem::LeadershipLost { slot, reason }, out);
            }
            notices
        }

        /// Forwards replies and lease timers; everything else is not for the leadership.
        fn forward_vvm(&mut self, event: &VvmEvent, out: &mut Effects) -> Notices {
            match *event {
                VvmEvent::Reply { now, op, reply } => {
                    self.forward(&LeaseEvent::Reply { now, op, reply }, out)
                }
                VvmEvent::Timer { now, timer } if timer.kind == TimerKind::Lease => {
                    self.forward(&LeaseEvent::Timer { now, timer }, out)
                }
                _ => Notices::default(),
            }
        }

        fn acquire(
            &mut self,
            slot: Slot,
            until: Instant,
            now: Instant,
            out: &mut Effects,
        ) -> Outcome<State> {
            self.forward(&LeaseEvent::Acquire { now, slot }, out);
            Transition(State::acquiring(slot, until))
        }

        /// Slot `slot` was not won: try the next one, wait for the next round, or give up.
        fn next_slot(
            &mut self,
            slot: Slot,
            until: Instant,
            now: Instant,
            out: &mut Effects,
        ) -> Outcome<State> {
            if slot.0 < self.slots {
                return self.acquire(Slot(slot.0 + 1), until, now, out);
            }
            if now >= until {
                self.raise(Problem::AcquisitionFailed, out);
                return Transition(State::idle());
            }
            self.seq += 1;
            let timer = TimerId {
                kind: TimerKind::Round,
                seq: self.seq,
            };
            let at = core::cmp::min(now + self.round_interval, until);
            out.push(Effect::SetTimer { timer, at });
            Transition(State::round_wait(until, timer))
        }

        /// Services are down: stop renewing once nothing is in flight, then release.
        fn stop_monitor(&mut self, now: Instant, out: &mut Effects) -> Outcome<State> {
            out.push(Effect::MonitorStopped);
            let notices = self.forward(&LeaseEvent::Release { now }, out);
            self.releasing(notices, out)
        }

        /// Where shutdown stands once the release was asked: finished when the leadership
        /// reported `Released`; cleaning the elections while its compare-and-delete is in
        /// flight; otherwise still waiting for the monitor's last operation (an insert or a
        /// renewal sent before the shutdown), after which the leadership releases by itself.
        fn releasing(&mut self, notices: Notices, out: &mut Effects) -> Outcome<State> {
            if notices.released {
                return self.finish(out);
            }
            if matches!(self.leadership.state(), LeaseState::Releasing { .. }) {
                Transition(State::cleaning_elections())
            } else {
                Transition(State::stopping_monitor())
            }
        }

        /// Shutdown in progress: a second shutdown is a no-op; a service failing while it is
        /// being stopped is still a problem. (A plain helper rather than a statig superstate:
        /// the hierarchy walk on every transition costs more than the event's own work.)
        fn while_shutting_down(&mut self, event: &VvmEvent, out: &mut Effects) -> Outcome<State> {
            if let VvmEvent::ServiceFailed { index, .. } = *event {
                self.raise(Problem::ServiceFailed { index }, out);
            }
            Handled
        }

        fn finish(&mut self, out: &mut Effects) -> Outcome<State> {
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
        fn provided(&mut self, context: &mut Effects, event: &VvmEvent) -> Outcome<State> {
            match *event {
                VvmEvent::Launch { now } => {
                    self.acquire(Slot(1), now + self.acquisition, now, context)
                }
                _ => Handled,
            }
        }

        /// Trying `slot`; acquisition ends at `until`.
        #[state]
        fn acquiring(
            &mut self,
            context: &mut Effects,
            slot: &Slot,
            until: &Instant,
            event: &VvmEvent,
        ) -> Outcome<State> {
            match *event {
                VvmEvent::Shutdown { now } => self.stop_monitor(now, context),
                _ => {
                    let notices = self.forward_vvm(event, context);
                    if let Some(token) = notices.acquired {
                        context.push(Effect::StartServices { token });
                        return Transition(State::starting_services(token));
                    }
                    if notices.not_acquired {
                        return self.next_slot(*slot, *until, event.now(), context);
                    }
                    Handled
                }
            }
        }

        /// Every slot was tried; waiting for the next round.
        #[state]
        fn round_wait(
            &mut self,
            context: &mut Effects,
            until: &Instant,
            timer: &TimerId,
            event: &VvmEvent,
        ) -> Outcome<State> {
            match *event {
                VvmEvent::Shutdown { now } => self.stop_monitor(now, context),
                VvmEvent::Timer { now, timer: fired } if fired == *timer => {
                    self.acquire(Slot(1), *until, now, context)
                }
                _ => Handled,
            }
        }

        /// Leadership held; services starting.
        #[state]
        fn starting_services(
            &mut self,
            context: &mut Effects,
            token: &FencingToken,
            event: &VvmEvent,
        ) -> Outcome<State> {
            match *event {
                VvmEvent::ServicesStarted { .. } => {
                    // The tenure may have moved on (renewals) while services started; if it was
                    // lost meanwhile, the problem is already raised and launch is not "running".
                    let _ = token;
                    if let Some(token) = self.leadership.token() {
                        context.push(Effect::Running { token });
                    }
                    Transition(State::running())
                }
                VvmEvent::ServiceFailed { index, .. } => {
                    self.raise(Problem::ServiceStartFailed { index }, context);
                    Transition(State::running())
                }
                VvmEvent::Shutdown { .. } => {
                    context.push(Effect::StopServices);
                    Transition(State::stopping_services())
                }
                _ => {
                    self.forward_vvm(event, context);
                    Handled
                }
            }
        }

        /// Services started (or failed to start: see the problem).
        #[state]
        fn running(&mut self, context: &mut Effects, event: &VvmEvent) -> Outcome<State> {
            match *event {
                VvmEvent::ServiceFailed { index, .. } => {
                    self.raise(Problem::ServiceFailed { index }, context);
                    Handled
                }
                VvmEvent::Shutdown { .. } => {
                    context.push(Effect::StopServices);
                    Transition(State::stopping_services())
                }
                _ => {
                    self.forward_vvm(event, context);
                    Handled
                }
            }
        }

        /// Launch ended without leadership; nothing runs.
        #[state]
        fn idle(&mut self, context: &mut Effects, event: &VvmEvent) -> Outcome<State> {
            match *event {
                VvmEvent::Shutdown { now } => self.stop_monitor(now, context),
                _ => {
                    self.forward_vvm(event, context);
                    Handled
                }
            }
        }

        /// Waiting for the services to stop.
        #[state]
        fn stopping_services(&mut self, context: &mut Effects, event: &VvmEvent) -> Outcome<State> {
            match *event {
                VvmEvent::ServicesStopped { now } => self.stop_monitor(now, context),
                VvmEvent::Reply { .. } | VvmEvent::Timer { .. } => {
                    self.forward_vvm(event, context);
                    Handled
                }
                _ => self.while_shutting_down(event, context),
            }
        }

        /// The monitor is stopped (no new renewal will be sent) but an operation it sent before
        /// is still in flight; the release follows its reply.
        #[state]
        fn stopping_monitor(&mut self, context: &mut Effects, event: &VvmEvent) -> Outcome<State> {
            match *event {
                VvmEvent::Reply { .. } | VvmEvent::Timer { .. } => {
                    let notices = self.forward_vvm(event, context);
                    self.releasing(notices, context)
                }
                _ => self.while_shutting_down(event, context),
            }
        }

        /// Compare-and-delete of our record in flight.
        #[state]
        fn cleaning_elections(
            &mut self,
            context: &mut Effects,
            event: &VvmEvent,
        ) -> Outcome<State> {
            match *event {
                VvmEvent::Reply { .. } => {
                    let notices = self.forward_vvm(event, context);
                    self.releasing(notices, context)
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
}

pub use states::State as VvmState;
use states::State;
