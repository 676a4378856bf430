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
//! | V6b | StartingServices, Running | RecordVanished | leading (a lease's or a holding's record) | StoppingServices | Lost(slot, Overtaken), ProblemRaised(LeadershipLost), StopServices: as V10, at once instead of at the next renewal (the leadership's L26) |
//! | V6d | every state but Acquiring and RoundWait | SlotChanged | | same | — |
//! | V6e | StoppingServices | RecordVanished | leading | same | Lost(slot, Overtaken), ProblemRaised(LeadershipLost) (first problem only), as V10a |
//! | V6f | every other state | RecordVanished | | same | — |
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
//! **On a session** ([`Lifecycle::on_session`]) the slot is held as a holding of a session
//! ([`SessionLeadership`]) instead of a lease: the same rows apply with the holding in place of
//! the leadership — `Insert` is the session's acquire, `CompareAndDelete` the holding's
//! release, and there is no lease timer, renewal or `ArmKiller` (the session keeps the kill
//! deadline) — plus these rows:
//!
//! | # | state | event | guard | next | effects |
//! |---|---|---|---|---|---|
//! | V19 | Acquiring | SessionLost | on a session | same, loss noted | — (the holding notes it: the acquire's reply wins nothing, H9, H5) |
//! | V20 | Acquiring | reply → NotAcquired | on a session, loss noted | Idle | NotAcquired, ProblemRaised(AcquisitionFailed): no acquire succeeds on a lost session |
//! | V21 | RoundWait | SessionLost | on a session | Idle | ProblemRaised(AcquisitionFailed) |
//! | V22 | StartingServices, Running | SessionLost(reason) | on a session | StoppingServices | Lost(slot, reason), ProblemRaised(LeadershipLost), StopServices: as V10; the holding's record goes with the session |
//! | V23 | StoppingServices, StoppingMonitor, CleaningElections, Idle | SessionLost | on a session | same | [Lost, ProblemRaised(LeadershipLost) if held] (as V10a); noted for the finish |
//! | V24 | Provided, Shutdown | SessionLost | | same | — |
//! | V25 | any | SessionLost | on a lease | same | — |
//! | V26 | as V14, V16, V17 | → Released | on a session | Shutdown | Released, [DisarmKiller if every stop was clean and nothing was lost: the session may be closed cleanly], Finished(problem) |
//! | V20a | Acquiring | reply → NotAcquired | on its own session, loss noted, now < until | ReopeningSession | NotAcquired, OpenSession(until): the candidate rides out its session's loss as one on a lease rides out a store blip |
//! | V21a | RoundWait | SessionLost | on its own session, now < until | ReopeningSession | OpenSession(until) |
//! | V27 | ReopeningSession | SessionOpened | | Acquiring(1), fresh round, loss forgotten | Insert(1) on the fresh session |
//! | V28 | ReopeningSession | SessionLost | | Idle | ProblemRaised(AcquisitionFailed): no session opened before the acquisition's end |
//! | V29 | ReopeningSession | Shutdown | | as V12 | nothing in flight, nothing held |
//! | V30 | ReopeningSession | anything else | | same | — |
//!
//! V20 and V21 apply on a shared session, and on an own one at or after `until`.
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
//!
//! **Why an `Option` of the holding beside the leadership, not generics.** The lifecycle keeps
//! its [`Leadership`] and, on a session, a [`SessionLeadership`] next to it; the context hands
//! events to the one in use. A type parameter would make the lease path free of even that test,
//! but it would spread to every user of `Lifecycle` (driver, simulator, model checks) and to
//! the statig machine, whose state handlers are generated for one context type; the test costs
//! the lease path one compare per event, and the holding's paths are kept out of line so that
//! the lease's inlining stays as it was (BENCHMARKS.md). [`Lifecycle::leadership`] stays what
//! the simulator and the model checks inspect: idle for ever on a session.

use core::time::Duration;

use statig::prelude::*;

