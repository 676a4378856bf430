//! # vvm-runtime: executes what the core decides
//!
//! The runtime feeds events into the pure machines of [`vvm_core`] and performs their effects:
//! store calls (each under its own timeout), timers, the killer thread and the services.
#![forbid(unsafe_code)]
#![deny(missing_docs)]

pub mod store;

pub use store::{Lease, LeaseStore, LeaseValue, StoreError, ValueError};
