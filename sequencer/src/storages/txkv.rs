//! A [`SeqStorage`] over a transactional key-value store (feature `txkv`): the [`TxKv`] trait the
//! FoundationDB lease store is built on, so the sequencer keeps its numbers in FoundationDB too
//! (`TxKvSeqStorage<FdbKv>`), and [`MemoryKv`](vvm_adapters::txkv::MemoryKv) runs the very same
//! code in memory for the tests.
//!
//! Keys, under a prefix (default [`PREFIX_DEFAULT`]); integers big-endian, so that the byte order
//! of keys is the numeric order:
//!
//! | key | value |
//! |---|---|
//! | `prefix` `n` ws_id (8) seq_id (2) | the highest stored number (8) |
//! | `prefix` `o` | the stored next PLog offset (8) |
//! | `prefix` `p` offset (8) | a PLog event: the writer token of its append call (8), then (ws_id, seq_id, number) per value, 18 bytes each |
//! | `prefix` `e` | the PLog's end: the highest appended offset + 1 (8) |
//!
//! A write reads every key it stores and the offset, and sets each to the maximum of old and
//! new, **in one transaction**: nobody sees the offset without its values, and nothing stored
//! decreases. Merging by maximum makes a write idempotent, so a write whose outcome is unknown
//! is simply run again. The PLog is read through the same trait: point reads from the asked
//! offset up to the stored end, a fresh transaction per page (FoundationDB bounds a
//! transaction's life to five seconds).

use std::future::Future;
use std::ops::ControlFlow;
use std::time::Duration;

use crate::engine::{Number, NumberKey, PLogOffset, SeqId, SeqValue, WsId};
use crate::{ReplaySink, SeqStorage, SeqStorageError};

use crate::storages::txkv_codec::{be_u64, decode_event, encode_event, Keys};
use vvm_adapters::txkv::{KvTx, TxError, TxKv};

/// The default key prefix (distinct from the lease store's `vvm/slot/`).
pub const PREFIX_DEFAULT: &[u8] = b"vvm/seq/";
/// Longest key prefix, in bytes.
pub const PREFIX_MAX_BYTES: usize = 256;
/// Most numbers one PLog event may carry (4 096 × 18 bytes stay below FoundationDB's 100 kB
/// value limit).
pub const EVENT_VALUES_MAX: usize = 4_096;
/// Offsets read per transaction during a replay.
pub const REPLAY_PAGE_OFFSETS: u64 = 256;
/// Numbers written per transaction; a larger batch writes its first values in transactions of
/// their own and the offset with the last ones (values never land later than the offset), so
/// that no transaction outgrows FoundationDB's 10 MB limit.
pub const WRITE_VALUES_PER_TX: usize = 10_000;
/// Times a transaction that conflicted, or whose outcome is unknown, is run again (every
/// transaction here may run twice: see the module docs).
pub const RETRIES_MAX: u32 = 5;
/// First pause before running a transaction again; doubles each time.
const BACKOFF_FIRST: Duration = Duration::from_millis(2);

/// Why the storage could not be made, or an event not appended.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum TxSeqError {
    /// The key prefix is longer than [`PREFIX_MAX_BYTES`].
    #[error("key prefix of {0} bytes, more than {PREFIX_MAX_BYTES}")]
    PrefixTooLong(usize),
    /// The PLog already has another event at this offset (it is insert-only).
    #[error("PLog offset {0:?} is taken")]
    OffsetTaken(PLogOffset),
    /// Too many numbers in one event.
    #[error("event carries {0} numbers, more than {EVENT_VALUES_MAX}")]
    TooManyValues(usize),
    /// No event can sit at `u64::MAX`: no offset would follow it.
    #[error("PLog offset {0:?} is the last possible one")]
    OffsetsExhausted(PLogOffset),
    /// The store failed.
    #[error(transparent)]
    Store(#[from] TxError),
    /// The store holds something that cannot be right.
    #[error(transparent)]
    Corrupt(SeqStorageError),
}

