//! Leases over a transactional key-value store without TTLs (feature `txkv`).
//!
//! A store like FoundationDB offers serializable transactions over keys and values, but no
//! expiry. [`TxLeaseStore`] builds the [`LeaseStore`](vvm_runtime::LeaseStore) contract on top of
//! the small [`TxKv`] trait, judging expiry **by observation** (see [`lease`]); the
//! FoundationDB store is a thin [`TxKv`] mapping of it, and [`MemoryKv`] runs the same logic in
//! memory, with injectable faults, so that it passes the conformance suite here.
//!
//! The change feed ([`LeaseStore::changed`](vvm_runtime::LeaseStore::changed)) rests on the
//! store's watches ([`KvTx::watch`]); see [`lease`]. The store keeps semaphores too
//! ([`SemaphoreStore`](vvm_runtime::SemaphoreStore)), each in one key; see the `semaphore`
//! module source.

pub mod lease;
pub mod memory;
mod record;
mod semaphore;
mod session;

use std::future::Future;

pub use lease::{
    TxLeaseError, TxLeaseStore, TxOptions, FEED_UNKNOWN_PAUSE, OBSERVATIONS_MAX,
    RETRIES_MAX_DEFAULT, TIMEOUT_DEFAULT,
};
pub use memory::{KvFault, MemoryKv, MemoryKvError, WATCHES_MAX};
pub use semaphore::{TxSemaphoreError, MARKS_WAITED_MAX, SEMAPHORES_PER_SESSION_MAX};
use vvm_runtime::Cause;

/// Why a transaction step did not succeed. The message says which of the three it is; the
/// [`source`](std::error::Error::source) is the store's own error (e.g. FoundationDB's
/// `FdbError`, or [`MemoryKvError`]).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum TxError {
    /// A conflict or a transient condition; nothing was committed, and the whole transaction
    /// may be run again.
    #[error("transaction must be retried")]
    Retryable {
        /// What the store said.
        source: Cause,
    },
    /// The commit may or may not have been applied (FoundationDB's `commit_unknown_result`).
    /// Never retried blindly: a conditional write that did apply would then be judged against
    /// its own result.
    #[error("transaction outcome unknown")]
    UnknownResult {
        /// What the store said.
        source: Cause,
    },
    /// Failed; nothing was committed.
    #[error("transaction failed")]
    Failed {
        /// What the store said.
        source: Cause,
    },
}

impl TxError {
    /// [`Retryable`](TxError::Retryable) because of `source`.
    pub fn retryable(source: impl std::error::Error + Send + Sync + 'static) -> TxError {
        TxError::Retryable {
            source: Cause::new(source),
        }
    }

    /// [`UnknownResult`](TxError::UnknownResult) because of `source`.
    pub fn unknown_result(source: impl std::error::Error + Send + Sync + 'static) -> TxError {
        TxError::UnknownResult {
            source: Cause::new(source),
        }
    }

    /// [`Failed`](TxError::Failed) because of `source`.
    pub fn failed(source: impl std::error::Error + Send + Sync + 'static) -> TxError {
        TxError::Failed {
            source: Cause::new(source),
        }
    }
}

/// A key and its value, as a range read ([`KvTx::range`]) answers them.
pub type KeyValue = (Vec<u8>, Vec<u8>);

/// A future of a liveness mark ([`TxKv::mark_lost`], [`TxKv::mark_freed`]).
pub type MarkFuture = std::pin::Pin<Box<dyn Future<Output = ()> + Send>>;

