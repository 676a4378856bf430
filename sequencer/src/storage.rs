//! The storage contract of the sequencer: stored numbers, the stored PLog offset, and a reader
//! of the PLog for actualization.

use std::future::Future;
use std::ops::ControlFlow;

use crate::engine::{Number, PLogOffset, SeqId, SeqValue, WsId};

/// Why a storage call failed.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum SeqStorageError {
    /// The call failed. For a write, nothing or all of it may have been applied (never a part:
    /// values and offset are one unit, see [`SeqStorage::write_values_and_next_plog_offset`]).
    #[error("sequence storage call failed")]
    Failed {
        /// Why: the storage's own error, kept whole.
        source: vvm_runtime::Cause,
    },
    /// The call did not finish within its timeout (set by the runtime).
    #[error("sequence storage call {op} timed out after {timeout_ms} ms")]
    Timeout {
        /// Which call.
        op: &'static str,
        /// The timeout.
        timeout_ms: u64,
    },
    /// The storage answered something that cannot be right. There is no underlying error: the
    /// storage answered, and the answer is wrong.
    #[error("sequence storage is inconsistent: {what}")]
    Corrupt {
        /// What is wrong, e.g. "stored number of 7 bytes, not 8".
        what: String,
    },
}

impl SeqStorageError {
    /// [`Failed`](SeqStorageError::Failed) because of `source`.
    pub fn failed(source: impl std::error::Error + Send + Sync + 'static) -> SeqStorageError {
        SeqStorageError::Failed {
            source: vvm_runtime::Cause::new(source),
        }
    }
}

/// The replay sink: called once per PLog event, in offset order, with the event's numbers (keys
/// may repeat, in any order). Returning [`ControlFlow::Break`] stops the replay early.
pub type ReplaySink<'a> = dyn FnMut(PLogOffset, &[SeqValue]) -> ControlFlow<()> + Send + 'a;

/// Where a sequencer keeps its numbers, and how it reads the PLog.
///
/// Every method is one call under one timeout of the runtime. Implementations must be safe to
/// call from spawned tasks; a call that is dropped half-way (timeout, shutdown) must leave the
/// storage as if it either happened entirely or not at all.
pub trait SeqStorage: Send + Sync + 'static {
    /// The highest stored number of each of `seq_ids` in workspace `ws_id`, in the same order;
    /// `Number(0)` where none is stored.
    fn read_numbers(
        &self,
        ws_id: WsId,
        seq_ids: &[SeqId],
    ) -> impl Future<Output = Result<Vec<Number>, SeqStorageError>> + Send;

    /// The stored next PLog offset: every event below it has its numbers stored. An empty
    /// storage answers the first offset of the PLog.
    fn read_next_plog_offset(
        &self,
    ) -> impl Future<Output = Result<PLogOffset, SeqStorageError>> + Send;

    /// Stores `values` (keys unique) and `next_plog_offset` **as one unit**: a reader never
    /// sees the offset without the values. Both merge by maximum: a stored number or offset
    /// never decreases, whatever order writes arrive in. `values` may be empty.
    fn write_values_and_next_plog_offset(
        &self,
        values: &[SeqValue],
        next_plog_offset: PLogOffset,
    ) -> impl Future<Output = Result<(), SeqStorageError>> + Send;

    /// The longest one call waits by itself for a lock held by someone else (another
    /// connection, another process) before it fails with the storage's own error, in
    /// milliseconds; `0` (the default) for a storage that never waits so.
    ///
    /// [`Sequencer::new`](super::Sequencer::new) refuses call timeouts at or below it
    /// ([`SeqConfigError::TimeoutBelowLockWait`](super::SeqConfigError::TimeoutBelowLockWait)):
    /// with a shorter timeout, every call made while someone holds the lock would be given up
    /// on while it still waits, and each retry would leave another such call behind.
    fn lock_wait_ms(&self) -> u64 {
        0
    }

    /// Feeds `sink` every PLog event at or after `offset`, in offset order, until the log ends
    /// or `sink` breaks.
    fn actualize_from_plog(
        &self,
        offset: PLogOffset,
        sink: &mut ReplaySink<'_>,
    ) -> impl Future<Output = Result<(), SeqStorageError>> + Send;
}
