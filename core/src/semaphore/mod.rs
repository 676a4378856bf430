//! Counted semaphores: the logic of coordination, written once for every store.
//!
//! A semaphore has a name, a limit, data, and *parties*: owners, which hold part of the limit,
//! and waiters, queued in arrival order. Leader election is a semaphore of limit 1 whose owner's
//! data is the leader's endpoint; service discovery one of a huge limit whose owners' data are
//! the live endpoints; configuration a semaphore's own data that workers watch.
//!
//! Everything here is a pure function of one semaphore's state and one operation: a store reads
//! the state (or decodes it, [`Semaphore::decode`]), calls one method inside one transaction,
//! writes the state back when [`Outcome::changes`] says so (or deletes the record when
//! [`Outcome::delete`] does) and wakes the sessions in [`Outcome::granted`]. No clock, no I/O:
//! a waiter's timeout is carried as given and enforced by the runtime, which calls
//! [`Semaphore::cancel_waiter_timeout`] when it passes.
//!
//! # Semantics
//!
//! - **Strict FIFO.** An acquire is granted at once only when its count fits in what the owners
//!   leave free *and* nobody is queued; otherwise it queues behind the others. Waiters are
//!   granted from the head of the queue while they fit: a head that does not fit blocks everyone
//!   behind it, even those that would fit. A big request is thus never starved by a stream of
//!   small ones, and the grant order is the arrival order, which is what every store can
//!   reproduce (etcd by creation revision, the others by a sequence in one transaction).
//! - **Not recursive; replaced in place.** A second acquire by the same session replaces the
//!   first one's parameters and keeps its order id, so its place in the queue and, for an owner,
//!   its token. An owner may lower its count (an exclusive hold becomes a shared one) but not
//!   raise it: raising would jump the queue of those who wait for the same units, so it is
//!   refused ([`SemaphoreError::OwnerCountRaised`]); release and acquire again to queue for more.
//!   A waiter may change its count either way. One release ends whatever the session had.
//! - **Late calls act on nothing newer.** Every acquire, release and timeout names the
//!   session's call it belongs to ([`RequestId`]); a call older than the one that last shaped the
//!   session's party is refused or ignored, so a release the store applies late cannot end a
//!   grant the session made since.
//! - **Try once.** A timeout of 0 means: granted now or not at all, never queued. A queued
//!   request replaced by a try that fails leaves the queue.
//! - **Tokens.** Every grant raises the semaphore's [`Generation`] by one and gives it to the new
//!   owner as its token (the revision of its [`FencingToken`](crate::FencingToken), on slot 0): tokens strictly increase in grant order, so a resource that remembers
//!   the highest token it saw can refuse a former owner's late writes.
//! - **Ephemeral semaphores** are made by the first acquire ([`Semaphore::ephemeral`], limit
//!   `u64::MAX`, so that any count fits and `u64::MAX` means exclusive) and deleted when their
//!   last party leaves.
//! - **A forced delete never frees units in use.** Deleting by force ends every waiter's request
//!   and every owner's grant, but what an owner runs may take a while to stop, so the owners'
//!   units stay counted: the semaphore is *being deleted*, refuses acquires and the creation of
//!   its name ([`SemaphoreError::BeingDeleted`]), and is deleted once its last former owner has
//!   left (by release or by its session's end). Without owners a forced delete is immediate.
//!   Units in use thus never exceed the limit, across a delete and re-creation too.
//!
//! # Sizes
//!
//! A semaphore travels whole: in every describe and watch snapshot and, for key-value stores, as
//! one encoded value rewritten by every operation. Its sizes are bounded so that the largest one
//! ([`ENCODED_BYTES_MAX`], about 1.07 MiB) still fits in one etcd request at etcd's default
//! limit of 1.5 MiB:
//!
//! - [`DATA_BYTES_MAX`] = 16 KiB of the semaphore's own data: a configuration of a few hundred
//!   settings. Larger configuration belongs in a store of its own, with its version here.
//! - [`PARTY_DATA_BYTES_MAX`] = 1 KiB per party: an endpoint, a host name, a few labels.
//! - [`PARTIES_MAX`] = 1024 owners and waiters together: a discovered service of a thousand
//!   instances, or a lock with a thousand contenders. Every operation costs O(parties) of this
//!   semaphore and nothing of any other, and this bound keeps that cost, and each write, bounded.
//! - [`NAME_BYTES_MAX`] = 255 bytes of name (see [`SemaphoreName`]).

pub use crate::session::SessionKey;

mod codec;
mod invariants;
mod name;
mod outcome;
mod state;
mod unreleased;
mod view;