use crate::config::VvmConfig;
use crate::effect::{
    Effect, Effects, FencingToken, Incarnation, LossReason, OpId, Problem, Reply, Slot, TimerId,
    TimerKind,
};
use crate::holding::{HoldingEvent, SessionLeadership};
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
    /// The store says that the record of the slot this VVM leads is gone or holds another value:
    /// removed from outside (`etcdctl del`, a revoked lease, a `DELETE` in the file). A fact
    /// read back from the store after the record was written, not a hint: while services start
    /// or run, leadership is lost and they stop at once (V6b), instead of at the next renewal's
    /// refusal — on a lease (the leadership's L26) and on a session (the holding's H15) alike.
    /// Ignored when not leading (V6f).
    RecordVanished {
        /// Current time.
        now: Instant,
    },
    /// The session the VVM holds its slot on was lost (only for a lifecycle
    /// [`on_session`](Lifecycle::on_session); a lifecycle on a lease ignores it): a holding of
    /// it is lost at once (V22), an acquisition in flight wins nothing and acquisition ends
    /// (V19–V21).
    SessionLost {
        /// Current time.
        now: Instant,
        /// Why the session was lost.
        reason: LossReason,
    },
    /// The fresh session asked for by [`Effect::OpenSession`] is open: acquisition goes on
    /// with a fresh round on it (V27).
    SessionOpened {
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
            | VvmEvent::SlotChanged { now }
            | VvmEvent::RecordVanished { now }
            | VvmEvent::SessionLost { now, .. }
            | VvmEvent::SessionOpened { now } => now,
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
    /// The slot is held as a holding of a session ([`Lifecycle::on_session`]).
    on_session: bool,
    /// The session is this VVM's own: lost while campaigning, it is opened anew (V20a, V21a).
    reopens: bool,
    /// The leadership or the session was lost (a lease's `Lost`, or [`VvmEvent::SessionLost`]).
    lost: bool,
}

/// The statig context: the caller's effect buffer, the embedded leadership machine, and the
/// notices of an event the leadership already handled on the fast path (see
/// [`Lifecycle::handle`]), which the state handler takes instead of forwarding the event again.
#[derive(Debug)]
pub struct Cx<'a> {
    out: &'a mut Effects,
    leadership: &'a mut Leadership,
    /// The holding of a lifecycle on a session; `None` on a lease.
    holding: Option<&'a mut SessionLeadership>,
    handled: Option<Notices>,
}

/// A store reply or lease timer for a holding while the services start, run or stop (the fast
/// path of [`Lifecycle::handle`]): `None` when it is still held, so it reported nothing.
#[inline(never)]
fn serve_holding(
    holding: &mut SessionLeadership,
    event: &LeaseEvent,
    out: &mut Effects,
) -> Option<Notices> {
    let notices = holding.handle_lease(event, out);
    if holding.is_held() {
        debug_assert_eq!(notices, Notices::default());
        return None;
    }
    Some(notices)
}

/// A leadership event for a holding, out of line so that the lease's path keeps its inlining.
#[inline(never)]
fn lead_holding(holding: &mut SessionLeadership, event: &LeaseEvent, out: &mut Effects) -> Notices {
    holding.handle_lease(event, out)
}

impl Cx<'_> {
    /// Hands a leadership event to whichever machine holds the slot.
    #[inline(always)]
    fn lead(&mut self, event: &LeaseEvent) -> Notices {
        match &mut self.holding {
            None => self.leadership.handle_noting(event, self.out),
            Some(holding) => lead_holding(holding, event, self.out),
        }
    }

    /// The fencing token, while the slot is held.
    fn token(&self) -> Option<FencingToken> {
        match &self.holding {
            None => self.leadership.token(),
            Some(holding) => holding.token(),
        }
    }

    /// Whether the release's delete is in flight.
    fn releasing(&self) -> bool {
        match &self.holding {
            None => matches!(self.leadership.state(), LeaseState::Releasing { .. }),
            Some(holding) => holding.is_releasing(),
        }
    }
}

