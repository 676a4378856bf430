//! The semaphore contract: a store keeps one [`Semaphore`] per name and runs each operation of
//! [`vvm_core::semaphore`] inside one of its transactions.
//!
//! Every operation ([`SemaphoreStore::semaphore`]) is one transaction that
//!
//! 1. checks that the calling session is live (an expired, deleted or never created session
//!    gets [`SemaphoreStoreError::SessionGone`] and nothing is written);
//! 2. reads the semaphore's state under its name;
//! 3. **expires the parties of dead sessions**: every owner or waiter whose session is not live
//!    is removed as by [`Semaphore::expire_session`] (which grants the waiters behind it);
//! 4. runs the one core operation ([`SemaphoreRequest`]);
//! 5. writes the state back when anything changed, or deletes the record when the outcome says
//!    so, and wakes the semaphore's change feed ([`SemaphoreStore::semaphore_changed`]).
//!
//! Steps 2 to 5 are the same for every store and written once, in [`transact`]; a store supplies
//! the reads and writes and its own judgement of a session's liveness.
//!
//! # When a session's parties end
//!
//! - **Lazily, in every transaction** (step 3). This is what makes the rules hold whatever
//!   happened: a process that crashed deletes nothing, and its session simply expires; the
//!   next transaction on the semaphore finds its parties dead and removes them before doing
//!   anything else, so no operation ever sees, counts or grants behind a dead party.
//! - **Eagerly, when a session record is deleted** ([`SessionStore::delete_session`]): the store
//!   removes the session's parties in the same transaction, so a closed session's waiters are
//!   not left queued behind it until someone looks.
//! - **On time, by the waiters.** An expiry writes nothing, so nobody would look. Every answer
//!   therefore carries [`Applied::parties_expire_in`], the soonest expiry among the other parties'
//!   sessions (as far as the store can tell); a waiting acquire or a watch looks again then
//!   (one transaction), which removes the dead parties and wakes whoever they blocked. A party
//!   whose session is kept alive moves its expiry, so a waiter behind a live owner costs about
//!   one transaction per lease period, like a waiting candidate of a slot.
//!
//! A lost session (its keepalives failed) cannot be trusted to write: its parties end by its
//! expiry, the lazy way. Its runtime ends every grant and acquire at once on its side.
//!
//! # Order of arrival
//!
//! The order of the queue is the core's order ids, assigned inside the transaction; a store
//! whose transactions are not serializable per semaphore (etcd, which orders by a key's creation
//! revision instead) maps its own order onto them.

use std::future::Future;
use std::pin::Pin;
use std::time::Duration;

use vvm_core::semaphore::{
    DecodeError, Description, Generation, OrderId, Outcome, RequestId, Semaphore, SemaphoreError,
    SemaphoreName, SessionKey,
};

use crate::semaphore_names::{NamesPage, SemaphoreNames};
use crate::session_store::SessionStore;
use crate::store::StoreError;

/// A new id for a session's call on a semaphore ([`RequestId`]): strictly greater than every
/// id this process handed out before, so a session's calls are numbered in the order they are
/// made, whichever task makes them. Ids start at 1 (version-1 states carry 0).
pub fn next_request_id() -> RequestId {
    static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);
    RequestId(NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed))
}

/// A wait for a change of one semaphore's stored state.
pub type SemaphoreChange = Pin<Box<dyn Future<Output = ()> + Send>>;

