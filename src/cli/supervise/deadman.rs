//! The supervisor's own end at the kill deadline, by the kernel: a POSIX timer on
//! `CLOCK_BOOTTIME` that sends SIGKILL to this process, moved later with every deadline `vvm`
//! sends. A SIGKILL from a timer ends a stopped process too, so a supervisor that is stopped
//! (SIGSTOP, a debugger, a frozen cgroup) still ends at the deadline — and with it, by its
//! parent-death signal, the first process of the command's PID namespace and so the whole tree.
//! The supervisor's own loop ends the tree at the deadline first; the timer is set a little
//! later ([`MARGIN_NS`]) so that it only acts when that loop could not run.
#![allow(unsafe_code)]

/// How long after the deadline the timer fires: the supervisor's loop normally acts first.
pub const MARGIN_NS: u64 = 20_000_000;

/// The armed timer; dropped with the process (it is never deleted: the process ends first).
#[derive(Debug)]
pub struct Deadman {
    timer: libc::timer_t,
}

impl Deadman {
    /// A timer that will send SIGKILL to this process, not armed yet.
    pub fn new() -> std::io::Result<Deadman> {
        // SAFETY: a zeroed `sigevent` is valid; `timer` is written by the call before use.
        unsafe {
            let mut event: libc::sigevent = std::mem::zeroed();
            event.sigev_notify = libc::SIGEV_SIGNAL;
            event.sigev_signo = libc::SIGKILL;
            let mut timer: libc::timer_t = std::mem::zeroed();
            if libc::timer_create(libc::CLOCK_BOOTTIME, &mut event, &mut timer) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(Deadman { timer })
        }
    }

    /// Arms the timer for `deadline_ns` (`CLOCK_BOOTTIME`) plus [`MARGIN_NS`], replacing the
    /// previous time. One system call; it cannot block.
    pub fn arm(&self, deadline_ns: u64) -> std::io::Result<()> {
        let at_ns = deadline_ns.saturating_add(MARGIN_NS);
        let seconds = i64::try_from(at_ns / 1_000_000_000).unwrap_or(i64::MAX);
        // Below 10^9: fits any `c_long`.
        let nanoseconds = (at_ns % 1_000_000_000) as libc::c_long;
        // SAFETY: a zeroed `itimerspec` is valid; `self.timer` was made by `timer_create`.
        let failed = unsafe {
            let mut spec: libc::itimerspec = std::mem::zeroed();
            spec.it_value.tv_sec = seconds;
            spec.it_value.tv_nsec = nanoseconds;
            libc::timer_settime(self.timer, libc::TIMER_ABSTIME, &spec, std::ptr::null_mut()) != 0
        };
        if failed {
            return Err(std::io::Error::last_os_error());
        }
        Ok(())
    }
}
