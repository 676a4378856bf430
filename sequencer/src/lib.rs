//! # vvm-sequencer: gapless, duplicate-free numbers per workspace
//!
//! A command processor numbers what it writes (record ids, log offsets) with one sequencing
//! transaction per event; among the events committed to its event log (the PLog), numbers have
//! no gaps and no duplicates, across crashes too: the PLog is the truth, and a restarted
//! sequencer replays it. The crate has three parts:
//!
//! - [`engine`]: the pure rules (the issuer, its cache, the backlog of committed numbers), no
//!   I/O and no clock;
//! - [`Sequencer`]: the engine with a background task and a [`SeqStorage`], its states as
//!   types;
//! - [`storages`]: where the numbers are kept (in memory, SQLite, a transactional key-value
//!   store such as FoundationDB), each behind the feature of its name.
//!
//! It is independent of leadership: a service that runs under a `vvm` VVM uses it to number
//! its events, and so can any other.
//!
//! [`Sequencer`] wraps the pure [`engine`] parts with a background task and a
//! [`SeqStorage`]. Its states are types, so misuse does not compile:
//!
//! ```text
//!  new ──▶ Sequencer<Actualizing> ──ready / idle──▶ Sequencer<Idle> ──start──▶ Sequencer<InTx>
//!                 ▲                                   ▲   │ Busy (handed back)     │ next*
//!                 │                                   │   ▼                        │
//!                 └──────────────── actualize ────────┼────────────────────────────┤
//!                                                     └──────────── flush ─────────┘
//! ```
//!
//! One background task per sequencer: the actualizer (read the stored offset, replay the PLog
//! from it, flushing whenever the replayed backlog is over its limit), then the flusher (write
//! the whole backlog with the offset it covers whenever signalled). Every storage call has a
//! timeout, every failed step at most [`SeqConfig::retries_max`] retries with doubling backoff.
//! A new actualization stops the task cooperatively — a write in flight returns first — and
//! starts its own once the old one ended; [`shutdown`](Sequencer::shutdown) stops it the same
//! way and returns within its budget whatever storage does, saying when the sequencer was not
//! actualized. After a failed actualization, `ready()` on the idle sequencer starts the next one
//! and awaits it; a PLog found out of order is permanent
//! ([`StartRefusal::CorruptPLog`], not transient).
//!
//! `next` hands out the number after the maximum of everything known of the key: the open
//! transaction or the cache when they know it (they hold that maximum), otherwise the backlog
//! and storage together, storage read even when the backlog has the key (a replayed number may
//! be below storage's). Call timeouts must be longer than the storage's own lock wait
//! ([`SeqStorage::lock_wait_ms`]); `new` checks.
//!
//! ```
//! use vvm_sequencer::engine::{Number, PLogOffset, Params, SeqId, WsId, WsKind};
//! use vvm_sequencer::{SeqConfig, Sequencer};
//! # use std::ops::ControlFlow;
//! # use vvm_sequencer::engine::SeqValue;
//! # use vvm_sequencer::{ReplaySink, SeqStorage, SeqStorageError};
//! # struct Empty;
//! # impl SeqStorage for Empty {
//! #     async fn read_numbers(&self, _: WsId, s: &[SeqId]) -> Result<Vec<Number>, SeqStorageError> {
//! #         Ok(vec![Number(0); s.len()])
//! #     }
//! #     async fn read_next_plog_offset(&self) -> Result<PLogOffset, SeqStorageError> { Ok(PLogOffset(1)) }
//! #     async fn write_values_and_next_plog_offset(&self, _: &[SeqValue], _: PLogOffset) -> Result<(), SeqStorageError> { Ok(()) }
//! #     async fn actualize_from_plog(&self, _: PLogOffset, _: &mut ReplaySink<'_>) -> Result<(), SeqStorageError> { Ok(()) }
//! # }
//! # let storage = Empty;
//! # tokio::runtime::Builder::new_current_thread().enable_time().build().unwrap().block_on(async {
//! let params = Params::builder().sequence(WsKind(1), SeqId(1), Number(100)).build().unwrap();
//! let seq = Sequencer::new(params, storage, SeqConfig::default()).unwrap().ready().await;
//! let mut tx = seq.start(WsKind(1), WsId(7)).unwrap();
//! assert_eq!(tx.offset(), PLogOffset(1));
//! assert_eq!(tx.next(SeqId(1)).await.unwrap(), Number(100));
//! // ... write the event to the PLog at tx.offset(), then:
//! let seq = tx.flush();
//! seq.shutdown().await.unwrap();
//! # });
//! ```

#![forbid(unsafe_code)]
#![deny(missing_docs)]
#![deny(missing_debug_implementations)]

pub mod engine;
pub mod storages;

mod config;
mod errors;
mod handle;
mod storage;
mod task;
mod worker;

pub use crate::engine::StartRefusal;
pub use config::{
    SeqConfig, SeqConfigError, REPLAY_PAGE_EVENTS_MAX, SEQ_DURATION_MAX_MS, SEQ_RETRIES_LIMIT,
};
pub use errors::{ActualizeError, NextError, SeqStatus, SetupError, ShutdownError};
pub use handle::{Actualizing, Busy, Idle, InTx, SeqState, Sequencer};
pub use storage::{ReplaySink, SeqStorage, SeqStorageError};