/// One operation on a semaphore, as a session asks it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum SemaphoreRequest {
    /// [`Semaphore::create`]: a new semaphore of `limit` units with `data`.
    Create {
        /// Units.
        limit: u64,
        /// Its own data.
        data: Vec<u8>,
    },
    /// [`Semaphore::acquire`]; with `ephemeral`, a name the store does not hold is made an
    /// ephemeral semaphore first ([`Semaphore::ephemeral`]).
    Acquire {
        /// Names this call ([`next_request_id`]).
        request: RequestId,
        /// Units asked for.
        count: u64,
        /// What the party publishes.
        data: Vec<u8>,
        /// How long it may stay queued, in milliseconds (0: try once).
        timeout_ms: u64,
        /// Create the semaphore as an ephemeral one when it does not exist.
        ephemeral: bool,
    },
    /// [`Semaphore::release`].
    Release {
        /// Names this call ([`next_request_id`]): it ends what this call or earlier ones made.
        request: RequestId,
    },
    /// [`Semaphore::cancel_waiter_timeout`]: the caller's queued request timed out.
    CancelWaiterTimeout {
        /// The acquire that timed out.
        request: RequestId,
    },
    /// [`Semaphore::update_data`].
    UpdateData {
        /// The new data.
        data: Vec<u8>,
    },
    /// [`Semaphore::set_limit`]: the limit changed in place; a raise grants waiters.
    SetLimit {
        /// The new limit.
        limit: u64,
    },
    /// [`Semaphore::delete`].
    Delete {
        /// End every party instead of refusing while there are some.
        force: bool,
    },
    /// [`Semaphore::describe`]: a snapshot (dead parties are removed first, as for every
    /// operation).
    Describe,
}

impl SemaphoreRequest {
    /// A release numbered now ([`next_request_id`]): it ends whatever the session's earlier
    /// calls made, and nothing a later call makes.
    pub fn release() -> Self {
        SemaphoreRequest::Release {
            request: next_request_id(),
        }
    }
}

/// What a semaphore transaction did.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Applied {
    /// The outcome of the caller's operation; `None` for [`SemaphoreRequest::Describe`] and
    /// [`SemaphoreRequest::Create`], and for a release or a timeout of a name the store does not
    /// hold (nothing to end).
    pub outcome: Option<Outcome>,
    /// The state after the transaction; `None` when the record was deleted (or, for a release
    /// or a timeout, was not there).
    pub description: Option<Description>,
    /// Sessions whose parties this transaction removed because they were not live.
    pub expired: Vec<SessionKey>,
    /// How long until the soonest expiry of another party's session, as the store judged it in
    /// the transaction; `None` when there is no other party or the store cannot tell. A waiter
    /// looks again then at the latest.
    pub parties_expire_in: Option<Duration>,
}

/// Why a semaphore operation was not done. Nothing was written.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum SemaphoreStoreError {
    /// The core refused the operation.
    #[error("the semaphore operation was refused")]
    Refused(#[from] SemaphoreError),
    /// No semaphore of this name exists.
    #[error("semaphore {0} does not exist")]
    NotFound(SemaphoreName),
    /// The calling session is not live (expired, deleted, never created).
    #[error("session {0} is not live")]
    SessionGone(SessionKey),
    /// The stored state of the semaphore cannot be read; it is left as it is.
    #[error("the stored state of semaphore {name} cannot be read")]
    Corrupt {
        /// The semaphore.
        name: SemaphoreName,
        /// What is wrong with it.
        source: DecodeError,
    },
    /// The store call failed, or its outcome is unknown.
    #[error("store call failed")]
    Store(#[from] StoreError),
}

/// A store of semaphores whose parties live as long as their sessions. See the module
/// documentation for the contract.
pub trait SemaphoreStore: SessionStore {
    /// Runs `request` of `session` on the semaphore `name` in one transaction (see the module
    /// documentation): the session checked live, dead parties removed, the operation applied,
    /// the state written back or deleted, the feed woken.
    fn semaphore(
        &self,
        session: SessionKey,
        name: &SemaphoreName,
        request: SemaphoreRequest,
    ) -> impl Future<Output = Result<Applied, SemaphoreStoreError>> + Send;

    /// Resolves once the stored state of `name` changed (written, deleted, created) after this
    /// call: a change between the call and the first poll is not missed. It may resolve
    /// without a change now and then (the caller reads again); it never resolves in a loop.
    /// Not a store call.
    fn semaphore_changed(&self, name: &SemaphoreName) -> SemaphoreChange;

    /// One page of the names of the semaphores that exist (created and not deleted, ephemeral
    /// ones included), sorted by their bytes ([`NamesPage`]): one read, which writes nothing
    /// and removes no dead party. A stored name that is not valid fails the call
    /// ([`UnreadableName`](crate::UnreadableName)).
    fn semaphore_names(
        &self,
        page: &NamesPage,
    ) -> impl Future<Output = Result<SemaphoreNames, StoreError>> + Send;
}

/// What a store does with the record after [`transact`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Write {
    /// Nothing changed: write nothing.
    Keep,
    /// Write this state under the name.
    Put(Semaphore),
    /// Delete the record; a store that remembers the counters of deleted semaphores
    /// ([`Semaphore::resume`]) keeps these.
    Delete {
        /// The last token issued.
        generation: Generation,
        /// The next order id.
        next_order_id: OrderId,
    },
}

