//! Sessions of the memory store: a map of session records beside the slot records. A holding is
//! a slot record that names its session and is live while the session is; the session keeps
//! the set of its slots, so ending it (expired, deleted) ends its holdings in one step.
//!
//! Costs: a keepalive touches only the session record, O(1) whatever the number of holdings;
//! an acquire and a release are O(1); the end of a session is O(its holdings), once. Expiry is
//! judged when a record is looked at, as for slot records: a session nobody looks at stays in
//! the map until then (at most [`SESSIONS_MAX`]).

use std::collections::HashSet;
use std::time::Duration;

use vvm_core::{Instant, Revision, SessionKey, Slot};
use vvm_runtime::{Acquired, LeaseValue, SessionRecord as Record, SessionStore, StoreError};

use super::{Inner, MemoryStore, MemoryStoreError, Stored, RECORDS_MAX, SESSIONS_MAX};

/// A session record and the slots it holds.
#[derive(Debug)]
pub(super) struct SessionRecord {
    bytes: Vec<u8>,
    revision: Revision,
    pub(super) expires_at: Instant,
    slots: HashSet<Slot>,
}

impl Inner {
    /// Whether the session record `key` is live; an expired one is removed with its holdings.
    pub(super) fn session_live(&mut self, key: SessionKey, now: Instant) -> bool {
        match self.sessions.get(&key) {
            None => false,
            Some(session) if session.expires_at > now => true,
            Some(_) => {
                self.end_session(key);
                false
            }
        }
    }

    /// Removes the session record `key` and every holding of it, telling each slot's waiters.
    fn end_session(&mut self, key: SessionKey) {
        let Some(session) = self.sessions.remove(&key) else {
            return;
        };
        for slot in session.slots {
            if self.records.remove(&slot).is_some() {
                self.changed(slot);
            }
        }
        self.end_semaphore_parties(key);
    }

    /// Takes a removed or replaced record of `slot` out of its session's set.
    pub(super) fn unlink(&mut self, slot: Slot, stored: &Stored) {
        if let Some(session) = stored.session.and_then(|key| self.sessions.get_mut(&key)) {
            session.slots.remove(&slot);
        }
    }
}

impl SessionStore for MemoryStore {
    async fn create_session(
        &self,
        key: SessionKey,
        value: &LeaseValue,
        ttl: Duration,
    ) -> Result<Option<Revision>, StoreError> {
        let now = self.time.now();
        let mut inner = self.lock();
        if inner.session_live(key, now) {
            return Ok(None);
        }
        if inner.sessions.len() >= SESSIONS_MAX {
            let ended: Vec<SessionKey> = inner
                .sessions
                .iter()
                .filter(|(_, session)| session.expires_at <= now)
                .map(|(key, _)| *key)
                .collect();
            for key in ended {
                inner.end_session(key);
            }
            if inner.sessions.len() >= SESSIONS_MAX {
                return Err(StoreError::failed(MemoryStoreError::SessionsFull));
            }
        }
        let revision = inner.next_revision();
        inner.sessions.insert(
            key,
            SessionRecord {
                bytes: value.encode().into_bytes(),
                revision,
                expires_at: now + ttl,
                slots: HashSet::new(),
            },
        );
        Ok(Some(revision))
    }

    /// Moves the expiry only: the revision stays, and no holding is touched.
    async fn keep_alive(
        &self,
        key: SessionKey,
        expected: Revision,
        ttl: Duration,
    ) -> Result<Option<Revision>, StoreError> {
        let now = self.time.now();
        let mut inner = self.lock();
        if !inner.session_live(key, now) {
            return Ok(None);
        }
        Ok(inner
            .sessions
            .get_mut(&key)
            .filter(|session| session.revision == expected)
            .map(|session| {
                session.expires_at = now + ttl;
                session.revision
            }))
    }

    async fn delete_session(
        &self,
        key: SessionKey,
        expected: Revision,
    ) -> Result<bool, StoreError> {
        let now = self.time.now();
        let mut inner = self.lock();
        let ours = inner.session_live(key, now)
            && inner
                .sessions
                .get(&key)
                .is_some_and(|session| session.revision == expected);
        if ours {
            inner.end_session(key);
        }
        Ok(ours)
    }

    async fn get_session(&self, key: SessionKey) -> Result<Option<Record>, StoreError> {
        let now = self.time.now();
        let mut inner = self.lock();
        if !inner.session_live(key, now) {
            return Ok(None);
        }
        let Some(session) = inner.sessions.get(&key) else {
            return Ok(None);
        };
        let value = LeaseValue::decode(&session.bytes).map_err(StoreError::failed)?;
        Ok(Some(Record {
            value,
            revision: session.revision,
        }))
    }

    async fn acquire(&self, slot: Slot, key: SessionKey) -> Result<Acquired, StoreError> {
        let now = self.time.now();
        let mut inner = self.lock();
        if !inner.session_live(key, now) {
            return Ok(Acquired::SessionGone);
        }
        if let Some(stored) = inner.live(slot, now) {
            return Ok(match stored.session {
                Some(holder) if holder == key => Acquired::Written(stored.revision),
                _ => Acquired::Held,
            });
        }
        if inner.records.len() >= RECORDS_MAX {
            return Err(StoreError::failed(MemoryStoreError::Full));
        }
        let revision = inner.next_revision();
        let Some(session) = inner.sessions.get_mut(&key) else {
            return Ok(Acquired::SessionGone);
        };
        session.slots.insert(slot);
        let stored = Stored {
            bytes: session.bytes.clone(),
            revision,
            expires_at: session.expires_at,
            session: Some(key),
        };
        inner.records.insert(slot, stored);
        inner.changed(slot);
        Ok(Acquired::Written(revision))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use vvm_core::{Incarnation, SessionId};
    use vvm_runtime::LeaseStore;

    fn key(n: u64) -> SessionKey {
        SessionKey {
            incarnation: Incarnation(n),
            id: SessionId(1),
        }
    }

    fn value(n: u64) -> LeaseValue {
        LeaseValue {
            address: format!("10.0.0.{n}:7000"),
            incarnation: Incarnation(n),
            stopping: false,
        }
    }

    /// On tokio's paused clock: a keepalive extends every holding's life at once, touching
    /// nothing but the session record, and the holdings end with the session's new expiry.
    // covers: St.HoldingsLiveWithTheSession
    #[tokio::test(start_paused = true)]
    async fn a_keepalive_extends_every_holding_and_they_end_with_the_session() {
        let store = MemoryStore::new();
        let ttl = Duration::from_secs(10);
        let revision = store
            .create_session(key(1), &value(1), ttl)
            .await
            .expect("runs")
            .expect("created");
        for slot in 0..1_000 {
            assert!(matches!(
                store.acquire(Slot(slot), key(1)).await,
                Ok(Acquired::Written(_))
            ));
        }
        tokio::time::sleep(Duration::from_secs(8)).await;
        assert_eq!(
            store.keep_alive(key(1), revision, ttl).await,
            Ok(Some(revision))
        );
        tokio::time::sleep(Duration::from_secs(8)).await;
        assert!(store.get(Slot(999)).await.expect("read").is_some());
        assert_eq!(
            store.time_left(Slot(0)).await,
            Ok(Some(Duration::from_secs(2)))
        );
        tokio::time::sleep(Duration::from_secs(2)).await;
        for slot in [0, 500, 999] {
            assert_eq!(store.get(Slot(slot)).await, Ok(None));
        }
        assert!(store.lock().records.is_empty(), "every holding was removed");
        assert!(store.lock().sessions.is_empty());
    }
}
