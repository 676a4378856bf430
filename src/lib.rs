//! # vvm
//!
//! Runs service work only while it holds leadership of one of `N` slots in a shared store, keeps
//! the lease renewed, ends its own process before the lease could pass to someone else, and shuts
//! down in a strict order: services, then the leadership monitor, then the release of the key.
//!
//! This crate re-exports [`vvm_core`] and [`vvm_runtime`], and the stores of [`adapters`]
//! behind features: `memory` (default), `sqlite`, `etcd`, `etcd-tls`, `foundationdb`, `postgres`, `url`,
//! `open`. The `cli` feature builds the `vvm` host binary. The README's quick start, a complete
//! program on the memory store, is compiled and run with the tests.
//!
//! ```
//! # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! use vvm::adapters::MemoryStore;
//! use vvm::{Services, Vvm, VvmConfig};
//!
//! // No services: the VVM only holds a slot.
//! let vvm = Vvm::provide(VvmConfig::builder("10.0.0.7:7000"), MemoryStore::new(), Services::new())?;
//! let stop = vvm.stop_handle();
//! let vvm = vvm.launch().await;
//! stop.stop(); // from anywhere, e.g. a signal handler
//! vvm.shutdown().await?; // services, monitor, then the release of the key
//! # Ok(()) }
//! ```
//!
//! **A store from a URL, for every API.** With the `open` feature, one call turns a URL
//! (`memory:`, `sqlite:PATH`, `etcd://HOST:PORT`, `fdb:`) into a store that a [`Vvm`],
//! [`Elections`] and [`Coordination`] all accept; clones share it:
//!
//! ```
//! # #[cfg(feature = "open")]
//! # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! use vvm::adapters::open::open;
//! use vvm::{AcquireOptions, Coordination, Elections, KillerThread, LeaseConfig, LeaseValue};
//! use vvm::{new_incarnation, Services, SessionHandle, Slot, Vvm, VvmConfig};
//!
//! let lease = LeaseConfig::default();
//! let store = open("memory:", &lease).await?; // or "sqlite:/var/lib/app/vvm.sqlite", "etcd://10.0.0.1:2379"
//! let killer = KillerThread::global(); // ends this process before a lost lease could pass on
//!
//! // Services that run only while this process leads slot 1.
//! let config = VvmConfig::builder("10.0.0.7:7000");
//! let vvm = Vvm::provide(config, store.clone(), Services::new())?.launch().await;
//!
//! // A slot held without services around it.
//! let elections = Elections::start(store.clone(), "10.0.0.7:7000", lease, &killer)?;
//! let token = elections.acquire(Slot(2)).await?;
//! assert_eq!(token.slot, Slot(2));
//!
//! // Units of a counted semaphore, held on a session.
//! let me = LeaseValue::new("10.0.0.7:7000", new_incarnation());
//! let session = SessionHandle::open(store.clone(), lease, me, &killer).await?;
//! let coordination = Coordination::new(session);
//! coordination.create("workers", 2, Vec::new()).await?;
//! let grant = coordination.acquire("workers", AcquireOptions::new(1)).await?;
//! assert!(grant.is_some(), "1 of 2 units");
//!
//! // Everything given back: the process may live on.
//! grant.expect("granted").release().await?;
//! coordination.session().close().await?;
//! elections.release_all().await?;
//! vvm.shutdown().await?;
//! # Ok(()) }
//! # #[cfg(not(feature = "open"))]
//! # fn main() {}
//! ```
#![forbid(unsafe_code)]
#![deny(missing_debug_implementations)]
#![deny(missing_docs)]

pub use vvm_core;
/// Semaphores' vocabulary (`Description`, `Status`, `Outcome`, the size bounds): the rules of
/// coordination, as every store runs them.
pub use vvm_core::semaphore;
pub use vvm_core::{
    ConfigError, FencingToken, Incarnation, Instant, LeaseConfig, LossReason, Phase, Problem,
    Revision, Semaphore, SemaphoreError, SemaphoreName, SessionId, SessionKey, Slot, VvmConfig,
    VvmConfigBuilder, ACQUISITION_FOREVER,
};
pub use vvm_runtime::*;

/// The lease stores, each behind the feature of its name (`memory`, the default; `sqlite`,
/// `etcd`, `etcd-tls`, `foundationdb`, `postgres`), store URLs (`url`) and opening the store a URL names
/// (`open`).
#[doc(inline)]
pub use vvm_adapters as adapters;

/// The README's examples, compiled and run by `cargo test --doc`.
#[doc = include_str!("../README.md")]
#[cfg(doctest)]
pub struct ReadmeDoctests;
