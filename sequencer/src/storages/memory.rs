//! An in-process [`SeqStorage`] with a PLog of its own, for tests and benchmarks.
//!
//! Clones share one state, so a "restarted" sequencer can be given the storage its crashed
//! predecessor used. Faults ([`SeqFault`]) can be aimed at each call, including a crash
//! *between* the values and the offset of a write, which is the boundary a careless design gets
//! wrong: values land, the offset does not.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use crate::engine::{Number, NumberKey, PLogOffset, SeqId, SeqValue, WsId};
use crate::{ReplaySink, SeqStorage, SeqStorageError};

/// Most events the PLog holds.
pub const PLOG_EVENTS_MAX: usize = 10_000_000;
/// Most numbers one PLog event may carry.
pub const EVENT_VALUES_MAX: usize = 4_096;
/// Events copied out of the PLog per lock, during a replay.
const REPLAY_CHUNK_EVENTS: usize = 1_024;

/// One of the four storage calls, to aim faults at and to count.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum SeqOp {
    /// `read_numbers`.
    ReadNumbers,
    /// `read_next_plog_offset`.
    ReadNextPLogOffset,
    /// `write_values_and_next_plog_offset`.
    Write,
    /// `actualize_from_plog`.
    Replay,
}

/// What goes wrong with a call.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SeqFault {
    /// Fails; nothing is applied.
    Fail,
    /// Never completes; only the caller's timeout ends it.
    Hang,
    /// Waits this long (tokio's clock), then runs normally.
    Delay(Duration),
    /// For a write: the values are stored, then the "process dies" before the offset is — the
    /// call fails. For a replay: a few events are fed, then the call fails.
    FailHalfway,
}

/// Why an event could not be appended to the PLog.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum PLogError {
    /// An event is already stored at that offset (the PLog is insert-only).
    #[error("PLog offset {0:?} is taken")]
    OffsetTaken(PLogOffset),
    /// Too many numbers in one event.
    #[error("event carries {0} numbers, more than {EVENT_VALUES_MAX}")]
    TooManyValues(usize),
    /// The PLog is full.
    #[error("PLog holds {PLOG_EVENTS_MAX} events already")]
    Full,
}

#[derive(Clone, Copy, Debug)]
struct Injection {
    fault: SeqFault,
    remaining: Option<u32>,
}

#[derive(Debug)]
struct State {
    numbers: HashMap<NumberKey, Number>,
    next_plog_offset: PLogOffset,
    plog: BTreeMap<PLogOffset, Vec<SeqValue>>,
    faults: HashMap<SeqOp, Injection>,
    calls: HashMap<SeqOp, u64>,
}

/// The memory storage. Cheap to clone; clones share everything.
#[derive(Clone, Debug)]
pub struct MemorySeqStorage {
    state: Arc<Mutex<State>>,
}

impl Default for MemorySeqStorage {
    fn default() -> Self {
        Self::new(PLogOffset(1))
    }
}