/// The sequencer's storage over `K`. Cheap to clone when `K` is; clones share the store.
#[derive(Clone, Debug)]
pub struct TxKvSeqStorage<K> {
    kv: K,
    keys: Keys,
    first_offset: PLogOffset,
}

/// The sequencer's storage on FoundationDB, sharing the lease store's database:
/// `TxKvSeqStorage::new(lease_store.kv().clone(), first_offset)`.
#[cfg(feature = "foundationdb")]
pub type FdbSeqStorage = TxKvSeqStorage<vvm_adapters::foundationdb::FdbKv>;

/// The sequencer's storage on PostgreSQL, sharing the lease store's table and connections:
/// `TxKvSeqStorage::new(lease_store.kv().clone(), first_offset)`.
#[cfg(feature = "postgres")]
pub type PgSeqStorage = TxKvSeqStorage<vvm_adapters::postgres::PgKv>;

// The PostgreSQL mapping is a storage too (its futures are `Send`, its transaction fits).
#[cfg(feature = "postgres")]
const _: fn() = || {
    fn storage<S: SeqStorage>() {}
    storage::<PgSeqStorage>();
};

// The FoundationDB mapping is only type-checked where libfdb_c is missing: make sure it is a
// storage (its futures are `Send`, its transaction fits the trait).
#[cfg(feature = "foundationdb")]
const _: fn() = || {
    fn storage<S: SeqStorage>() {}
    storage::<FdbSeqStorage>();
};

/// A failure inside a transaction: the store's, or a stored value that cannot be right.
#[derive(Debug)]
enum Fault {
    Tx(TxError),
    Corrupt(SeqStorageError),
}

impl From<TxError> for Fault {
    fn from(e: TxError) -> Self {
        Fault::Tx(e)
    }
}

impl From<SeqStorageError> for Fault {
    fn from(e: SeqStorageError) -> Self {
        Fault::Corrupt(e)
    }
}

impl From<Fault> for SeqStorageError {
    fn from(f: Fault) -> Self {
        match f {
            Fault::Tx(e) => SeqStorageError::failed(e),
            Fault::Corrupt(e) => e,
        }
    }
}

impl From<Fault> for TxSeqError {
    fn from(f: Fault) -> Self {
        match f {
            Fault::Tx(e) => TxSeqError::Store(e),
            Fault::Corrupt(e) => TxSeqError::Corrupt(e),
        }
    }
}

/// Whether running a transaction again may succeed: after a conflict, and after an unknown
/// outcome (running one of ours twice does no harm). Corrupt data stays corrupt.
fn retryable(f: &Fault) -> bool {
    matches!(
        f,
        Fault::Tx(TxError::Retryable { .. } | TxError::UnknownResult { .. })
    )
}

impl<K: TxKv> TxKvSeqStorage<K> {
    /// A storage in `kv` under [`PREFIX_DEFAULT`]; an empty one answers `first_offset` as its
    /// next PLog offset.
    pub fn new(kv: K, first_offset: PLogOffset) -> Self {
        TxKvSeqStorage {
            kv,
            keys: Keys::new(PREFIX_DEFAULT.to_vec()),
            first_offset,
        }
    }

    /// As [`new`](Self::new), under another key prefix (several sequencers in one store).
    pub fn with_prefix(
        kv: K,
        first_offset: PLogOffset,
        prefix: impl Into<Vec<u8>>,
    ) -> Result<Self, TxSeqError> {
        let prefix = prefix.into();
        if prefix.len() > PREFIX_MAX_BYTES {
            return Err(TxSeqError::PrefixTooLong(prefix.len()));
        }
        Ok(TxKvSeqStorage {
            kv,
            keys: Keys::new(prefix),
            first_offset,
        })
    }

    /// The store.
    pub fn kv(&self) -> &K {
        &self.kv
    }

