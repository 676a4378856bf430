//! Sessions on etcd ([`SessionStore`]): one etcd lease per session, which carries the session
//! record and every holding of the session.
//!
//! With `s` the session's key, `<prefix>session/<incarnation, 16 hex digits>-<id>`
//! ([`EtcdStore::session_key`]), and `L` the session's lease:
//!
//! | operation | etcd requests |
//! |---|---|
//! | create_session | grant `L` of the TTL; `if create_revision(s) == 0 then put(s, value, L) else get(s)` |
//! | keep_alive | one `LeaseKeepAlive` of `L` |
//! | delete_session | `if mod_revision(s) == expected then delete(s)`; then revoke `L` |
//! | get_session | range read of `s` |
//! | acquire | `if create_revision(slot) == 0 && lease(s) == L && value(state) > "released" then put(slot, value, L), put(state, "holding s") else get(slot), get(s), get(state)`; a slot absent while its state names another live session's holding is held (`Et.HoldingRemoved`), else the same transaction comparing the state read |
//!
//! A holding is the slot's key bound to `L`: etcd deletes it, the session record and every
//! other holding in the one revocation of `L`, whether the session expired (etcd revokes an
//! expired lease) or was deleted ([`delete_session`](SessionStore::delete_session) revokes
//! it). A keepalive renews `L`, so it renews every holding whatever their number, writes no key,
//! and leaves the record's revision as it was (the contract allows it).
//!
//! # Keys
//!
//! Slot keys are `<prefix><decimal>` and the prefix never ends with a digit, so a session key,
//! whose first byte after the prefix is `s`, is never a slot key of the same prefix. It also
//! sorts after every slot key of the prefix (`s` > `9`), so the change feed's watch, which
//! covers the range from the lowest to the highest watched slot key (`feed` module), never
//! sees a session key of its own store.
//!
//! # What the store remembers
//!
//! The store (and its clones) keeps, per session it created or read, the lease id, the value,
//! the revision of the record, and the lease's TTL once known: at most [`SESSIONS_MAX`]
//! sessions. A create beyond them fails before anything is written
//! ([`EtcdError::SessionsFull`]); so does an acquire for a session it would have to learn.
//! An entry is dropped once the store sees the session gone (deleted, its lease not found, its
//! record absent).
//!
//! It serves three purposes:
//! - a keepalive of a known session is one gRPC round trip: no read of the record first. A
//!   session this store does not know yet (created with an unknown outcome, or by another
//!   store) is read first, and its lease's TTL asked once, then kept alive like the others;
//! - an acquire knows the value and lease to bind the holding to without a read;
//! - a holding released with [`LeaseStore::compare_and_delete`], or replaced with
//!   [`LeaseStore::compare_and_swap`], does not revoke the lease it was bound to when that
//!   lease is a known session's: it would end the session and all its other holdings. So a
//!   holding must be released or swapped through the store that acquired it, or a clone of it
//!   (in practice the process that holds it, the only one whose value it carries); another
//!   store that released it would revoke the session's lease.
//!
//! # Keepalive
//!
//! Each keepalive opens one `LeaseKeepAlive` stream, sends one request, reads its answer and
//! closes the stream: one request and its answer on the client's connection, like any unary
//! call (etcd-client sends the first request when it opens the stream). A stream kept open per
//! session would save little (the HTTP/2 stream set-up rides on the same round trip) and
//! would have to be re-opened on a broken connection, resent on another member, and bounded;
//! a session's keepalives are `L/4` apart (`L/20` at the least when retried). The answer's TTL is not visible through
//! etcd-client (it checks only that it is positive), so the TTL a keepalive asks for is
//! checked against the lease's, which is fixed when the lease is granted: known from the grant
//! for a session created here, asked of etcd once (`LeaseTimeToLive`) otherwise.
//!
//! A keepalive of a lease etcd no longer has is `Ok(None)`. A keepalive of a known session
//! does not read the record: a record deleted by hand (not through this store) while its
//! lease lives on is not noticed, and its holdings live with the lease; every acquire sees
//! the record gone, and answers [`Acquired::SessionGone`].
//!
//! # Deletion
//!
//! The delete of the record is checked against `expected`; only then is the lease revoked,
//! at once (not in the background), which deletes every holding. A revocation that fails
//! after the record was deleted is tried once more in the background, and the delete still
//! answers `true`: the record is gone, and the holdings end when the lease's TTL ends at the
//! latest (within one TTL of the last keepalive).
//!
//! # Resending
//!
//! A create is sent again like an insert (its fresh lease recognises an earlier send that
//! applied). An acquire is sent again after a broken connection too: it is idempotent per
//! session, so when the slot is bound to `L` (only this session's holdings are) its comparison
//! is false and the answer is that holding's revision, whether an earlier send of this acquire
//! wrote it or an earlier acquire did. A delete is sent again only when refused.
//! A keepalive, a read and a revocation are sent again after a broken connection: repeating
//! them changes nothing.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use etcd_client::{
    Compare, CompareOp, DeleteOptions, GetOptions, PutOptions, Txn, TxnOp, TxnOpResponse,
};
use vvm_core::{Revision, SessionKey, Slot};
#[cfg(doc)]
use vvm_runtime::LeaseStore;
use vvm_runtime::{Acquired, ErrorChain, LeaseValue, SessionRecord, SessionStore, StoreError};

