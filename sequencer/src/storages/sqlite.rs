//! A [`SeqStorage`] in one SQLite file: stored numbers, the stored next PLog offset and the
//! sequence columns of the PLog itself.
//!
//! A write stores the values **and** the offset in one `IMMEDIATE` transaction, so no reader
//! and no crash ever sees one without the other. Numbers and the offset merge by maximum inside
//! the statement (`max(old, new)`), so a stored value never decreases.
//!
//! Calls run on tokio's blocking pool, **one at a time per storage** (clones share the turn):
//! a call waits for its turn asynchronously, so a caller that gives up (its timeout) while
//! waiting leaves nothing behind, and one that gives up while its statement runs leaves that
//! one statement, which ends within [`busy_timeout_ms`](SqliteSeqStorage::busy_timeout_ms)
//! (plus its own work) when another connection holds the write lock. Timed-out calls and their
//! retries never pile up on the pool. The sequencer's call timeouts must be longer than the
//! busy timeout (`SeqStorage::lock_wait_ms`; checked by `Sequencer::new`), so that a call
//! that waits for the lock fails by itself, with SQLite's own error.
//!
//! SQLite integers are signed; `u64` values are stored with their top bit flipped, which maps
//! `0..=u64::MAX` onto `i64::MIN..=i64::MAX` in order, so comparisons in SQL (`max`, `>=`,
//! `ORDER BY`) agree with the numbers' order, `u64::MAX` included.

use std::ops::ControlFlow;
use std::path::Path;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use crate::engine::{Number, NumberKey, PLogOffset, SeqId, SeqValue, WsId};
use crate::{ReplaySink, SeqStorage, SeqStorageError};
use rusqlite::{params, Connection, OptionalExtension, TransactionBehavior};

/// Events read per query during a replay.
pub const REPLAY_PAGE_EVENTS: u32 = 1_024;
/// Most numbers one PLog event may carry.
pub const EVENT_VALUES_MAX: usize = 4_096;
/// How long a statement waits for another connection's write lock (short, bounded), unless
/// set with [`SqliteSeqStorage::with_busy_timeout_ms`].
pub const BUSY_TIMEOUT_MS: u64 = 1_000;
/// Longest busy timeout accepted, in milliseconds (one minute).
pub const BUSY_TIMEOUT_MAX_MS: u64 = 60_000;

const VALUE_BYTES: usize = 8 + 2 + 8;

const SCHEMA: &str = "
CREATE TABLE IF NOT EXISTS seq_numbers (
    ws_id INTEGER NOT NULL,
    seq_id INTEGER NOT NULL,
    number INTEGER NOT NULL,
    PRIMARY KEY (ws_id, seq_id)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS seq_offset (
    id INTEGER PRIMARY KEY CHECK (id = 0),
    next_plog_offset INTEGER NOT NULL
);
CREATE TABLE IF NOT EXISTS seq_plog (
    plog_offset INTEGER PRIMARY KEY,
    seq_values BLOB NOT NULL
);
";

/// Durability of a commit.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Durability {
    /// `synchronous=NORMAL` in WAL mode: survives a process crash; the last commits may be lost
    /// on power loss (the PLog replay restores their numbers).
    Normal,
    /// `synchronous=FULL`: one disk sync per commit.
    Full,
}

