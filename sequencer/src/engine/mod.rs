//! # Sequences: gapless, duplicate-free numbers per workspace
//!
//! A workspace has sequences (record IDs, log offsets, ...). A command processor runs one
//! *sequencing transaction* per event: `start` (get the event's PLog offset), `next` any number
//! of times, then `flush` once the event is in the PLog — or `actualize` when writing it failed,
//! which hands the same numbers out again. **The PLog is the truth**: among committed events,
//! numbers have no gaps and no duplicates, also across crashes.
//!
//! This module holds the pure part, split by who owns it:
//!
//! - [`Issuer`] — owned by the caller that runs transactions: the LRU [`Cache`] of last issued
//!   numbers and the open transaction. Its cached path takes no lock and never allocates.
//! - [`Backlog`] — shared with the flusher and the actualizer: committed numbers not yet
//!   persisted, the PLog offset they cover, backpressure ([`Backlog::admit`]), batches for the
//!   flusher and the merge of a replayed PLog.
//!
//! ```text
//!   start ──admit──▶ Backlog            next ──▶ Issuer: transaction → cache
//!   flush ──commit─▶ Backlog                       └─▶ (caller) max(Backlog, storage)
//!   flusher: take_batch → write(values, next offset) → batch_written / batch_failed
//!   actualizer: begin_actualization → loaded(stored offset) → replay(event)* → actualized
//! ```
//!
//! Rules kept here, each with a test: a stored `(values, offset)` pair covers every event
//! below the offset; replayed and committed numbers merge by maximum; a number not cached is the
//! maximum of the backlog's and storage's, never one of them alone; `next` never goes below a
//! sequence's initial value; backpressure counts unflushed events as well as keys; a sequence at
//! `u64::MAX` is exhausted, never wrapped. The transition tables are in `specs/sequencer.md`.
//!
//! ```
//! use vvm_sequencer::engine::*;
//!
//! let params = Params::builder().sequence(WsKind(1), SeqId(1), Number(100)).build().unwrap();
//! let mut issuer = Issuer::new(params.clone());
//! let mut backlog = Backlog::new(&params);
//! backlog.begin_actualization();
//! backlog.loaded(PLogOffset(1)).unwrap();          // stored offset; empty PLog after it
//! backlog.actualized().unwrap();
//!
//! let offset = backlog.admit().unwrap();           // start
//! issuer.begin(WsKind(1), WsId(7)).unwrap();
//! let n = match issuer.next_cached(SeqId(1)).unwrap() {
//!     Some(n) => n,
//!     None => {
//!         // The backlog's numbers of the kind's sequences first, then storage's: the maximum.
//!         let mut pending = Vec::new();
//!         backlog.snapshot(WsId(7), issuer.kind_seqs().unwrap(), &mut pending);
//!         let stored = [Number(0)]; // read from storage
//!         issuer.next_from(SeqId(1), &pending, &stored).unwrap()
//!     }
//! };
//! assert_eq!((offset, n), (PLogOffset(1), Number(100)));
//! let (ws, issued) = issuer.issued().unwrap();
//! backlog.commit(offset, ws, issued).unwrap();     // flush
//! issuer.end().unwrap();
//!
//! let mut batch = Vec::new();
//! let ticket = backlog.take_batch(&mut batch).unwrap();
//! assert_eq!(ticket.next_offset(), PLogOffset(2));
//! assert!(backlog.batch_written(ticket, &batch));
//! assert_eq!(backlog.unflushed_keys(), 0);
//! ```

mod backlog;
#[cfg(test)]
mod backlog_tests;
mod cache;
mod issuer;
mod params;
mod types;

pub use backlog::{Backlog, BacklogError, BatchTicket, Offsets, Phase, ReplayStep, StartRefusal};
pub use cache::Cache;
pub use issuer::{number_after, Issued, Issuer, SeqError};
pub use params::{
    Params, ParamsBuilder, ParamsError, CACHE_CAPACITY_DEFAULT, CACHE_CAPACITY_MAX, KINDS_MAX,
    SEQS_PER_KIND_MAX, UNFLUSHED_EVENTS_DEFAULT, UNFLUSHED_EVENTS_LIMIT, UNFLUSHED_KEYS_DEFAULT,
    UNFLUSHED_KEYS_LIMIT,
};
pub use types::{
    KeyBuildHasher, KeyHasher, Number, NumberKey, PLogOffset, SeqId, SeqValue, WsId, WsKind,
};
