//! An in-memory [`TxKv`] with optimistic concurrency like FoundationDB's: a commit fails with
//! [`TxError::Retryable`] when a key the transaction read was changed since. Faults can be
//! queued to reproduce conflicts, failures, unknown outcomes and hangs.
//!
//! Watches behave like FoundationDB's: registered by the commit of the transaction that made
//! them, fired once the key's value differs from the one that transaction saw, failed when the
//! transaction does not commit or the store drops them ([`MemoryKv::cancel_watches`]), and at
//! most [`WATCHES_MAX`] at once (FoundationDB's default limit per database).

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::future::Future;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use tokio::sync::oneshot;

use super::{KeyValue, KvTx, TxError, TxKv};

/// Most keys the store holds: 2^21, room for a session holding `vvm_core::HOLDINGS_MAX` (2^20)
/// slots beside as many other records.
pub const KEYS_MAX: usize = 1 << 21;
/// Most faults queued at once.
pub const FAULTS_MAX: usize = 1024;
/// Most active watches at once; a commit that would register more fails the extra ones.
pub const WATCHES_MAX: usize = 10_000;

/// A watch: fires when the value under `key` is no longer `value`.
#[derive(Debug)]
struct Watcher {
    key: Vec<u8>,
    value: Option<Vec<u8>>,
    fire: oneshot::Sender<Result<(), TxError>>,
}

/// Why a [`MemoryKv`] transaction step failed: the cause inside its [`TxError`].
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum MemoryKvError {
    /// A test injected this fault (see [`MemoryKv::inject`]).
    #[error("injected {0:?}")]
    Injected(KvFault),
    /// A key this transaction read was changed by another commit since.
    #[error("conflict on key {}", String::from_utf8_lossy(.key))]
    Conflict {
        /// The key.
        key: Vec<u8>,
    },
    /// Committing would store more than `KEYS_MAX` keys.
    #[error("memory key-value store is full ({max} keys)")]
    Full {
        /// The limit.
        max: usize,
    },
    /// [`WATCHES_MAX`] watches are waiting already.
    #[error("too many watches (at most {WATCHES_MAX})")]
    TooManyWatches,
    /// The watch's transaction was not committed, or the store dropped the watch.
    #[error("watch cancelled (not committed, or dropped by the store)")]
    WatchCancelled,
}

/// What the next commit (or read, for [`KvFault::HangRead`] and [`KvFault::FailRead`]) does
/// instead of its normal work.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum KvFault {
    /// The commit conflicts: nothing applied, [`TxError::Retryable`].
    Conflict,
    /// The commit fails: nothing applied, [`TxError::Failed`].
    Fail,
    /// The commit applies, then reports [`TxError::UnknownResult`].
    UnknownApplied,
    /// The commit does not apply and reports [`TxError::UnknownResult`].
    UnknownNotApplied,
    /// The commit never completes.
    HangCommit,
    /// The next read never completes.
    HangRead,
    /// The next read fails with [`TxError::Failed`].
    FailRead,
}

#[derive(Debug, Default)]
struct Inner {
    data: BTreeMap<Vec<u8>, Vec<u8>>,
    /// Version of the last change of each key ever written, cleared ones included.
    versions: HashMap<Vec<u8>, u64>,
    version: u64,
    faults: VecDeque<KvFault>,
    commits: u64,
    watches: Vec<Watcher>,
}

impl Inner {
    fn version_of(&self, key: &[u8]) -> u64 {
        self.versions.get(key).copied().unwrap_or(0)
    }

    /// Fires the watches whose key changed and forgets those nobody waits for any more.
    fn fire_watches(&mut self) {
        let watches = std::mem::take(&mut self.watches);
        for watcher in watches {
            if watcher.fire.is_closed() {
                continue;
            }
            if self.data.get(&watcher.key) != watcher.value.as_ref() {
                // The receiver may be gone meanwhile: nothing to tell then.
                let _ = watcher.fire.send(Ok(()));
            } else {
                self.watches.push(watcher);
            }
        }
    }

    fn take_fault(&mut self, wanted: impl Fn(KvFault) -> bool) -> Option<KvFault> {
        let index = self.faults.iter().position(|fault| wanted(*fault))?;
        self.faults.remove(index)
    }
}

/// The in-memory transactional store. Cloning shares the data.
#[derive(Clone, Debug, Default)]
pub struct MemoryKv {
    inner: Arc<Mutex<Inner>>,
}

fn lock(inner: &Mutex<Inner>) -> MutexGuard<'_, Inner> {
    // Every critical section leaves the maps consistent; a poisoned lock is usable.
    inner.lock().unwrap_or_else(PoisonError::into_inner)
}

impl MemoryKv {
    /// An empty store.
    pub fn new() -> Self {
        MemoryKv::default()
    }

