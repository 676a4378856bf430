//! Sessions over a [`TxKv`]: the session record is a record like a slot's, under the session's
//! own key, and judged expired by observation like one (see [`lease`](super::lease)); a holding
//! is a slot record of its own kind that names its session and carries no TTL: it is live while
//! the session's record is, which every operation on the slot reads in the same transaction.
//!
//! - create: `if absent(session key) then set(live record, revision 1)`;
//! - keepalive: `if live(session key) at expected then set(live record, revision + 1)`: one
//!   transaction of one key, whatever the number of holdings. The revision rises, since others
//!   judge expiry by seeing the same revision for a whole TTL;
//! - delete: `if live at expected then clear(session key)`, and in the same transaction its
//!   parties removed from every semaphore (`semaphore` module): every holding reads as absent from
//!   then on. No holding key changes, so the change feed of their slots does not fire: a waiter
//!   learns it at its next try, as of an expiry. Releasing each holding first (as
//!   `Holding::release` does) fires it;
//! - acquire: one transaction reads the slot's key and the session's: `if live(session) and
//!   absent(slot) then set(holding)`; a holding of the same session answers its revision.
//!
//! # Liveness marks (`Tx.Marks`)
//!
//! Where the key-value store can tell that a process ended before its TTL says so
//! ([`TxKv::take_mark`]: PostgreSQL's session-level advisory lock, with `death=advisory-lock`):
//! - create: the mark (named by the session record's key) is taken **before** the record is
//!   written, and its epoch written under `<prefix>\0mark/<session>` in the record's own
//!   transaction: a record that names a mark is never seen without it held, and never without
//!   its mark key. A create that wrote nothing gives the mark back; after an unknown outcome it
//!   stays held (the record may be live);
//! - judge: every transaction that reads another session's live record for a holding or a
//!   semaphore party also reads that session's mark key and, when there is one, asks
//!   [`KvTx::mark_free`] in the same transaction. A free mark ends the session exactly as an
//!   expiry by observation does (same transaction, same path: the slot is free, the party
//!   gone). No mark key (a process that takes none, or of an older version), or a store that
//!   cannot tell (another epoch): the TTL alone judges;
//! - wake: a slot's change feed waits on [`TxKv::mark_freed`] of its holder's mark beside its
//!   watches, so a waiter tries again as soon as the holder's mark is freed;
//! - holder: the session's task ends the process when its mark is lost while it lives
//!   ([`SessionStore::mark_lost`]), since waiters may act at once from then on;
//! - delete: the mark key is cleared with the record, and the mark released after the delete
//!   (nothing acts under a session that is being deleted).
//!
//! The TTL never depends on marks: a holder's kill deadline is its keepalives', as without.

use std::time::Duration;

use vvm_core::{Revision, SessionKey, Slot};
use vvm_runtime::{
    Acquired, CallTimedOut, LeaseValue, MarkLost, SessionRecord, SessionStore, StoreError,
};

use super::lease::{
    failed, live_write, next_revision, read_in, Decision, State, Target, TxLeaseStore,
};
use super::record::Record;
use super::{KvTx, TxError, TxKv};

/// What follows the prefix in the key of a session's mark: a NUL byte, which no slot or session
/// key has there (see the `semaphore` module).
const MARK_PART: &[u8] = b"\0mark/";

impl<K: TxKv> TxLeaseStore<K> {
    /// The key holding the epoch of the liveness mark of `session`, when it took one.
    pub(super) fn mark_key(&self, session: SessionKey) -> Vec<u8> {
        let mut key = self.options.prefix.clone();
        key.extend_from_slice(MARK_PART);
        key.extend_from_slice(session.to_string().as_bytes());
        key
    }

