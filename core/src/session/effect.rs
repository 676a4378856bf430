//! What the session machine asks its runtime to do, and the names it hands out.

use core::time::Duration;

use crate::effect::{effect_buffer, LossReason, OpId, Revision, TimerId};
use crate::time::Instant;

/// Most holdings one session keeps: 2^20, ten times the 100 000 a process is sized for. Holding
/// ids are dense (`0..HOLDINGS_MAX`, as a slab hands them out), so the session keeps them in a
/// bit set, one bit per id up to the highest in use (at most 128 KiB): attach, detach and loss
/// cost the same whatever the number of holdings; only attaching past the room reserved
/// ([`Session::reserve_holdings`](crate::Session::reserve_holdings)) allocates.
pub const HOLDINGS_MAX: u32 = 1 << 20;

/// Most effects one session event can produce.
pub const SESSION_EFFECTS_MAX: usize = 4;

/// Names one session of a machine. Minted by the machine, strictly increasing, one per
/// [`Open`](crate::SessionEvent::Open): the create is the only write ever sent for a new id,
/// which is what lets a create with an unknown outcome be settled by one read. The runtime
/// derives the store key from the process's [`Incarnation`](crate::Incarnation) and this id.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct SessionId(pub u64);

/// A session as every store knows it: the incarnation of the process that opened it and the id
/// its [`Session`](crate::Session) machine minted. Ids are minted per process, so the pair is
/// what tells two processes' sessions apart, and no pair is ever used twice; the stores name
/// the session record after it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct SessionKey {
    /// The process start that opened the session.
    pub incarnation: crate::Incarnation,
    /// The session within that process.
    pub id: SessionId,
}

impl core::fmt::Display for SessionKey {
    /// `<incarnation, 16 hex digits>-<id>`, as the stores name the record.
    ///
    /// ```
    /// use vvm_core::{Incarnation, SessionId, SessionKey};
    ///
    /// let key = SessionKey { incarnation: Incarnation(255), id: SessionId(3) };
    /// assert_eq!(key.to_string(), "00000000000000ff-3");
    /// ```
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        write!(f, "{:016x}-{}", self.incarnation.0, self.id.0)
    }
}

/// Names one holding of a session — a slot's leadership, a semaphore's grant — in
/// `0..`[`HOLDINGS_MAX`]. Chosen by the runtime, which keeps what the holding runs under it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct HoldingId(pub u32);

/// Why a session was not opened.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum OpenRefusal {
    /// A live record under this id belongs to someone else.
    Taken,
    /// The store failed, or the outcome stayed unknown after reading it back.
    StoreFailed,
    /// The create was confirmed only after the deadline it would set had passed (the process
    /// was paused); the record is left to expire.
    DeadlinePassed,
    /// Holdings of the lost session `id` have not all been detached: their services may still
    /// run under its kill deadline, which a new session must not replace.
    HoldingsRemain,
}

/// Why a holding was not attached.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum AttachRefusal {
    /// The session is not alive: closed, opening, lost, or past its kill deadline.
    NotAlive,
    /// A close was asked or is under way.
    Closing,
    /// The holding is attached already.
    Attached,
    /// The id is not below [`HOLDINGS_MAX`].
    OutOfRange,
}