    /// Runs `attempt` (one whole transaction) until it succeeds, at most [`RETRIES_MAX`] more
    /// times while running it again may help.
    async fn transact<T, F, Fut>(&self, mut attempt: F) -> Result<T, Fault>
    where
        F: FnMut(K::Tx) -> Fut,
        Fut: Future<Output = Result<T, Fault>>,
    {
        let mut retry = 0u32;
        loop {
            let result = match self.kv.begin() {
                Ok(tx) => attempt(tx).await,
                Err(e) => Err(e.into()),
            };
            match result {
                Err(f) if retry < RETRIES_MAX && retryable(&f) => {
                    tracing::debug!(fault = ?f, retry, "sequence storage transaction again");
                    tokio::time::sleep(BACKOFF_FIRST.saturating_mul(1 << retry)).await;
                    retry += 1;
                }
                other => return other,
            }
        }
    }

    /// Reads a big-endian `u64` under `key` in `tx`.
    async fn get_u64(tx: &mut K::Tx, key: &[u8], what: &str) -> Result<Option<u64>, Fault> {
        match tx.get(key).await? {
            None => Ok(None),
            Some(bytes) => Ok(Some(be_u64(&bytes, what)?)),
        }
    }

    /// One transaction: every value and, when `offset` is given, the offset, each merged by
    /// maximum.
    async fn write_merged(
        &self,
        values: &[SeqValue],
        offset: Option<PLogOffset>,
    ) -> Result<(), SeqStorageError> {
        let offset_key = self.keys.offset();
        let written = self
            .transact(|mut tx| {
                let offset_key = &offset_key;
                async move {
                    for v in values {
                        let key = self.keys.number(v.key);
                        let stored = Self::get_u64(&mut tx, &key, "stored number").await?;
                        if stored.unwrap_or(0) < v.value.0 {
                            tx.set(&key, &v.value.0.to_be_bytes());
                        }
                    }
                    if let Some(offset) = offset {
                        let stored = Self::get_u64(&mut tx, offset_key, "stored offset").await?;
                        if stored.unwrap_or(0) < offset.0 {
                            tx.set(offset_key, &offset.0.to_be_bytes());
                        }
                    }
                    Ok(tx.commit().await?)
                }
            })
            .await;
        Ok(written?)
    }

    /// Appends an event to the PLog (insert-only: an offset is written once). What a command
    /// processor does before `flush`; here so that the tests and small hosts have a PLog.
    ///
    /// A transaction of this call whose outcome was unknown is run again, and must then tell
    /// its own record from anyone else's: each call writes a fresh random writer token into
    /// its record. Its own token found at the offset means its earlier attempt landed (`Ok`);
    /// any other record there — another process's or another call's, even with the very same
    /// numbers — is refused with [`TxSeqError::OffsetTaken`], as the memory and SQLite
    /// storages do. A caller that gets an error (the outcome may be unknown) gives its
    /// transaction up with `actualize`; calling again would be another writer.
    pub async fn append_event(
        &self,
        offset: PLogOffset,
        values: &[SeqValue],
    ) -> Result<(), TxSeqError> {
        if values.len() > EVENT_VALUES_MAX {
            return Err(TxSeqError::TooManyValues(values.len()));
        }
        let end = offset.next().ok_or(TxSeqError::OffsetsExhausted(offset))?;
        let event = encode_event(vvm_runtime::new_incarnation().0, values);
        let (key, end_key) = (self.keys.plog(offset), self.keys.end());
        // Idempotent within this call only: an attempt whose outcome was unknown finds its own
        // record (same token, same numbers) and succeeds; any other record is refused.
        let outcome = self
            .transact(|mut tx| {
                let (key, end_key, event) = (&key, &end_key, &event);
                async move {
                    match tx.get(key).await? {
                        Some(existing) if existing == *event => return Ok(Appended::Already),
                        Some(_) => return Ok(Appended::Taken),
                        None => {}
                    }
                    tx.set(key, event);
                    let stored_end = Self::get_u64(&mut tx, end_key, "PLog end").await?;
                    if stored_end.unwrap_or(0) < end.0 {
                        tx.set(end_key, &end.0.to_be_bytes());
                    }
                    tx.commit().await?;
                    Ok(Appended::Now)
                }
            })
            .await?;
        match outcome {
            Appended::Now | Appended::Already => Ok(()),
            Appended::Taken => Err(TxSeqError::OffsetTaken(offset)),
        }
    }
}

