//! A session: the unit of liveness of a process. One record in the store, one keepalive and one
//! kill deadline for everything the process holds.
//!
//! A *holding* — a slot's leadership, a semaphore's grant — belongs to exactly one session and
//! renews nothing itself: its record names the session and lives as long as the session record
//! does. The session alone is kept alive (one store call per keepalive, every `L/4`, whatever
//! the number of holdings) and alone has a kill deadline, with the same rules as the leadership
//! of a slot (see [`Leadership`](crate::Leadership)): the deadline moves later only on a
//! confirmed write, to its send time + `0.8·L`; before each keepalive it may only move earlier;
//! a failed keepalive is retried after `L/20`, `L/10`, then `L/5` while the retry's answer
//! could still arrive before the deadline. A lost session loses every holding at once with one
//! [`SessionEffect::Lost`], which the runtime fans out to the holdings it keeps.
//!
//! `L` is the lease, `t_send` the time the request of the last *confirmed* write was sent, `n`
//! the number of holdings attached. Every state waiting for a reply or a timer ignores replies
//! and firings it does not wait for (stale [`OpId`] / [`TimerId`]); `Open` outside Closed and
//! Lost is ignored. "Close asked" means a `Close` arrived while a call was in flight (kept in
//! the call's [`Pending::release`], the same record of a call in flight as the leadership's).
//! The table is the same as in `specs/session.md`.
//!
//! | # | state | event | guard | next | effects |
//! |---|---|---|---|---|---|
//! | S1 | Closed, Lost | Open | n = 0 | Opening | Create(id, L) with a fresh id |
//! | S2 | Lost | Open | n > 0 | Lost | NotOpened(lost id, HoldingsRemain) |
//! | S3 | Closed | Close | | Closed | Closed(none, not deleted) |
//! | S4 | Opening | Written(r) | no close asked, now < t_send+0.8L | Alive | ArmKiller(t_send+0.8L), Opened(id, r), SetTimer(t_send+L/4) |
//! | S5 | Opening, KeepingAlive | Written(r) | close asked | Closing | Delete(r) (no ArmKiller: nothing acts under a session being closed) |
//! | S6 | Opening | Rejected, Held | | Closed | NotOpened(Taken) [+ Closed(id, not deleted) if close asked] |
//! | S7 | Opening | Failed (or a reply no create gets) | | Closed | NotOpened(StoreFailed) [+ Closed] |
//! | S8 | Opening | Unknown | | OpenResolving | Get |
//! | S9 | OpenResolving | Found(ours, r) | | as S4 / S5 / S25, anchored to the create's send time | the id is fresh, so the record can only be that create's |
//! | S10 | OpenResolving | Found(other) | | Closed | NotOpened(Taken) [+ Closed] |
//! | S11 | OpenResolving | Found(none), Failed, Unknown, other | | Closed | NotOpened(StoreFailed) [+ Closed] |
//! | S12 | Opening, OpenResolving, KeepingAlive, KeepResolving | Close | n = 0 | same, close asked | — |
//! | S13 | Alive, KeepingAlive, KeepResolving, RetryWait, Lost | Close | n > 0 | same | CloseRefused(id, n) |
//! | S14 | Alive, RetryWait | Timer | | KeepingAlive | [ArmKiller(now+0.75L) if earlier], KeepAlive(r, L) |
//! | S15 | KeepingAlive | Written(r' ≥ r) | no close asked, now < t_send+0.8L | Alive | ArmKiller(t_send+0.8L), KeptAlive(id, r'), SetTimer(t_send+L/4) |
//! | S16 | KeepingAlive | Rejected | | Lost | Lost(Overtaken, n) [+ Closed(id, not deleted), next Closed, if close asked] |
//! | S17 | KeepingAlive | Failed (or Written(r' < r), Deleted, Found, Held) | now + backoff(k) + timeout < deadline, no close asked | RetryWait(k) | SetTimer(now + backoff(k)); k = failed attempts in a row, backoff L/20, L/10, then L/5 |
//! | S18 | KeepingAlive | Failed | now + backoff(k) + timeout ≥ deadline, no close asked | Lost | Lost(RenewalFailed, n); the record is left to expire |
//! | S19 | KeepingAlive, KeepResolving | Failed | close asked | Closing | Delete(r) |
//! | S20 | KeepingAlive | Unknown | | KeepResolving | Get |
//! | S21 | KeepResolving | Found(ours, r' > r) | | as S17 / S18 / S19, holding r' | committed, but which attempt and when is unknown: nothing is confirmed |
//! | S22 | KeepResolving | Found(ours, revision ≤ r), Failed, Unknown | | as S17 / S18 / S19 | |
//! | S23 | KeepResolving | Found(other or none) | | Lost | Lost(Overtaken, n) [+ Closed, next Closed, if close asked] |
//! | S24 | Alive, RetryWait | Close | n = 0 | Closing | Delete(r) |
//! | S25 | Opening, OpenResolving | Written(r), Found(ours, r) | now ≥ t_send+0.8L | Closed | NotOpened(DeadlinePassed) [+ Closed]: no session after its deadline |
//! | S26 | KeepingAlive | Written(r' ≥ r) | now ≥ t_send+0.8L, no close asked | Lost | Lost(DeadlinePassed, n); the record is left to expire |
//! | S27 | Closing | any reply | | Closed | [DisarmKiller if Deleted], Closed(id, deleted) |
//! | S28 | Lost | Close | n = 0 | Closed | Closed(id, not deleted) |
//! | S29 | Alive, KeepingAlive, KeepResolving, RetryWait | Attach(h) | now < deadline, no close asked, h not attached, h < HOLDINGS_MAX | same | Attached(h) |
//! | S30 | any | Attach(h) | otherwise | same | AttachRefused(h, NotAlive \| Closing \| Attached \| OutOfRange) |
//! | S31 | any | Detach(h) | | same | — (h removed if attached) |
//! | S32 | Opening…RetryWait | a loss (S16, S18, S23, S26) | n = 0 | Lost | DisarmKiller before Lost(…, 0): nothing is attached, so nothing acts under the session (a candidate's session lost while it waits must not end its process) |
//! | S33 | Lost | DetachUnused(h) | h attached, n becomes 0, no holding detached by S31 since the loss | Lost | DisarmKiller: what was attached at the loss was never handed to anyone (an acquire in flight) |
//!
//! Alive, KeepingAlive, KeepResolving and RetryWait are the *alive* states: each carries the
//! [`Liveness`] of the session. Like the leading states of [`Leadership`](crate::Leadership),
//! they are not grouped under a statig superstate: the hierarchy walk would cost more per event
//! than the two shared rules written out.
//!
//! Holdings stay attached through a loss until the runtime detaches each one after its services
//! stopped (S31): until then the session refuses to close or to open anew (S2, S13), since a new
//! session's later deadline would otherwise replace the one those services still run under.
//! Attach and Detach never enter the statig machine; they touch only the holdings set beside it.
//!
//! Cost per event: O(1) in the number of holdings for every event — a keepalive is one store
//! call, a loss one effect, attach and detach one bit each. A holding costs one bit of a set
//! that covers the ids in use (up to [`HOLDINGS_MAX`]) and nothing else in the core.

