//! An in-process [`LeaseStore`] for tests and single-process use.
//!
//! Expiry is judged by an injected [`TimeSource`] (by default the runtime's [`Clock`], which
//! follows tokio's paused time), so a test moves drivers and store expiry together. Revisions
//! come from one counter for the whole store: they strictly increase per key, also across delete
//! and re-insert. Per key, a [`Fault`] can be injected to reproduce every path of the core, and
//! [`set`](MemoryStore::set), [`overwrite`](MemoryStore::overwrite) and
//! [`delete`](MemoryStore::delete) change records underneath the VVMs.
//!
//! It is also a [`SessionStore`](vvm_runtime::SessionStore) (`session.rs`): session records
//! beside the slot records, and holdings that are slot records naming their session instead of
//! carrying an expiry of their own.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use tokio::sync::watch;
use vvm_core::{Instant, Revision, SessionKey, Slot};
use vvm_runtime::{
    Clock, Inserted, Lease, LeaseStore, LeaseValue, SlotChange, StoreError, TimeSource,
};

mod semaphore;
mod session;

/// Most live or expired-but-not-yet-pruned records the store holds, slot records and holdings
/// together: 2^20, as many as one session may hold (`vvm_core::HOLDINGS_MAX`).
pub const RECORDS_MAX: usize = 1 << 20;

/// Most session records the store holds.
pub const SESSIONS_MAX: usize = 65_536;

/// One of the four store operations; used to aim faults and to count calls.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Op {
    /// `insert_if_not_exists`, or `insert_or_time_left` (one call here).
    Insert,
    /// `compare_and_swap`.
    CompareAndSwap,
    /// `compare_and_delete`.
    CompareAndDelete,
    /// `get`.
    Get,
}

/// Why a call to the memory store failed: the cause inside its [`StoreError`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum MemoryStoreError {
    /// [`RECORDS_MAX`] live records exist; nothing was written.
    #[error("memory store is full ({RECORDS_MAX} records)")]
    Full,
    /// [`SESSIONS_MAX`] live session records exist; nothing was written.
    #[error("memory store is full ({SESSIONS_MAX} sessions)")]
    SessionsFull,
    /// A test injected this failure (see [`Injection`]).
    #[error("injected {fault:?} on slot {slot}")]
    Injected {
        /// The key.
        slot: u32,
        /// What was injected.
        fault: Fault,
    },
}

/// What goes wrong with a call hit by an injection.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fault {
    /// Fails with [`StoreError::Failed`]; nothing is applied.
    Fail,
    /// The operation is applied, then reported as [`StoreError::Unknown`].
    UnknownCommitted,
    /// Reported as [`StoreError::Unknown`]; nothing is applied.
    UnknownNotCommitted,
    /// Waits this long (on tokio's clock), then applies the operation normally.
    Delay(Duration),
    /// Never completes; only the caller's timeout ends the call.
    Hang,
}

/// A [`Fault`] aimed at one key: optionally only at one [`Op`], optionally only a number of times.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Injection {
    fault: Fault,
    op: Option<Op>,
    times: Option<u32>,
}

impl Injection {
    /// `fault` on every operation, until cleared.
    pub const fn new(fault: Fault) -> Self {
        Injection {
            fault,
            op: None,
            times: None,
        }
    }

    /// Only calls of `op` are hit.
    pub const fn on(mut self, op: Op) -> Self {
        self.op = Some(op);
        self
    }

    /// Only the next `times` calls that match are hit; then the injection removes itself.
    pub const fn times(mut self, times: u32) -> Self {
        self.times = Some(times);
        self
    }
}

#[derive(Clone, Debug)]
struct Stored {
    bytes: Vec<u8>,
    revision: Revision,
    /// Unused for a holding: its session's expiry is its own.
    expires_at: Instant,
    /// The session of a holding; `None` for a slot record.
    session: Option<SessionKey>,
}

#[derive(Debug, Default)]
struct Inner {
    records: HashMap<Slot, Stored>,
    revision: u64,
    faults: HashMap<Slot, Injection>,
    calls: HashMap<(Slot, Op), u64>,
    /// The change feed of each slot somebody waited on; bumped under the same lock as the write,
    /// so a waiter that subscribed before a write always sees it. Bumped when a record is
    /// removed (deleted, or found expired) or written by another holder — not when its holder
    /// renews it (same bytes): a waiting candidate wakes only when it may win.
    feeds: HashMap<Slot, watch::Sender<()>>,
    /// Session records, each with the slots it holds.
    sessions: HashMap<SessionKey, session::SessionRecord>,
    /// Semaphores, whose parties name sessions.
    semaphores: semaphore::Semaphores,
}

