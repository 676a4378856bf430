//! Every storage of the sequencer behind one type, so that one test runs on each: the memory
//! storage, SQLite on a file, and the transactional-KV storage on `MemoryKv`. A [`Place`] is
//! the data; each [`Place::open`] is another handle on it, as another process would have; a
//! [`Storage`] can be made slow to write.

use std::ops::ControlFlow;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use vvm_adapters::txkv::MemoryKv;
use vvm_sequencer::engine::{Number, PLogOffset, SeqId, SeqValue, WsId};
use vvm_sequencer::storages::memory::{MemorySeqStorage, PLogError};
use vvm_sequencer::storages::sqlite::{Durability, SqliteSeqError, SqliteSeqStorage};
use vvm_sequencer::storages::txkv::{TxKvSeqStorage, TxSeqError};
use vvm_sequencer::{ReplaySink, SeqStorage, SeqStorageError};

/// Which storage.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    Memory,
    Sqlite,
    Txkv,
}

pub const KINDS: [Kind; 3] = [Kind::Memory, Kind::Sqlite, Kind::Txkv];

/// SQLite statements wait this long for another connection's lock: below the tests' call
/// timeouts (the sequencer refuses timeouts at or below it).
pub const SQLITE_BUSY_TIMEOUT_MS: u64 = 50;

/// A SQLite file removed (with its journal) on drop.
pub struct TempFile(pub PathBuf);

impl TempFile {
    pub fn new(name: &str) -> Self {
        static COUNT: AtomicU64 = AtomicU64::new(0);
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or(0);
        TempFile(std::env::temp_dir().join(format!(
            "vvm-seq-{name}-{}-{nanos}-{}.sqlite",
            std::process::id(),
            COUNT.fetch_add(1, Ordering::Relaxed)
        )))
    }
}

impl Drop for TempFile {
    fn drop(&mut self) {
        for suffix in ["", "-wal", "-shm"] {
            let mut p = self.0.clone().into_os_string();
            p.push(suffix);
            let _ = std::fs::remove_file(p);
        }
    }
}

/// The data of one storage.
pub enum Place {
    Memory(MemorySeqStorage),
    Sqlite(TempFile),
    Txkv(MemoryKv),
}

impl Place {
    pub fn new(kind: Kind, name: &str) -> Place {
        match kind {
            Kind::Memory => Place::Memory(MemorySeqStorage::default()),
            Kind::Sqlite => Place::Sqlite(TempFile::new(name)),
            Kind::Txkv => Place::Txkv(MemoryKv::new()),
        }
    }

    /// A new handle on the data (the memory storage has one state: its clones share it).
    pub fn open(&self) -> Storage {
        let handle = match self {
            Place::Memory(m) => Handle::Memory(m.clone()),
            Place::Sqlite(file) => Handle::Sqlite(
                SqliteSeqStorage::open(&file.0, PLogOffset(1), Durability::Normal)
                    .and_then(|s| s.with_busy_timeout_ms(SQLITE_BUSY_TIMEOUT_MS))
                    .unwrap(),
            ),
            Place::Txkv(kv) => Handle::Txkv(TxKvSeqStorage::new(kv.clone(), PLogOffset(1))),
        };
        Storage {
            handle,
            write_delay_ms: Arc::default(),
            faults: Arc::default(),
        }
    }
}

#[derive(Clone)]
pub enum Handle {
    Memory(MemorySeqStorage),
    Sqlite(SqliteSeqStorage),
    Txkv(TxKvSeqStorage<MemoryKv>),
}

/// Why an append failed.
#[derive(Debug, PartialEq, Eq)]
pub enum AppendError {
    /// The storage's own `OffsetTaken`.
    Taken(PLogOffset),
    /// Anything else, as text.
    Other(String),
}

/// Calls of a [`Storage`] to fail: each counter is how many of the next such calls fail.
#[derive(Debug, Default)]
pub struct Faults {
    /// Writes that fail before they begin (nothing applied).
    pub writes: AtomicU32,
    /// Writes that are applied, then reported failed (an unknown outcome).
    pub writes_after: AtomicU32,
    /// `read_numbers` calls that fail.
    pub reads: AtomicU32,
    /// Replay calls that fail before they feed anything.
    pub replays: AtomicU32,
}

/// Takes one from `count` if it is not zero.
fn take(count: &AtomicU32) -> bool {
    count
        .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
        .is_ok()
}

fn injected(op: &str) -> SeqStorageError {
    SeqStorageError::failed(std::io::Error::other(format!("injected {op} failure")))
}