use statig::prelude::*;

use crate::config::LeaseConfig;
use crate::effect::{Incarnation, LossReason, OpId, Reply, Revision, TimerId, TimerKind};
use crate::leadership::Pending;
use crate::time::Instant;

mod effect;
mod holdings;

pub use effect::{
    AttachRefusal, HoldingId, OpenRefusal, SessionEffect, SessionEffects, SessionId, SessionKey,
    HOLDINGS_MAX, SESSION_EFFECTS_MAX,
};
use holdings::Holdings;

/// An input of [`Session`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SessionEvent {
    /// Create a session record under a fresh id. Ignored unless closed or lost.
    Open {
        /// Current time.
        now: Instant,
    },
    /// Delete the session record. Refused while holdings are attached; finishes with
    /// [`SessionEffect::Closed`].
    Close {
        /// Current time.
        now: Instant,
    },
    /// A timer set by [`SessionEffect::SetTimer`] fired.
    Timer {
        /// Current time.
        now: Instant,
        /// Which timer.
        timer: TimerId,
    },
    /// A store call finished.
    Reply {
        /// Current time.
        now: Instant,
        /// The call.
        op: OpId,
        /// Its outcome.
        reply: Reply,
    },
    /// Attach a holding to the session: answered with [`SessionEffect::Attached`] or
    /// [`SessionEffect::AttachRefused`].
    Attach {
        /// Current time.
        now: Instant,
        /// The holding.
        holding: HoldingId,
    },
    /// Detach a holding: its services have stopped. No effect; a holding not attached is
    /// ignored.
    Detach {
        /// Current time.
        now: Instant,
        /// The holding.
        holding: HoldingId,
    },
    /// Detach a holding that was never handed to anyone (an acquire that won nothing, or whose
    /// answer came after the session ended): nothing acted under it. After a loss, the last
    /// holding detached so — with every other one detached so too — disarms the kill deadline
    /// (S33): nothing acts under the lost session any more.
    DetachUnused {
        /// Current time.
        now: Instant,
        /// The holding.
        holding: HoldingId,
    },
}

