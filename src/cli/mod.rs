//! The subcommands of the host binary.

use std::future::Future;
use std::process::ExitCode;

pub mod args;
pub mod clock;
pub mod demo;
pub mod duration;
pub mod exec;
mod hold;
pub mod host;
pub mod log;
pub mod manual;
pub mod ops;
pub mod program;
pub mod run;
mod run_semaphore;
pub mod semaphore;
pub mod status;
pub mod store;
pub mod supervise;
pub mod systemd;
pub mod waiting;

pub use super::{DemoArgs, DemoStore, RunArgs, SemaphoreAction, SemaphoreArgs, StatusArgs};

/// Exit code of a usage error: bad flag, bad value, unknown store scheme.
pub const EXIT_USAGE: u8 = 2;

/// Default exit code of a `vvm run` whose `--acquire` ended with every slot (or the units) held
/// by someone else (`--busy-code`): apart from 1 (a problem, a store that failed) and 2 (usage),
/// so that a cron job can tell "someone else runs it" from "something is wrong". Not 75
/// (`EX_TEMPFAIL`, `flock -E 75`'s usual choice): that is the killer's.
pub const EXIT_BUSY: u8 = 3;

/// Prints a one-line usage error and returns exit code 2. Never panics (see [`log::line`]).
pub fn usage_error(message: &str) -> ExitCode {
    log::line(message);
    ExitCode::from(EXIT_USAGE)
}

/// Prints a one-line failure and returns exit code 1. Never panics (see [`log::line`]).
pub fn fail(message: &str) -> ExitCode {
    log::line(message);
    ExitCode::FAILURE
}

/// Runs `future` on a multi-threaded tokio runtime.
pub fn block_on(future: impl Future<Output = ExitCode>) -> ExitCode {
    match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime.block_on(future),
        Err(e) => fail(&format!("cannot start the async runtime: {e}")),
    }
}

/// `error` and its causes on one line, `outer: inner: innermost` (see [`vvm::store::ErrorChain`]):
/// errors do not repeat their source in their own message, so a host prints the chain.
pub fn error_chain(error: &dyn std::error::Error) -> String {
    vvm::store::ErrorChain(error).to_string()
}
