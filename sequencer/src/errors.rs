//! What the handle's calls report besides success.

use crate::engine::{BacklogError, PLogOffset, Phase, SeqError};

use super::config::SeqConfigError;
use super::storage::SeqStorageError;

/// Why a sequencer could not be made.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum SetupError {
    /// The [`SeqConfig`](super::SeqConfig) is invalid.
    #[error(transparent)]
    Config(#[from] SeqConfigError),
    /// Not called from within a tokio runtime (the background task needs one, with time
    /// enabled).
    #[error("a sequencer must be created inside a tokio runtime")]
    NoRuntime,
}

/// Why `next` failed. The transaction stays open; after a storage error the caller usually
/// gives the event up with [`actualize`](crate::Sequencer::actualize).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum NextError {
    /// Unknown sequence or exhausted sequence.
    #[error(transparent)]
    Seq(#[from] SeqError),
    /// Reading the stored numbers failed.
    #[error(transparent)]
    Storage(#[from] SeqStorageError),
}

/// Why an actualization gave up. `start` then refuses with
/// [`StartRefusal::ActualizationFailed`](crate::engine::StartRefusal::ActualizationFailed) and begins a new one.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ActualizeError {
    /// A storage call failed (or timed out) after its retries.
    #[error(transparent)]
    Storage(#[from] SeqStorageError),
    /// The PLog fed an event below one already covered: the storage broke the documented
    /// offset order, so events may be missing. Not retried within the actualization: the
    /// same log would be read again.
    #[error("the PLog is corrupt: event at {got:?} fed after every event below {covered:?}")]
    CorruptPLog {
        /// Every event below this offset was covered already.
        covered: PLogOffset,
        /// The offset of the event fed.
        got: PLogOffset,
    },
    /// The backlog refused a step: a bug in the driver, reported instead of corrupting state.
    #[error("actualization out of step")]
    OutOfStep(#[source] BacklogError),
}

impl From<BacklogError> for ActualizeError {
    fn from(e: BacklogError) -> Self {
        match e {
            BacklogError::PLogOutOfOrder { covered, got } => {
                ActualizeError::CorruptPLog { covered, got }
            }
            other => ActualizeError::OutOfStep(other),
        }
    }
}

/// `shutdown` could not leave storage covering every committed event. Nothing is lost — the
/// PLog has the events and the next actualization replays them — but that recovery is longer,
/// and a caller may want to know why.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ShutdownError {
    /// Numbers of committed events were not persisted (storage failed or hung).
    #[error(
        "sequencer shut down with {unflushed_keys} keys of {unflushed_events} events unflushed"
    )]
    Unflushed {
        /// Keys not written.
        unflushed_keys: usize,
        /// Events not covered by the stored offset.
        unflushed_events: u64,
    },
    /// The sequencer had not caught up with the PLog: its actualization was unfinished or had
    /// failed, so it did not even know every committed event, let alone store it.
    #[error("sequencer shut down not actualized ({phase:?})")]
    NotActualized {
        /// Where the actualization stood.
        phase: Phase,
        /// Why the last actualization gave up, if one did (a later one may be unfinished).
        #[source]
        cause: Option<ActualizeError>,
    },
}

/// A snapshot of where a sequencer stands.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SeqStatus {
    /// The backlog's phase.
    pub phase: Phase,
    /// Keys waiting to be written.
    pub unflushed_keys: usize,
    /// Events not covered by the stored offset.
    pub unflushed_events: u64,
    /// Batches written.
    pub writes_ok: u64,
    /// Batch writes that failed.
    pub writes_failed: u64,
    /// The last storage error with its causes, as [`ErrorChain`](vvm_runtime::ErrorChain) prints it;
    /// cleared by the next successful write.
    pub last_error: Option<String>,
}
