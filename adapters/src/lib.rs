//! # vvm-adapters: lease stores
//!
//! Implementations of [`vvm_runtime::LeaseStore`], each behind a cargo feature.
#![forbid(unsafe_code)]
#![deny(missing_docs)]

#[cfg(feature = "memory")]
pub mod memory;

#[cfg(feature = "memory")]
pub use memory::MemoryStore;

#[cfg(feature = "memory")]
pub mod seq_memory;
#[cfg(feature = "sqlite")]
pub mod seq_sqlite;

#[cfg(feature = "etcd")]
pub mod etcd;
#[cfg(feature = "etcd")]
pub use etcd::EtcdStore;

#[cfg(feature = "sqlite")]
pub mod sqlite;

#[cfg(feature = "sqlite")]
pub use sqlite::{SqliteStore, SqliteStoreError};

#[cfg(feature = "url")]
pub mod url;

#[cfg(feature = "open")]
pub mod open;

#[cfg(feature = "txkv")]
pub mod seq_txkv;
#[cfg(feature = "txkv")]
mod seq_txkv_codec;
#[cfg(feature = "txkv")]
pub mod txkv;

#[cfg(feature = "foundationdb")]
pub mod foundationdb;
