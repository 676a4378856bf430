//! The FoundationDB store (feature `foundationdb`): the lease logic of
//! [`TxLeaseStore`](crate::txkv::TxLeaseStore) (expiry by observation; FoundationDB has no
//! TTLs) over a thin [`TxKv`] mapping of FoundationDB transactions.
//!
//! | [`TxKv`] | FoundationDB |
//! |---|---|
//! | `begin` | `Database::create_trx`, with the operation's timeout and a retry limit set on it |
//! | `get` / `set` / `clear` | the transaction's own (serializable reads, not snapshot reads) |
//! | `commit` | `Transaction::commit` |
//! | `watch` | `Transaction::watch`, with the transaction's timeout lifted (see below) |
//! | [`TxError::UnknownResult`] | `commit_unknown_result` and every other "maybe committed" error |
//! | [`TxError::Retryable`] | errors FoundationDB marks retryable and certainly not committed (conflicts) |
//! | [`TxError::Failed`] | everything else |
//!
//! The change feed of the lease logic waits on FoundationDB watches: a watch is registered by
//! the commit of the read-only transaction that set it and fires once the key's value differs
//! from the one that transaction read. The operation timeout would cancel a watch that waits
//! longer, so a transaction that sets one drops that timeout; its reads and its commit stay
//! bounded by the lease logic's own timeout, and dropping the watch's future cancels it.
//! FoundationDB keeps at most 10 000 watches per database by default (`too_many_watches`
//! beyond), one per watched slot of each waiting candidate.
//!
//! Building needs libclang; linking and running need the FoundationDB client library
//! (`libfdb_c`, 7.3). The network thread must be running before a store is opened: the host
//! calls `foundationdb::boot()` once (it is `unsafe`: once per process, and its guard must be
//! dropped before the process exits) and passes the guard to [`open`] as proof.

use std::future::Future;
use std::path::Path;
use std::sync::Arc;

pub use foundationdb::api::NetworkAutoStop;
use foundationdb::options::{StreamingMode, TransactionOption};
use foundationdb::{Database, FdbError, RangeOption, Transaction};

use crate::txkv::{KeyValue, KvTx, TxError, TxKv, TxLeaseStore, TxOptions};

/// Starts FoundationDB's network thread (`unsafe`: at most once per process, and the returned
/// guard must be dropped before the process exits). Re-exported so that hosts need no direct
/// dependency on the client crate.
pub use foundationdb::boot;

/// The FoundationDB lease store.
pub type FdbStore = TxLeaseStore<FdbKv>;

/// Why a FoundationDB store could not be opened.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum FdbOpenError {
    /// The cluster file path is not UTF-8 or contains a NUL byte.
    #[error("cluster file path {0:?} is not usable (not UTF-8, or contains a NUL byte)")]
    ClusterFilePath(std::path::PathBuf),
    /// FoundationDB refused to open the database.
    #[error("could not open FoundationDB")]
    Open(#[source] FdbError),
}

/// Opens the database of `cluster_file` (FoundationDB's default cluster file when `None`) as a
/// lease store. `_network` proves that the network thread runs.
pub fn open(
    _network: &NetworkAutoStop,
    cluster_file: Option<&Path>,
    options: TxOptions,
) -> Result<FdbStore, FdbOpenError> {
    let path = match cluster_file {
        None => None,
        Some(path) => match path.to_str() {
            Some(text) if !text.contains('\0') => Some(text),
            _ => return Err(FdbOpenError::ClusterFilePath(path.to_path_buf())),
        },
    };
    let database = Database::new(path).map_err(FdbOpenError::Open)?;
    let kv = FdbKv::new(database, &options);
    Ok(TxLeaseStore::new(kv, options))
}

/// FoundationDB as a [`TxKv`]. Cloning shares the database handle.
#[derive(Clone)]
pub struct FdbKv {
    database: Arc<Database>,
    timeout_ms: i32,
}

impl std::fmt::Debug for FdbKv {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FdbKv")
            .field("timeout_ms", &self.timeout_ms)
            .finish_non_exhaustive()
    }
}

