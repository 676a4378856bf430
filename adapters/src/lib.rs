//! # vvm-adapters: lease stores
//!
//! Implementations of [`vvm_runtime::LeaseStore`], each behind a cargo feature.
#![forbid(unsafe_code)]
#![deny(missing_docs)]