/// What an append found.
enum Appended {
    Now,
    Already,
    Taken,
}

impl<K: TxKv> SeqStorage for TxKvSeqStorage<K> {
    async fn read_numbers(
        &self,
        ws_id: WsId,
        seq_ids: &[SeqId],
    ) -> Result<Vec<Number>, SeqStorageError> {
        let keys: Vec<Vec<u8>> = seq_ids
            .iter()
            .map(|&seq_id| self.keys.number(NumberKey { ws_id, seq_id }))
            .collect();
        // Read-only: nothing to commit, and nothing to conflict with.
        let numbers = self
            .transact(|mut tx| {
                let keys = &keys;
                async move {
                    let mut out = Vec::with_capacity(keys.len());
                    for key in keys {
                        let stored = Self::get_u64(&mut tx, key, "stored number").await?;
                        out.push(Number(stored.unwrap_or(0)));
                    }
                    Ok(out)
                }
            })
            .await;
        Ok(numbers?)
    }

    async fn read_next_plog_offset(&self) -> Result<PLogOffset, SeqStorageError> {
        let key = self.keys.offset();
        let stored = self
            .transact(|mut tx| {
                let key = &key;
                async move { Self::get_u64(&mut tx, key, "stored offset").await }
            })
            .await?;
        Ok(stored.map_or(self.first_offset, PLogOffset))
    }

    async fn write_values_and_next_plog_offset(
        &self,
        values: &[SeqValue],
        next_plog_offset: PLogOffset,
    ) -> Result<(), SeqStorageError> {
        let mut chunks = values.chunks(WRITE_VALUES_PER_TX).peekable();
        // The last chunk (or none, for an empty batch) goes with the offset.
        while let Some(chunk) = chunks.next() {
            if chunks.peek().is_some() {
                self.write_merged(chunk, None).await?;
            } else {
                return self.write_merged(chunk, Some(next_plog_offset)).await;
            }
        }
        self.write_merged(&[], Some(next_plog_offset)).await
    }

    async fn actualize_from_plog(
        &self,
        offset: PLogOffset,
        sink: &mut ReplaySink<'_>,
    ) -> Result<(), SeqStorageError> {
        let end_key = self.keys.end();
        let mut from = offset.0;
        let mut values = Vec::new();
        loop {
            // One page per transaction: the end, then the events of up to a page of offsets
            // (an offset without an event is a gap in the log, skipped).
            let page = self
                .transact(|mut tx| {
                    let end_key = &end_key;
                    async move {
                        let end = Self::get_u64(&mut tx, end_key, "PLog end").await?;
                        let end = end.unwrap_or(0);
                        let to = end.min(from.saturating_add(REPLAY_PAGE_OFFSETS));
                        let mut events = Vec::new();
                        for o in from..to {
                            if let Some(event) = tx.get(&self.keys.plog(PLogOffset(o))).await? {
                                events.push((PLogOffset(o), event));
                            }
                        }
                        Ok((events, to, end))
                    }
                })
                .await;
            let (events, to, end) = page?;
            for (o, event) in &events {
                decode_event(event, &mut values)?;
                if sink(*o, &values) == ControlFlow::Break(()) {
                    return Ok(());
                }
            }
            if to >= end {
                return Ok(());
            }
            from = to;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn conflicts_and_unknown_outcomes_are_run_again_failures_and_corruption_not() {
        let tx = |e| retryable(&Fault::Tx(e));
        let io = || std::io::Error::other("x");
        assert!(tx(TxError::retryable(io())));
        assert!(tx(TxError::unknown_result(io())));
        assert!(!tx(TxError::failed(io())));
        assert!(!retryable(&Fault::Corrupt(SeqStorageError::Corrupt {
            what: "x".into()
        })));
    }
}
