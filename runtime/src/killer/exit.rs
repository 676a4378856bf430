//! The production kill: one fixed line to standard error if that cannot block, then `_exit`.
//!
//! Everything here runs on the killer thread after a deadline passed, while other threads may
//! hold any lock (the standard error lock of a blocked log writer, the allocator's, the
//! runtime's). So it takes none, allocates nothing and never waits.

use super::{KillReport, Killer};

/// The exit code of a process ended by [`ExitKiller`]: 75 (`EX_TEMPFAIL` of `sysexits.h`). The
/// process lost its lease; a service manager may start it again, and it will campaign anew.
pub const KILL_EXIT_CODE: i32 = 75;

/// The one line [`ExitKiller`] writes to standard error before ending the process.
pub const KILL_MESSAGE: &str =
    "vvm: kill deadline passed without a confirmed renewal; ending the process (exit code 75)\n";

/// The production killer: writes [`KILL_MESSAGE`] to standard error if that cannot block
/// ([`write_kill_message`]), then ends the process at once with [`KILL_EXIT_CODE`].
///
/// It runs no exit handler, flushes no buffer and drops nothing: `std::process::exit` would flush
/// standard output under its lock, which a thread blocked on a stalled pipe may hold forever.
#[derive(Clone, Copy, Debug, Default)]
pub struct ExitKiller;

impl Killer for ExitKiller {
    fn kill(&self, _report: &KillReport) {
        write_kill_message();
        signal_hook::low_level::exit(KILL_EXIT_CODE);
    }
}

/// Writes [`KILL_MESSAGE`] to standard error, or nothing when that could block.
///
/// One system call per step and no allocation. What is safe depends on what standard error is:
/// - a pipe, FIFO or terminal: opened anew through `/proc/self/fd/2` with `O_NONBLOCK`, which
///   gives this write its own non-blocking file description (setting the flag on fd 2 itself
///   would change it for every process sharing the pipe), then one write; a full pipe drops
///   the line;
/// - a socket (e.g. the journal): one `send` with `MSG_DONTWAIT`;
/// - a regular file: one write (it never waits for a reader);
/// - anything else, or any failure: nothing.
pub fn write_kill_message() {
    use rustix::fs::{fstat, open, FileType, Mode, OFlags};

    let message = KILL_MESSAGE.as_bytes();
    let stderr = std::io::stderr();
    let Ok(stat) = fstat(&stderr) else {
        return;
    };
    match FileType::from_raw_mode(stat.st_mode) {
        FileType::Fifo | FileType::CharacterDevice => {
            let flags = OFlags::WRONLY | OFlags::NONBLOCK | OFlags::NOCTTY | OFlags::CLOEXEC;
            if let Ok(fd) = open(c"/proc/self/fd/2", flags, Mode::empty()) {
                let _ = rustix::io::write(&fd, message);
            }
        }
        FileType::Socket => {
            let _ = rustix::net::send(&stderr, message, rustix::net::SendFlags::DONTWAIT);
        }
        FileType::RegularFile => {
            let _ = rustix::io::write(&stderr, message);
        }
        _ => {}
    }
}
