//! Reading a semaphore: its fields and the snapshot describe and watch deliver.

use super::{Description, Generation, OrderId, Owner, Semaphore, SemaphoreName, Waiter};

impl Semaphore {
    /// A snapshot, as describe and watch deliver it.
    pub fn describe(&self) -> Description {
        Description {
            name: self.name.clone(),
            data: self.data.clone(),
            count: self.count(),
            limit: self.limit,
            ephemeral: self.ephemeral,
            deleting: self.deleting,
            generation: self.generation,
            owners: self.owners.clone(),
            waiters: self.waiters.clone(),
        }
    }

    /// Its name.
    pub fn name(&self) -> &SemaphoreName {
        &self.name
    }

    /// Its limit.
    pub fn limit(&self) -> u64 {
        self.limit
    }

    /// Its own data.
    pub fn data(&self) -> &[u8] {
        &self.data
    }

    /// Whether it is ephemeral.
    pub fn is_ephemeral(&self) -> bool {
        self.ephemeral
    }

    /// Whether it is being deleted: deleted by force while it had owners, whose units stay
    /// counted until they leave ([`delete`](Self::delete)).
    pub fn is_deleting(&self) -> bool {
        self.deleting
    }

    /// Whether the store must delete its record: an ephemeral semaphore or one being deleted,
    /// with no party left ([`Outcome::delete`](super::Outcome::delete) says so after each
    /// operation).
    pub fn is_spent(&self) -> bool {
        (self.ephemeral || self.deleting) && self.is_empty()
    }

    /// Units held by the owners together.
    pub fn count(&self) -> u64 {
        self.owners
            .iter()
            .fold(0, |sum: u64, o| sum.saturating_add(o.count))
    }

    /// Its owners, in order of arrival.
    pub fn owners(&self) -> &[Owner] {
        &self.owners
    }

    /// Its waiters, in queue order.
    pub fn waiters(&self) -> &[Waiter] {
        &self.waiters
    }

    /// Whether it has neither owner nor waiter.
    pub fn is_empty(&self) -> bool {
        self.owners.is_empty() && self.waiters.is_empty()
    }

    /// The token of its last grant (0 before the first).
    pub fn generation(&self) -> Generation {
        self.generation
    }

    /// The order id its next new acquire gets.
    pub fn next_order_id(&self) -> OrderId {
        self.next_order_id
    }
}
