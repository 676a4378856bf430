//! Leadership of one slot: acquire, renew, resolve unknown outcomes, release, and the kill
//! deadline that keeps a stale leader from acting.
//!
//! `L` is the lease, `t_send` the time the request of the last *confirmed* write was sent.
//! Every state waiting for a reply or a timer ignores replies and firings it does not wait for
//! (stale [`OpId`] / [`TimerId`]); `Acquire` outside `Idle` is ignored. The table is the same as
//! in `specs/leadership.md`.
//!
//! | # | state | event | guard | next | effects |
//! |---|---|---|---|---|---|
//! | L1 | Idle | Acquire(slot) | | Inserting | Insert(slot, L) |
//! | L2 | Idle | Release | | Idle | Released(none) |
//! | L3 | Inserting | Written(r) | no release asked | Holding | ArmKiller(t_send+0.8L), Acquired(slot,r), SetTimer(t_send+L/4) |
//! | L4 | Inserting, Renewing | Written(r) | release asked | Releasing | CompareAndDelete(r) (no ArmKiller: nobody acts under a lease being released) |
//! | L5 | Inserting | Rejected | | Idle | NotAcquired(Held) [+ Released if release asked] |
//! | L5a | Inserting | Held(left) | | Idle | NotAcquired(Held) [+ Released if release asked]; `left` (the record's time left on the store's clock) is reported to the lifecycle, which times its next try by it |
//! | L6 | Inserting | Failed | | Idle | NotAcquired(StoreFailed) [+ Released if release asked] |
//! | L7 | Inserting | Unknown | | InsertResolving | Get |
//! | L8 | Inserting, InsertResolving, Renewing, RenewResolving, Releasing | Release | | same, release asked | — |
//! | L9 | InsertResolving | Found(ours, r) | no release asked | Claiming | CompareAndSwap(r): ours, but maybe an earlier attempt that landed late, so it is claimed afresh |
//! | L9r | InsertResolving | Found(ours, r) | release asked | Releasing | CompareAndDelete(r) |
//! | L9a | Claiming | Written(r' > r) | | as L3 / L4, anchored to the claim's send time | |
//! | L9b | Claiming | Rejected | | Idle | NotAcquired(Held) [+ Released] |
//! | L9c | Claiming | Failed, Unknown, Held, other | | Idle | NotAcquired(StoreFailed) [+ Released] |
//! | L10 | InsertResolving | Found(other) | | Idle | NotAcquired(Held) [+ Released] |
//! | L11 | InsertResolving | Found(none), Failed, Unknown | | Idle | NotAcquired(StoreFailed) [+ Released] |
//! | L12 | Holding, RetryWait | Timer | | Renewing | [ArmKiller(now+0.75L) if earlier], CompareAndSwap(r) |
//! | L13 | Renewing | Written(r') | no release asked | Holding | ArmKiller(t_send+0.8L), Renewed(slot,r'), SetTimer(t_send+L/4) |
//! | L14 | Renewing | Rejected | | Idle | Lost(Overtaken) [+ Released(slot, not deleted) if release asked]: the record is someone else's or gone |
//! | L15 | Renewing | Failed (or a reply no renewal gets: Deleted, Found, Held) | now + backoff(n) + timeout < deadline, no release asked | RetryWait(n) | SetTimer(now + backoff(n)); n = failed attempts in a row, backoff L/20, L/10, then L/5 |
//! | L16 | Renewing | Failed | now + backoff(n) + timeout ≥ deadline, no release asked | Idle | Lost(RenewalFailed); the record is left to expire |
//! | L17 | Renewing, RenewResolving | Failed | release asked | Releasing | CompareAndDelete(r) |
//! | L18 | Renewing | Unknown | | RenewResolving | Get |
//! | L19 | RenewResolving | Found(ours, r' > r) | no release asked | as L15 / L16, holding r' | committed, but when is unknown, so nothing is confirmed; the retry swaps from r' |
//! | L19a | RenewResolving | Found(ours, r' > r) | release asked | Releasing | CompareAndDelete(r') |
//! | L20 | RenewResolving | Found(ours, revision ≤ r), Failed, Unknown | | as L15 / L16 / L17 | |
//! | L21 | RenewResolving | Found(other or none) | | Idle | Lost(Overtaken) [+ Released(slot, not deleted) if release asked] |
//! | L22 | Holding, RetryWait | Release | | Releasing | CompareAndDelete(r) |
//! | L23 | Releasing | any reply | | Idle | Released(slot, deleted) if release asked |
//! | L24 | Inserting, Claiming | Written(r) | now ≥ t_send+0.8L | Idle | NotAcquired(DeadlinePassed): no token after the deadline |
//! | L25 | Renewing | Written(r') | now ≥ t_send+0.8L | Idle | Lost(DeadlinePassed); the record is left to expire |
//! | L26 | Holding, RetryWait; Renewing, RenewResolving with no release asked | Vanished | | Idle | Lost(Overtaken): the store said that our record is gone or holds another value; a reply in flight is stale |
//! | L26a | every other state | Vanished | | same | — (a release in flight finishes by its reply) |
//!
//! Holding, Renewing, RenewResolving and RetryWait are the *leading* states: each carries the
//! [`Held`] lease. They are not grouped under a statig superstate on purpose — the hierarchy walk
//! statig performs on every transition cost a quarter of the instructions per event, and the group
//! shares only one rule (release while nothing is in flight, L22), written out in two states.
//!
//! Kill-deadline rules: it moves later only on a confirmed write (L3, L9a, L13), to the
//! send time of that write + 0.8·L; before each renewal (L12) it may only move earlier. "Ours"
//! means the record carries this process's [`Incarnation`]; an address alone never counts.

