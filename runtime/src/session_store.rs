//! The session contract: one record per session, and holdings whose life is the session's.
//!
//! A **session record** is a TTL record under a [`SessionKey`], with the same four conditional
//! operations as a slot record ([`LeaseStore`]): create only if absent, keep alive only if ours
//! at a revision, delete only if ours at a revision, read. A **holding** is the record of a slot
//! written by [`SessionStore::acquire`]: it carries the session's [`LeaseValue`] and has no TTL
//! of its own; it is live exactly while its session's record is. So one keepalive renews every
//! holding of a session, whatever their number, and a session that ends (expired, deleted)
//! takes every holding with it in the same instant.
//!
//! Holdings and slot records are one key space: every [`LeaseStore`] operation on a slot sees a
//! live holding as a live record (its value the session's, its revision the acquire's), so a
//! candidate of the per-slot protocol can never take a slot a session holds, nor the other way
//! round, and observers ([`observe`](crate::observe())) report holdings like any holder. A holding
//! is released like any record, with [`LeaseStore::compare_and_delete`].
//!
//! | operation | writes when | answer |
//! |---|---|---|
//! | [`create_session`](SessionStore::create_session) | no live record under the key | `Some(revision)`, else `None` |
//! | [`keep_alive`](SessionStore::keep_alive) | the live record is ours at `expected` | `Some(revision ≥ expected)`, else `None` |
//! | [`delete_session`](SessionStore::delete_session) | the live record is ours at `expected` | `true` (its holdings end too), else `false` |
//! | [`get_session`](SessionStore::get_session) | — | the live record |
//! | [`acquire`](SessionStore::acquire) | the session is live and the slot has no live record | [`Acquired`]; idempotent per session |
//!
//! A keepalive may keep the record's revision (etcd's lease keepalive writes no key) or give a
//! higher one; never a lower one. Each operation is atomic in the store: the acquire checks the
//! session inside the transaction that writes the holding.

use std::future::Future;
use std::pin::Pin;
use std::time::Duration;

use vvm_core::{Revision, SessionKey, Slot};

use crate::store::{LeaseStore, LeaseValue, StoreError};

/// A live session record.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct SessionRecord {
    /// Its value: the address and incarnation of the process, which its holdings carry too.
    pub value: LeaseValue,
    /// The revision of its last write.
    pub revision: Revision,
}

/// What an [`acquire`](SessionStore::acquire) did.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Acquired {
    /// The holding was written at this revision, above every earlier one of the slot: the
    /// fencing token of this tenure.
    Written(Revision),
    /// The slot has a live record of someone else (another session's holding, or a slot
    /// record): nothing was written.
    Held,
    /// The session is not live (expired, deleted, never created): nothing was written.
    SessionGone,
}

/// What [`SessionStore::mark_lost`] answers: resolves when the session's liveness mark is lost.
pub type MarkLost = Pin<Box<dyn Future<Output = ()> + Send>>;

/// A store of sessions and the holdings that live as long as they do. See the module
/// documentation for the contract.
pub trait SessionStore: LeaseStore {
    /// Writes the session record `key` with `value` and time to live `ttl`, if no live record
    /// exists under `key`.
    fn create_session(
        &self,
        key: SessionKey,
        value: &LeaseValue,
        ttl: Duration,
    ) -> impl Future<Output = Result<Option<Revision>, StoreError>> + Send;

    /// Extends the life of the session record to `ttl` from now if it is live at `expected`:
    /// one store call, whatever the number of holdings. `Ok(Some(revision))` (at least
    /// `expected`) when extended, `Ok(None)` when the record is absent or not at `expected`.
    fn keep_alive(
        &self,
        key: SessionKey,
        expected: Revision,
        ttl: Duration,
    ) -> impl Future<Output = Result<Option<Revision>, StoreError>> + Send;

    /// Deletes the session record if it is live at `expected`, and with it every holding of the
    /// session. `Ok(true)` when deleted.
    fn delete_session(
        &self,
        key: SessionKey,
        expected: Revision,
    ) -> impl Future<Output = Result<bool, StoreError>> + Send;

