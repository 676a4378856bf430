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

use std::time::Duration;

use vvm_core::{Revision, SessionKey, Slot};
use vvm_runtime::{Acquired, LeaseValue, SessionRecord, SessionStore, StoreError};

use super::lease::{live_write, next_revision, Decision, State, Target, TxLeaseStore};
use super::record::Record;
use super::TxKv;

impl<K: TxKv> SessionStore for TxLeaseStore<K> {
    async fn create_session(
        &self,
        key: SessionKey,
        value: &LeaseValue,
        ttl: Duration,
    ) -> Result<Option<Revision>, StoreError> {
        let bytes = value.encode().into_bytes();
        self.transact(Target::Session(key), None, |state, _| match state {
            State::Absent { revision } => {
                let revision = next_revision(Slot(0), *revision)?;
                Ok(live_write(revision, ttl, &bytes))
            }
            State::Live { .. } | State::Unreadable => Ok(Decision::Done(None)),
        })
        .await
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
        self.delete_session_and_parties(key, expected).await
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
