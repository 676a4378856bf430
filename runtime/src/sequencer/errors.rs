//! What the handle's calls report besides success.

use std::fmt;

use vvm_core::sequencer::{Phase, SeqError, StartRefusal};

use super::config::SeqConfigError;
use super::handle::{Idle, Sequencer};
use super::storage::{SeqStorage, SeqStorageError};

/// Why a sequencer could not be made.
#[derive(Debug, thiserror::Error)]
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
/// gives the event up with [`actualize`](Sequencer::actualize).
#[derive(Debug, thiserror::Error)]
pub enum NextError {
    /// Unknown sequence or exhausted sequence.
    #[error(transparent)]
    Seq(#[from] SeqError),
    /// Reading the stored numbers failed.
    #[error(transparent)]
    Storage(#[from] SeqStorageError),
}

/// `start` refused: the reason and the idle sequencer, handed back.
pub struct Busy<St: SeqStorage> {
    /// Why. [`StartRefusal::is_transient`] tells whether trying again later can help.
    pub reason: StartRefusal,
    pub(crate) sequencer: Sequencer<Idle, St>,
}

impl<St: SeqStorage> Busy<St> {
    /// The sequencer, still idle.
    pub fn into_idle(self) -> Sequencer<Idle, St> {
        self.sequencer
    }
}

impl<St: SeqStorage> fmt::Debug for Busy<St> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Busy")
            .field("reason", &self.reason)
            .finish()
    }
}

impl<St: SeqStorage> fmt::Display for Busy<St> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "sequencer busy: {}", self.reason)
    }
}

impl<St: SeqStorage> std::error::Error for Busy<St> {}

/// `shutdown` ended with numbers not persisted. Nothing is lost — the PLog has them and the
/// next actualization replays them — but that recovery will be longer.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("sequencer shut down with {unflushed_keys} keys of {unflushed_events} events unflushed")]
pub struct ShutdownError {
    /// Keys not written.
    pub unflushed_keys: usize,
    /// Events not covered by the stored offset.
    pub unflushed_events: u64,
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
    /// The last storage error, cleared by the next successful write.
    pub last_error: Option<String>,
}
