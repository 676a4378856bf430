//! # vvm
//!
//! Runs service work only while it holds leadership of one of `N` slots in a shared store, keeps
//! the lease renewed, ends its own process before the lease could pass to someone else, and shuts
//! down in a strict order: services, then the leadership monitor, then the release of the key.
#![forbid(unsafe_code)]
#![deny(missing_docs)]

pub use vvm_core;
pub use vvm_core::{
    ConfigError, FencingToken, Incarnation, Instant, LeaseConfig, LossReason, Phase, Problem,
    Revision, Slot, VvmConfig, VvmConfigBuilder, ACQUISITION_FOREVER,
};
pub use vvm_runtime::*;

/// The lease stores, each behind the feature of its name (`memory`, the default; `sqlite`,
/// `etcd`, `etcd-tls`, `foundationdb`), store URLs (`url`) and opening the store a URL names
/// (`open`).
pub use vvm_adapters as adapters;
