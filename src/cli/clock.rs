//! A timestamp that several processes on one host can compare: `CLOCK_MONOTONIC` nanoseconds.

/// Nanoseconds of the host's monotonic clock, shared by every process on the host.
pub fn host_monotonic_ns() -> u64 {
    let now = rustix::time::clock_gettime(rustix::time::ClockId::Monotonic);
    // Both fields are non-negative for the monotonic clock.
    (now.tv_sec as u64) * 1_000_000_000 + now.tv_nsec as u64
}
