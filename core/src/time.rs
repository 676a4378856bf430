//! Time as an input: a monotonic instant that the core never reads itself.
//!
//! The runtime reads its clock and hands the reading to the machines inside every event, so the
//! same sequence of events always produces the same effects. That is what makes the machines
//! testable with exact expectations, model-checkable and replayable in simulation.

use core::ops::Add;
use core::time::Duration;

/// A point on a monotonic clock, in nanoseconds since an origin chosen by the runtime.
///
/// The origin is arbitrary (process start, boot, a simulation's zero); only differences matter.
/// Arithmetic saturates instead of overflowing: an instant near `u64::MAX` nanoseconds (584 years)
/// is a bug in the caller, but it must not turn into a deadline in the past.
///
/// ```
/// use core::time::Duration;
/// use vvm_core::Instant;
///
/// let t = Instant::from_nanos(1_000);
/// assert_eq!((t + Duration::from_nanos(500)).as_nanos(), 1_500);
/// assert_eq!(t.saturating_since(Instant::from_nanos(4_000)), Duration::ZERO);
/// ```
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Instant(u64);

impl Instant {
    /// The origin of the clock.
    pub const ZERO: Instant = Instant(0);
    /// The latest representable instant; also what saturated arithmetic ends at.
    pub const MAX: Instant = Instant(u64::MAX);

    /// An instant `nanos` nanoseconds after the origin.
    #[inline]
    pub const fn from_nanos(nanos: u64) -> Self {
        Instant(nanos)
    }

    /// Nanoseconds since the origin.
    #[inline]
    pub const fn as_nanos(self) -> u64 {
        self.0
    }

    /// `self + duration`, or [`Instant::MAX`] when that does not fit.
    #[inline]
    pub const fn saturating_add(self, duration: Duration) -> Self {
        // Seconds and sub-second nanoseconds separately: no 128-bit arithmetic on the hot path.
        let add_ns = duration
            .as_secs()
            .saturating_mul(1_000_000_000)
            .saturating_add(duration.subsec_nanos() as u64);
        Instant(self.0.saturating_add(add_ns))
    }

    /// `self + nanos` nanoseconds, or [`Instant::MAX`] when that does not fit.
    #[inline]
    pub const fn saturating_add_nanos(self, nanos: u64) -> Self {
        Instant(self.0.saturating_add(nanos))
    }

    /// How long after `earlier` this instant is; zero when `earlier` is later.
    #[inline]
    pub const fn saturating_since(self, earlier: Instant) -> Duration {
        Duration::from_nanos(self.0.saturating_sub(earlier.0))
    }
}

impl Add<Duration> for Instant {
    type Output = Instant;

    #[inline]
    fn add(self, rhs: Duration) -> Instant {
        self.saturating_add(rhs)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn addition_saturates_instead_of_wrapping() {
        let near_end = Instant::from_nanos(u64::MAX - 1);
        assert_eq!(near_end + Duration::from_secs(1), Instant::MAX);
        assert_eq!(Instant::ZERO + Duration::MAX, Instant::MAX);
    }

    #[test]
    fn since_is_zero_for_a_later_origin() {
        let a = Instant::from_nanos(10);
        let b = Instant::from_nanos(25);
        assert_eq!(b.saturating_since(a), Duration::from_nanos(15));
        assert_eq!(a.saturating_since(b), Duration::ZERO);
    }
}
