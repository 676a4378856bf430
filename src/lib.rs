//! # vvm
//!
//! Runs service work only while it holds leadership of one of `N` slots in a shared store, keeps
//! the lease renewed, ends its own process before the lease could pass to someone else, and shuts
//! down in a strict order: services, then the leadership monitor, then the release of the key.
//!
//! This crate re-exports [`vvm_core`] and [`vvm_runtime`], and the stores of [`adapters`]
//! behind features: `memory` (default), `sqlite`, `etcd`, `etcd-tls`, `foundationdb`, `url`,
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
#![forbid(unsafe_code)]
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
/// `etcd`, `etcd-tls`, `foundationdb`), store URLs (`url`) and opening the store a URL names
/// (`open`).
pub use vvm_adapters as adapters;

/// The README's examples, compiled and run by `cargo test --doc`.
#[doc = include_str!("../README.md")]
#[cfg(doctest)]
pub struct ReadmeDoctests;