    /// Whether the session `session`, whose record `bytes` was read in `tx`, is known ended by
    /// its liveness mark: a live record, a mark key naming an epoch, and the store saying the
    /// mark is free in it. `Ok(Err(retryable))` when the transaction must be run again.
    pub(super) async fn ended_by_mark(
        &self,
        tx: &mut K::Tx,
        session: SessionKey,
        bytes: Option<&[u8]>,
        deadline: tokio::time::Instant,
        slot: Slot,
    ) -> Result<Result<bool, TxError>, StoreError> {
        if !self.kv.has_marks() {
            return Ok(Ok(false));
        }
        if !matches!(bytes.and_then(Record::decode), Some(Record::Live { .. })) {
            return Ok(Ok(false));
        }
        let timeout = self.options.timeout;
        let epoch = match read_in(tx, &self.mark_key(session), deadline, slot, timeout).await? {
            Ok(Some(epoch)) => epoch,
            Ok(None) => return Ok(Ok(false)),
            Err(retry) => return Ok(Err(retry)),
        };
        let mark = self.session_key(session);
        match tokio::time::timeout_at(deadline, tx.mark_free(&mark, &epoch)).await {
            Err(_) => Err(StoreError::failed(CallTimedOut {
                call: "asking for a session's mark",
                slot: slot.0,
                timeout,
            })),
            Ok(Err(error @ TxError::Retryable { .. })) => Ok(Err(error)),
            Ok(Err(error)) => Err(failed(&error)),
            Ok(Ok(free)) => Ok(Ok(free == Some(true))),
        }
    }

    /// Takes the liveness mark of `key`, before the session record is written, and answers its
    /// epoch, which the record's creation writes under the mark key in its transaction; `None`
    /// when the store takes no marks.
    async fn take_mark(&self, key: SessionKey) -> Result<Option<Vec<u8>>, StoreError> {
        if !self.kv.has_marks() {
            return Ok(None);
        }
        let timeout = self.options.timeout;
        tokio::time::timeout(timeout, self.kv.take_mark(&self.session_key(key)))
            .await
            .map_err(|_| {
                StoreError::failed(CallTimedOut {
                    call: "taking the session's mark",
                    slot: 0,
                    timeout,
                })
            })?
            .map_err(|error| failed(&error))
    }
}

impl<K: TxKv> SessionStore for TxLeaseStore<K> {
    async fn create_session(
        &self,
        key: SessionKey,
        value: &LeaseValue,
        ttl: Duration,
    ) -> Result<Option<Revision>, StoreError> {
        // The mark first: a record that names one is never seen without it held; its epoch
        // is written with the record, in one transaction.
        let epoch = self.take_mark(key).await?;
        let mark_key = self.mark_key(key);
        let with = epoch.as_deref().map(|epoch| (mark_key.as_slice(), epoch));
        let bytes = value.encode().into_bytes();
        let created = self
            .transact_with(Target::Session(key), None, with, |state, _| match state {
                State::Absent { revision } => {
                    let revision = next_revision(Slot(0), *revision)?;
                    Ok(live_write(revision, ttl, &bytes))
                }
                State::Live { .. } | State::Unreadable => Ok(Decision::Done(None)),
            })
            .await;
        // Nothing written names the mark: give it back (its connection ends). After an unknown
        // outcome the record may be live and name it, so it stays held.
        if matches!(created, Ok(None) | Err(StoreError::Failed { .. })) {
            self.kv.release_mark(&self.session_key(key));
        }
        created
    }

    async fn keep_alive(
        &self,
        key: SessionKey,
        expected: Revision,
        ttl: Duration,
    ) -> Result<Option<Revision>, StoreError> {
        self.transact(Target::Session(key), None, |state, _| match state {
            State::Live {
                revision, value, ..
            } if *revision == expected.0 => {
                let revision = next_revision(Slot(0), *revision)?;
                Ok(live_write(revision, ttl, value))
            }
            _ => Ok(Decision::Done(None)),
        })
        .await
    }