impl SessionEvent {
    /// The time the event carries.
    pub const fn now(&self) -> Instant {
        match *self {
            SessionEvent::Open { now }
            | SessionEvent::Close { now }
            | SessionEvent::Timer { now, .. }
            | SessionEvent::Reply { now, .. }
            | SessionEvent::Attach { now, .. }
            | SessionEvent::Detach { now, .. }
            | SessionEvent::DetachUnused { now, .. } => now,
        }
    }
}

/// An open session: its last confirmed write and the deadline derived from it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Liveness {
    /// The session.
    pub id: SessionId,
    /// Revision of the last confirmed write (for a read-back renewal, the revision found).
    pub revision: Revision,
    /// Send time of the last confirmed write.
    pub anchor: Instant,
    /// The kill deadline: `anchor + 0.8·L`, or earlier if the pre-keepalive guard lowered it.
    pub deadline: Instant,
}

/// The statig context: the caller's effect buffer and the number of holdings attached.
#[derive(Debug)]
pub struct Ctx<'a> {
    out: &'a mut SessionEffects,
    holdings: u32,
}

impl Ctx<'_> {
    #[inline]
    fn push(&mut self, effect: SessionEffect) {
        self.out.push(effect);
    }
}

/// Shared storage of the statig machine: what every state may read.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Shared {
    lease: LeaseConfig,
    incarnation: Incarnation,
    /// Last operation or timer number handed out.
    seq: u64,
    /// Last session id handed out.
    sessions: u64,
}

/// The session of a process. Pure: feed it [`SessionEvent`]s, execute the [`SessionEffect`]s
/// it writes.
///
/// ```
/// use vvm_core::*;
///
/// let lease = LeaseConfig::default(); // L = 20 s
/// let mut session = Session::new(lease, Incarnation(1));
/// let mut out = SessionEffects::new();
/// let t0 = Instant::from_nanos(1_000);
/// session.handle(&SessionEvent::Open { now: t0 }, &mut out);
/// let SessionEffect::Create { op, id, .. } = out.as_slice()[0] else { unreachable!() };
///
/// out.clear();
/// let reply = Reply::Written(Revision(3));
/// session.handle(&SessionEvent::Reply { now: t0, op, reply }, &mut out);
/// assert_eq!(out.as_slice()[0], SessionEffect::ArmKiller { at: t0 + lease.kill_after() });
///
/// out.clear();
/// let holding = HoldingId(0);
/// session.handle(&SessionEvent::Attach { now: t0, holding }, &mut out);
/// assert_eq!(out.as_slice(), [SessionEffect::Attached { holding }]);
/// assert_eq!((session.id(), session.holdings()), (Some(id), 1));
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Session {
    machine: InitializedStateMachine<Shared>,
    holdings: Holdings,
    /// Since the loss, a holding that may have acted was detached (S31 after a loss): the kill
    /// deadline stays, whatever detaches after it. Set only while lost, cleared at the next open.
    acted_since_loss: bool,
}