use statig::prelude::*;

use crate::config::LeaseConfig;
use crate::effect::{
    Effect, Effects, FencingToken, Incarnation, LossReason, OpId, Refusal, Reply, Revision, Slot,
    TimerId, TimerKind,
};
use crate::time::Instant;

/// An input of [`Leadership`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LeaseEvent {
    /// Try to acquire `slot`. Ignored unless idle.
    Acquire {
        /// Current time.
        now: Instant,
        /// The slot to win.
        slot: Slot,
    },
    /// Stop renewing and delete our record. Finishes with [`Effect::Released`].
    Release {
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
    /// The store said, after our record was written, that it is gone or holds another value
    /// (removed from outside: `etcdctl del`, a revoked lease, a `DELETE` in the file). Only a
    /// write of ours could bring it back and none is made while leading, so no renewal can
    /// succeed any more: leadership is lost at once (L26) instead of at the next renewal.
    Vanished {
        /// Current time.
        now: Instant,
    },
}

impl LeaseEvent {
    /// The time the event carries.
    pub const fn now(&self) -> Instant {
        match *self {
            LeaseEvent::Acquire { now, .. }
            | LeaseEvent::Release { now }
            | LeaseEvent::Timer { now, .. }
            | LeaseEvent::Reply { now, .. }
            | LeaseEvent::Vanished { now } => now,
        }
    }
}

/// A lease we hold: the last confirmed write and the deadline derived from it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Held {
    /// The slot.
    pub slot: Slot,
    /// Revision of the last confirmed write (the fencing revision).
    pub revision: Revision,
    /// Send time of the last confirmed write.
    pub anchor: Instant,
    /// The kill deadline: `anchor + 0.8·L`, or earlier if the pre-renewal guard lowered it.
    pub deadline: Instant,
}

/// A store operation in flight.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Pending {
    /// The operation waited for.
    pub op: OpId,
    /// When the write being confirmed was sent (for a `Get`, the write it resolves).
    pub sent_at: Instant,
    /// Whether a release was asked while it was in flight.
    pub release: bool,
}

/// What one event made the machine report, for an embedding machine that must react to it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct Notices {
    /// [`Effect::Acquired`] was emitted.
    pub(crate) acquired: Option<FencingToken>,
    /// [`Effect::NotAcquired`] was emitted.
    pub(crate) not_acquired: bool,
    /// [`Effect::Lost`] was emitted.
    pub(crate) lost: Option<(Slot, LossReason)>,
    /// [`Effect::Released`] was emitted.
    pub(crate) released: bool,
    /// ... and it said that a record of ours was deleted.
    pub(crate) deleted: bool,
    /// The refused insert found a live record with this long left on the store's clock (L5a).
    pub(crate) left: Option<core::time::Duration>,
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

/// Shared storage of the statig machine: what every state may read.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Shared {
    lease: LeaseConfig,
    incarnation: Incarnation,
    seq: u64,
}