    async fn delete_session(
        &self,
        key: SessionKey,
        expected: Revision,
    ) -> Result<bool, StoreError> {
        // With its parties in every semaphore, in the same transaction (`semaphore` module).
        let deleted = self.delete_session_and_parties(key, expected).await;
        // Whatever the answer: nothing acts under a session being deleted (its holdings are
        // gone), so a waiter may judge it ended from now.
        self.kv.release_mark(&self.session_key(key));
        deleted
    }

    fn mark_lost(&self, key: SessionKey) -> MarkLost {
        self.kv.mark_lost(&self.session_key(key))
    }

    async fn get_session(&self, key: SessionKey) -> Result<Option<SessionRecord>, StoreError> {
        self.transact(Target::Session(key), None, |state, _| match state {
            State::Live {
                revision, value, ..
            } => {
                let value = LeaseValue::decode(value).map_err(StoreError::failed)?;
                Ok(Decision::Done(Some(SessionRecord {
                    value,
                    revision: Revision(*revision),
                })))
            }
            State::Absent { .. } | State::Unreadable => Ok(Decision::Done(None)),
        })
        .await
    }

    async fn acquire(&self, slot: Slot, key: SessionKey) -> Result<Acquired, StoreError> {
        self.transact(Target::Slot(slot), Some(key), |state, session| {
            let Some(State::Live { value, .. }) = session else {
                return Ok(Decision::Done(Acquired::SessionGone));
            };
            match state {
                State::Absent { revision } => {
                    let revision = next_revision(slot, *revision)?;
                    Ok(Decision::Write {
                        record: Some(Record::Held {
                            revision,
                            session: key,
                            value: value.clone(),
                        }),
                        answer: Acquired::Written(Revision(revision)),
                        own: None,
                    })
                }
                State::Live {
                    revision,
                    session: Some(holder),
                    removed: false,
                    ..
                } if *holder == key => Ok(Decision::Done(Acquired::Written(Revision(*revision)))),
                State::Live { .. } | State::Unreadable => Ok(Decision::Done(Acquired::Held)),
            }
        })
        .await
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::txkv::{MemoryKv, TxOptions};
    use vvm_core::{Incarnation, SessionId};
    use vvm_runtime::LeaseStore;

    const TTL: Duration = Duration::from_secs(10);

    fn value(n: u64) -> LeaseValue {
        LeaseValue {
            address: format!("10.0.0.{n}:7000"),
            incarnation: Incarnation(n),
            stopping: false,
        }
    }

    fn key() -> SessionKey {
        SessionKey {
            incarnation: Incarnation(1),
            id: SessionId(1),
        }
    }

    /// Another process judges a holding by the session's record, by observation: kept alive, it
    /// stays held past a TTL of that process's sightings; unrenewed for a whole TTL after its
    /// first sighting, the slot is free to it.
    // covers: Tx.Sessions
    #[tokio::test(start_paused = true)]
    async fn another_process_judges_a_holding_by_its_sessions_record() {
        let holder = TxLeaseStore::new(MemoryKv::new(), TxOptions::default());
        let other = holder.other_observer();
        let mut revision = holder
            .create_session(key(), &value(1), TTL)
            .await
            .expect("runs")
            .expect("created");
        assert!(matches!(
            holder.acquire(Slot(1), key()).await,
            Ok(Acquired::Written(_))
        ));
        assert!(other.get(Slot(1)).await.expect("read").is_some());
        for _ in 0..3 {
            tokio::time::sleep(TTL / 2).await;
            let kept = holder.keep_alive(key(), revision, TTL).await.expect("runs");
            revision = kept.expect("ours");
            assert!(
                other.get(Slot(1)).await.expect("read").is_some(),
                "kept alive"
            );
        }
        assert_eq!(
            other
                .insert_if_not_exists(Slot(1), &value(2), TTL)
                .await
                .expect("runs"),
            None
        );
        tokio::time::sleep(TTL).await;
        assert_eq!(other.get(Slot(1)).await.expect("read"), None);
        assert!(other
            .insert_if_not_exists(Slot(1), &value(2), TTL)
            .await
            .expect("runs")
            .is_some());
    }
}
