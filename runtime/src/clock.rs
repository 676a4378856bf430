//! Where the runtime's `now` comes from: one clock for the driver, the killer and the stores.
//!
//! The core only ever sees [`Instant`]s: nanoseconds since an origin. The runtime fixes that
//! origin once per process ([`origin`]) and reads the present as
//!
//! ```text
//! now = (tokio's clock − origin) + time the host spent suspended since the origin
//! ```
//!
//! On Linux that is `CLOCK_BOOTTIME` measured from the origin: tokio's clock is `CLOCK_MONOTONIC`,
//! which stops while the host is suspended, and the suspended time is read live as the growth of
//! `CLOCK_BOOTTIME − CLOCK_MONOTONIC` since the origin ([`HostSuspend`]). A lease does not stop
//! ageing during a suspend — the SQLite store judges expiry by `CLOCK_BOOTTIME`, etcd and
//! FoundationDB by clocks of other machines — so neither may the holder's deadlines. Elsewhere the
//! suspended time is taken as zero: `now` is the monotonic clock, and a suspend longer than the
//! lease can leave a stale leader acting until its killer notices (documented in
//! `specs/runtime.md`).
//!
//! Tests can still freeze and advance time with `tokio::time::pause()` / `advance()`: every driver,
//! timer and memory store of the test moves together, and the suspended time only ever adds what
//! the host really spent asleep. The killer thread reads the same sum with the operating system's
//! monotonic clock in place of tokio's ([`boot_instant`]); its suspend source is injectable
//! ([`ManualSuspend`]) so that a test can model a suspend.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use vvm_core::Instant;

/// The process-wide zero: a reading of the monotonic clock and the gap between the boot and
/// monotonic clocks at that moment.
struct Origin {
    at: std::time::Instant,
    gap_ns: u64,
}

fn origin_point() -> &'static Origin {
    static ORIGIN: OnceLock<Origin> = OnceLock::new();
    ORIGIN.get_or_init(|| {
        let now = std::time::Instant::now();
        // Shortly after boot the monotonic clock may not reach back an hour; take what it has.
        let at = [3600, 60, 1]
            .into_iter()
            .find_map(|secs| now.checked_sub(Duration::from_secs(secs)))
            .unwrap_or(now);
        Origin {
            at,
            gap_ns: boot_gap_ns(),
        }
    })
}

/// The zero of every [`Instant`] the runtime produces: somewhat before the runtime first needed
/// the time in this process.
///
/// The margin matters under paused time: a paused tokio clock starts from the operating system's
/// clock at the moment it was paused, which may be shortly before the first call here. Readings
/// before the origin would saturate to zero and no longer match the timers set from them.
pub fn origin() -> std::time::Instant {
    origin_point().at
}

/// `CLOCK_BOOTTIME − CLOCK_MONOTONIC` in nanoseconds: how long the host has been suspended since
/// it booted. Both clocks are read by the vDSO, without a system call.
#[cfg(target_os = "linux")]
fn boot_gap_ns() -> u64 {
    use rustix::time::{clock_gettime, ClockId};

    let ns = |t: rustix::time::Timespec| {
        let secs = u64::try_from(t.tv_sec).unwrap_or(0);
        let nanos = u64::try_from(t.tv_nsec).unwrap_or(0);
        secs.saturating_mul(1_000_000_000).saturating_add(nanos)
    };
    // Monotonic on both sides of the boot reading: their midpoint is the moment the boot clock
    // was read, so the gap carries no error from the time between the two reads.
    let before = ns(clock_gettime(ClockId::Monotonic));
    let boot = ns(clock_gettime(ClockId::Boottime));
    let after = ns(clock_gettime(ClockId::Monotonic));
    boot.saturating_sub(before / 2 + after / 2)
}

/// No boot clock to compare with: a suspend is not seen.
#[cfg(not(target_os = "linux"))]
fn boot_gap_ns() -> u64 {
    0
}

/// How long the host has spent suspended since the [`origin`]: what must be added to a reading
/// of the monotonic clock to get the boot clock.
pub trait SuspendSource: Send + Sync + 'static {
    /// Time spent suspended since the origin. Never decreases.
    fn suspended(&self) -> Duration;
}

/// The host's suspended time since the [`origin`], read live from `CLOCK_BOOTTIME` and
/// `CLOCK_MONOTONIC` on Linux; always zero elsewhere.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct HostSuspend;

impl SuspendSource for HostSuspend {
    fn suspended(&self) -> Duration {
        // The kernel adjusts the two clocks separately; a few nanoseconds of jitter in their
        // difference must not make `now` step back, so only the largest value seen counts.
        static SEEN_NS: AtomicU64 = AtomicU64::new(0);
        let grown_ns = boot_gap_ns().saturating_sub(origin_point().gap_ns);
        let seen_ns = SEEN_NS.fetch_max(grown_ns, Ordering::Relaxed).max(grown_ns);
        Duration::from_nanos(seen_ns)
    }
}

/// A suspended time that a test sets: models a host suspend without suspending the host.
/// Clones share the value.
#[derive(Clone, Debug, Default)]
pub struct ManualSuspend {
    ns: Arc<AtomicU64>,
}

impl ManualSuspend {
    /// No suspend yet.
    pub fn new() -> Self {
        ManualSuspend::default()
    }

    /// Adds `by` to the suspended time, as a suspend of that length would.
    pub fn suspend(&self, by: Duration) {
        let by_ns = u64::try_from(by.as_nanos()).unwrap_or(u64::MAX);
        let _ = self
            .ns
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |ns| {
                Some(ns.saturating_add(by_ns))
            });
    }
}

impl SuspendSource for ManualSuspend {
    fn suspended(&self) -> Duration {
        Duration::from_nanos(self.ns.load(Ordering::SeqCst))
    }
}