impl MemorySeqStorage {
    /// An empty storage whose PLog starts at `first_offset`.
    pub fn new(first_offset: PLogOffset) -> Self {
        MemorySeqStorage {
            state: Arc::new(Mutex::new(State {
                numbers: HashMap::new(),
                next_plog_offset: first_offset,
                plog: BTreeMap::new(),
                faults: HashMap::new(),
                calls: HashMap::new(),
            })),
        }
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        // Nothing panics while the lock is held; a poisoned lock still guards whole updates.
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Aims `fault` at every call of `op` (`times: None`) or at the next `times` calls.
    pub fn inject(&self, op: SeqOp, fault: SeqFault, times: Option<u32>) {
        self.lock().faults.insert(
            op,
            Injection {
                fault,
                remaining: times,
            },
        );
    }

    /// Removes every fault.
    pub fn clear_faults(&self) {
        self.lock().faults.clear();
    }

    /// How many times `op` was called.
    pub fn calls(&self, op: SeqOp) -> u64 {
        self.lock().calls.get(&op).copied().unwrap_or(0)
    }

    /// Appends an event to the PLog (what a command processor does before `flush`).
    pub fn append_event(&self, offset: PLogOffset, values: &[SeqValue]) -> Result<(), PLogError> {
        if values.len() > EVENT_VALUES_MAX {
            return Err(PLogError::TooManyValues(values.len()));
        }
        let mut s = self.lock();
        if s.plog.len() >= PLOG_EVENTS_MAX {
            return Err(PLogError::Full);
        }
        if s.plog.contains_key(&offset) {
            return Err(PLogError::OffsetTaken(offset));
        }
        s.plog.insert(offset, values.to_vec());
        Ok(())
    }

    /// The stored number of `key` (`Number(0)` when none).
    pub fn stored_number(&self, key: NumberKey) -> Number {
        self.lock().numbers.get(&key).copied().unwrap_or_default()
    }

    /// The stored next PLog offset.
    pub fn stored_next_plog_offset(&self) -> PLogOffset {
        self.lock().next_plog_offset
    }

    /// Sets a stored number directly (for tests that start from a given storage state).
    pub fn put_number(&self, key: NumberKey, value: Number) {
        self.lock().numbers.insert(key, value);
    }

    /// The highest number of `key` in the PLog: what the next number must follow.
    pub fn plog_highest(&self, key: NumberKey) -> Number {
        self.lock()
            .plog
            .values()
            .flatten()
            .filter(|v| v.key == key)
            .map(|v| v.value)
            .max()
            .unwrap_or_default()
    }

    /// Events in the PLog.
    pub fn plog_len(&self) -> usize {
        self.lock().plog.len()
    }

    /// Counts the call and takes the fault aimed at it, if any.
    fn enter(&self, op: SeqOp) -> Option<SeqFault> {
        let mut s = self.lock();
        *s.calls.entry(op).or_insert(0) += 1;
        let injection = s.faults.get_mut(&op)?;
        let fault = injection.fault;
        match &mut injection.remaining {
            None => {}
            Some(0) => return None,
            Some(n) => *n -= 1,
        }
        Some(fault)
    }
}

fn failed(op: &'static str) -> SeqStorageError {
    SeqStorageError::failed(InjectedFault { op })
}

/// The cause of a storage call failed by an injected [`SeqFault`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[error("injected fault in {op}")]
pub struct InjectedFault {
    /// The call that failed.
    pub op: &'static str,
}

/// Applies a non-halfway fault; `Ok(true)` means "go on normally".
async fn common_fault(fault: Option<SeqFault>, op: &'static str) -> Result<bool, SeqStorageError> {
    match fault {
        None => Ok(true),
        Some(SeqFault::Fail) => Err(failed(op)),
        Some(SeqFault::Hang) => std::future::pending().await,
        Some(SeqFault::Delay(d)) => {
            tokio::time::sleep(d).await;
            Ok(true)
        }
        Some(SeqFault::FailHalfway) => Ok(false),
    }
}

impl SeqStorage for MemorySeqStorage {
    async fn read_numbers(
        &self,
        ws_id: WsId,
        seq_ids: &[SeqId],
    ) -> Result<Vec<Number>, SeqStorageError> {
        if !common_fault(self.enter(SeqOp::ReadNumbers), "read_numbers").await? {
            return Err(failed("read_numbers"));
        }
        let s = self.lock();
        Ok(seq_ids
            .iter()
            .map(|&seq_id| {
                s.numbers
                    .get(&NumberKey { ws_id, seq_id })
                    .copied()
                    .unwrap_or_default()
            })
            .collect())
    }

    async fn read_next_plog_offset(&self) -> Result<PLogOffset, SeqStorageError> {
        let fault = self.enter(SeqOp::ReadNextPLogOffset);
        if !common_fault(fault, "read_next_plog_offset").await? {
            return Err(failed("read_next_plog_offset"));
        }
        Ok(self.lock().next_plog_offset)
    }

    async fn write_values_and_next_plog_offset(
        &self,
        values: &[SeqValue],
        next_plog_offset: PLogOffset,
    ) -> Result<(), SeqStorageError> {
        let go_on = common_fault(self.enter(SeqOp::Write), "write").await?;
        let mut s = self.lock();
        // Values first, offset last: a crash in between leaves values ahead of the offset,
        // which a replay merges harmlessly. The other order would lose numbers.
        for v in values {
            let slot = s.numbers.entry(v.key).or_default();
            *slot = (*slot).max(v.value);
        }
        if !go_on {
            return Err(failed("write (after the values, before the offset)"));
        }
        s.next_plog_offset = s.next_plog_offset.max(next_plog_offset);
        Ok(())
    }