use super::vanished::{self, HOLDING};
use super::{
    classify_write, insert_txn, read_failed, revision_from, EtcdClientError, EtcdError, EtcdStore,
    Resend,
};

/// Most sessions one store (with its clones) keeps the lease of: 2^20. A create beyond them
/// fails with [`EtcdError::SessionsFull`], before anything is written.
pub const SESSIONS_MAX: usize = 1 << 20;

/// What the store knows of one session.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Known {
    /// The etcd lease that carries the record and the holdings.
    lease: i64,
    /// The lease's TTL in whole seconds, once known (granted here, or asked of etcd).
    ttl_secs: Option<i64>,
    /// The record's value, which the holdings carry too.
    value: LeaseValue,
    /// The revision of the record (a keepalive does not change it).
    revision: Revision,
}

/// The sessions a store knows, shared by its clones.
#[derive(Debug, Default)]
pub(super) struct Sessions {
    by_key: HashMap<SessionKey, Known>,
    /// The leases of `by_key`: what [`EtcdStore::is_session_lease`] looks up.
    leases: HashSet<i64>,
    /// Creates under way, each of which adds an entry when it succeeds: counted against
    /// [`SESSIONS_MAX`].
    reserved: usize,
}

impl Sessions {
    fn has_room(&self, key: SessionKey) -> bool {
        self.by_key.contains_key(&key)
            || self.by_key.len().saturating_add(self.reserved) < SESSIONS_MAX
    }

    /// Records `known` under `key`; a TTL known already for the same lease is kept.
    fn put(&mut self, key: SessionKey, mut known: Known) {
        if let Some(old) = self.by_key.get(&key) {
            if old.lease == known.lease {
                known.ttl_secs = known.ttl_secs.or(old.ttl_secs);
            } else {
                let old_lease = old.lease;
                self.leases.remove(&old_lease);
            }
        }
        self.leases.insert(known.lease);
        self.by_key.insert(key, known);
    }

    /// Forgets `key` if what is known of it passes `gone`.
    fn forget_if(&mut self, key: SessionKey, gone: impl FnOnce(&Known) -> bool) {
        if self.by_key.get(&key).is_some_and(gone) {
            if let Some(old) = self.by_key.remove(&key) {
                self.leases.remove(&old.lease);
            }
        }
    }
}