/// Converts a reading of the operating system's monotonic clock into a core [`Instant`],
/// without any suspended time: for differences between two readings.
pub fn instant_from_std(at: std::time::Instant) -> Instant {
    from_elapsed(at.saturating_duration_since(origin()))
}

/// The boot-clock [`Instant`] of a monotonic reading `at` taken now: `at` since the origin plus
/// what `suspend` says the host spent suspended. The killer thread's clock.
pub fn boot_instant(at: std::time::Instant, suspend: &dyn SuspendSource) -> Instant {
    instant_from_std(at).saturating_add(suspend.suspended())
}

fn from_elapsed(elapsed: Duration) -> Instant {
    Instant::ZERO.saturating_add(elapsed)
}

/// Anything that tells the current [`Instant`]. Stores that judge expiry themselves (the memory
/// store) take one, so that tests can share a single notion of time between drivers and stores.
pub trait TimeSource: Send + Sync + 'static {
    /// The present.
    fn now(&self) -> Instant;
}

/// The runtime's clock: tokio's clock measured from [`origin`], plus the time the host spent
/// suspended since then ([`HostSuspend`]) — `CLOCK_BOOTTIME` on Linux.
///
/// Under `tokio::time::pause()` it stands still until the test advances it (or the host
/// suspends); outside a tokio runtime it reads the operating system's clocks.
///
/// ```
/// use vvm_runtime::{Clock, TimeSource};
///
/// let clock = Clock;
/// let a = clock.now();
/// let b = clock.now();
/// assert!(b >= a);
/// ```
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Clock;

impl Clock {
    /// The tokio instant at which a core [`Instant`] falls, for sleeping until it.
    ///
    /// Tokio's timers run on the monotonic clock, so the suspended time known now is taken off.
    /// A later suspend makes such a timer fire late in core time: whoever wakes must read
    /// [`now`](TimeSource::now) again rather than assume the deadline is exactly here.
    pub fn to_tokio(self, at: Instant) -> tokio::time::Instant {
        let origin = tokio::time::Instant::from_std(origin());
        let offset = Duration::from_nanos(at.as_nanos()).saturating_sub(HostSuspend.suspended());
        // A deadline too far away to represent is as good as never; a day past the present
        // keeps the timer valid and is re-armed long before it matters.
        origin
            .checked_add(offset)
            .unwrap_or_else(|| tokio::time::Instant::now() + Duration::from_secs(24 * 60 * 60))
    }
}

impl TimeSource for Clock {
    fn now(&self) -> Instant {
        let origin = tokio::time::Instant::from_std(origin());
        from_elapsed(tokio::time::Instant::now().saturating_duration_since(origin))
            .saturating_add(HostSuspend.suspended())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // covers: Rt.Clock
    #[tokio::test(start_paused = true)]
    async fn paused_time_moves_only_when_advanced() {
        let before = Clock.now();
        tokio::time::advance(Duration::from_secs(3)).await;
        let after = Clock.now();
        assert_eq!(after.saturating_since(before), Duration::from_secs(3));
    }

    /// Most jitter the gap between the boot and monotonic clocks shows between two reads.
    const SUSPEND_JITTER_MAX: Duration = Duration::from_millis(1);

    #[test]
    fn conversion_round_trips_through_tokio_instants() {
        let at = Instant::from_nanos(5_000_000_000);
        let suspended = HostSuspend.suspended();
        let tokio_at = Clock.to_tokio(at);
        let back = tokio_at.saturating_duration_since(tokio::time::Instant::from_std(origin()));
        // `to_tokio` reads the suspended time again. The kernel steps `CLOCK_BOOTTIME` and
        // `CLOCK_MONOTONIC` separately, so two reads of their gap differ by tens of microseconds
        // on some hosts (48 µs seen) even without a suspend: the round trip holds to within that
        // jitter, far below any suspend that matters to a lease.
        let error = (back + suspended).abs_diff(Duration::from_secs(5));
        assert!(
            error < SUSPEND_JITTER_MAX,
            "the round trip is off by {error:?}: {back:?} + {suspended:?} suspended"
        );
    }

    // covers: Rt.OneClock
    #[test]
    fn a_modelled_suspend_moves_the_boot_instant_by_its_length() {
        let suspend = ManualSuspend::new();
        let at = std::time::Instant::now();
        let before = boot_instant(at, &suspend);
        suspend.suspend(Duration::from_secs(3));
        assert_eq!(
            boot_instant(at, &suspend).saturating_since(before),
            Duration::from_secs(3)
        );
    }

    // covers: Rt.OneClock
    #[cfg(target_os = "linux")]
    #[test]
    fn the_runtime_clock_is_the_boot_clock_from_the_origin() {
        use rustix::time::{clock_gettime, ClockId};

        let boot_ns =
            |t: rustix::time::Timespec| t.tv_sec as i128 * 1_000_000_000 + t.tv_nsec as i128;
        // Both readings of each pair are taken back to back: their differences agree to well
        // under a millisecond whatever the host did since the origin.
        let boot_a = boot_ns(clock_gettime(ClockId::Boottime));
        let now_a = Clock.now().as_nanos() as i128;
        std::thread::sleep(Duration::from_millis(20));
        let boot_b = boot_ns(clock_gettime(ClockId::Boottime));
        let now_b = Clock.now().as_nanos() as i128;
        let drift_ns = ((now_b - now_a) - (boot_b - boot_a)).abs();
        assert!(
            drift_ns < 5_000_000,
            "runtime clock and CLOCK_BOOTTIME differ by {drift_ns} ns"
        );
        assert!(HostSuspend.suspended() <= HostSuspend.suspended());
    }
}
