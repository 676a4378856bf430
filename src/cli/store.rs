//! Opening the store named by `--store`: [`vvm_adapters::open`] does the work; this module maps
//! its errors to exit codes and starts FoundationDB's network thread for `fdb:` URLs.

use std::process::ExitCode;
use std::time::Duration;

use vvm::LeaseConfig;
pub use vvm_adapters::open::AnyStore;
use vvm_adapters::open::OpenError;

use super::{fail, usage_error};

/// The file name of the default store, in the user's state directory.
const DEFAULT_FILE: &str = "vvm.sqlite";

/// The store a command uses: `given` (`--store` or `VVM_STORE`), else `sqlite:` in the user's
/// state directory — `$XDG_STATE_HOME/vvm/vvm.sqlite`, else `$HOME/.local/state/vvm/vvm.sqlite`
/// — so that every `vvm` of one user meets on one store wherever it was started. Relative
/// `XDG_STATE_HOME` values are ignored, as the XDG base directory rules say.
///
/// With `create`, the directory of the default store is created (mode 0700: only its user can
/// reach the store). A `sqlite:` store whose directory does not exist is refused with a message
/// that says so (SQLite's own says only that it cannot open the file).
pub fn resolve(given: Option<&str>, create: bool) -> Result<String, String> {
    let url = match given {
        Some(url) => url.to_owned(),
        None => {
            let dir = default_dir().ok_or_else(|| {
                "no default store: neither XDG_STATE_HOME nor HOME is set; give --store".to_owned()
            })?;
            if create {
                use std::os::unix::fs::DirBuilderExt;
                std::fs::DirBuilder::new()
                    .recursive(true)
                    .mode(0o700)
                    .create(&dir)
                    .map_err(|e| {
                        format!(
                            "cannot create the default store's directory {}: {e}; give --store",
                            dir.display()
                        )
                    })?;
            }
            format!("sqlite:{}", dir.join(DEFAULT_FILE).display())
        }
    };
    // A bad URL is refused here, before anything is logged with it.
    let parsed = vvm_adapters::url::StoreUrl::parse(&url)
        .map_err(|e| format!("bad store URL: {}", super::error_chain(&e)))?;
    if let vvm_adapters::url::StoreUrl::Sqlite(sqlite) = parsed {
        let parent = sqlite.path.parent().filter(|p| !p.as_os_str().is_empty());
        if let Some(parent) = parent {
            if create && !parent.is_dir() {
                let what = if parent.exists() {
                    "is not a directory"
                } else {
                    "does not exist"
                };
                return Err(format!(
                    "--store {}: {} {what}; create the directory or choose another path",
                    sqlite.path.display(),
                    parent.display()
                ));
            }
        }
    }
    Ok(url)
}

/// `$XDG_STATE_HOME/vvm` when that is an absolute path, else `$HOME/.local/state/vvm`.
fn default_dir() -> Option<std::path::PathBuf> {
    let absolute = |name: &str| {
        std::env::var_os(name)
            .map(std::path::PathBuf::from)
            .filter(|path| path.is_absolute())
    };
    if let Some(state) = absolute("XDG_STATE_HOME") {
        return Some(state.join("vvm"));
    }
    absolute("HOME").map(|home| home.join(".local/state/vvm"))
}

/// `url` as safe to log: the canonical form without credentials (see
/// [`vvm_adapters::url::StoreUrl`]), or `url` itself when it does not parse (it is then refused
/// before anything is logged with it).
pub fn shown(url: &str) -> String {
    vvm_adapters::url::StoreUrl::parse(url).map_or_else(|_| url.to_owned(), |u| u.to_string())
}

/// A store that could not be opened: a bad URL or value (exit 2) or a store that failed (exit 1).
#[derive(Debug)]
pub struct OpenFailure(OpenError);