impl Write {
    /// The deletion of `state`'s record, keeping its counters.
    pub fn delete(state: &Semaphore) -> Self {
        Write::Delete {
            generation: state.generation(),
            next_order_id: state.next_order_id(),
        }
    }

    /// What ends `session`'s part in `state` when its session record is deleted: the state
    /// without it, or its deletion when it was the last party of an ephemeral semaphore or of
    /// one being deleted; `Keep` when
    /// the session had no part in it.
    pub fn ending_session(mut state: Semaphore, session: SessionKey) -> Self {
        let outcome = state.expire_session(session);
        if outcome.delete {
            Write::delete(&state)
        } else if outcome.changes.any() {
            Write::Put(state)
        } else {
            Write::Keep
        }
    }
}

/// The store-independent part of a semaphore transaction (steps 2 to 5 of the module
/// documentation): `stored` is the record under `name` (decoded), `counters` those a deleted
/// semaphore of the name left, and `session_left` the store's judgement of a session's liveness
/// inside the same transaction: the time it has left, or `None` when it is not live. The
/// caller is checked live first. Returns what to write and what to answer; an inner error means
/// nothing is to be written.
pub fn transact<E>(
    stored: Option<Semaphore>,
    counters: Option<(Generation, OrderId)>,
    session: SessionKey,
    name: &SemaphoreName,
    request: SemaphoreRequest,
    mut session_left: impl FnMut(SessionKey) -> Result<Option<Duration>, E>,
) -> Result<Result<(Write, Applied), SemaphoreStoreError>, E> {
    if session_left(session)?.is_none() {
        return Ok(Err(SemaphoreStoreError::SessionGone(session)));
    }
    let existed = stored.is_some();
    let mut state = stored;
    let mut changed = false;
    let mut expired = Vec::new();
    let mut parties_expire_in: Option<Duration> = None;
    let mut counters = counters.unwrap_or((Generation(0), OrderId(1)));
    if let Some(semaphore) = state.as_mut() {
        let parties: Vec<SessionKey> = semaphore
            .owners()
            .iter()
            .map(|o| o.session)
            .chain(semaphore.waiters().iter().map(|w| w.session))
            .filter(|party| *party != session)
            .collect();
        for party in parties {
            match session_left(party)? {
                Some(left) => {
                    parties_expire_in =
                        Some(parties_expire_in.map_or(left, |soonest| soonest.min(left)));
                }
                None => {
                    changed |= semaphore.expire_session(party).changes.any();
                    expired.push(party);
                }
            }
        }
        counters = (semaphore.generation(), semaphore.next_order_id());
    }
    // An ephemeral semaphore, or one being deleted, whose parties all expired is gone before
    // the operation runs.
    if state.as_ref().is_some_and(Semaphore::is_spent) {
        state = None;
    }
    let outcome = match apply(&mut state, counters, session, name, request) {
        Ok(outcome) => outcome,
        Err(error) => return Ok(Err(error)),
    };
    changed |= outcome.as_ref().is_some_and(|o| o.changes.any()) || (!existed && state.is_some());
    let deleted = outcome.as_ref().is_some_and(|o| o.delete)
        || state.as_ref().is_some_and(Semaphore::is_spent);
    let description = match &state {
        Some(semaphore) if !deleted => Some(semaphore.describe()),
        _ => None,
    };
    let write = match state {
        Some(semaphore) if deleted => Write::delete(&semaphore),
        Some(semaphore) if changed => Write::Put(semaphore),
        Some(_) => Write::Keep,
        // Gone before the operation: its parties all expired ([`Semaphore::is_spent`]).
        None if existed => Write::Delete {
            generation: counters.0,
            next_order_id: counters.1,
        },
        None => Write::Keep,
    };
    Ok(Ok((
        write,
        Applied {
            outcome,
            description,
            expired,
            parties_expire_in,
        },
    )))
}