/// One handle on a storage; its writes wait `write_delay_ms` first (a slow storage), and its
/// calls fail as `faults` says.
#[derive(Clone)]
pub struct Storage {
    pub handle: Handle,
    pub write_delay_ms: Arc<AtomicU64>,
    pub faults: Arc<Faults>,
}

impl Storage {
    /// Makes every later write wait `delay` before it begins (zero: none).
    pub fn slow_writes(&self, delay: Duration) {
        let ms = u64::try_from(delay.as_millis()).unwrap_or(u64::MAX);
        self.write_delay_ms.store(ms, Ordering::SeqCst);
    }

    /// Appends an event to the PLog, as a command processor does before `flush`.
    pub async fn append(&self, offset: PLogOffset, values: &[SeqValue]) -> Result<(), AppendError> {
        match &self.handle {
            Handle::Memory(m) => m.append_event(offset, values).map_err(|e| match e {
                PLogError::OffsetTaken(o) => AppendError::Taken(o),
                other => AppendError::Other(other.to_string()),
            }),
            Handle::Sqlite(s) => s.append_event(offset, values).await.map_err(|e| match e {
                SqliteSeqError::OffsetTaken(o) => AppendError::Taken(o),
                other => AppendError::Other(vvm_runtime::ErrorChain(&other).to_string()),
            }),
            Handle::Txkv(t) => t.append_event(offset, values).await.map_err(|e| match e {
                TxSeqError::OffsetTaken(o) => AppendError::Taken(o),
                other => AppendError::Other(vvm_runtime::ErrorChain(&other).to_string()),
            }),
        }
    }

    /// Every PLog event, in offset order.
    pub async fn plog(&self) -> Vec<(PLogOffset, Vec<SeqValue>)> {
        let mut events = Vec::new();
        self.actualize_from_plog(PLogOffset(0), &mut |o, values| {
            events.push((o, values.to_vec()));
            ControlFlow::Continue(())
        })
        .await
        .unwrap();
        events
    }
}

impl SeqStorage for Storage {
    async fn read_numbers(
        &self,
        ws_id: WsId,
        seq_ids: &[SeqId],
    ) -> Result<Vec<Number>, SeqStorageError> {
        if take(&self.faults.reads) {
            return Err(injected("read"));
        }
        match &self.handle {
            Handle::Memory(m) => m.read_numbers(ws_id, seq_ids).await,
            Handle::Sqlite(s) => s.read_numbers(ws_id, seq_ids).await,
            Handle::Txkv(t) => t.read_numbers(ws_id, seq_ids).await,
        }
    }

    async fn read_next_plog_offset(&self) -> Result<PLogOffset, SeqStorageError> {
        match &self.handle {
            Handle::Memory(m) => m.read_next_plog_offset().await,
            Handle::Sqlite(s) => s.read_next_plog_offset().await,
            Handle::Txkv(t) => t.read_next_plog_offset().await,
        }
    }

    async fn write_values_and_next_plog_offset(
        &self,
        values: &[SeqValue],
        next_plog_offset: PLogOffset,
    ) -> Result<(), SeqStorageError> {
        let delay_ms = self.write_delay_ms.load(Ordering::SeqCst);
        if delay_ms > 0 {
            tokio::time::sleep(Duration::from_millis(delay_ms)).await;
        }
        if take(&self.faults.writes) {
            return Err(injected("write"));
        }
        let written = match &self.handle {
            Handle::Memory(m) => {
                m.write_values_and_next_plog_offset(values, next_plog_offset)
                    .await
            }
            Handle::Sqlite(s) => {
                s.write_values_and_next_plog_offset(values, next_plog_offset)
                    .await
            }
            Handle::Txkv(t) => {
                t.write_values_and_next_plog_offset(values, next_plog_offset)
                    .await
            }
        };
        match written {
            Ok(()) if take(&self.faults.writes_after) => Err(injected("write (applied)")),
            other => other,
        }
    }

    fn lock_wait_ms(&self) -> u64 {
        match &self.handle {
            Handle::Memory(m) => m.lock_wait_ms(),
            Handle::Sqlite(s) => s.lock_wait_ms(),
            Handle::Txkv(t) => t.lock_wait_ms(),
        }
    }

    async fn actualize_from_plog(
        &self,
        offset: PLogOffset,
        sink: &mut ReplaySink<'_>,
    ) -> Result<(), SeqStorageError> {
        if take(&self.faults.replays) {
            return Err(injected("replay"));
        }
        match &self.handle {
            Handle::Memory(m) => m.actualize_from_plog(offset, sink).await,
            Handle::Sqlite(s) => s.actualize_from_plog(offset, sink).await,
            Handle::Txkv(t) => t.actualize_from_plog(offset, sink).await,
        }
    }
}