impl OpenFailure {
    /// What a read-only open found missing (see `OpenError::is_absent`), said without the
    /// "store failed" of an error; `None` for every other failure.
    pub fn absent(&self) -> Option<String> {
        self.0
            .is_absent()
            .then(|| match std::error::Error::source(&self.0) {
                Some(what) => what.to_string(),
                None => self.0.to_string(),
            })
    }

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

/// What `vvm run` does when the store cannot serve at start (`--store-unavailable`): an etcd
/// cluster without a quorum or out of reach is unavailable for a while, not set up wrongly.
#[derive(clap::ValueEnum, Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Unavailable {
    /// Wait for it: try again after growing pauses (up to `--round`) within the acquisition
    /// window (`--acquire`), then lead when it serves.
    #[default]
    Wait,
    /// Exit 1 at once, for scripts that would rather know.
    Fail,
}

/// The first pause before opening an unavailable store again; pauses double up to the round.
const REOPEN_FIRST: Duration = Duration::from_millis(100);

/// Opens the store named by `url` as [`open_store`] does; while it is unavailable
/// ([`OpenError::is_unavailable`]) and `policy` says wait, opens it again after jittered pauses
/// from [`REOPEN_FIRST`] up to `round`, for at most `window` (`--acquire`). Says once that it
/// waits. Every other failure, and the last one when the window ends, is the exit code; so is
/// SIGINT or SIGTERM during the wait (a clean stop: nothing was held, nothing started).
pub async fn open_store_waiting(
    url: &str,
    lease: &LeaseConfig,
    policy: Unavailable,
    window: Duration,
    round: Duration,
) -> Result<AnyStore, ExitCode> {
    use tokio::signal::unix::{signal, SignalKind};

    let started = tokio::time::Instant::now();
    let mut pauses = vvm::store::jittered_backoff(REOPEN_FIRST.min(round), round.max(REOPEN_FIRST));
    let mut said = false;
    // Listened for only once there is something to wait for: until then the default
    // disposition (the process ends) is as good, and nothing of the host is set up yet.
    let mut signals: Option<(tokio::signal::unix::Signal, tokio::signal::unix::Signal)> = None;
    loop {
        let attempt = open_store(url, lease);
        let outcome = match &mut signals {
            None => attempt.await,
            // Once waiting, a signal ends an attempt too: one may last the request timeout.
            Some((terminate, interrupt)) => tokio::select! {
                outcome = attempt => outcome,
                _ = terminate.recv() => return Err(stopped("SIGTERM")),
                _ = interrupt.recv() => return Err(stopped("SIGINT")),
            },
        };
        let error = match outcome {
            Ok(store) => return Ok(store),
            Err(OpenFailure(error)) => error,
        };
        let waited = started.elapsed();
        if policy == Unavailable::Fail || !error.is_unavailable() || waited >= window {
            return Err(OpenFailure(error).exit());
        }
        if !said {
            said = true;
            tracing::warn!(
                store = %shown(url),
                error = %super::error_chain(&error),
                "the store is unavailable; waiting for it (--store-unavailable fail exits instead)"
            );
        } else {
            tracing::debug!(error = %super::error_chain(&error), waited = ?waited, "the store is still unavailable");
        }
        let signals = match &mut signals {
            Some(signals) => signals,
            None => match (
                signal(SignalKind::terminate()),
                signal(SignalKind::interrupt()),
            ) {
                (Ok(terminate), Ok(interrupt)) => signals.insert((terminate, interrupt)),
                (Err(e), _) | (_, Err(e)) => {
                    return Err(fail(&format!("cannot listen for signals: {e}")))
                }
            },
        };
        let pause = pauses.next().unwrap_or(round).min(window - waited);
        tokio::select! {
            () = tokio::time::sleep(pause) => {}
            _ = signals.0.recv() => return Err(stopped("SIGTERM")),
            _ = signals.1.recv() => return Err(stopped("SIGINT")),
        }
    }
}

/// A signal ended the wait for the store: nothing was held or started, so it is a clean stop
/// (one by SIGINT ends `vvm` by SIGINT, see [`super::host::clean_exit`]).
fn stopped(name: &str) -> ExitCode {
    tracing::info!("{name} while waiting for the store: stopping");
    if name == "SIGINT" {
        super::host::note_interrupt();
    }
    super::host::clean_exit()
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