/// Leadership of one slot. Pure: feed it [`LeaseEvent`]s, execute the [`Effect`]s it writes.
///
/// ```
/// use vvm_core::*;
///
/// let lease = LeaseConfig::default(); // L = 20 s
/// let mut leader = Leadership::new(lease, Incarnation(1));
/// let mut out = Effects::new();
/// let t0 = Instant::from_nanos(1_000);
/// leader.handle(&LeaseEvent::Acquire { now: t0, slot: Slot(1) }, &mut out);
/// let Effect::Insert { op, .. } = out.as_slice()[0] else { unreachable!() };
///
/// out.clear();
/// let reply = Reply::Written(Revision(9));
/// leader.handle(&LeaseEvent::Reply { now: t0, op, reply }, &mut out);
/// assert_eq!(out.as_slice()[0], Effect::ArmKiller { at: t0 + lease.kill_after() });
/// assert_eq!(leader.token(), Some(FencingToken { slot: Slot(1), revision: Revision(9) }));
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Leadership {
    machine: InitializedStateMachine<Shared>,
}

// Model checkers fingerprint states by hash; equal machines (same shared data, same state) hash
// equally, which is all `Hash` must agree with `Eq` on.
impl core::hash::Hash for Leadership {
    fn hash<H: core::hash::Hasher>(&self, state: &mut H) {
        self.machine.inner().hash(state);
        self.machine.state().hash(state);
    }
}

impl Leadership {
    /// An idle machine for a process of `incarnation`.
    pub fn new(lease: LeaseConfig, incarnation: Incarnation) -> Self {
        let shared = Shared {
            lease,
            incarnation,
            seq: 0,
        };
        let machine = shared
            .uninitialized_state_machine()
            .init_with_context(&mut Ctx {
                out: &mut Effects::new(),
                notices: Notices::default(),
            });
        Leadership { machine }
    }

    /// Handles one event, appending the resulting effects to `out`.
    // Never inlined: one copy of the machine, and a clear boundary for instruction counts.
    #[inline(never)]
    pub fn handle(&mut self, event: &LeaseEvent, out: &mut Effects) {
        self.handle_noting(event, out);
    }

    /// [`handle`](Self::handle), also returning what happened in a form the lifecycle reacts to
    /// without scanning the effects again.
    pub(crate) fn handle_noting(&mut self, event: &LeaseEvent, out: &mut Effects) -> Notices {
        let mut cx = Ctx {
            out,
            notices: Notices::default(),
        };
        self.machine.handle_with_context(event, &mut cx);
        self.assert_invariants();
        cx.notices
    }

    /// The current state.
    pub fn state(&self) -> &LeaseState {
        self.machine.state()
    }

    /// The lease held, while leading.
    pub fn held(&self) -> Option<Held> {
        match *self.machine.state() {
            State::Holding { held, .. }
            | State::Renewing { held, .. }
            | State::RenewResolving { held, .. }
            | State::RetryWait { held, .. } => Some(held),
            _ => None,
        }
    }

    /// The fencing token of the last confirmed write, while leading.
    pub fn token(&self) -> Option<FencingToken> {
        self.held().map(|held| FencingToken {
            slot: held.slot,
            revision: held.revision,
        })
    }

    /// The kill deadline, while leading.
    pub fn deadline(&self) -> Option<Instant> {
        self.held().map(|held| held.deadline)
    }

    /// Whether nothing is held, tried or in flight.
    pub fn is_idle(&self) -> bool {
        matches!(self.machine.state(), State::Idle {})
    }

    /// Whether a store operation is in flight.
    pub fn in_flight(&self) -> bool {
        matches!(
            self.machine.state(),
            State::Inserting { .. }
                | State::InsertResolving { .. }
                | State::Claiming { .. }
                | State::Renewing { .. }
                | State::RenewResolving { .. }
                | State::Releasing { .. }
        )
    }

    /// The lease configuration.
    pub fn lease(&self) -> &LeaseConfig {
        &self.machine.inner().lease
    }

    fn assert_invariants(&self) {
        if let Some(held) = self.held() {
            let lease = self.lease();
            // The deadline never outlives what the last confirmed write guarantees...
            debug_assert!(held.deadline <= held.anchor + lease.kill_after());
            // ...and so always ends strictly before the record could expire.
            debug_assert!(held.deadline < held.anchor + lease.lease());
        }
    }
}

mod states;

pub use states::State as LeaseState;
use states::State;
