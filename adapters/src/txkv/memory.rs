//! An in-memory [`TxKv`] with optimistic concurrency like FoundationDB's: a commit fails with
//! [`TxError::Retryable`] when a key the transaction read was changed since. Faults can be
//! queued to reproduce conflicts, failures, unknown outcomes and hangs.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use super::{KvTx, TxError, TxKv};

/// Most keys the store holds.
pub const KEYS_MAX: usize = 65_536;
/// Most faults queued at once.
pub const FAULTS_MAX: usize = 1024;

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
}

impl Inner {
    fn version_of(&self, key: &[u8]) -> u64 {
        self.versions.get(key).copied().unwrap_or(0)
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
        true
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
    writes: BTreeMap<Vec<u8>, Option<Vec<u8>>>,
}

impl TxKv for MemoryKv {
    type Tx = MemoryTx;

    fn begin(&self) -> Result<MemoryTx, TxError> {
        Ok(MemoryTx {
            inner: self.inner.clone(),
            reads: HashMap::new(),
            writes: BTreeMap::new(),
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
            Some(_) => {
                return Err(TxError::Failed {
                    reason: "injected read failure".into(),
                })
            }
            None => {}
        }
        let inner = lock(&self.inner);
        self.reads
            .entry(key.to_vec())
            .or_insert_with(|| inner.version_of(key));
        Ok(inner.data.get(key).cloned())
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
        let reason = |what: &str| format!("injected {what}");
        match fault {
            Some(KvFault::Conflict) => {
                return Err(TxError::Retryable {
                    reason: reason("conflict"),
                })
            }
            Some(KvFault::Fail) => {
                return Err(TxError::Failed {
                    reason: reason("failure"),
                })
            }
            Some(KvFault::UnknownNotApplied) => {
                return Err(TxError::UnknownResult {
                    reason: reason("unknown result (not applied)"),
                })
            }
            Some(KvFault::HangCommit) => std::future::pending().await,
            _ => {}
        }
        let mut inner = lock(&self.inner);
        if let Some((key, _)) = self
            .reads
            .iter()
            .find(|(key, seen)| inner.version_of(key) != **seen)
        {
            return Err(TxError::Retryable {
                reason: format!("conflict on key {}", String::from_utf8_lossy(key)),
            });
        }
        let new_keys = self
            .writes
            .iter()
            .filter(|(key, value)| value.is_some() && !inner.data.contains_key(*key))
            .count();
        if inner.data.len() + new_keys > KEYS_MAX {
            return Err(TxError::Failed {
                reason: format!("memory key-value store is full ({KEYS_MAX} keys)"),
            });
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
        }
        inner.commits += 1;
        if fault == Some(KvFault::UnknownApplied) {
            return Err(TxError::UnknownResult {
                reason: reason("unknown result (applied)"),
            });
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
