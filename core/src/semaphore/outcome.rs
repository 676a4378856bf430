//! What an operation tells its caller: the outcome of a valid operation, or why it was refused.

use super::{Generation, NameError, OrderId, Owner, SemaphoreName, SessionKey, Waiter};

/// Why an operation was refused. A refused operation changes nothing.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum SemaphoreError {
    /// The name is not a valid [`SemaphoreName`].
    #[error("invalid semaphore name")]
    InvalidName(#[from] NameError),
    /// A semaphore is created with limit 0: nobody could ever hold it.
    #[error("a semaphore's limit is 0")]
    LimitZero,
    /// The store already holds a semaphore under this name.
    #[error("semaphore {0} already exists")]
    AlreadyExists(SemaphoreName),
    /// An acquire asks for 0 units or for more than the limit (it could never be granted).
    #[error("an acquire of {count} units on a semaphore of limit {limit}")]
    CountOutOfRange {
        /// Units asked for.
        count: u64,
        /// The semaphore's limit.
        limit: u64,
    },
    /// Data longer than allowed: [`DATA_BYTES_MAX`](super::DATA_BYTES_MAX) for the
    /// semaphore's own, [`PARTY_DATA_BYTES_MAX`](super::PARTY_DATA_BYTES_MAX) for a party's.
    #[error("{bytes} bytes of data, more than {max}")]
    DataTooLarge {
        /// Length given.
        bytes: usize,
        /// The bound that applies.
        max: usize,
    },
    /// An owner acquired again with a higher count. Raising a hold in place would jump the
    /// queue; release and acquire anew.
    #[error("an owner of {held} units asked for {asked}: a hold may only be lowered in place")]
    OwnerCountRaised {
        /// Units it holds.
        held: u64,
        /// Units asked for.
        asked: u64,
    },
    /// An acquire older than the one that made or last replaced the session's party: a call
    /// applied late, after its session moved on. Nothing changed.
    #[error("request {given} of the session is older than its request {party} already applied")]
    StaleRequest {
        /// The request id the acquire carried.
        given: u64,
        /// The request id of the session's party.
        party: u64,
    },
    /// A new party would exceed [`PARTIES_MAX`](super::PARTIES_MAX).
    #[error("the semaphore already has the most owners and waiters allowed")]
    TooManyParties,
    /// Order ids or generations would pass `u64::MAX` (reachable only from counters resumed or
    /// decoded near it).
    #[error("the semaphore's order ids or generations are used up")]
    Exhausted,
    /// An acquire, or a creation of its name, while the semaphore is being deleted: it was
    /// deleted by force while it had owners, and goes when the last of them leaves
    /// ([`Semaphore::delete`](super::Semaphore::delete)).
    #[error(
        "semaphore {name} is being deleted: {owners} former owners still hold units; it goes \
         when they stop"
    )]
    BeingDeleted {
        /// The semaphore.
        name: SemaphoreName,
        /// Former owners still holding units.
        owners: usize,
    },
    /// A limit change below the units the owners hold now: their grants cannot be taken back,
    /// so the limit may come down to `in_use` at the lowest
    /// ([`Semaphore::set_limit`](super::Semaphore::set_limit)).
    #[error("cannot set the limit to {wanted}: {in_use} units are in use now")]
    LimitBelowUse {
        /// Units the owners hold together.
        in_use: u64,
        /// The limit asked for.
        wanted: u64,
    },
    /// A limit change below the count a queued request asks for, which could then never be
    /// granted.
    #[error("cannot set the limit to {wanted}: a queued request asks for {count} units")]
    LimitBelowRequest {
        /// The largest count a waiter asks for.
        count: u64,
        /// The limit asked for.
        wanted: u64,
    },
    /// A limit change of an ephemeral semaphore: it has no limit (any count fits), and is
    /// deleted when its last party leaves.
    #[error("an ephemeral semaphore has no limit to change")]
    EphemeralLimit,
    /// A delete without `force` of a semaphore that has owners or waiters.
    #[error("the semaphore has {owners} owners and {waiters} waiters")]
    Busy {
        /// Number of owners.
        owners: usize,
        /// Number of waiters.
        waiters: usize,
    },
}

