//! Where a sequencer keeps its numbers: [`SeqStorage`](crate::SeqStorage) implementations, each
//! behind the feature of its name.
//!
//! | feature | storage |
//! |---|---|
//! | `memory` (default) | [`memory::MemorySeqStorage`]: one process, with a PLog of its own and injectable faults (tests, benchmarks) |
//! | `sqlite` | `sqlite::SqliteSeqStorage`: one SQLite file, numbers and the PLog's sequence columns |
//! | `txkv` | `txkv::TxKvSeqStorage`: any transactional key-value store of `vvm-adapters` (FoundationDB, PostgreSQL, the in-memory twin) |

#[cfg(feature = "memory")]
pub mod memory;
#[cfg(feature = "sqlite")]
pub mod sqlite;
#[cfg(feature = "txkv")]
pub mod txkv;
#[cfg(feature = "txkv")]
mod txkv_codec;