impl Inner {
    /// The live record under `key`; an expired one is removed and treated as absent. A holding
    /// is live while its session is; an expired session is removed with all its holdings.
    fn live(&mut self, key: Slot, now: Instant) -> Option<&Stored> {
        let expired = match self.records.get(&key) {
            None => false,
            Some(Stored {
                session: Some(session),
                ..
            }) => {
                let session = *session;
                !self.session_live(session, now)
            }
            Some(record) => record.expires_at <= now,
        };
        if expired {
            self.remove(key);
        }
        self.records.get(&key)
    }

    /// When the live record under `key` ends, if there is one.
    fn live_until(&mut self, key: Slot, now: Instant) -> Option<Instant> {
        self.live(key, now)?;
        self.records.get(&key).map(|stored| self.expires_at(stored))
    }

    /// When the live record under `key` ends: its own expiry, or its session's.
    fn expires_at(&self, stored: &Stored) -> Instant {
        stored
            .session
            .and_then(|session| self.sessions.get(&session))
            .map_or(stored.expires_at, |session| session.expires_at)
    }

    /// Removes the record under `key`, telling the waiters of its feed; a holding leaves its
    /// session's set.
    fn remove(&mut self, key: Slot) -> Option<Stored> {
        let removed = self.records.remove(&key);
        if let Some(stored) = &removed {
            self.unlink(key, stored);
            self.changed(key);
        }
        removed
    }

    fn changed(&self, key: Slot) {
        if let Some(feed) = self.feeds.get(&key) {
            // `send_replace` notifies even when every receiver is gone; the sender stays for
            // the next waiter, so the map holds at most one sender per slot ever waited on.
            feed.send_replace(());
        }
    }

    fn write(
        &mut self,
        key: Slot,
        bytes: Vec<u8>,
        now: Instant,
        ttl: Duration,
    ) -> Result<Revision, StoreError> {
        if self.records.len() >= RECORDS_MAX && !self.records.contains_key(&key) {
            let ended: Vec<Slot> = self
                .records
                .iter()
                .filter(|(_, record)| self.expires_at(record) <= now)
                .map(|(key, _)| *key)
                .collect();
            for key in ended {
                self.remove(key);
            }
            if self.records.len() >= RECORDS_MAX {
                return Err(StoreError::failed(MemoryStoreError::Full));
            }
        }
        let revision = self.next_revision();
        let stored = Stored {
            bytes,
            revision,
            expires_at: now + ttl,
            session: None,
        };
        // A record is live here (callers prune expired ones first): same bytes = same holder.
        let renewal = self
            .records
            .get(&key)
            .is_some_and(|old| self.expires_at(old) > now && old.bytes == stored.bytes);
        if let Some(old) = self.records.insert(key, stored) {
            self.unlink(key, &old);
        }
        if !renewal {
            self.changed(key);
        }
        Ok(revision)
    }

    /// The store's next revision: one counter for every key and session.
    fn next_revision(&mut self) -> Revision {
        self.revision += 1;
        Revision(self.revision)
    }

    /// Counts the call and takes the fault that hits it, if any.
    fn fault_for(&mut self, key: Slot, op: Op) -> Option<Fault> {
        *self.calls.entry((key, op)).or_default() += 1;
        let injection = self.faults.get_mut(&key)?;
        if injection.op.is_some_and(|aimed| aimed != op) {
            return None;
        }
        let fault = injection.fault;
        if let Some(times) = injection.times.as_mut() {
            *times = times.saturating_sub(1);
            if *times == 0 {
                self.faults.remove(&key);
            }
        }
        Some(fault)
    }
}

fn matches(stored: &Stored, expected: &Lease) -> bool {
    stored.revision == expected.revision && stored.bytes == expected.value.encode().as_bytes()
}

fn decode(key: Slot, stored: &Stored) -> Result<Lease, StoreError> {
    let value = LeaseValue::decode(&stored.bytes).map_err(|source| StoreError::Corrupt {
        slot: key.0,
        source,
    })?;
    Ok(Lease {
        value,
        revision: stored.revision,
    })
}

/// The in-memory store. Cloning shares the records.
#[derive(Clone)]
pub struct MemoryStore {
    inner: Arc<Mutex<Inner>>,
    time: Arc<dyn TimeSource>,
}

