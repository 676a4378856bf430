//! Leadership of one slot held as a *holding* of a session: acquired through the session, never
//! renewed by itself, lost when the session is lost, released by deleting the holding's record.
//!
//! A [`Session`](crate::Session) keeps one record alive for every holding of a process (one
//! keepalive per `L/4`, one kill deadline); a holding's record lives exactly as long as the
//! session's. So this machine has no timer, no renewal and no kill deadline of its own: the
//! effects it shares with [`Leadership`](crate::Leadership) mean the same, executed on the
//! session — [`Effect::Insert`] is the session's acquire of the slot (one store call that
//! writes only while the session is live; its `ttl` is zero, a holding has no time to live of
//! its own), [`Effect::CompareAndDelete`] the release of the holding — and it never writes
//! [`Effect::SetTimer`], [`Effect::CompareAndSwap`], [`Effect::Get`] or [`Effect::ArmKiller`].
//! The fencing token is the holding's revision, which the store assigns above every earlier
//! tenure of the slot; keepalives of the session do not change it.
//!
//! An acquire whose outcome stays unknown is not read back: the session's acquire is idempotent,
//! so the runtime settles an unknown outcome by sending it again, and reports `Unknown` only
//! once its sends are spent; a record it may have written is the session's, deleted with it or
//! by the session's next acquire of the slot.
//!
//! Every state ignores replies it does not wait for (stale [`OpId`]) and every timer; `Acquire`
//! outside Idle is ignored. "Lost noted" means a [`HoldingEvent::SessionLost`] arrived while
//! the acquire was in flight. The table is the same as in `specs/holding.md`.
//!
//! | # | state | event | guard | next | effects |
//! |---|---|---|---|---|---|
//! | H1 | Idle | Acquire(slot) | | Acquiring | Insert(slot, ttl 0): the session's acquire |
//! | H2 | Idle | Release | | Idle | Released(none, not deleted) |
//! | H3 | Acquiring | Written(r) | no release asked, no loss noted | Holding(r) | Acquired(slot, r) |
//! | H4 | Acquiring | Written(r) | release asked | Releasing | CompareAndDelete(r): nobody acts under a holding being released |
//! | H5 | Acquiring | Written(r) | loss noted, no release asked | Idle | NotAcquired(StoreFailed): the holding died with its session; its record is the session's |
//! | H6 | Acquiring | Rejected, Held | | Idle | NotAcquired(Held) [+ Released(slot, not deleted) if release asked] |
//! | H7 | Acquiring | Failed, Unknown (or a reply no acquire gets: Deleted, Found) | | Idle | NotAcquired(StoreFailed) [+ Released(slot, not deleted) if release asked] |
//! | H8 | Acquiring | Release | | same, release asked | — |
//! | H9 | Acquiring | SessionLost | | same, loss noted | — |
//! | H10 | Holding | SessionLost(reason) | | Idle | Lost(slot, reason): the record goes with the session, nothing is deleted |
//! | H11 | Holding | Release | | Releasing | CompareAndDelete(r) |
//! | H12 | Releasing | its reply | | Idle | Released(slot, deleted = the reply is Deleted) |
//! | H13 | Idle, Releasing | SessionLost | | same | — (a release in flight finishes; the holding is gone either way) |
//! | H14 | any | Timer, stale reply; Acquire outside Idle; Release in Releasing | | same | — |
//! | H15 | Holding | Vanished | | Idle | Lost(slot, Overtaken): the store said the holding's record is gone or another's; nothing is deleted |
//! | H16 | Idle, Acquiring, Releasing | Vanished | | same | — (an acquire's reply decides; a release in flight finishes by its reply) |
//!
//! There is no leading state but Holding, so no statig superstate either; every event costs one
//! state dispatch.

use statig::prelude::*;

use crate::effect::{
    Effect, Effects, FencingToken, LossReason, OpId, Refusal, Reply, Revision, Slot,
};
use crate::leadership::{LeaseEvent, Notices};
use crate::time::Instant;

/// An input of [`SessionLeadership`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum HoldingEvent {
    /// Try to acquire `slot` as a holding of the session. Ignored unless idle.
    Acquire {
        /// Current time.
        now: Instant,
        /// The slot to win.
        slot: Slot,
    },
    /// Delete the holding's record. Finishes with [`Effect::Released`].
    Release {
        /// Current time.
        now: Instant,
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
    /// The session was lost: every holding of it ended at once.
    SessionLost {
        /// Current time.
        now: Instant,
        /// Why the session was lost.
        reason: LossReason,
    },
    /// The store says that the holding's record is gone or another's while the session lives:
    /// removed from outside (`etcdctl del` of its key, a `DELETE` in the file). A fact read back
    /// from the store, not a hint: the holding is lost at once (H15).
    Vanished {
        /// Current time.
        now: Instant,
    },
}

impl HoldingEvent {
    /// The time the event carries.
    pub const fn now(&self) -> Instant {
        match *self {
            HoldingEvent::Acquire { now, .. }
            | HoldingEvent::Release { now }
            | HoldingEvent::Reply { now, .. }
            | HoldingEvent::SessionLost { now, .. }
            | HoldingEvent::Vanished { now } => now,
        }
    }
}