    /// Reads the live session record, if any.
    fn get_session(
        &self,
        key: SessionKey,
    ) -> impl Future<Output = Result<Option<SessionRecord>, StoreError>> + Send;

    /// Writes a holding of `slot` for the session `key`: the slot's record, carrying the
    /// session's value, live exactly as long as the session. Written only when, in one
    /// transaction, the session is live and the slot has no live record.
    ///
    /// Idempotent: when the slot's live record is already a holding of this session, the answer
    /// is [`Acquired::Written`] with that holding's revision and nothing is written, so an
    /// acquire whose outcome is unknown is settled by sending it again.
    fn acquire(
        &self,
        slot: Slot,
        key: SessionKey,
    ) -> impl Future<Output = Result<Acquired, StoreError>> + Send;

    /// [`acquire`](Self::acquire) of each of `slots` (at most [`ACQUIRE_BATCH_MAX`], no slot
    /// twice) for the session `key`: the answer for `slots[i]` at `i`, each as `acquire` would
    /// give it, idempotent alike. Once the session is found gone, the rest are
    /// [`Acquired::SessionGone`] too. A store that can should decide them all in one
    /// transaction (SQLite does); by default they are `acquire`d one after another.
    fn acquire_batch(
        &self,
        slots: Vec<Slot>,
        key: SessionKey,
    ) -> impl Future<Output = Result<Vec<Acquired>, StoreError>> + Send {
        async move {
            let mut answers = Vec::with_capacity(slots.len());
            for slot in slots {
                let answer = match answers.last() {
                    Some(Acquired::SessionGone) => Acquired::SessionGone,
                    _ => self.acquire(slot, key).await?,
                };
                answers.push(answer);
            }
            Ok(answers)
        }
    }

    /// Resolves when this process loses the liveness mark of its session `key` other than by
    /// deleting the session (PostgreSQL with `death=advisory-lock`: the connection holding the
    /// session's advisory lock broke): from then on other processes may judge the session
    /// ended before its TTL, so the session's task moves the kill deadline to now. Pending for
    /// stores that keep no marks (the default).
    fn mark_lost(&self, key: SessionKey) -> MarkLost {
        let _ = key;
        Box::pin(std::future::pending())
    }
}

/// Most slots of one [`SessionStore::acquire_batch`] call: a store that decides them in one
/// transaction holds its write lock for about this many writes, so that other sessions'
/// keepalives wait milliseconds, not seconds.
pub const ACQUIRE_BATCH_MAX: usize = 1024;

/// A shared store is a store of sessions too (a process may hand one connection to sessions,
/// VVMs and observers).
impl<S: SessionStore> SessionStore for std::sync::Arc<S> {
    fn create_session(
        &self,
        key: SessionKey,
        value: &LeaseValue,
        ttl: Duration,
    ) -> impl Future<Output = Result<Option<Revision>, StoreError>> + Send {
        S::create_session(self, key, value, ttl)
    }

    fn keep_alive(
        &self,
        key: SessionKey,
        expected: Revision,
        ttl: Duration,
    ) -> impl Future<Output = Result<Option<Revision>, StoreError>> + Send {
        S::keep_alive(self, key, expected, ttl)
    }

    fn delete_session(
        &self,
        key: SessionKey,
        expected: Revision,
    ) -> impl Future<Output = Result<bool, StoreError>> + Send {
        S::delete_session(self, key, expected)
    }

    fn get_session(
        &self,
        key: SessionKey,
    ) -> impl Future<Output = Result<Option<SessionRecord>, StoreError>> + Send {
        S::get_session(self, key)
    }

    fn acquire(
        &self,
        slot: Slot,
        key: SessionKey,
    ) -> impl Future<Output = Result<Acquired, StoreError>> + Send {
        S::acquire(self, slot, key)
    }

    fn acquire_batch(
        &self,
        slots: Vec<Slot>,
        key: SessionKey,
    ) -> impl Future<Output = Result<Vec<Acquired>, StoreError>> + Send {
        S::acquire_batch(self, slots, key)
    }

    fn mark_lost(&self, key: SessionKey) -> MarkLost {
        S::mark_lost(self, key)
    }
}