impl std::fmt::Debug for MemoryStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MemoryStore").finish_non_exhaustive()
    }
}

impl Default for MemoryStore {
    fn default() -> Self {
        MemoryStore::new()
    }
}

impl MemoryStore {
    /// An empty store whose expiry follows the runtime's [`Clock`].
    pub fn new() -> Self {
        MemoryStore::with_time(Clock)
    }

    /// An empty store whose expiry follows `time`.
    pub fn with_time(time: impl TimeSource) -> Self {
        MemoryStore {
            inner: Arc::default(),
            time: Arc::new(time),
        }
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        // The critical sections cannot leave the map half-updated; a poisoned lock is usable.
        self.inner.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Makes calls on `key` misbehave as `injection` says, replacing any earlier injection.
    pub fn inject(&self, key: Slot, injection: Injection) {
        self.lock().faults.insert(key, injection);
    }

    /// Removes the injection on `key`.
    pub fn clear_fault(&self, key: Slot) {
        self.lock().faults.remove(&key);
    }

    /// How many calls of `op` on `key` were made, faulty ones included.
    pub fn calls(&self, key: Slot, op: Op) -> u64 {
        self.lock().calls.get(&(key, op)).copied().unwrap_or(0)
    }

    /// The live record under `key`, read without faults or counting.
    pub fn record(&self, key: Slot) -> Result<Option<Lease>, StoreError> {
        let now = self.time.now();
        let mut inner = self.lock();
        inner
            .live(key, now)
            .map(|stored| decode(key, stored))
            .transpose()
    }

    /// Writes `value` under `key` for `ttl` whatever is there; returns the new revision.
    pub fn set(
        &self,
        key: Slot,
        value: &LeaseValue,
        ttl: Duration,
    ) -> Result<Revision, StoreError> {
        self.set_raw(key, value.encode().into_bytes(), ttl)
    }

    /// Writes arbitrary bytes under `key` for `ttl`, e.g. a record no VVM can read.
    pub fn set_raw(
        &self,
        key: Slot,
        bytes: Vec<u8>,
        ttl: Duration,
    ) -> Result<Revision, StoreError> {
        let now = self.time.now();
        self.lock().write(key, bytes, now, ttl)
    }

    /// Replaces the value of the live record under `key`, keeping its expiry; `None` when
    /// there is no live record.
    pub fn overwrite(&self, key: Slot, value: &LeaseValue) -> Result<Option<Revision>, StoreError> {
        let now = self.time.now();
        let mut inner = self.lock();
        let Some(expires_at) = inner.live_until(key, now) else {
            return Ok(None);
        };
        let ttl = expires_at.saturating_since(now);
        inner
            .write(key, value.encode().into_bytes(), now, ttl)
            .map(Some)
    }

    /// Deletes the live record under `key`; whether there was one.
    pub fn delete(&self, key: Slot) -> bool {
        let now = self.time.now();
        let mut inner = self.lock();
        let live = inner.live(key, now).is_some();
        inner.remove(key);
        live
    }

    /// Applies a fault that precedes the operation; `Err` ends the call, `Ok(applies_then_unknown)`
    /// lets it run.
    async fn before(&self, key: Slot, op: Op) -> Result<bool, StoreError> {
        let fault = self.lock().fault_for(key, op);
        match fault {
            None => Ok(false),
            Some(Fault::Fail) => Err(StoreError::failed(MemoryStoreError::Injected {
                slot: key.0,
                fault: Fault::Fail,
            })),
            Some(Fault::UnknownNotCommitted) => Err(unknown(key, Fault::UnknownNotCommitted)),
            Some(Fault::UnknownCommitted) => Ok(true),
            Some(Fault::Delay(delay)) => {
                tokio::time::sleep(delay).await;
                Ok(false)
            }
            Some(Fault::Hang) => std::future::pending().await,
        }
    }
}

fn unknown(key: Slot, fault: Fault) -> StoreError {
    StoreError::unknown(MemoryStoreError::Injected { slot: key.0, fault })
}

/// `Ok(result)`, or the injected unknown outcome after the operation was applied.
fn finish<T>(
    key: Slot,
    then_unknown: bool,
    result: Result<T, StoreError>,
) -> Result<T, StoreError> {
    match (then_unknown, result) {
        (true, Ok(_)) => Err(unknown(key, Fault::UnknownCommitted)),
        (_, result) => result,
    }
}

impl LeaseStore for MemoryStore {
    async fn insert_if_not_exists(
        &self,
        key: Slot,
        value: &LeaseValue,
        ttl: Duration,
    ) -> Result<Option<Revision>, StoreError> {
        let then_unknown = self.before(key, Op::Insert).await?;
        let now = self.time.now();
        let mut inner = self.lock();
        let result = match inner.live(key, now) {
            Some(_) => Ok(None),
            None => inner
                .write(key, value.encode().into_bytes(), now, ttl)
                .map(Some),
        };
        finish(key, then_unknown, result)
    }

