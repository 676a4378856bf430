//! The rules every reachable semaphore state obeys. Checked after every operation (in debug
//! builds), by the tests, and by [`Semaphore::decode`], which accepts only states that obey
//! them.

use super::{
    OrderId, Semaphore, DATA_BYTES_MAX, EPHEMERAL_LIMIT, PARTIES_MAX, PARTY_DATA_BYTES_MAX,
};

/// A rule a semaphore state breaks.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, thiserror::Error)]
#[non_exhaustive]
pub enum Violation {
    /// The limit is 0.
    #[error("the limit is 0")]
    LimitZero,
    /// An ephemeral semaphore's limit is not [`EPHEMERAL_LIMIT`].
    #[error("an ephemeral semaphore's limit is not u64::MAX")]
    EphemeralLimit,
    /// The semaphore's data or a party's is longer than allowed.
    #[error("data longer than allowed")]
    DataTooLarge,
    /// More than [`PARTIES_MAX`] owners and waiters.
    #[error("more owners and waiters than allowed")]
    TooManyParties,
    /// A party's count is 0 or above the limit.
    #[error("a count of 0 or above the limit")]
    CountOutOfRange,
    /// The owners hold more than the limit together.
    #[error("the owners hold more than the limit")]
    OverLimit,
    /// Order ids do not strictly increase from the first owner to the last waiter, or one was
    /// never issued (not below the next order id, or 0).
    #[error("order ids out of order or never issued")]
    Order,
    /// Tokens do not strictly increase along the owners, or one was never issued (0, or above
    /// the generation).
    #[error("tokens out of order or never issued")]
    Token,
    /// The generation has no room left for a token for every waiter.
    #[error("no tokens left for the waiters")]
    Exhausted,
    /// A session appears twice (as owners, waiters, or both).
    #[error("a session appears twice")]
    DuplicateSession,
    /// A waiter was queued with timeout 0, which never queues.
    #[error("a waiter with timeout 0")]
    ZeroTimeoutWaiter,
    /// A semaphore being deleted has waiters: the forced delete ended them all, and it refuses
    /// new ones.
    #[error("a semaphore being deleted has waiters")]
    DeletingWithWaiters,
    /// The head of the queue fits in what the owners leave free: it should have been granted.
    #[error("the head waiter fits but was not granted")]
    LostWakeUp,
}

impl Semaphore {
    /// Checks every rule of a semaphore state; the first one broken. Costs O(p log p) for `p`
    /// parties (the duplicate check sorts them); used by tests, debug builds and decoding.
    pub fn check_invariants(&self) -> Result<(), Violation> {
        if self.limit == 0 {
            return Err(Violation::LimitZero);
        }
        if self.ephemeral && self.limit != EPHEMERAL_LIMIT {
            return Err(Violation::EphemeralLimit);
        }
        let owner_data = self.owners.iter().map(|o| o.data.len());
        let waiter_data = self.waiters.iter().map(|w| w.data.len());
        if self.data.len() > DATA_BYTES_MAX
            || owner_data
                .chain(waiter_data)
                .any(|n| n > PARTY_DATA_BYTES_MAX)
        {
            return Err(Violation::DataTooLarge);
        }
        if self.owners.len() + self.waiters.len() > PARTIES_MAX {
            return Err(Violation::TooManyParties);
        }
        let counts = self.owners.iter().map(|o| o.count);
        if counts
            .chain(self.waiters.iter().map(|w| w.count))
            .any(|count| count == 0 || count > self.limit)
        {
            return Err(Violation::CountOutOfRange);
        }
        let mut held: u64 = 0;
        for owner in &self.owners {
            held = held
                .checked_add(owner.count)
                .filter(|&held| held <= self.limit)
                .ok_or(Violation::OverLimit)?;
        }
        // Every owner arrived before every waiter, and ids rise along both lists.
        let orders = self.owners.iter().map(|o| o.order_id);
        let mut last = OrderId(0);
        for order_id in orders.chain(self.waiters.iter().map(|w| w.order_id)) {
            if order_id <= last || order_id >= self.next_order_id {
                return Err(Violation::Order);
            }
            last = order_id;
        }
        let mut last = 0;
        for owner in &self.owners {
            if owner.token.0 <= last || owner.token > self.generation {
                return Err(Violation::Token);
            }
            last = owner.token.0;
        }
        if self.generation.0 > u64::MAX - self.waiters.len() as u64 {
            return Err(Violation::Exhausted);
        }
        let sessions = self.owners.iter().map(|o| o.session);
        let sessions = sessions.chain(self.waiters.iter().map(|w| w.session));
        let mut keys: Vec<(u64, u64)> = sessions.map(|s| (s.incarnation.0, s.id.0)).collect();
        keys.sort_unstable();
        if keys.windows(2).any(|pair| pair[0] == pair[1]) {
            return Err(Violation::DuplicateSession);
        }
        if self.waiters.iter().any(|w| w.timeout_ms == 0) {
            return Err(Violation::ZeroTimeoutWaiter);
        }
        if self.deleting && !self.waiters.is_empty() {
            return Err(Violation::DeletingWithWaiters);
        }
        if let Some(head) = self.waiters.first() {
            if head.count <= self.limit - held {
                return Err(Violation::LostWakeUp);
            }
        }
        Ok(())
    }
}
