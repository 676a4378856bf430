//! The lifecycle of one VVM: acquisition over slots `1..=N`, services, the write-once problem
//! and the fixed shutdown order. It embeds a [`Leadership`] and forwards store replies and lease
//! timers to it. The table is the same as in `specs/lifecycle.md`.
//!
//! | # | state | event | guard | next | effects |
//! |---|---|---|---|---|---|
//! | V1 | Provided | Launch | | Acquiring(1) | Insert(1) |
//! | V2 | Acquiring(k) | reply → Acquired(token) | | StartingServices | …, StartServices(token) |
//! | V3 | Acquiring(k) | reply → NotAcquired | k < N | Acquiring(k+1) | NotAcquired, Insert(k+1); the round notes the refusal (below) |
//! | V4 | Acquiring(N) | reply → NotAcquired | now < until, no change noted | RoundWait | NotAcquired, SetTimer(Round, next try) |
//! | V4a | Acquiring(N) | reply → NotAcquired | now < until, change noted | Acquiring(1), fresh round | NotAcquired, Insert(1): a record changed after the feed was subscribed, maybe after its slot was tried |
//! | V5 | Acquiring(N) | reply → NotAcquired | now ≥ until | Idle | NotAcquired, ProblemRaised(AcquisitionFailed) |
//! | V6 | RoundWait | Timer(Round) | | Acquiring(1), fresh round | Insert(1) |
//! | V6a | RoundWait | SlotChanged | | Acquiring(1), fresh round | Insert(1) (the round timer left set is stale and ignored) |
//! | V6b | every state but Acquiring and RoundWait | SlotChanged | | same | — |
//! | V6c | Acquiring | SlotChanged | | same, change noted | — |
//! | V7 | StartingServices | ServicesStarted | | Running | Running(token) if still leading |
//! | V8 | StartingServices | ServiceFailed(i) | | Running | ProblemRaised(ServiceStartFailed(i)) |
//! | V9 | Running | ServiceFailed(i) | | Running | ProblemRaised(ServiceFailed(i)) |
//! | V9a | StartingServices, Running | ServicesStopped (not asked for: the services' pipeline vanished) | | Running | ProblemRaised(ServicesVanished); the stop is not clean |
//! | V10 | StartingServices, Running | reply / lease timer → Lost | | StoppingServices | Lost, ProblemRaised(LeadershipLost), StopServices: a loss stops the services at once; the record is left to expire |
//! | V10a | StoppingServices, StoppingMonitor, CleaningElections | reply / lease timer → Lost | | same | Lost, ProblemRaised(LeadershipLost) (first problem only) |
//! | V11 | StartingServices, Running | Shutdown | | StoppingServices | StopServices |
//! | V12 | Acquiring, RoundWait, Idle | Shutdown | | as V13 / V14 / V15 | |
//! | V13 | StoppingServices | ServicesStopped(clean) | lease held, nothing in flight | CleaningElections | MonitorStopped, CompareAndDelete |
//! | V14 | StoppingServices | ServicesStopped(clean) | nothing held, nothing in flight | Shutdown | MonitorStopped, Released, Finished(problem) |
//! | V15 | StoppingServices | ServicesStopped | store op in flight | StoppingMonitor | MonitorStopped (the leadership releases after the reply) |
//! | V16 | StoppingMonitor | reply | | CleaningElections, or Shutdown | the leadership's release: CompareAndDelete, or Released + Finished(problem) as in V17 |
//! | V17 | CleaningElections | reply → Released | | Shutdown | Released, [DisarmKiller if the record was deleted and every stop was clean], Finished(problem) |
//! | V18 | ShuttingDown, Shutdown | Shutdown | | same | — |
//!
//! **When the next round starts (V4).** Each refusal of a round is noted: an insert refused
//! with the record's time left (`Held(left)`, L5a) gives that record's expiry `now + left` (the
//! store's clock counted on ours from the reply, so never earlier than the store's expiry, up to
//! the clocks' rates); a refusal without it (`Rejected`, a failed store) makes the round *blind*.
//! The next try is at `min(until, earliest expiry, now + round if blind)`, and never sooner than
//! [`EXPIRY_RETRY_MIN`] after the refusal. Besides, the store's change feed — subscribed by the
//! driver before the first insert of the round, while [`Lifecycle::watches_slots`] — starts a
//! round at once on a deletion or a new holder (V6a), also when it fired during the round
//! (V6c, V4a). So a candidate tries at the feed's change, the record's expiry or the end of the
//! acquisition, whichever comes first. For a store without a change feed the driver reports at
//! most the round interval as time left, so its candidates keep their rounds (nothing else would
//! tell them of a release); a store that tells neither is polled in rounds.
//! None of it can take a slot early: the store's insert decides every try.
//!
//! Only the first problem is kept ([`Problem`] is write-once). A loss of leadership stops the
//! services at once and, once they stopped, finishes the shutdown by itself (without deleting the
//! record, which is left to expire); the killer ends the process at the deadline if they do not
//! stop in time. The kill deadline is removed ([`Effect::DisarmKiller`]) only after a clean
//! release: every service returned by itself and the record was deleted.

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
    /// Every service has stopped, or the services ended by themselves.
    ServicesStopped {
        /// Current time.
        now: Instant,
        /// Every service returned by itself: none was aborted after its stop timeout, none
        /// panicked, none was left behind by a vanished pipeline. Only then may the kill
        /// deadline be removed after the release.
        clean: bool,
    },
    /// The store's change feed says the record of a slot changed or went away. Between rounds,
    /// the next round starts at once instead of at the round timer; during a round, the next
    /// one starts as soon as this one ends; elsewhere it is ignored. Only a hint to try sooner: the store's
    /// insert-if-not-exists still decides, so it can never take a slot early.
    SlotChanged {
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
            | VvmEvent::ServicesStopped { now, .. }
            | VvmEvent::SlotChanged { now } => now,
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

/// The shortest wait before retrying a slot whose record is about to expire: a store answering
/// "live, 0 ns left" again and again (its clock and ours disagree slightly) costs one try per
/// millisecond at most.
pub const EXPIRY_RETRY_MIN: Duration = Duration::from_millis(1);

/// What one acquisition round learned so far: it decides when the next round starts (V4).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct Round {
    /// The earliest expiry of a refusing record, on our clock.
    expiry: Option<Instant>,
    /// A slot was refused without its time left, or the store failed: the round interval applies.
    blind: bool,
    /// The change feed fired during the round (V6c).
    changed: bool,
}