    async fn actualize_from_plog(
        &self,
        offset: PLogOffset,
        sink: &mut ReplaySink<'_>,
    ) -> Result<(), SeqStorageError> {
        let halfway = !common_fault(self.enter(SeqOp::Replay), "actualize_from_plog").await?;
        let mut from = offset;
        let mut fed = 0usize;
        loop {
            let chunk: Vec<(PLogOffset, Vec<SeqValue>)> = self
                .lock()
                .plog
                .range(from..)
                .take(REPLAY_CHUNK_EVENTS)
                .map(|(o, v)| (*o, v.clone()))
                .collect();
            let Some(&(last, _)) = chunk.last() else {
                return Ok(());
            };
            for (o, values) in &chunk {
                if halfway && fed >= 2 {
                    return Err(failed("actualize_from_plog (halfway)"));
                }
                fed += 1;
                if sink(*o, values).is_break() {
                    return Ok(());
                }
            }
            match last.next() {
                Some(next) => from = next,
                None => return Ok(()),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::ops::ControlFlow;

    fn sv(ws: u64, n: u64) -> SeqValue {
        SeqValue {
            key: NumberKey {
                ws_id: WsId(ws),
                seq_id: SeqId(1),
            },
            value: Number(n),
        }
    }

    fn block_on<F: std::future::Future>(f: F) -> F::Output {
        tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .build()
            .unwrap()
            .block_on(f)
    }

    // covers: Seq.StoredNeverDecreases
    #[test]
    fn stored_numbers_and_offsets_never_decrease() {
        let s = MemorySeqStorage::default();
        block_on(async {
            s.write_values_and_next_plog_offset(&[sv(1, 10)], PLogOffset(9))
                .await
                .unwrap();
            s.write_values_and_next_plog_offset(&[sv(1, 7)], PLogOffset(5))
                .await
                .unwrap();
            assert_eq!(
                s.read_numbers(WsId(1), &[SeqId(1), SeqId(2)])
                    .await
                    .unwrap(),
                vec![Number(10), Number(0)]
            );
            assert_eq!(s.read_next_plog_offset().await.unwrap(), PLogOffset(9));
        });
    }

    #[test]
    fn a_halfway_write_stores_the_values_but_not_the_offset() {
        let s = MemorySeqStorage::default();
        s.inject(SeqOp::Write, SeqFault::FailHalfway, Some(1));
        block_on(async {
            assert!(s
                .write_values_and_next_plog_offset(&[sv(1, 10)], PLogOffset(9))
                .await
                .is_err());
            assert_eq!(s.stored_next_plog_offset(), PLogOffset(1));
            assert_eq!(s.stored_number(sv(1, 0).key), Number(10));
            s.write_values_and_next_plog_offset(&[], PLogOffset(9))
                .await
                .unwrap();
        });
        assert_eq!(s.stored_next_plog_offset(), PLogOffset(9));
        assert_eq!(s.calls(SeqOp::Write), 2);
    }

    #[test]
    fn the_plog_is_insert_only_and_replays_in_order_from_an_offset() {
        let s = MemorySeqStorage::default();
        for o in [3u64, 1, 2] {
            s.append_event(PLogOffset(o), &[sv(o, o)]).unwrap();
        }
        assert_eq!(
            s.append_event(PLogOffset(2), &[]),
            Err(PLogError::OffsetTaken(PLogOffset(2)))
        );
        let mut seen = Vec::new();
        block_on(s.actualize_from_plog(PLogOffset(2), &mut |o, _| {
            seen.push(o.0);
            ControlFlow::Continue(())
        }))
        .unwrap();
        assert_eq!(seen, vec![2, 3]);
        assert_eq!(s.plog_highest(sv(3, 0).key), Number(3));
        assert_eq!(s.plog_len(), 3);
    }
}