/// An instruction from the [`Session`](crate::Session) machine to the runtime.
///
/// A closed enum of its own rather than more variants of [`Effect`](crate::Effect): a session's
/// store calls name a session record, not a slot, and its runtime is its own task (one
/// keepalive task and one kill deadline per session), so each driver matches exactly the effects
/// it executes, with no arm for another machine's. What the two share is reused as is: [`OpId`],
/// [`TimerId`], [`Reply`](crate::Reply), [`Revision`] and [`LossReason`], so the store-reply
/// mapping and the timer wheel of the runtime serve both.
///
/// Store calls always concern this process's own record value (its incarnation), which the
/// runtime knows; they never carry it, so that effects stay `Copy`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum SessionEffect {
    /// Write the session record `id` with time-to-live `ttl`, only if no live record exists.
    /// Replied to with [`Reply::Written`](crate::Reply::Written), or
    /// [`Reply::Rejected`](crate::Reply::Rejected) / [`Reply::Held`](crate::Reply::Held).
    Create {
        /// Names the reply.
        op: OpId,
        /// The session.
        id: SessionId,
        /// Time to live of the record.
        ttl: Duration,
    },
    /// The keepalive: rewrite the session record, only if it is ours at revision `expected`;
    /// extends its life to `ttl`. One call per keepalive whatever the number of holdings.
    /// Replied to with [`Reply::Written`](crate::Reply::Written) or
    /// [`Reply::Rejected`](crate::Reply::Rejected).
    KeepAlive {
        /// Names the reply.
        op: OpId,
        /// The session.
        id: SessionId,
        /// The revision our last confirmed write produced.
        expected: Revision,
        /// New time to live.
        ttl: Duration,
    },
    /// Delete the session record, only if it is ours at revision `expected`. Replied to with
    /// [`Reply::Deleted`](crate::Reply::Deleted) or [`Reply::Rejected`](crate::Reply::Rejected).
    Delete {
        /// Names the reply.
        op: OpId,
        /// The session.
        id: SessionId,
        /// The revision our last confirmed write produced.
        expected: Revision,
    },
    /// Read the live session record; resolves a call whose outcome is unknown. Replied to with
    /// [`Reply::Found`](crate::Reply::Found).
    Get {
        /// Names the reply.
        op: OpId,
        /// The session.
        id: SessionId,
    },
    /// Fire `timer` at `at`, replacing any pending timer of this session.
    SetTimer {
        /// Names the firing.
        timer: TimerId,
        /// When.
        at: Instant,
    },
    /// Set this session's kill deadline to `at`: from then on nothing may act under any of its
    /// holdings, so the killer ends the process.
    ArmKiller {
        /// The deadline.
        at: Instant,
    },
    /// Remove this session's kill deadline: it had no holding left and its record was deleted.
    /// Emitted only just before [`SessionEffect::Closed`] with `deleted: true`.
    DisarmKiller,
    /// The session record was created: holdings may be attached.
    Opened {
        /// The session.
        id: SessionId,
        /// Revision of the create.
        revision: Revision,
    },
    /// An open did not succeed.
    NotOpened {
        /// The session tried (for [`OpenRefusal::HoldingsRemain`], the lost one).
        id: SessionId,
        /// Why.
        refusal: OpenRefusal,
    },
    /// A keepalive was confirmed.
    KeptAlive {
        /// The session.
        id: SessionId,
        /// Revision of the keepalive.
        revision: Revision,
    },
    /// The session ended without a close, and with it every holding at once: the runtime stops
    /// the services of each holding it keeps under this session and detaches it. One effect
    /// whatever the number of holdings; the record is left to expire.
    Lost {
        /// The session.
        id: SessionId,
        /// Why.
        reason: LossReason,
        /// How many holdings were attached (and are still, until detached).
        holdings: u32,
    },
    /// The session machine is done: nothing in flight, no holding, our record deleted if the
    /// session was open.
    Closed {
        /// The session, if one was opened or tried.
        id: Option<SessionId>,
        /// Whether a record of ours was actually deleted.
        deleted: bool,
    },
    /// A close was refused: holdings are attached, and deleting the record would free what
    /// their services may still act on. Detach every holding first.
    CloseRefused {
        /// The session.
        id: SessionId,
        /// How many holdings are attached.
        holdings: u32,
    },
    /// A holding was attached: from now on it lives and dies with the session.
    Attached {
        /// The holding.
        holding: HoldingId,
    },
    /// A holding was not attached.
    AttachRefused {
        /// The holding.
        holding: HoldingId,
        /// Why.
        refusal: AttachRefusal,
    },
}

effect_buffer!(
    /// A fixed-capacity, allocation-free list of session effects, filled by
    /// [`Session::handle`](crate::Session::handle). Capacity is [`SESSION_EFFECTS_MAX`].
    SessionEffects,
    SessionEffect,
    SESSION_EFFECTS_MAX,
    SessionEffect::DisarmKiller
);