    /// One call: the insert and, when refused, the refusing record's exact time left, judged
    /// under one lock. Counted and faulted as [`Op::Insert`].
    async fn insert_or_time_left(
        &self,
        key: Slot,
        value: &LeaseValue,
        ttl: Duration,
    ) -> Result<Inserted, StoreError> {
        let then_unknown = self.before(key, Op::Insert).await?;
        let now = self.time.now();
        let mut inner = self.lock();
        let result = match inner.live_until(key, now) {
            Some(expires_at) => Ok(Inserted::Held {
                left: Some(expires_at.saturating_since(now)),
            }),
            None => inner
                .write(key, value.encode().into_bytes(), now, ttl)
                .map(Inserted::Written),
        };
        finish(key, then_unknown, result)
    }

    async fn compare_and_swap(
        &self,
        key: Slot,
        expected: &Lease,
        new_value: &LeaseValue,
        ttl: Duration,
    ) -> Result<Option<Revision>, StoreError> {
        let then_unknown = self.before(key, Op::CompareAndSwap).await?;
        let now = self.time.now();
        let mut inner = self.lock();
        let result = match inner.live(key, now) {
            Some(stored) if matches(stored, expected) => inner
                .write(key, new_value.encode().into_bytes(), now, ttl)
                .map(Some),
            _ => Ok(None),
        };
        finish(key, then_unknown, result)
    }

    async fn compare_and_delete(&self, key: Slot, expected: &Lease) -> Result<bool, StoreError> {
        let then_unknown = self.before(key, Op::CompareAndDelete).await?;
        let now = self.time.now();
        let mut inner = self.lock();
        let result = match inner.live(key, now) {
            Some(stored) if matches(stored, expected) => {
                inner.remove(key);
                Ok(true)
            }
            _ => Ok(false),
        };
        finish(key, then_unknown, result)
    }

    /// Exact: the store judges expiry itself. Not subject to faults (display only).
    async fn time_left(&self, key: Slot) -> Result<Option<Duration>, StoreError> {
        let now = self.time.now();
        let mut inner = self.lock();
        Ok(inner
            .live_until(key, now)
            .map(|at| at.saturating_since(now)))
    }

    /// In-process: a delete, an expired record removed, or a write by another holder under one
    /// of `keys` wakes the waiter; a renewal by the same holder does not. An expiry nobody
    /// touched is not seen (no timer per record); the waiter's own timer (the record's expiry,
    /// learnt from its refused insert) covers it. Not subject to faults and not counted: it is no store call.
    fn changed(&self, keys: &[Slot]) -> SlotChange {
        let mut inner = self.lock();
        let mut waits: Vec<SlotChange> = keys
            .iter()
            .map(|key| {
                let mut rx = inner
                    .feeds
                    .entry(*key)
                    .or_insert_with(|| watch::channel(()).0)
                    .subscribe();
                let wait: SlotChange = Box::pin(async move {
                    // A closed feed (the store is gone) never changes again: keep waiting.
                    if rx.changed().await.is_err() {
                        std::future::pending::<()>().await;
                    }
                });
                wait
            })
            .collect();
        drop(inner);
        Box::pin(std::future::poll_fn(move |cx| {
            // Each wait keeps its registration between polls; the first to resolve ends it.
            if waits
                .iter_mut()
                .any(|wait| wait.as_mut().poll(cx).is_ready())
            {
                std::task::Poll::Ready(())
            } else {
                std::task::Poll::Pending
            }
        }))
    }

    fn has_change_feed(&self) -> bool {
        true
    }

    async fn get(&self, key: Slot) -> Result<Option<Lease>, StoreError> {
        let then_unknown = self.before(key, Op::Get).await?;
        let now = self.time.now();
        let mut inner = self.lock();
        let result = inner
            .live(key, now)
            .map(|stored| decode(key, stored))
            .transpose();
        finish(key, then_unknown, result)
    }
}