    /// Queues `fault` for the next commit or read it applies to; at most [`FAULTS_MAX`] are
    /// queued, later ones are dropped (and `false` returned).
    pub fn inject(&self, fault: KvFault) -> bool {
        let mut inner = lock(&self.inner);
        if inner.faults.len() >= FAULTS_MAX {
            return false;
        }
        inner.faults.push_back(fault);
        true
    }

    /// The value under `key`, read outside any transaction.
    pub fn value(&self, key: &[u8]) -> Option<Vec<u8>> {
        lock(&self.inner).data.get(key).cloned()
    }

    /// Writes `value` under `key` outside any transaction, as another writer would.
    pub fn put(&self, key: &[u8], value: &[u8]) -> bool {
        let mut inner = lock(&self.inner);
        if inner.data.len() >= KEYS_MAX && !inner.data.contains_key(key) {
            return false;
        }
        inner.version += 1;
        let version = inner.version;
        inner.versions.insert(key.to_vec(), version);
        inner.data.insert(key.to_vec(), value.to_vec());
        inner.fire_watches();
        true
    }

    /// Removes `key` outside any transaction, as another writer would.
    pub fn remove(&self, key: &[u8]) {
        let mut inner = lock(&self.inner);
        inner.version += 1;
        let version = inner.version;
        inner.versions.insert(key.to_vec(), version);
        inner.data.remove(key);
        inner.fire_watches();
    }

    /// How many watches are active (registered and still awaited).
    pub fn watches(&self) -> usize {
        let mut inner = lock(&self.inner);
        inner.watches.retain(|watcher| !watcher.fire.is_closed());
        inner.watches.len()
    }

    /// Drops every active watch, as FoundationDB does when it cannot keep them: each fails.
    pub fn cancel_watches(&self) {
        lock(&self.inner).watches.clear();
    }

    /// How many commits applied.
    pub fn commits(&self) -> u64 {
        lock(&self.inner).commits
    }
}

/// A transaction of [`MemoryKv`].
#[derive(Debug)]
pub struct MemoryTx {
    inner: Arc<Mutex<Inner>>,
    reads: HashMap<Vec<u8>, u64>,
    /// The value of every key read, as first read.
    seen: HashMap<Vec<u8>, Option<Vec<u8>>>,
    writes: BTreeMap<Vec<u8>, Option<Vec<u8>>>,
    /// Watches made in this transaction, registered by its commit.
    watches: Vec<Watcher>,
}

impl TxKv for MemoryKv {
    type Tx = MemoryTx;

    fn begin(&self) -> Result<MemoryTx, TxError> {
        Ok(MemoryTx {
            inner: self.inner.clone(),
            reads: HashMap::new(),
            seen: HashMap::new(),
            writes: BTreeMap::new(),
            watches: Vec::new(),
        })
    }
}

impl KvTx for MemoryTx {
    async fn get(&mut self, key: &[u8]) -> Result<Option<Vec<u8>>, TxError> {
        if let Some(written) = self.writes.get(key) {
            return Ok(written.clone());
        }
        let fault =
            lock(&self.inner).take_fault(|f| matches!(f, KvFault::HangRead | KvFault::FailRead));
        match fault {
            Some(KvFault::HangRead) => std::future::pending().await,
            Some(_) => return Err(TxError::failed(MemoryKvError::Injected(KvFault::FailRead))),
            None => {}
        }
        let inner = lock(&self.inner);
        self.reads
            .entry(key.to_vec())
            .or_insert_with(|| inner.version_of(key));
        let value = inner.data.get(key).cloned();
        self.seen
            .entry(key.to_vec())
            .or_insert_with(|| value.clone());
        Ok(value)
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
        let fault =
            lock(&self.inner).take_fault(|f| matches!(f, KvFault::HangRead | KvFault::FailRead));
        match fault {
            Some(KvFault::HangRead) => std::future::pending().await,
            Some(_) => return Err(TxError::failed(MemoryKvError::Injected(KvFault::FailRead))),
            None => {}
        }
        let bounds = (
            std::ops::Bound::Included(begin.to_vec()),
            std::ops::Bound::Excluded(end.to_vec()),
        );
        let inner = lock(&self.inner);
        // The stored keys and this transaction's writes, merged in order; a write overrides.
        // The whole range is merged: the model store is small (`KEYS_MAX`).
        let mut seen: BTreeMap<&[u8], Option<&[u8]>> = inner
            .data
            .range(bounds.clone())
            .map(|(key, value)| (key.as_slice(), Some(value.as_slice())))
            .collect();
        for (key, value) in self.writes.range(bounds) {
            seen.insert(key.as_slice(), value.as_deref());
        }
        Ok(seen
            .into_iter()
            .filter_map(|(key, value)| Some((key.to_vec(), value?.to_vec())))
            .take(limit)
            .collect())
    }