/// A transactional key-value store: serializable transactions of reads and writes.
///
/// # Liveness marks (optional)
///
/// A store may tell, beside the TTL, that the process that took a *mark* has ended
/// (PostgreSQL: a session-level advisory lock, freed by the server when the connection holding
/// it ends). The rules that use them are written once, in the `session` module; a store that
/// keeps none (FoundationDB, [`MemoryKv`]) keeps the defaults, which take none and can never
/// tell, and its sessions are judged by their TTL alone.
pub trait TxKv: Send + Sync + 'static {
    /// One transaction.
    type Tx: KvTx;

    /// Starts a transaction.
    fn begin(&self) -> Result<Self::Tx, TxError>;

    /// Whether records here may name marks: only then does a waiter read a session's mark key
    /// and ask [`KvTx::mark_free`]. `false` by default.
    fn has_marks(&self) -> bool {
        false
    }

    /// Takes the mark `mark` for this process (again: nothing more) and answers the *epoch* it
    /// is held in — what a waiter must see for the mark to mean anything (PostgreSQL: the
    /// server's start, since a restarted or promoted server holds no locks) — or `None` when
    /// this store takes no marks (the default).
    fn take_mark(
        &self,
        mark: &[u8],
    ) -> impl Future<Output = Result<Option<Vec<u8>>, TxError>> + Send {
        let _ = mark;
        async { Ok(None) }
    }

    /// Gives the mark `mark` back, if this process holds it; [`mark_lost`](TxKv::mark_lost)
    /// never resolves for it then.
    fn release_mark(&self, mark: &[u8]) {
        let _ = mark;
    }

    /// Resolves when the mark `mark`, held by this process, is lost other than by
    /// [`release_mark`](TxKv::release_mark) (PostgreSQL: its connection ended). Pending when
    /// this process does not hold it, and by default.
    fn mark_lost(&self, mark: &[u8]) -> MarkFuture {
        let _ = mark;
        Box::pin(std::future::pending())
    }

    /// Resolves when the mark `mark`, taken in `epoch`, may have been freed (a waiter then
    /// looks again); pending while it cannot tell, and by default.
    fn mark_freed(&self, mark: &[u8], epoch: &[u8]) -> MarkFuture {
        let _ = (mark, epoch);
        Box::pin(std::future::pending())
    }
}

/// One transaction: reads see the writes made in it; [`commit`](KvTx::commit) applies them
/// atomically, and fails with [`TxError::Retryable`] when a key read in it was changed by a
/// transaction committed in between (one that writes nothing never conflicts, as in
/// FoundationDB).
pub trait KvTx: Send + 'static {
    /// The value under `key`, if any.
    fn get(&mut self, key: &[u8]) -> impl Future<Output = Result<Option<Vec<u8>>, TxError>> + Send;

    /// The keys in `[begin, end)` with their values, in the order of their bytes, at most
    /// `limit` of them (the first ones), as this transaction sees them (its own writes
    /// included). A snapshot read (FoundationDB's `snapshot` range read): it adds nothing to
    /// the keys whose change makes the commit conflict, so use it to look, not to decide a
    /// write.
    fn range(
        &mut self,
        begin: &[u8],
        end: &[u8],
        limit: usize,
    ) -> impl Future<Output = Result<Vec<KeyValue>, TxError>> + Send;

    /// Writes `value` under `key` when committed.
    fn set(&mut self, key: &[u8], value: &[u8]);

    /// Removes `key` when committed.
    fn clear(&mut self, key: &[u8]);

    /// Whether the mark `mark`, taken in `epoch`, is free now, asked inside this transaction:
    /// `Some(true)` when no process holds it (its holder ended), `Some(false)` when one does,
    /// `None` when the store cannot tell (another epoch; the default).
    fn mark_free(
        &mut self,
        mark: &[u8],
        epoch: &[u8],
    ) -> impl Future<Output = Result<Option<bool>, TxError>> + Send {
        let _ = (mark, epoch);
        async { Ok(None) }
    }

    /// Applies every write of the transaction, or none.
    fn commit(self) -> impl Future<Output = Result<(), TxError>> + Send;

    /// A watch on `key` (FoundationDB's `Transaction::watch`): it becomes active when the
    /// transaction commits, and then resolves with `Ok(())` once the value under `key` differs
    /// from the one this transaction saw (read or wrote). It resolves with an error when it is
    /// cancelled or cannot be kept (the transaction did not commit, the store dropped it, too
    /// many watches). Dropping the future cancels the watch.
    fn watch(&mut self, key: &[u8]) -> impl Future<Output = Result<(), TxError>> + Send + 'static;
}
