//! One wrapper for the stores the tests and benchmarks bend: a store seen through [`Hooks`] that
//! count its calls, hang them, act on an answer, or hide its change feed and time left. Shared by
//! the tests and the benchmarks.

use std::future::Future;
use std::time::Duration;

use vvm_core::{Revision, Slot};

use vvm_runtime::{Inserted, Lease, LeaseStore, LeaseValue, SlotChange, StoreError};

/// What a [`Hooked`] store does around the calls it passes on. Every method has a default that
/// changes nothing.
pub trait Hooks: Send + Sync + 'static {
    /// Runs before every store call (the change feed is no call): count it, hang it, ...
    fn before(&self) -> impl Future<Output = ()> + Send {
        async {}
    }

    /// Sees the answer of an insert that reports the time left; may act on the store.
    fn after_insert(&self, key: Slot, inserted: &Result<Inserted, StoreError>) {
        let _ = (key, inserted);
    }

    /// Whether the store's change feed shows through (else `changed` never resolves and
    /// `has_change_feed` is false).
    fn feed(&self) -> bool {
        true
    }

    /// Whether a refused insert tells the record's time left, and `time_left` answers.
    fn time_left(&self) -> bool {
        true
    }
}

/// `store` seen through `hooks`.
#[derive(Clone, Default)]
pub struct Hooked<S, H> {
    /// The store passed on to.
    pub store: S,
    /// What happens around the calls.
    pub hooks: H,
}

impl<S: LeaseStore, H: Hooks> LeaseStore for Hooked<S, H> {
    async fn insert_if_not_exists(
        &self,
        key: Slot,
        value: &LeaseValue,
        ttl: Duration,
    ) -> Result<Option<Revision>, StoreError> {
        self.hooks.before().await;
        self.store.insert_if_not_exists(key, value, ttl).await
    }

    // One call when the store answers both in one (memory, SQLite): one `before` too.
    async fn insert_or_time_left(
        &self,
        key: Slot,
        value: &LeaseValue,
        ttl: Duration,
    ) -> Result<Inserted, StoreError> {
        self.hooks.before().await;
        let inserted = match self.hooks.time_left() {
            true => self.store.insert_or_time_left(key, value, ttl).await,
            false => match self.store.insert_if_not_exists(key, value, ttl).await {
                Ok(Some(revision)) => Ok(Inserted::Written(revision)),
                Ok(None) => Ok(Inserted::Held { left: None }),
                Err(error) => Err(error),
            },
        };
        self.hooks.after_insert(key, &inserted);
        inserted
    }

    async fn compare_and_swap(
        &self,
        key: Slot,
        expected: &Lease,
        new_value: &LeaseValue,
        ttl: Duration,
    ) -> Result<Option<Revision>, StoreError> {
        self.hooks.before().await;
        self.store
            .compare_and_swap(key, expected, new_value, ttl)
            .await
    }

    async fn compare_and_delete(&self, key: Slot, expected: &Lease) -> Result<bool, StoreError> {
        self.hooks.before().await;
        self.store.compare_and_delete(key, expected).await
    }

    async fn get(&self, key: Slot) -> Result<Option<Lease>, StoreError> {
        self.hooks.before().await;
        self.store.get(key).await
    }

    async fn time_left(&self, key: Slot) -> Result<Option<Duration>, StoreError> {
        self.hooks.before().await;
        match self.hooks.time_left() {
            true => self.store.time_left(key).await,
            false => Ok(None),
        }
    }

    fn changed(&self, keys: &[Slot]) -> SlotChange {
        match self.hooks.feed() {
            true => self.store.changed(keys),
            false => Box::pin(std::future::pending()),
        }
    }

    fn changed_for_candidate(&self, keys: &[Slot]) -> SlotChange {
        match self.hooks.feed() {
            true => self.store.changed_for_candidate(keys),
            false => Box::pin(std::future::pending()),
        }
    }

    fn has_change_feed(&self) -> bool {
        self.hooks.feed() && self.store.has_change_feed()
    }
}

/// Hides a store's change feed — what a store without one looks like to its candidates.
#[derive(Clone, Copy, Debug, Default)]
pub struct NoFeed {
    /// Whether a refused insert still tells the record's time left.
    time_left: bool,
}

impl NoFeed {
    /// Hides the feed only: a refused insert still tells the record's time left.
    pub fn new<S>(store: S) -> Hooked<S, NoFeed> {
        Hooked {
            store,
            hooks: NoFeed { time_left: true },
        }
    }

    /// Hides the feed and the time left: candidates poll in rounds, as every store did before
    /// either existed.
    pub fn rounds_only<S>(store: S) -> Hooked<S, NoFeed> {
        Hooked {
            store,
            hooks: NoFeed { time_left: false },
        }
    }
}

impl Hooks for NoFeed {
    fn feed(&self) -> bool {
        false
    }

    fn time_left(&self) -> bool {
        self.time_left
    }
}