// Model checkers fingerprint states by hash; equal machines hash equally.
impl core::hash::Hash for Session {
    fn hash<H: core::hash::Hasher>(&self, state: &mut H) {
        self.machine.inner().hash(state);
        self.machine.state().hash(state);
        self.holdings.hash(state);
        self.acted_since_loss.hash(state);
    }
}

impl Session {
    /// A closed session machine for a process of `incarnation`; its first session is id 1.
    pub fn new(lease: LeaseConfig, incarnation: Incarnation) -> Self {
        Session::after(lease, incarnation, SessionId(0))
    }

    /// A closed session machine whose first session id is the one after `last`: several
    /// machines of one incarnation must never mint the same id (a create with an unknown outcome
    /// is settled by reading the record back, which is sound only if no other create ever used
    /// its key), so a process that runs more than one hands each a range of its own.
    pub fn after(lease: LeaseConfig, incarnation: Incarnation, last: SessionId) -> Self {
        let shared = Shared {
            lease,
            incarnation,
            seq: 0,
            sessions: last.0,
        };
        let machine = shared
            .uninitialized_state_machine()
            .init_with_context(&mut Ctx {
                out: &mut SessionEffects::new(),
                holdings: 0,
            });
        Session {
            machine,
            holdings: Holdings::new(),
            acted_since_loss: false,
        }
    }

    /// Handles one event, appending the resulting effects to `out`.
    #[inline(never)]
    pub fn handle(&mut self, event: &SessionEvent, out: &mut SessionEffects) {
        match *event {
            SessionEvent::Attach { now, holding } => {
                let outcome = self
                    .accepts(now)
                    .and_then(|()| self.holdings.insert(holding));
                out.push(match outcome {
                    Ok(()) => SessionEffect::Attached { holding },
                    Err(refusal) => SessionEffect::AttachRefused { holding, refusal },
                });
            }
            SessionEvent::Detach { holding, .. } => {
                if self.holdings.remove(holding) && self.is_lost() {
                    self.acted_since_loss = true;
                }
            }
            SessionEvent::DetachUnused { holding, .. } => {
                let removed = self.holdings.remove(holding);
                if removed && self.is_lost() && self.holdings.len() == 0 && !self.acted_since_loss {
                    // S33: what was attached at the loss never acted, and nothing else may
                    // attach to a lost session.
                    out.push(SessionEffect::DisarmKiller);
                }
            }
            _ => {
                if matches!(event, SessionEvent::Open { .. }) && self.holdings.len() == 0 {
                    // The flag is only ever set while lost, and a session opens anew only with
                    // nothing attached (S1; S2 refuses otherwise): the fresh session's next loss
                    // counts from itself, with no test on every other event.
                    self.acted_since_loss = false;
                }
                let mut cx = Ctx {
                    out,
                    holdings: self.holdings.len(),
                };
                self.machine.handle_with_context(event, &mut cx);
            }
        }
        self.assert_invariants();
    }

