//! Where the runtime's `now` comes from.
//!
//! The core only ever sees [`Instant`]s: nanoseconds since an origin. The runtime fixes that
//! origin once per process ([`origin`]) and reads the present from tokio's clock, so that tests
//! can freeze and advance time with `tokio::time::pause()` / `advance()` and every driver, timer
//! and memory store of the test moves together. In production tokio's clock is the operating
//! system's monotonic clock, the same one the killer thread reads (see [`crate::killer`]).

use std::sync::OnceLock;
use std::time::Duration;

use vvm_core::Instant;

/// The zero of every [`Instant`] the runtime produces: somewhat before the runtime first needed
/// the time in this process.
///
/// The margin matters under paused time: a paused tokio clock starts from the operating system's
/// clock at the moment it was paused, which may be shortly before the first call here. Readings
/// before the origin would saturate to zero and no longer match the timers set from them.
pub fn origin() -> std::time::Instant {
    static ORIGIN: OnceLock<std::time::Instant> = OnceLock::new();
    *ORIGIN.get_or_init(|| {
        let now = std::time::Instant::now();
        // Shortly after boot the monotonic clock may not reach back an hour; take what it has.
        [3600, 60, 1]
            .into_iter()
            .find_map(|secs| now.checked_sub(Duration::from_secs(secs)))
            .unwrap_or(now)
    })
}

/// Converts a reading of the operating system's monotonic clock into a core [`Instant`].
pub fn instant_from_std(at: std::time::Instant) -> Instant {
    from_elapsed(at.saturating_duration_since(origin()))
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

/// The runtime's clock: tokio's clock measured from [`origin`].
///
/// Under `tokio::time::pause()` it stands still until the test advances it; outside a tokio
/// runtime it reads the operating system's monotonic clock.
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
    pub fn to_tokio(self, at: Instant) -> tokio::time::Instant {
        let origin = tokio::time::Instant::from_std(origin());
        let offset = Duration::from_nanos(at.as_nanos());
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

    #[test]
    fn conversion_round_trips_through_tokio_instants() {
        let at = Instant::from_nanos(5_000_000_000);
        let tokio_at = Clock.to_tokio(at);
        let back = tokio_at.saturating_duration_since(tokio::time::Instant::from_std(origin()));
        assert_eq!(back, Duration::from_secs(5));
    }
}