    fn set(&mut self, key: &[u8], value: &[u8]) {
        self.writes.insert(key.to_vec(), Some(value.to_vec()));
    }

    fn clear(&mut self, key: &[u8]) {
        self.writes.insert(key.to_vec(), None);
    }

    async fn commit(self) -> Result<(), TxError> {
        let fault =
            lock(&self.inner).take_fault(|f| !matches!(f, KvFault::HangRead | KvFault::FailRead));
        let injected = MemoryKvError::Injected;
        match fault {
            Some(KvFault::Conflict) => {
                return Err(TxError::retryable(injected(KvFault::Conflict)));
            }
            Some(KvFault::Fail) => return Err(TxError::failed(injected(KvFault::Fail))),
            Some(KvFault::UnknownNotApplied) => {
                return Err(TxError::unknown_result(injected(
                    KvFault::UnknownNotApplied,
                )));
            }
            Some(KvFault::HangCommit) => std::future::pending().await,
            _ => {}
        }
        let mut inner = lock(&self.inner);
        // As in FoundationDB, a read-only transaction never conflicts: it writes nothing that
        // its reads could invalidate.
        if let Some((key, _)) = self
            .reads
            .iter()
            .filter(|_| !self.writes.is_empty())
            .find(|(key, seen)| inner.version_of(key) != **seen)
        {
            return Err(TxError::retryable(MemoryKvError::Conflict {
                key: key.clone(),
            }));
        }
        let new_keys = self
            .writes
            .iter()
            .filter(|(key, value)| value.is_some() && !inner.data.contains_key(*key))
            .count();
        if inner.data.len() + new_keys > KEYS_MAX {
            return Err(TxError::failed(MemoryKvError::Full { max: KEYS_MAX }));
        }
        if !self.writes.is_empty() {
            inner.version += 1;
            let version = inner.version;
            for (key, value) in self.writes {
                inner.versions.insert(key.clone(), version);
                match value {
                    Some(value) => inner.data.insert(key, value),
                    None => inner.data.remove(&key),
                };
            }
            inner.fire_watches();
        }
        inner.commits += 1;
        if fault == Some(KvFault::UnknownApplied) {
            // The watches of a commit with an unknown outcome are dropped: they fail.
            return Err(TxError::unknown_result(injected(KvFault::UnknownApplied)));
        }
        inner.watches.retain(|watcher| !watcher.fire.is_closed());
        for watcher in self.watches {
            if watcher.fire.is_closed() {
                continue;
            }
            // A change between this transaction's read and its commit fires at once.
            if inner.data.get(&watcher.key) != watcher.value.as_ref() {
                let _ = watcher.fire.send(Ok(()));
                continue;
            }
            if inner.watches.len() >= WATCHES_MAX {
                let _ = watcher
                    .fire
                    .send(Err(TxError::failed(MemoryKvError::TooManyWatches)));
                continue;
            }
            inner.watches.push(watcher);
        }
        Ok(())
    }