fn lock(sessions: &Mutex<Sessions>) -> MutexGuard<'_, Sessions> {
    // Every update leaves the maps consistent: a panic elsewhere cannot have left them half
    // changed.
    sessions.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Room for one session, taken before its create is sent and given back when dropped (the
/// create failed, was refused, or was dropped mid-way).
struct Reservation {
    sessions: Arc<Mutex<Sessions>>,
}

impl Reservation {
    /// Records the created session in the room taken.
    fn fill(self, key: SessionKey, known: Known) {
        lock(&self.sessions).put(key, known);
    }
}

impl Drop for Reservation {
    fn drop(&mut self) {
        let mut sessions = lock(&self.sessions);
        sessions.reserved = sessions.reserved.saturating_sub(1);
    }
}

/// A read of a session record, and the cluster revision it was read at.
struct Read {
    known: Option<Known>,
    at: i64,
}

/// Whether `error` says the lease does not exist (revoked, expired): etcd's `NotFound`
/// ("requested lease not found") for a put, a revocation or a time-to-live, and etcd-client's
/// own error for a keepalive answered with a TTL of zero.
fn lease_not_found(error: &etcd_client::Error) -> bool {
    match error {
        etcd_client::Error::GRpcStatus(status) => {
            status.code() == tonic::Code::NotFound && status.message().contains("lease not found")
        }
        etcd_client::Error::LeaseKeepAliveError(what) => what == "lease not found",
        _ => false,
    }
}

/// `revision` as etcd's, when a record can have it (above zero).
fn positive(revision: Revision) -> Option<i64> {
    i64::try_from(revision.0)
        .ok()
        .filter(|revision| *revision > 0)
}

/// The value of a slot's state key while a holding of the session whose record is `session`
/// may live there (`Et.HoldingRemoved`).
fn holding_state(session: &[u8]) -> Vec<u8> {
    [HOLDING.as_bytes(), session].concat()
}

/// What an acquire does after one transaction.
enum Next {
    /// Answer this.
    Done(Acquired),
    /// Try again, the slot's state being as this says.
    Try(StateWas),
    /// The slot is free and its state names another session's holding: held while that
    /// session's record (`session`) lives, else tried again with the state as it is.
    Check { session: Vec<u8>, state: Vec<u8> },
}

/// What the slot's state key must be for an acquire to write (`Et.HoldingRemoved`).
#[derive(Clone, Debug)]
enum StateWas {
    /// A holder's release (the first try: the usual hand-off).
    Released,
    /// Absent.
    Absent,
    /// Exactly this value, judged free.
    Value(Vec<u8>),
}

/// The acquire of `slot` for the session whose key is `session`, bound to its `lease`, when the
/// slot's `state` key is as `was` says; it writes the state naming the session. Reads the three
/// keys when the comparison is false.
fn acquire_txn(
    [slot, session, state]: [Vec<u8>; 3],
    value: &LeaseValue,
    lease: i64,
    was: StateWas,
) -> Txn {
    let state_was = match was {
        // Every `released <revision>` is greater; an absent key compares false.
        StateWas::Released => Compare::value(state.clone(), CompareOp::Greater, "released"),
        StateWas::Absent => Compare::version(state.clone(), CompareOp::Equal, 0),
        StateWas::Value(value) => Compare::value(state.clone(), CompareOp::Equal, value),
    };
    Txn::new()
        .when([
            Compare::create_revision(slot.clone(), CompareOp::Equal, 0),
            // An absent key compares as lease 0, never a granted lease: the session is live.
            Compare::lease(session.clone(), CompareOp::Equal, lease),
            state_was,
        ])
        .and_then([
            TxnOp::put(
                slot.clone(),
                value.encode(),
                Some(PutOptions::new().with_lease(lease)),
            ),
            TxnOp::put(state.clone(), holding_state(&session), None),
        ])
        .or_else([
            TxnOp::get(slot, Some(GetOptions::new().with_keys_only())),
            TxnOp::get(session, Some(GetOptions::new().with_keys_only())),
            TxnOp::get(state, None),
        ])
}

/// The lease and the revision of the first record of a read.
fn first_record(get: Option<&etcd_client::GetResponse>) -> Option<(i64, i64)> {
    get.and_then(|get| get.kvs().first())
        .map(|kv| (kv.lease(), kv.mod_revision()))
}

impl EtcdStore {
    /// The key of the session record `key`: the prefix, `session/`, then the key as
    /// [`SessionKey`] displays it (`<incarnation, 16 hex digits>-<id>`). It is never a slot key
    /// of the same prefix (those end with the prefix's digits only).
    ///
    /// ```no_run
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// use vvm_adapters::etcd::{EtcdOptions, EtcdStore};
    /// use vvm_core::{Incarnation, SessionId, SessionKey};
    ///
    /// let store = EtcdStore::connect(EtcdOptions::new(["127.0.0.1:2379"])?).await?;
    /// let key = SessionKey { incarnation: Incarnation(255), id: SessionId(3) };
    /// assert_eq!(store.session_key(key), b"vvm/slot/session/00000000000000ff-3");
    /// # Ok(()) }
    /// ```
    pub fn session_key(&self, key: SessionKey) -> Vec<u8> {
        format!("{}{}{key}", self.prefix, super::options::SESSION_PART).into_bytes()
    }

    /// Whether `lease` carries a session this store knows (and so its holdings).
    pub(super) fn is_session_lease(&self, lease: i64) -> bool {
        lease != 0 && lock(&self.sessions).leases.contains(&lease)
    }

    /// The TTL of the session `key`, when the store knows it (created here, or learnt).
    pub(super) fn known_ttl(&self, key: SessionKey) -> Option<Duration> {
        self.known(key)
            .and_then(|known| known.ttl_secs)
            .and_then(|secs| u64::try_from(secs).ok())
            .map(Duration::from_secs)
    }

    fn known(&self, key: SessionKey) -> Option<Known> {
        lock(&self.sessions).by_key.get(&key).cloned()
    }

    /// Records a session learnt from a read, if there is room; whether it is recorded.
    fn learn(&self, key: SessionKey, known: Known) -> bool {
        let mut sessions = lock(&self.sessions);
        if !sessions.has_room(key) {
            tracing::debug!(session = %key, max = SESSIONS_MAX, "session not remembered: the store knows too many");
            return false;
        }
        sessions.put(key, known);
        true
    }

    fn forget_if(&self, key: SessionKey, gone: impl FnOnce(&Known) -> bool) {
        lock(&self.sessions).forget_if(key, gone);
    }

    /// Forgets `key` if what is known of it was written at `at` or before: a read at `at`
    /// found the record absent, so that session is over.
    fn forget_absent_at(&self, key: SessionKey, at: i64) {
        self.forget_if(key, |known| {
            i64::try_from(known.revision.0).is_ok_and(|revision| revision <= at)
        });
    }

    /// Forgets `key` if it is known with `lease`, which etcd says is gone.
    fn forget_lease(&self, key: SessionKey, lease: i64) {
        self.forget_if(key, |known| known.lease == lease);
    }

    fn reserve(&self, key: SessionKey) -> Result<Reservation, StoreError> {
        let mut sessions = lock(&self.sessions);
        if !sessions.has_room(key) {
            return Err(StoreError::failed(EtcdError::SessionsFull {
                max: SESSIONS_MAX,
            }));
        }
        sessions.reserved += 1;
        Ok(Reservation {
            sessions: Arc::clone(&self.sessions),
        })
    }

    /// Reads the session record `key`.
    async fn read_session(&self, key: SessionKey) -> Result<Read, StoreError> {
        let response = self.read_key(self.session_key(key)).await?;
        let at = response.header().map_or(0, |header| header.revision());
        let Some(record) = response.kvs().first() else {
            return Ok(Read { known: None, at });
        };
        let value = LeaseValue::decode(record.value()).map_err(StoreError::failed)?;
        let revision = revision_from(record.mod_revision()).map_err(|_| {
            StoreError::failed(EtcdError::BadRevision {
                revision: record.mod_revision(),
            })
        })?;
        if record.lease() == 0 {
            return Err(StoreError::failed(EtcdError::SessionNotLeased {
                session: key.to_string(),
            }));
        }
        let known = Known {
            lease: record.lease(),
            ttl_secs: None,
            value,
            revision,
        };
        Ok(Read {
            known: Some(known),
            at,
        })
    }

    /// The TTL `lease` was granted with, in whole seconds; `None` when etcd no longer has it.
    async fn lease_ttl(&self, lease: i64) -> Result<Option<i64>, StoreError> {
        let answer = self
            .resend(Resend::Broken, || {
                let mut client = self.lease.clone();
                async move { client.time_to_live(lease, None).await }
            })
            .await;
        match answer {
            Ok(left) => {
                self.seen.note(left.header());
                // -1: expired or revoked.
                Ok((left.ttl() >= 0).then_some(left.granted_ttl()))
            }
            Err(error) if lease_not_found(&error) => Ok(None),
            Err(error) => Err(read_failed(error)),
        }
    }

    /// Revokes `lease` now; on failure once more in the background (see the module
    /// documentation, deletion).
    async fn revoke_now(&self, lease: i64) {
        let revoked = self
            .resend(Resend::Broken, || {
                let mut client = self.lease.clone();
                async move { client.revoke(lease).await }
            })
            .await;
        match revoked {
            Ok(response) => self.seen.note(response.header()),
            Err(error) if lease_not_found(&error) => {}
            Err(error) => {
                tracing::debug!(lease, error = %ErrorChain(&EtcdClientError(error)), "session lease not revoked; trying once more in the background, else its holdings end with its TTL");
                self.revoke_later(lease);
            }
        }
    }

    /// The answer of an acquire's transaction: written; or, when its comparison was false, the
    /// session gone, the slot held by this session (the answer is that holding's revision: an
    /// acquire is idempotent, and an earlier send of this one that applied is recognised so),
    /// or the slot held by someone else.
    fn acquired(
        &self,
        response: &etcd_client::TxnResponse,
        key: SessionKey,
        lease: i64,
        own: &[u8],
    ) -> Result<Next, StoreError> {
        if response.succeeded() {
            let revision = response
                .header()
                .map(|header| header.revision())
                .ok_or_else(|| StoreError::unknown(EtcdError::NoRevision))?;
            return revision_from(revision).map(|revision| Next::Done(Acquired::Written(revision)));
        }
        let reads = response.op_responses();
        let mut gets = reads.iter().filter_map(|op| match op {
            TxnOpResponse::Get(get) => Some(get),
            _ => None,
        });
        let (slot, session) = (first_record(gets.next()), first_record(gets.next()));
        let state = gets
            .next()
            .and_then(|get| get.kvs().first())
            .map(|kv| kv.value().to_vec());
        if session.is_none_or(|(bound, _)| bound != lease) {
            // Read after the lease was learnt: that session is over.
            self.forget_lease(key, lease);
            return Ok(Next::Done(Acquired::SessionGone));
        }
        match (slot, state) {
            // Only this session's holdings are bound to its lease.
            (Some((bound, revision)), _) if bound == lease => {
                revision_from(revision).map(|revision| Next::Done(Acquired::Written(revision)))
            }
            (Some(_), _) => Ok(Next::Done(Acquired::Held)),
            // Free, and the state said no release: never taken, or judged (`Et.HoldingRemoved`).
            (None, None) => Ok(Next::Try(StateWas::Absent)),
            (None, Some(state)) => Ok(match state.strip_prefix(HOLDING.as_bytes()) {
                Some(holder) if holder != own => Next::Check {
                    session: holder.to_vec(),
                    state,
                },
                _ => Next::Try(StateWas::Value(state)),
            }),
        }
    }
}

impl SessionStore for EtcdStore {
    /// Grants the session's lease (a TTL etcd cannot honour is refused, as for slot records)
    /// and creates the record bound to it; a lease whose create did not write is revoked.
    async fn create_session(
        &self,
        key: SessionKey,
        value: &LeaseValue,
        ttl: Duration,
    ) -> Result<Option<Revision>, StoreError> {
        let ttl_secs = Self::check_ttl(ttl).map_err(StoreError::failed)?;
        let reservation = self.reserve(key)?;
        let lease = self.grant(ttl).await?;
        let txn = insert_txn(self.session_key(key), value, lease);
        let response = self.write(txn, lease, Resend::Broken).await?;
        let Some(revision) = self.written(&response, lease)? else {
            return Ok(None);
        };
        reservation.fill(
            key,
            Known {
                lease,
                ttl_secs: Some(ttl_secs),
                value: value.clone(),
                revision,
            },
        );
        Ok(Some(revision))
    }

    /// One `LeaseKeepAlive` of the session's lease when the store knows the session at
    /// `expected`; otherwise the record is read first (and the lease's TTL asked once). The
    /// answer keeps the revision: etcd's keepalive writes no key. `ttl` must be the lease's
    /// own ([`EtcdError::SessionTtlMismatch`]).
    async fn keep_alive(
        &self,
        key: SessionKey,
        expected: Revision,
        ttl: Duration,
    ) -> Result<Option<Revision>, StoreError> {
        let asked_secs = Self::check_ttl(ttl).map_err(StoreError::failed)?;
        if positive(expected).is_none() {
            return Ok(None);
        }
        let known = match self.known(key).filter(|known| known.revision == expected) {
            Some(known) => known,
            None => {
                let read = self.read_session(key).await?;
                let Some(known) = read.known else {
                    self.forget_absent_at(key, read.at);
                    return Ok(None);
                };
                // Remembered even when at another revision: it is the live record.
                self.learn(key, known.clone());
                if known.revision != expected {
                    return Ok(None);
                }
                known
            }
        };
        let lease = known.lease;
        let lease_secs = match known.ttl_secs {
            Some(secs) => secs,
            None => {
                let Some(secs) = self.lease_ttl(lease).await? else {
                    self.forget_lease(key, lease);
                    return Ok(None);
                };
                self.learn(
                    key,
                    Known {
                        ttl_secs: Some(secs),
                        ..known
                    },
                );
                secs
            }
        };
        if lease_secs != asked_secs {
            return Err(StoreError::failed(EtcdError::SessionTtlMismatch {
                asked_secs,
                lease_secs,
            }));
        }
        let kept = self
            .resend(Resend::Broken, || {
                let mut client = self.lease.clone();
                // The client sends the first keepalive as it opens the stream, and fails when
                // its answer's TTL is not positive; dropping the keeper closes the stream.
                async move { client.keep_alive(lease).await.map(drop) }
            })
            .await;
        match kept {
            Ok(()) => Ok(Some(expected)),
            Err(error) if lease_not_found(&error) => {
                self.forget_lease(key, lease);
                Ok(None)
            }
            Err(error) => Err(classify_write(error)),
        }
    }

    /// Deletes the record if at `expected`, then revokes its lease at once, which deletes every
    /// holding (see the module documentation, deletion).
    async fn delete_session(
        &self,
        key: SessionKey,
        expected: Revision,
    ) -> Result<bool, StoreError> {
        let Some(revision) = positive(expected) else {
            return Ok(false);
        };
        let name = self.session_key(key);
        // Its parties in semaphores are removed in the same transaction (`semaphore` module);
        // when they cannot be told, they end with the lease, lazily.
        let lease = match self.known(key).filter(|known| known.revision == expected) {
            Some(known) => Some(known.lease),
            None => self
                .read_session(key)
                .await
                .ok()
                .and_then(|read| read.known)
                .map(|known| known.lease),
        };
        let names = match lease {
            Some(lease) => self.parties_of(key, lease).await,
            None => Vec::new(),
        };
        let mut attempts = 0;
        let response = loop {
            attempts += 1;
            let with_parties = !names.is_empty() && attempts <= super::SEMAPHORE_ATTEMPTS_MAX;
            let txn = if with_parties {
                self.delete_with_parties_txn(key, name.clone(), revision, &names)
                    .await?
            } else {
                Txn::new()
                    .when([Compare::mod_revision(
                        name.clone(),
                        CompareOp::Equal,
                        revision,
                    )])
                    .and_then([TxnOp::delete(
                        name.clone(),
                        Some(DeleteOptions::new().with_prev_key()),
                    )])
            };
            let response = self.write(txn, 0, Resend::Unsent).await?;
            if response.succeeded()
                || !with_parties
                || !super::semaphore::record_unchanged(&response, revision)
            {
                break response;
            }
        };
        if !response.succeeded() {
            return Ok(false);
        }
        let deleted = response.op_responses().iter().find_map(|op| match op {
            TxnOpResponse::Delete(delete) => delete.prev_kvs().first().map(|kv| kv.lease()),
            _ => None,
        });
        let lease = deleted
            .or_else(|| self.known(key).map(|known| known.lease))
            .unwrap_or(0);
        if lease != 0 {
            self.revoke_now(lease).await;
        }
        self.forget_lease(key, lease);
        Ok(true)
    }

    /// One range read of the record; the store learns the session's lease from it, so that a
    /// session created with an unknown outcome can be kept alive once read back.
    async fn get_session(&self, key: SessionKey) -> Result<Option<SessionRecord>, StoreError> {
        let read = self.read_session(key).await?;
        let Some(known) = read.known else {
            self.forget_absent_at(key, read.at);
            return Ok(None);
        };
        let record = SessionRecord {
            value: known.value.clone(),
            revision: known.revision,
        };
        self.learn(key, known);
        Ok(Some(record))
    }

    /// One transaction that checks the slot free and the session's record bound to its lease,
    /// and binds the holding to that lease. A session the store does not know is read first.
    async fn acquire(&self, slot: Slot, key: SessionKey) -> Result<Acquired, StoreError> {
        let known = match self.known(key) {
            Some(known) => known,
            None => {
                let read = self.read_session(key).await?;
                let Some(known) = read.known else {
                    self.forget_absent_at(key, read.at);
                    return Ok(Acquired::SessionGone);
                };
                // Its holdings' releases must know its lease (module documentation).
                if !self.learn(key, known.clone()) {
                    return Err(StoreError::failed(EtcdError::SessionsFull {
                        max: SESSIONS_MAX,
                    }));
                }
                known
            }
        };
        let lease = known.lease;
        let keys = [
            self.key(slot),
            self.session_key(key),
            vanished::state_key(&self.prefix, slot),
        ];
        let mut was = StateWas::Released;
        // The first try passes after a holder's release; a second compares the state it read;
        // a third meets a state that changed meanwhile, and more would be a race to lose.
        for _ in 0..3 {
            let txn = acquire_txn(keys.clone(), &known.value, lease, was);
            let sent = self
                .resend(Resend::Broken, || {
                    let (mut kv, txn) = (self.kv.clone(), txn.clone());
                    async move { kv.txn(txn).await }
                })
                .await;
            let response = match sent {
                Ok(response) => response,
                // The lease ended between the comparison and the put.
                Err(error) if lease_not_found(&error) => {
                    self.forget_lease(key, lease);
                    return Ok(Acquired::SessionGone);
                }
                Err(error) => return Err(classify_write(error)),
            };
            self.seen.note(response.header());
            was = match self.acquired(&response, key, lease, &keys[1])? {
                Next::Done(acquired) => return Ok(acquired),
                Next::Try(was) => was,
                Next::Check { session, state } => {
                    // A holding removed from outside while its session may still act.
                    if self.read_key(session).await?.kvs().is_empty() {
                        StateWas::Value(state)
                    } else {
                        return Ok(Acquired::Held);
                    }
                }
            };
        }
        Ok(Acquired::Held)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use vvm_core::{Incarnation, SessionId};

    fn key(id: u64) -> SessionKey {
        SessionKey {
            incarnation: Incarnation(1),
            id: SessionId(id),
        }
    }

    fn known(lease: i64) -> Known {
        Known {
            lease,
            ttl_secs: None,
            value: LeaseValue {
                address: "a".into(),
                incarnation: Incarnation(1),
                stopping: false,
            },
            revision: Revision(5),
        }
    }

    #[test]
    fn the_session_map_tracks_leases_and_keeps_room_for_creates() {
        let mut sessions = Sessions::default();
        sessions.put(
            key(1),
            Known {
                ttl_secs: Some(10),
                ..known(7)
            },
        );
        sessions.put(key(1), known(7));
        assert_eq!(
            sessions.by_key[&key(1)].ttl_secs,
            Some(10),
            "a known TTL is kept"
        );
        sessions.put(key(1), known(8));
        assert!(!sessions.leases.contains(&7) && sessions.leases.contains(&8));
        sessions.forget_if(key(1), |known| known.lease == 7);
        assert!(
            sessions.leases.contains(&8),
            "another lease is not forgotten"
        );
        sessions.forget_if(key(1), |known| known.lease == 8);
        assert!(sessions.by_key.is_empty() && sessions.leases.is_empty());

        sessions.reserved = SESSIONS_MAX - 1;
        assert!(sessions.has_room(key(2)));
        sessions.put(key(2), known(9));
        assert!(!sessions.has_room(key(3)), "reserved room counts");
        assert!(
            sessions.has_room(key(2)),
            "a known session is updated in place"
        );
    }

    #[test]
    fn lease_not_found_is_told_from_other_errors() {
        use tonic::{Code, Status};
        let status =
            |code, message: &str| etcd_client::Error::GRpcStatus(Status::new(code, message));
        assert!(lease_not_found(&status(
            Code::NotFound,
            "etcdserver: requested lease not found"
        )));
        assert!(lease_not_found(&etcd_client::Error::LeaseKeepAliveError(
            "lease not found".into()
        )));
        assert!(!lease_not_found(&status(
            Code::NotFound,
            "etcdserver: user name not found"
        )));
        assert!(!lease_not_found(&status(
            Code::Unavailable,
            "lease not found"
        )));
        assert!(!lease_not_found(&etcd_client::Error::LeaseKeepAliveError(
            "channel closed".into()
        )));
    }
}
