//! Opening the store named by `--store`: [`vvm_adapters::open`] does the work; this module maps
//! its errors to exit codes and starts FoundationDB's network thread for `fdb:` URLs.

use std::process::ExitCode;

use vvm::LeaseConfig;
pub use vvm_adapters::open::AnyStore;
use vvm_adapters::open::OpenError;

use super::{fail, usage_error};

/// A store that could not be opened: a bad URL or value (exit 2) or a store that failed (exit 1).
#[derive(Debug)]
pub struct OpenFailure(OpenError);

impl OpenFailure {
    /// Prints the error with its causes on one line and returns the matching exit code.
    pub fn exit(self) -> ExitCode {
        let message = super::error_chain(&self.0);
        if self.0.is_usage() {
            usage_error(&message)
        } else {
            fail(&message)
        }
    }
}

/// Opens the store named by `url`, checking that it can honour `lease`.
pub async fn open_store(url: &str, lease: &LeaseConfig) -> Result<AnyStore, OpenFailure> {
    #[cfg(feature = "foundationdb")]
    if let Ok(parsed @ vvm_adapters::url::StoreUrl::Fdb(_)) =
        vvm_adapters::url::StoreUrl::parse(url)
    {
        return fdb::open(&parsed).map_err(OpenFailure);
    }
    vvm_adapters::open::open(url, lease)
        .await
        .map_err(OpenFailure)
}

/// Opens the store named by `url` for reading only (see [`vvm_adapters::open::open_read_only`]).
pub async fn open_store_read_only(url: &str, lease: &LeaseConfig) -> Result<AnyStore, OpenFailure> {
    #[cfg(feature = "foundationdb")]
    if let Ok(parsed @ vvm_adapters::url::StoreUrl::Fdb(_)) =
        vvm_adapters::url::StoreUrl::parse(url)
    {
        return fdb::open(&parsed).map_err(OpenFailure);
    }
    vvm_adapters::open::open_read_only(url, lease)
        .await
        .map_err(OpenFailure)
}

/// FoundationDB: its client needs a network thread, started once per process.
#[cfg(feature = "foundationdb")]
mod fdb {
    use vvm_adapters::open::{AnyStore, OpenError};
    use vvm_adapters::url::StoreUrl;

    /// Starts the network thread and opens the database `url` names; the store keeps the
    /// thread's guard.
    #[allow(unsafe_code)]
    pub fn open(url: &StoreUrl) -> Result<AnyStore, OpenError> {
        // SAFETY: the network may be booted once per process, and its guard must be dropped
        // before the process exits. This binary opens exactly one store per process (one `run`
        // or `status`), and the guard lives inside that store, which is dropped when the command
        // returns and its runtime shuts down, before `main` returns.
        let network = unsafe { vvm_adapters::foundationdb::boot() };
        vvm_adapters::open::open_fdb(url, network)
    }
}