/// Why the storage could not be opened, or an event not appended.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum SqliteSeqError {
    /// SQLite said no.
    #[error("SQLite failed")]
    Sqlite(#[from] rusqlite::Error),
    /// The PLog already has an event at this offset.
    #[error("PLog offset {0:?} is taken")]
    OffsetTaken(PLogOffset),
    /// Too many numbers in one event.
    #[error("event carries {0} numbers, more than {EVENT_VALUES_MAX}")]
    TooManyValues(usize),
    /// The blocking task running the statement was lost.
    #[error("the SQLite task was lost")]
    Task(#[source] tokio::task::JoinError),
    /// The turn of calls was closed (it never is while a storage exists).
    #[error("the SQLite storage's turn of calls was closed")]
    Turn(#[source] tokio::sync::AcquireError),
    /// A busy timeout of 0 (SQLite would then fail at once on a held lock) or above
    /// [`BUSY_TIMEOUT_MAX_MS`].
    #[error("busy timeout of {0} ms; 1 ..= {BUSY_TIMEOUT_MAX_MS} ms supported")]
    BusyTimeout(u64),
}

/// The SQLite storage. Cheap to clone; clones share the connection and its turn.
#[derive(Clone, Debug)]
pub struct SqliteSeqStorage {
    conn: Arc<Mutex<Connection>>,
    /// One permit: the call that holds it is the only one of this storage on the blocking
    /// pool (see the module docs).
    turn: Arc<tokio::sync::Semaphore>,
    busy_timeout_ms: u64,
    first_offset: PLogOffset,
}

/// Maps `u64` onto `i64` preserving order.
fn enc(x: u64) -> i64 {
    i64::from_ne_bytes((x ^ (1 << 63)).to_ne_bytes())
}

fn dec(x: i64) -> u64 {
    u64::from_ne_bytes(x.to_ne_bytes()) ^ (1 << 63)
}

fn encode_values(values: &[SeqValue]) -> Vec<u8> {
    let mut out = Vec::with_capacity(values.len() * VALUE_BYTES);
    for v in values {
        out.extend_from_slice(&v.key.ws_id.0.to_le_bytes());
        out.extend_from_slice(&v.key.seq_id.0.to_le_bytes());
        out.extend_from_slice(&v.value.0.to_le_bytes());
    }
    out
}

fn decode_values(bytes: &[u8], out: &mut Vec<SeqValue>) -> Result<(), SeqStorageError> {
    if !bytes.len().is_multiple_of(VALUE_BYTES) {
        return Err(SeqStorageError::Corrupt {
            what: format!("PLog values of {} bytes", bytes.len()),
        });
    }
    out.clear();
    for chunk in bytes.chunks_exact(VALUE_BYTES) {
        let (ws, rest) = chunk.split_at(8);
        let (seq, n) = rest.split_at(2);
        let corrupt = |_| SeqStorageError::Corrupt {
            what: "PLog value field of the wrong size".into(),
        };
        out.push(SeqValue {
            key: NumberKey {
                ws_id: WsId(u64::from_le_bytes(ws.try_into().map_err(corrupt)?)),
                seq_id: SeqId(u16::from_le_bytes(seq.try_into().map_err(corrupt)?)),
            },
            value: Number(u64::from_le_bytes(n.try_into().map_err(corrupt)?)),
        });
    }
    Ok(())
}

fn failed(e: SqliteSeqError) -> SeqStorageError {
    SeqStorageError::failed(e)
}

impl SqliteSeqStorage {
    /// Opens (creating if needed) the storage in the file at `path`; an empty storage answers
    /// `first_offset` as its next PLog offset.
    pub fn open(
        path: impl AsRef<Path>,
        first_offset: PLogOffset,
        durability: Durability,
    ) -> Result<Self, SqliteSeqError> {
        let conn = Connection::open(path)?;
        conn.pragma_update(None, "journal_mode", "WAL")?;
        let sync = match durability {
            Durability::Normal => "NORMAL",
            Durability::Full => "FULL",
        };
        conn.pragma_update(None, "synchronous", sync)?;
        Self::init(conn, first_offset)
    }

    /// A storage in memory (gone with the last clone).
    pub fn open_in_memory(first_offset: PLogOffset) -> Result<Self, SqliteSeqError> {
        Self::init(Connection::open_in_memory()?, first_offset)
    }

    fn init(conn: Connection, first_offset: PLogOffset) -> Result<Self, SqliteSeqError> {
        conn.busy_timeout(Duration::from_millis(BUSY_TIMEOUT_MS))?;
        conn.execute_batch(SCHEMA)?;
        Ok(SqliteSeqStorage {
            conn: Arc::new(Mutex::new(conn)),
            turn: Arc::new(tokio::sync::Semaphore::new(1)),
            busy_timeout_ms: BUSY_TIMEOUT_MS,
            first_offset,
        })
    }

    /// The same storage with statements waiting at most `busy_timeout_ms` for another
    /// connection's write lock (default [`BUSY_TIMEOUT_MS`]); clones share the setting. The
    /// sequencer's call timeouts must be longer.
    pub fn with_busy_timeout_ms(mut self, busy_timeout_ms: u64) -> Result<Self, SqliteSeqError> {
        if busy_timeout_ms == 0 || busy_timeout_ms > BUSY_TIMEOUT_MAX_MS {
            return Err(SqliteSeqError::BusyTimeout(busy_timeout_ms));
        }
        self.conn
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .busy_timeout(Duration::from_millis(busy_timeout_ms))?;
        self.busy_timeout_ms = busy_timeout_ms;
        Ok(self)
    }

    /// How long a statement waits for another connection's write lock.
    pub fn busy_timeout_ms(&self) -> u64 {
        self.busy_timeout_ms
    }

    /// Runs `f` on the connection in a blocking thread, once it is this call's turn.
    ///
    /// The turn is taken before anything is spawned and released when the blocking work ends
    /// (not when the caller stops waiting): a caller dropped while waiting for its turn spawns
    /// nothing, and at most one call of this storage is ever on the blocking pool.
    async fn blocking<T, F>(&self, f: F) -> Result<T, SqliteSeqError>
    where
        T: Send + 'static,
        F: FnOnce(&mut Connection) -> Result<T, SqliteSeqError> + Send + 'static,
    {
        let turn = Arc::clone(&self.turn)
            .acquire_owned()
            .await
            .map_err(SqliteSeqError::Turn)?;
        let conn = Arc::clone(&self.conn);
        tokio::task::spawn_blocking(move || {
            let _turn = turn;
            // A panic inside rusqlite would poison the lock; SQLite's own transaction
            // rollback keeps the file consistent, so the connection is still usable.
            let mut conn = conn.lock().unwrap_or_else(PoisonError::into_inner);
            f(&mut conn)
        })
        .await
        .map_err(SqliteSeqError::Task)?
    }

    /// Appends an event to the PLog (insert-only: an offset is written once).
    pub async fn append_event(
        &self,
        offset: PLogOffset,
        values: &[SeqValue],
    ) -> Result<(), SqliteSeqError> {
        if values.len() > EVENT_VALUES_MAX {
            return Err(SqliteSeqError::TooManyValues(values.len()));
        }
        let blob = encode_values(values);
        self.blocking(move |conn| {
            let inserted = conn
                .prepare_cached(
                    "INSERT INTO seq_plog (plog_offset, seq_values) VALUES (?1, ?2)
                     ON CONFLICT (plog_offset) DO NOTHING",
                )?
                .execute(params![enc(offset.0), blob])?;
            if inserted == 0 {
                return Err(SqliteSeqError::OffsetTaken(offset));
            }
            Ok(())
        })
        .await
    }
}

impl SeqStorage for SqliteSeqStorage {
    fn lock_wait_ms(&self) -> u64 {
        self.busy_timeout_ms
    }

    async fn read_numbers(
        &self,
        ws_id: WsId,
        seq_ids: &[SeqId],
    ) -> Result<Vec<Number>, SeqStorageError> {
        let seq_ids = seq_ids.to_vec();
        self.blocking(move |conn| {
            let mut stmt = conn.prepare_cached(
                "SELECT number FROM seq_numbers WHERE ws_id = ?1 AND seq_id = ?2",
            )?;
            let mut out = Vec::with_capacity(seq_ids.len());
            for seq in seq_ids {
                let n: Option<i64> = stmt
                    .query_row(params![enc(ws_id.0), seq.0], |r| r.get(0))
                    .optional()?;
                out.push(Number(n.map_or(0, dec)));
            }
            Ok(out)
        })
        .await
        .map_err(failed)
    }

    async fn read_next_plog_offset(&self) -> Result<PLogOffset, SeqStorageError> {
        let first = self.first_offset;
        self.blocking(move |conn| {
            let stored: Option<i64> = conn
                .prepare_cached("SELECT next_plog_offset FROM seq_offset WHERE id = 0")?
                .query_row([], |r| r.get(0))
                .optional()?;
            Ok(stored.map_or(first, |o| PLogOffset(dec(o))))
        })
        .await
        .map_err(failed)
    }

    async fn write_values_and_next_plog_offset(
        &self,
        values: &[SeqValue],
        next_plog_offset: PLogOffset,
    ) -> Result<(), SeqStorageError> {
        let values = values.to_vec();
        self.blocking(move |conn| {
            let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
            {
                let mut put = tx.prepare_cached(
                    "INSERT INTO seq_numbers (ws_id, seq_id, number) VALUES (?1, ?2, ?3)
                     ON CONFLICT (ws_id, seq_id) DO UPDATE SET number = max(number, excluded.number)",
                )?;
                for v in &values {
                    put.execute(params![enc(v.key.ws_id.0), v.key.seq_id.0, enc(v.value.0)])?;
                }
                tx.prepare_cached(
                    "INSERT INTO seq_offset (id, next_plog_offset) VALUES (0, ?1)
                     ON CONFLICT (id) DO UPDATE
                     SET next_plog_offset = max(next_plog_offset, excluded.next_plog_offset)",
                )?
                .execute(params![enc(next_plog_offset.0)])?;
            }
            tx.commit()?;
            Ok(())
        })
        .await
        .map_err(failed)
    }

    async fn actualize_from_plog(
        &self,
        offset: PLogOffset,
        sink: &mut ReplaySink<'_>,
    ) -> Result<(), SeqStorageError> {
        let mut from = offset;
        let mut values = Vec::new();
        loop {
            let page: Vec<(i64, Vec<u8>)> = self
                .blocking(move |conn| {
                    let mut stmt = conn.prepare_cached(
                        "SELECT plog_offset, seq_values FROM seq_plog
                         WHERE plog_offset >= ?1 ORDER BY plog_offset LIMIT ?2",
                    )?;
                    let rows = stmt
                        .query_map(params![enc(from.0), REPLAY_PAGE_EVENTS], |r| {
                            Ok((r.get(0)?, r.get(1)?))
                        })?
                        .collect::<Result<Vec<_>, _>>()?;
                    Ok(rows)
                })
                .await
                .map_err(failed)?;
            let full_page = page.len() == REPLAY_PAGE_EVENTS as usize;
            let mut last = None;
            for (o, blob) in &page {
                let o = PLogOffset(dec(*o));
                decode_values(blob, &mut values)?;
                if sink(o, &values) == ControlFlow::Break(()) {
                    return Ok(());
                }
                last = Some(o);
            }
            match last.and_then(PLogOffset::next) {
                Some(next) if full_page => from = next,
                _ => return Ok(()),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_encoding_keeps_order_at_the_edges() {
        let xs = [0, 1, (1 << 63) - 1, 1 << 63, u64::MAX - 1, u64::MAX];
        for w in xs.windows(2) {
            assert!(enc(w[0]) < enc(w[1]), "{w:?}");
        }
        for x in xs {
            assert_eq!(dec(enc(x)), x);
        }
        let v = vec![SeqValue {
            key: NumberKey {
                ws_id: WsId(u64::MAX),
                seq_id: SeqId(7),
            },
            value: Number(42),
        }];
        let mut out = Vec::new();
        decode_values(&encode_values(&v), &mut out).unwrap();
        assert_eq!(out, v);
        assert!(decode_values(&[1, 2, 3], &mut out).is_err());
    }
}