/// What a transaction does with a stored state of `name` that cannot be decoded (`source`
/// says why; `len_bytes` is its length): it is refused with [`SemaphoreStoreError::Corrupt`]
/// and left as it is, except by a forced delete ([`SemaphoreRequest::Delete`] with `force`),
/// which removes it after a warning that says what it removes — otherwise the name would be
/// blocked for good. Its parties and their grants end with it.
///
/// The deleted record keeps counters from `revision`, the store's revision of the record (or a
/// higher one): the counters inside it are lost, but every token and order id it handed out was
/// handed out by one of its writes, each of which took a revision of its own, so tokens issued
/// later still only ever increase.
pub fn undecodable(
    name: &SemaphoreName,
    source: DecodeError,
    len_bytes: usize,
    revision: u64,
    request: &SemaphoreRequest,
) -> Result<(Write, Applied), SemaphoreStoreError> {
    if *request != (SemaphoreRequest::Delete { force: true }) {
        return Err(SemaphoreStoreError::Corrupt {
            name: name.clone(),
            source,
        });
    }
    tracing::warn!(
        semaphore = %name,
        len_bytes,
        error = %source,
        "removing the stored state of the semaphore, which cannot be read: its owners' grants and its waiters end with it"
    );
    let write = Write::Delete {
        generation: Generation(revision),
        next_order_id: OrderId(revision.saturating_add(1)),
    };
    let applied = Applied {
        outcome: None,
        description: None,
        expired: Vec::new(),
        parties_expire_in: None,
    };
    Ok((write, applied))
}

/// Runs the caller's operation on `state` (`None`: the store holds no semaphore of the name).
fn apply(
    state: &mut Option<Semaphore>,
    counters: (Generation, OrderId),
    session: SessionKey,
    name: &SemaphoreName,
    request: SemaphoreRequest,
) -> Result<Option<Outcome>, SemaphoreStoreError> {
    let not_found = || SemaphoreStoreError::NotFound(name.clone());
    let fresh = |semaphore: Semaphore| semaphore.resume(counters.0, counters.1);
    Ok(match request {
        SemaphoreRequest::Create { limit, data } => {
            let created = Semaphore::create(state.as_ref(), name.as_str(), limit, data)?;
            *state = Some(fresh(created));
            None
        }
        SemaphoreRequest::Describe => {
            state.as_ref().ok_or_else(not_found)?;
            None
        }
        SemaphoreRequest::Acquire {
            request,
            count,
            data,
            timeout_ms,
            ephemeral,
        } => {
            if state.is_none() && ephemeral {
                *state = Some(fresh(Semaphore::ephemeral(name.as_str())?));
            }
            let semaphore = state.as_mut().ok_or_else(not_found)?;
            Some(semaphore.acquire(session, request, count, data, timeout_ms)?)
        }
        SemaphoreRequest::Release { request } => {
            state.as_mut().map(|s| s.release(session, request))
        }
        SemaphoreRequest::CancelWaiterTimeout { request } => state
            .as_mut()
            .map(|s| s.cancel_waiter_timeout(session, request)),
        SemaphoreRequest::UpdateData { data } => {
            Some(state.as_mut().ok_or_else(not_found)?.update_data(data)?)
        }
        SemaphoreRequest::SetLimit { limit } => {
            Some(state.as_mut().ok_or_else(not_found)?.set_limit(limit)?)
        }
        SemaphoreRequest::Delete { force } => {
            Some(state.as_mut().ok_or_else(not_found)?.delete(force)?)
        }
    })
}

/// A shared store is a store of semaphores too.
impl<S: SemaphoreStore> SemaphoreStore for std::sync::Arc<S> {
    fn semaphore(
        &self,
        session: SessionKey,
        name: &SemaphoreName,
        request: SemaphoreRequest,
    ) -> impl Future<Output = Result<Applied, SemaphoreStoreError>> + Send {
        S::semaphore(self, session, name, request)
    }

    fn semaphore_changed(&self, name: &SemaphoreName) -> SemaphoreChange {
        S::semaphore_changed(self, name)
    }

    fn semaphore_names(
        &self,
        page: &NamesPage,
    ) -> impl Future<Output = Result<SemaphoreNames, StoreError>> + Send {
        S::semaphore_names(self, page)
    }
}
