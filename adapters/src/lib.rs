//! # vvm-adapters: lease stores
//!
//! Implementations of [`vvm_runtime::LeaseStore`], each behind a cargo feature:
//!
//! | feature | store |
//! |---|---|
//! | `memory` (default) | [`MemoryStore`]: one process, tests |
//! | `sqlite` | `SqliteStore`: processes of one host, expiry by `CLOCK_BOOTTIME` |
//! | `etcd`, `etcd-tls`, `etcd-cluster` | `EtcdStore` over etcd's leases; TLS; throw-away clusters for tests |
//! | `txkv`, `foundationdb` | lease logic over a transactional key-value store; FoundationDB under it |
//! | `postgres` | the same lease logic over one PostgreSQL table, watches by `LISTEN`/`NOTIFY` |
//! | `url`, `open` | store URLs with options (`url`), and `open::open(url, &lease)` → `open::AnyStore` |
//!
//! ```
//! # #[tokio::main(flavor = "current_thread")] async fn main() {
//! use std::time::Duration;
//! use vvm_adapters::MemoryStore;
//! use vvm_core::{Incarnation, Slot};
//! use vvm_runtime::{LeaseStore, LeaseValue};
//!
//! let store = MemoryStore::new();
//! let mine = LeaseValue::new("10.0.0.7:7000", Incarnation(1));
//! let ttl = Duration::from_secs(10);
//! let revision = store.insert_if_not_exists(Slot(1), &mine, ttl).await.unwrap();
//! assert!(revision.is_some(), "the slot was free");
//! let theirs = LeaseValue::new("10.0.0.8:7000", Incarnation(2));
//! assert_eq!(store.insert_if_not_exists(Slot(1), &theirs, ttl).await.unwrap(), None, "taken");
//! let lease = store.get(Slot(1)).await.unwrap().unwrap();
//! assert_eq!((lease.value, Some(lease.revision)), (mine, revision));
//! # }
//! ```
#![forbid(unsafe_code)]
#![deny(missing_debug_implementations)]
#![deny(missing_docs)]

#[cfg(feature = "memory")]
pub mod memory;

#[cfg(feature = "memory")]
pub use memory::{MemoryStore, MemoryStoreError};

#[cfg(feature = "etcd")]
pub mod etcd;
#[cfg(feature = "etcd")]
pub use etcd::EtcdStore;

#[cfg(feature = "sqlite")]
pub mod sqlite;

#[cfg(any(feature = "etcd", feature = "sqlite", feature = "txkv"))]
mod unreleased;

#[cfg(feature = "sqlite")]
pub use sqlite::{SqliteStore, SqliteStoreError};

#[cfg(feature = "url")]
pub mod url;

#[cfg(feature = "open")]
pub mod open;

#[cfg(feature = "txkv")]
pub mod txkv;

#[cfg(feature = "foundationdb")]
pub mod foundationdb;

#[cfg(feature = "postgres")]
pub mod postgres;
