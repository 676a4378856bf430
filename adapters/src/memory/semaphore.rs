//! Semaphores of the memory store ([`SemaphoreStore`]): a map of states by name beside the
//! slot and session records, under the store's one lock, so every operation is one
//! transaction of [`vvm_runtime::semaphore_store::transact`].
//!
//! Parties are judged by their sessions' records: a party whose session expired is removed by
//! the next operation on its semaphore (lazily), and ending a session — its delete, or its
//! expiry noticed by any operation of the store — removes its parties from every semaphore at
//! once (eagerly), waking each semaphore's feed. That eager pass costs O(semaphores · parties)
//! once per ended session: the memory store is for tests and one process.
//!
//! A deleted semaphore leaves its counters behind (one entry per name ever deleted), so that
//! one created again under the name continues its tokens and order ids.

use std::collections::HashMap;
use std::time::Duration;

use tokio::sync::watch;
use vvm_core::semaphore::{Generation, OrderId, Semaphore, SemaphoreName, SessionKey};
use vvm_core::Instant;
use vvm_runtime::semaphore_store::{transact, Write};
use vvm_runtime::{
    Applied, SemaphoreChange, SemaphoreRequest, SemaphoreStore, SemaphoreStoreError,
};
use vvm_runtime::{NamesPage, SemaphoreNames, StoreError};

use super::{Inner, MemoryStore};

/// The semaphores of one memory store.
#[derive(Debug, Default)]
pub(super) struct Semaphores {
    states: HashMap<SemaphoreName, Semaphore>,
    /// Counters of deleted semaphores, by name.
    counters: HashMap<SemaphoreName, (Generation, OrderId)>,
    /// The change feed of each name somebody waited on; bumped under the store's lock with
    /// every write, so a wait that subscribed before a write always sees it.
    feeds: HashMap<SemaphoreName, watch::Sender<()>>,
}

impl Semaphores {
    fn changed(&self, name: &SemaphoreName) {
        if let Some(feed) = self.feeds.get(name) {
            feed.send_replace(());
        }
    }

    /// Applies what a transaction decided.
    fn write(&mut self, name: &SemaphoreName, write: Write) {
        match write {
            Write::Keep => return,
            Write::Put(state) => {
                self.states.insert(name.clone(), state);
            }
            Write::Delete {
                generation,
                next_order_id,
            } => {
                self.states.remove(name);
                self.counters
                    .insert(name.clone(), (generation, next_order_id));
            }
        }
        self.changed(name);
    }
}

impl Inner {
    /// Time the session `key` has left, `None` when it is not live (an expired one is ended).
    fn session_left(&mut self, key: SessionKey, now: Instant) -> Option<Duration> {
        if !self.session_live(key, now) {
            return None;
        }
        self.sessions
            .get(&key)
            .map(|session| session.expires_at.saturating_since(now))
    }

    /// Removes the parties of the ended session `key` from every semaphore, granting those
    /// behind them.
    pub(super) fn end_semaphore_parties(&mut self, key: SessionKey) {
        let names: Vec<SemaphoreName> = self
            .semaphores
            .states
            .iter()
            .filter(|(_, state)| {
                state.owners().iter().any(|o| o.session == key)
                    || state.waiters().iter().any(|w| w.session == key)
            })
            .map(|(name, _)| name.clone())
            .collect();
        for name in names {
            let Some(state) = self.semaphores.states.remove(&name) else {
                continue;
            };
            let write = Write::ending_session(state, key);
            // Only semaphores the session is a party of were picked: never `Keep`, which would
            // leave the state removed.
            debug_assert_ne!(write, Write::Keep);
            self.semaphores.write(&name, write);
        }
    }
}

impl SemaphoreStore for MemoryStore {
    async fn semaphore(
        &self,
        session: SessionKey,
        name: &SemaphoreName,
        request: SemaphoreRequest,
    ) -> Result<Applied, SemaphoreStoreError> {
        let now = self.time.now();
        let mut inner = self.lock();
        // Taken out while the transaction runs: judging a session may end another one, whose
        // eager pass must not see this semaphore half-done (the lazy pass below covers it).
        let stored = inner.semaphores.states.remove(name);
        let counters = inner.semaphores.counters.get(name).copied();
        let kept = stored.clone();
        let result = transact(stored, counters, session, name, request, |key| {
            Ok::<_, std::convert::Infallible>(inner.session_left(key, now))
        });
        let Ok(result) = result;
        match result {
            Ok((write, applied)) => {
                if let (Write::Keep, Some(state)) = (&write, kept) {
                    inner.semaphores.states.insert(name.clone(), state);
                }
                inner.semaphores.write(name, write);
                Ok(applied)
            }
            Err(error) => {
                if let Some(state) = kept {
                    inner.semaphores.states.insert(name.clone(), state);
                }
                Err(error)
            }
        }
    }

    /// The map's names, sorted here: O(semaphores · log) under the lock (the memory store is
    /// for tests and one process).
    async fn semaphore_names(&self, page: &NamesPage) -> Result<SemaphoreNames, StoreError> {
        let mut names: Vec<SemaphoreName> = {
            let inner = self.lock();
            let after = page.after();
            inner
                .semaphores
                .states
                .keys()
                .filter(|name| after.is_none_or(|after| *name > after))
                .cloned()
                .collect()
        };
        names.sort_unstable();
        Ok(page.take(names))
    }

    /// In-process: every write of `name` (and its delete) wakes the wait.
    fn semaphore_changed(&self, name: &SemaphoreName) -> SemaphoreChange {
        let mut rx = self
            .lock()
            .semaphores
            .feeds
            .entry(name.clone())
            .or_insert_with(|| watch::channel(()).0)
            .subscribe();
        Box::pin(async move {
            // A closed feed (the store is gone) never changes again: keep waiting.
            if rx.changed().await.is_err() {
                std::future::pending::<()>().await;
            }
        })
    }
}