    /// Whether a holding may be attached at `now`.
    fn accepts(&self, now: Instant) -> Result<(), AttachRefusal> {
        let (live, pending) = match *self.machine.state() {
            State::Alive { live, .. } | State::RetryWait { live, .. } => (live, None),
            State::KeepingAlive { live, pending, .. }
            | State::KeepResolving { live, pending, .. } => (live, Some(pending)),
            State::Closing { .. } => return Err(AttachRefusal::Closing),
            _ => return Err(AttachRefusal::NotAlive),
        };
        if pending.is_some_and(|pending| pending.release) {
            return Err(AttachRefusal::Closing);
        }
        if now >= live.deadline {
            // The killer is due: nothing may start acting under this session any more.
            return Err(AttachRefusal::NotAlive);
        }
        Ok(())
    }

    /// The current state.
    pub fn state(&self) -> &SessionState {
        self.machine.state()
    }

    /// The session's liveness, while alive.
    pub fn liveness(&self) -> Option<Liveness> {
        match *self.machine.state() {
            State::Alive { live, .. }
            | State::KeepingAlive { live, .. }
            | State::KeepResolving { live, .. }
            | State::RetryWait { live, .. } => Some(live),
            _ => None,
        }
    }

    /// The session's id, from the open until it is closed (a lost session keeps its id).
    pub fn id(&self) -> Option<SessionId> {
        match *self.machine.state() {
            State::Closed {} => None,
            State::Opening { id, .. }
            | State::OpenResolving { id, .. }
            | State::Closing { id, .. }
            | State::Lost { id, .. } => Some(id),
            State::Alive { live, .. }
            | State::KeepingAlive { live, .. }
            | State::KeepResolving { live, .. }
            | State::RetryWait { live, .. } => Some(live.id),
        }
    }

    /// Revision of the session record's last confirmed write, while alive.
    pub fn revision(&self) -> Option<Revision> {
        self.liveness().map(|live| live.revision)
    }

    /// The kill deadline, while alive.
    pub fn deadline(&self) -> Option<Instant> {
        self.liveness().map(|live| live.deadline)
    }

    /// Makes room for holdings `0..holdings` (at most [`HOLDINGS_MAX`]), so that attaching
    /// them allocates nothing; without it the set grows by doubling as ids rise.
    pub fn reserve_holdings(&mut self, holdings: u32) {
        self.holdings.reserve(holdings);
    }

    /// Number of holdings attached.
    pub fn holdings(&self) -> u32 {
        self.holdings.len()
    }

    /// Whether `holding` is attached.
    pub fn is_attached(&self, holding: HoldingId) -> bool {
        self.holdings.contains(holding)
    }

    /// Whether no session is open, tried or in flight.
    pub fn is_closed(&self) -> bool {
        matches!(self.machine.state(), State::Closed {})
    }

    /// Whether the session was lost (its holdings may still be detaching).
    pub fn is_lost(&self) -> bool {
        matches!(self.machine.state(), State::Lost { .. })
    }

    /// Whether a store call is in flight.
    pub fn in_flight(&self) -> bool {
        matches!(
            self.machine.state(),
            State::Opening { .. }
                | State::OpenResolving { .. }
                | State::KeepingAlive { .. }
                | State::KeepResolving { .. }
                | State::Closing { .. }
        )
    }

    /// The lease configuration.
    pub fn lease(&self) -> &LeaseConfig {
        &self.machine.inner().lease
    }

    fn assert_invariants(&self) {
        if let Some(live) = self.liveness() {
            let lease = self.lease();
            // The deadline never outlives what the last confirmed write guarantees...
            debug_assert!(live.deadline <= live.anchor + lease.kill_after());
            // ...and so always ends strictly before the record could expire.
            debug_assert!(live.deadline < live.anchor + lease.lease());
        }
        // Holdings exist only under an alive or a lost session.
        debug_assert!(
            self.holdings.len() == 0 || self.liveness().is_some() || self.is_lost(),
            "holdings outside an alive or lost session"
        );
    }
}

mod states;

pub use states::State as SessionState;
use states::State;