/// The leadership's event for a VVM event: store replies, lease timers and the store's word
/// that the record vanished; `None` for the rest.
#[inline]
fn lease_event(event: &VvmEvent) -> Option<LeaseEvent> {
    match *event {
        VvmEvent::RecordVanished { now } => Some(LeaseEvent::Vanished { now }),
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
    /// the context. Idle for ever on a session.
    leadership: Leadership,
    /// The holding, for a lifecycle [`on_session`](Self::on_session).
    holding: Option<SessionLeadership>,
}

// Model checkers fingerprint states by hash; equal machines (same shared data, same state) hash
// equally, which is all `Hash` must agree with `Eq` on.
impl core::hash::Hash for Lifecycle {
    fn hash<H: core::hash::Hasher>(&self, state: &mut H) {
        self.machine.inner().hash(state);
        self.machine.state().hash(state);
        self.leadership.hash(state);
        self.holding.hash(state);
    }
}

impl Lifecycle {
    /// A provided, not yet launched VVM of `incarnation`, leading its slot by the per-slot lease
    /// protocol (its own renewals and kill deadline).
    pub fn new(config: &VvmConfig, incarnation: Incarnation) -> Self {
        Lifecycle::build(config, incarnation, None, false)
    }

    /// A provided, not yet launched VVM that holds its slot as a holding of a session
    /// ([`SessionLeadership`]): acquired through the session, never renewed by itself, lost
    /// with the session ([`VvmEvent::SessionLost`]); the session keeps the kill deadline. The
    /// configuration's lease is the session's business and is not used here.
    pub fn on_session(config: &VvmConfig) -> Self {
        // The idle leadership never acts; it keeps `leadership()` meaningful (idle) for callers
        // that inspect it. Its incarnation is never written.
        Lifecycle::build(
            config,
            Incarnation(0),
            Some(SessionLeadership::new()),
            false,
        )
    }

    /// [`on_session`](Self::on_session) for a VVM whose session is its own: a loss of it while
    /// campaigning, holding nothing, asks for a fresh session ([`Effect::OpenSession`]) instead
    /// of ending the acquisition (V20a, V21a, V27, V28) — a shared session is its owner's to
    /// open anew.
    pub fn on_own_session(config: &VvmConfig) -> Self {
        Lifecycle::build(config, Incarnation(0), Some(SessionLeadership::new()), true)
    }

    fn build(
        config: &VvmConfig,
        incarnation: Incarnation,
        mut holding: Option<SessionLeadership>,
        reopens: bool,
    ) -> Self {
        let shared = Shared {
            slots: config.slots(),
            acquisition: config.acquisition(),
            round_interval: config.round_interval(),
            problem: None,
            seq: 0,
            services_clean: true,
            armed: false,
            on_session: holding.is_some(),
            reopens,
            lost: false,
        };
        let mut leadership = Leadership::new(*config.lease(), incarnation);
        let machine = shared
            .uninitialized_state_machine()
            .init_with_context(&mut Cx {
                out: &mut Effects::new(),
                leadership: &mut leadership,
                holding: holding.as_mut(),
                handled: None,
            });
        Lifecycle {
            machine,
            leadership,
            holding,
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
                let notices = match self.holding.as_mut() {
                    None => {
                        let notices = self.leadership.handle_noting(&lease, out);
                        // While serving, the leadership leads or has lost (Idle): still leading
                        // after the event means it reported nothing (no loss; an acquisition or
                        // a release cannot happen while serving). One state check instead of
                        // comparing notices.
                        if self.leadership.held().is_some() {
                            debug_assert_eq!(notices, Notices::default());
                            return;
                        }
                        notices
                    }
                    // The same for a holding, out of line: the lease's steady state stays as
                    // short as it was without holdings.
                    Some(holding) => match serve_holding(holding, &lease, out) {
                        Some(notices) => notices,
                        None => return,
                    },
                };
                handled = Some(notices);
            }
        }
        if self.holding.is_none() && matches!(event, VvmEvent::SessionLost { .. }) {
            // A lease has no session to lose (V25).
            return;
        }
        let mut cx = Cx {
            out,
            leadership: &mut self.leadership,
            holding: self.holding.as_mut(),
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

    /// The embedded leadership machine (idle for ever on a session: see [`holding`](Self::holding)).
    pub fn leadership(&self) -> &Leadership {
        &self.leadership
    }

    /// The embedded holding machine, for a lifecycle [`on_session`](Self::on_session).
    pub fn holding(&self) -> Option<&SessionLeadership> {
        self.holding.as_ref()
    }

    /// Whether the slot is held as a holding of a session.
    pub fn is_on_session(&self) -> bool {
        self.holding.is_some()
    }

    /// The current fencing token, while leading.
    pub fn token(&self) -> Option<FencingToken> {
        match &self.holding {
            None => self.leadership.token(),
            Some(holding) => holding.token(),
        }
    }

    /// Whether the VVM waits between acquisition rounds: then a [`VvmEvent::SlotChanged`]
    /// starts the next round at once.
    pub fn waits_for_round(&self) -> bool {
        matches!(self.machine.state(), State::RoundWait { .. })
    }

    /// Whether a driver watches the record of the slot this VVM leads, to report
    /// [`VvmEvent::RecordVanished`] at once: while the slot is led (on a lease) or held (on a
    /// session) and the services start, run or stop (V6b, V6e).
    pub fn watches_own_record(&self) -> Option<Slot> {
        if !self.serving() {
            return None;
        }
        self.token().map(|token| token.slot)
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
            State::Acquiring { .. } | State::RoundWait { .. } | State::ReopeningSession { .. } => {
                Phase::AcquiringLeadership
            }
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