impl Round {
    /// Notes the refusal of one slot at `now`; `left` is the refusing record's time left.
    fn refused(&mut self, now: Instant, left: Option<Duration>) {
        match left {
            Some(left) => {
                let at = now + left;
                self.expiry = Some(self.expiry.map_or(at, |earlier| earlier.min(at)));
            }
            None => self.blind = true,
        }
    }

    /// When the next round starts, for a round that ended at `now` without a change noted.
    fn next_try(&self, now: Instant, round_interval: Duration, until: Instant) -> Instant {
        let blind = (self.blind || self.expiry.is_none()).then(|| now + round_interval);
        let expiry = self.expiry.map(|at| at.max(now + EXPIRY_RETRY_MIN));
        let at = match (blind, expiry) {
            (Some(a), Some(b)) => a.min(b),
            (Some(a), None) | (None, Some(a)) => a,
            (None, None) => now + round_interval,
        };
        at.min(until)
    }
}

/// Shared storage of the statig machine.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Shared {
    slots: u32,
    acquisition: Duration,
    round_interval: Duration,
    problem: Option<Problem>,
    seq: u64,
    /// No service has been aborted or left running unseen (see [`VvmEvent::ServicesStopped`]).
    services_clean: bool,
    /// A lease was won, so a kill deadline was armed.
    armed: bool,
}

/// The statig context: the caller's effect buffer, the embedded leadership machine, and the
/// notices of an event the leadership already handled on the fast path (see
/// [`Lifecycle::handle`]), which the state handler takes instead of forwarding the event again.
pub struct Cx<'a> {
    out: &'a mut Effects,
    leadership: &'a mut Leadership,
    handled: Option<Notices>,
}

/// The leadership's event for a VVM event: store replies and lease timers; `None` for the rest.
#[inline]
fn lease_event(event: &VvmEvent) -> Option<LeaseEvent> {
    match *event {
        VvmEvent::Reply { now, op, reply } => Some(LeaseEvent::Reply { now, op, reply }),
        VvmEvent::Timer { now, timer } if timer.kind == TimerKind::Lease => {
            Some(LeaseEvent::Timer { now, timer })
        }
        _ => None,
    }
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
    /// Beside the statig machine rather than in its shared storage, so that the steady state
    /// reaches it without a dispatch (see [`handle`](Self::handle)); handlers get it through
    /// the context.
    leadership: Leadership,
}