/// What an operation did to the caller's own request.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Status {
    /// Acquire: the session owns the semaphore (newly, or still, with the parameters given).
    Granted {
        /// Its place in the order of arrival.
        order_id: OrderId,
        /// Its token.
        token: Generation,
    },
    /// Acquire: the session waits in the queue.
    Queued {
        /// Its place in the queue.
        order_id: OrderId,
    },
    /// Acquire with timeout 0 that could not be granted at once. A request the session had
    /// queued before was replaced by this one, so it left the queue too.
    NotGranted,
    /// Release or session expiry: the session's hold ended.
    Released {
        /// The order id of the hold.
        order_id: OrderId,
    },
    /// Release, session expiry or timeout: the session's queued request left the queue.
    Withdrawn {
        /// The order id it had.
        order_id: OrderId,
    },
    /// Release, session expiry or timeout: the session had nothing here that the operation
    /// ends (a timeout that comes after the grant leaves the grant alone).
    NotHeld,
    /// Release or timeout older than the request that made or last replaced the session's
    /// party ([`RequestId`](super::RequestId)): a late call; the party stays as it is.
    Superseded,
    /// The semaphore's data was set.
    Updated,
    /// The semaphore's limit was set ([`Semaphore::set_limit`](super::Semaphore::set_limit));
    /// a raise may have granted waiters ([`Outcome::granted`]).
    LimitSet {
        /// The limit before (the same as now when nothing changed).
        previous: u64,
    },
    /// The semaphore was deleted. Its owners' grants and its waiters' requests ended: the
    /// runtime tells each session. Owners' units stay counted until they leave: the semaphore
    /// is being deleted meanwhile ([`Semaphore::delete`](super::Semaphore::delete)).
    Deleted {
        /// The owners it had.
        owners: Vec<Owner>,
        /// The waiters it had, in queue order.
        waiters: Vec<Waiter>,
    },
}

/// What changed in the semaphore, so that a store writes only when needed and wakes only the
/// watches that asked for this kind of change.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct Changes {
    /// The semaphore's own data.
    pub data: bool,
    /// The limit.
    pub limit: bool,
    /// The owners: who, how many units, their data.
    pub owners: bool,
    /// The queue, or the counters (a try that failed changes neither).
    pub waiters: bool,
}

impl Changes {
    /// Whether anything changed: the state must be written back.
    pub const fn any(&self) -> bool {
        self.data || self.limit || self.owners || self.waiters
    }
}

/// A waiter granted by an operation: the runtime wakes its session.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Grant {
    /// The session now owning.
    pub session: SessionKey,
    /// Its order id.
    pub order_id: OrderId,
    /// Its token.
    pub token: Generation,
}

/// The outcome of an operation that was not refused.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Outcome {
    /// What happened to the caller's request.
    pub status: Status,
    /// What changed.
    pub changes: Changes,
    /// Waiters of *other* sessions granted by this operation, in grant order (the caller's own
    /// grant is its [`Status::Granted`]). Every one must be woken.
    pub granted: Vec<Grant>,
    /// The record must be deleted: the semaphore was deleted without owners, or it is ephemeral
    /// or being deleted and has no party left ([`Semaphore::is_spent`](super::Semaphore::is_spent)).
    pub delete: bool,
}

/// A snapshot of a semaphore, as describe and watch deliver it.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Description {
    /// Its name.
    pub name: SemaphoreName,
    /// Its own data.
    pub data: Vec<u8>,
    /// Units held by the owners together.
    pub count: u64,
    /// Its limit.
    pub limit: u64,
    /// Whether it is ephemeral.
    pub ephemeral: bool,
    /// Whether it is being deleted: its owners' grants ended with a forced delete, and their
    /// units stay counted until they leave.
    pub deleting: bool,
    /// The generation of its last grant: the highest token issued.
    pub generation: Generation,
    /// Its owners, in order of arrival.
    pub owners: Vec<Owner>,
    /// Its waiters, in queue order.
    pub waiters: Vec<Waiter>,
}