/// FoundationDB's own retry limit on a transaction; the lease logic starts a fresh transaction
/// for each of its bounded attempts, so this only bounds retries FoundationDB would do itself.
const FDB_RETRY_LIMIT: i32 = 0;

impl FdbKv {
    /// Wraps an open database; every transaction gets `options`' operation timeout.
    pub fn new(database: Database, options: &TxOptions) -> Self {
        let timeout_ms = i32::try_from(options.operation_timeout().as_millis()).unwrap_or(i32::MAX);
        FdbKv {
            database: Arc::new(database),
            timeout_ms: timeout_ms.max(1),
        }
    }
}

/// A transaction of [`FdbKv`].
pub struct FdbTx(Transaction);

impl std::fmt::Debug for FdbTx {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FdbTx").finish_non_exhaustive()
    }
}

impl TxKv for FdbKv {
    type Tx = FdbTx;

    fn begin(&self) -> Result<FdbTx, TxError> {
        let transaction = self
            .database
            .create_trx()
            .map_err(|error| map_error(&error))?;
        transaction
            .set_option(TransactionOption::Timeout(self.timeout_ms))
            .map_err(|error| map_error(&error))?;
        transaction
            .set_option(TransactionOption::RetryLimit(FDB_RETRY_LIMIT))
            .map_err(|error| map_error(&error))?;
        Ok(FdbTx(transaction))
    }
}

impl KvTx for FdbTx {
    async fn get(&mut self, key: &[u8]) -> Result<Option<Vec<u8>>, TxError> {
        let value = self
            .0
            .get(key, false)
            .await
            .map_err(|error| map_error(&error))?;
        Ok(value.map(|slice| slice.to_vec()))
    }

    async fn range(
        &mut self,
        begin: &[u8],
        end: &[u8],
        limit: usize,
    ) -> Result<Vec<KeyValue>, TxError> {
        if begin >= end || limit == 0 {
            return Ok(Vec::new());
        }
        // `Exact`: every one of the `limit` first pairs in one answer.
        let option = RangeOption {
            limit: Some(limit),
            mode: StreamingMode::Exact,
            ..RangeOption::from((begin, end))
        };
        let values = self
            .0
            .get_range(&option, 1, true)
            .await
            .map_err(|error| map_error(&error))?;
        Ok(values
            .iter()
            .map(|pair| (pair.key().to_vec(), pair.value().to_vec()))
            .collect())
    }

    fn set(&mut self, key: &[u8], value: &[u8]) {
        self.0.set(key, value);
    }

    fn clear(&mut self, key: &[u8]) {
        self.0.clear(key);
    }

    async fn commit(self) -> Result<(), TxError> {
        match self.0.commit().await {
            Ok(_) => Ok(()),
            Err(error) => Err(map_error(&error)),
        }
    }

    fn watch(&mut self, key: &[u8]) -> impl Future<Output = Result<(), TxError>> + Send + 'static {
        // A watch waits as long as nothing changes: the operation timeout must not cancel it.
        let untimed = self.0.set_option(TransactionOption::Timeout(0));
        let watch = self.0.watch(key);
        async move {
            untimed.map_err(|error| map_error(&error))?;
            watch.await.map_err(|error| map_error(&error))
        }
    }
}

/// Maps FoundationDB's error: "maybe committed" first, so that `commit_unknown_result` (which
/// FoundationDB also calls retryable) is never retried blindly.
fn map_error(error: &FdbError) -> TxError {
    if error.is_maybe_committed() {
        TxError::unknown_result(*error)
    } else if error.is_retryable_not_committed() {
        TxError::retryable(*error)
    } else {
        TxError::failed(*error)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // covers: Tx.Fdb
    // The error predicates call into libfdb_c: like every FoundationDB test, this one only
    // links and runs where the client library is installed.
    #[test]
    fn commit_unknown_result_is_unknown_and_conflicts_are_retried() {
        assert!(matches!(
            map_error(&FdbError::from_code(1021)),
            TxError::UnknownResult { .. }
        ));
        assert!(matches!(
            map_error(&FdbError::from_code(1020)),
            TxError::Retryable { .. }
        ));
        assert!(matches!(
            map_error(&FdbError::from_code(2000)),
            TxError::Failed { .. }
        ));
    }
}