// Model checkers fingerprint states by hash; equal machines (same shared data, same state) hash
// equally, which is all `Hash` must agree with `Eq` on.
impl core::hash::Hash for Lifecycle {
    fn hash<H: core::hash::Hasher>(&self, state: &mut H) {
        self.machine.inner().hash(state);
        self.machine.state().hash(state);
        self.leadership.hash(state);
    }
}

impl Lifecycle {
    /// A provided, not yet launched VVM of `incarnation`.
    pub fn new(config: &VvmConfig, incarnation: Incarnation) -> Self {
        let shared = Shared {
            slots: config.slots(),
            acquisition: config.acquisition(),
            round_interval: config.round_interval(),
            problem: None,
            seq: 0,
            services_clean: true,
            armed: false,
        };
        let mut leadership = Leadership::new(*config.lease(), incarnation);
        let machine = shared
            .uninitialized_state_machine()
            .init_with_context(&mut Cx {
                out: &mut Effects::new(),
                leadership: &mut leadership,
                handled: None,
            });
        Lifecycle {
            machine,
            leadership,
        }
    }

    /// Handles one event, appending the resulting effects to `out`.
    ///
    /// **Fast path.** While the services start, run or stop, a store reply or lease timer only
    /// concerns the leadership (V10 and V10a aside): it is handed to the leadership directly,
    /// and the lifecycle's own dispatch runs only when the leadership reported something
    /// (acquired, not acquired, lost, released). The steady state — a renewal every `L/4` —
    /// thus costs the leadership's transition and a state check, not two dispatches. When the
    /// leadership did report, the same event goes through the lifecycle's dispatch with those
    /// notices, exactly as if it had been forwarded from there.
    // Never inlined: one copy of the machine, and a clear boundary for instruction counts.
    #[inline(never)]
    pub fn handle(&mut self, event: &VvmEvent, out: &mut Effects) {
        let problem_before = self.problem();
        let mut handled = None;
        if self.serving() {
            if let Some(lease) = lease_event(event) {
                let notices = self.leadership.handle_noting(&lease, out);
                // While serving, the leadership leads or has lost (Idle): still leading after
                // the event means it reported nothing (no loss; an acquisition or a release
                // cannot happen while serving). One state check instead of comparing notices.
                if self.leadership.held().is_some() {
                    debug_assert_eq!(notices, Notices::default());
                    return;
                }
                handled = Some(notices);
            }
        }
        let mut cx = Cx {
            out,
            leadership: &mut self.leadership,
            handled,
        };
        self.machine.handle_with_context(event, &mut cx);
        // Every state that is `serving` takes the notices of a reply or lease timer.
        debug_assert!(cx.handled.is_none());
        // Write-once: a problem, once set, never changes.
        debug_assert!(problem_before.is_none() || problem_before == self.problem());
    }

    /// Whether the services start, run or stop: the states in which replies and lease timers
    /// go to the leadership and only a report of it concerns the lifecycle.
    #[inline]
    fn serving(&self) -> bool {
        matches!(
            self.machine.state(),
            State::StartingServices { .. } | State::Running {} | State::StoppingServices {}
        )
    }

    /// The first problem, if any.
    pub fn problem(&self) -> Option<Problem> {
        self.machine.inner().problem
    }

    /// The embedded leadership machine.
    pub fn leadership(&self) -> &Leadership {
        &self.leadership
    }

    /// The current fencing token, while leading.
    pub fn token(&self) -> Option<FencingToken> {
        self.leadership().token()
    }

    /// Whether the VVM waits between acquisition rounds: then a [`VvmEvent::SlotChanged`]
    /// starts the next round at once.
    pub fn waits_for_round(&self) -> bool {
        matches!(self.machine.state(), State::RoundWait { .. })
    }

    /// Whether the VVM acquires (in a round or between rounds): then a driver keeps the store's
    /// change feed of every slot subscribed, subscribing it *before* executing the effects of the
    /// transition that entered acquisition, so that no change after an insert's refusal is
    /// missed (V6a, V6c).
    pub fn watches_slots(&self) -> bool {
        matches!(
            self.machine.state(),
            State::Acquiring { .. } | State::RoundWait { .. }
        )
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

mod states;

pub use states::State as VvmState;
use states::State;