/// The acquire in flight.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Acquire {
    /// The operation waited for.
    pub op: OpId,
    /// A release was asked while it was in flight.
    pub release: bool,
    /// The session was lost while it was in flight.
    pub lost: bool,
}

/// The statig context: the caller's effect buffer and the notices of this event.
#[derive(Debug)]
pub struct Ctx<'a> {
    out: &'a mut Effects,
    notices: Notices,
}

impl Ctx<'_> {
    #[inline]
    fn push(&mut self, effect: Effect) {
        self.out.push(effect);
    }
}

/// Shared storage of the statig machine.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Shared {
    seq: u64,
}

/// Leadership of one slot held as a holding of a session. Pure: feed it [`HoldingEvent`]s,
/// execute the [`Effect`]s it writes on the session.
///
/// ```
/// use vvm_core::*;
///
/// let mut holding = SessionLeadership::new();
/// let mut out = Effects::new();
/// let t0 = Instant::from_nanos(1_000);
/// holding.handle(&HoldingEvent::Acquire { now: t0, slot: Slot(1) }, &mut out);
/// let Effect::Insert { op, .. } = out.as_slice()[0] else { unreachable!() };
///
/// out.clear();
/// let reply = Reply::Written(Revision(9));
/// holding.handle(&HoldingEvent::Reply { now: t0, op, reply }, &mut out);
/// let token = FencingToken { slot: Slot(1), revision: Revision(9) };
/// assert_eq!(out.as_slice(), [Effect::Acquired { token }]); // no timer, no kill deadline
///
/// out.clear();
/// let reason = LossReason::Overtaken;
/// holding.handle(&HoldingEvent::SessionLost { now: t0, reason }, &mut out);
/// assert_eq!(out.as_slice(), [Effect::Lost { slot: Slot(1), reason }]);
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SessionLeadership {
    machine: InitializedStateMachine<Shared>,
}

// Model checkers fingerprint states by hash; equal machines hash equally.
impl core::hash::Hash for SessionLeadership {
    fn hash<H: core::hash::Hasher>(&self, state: &mut H) {
        self.machine.inner().hash(state);
        self.machine.state().hash(state);
    }
}

impl Default for SessionLeadership {
    fn default() -> Self {
        SessionLeadership::new()
    }
}

impl SessionLeadership {
    /// An idle machine. It needs no lease and no incarnation: the session keeps both.
    pub fn new() -> Self {
        let machine = Shared { seq: 0 }
            .uninitialized_state_machine()
            .init_with_context(&mut Ctx {
                out: &mut Effects::new(),
                notices: Notices::default(),
            });
        SessionLeadership { machine }
    }

    /// Handles one event, appending the resulting effects to `out`.
    #[inline(never)]
    pub fn handle(&mut self, event: &HoldingEvent, out: &mut Effects) {
        self.handle_noting(event, out);
    }

    /// [`handle`](Self::handle), also returning what happened for the lifecycle.
    pub(crate) fn handle_noting(&mut self, event: &HoldingEvent, out: &mut Effects) -> Notices {
        let mut cx = Ctx {
            out,
            notices: Notices::default(),
        };
        self.machine.handle_with_context(event, &mut cx);
        cx.notices
    }

    /// A lifecycle's leadership event, as far as a holding has it: a lease timer concerns
    /// nothing here; a vanished record is the holding's loss (H15).
    pub(crate) fn handle_lease(&mut self, event: &LeaseEvent, out: &mut Effects) -> Notices {
        let event = match *event {
            LeaseEvent::Acquire { now, slot } => HoldingEvent::Acquire { now, slot },
            LeaseEvent::Release { now } => HoldingEvent::Release { now },
            LeaseEvent::Reply { now, op, reply } => HoldingEvent::Reply { now, op, reply },
            LeaseEvent::Vanished { now } => HoldingEvent::Vanished { now },
            LeaseEvent::Timer { .. } => return Notices::default(),
        };
        self.handle_noting(&event, out)
    }

    /// The current state.
    pub fn state(&self) -> &HoldingState {
        self.machine.state()
    }

    /// The fencing token of the holding, while held: its slot and revision.
    pub fn token(&self) -> Option<FencingToken> {
        match *self.machine.state() {
            State::Holding { slot, revision } => Some(FencingToken { slot, revision }),
            _ => None,
        }
    }

    /// Whether the holding is held.
    pub fn is_held(&self) -> bool {
        matches!(self.machine.state(), State::Holding { .. })
    }

    /// Whether the release's delete is in flight.
    pub fn is_releasing(&self) -> bool {
        matches!(self.machine.state(), State::Releasing { .. })
    }

    /// Whether nothing is held, tried or in flight.
    pub fn is_idle(&self) -> bool {
        matches!(self.machine.state(), State::Idle {})
    }

    /// Whether a store operation is in flight.
    pub fn in_flight(&self) -> bool {
        matches!(
            self.machine.state(),
            State::Acquiring { .. } | State::Releasing { .. }
        )
    }
}

mod states;

pub use states::State as HoldingState;
use states::State;