pub use codec::DecodeError;
pub use invariants::Violation;
pub use name::{NameError, SemaphoreName};
pub use outcome::{Changes, Description, Grant, Outcome, SemaphoreError, Status};
pub use state::Semaphore;
pub use unreleased::unreleased_party_left;

/// Longest semaphore name, in bytes.
pub const NAME_BYTES_MAX: usize = 255;
/// Most bytes of a semaphore's own data.
pub const DATA_BYTES_MAX: usize = 16 * 1024;
/// Most bytes of one party's data.
pub const PARTY_DATA_BYTES_MAX: usize = 1024;
/// Most owners and waiters of one semaphore, together.
pub const PARTIES_MAX: usize = 1024;
/// Limit of an ephemeral semaphore: any count fits, and `u64::MAX` is an exclusive hold.
pub const EPHEMERAL_LIMIT: u64 = u64::MAX;
/// Length of the largest encoding [`Semaphore::encode`] writes.
pub const ENCODED_BYTES_MAX: usize = codec::HEADER_BYTES
    + NAME_BYTES_MAX
    + DATA_BYTES_MAX
    + PARTIES_MAX * (codec::OWNER_BYTES + PARTY_DATA_BYTES_MAX);

/// etcd's default `--max-request-bytes`: the largest semaphore must fit in one request.
const ETCD_REQUEST_BYTES_DEFAULT: usize = 3 * 512 * 1024;
const _: () = assert!(ENCODED_BYTES_MAX + NAME_BYTES_MAX < ETCD_REQUEST_BYTES_DEFAULT);

/// The place of an acquire in a semaphore's order of arrival: strictly increasing per
/// semaphore, assigned when an acquire first enters it (granted or queued), kept when the same
/// session acquires again. A session whose order id changed has released and acquired anew.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct OrderId(pub u64);

/// A semaphore's count of grants, as the store keeps it: the `n`-th grant of a semaphore has
/// generation `n`. Users meet it as the revision of the grant's [`FencingToken`](crate::FencingToken)
/// (slot 0, printed `0:<n>`), which an owner passes along with its writes so that a resource can
/// refuse those of a former owner.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Generation(pub u64);

impl Generation {
    /// The fencing token of the grant with this generation: slot 0 (a semaphore has no slots),
    /// the generation as its revision, printed `0:<n>`.
    pub fn fencing_token(self) -> crate::FencingToken {
        crate::FencingToken {
            slot: crate::Slot(0),
            revision: crate::Revision(self.0),
        }
    }
}

/// Names one call of a session on a semaphore, so that a call the store applies late (its
/// caller gave up waiting for the answer, the network held it) cannot act on what the session
/// asked since. A session numbers its calls in increasing order; a party remembers the id of
/// the acquire that made or last replaced it, and
///
/// - an acquire with a lower id than the party's is refused ([`SemaphoreError::StaleRequest`]);
/// - a release with a lower id leaves the party alone ([`Status::Superseded`]): a late release
///   cannot end a later grant whose services run;
/// - a timeout ends a queued request only when it names that very request.
///
/// A late acquire that lands after its session released can still make a party nobody waits
/// for; it holds units until the session ends or releases the name again (liveness, never
/// safety).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct RequestId(pub u64);

/// A granted acquire.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Owner {
    /// Its place in the order of arrival.
    pub order_id: OrderId,
    /// The session holding it.
    pub session: SessionKey,
    /// The session's call that made it or last replaced it ([`RequestId`]).
    pub request: RequestId,
    /// Units held, `1..=limit`.
    pub count: u64,
    /// What the owner publishes (an endpoint, for discovery): at most [`PARTY_DATA_BYTES_MAX`].
    pub data: Vec<u8>,
    /// The timeout the acquire was asked with, in milliseconds, as given.
    pub timeout_ms: u64,
    /// The generation of its grant.
    pub token: Generation,
}

/// A queued acquire.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Waiter {
    /// Its place in the queue.
    pub order_id: OrderId,
    /// The session waiting.
    pub session: SessionKey,
    /// The session's call that made it or last replaced it ([`RequestId`]).
    pub request: RequestId,
    /// Units asked for, `1..=limit`.
    pub count: u64,
    /// What it will publish once granted: at most [`PARTY_DATA_BYTES_MAX`].
    pub data: Vec<u8>,
    /// How long it may wait, in milliseconds from when it was queued; never 0. The runtime
    /// enforces it with [`Semaphore::cancel_waiter_timeout`].
    pub timeout_ms: u64,
}