    fn watch(&mut self, key: &[u8]) -> impl Future<Output = Result<(), TxError>> + Send + 'static {
        // What this transaction saw: its own write, else its read, else the value now.
        let value = match self.writes.get(key) {
            Some(written) => written.clone(),
            None => match self.seen.get(key) {
                Some(read) => read.clone(),
                None => lock(&self.inner).data.get(key).cloned(),
            },
        };
        let (fire, fired) = oneshot::channel();
        self.watches.push(Watcher {
            key: key.to_vec(),
            value,
            fire,
        });
        async move {
            fired
                .await
                .unwrap_or_else(|_| Err(TxError::failed(MemoryKvError::WatchCancelled)))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A range read answers the keys of `[begin, end)` in order, the transaction's own writes
    /// over the stored ones (a clear hides a key), the first `limit` of them.
    // covers: Sem.Store.List
    #[tokio::test]
    async fn a_range_read_sees_the_transactions_writes_in_order() {
        let kv = MemoryKv::new();
        for key in [b"a", b"c", b"e", b"g"] {
            assert!(kv.put(key, b"stored"));
        }
        let mut tx = kv.begin().unwrap();
        tx.set(b"b", b"written");
        tx.clear(b"c");
        tx.set(b"e", b"rewritten");
        let pair = |key: &[u8], value: &[u8]| (key.to_vec(), value.to_vec());
        assert_eq!(
            tx.range(b"a", b"g", 10).await.unwrap(),
            [
                pair(b"a", b"stored"),
                pair(b"b", b"written"),
                pair(b"e", b"rewritten")
            ]
        );
        assert_eq!(
            tx.range(b"b", b"z", 2).await.unwrap(),
            [pair(b"b", b"written"), pair(b"e", b"rewritten")]
        );
        assert!(tx.range(b"g", b"a", 10).await.unwrap().is_empty());
        assert!(tx.range(b"a", b"z", 0).await.unwrap().is_empty());
    }

    #[tokio::test]
    async fn a_commit_conflicts_when_a_key_it_read_changed() {
        let kv = MemoryKv::new();
        let mut first = kv.begin().unwrap();
        assert_eq!(first.get(b"k").await.unwrap(), None);
        first.set(b"k", b"1");
        let mut second = kv.begin().unwrap();
        assert_eq!(second.get(b"k").await.unwrap(), None);
        second.set(b"k", b"2");
        first.commit().await.unwrap();
        assert!(matches!(
            second.commit().await,
            Err(TxError::Retryable { .. })
        ));
        assert_eq!(kv.value(b"k"), Some(b"1".to_vec()));

        // Clearing a key is a change too.
        let mut reader = kv.begin().unwrap();
        assert_eq!(reader.get(b"k").await.unwrap(), Some(b"1".to_vec()));
        reader.set(b"other", b"x");
        let mut clearer = kv.begin().unwrap();
        clearer.clear(b"k");
        assert_eq!(
            clearer.get(b"k").await.unwrap(),
            None,
            "reads see the transaction's writes"
        );
        clearer.commit().await.unwrap();
        assert!(matches!(
            reader.commit().await,
            Err(TxError::Retryable { .. })
        ));
        assert_eq!(kv.value(b"other"), None);
    }

    async fn fired(
        watch: impl Future<Output = Result<(), TxError>>,
    ) -> Option<Result<(), TxError>> {
        tokio::time::timeout(std::time::Duration::from_millis(50), watch)
            .await
            .ok()
    }

    #[tokio::test]
    async fn a_committed_watch_fires_when_the_value_changes_not_when_it_is_rewritten() {
        let kv = MemoryKv::new();
        assert!(kv.put(b"k", b"1"));
        let mut tx = kv.begin().unwrap();
        assert_eq!(tx.get(b"k").await.unwrap(), Some(b"1".to_vec()));
        let mut watch = Box::pin(tx.watch(b"k"));
        assert!(
            fired(&mut watch).await.is_none(),
            "not active before commit"
        );
        tx.commit().await.unwrap();
        assert_eq!(kv.watches(), 1);
        assert!(kv.put(b"k", b"1"));
        assert!(fired(&mut watch).await.is_none(), "the same value again");
        kv.remove(b"k");
        assert_eq!(fired(&mut watch).await, Some(Ok(())));
        assert_eq!(kv.watches(), 0);

        // A change between the read and the commit fires at once.
        let mut tx = kv.begin().unwrap();
        assert_eq!(tx.get(b"k").await.unwrap(), None);
        let watch = tx.watch(b"k");
        assert!(kv.put(b"k", b"2"));
        tx.commit().await.unwrap();
        assert_eq!(fired(watch).await, Some(Ok(())));
    }

    #[tokio::test]
    async fn watches_fail_when_not_committed_or_dropped_by_the_store() {
        let kv = MemoryKv::new();
        let mut tx = kv.begin().unwrap();
        let watch = tx.watch(b"k");
        drop(tx);
        assert!(matches!(
            fired(watch).await,
            Some(Err(TxError::Failed { .. }))
        ));

        assert!(kv.inject(KvFault::Conflict));
        let mut tx = kv.begin().unwrap();
        let watch = tx.watch(b"k");
        assert!(tx.commit().await.is_err());
        assert!(matches!(
            fired(watch).await,
            Some(Err(TxError::Failed { .. }))
        ));

        let mut tx = kv.begin().unwrap();
        let watch = tx.watch(b"k");
        tx.commit().await.unwrap();
        kv.cancel_watches();
        assert!(matches!(
            fired(watch).await,
            Some(Err(TxError::Failed { .. }))
        ));
        assert_eq!(kv.watches(), 0);
    }

    #[tokio::test]
    async fn injected_unknown_results_apply_or_not_as_named() {
        let kv = MemoryKv::new();
        assert!(kv.inject(KvFault::UnknownNotApplied));
        let mut tx = kv.begin().unwrap();
        tx.set(b"k", b"1");
        assert!(matches!(
            tx.commit().await,
            Err(TxError::UnknownResult { .. })
        ));
        assert_eq!(kv.value(b"k"), None);
        assert!(kv.inject(KvFault::UnknownApplied));
        let mut tx = kv.begin().unwrap();
        tx.set(b"k", b"1");
        assert!(matches!(
            tx.commit().await,
            Err(TxError::UnknownResult { .. })
        ));
        assert_eq!(kv.value(b"k"), Some(b"1".to_vec()));
    }
}
