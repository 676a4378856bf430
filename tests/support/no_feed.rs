//! A store seen through a wrapper that hides its change feed — what a store without one looks
//! like to its candidates. Shared by the tests and the benchmarks (`#[path]`-included).
#![allow(dead_code)]

use std::time::Duration;

use vvm::{Inserted, Lease, LeaseStore, LeaseValue, Revision, Slot, StoreError};

/// `S` without its change feed (`changed` never resolves, `has_change_feed` is false).
#[derive(Clone, Default)]
pub struct NoFeed<S> {
    store: S,
    /// Whether a refused insert still tells the record's time left.
    time_left: bool,
}

impl<S> NoFeed<S> {
    /// Hides the feed only: a refused insert still tells the record's time left.
    pub fn new(store: S) -> Self {
        NoFeed {
            store,
            time_left: true,
        }
    }

    /// Hides the feed and the time left: candidates poll in rounds, as every store did before
    /// either existed.
    pub fn rounds_only(store: S) -> Self {
        NoFeed {
            store,
            time_left: false,
        }
    }
}

impl<S: LeaseStore> LeaseStore for NoFeed<S> {
    async fn insert_if_not_exists(
        &self,
        key: Slot,
        value: &LeaseValue,
        ttl: Duration,
    ) -> Result<Option<Revision>, StoreError> {
        self.store.insert_if_not_exists(key, value, ttl).await
    }

    async fn insert_or_time_left(
        &self,
        key: Slot,
        value: &LeaseValue,
        ttl: Duration,
    ) -> Result<Inserted, StoreError> {
        if self.time_left {
            return self.store.insert_or_time_left(key, value, ttl).await;
        }
        Ok(
            match self.store.insert_if_not_exists(key, value, ttl).await? {
                Some(revision) => Inserted::Written(revision),
                None => Inserted::Held { left: None },
            },
        )
    }

    async fn compare_and_swap(
        &self,
        key: Slot,
        expected: &Lease,
        new_value: &LeaseValue,
        ttl: Duration,
    ) -> Result<Option<Revision>, StoreError> {
        self.store
            .compare_and_swap(key, expected, new_value, ttl)
            .await
    }

    async fn compare_and_delete(&self, key: Slot, expected: &Lease) -> Result<bool, StoreError> {
        self.store.compare_and_delete(key, expected).await
    }

    async fn get(&self, key: Slot) -> Result<Option<Lease>, StoreError> {
        self.store.get(key).await
    }

    async fn time_left(&self, key: Slot) -> Result<Option<Duration>, StoreError> {
        if self.time_left {
            self.store.time_left(key).await
        } else {
            Ok(None)
        }
    }
}
