//! Waiting for the write lock: short polls, bounded in time and in count.
//!
//! SQLite's own busy handler sleeps 1, 2, 5, 10 … 100 ms between attempts: once a few attempts
//! have failed, the waiter sleeps through many free moments of the lock, and a lease renewal may
//! wait longer than its call may take. The store installs no handler; on `SQLITE_BUSY` it tries
//! again after at most [`POLL_MAX`], so it takes the lock soon after an ordinary writer releases
//! it. No polling wins against a writer that commits back to back without pause (there the lock
//! is free for a microsecond at a time); the bound turns that into
//! [`StoreError::Failed`](vvm_runtime::StoreError) — nothing was written — and the runtime's
//! retry takes over instead of a call hanging.

use std::time::{Duration, Instant};

use rusqlite::ErrorCode;

/// The first pause after `SQLITE_BUSY`.
pub const POLL_MIN: Duration = Duration::from_micros(100);

/// The longest pause between two attempts.
pub const POLL_MAX: Duration = Duration::from_millis(1);

/// Most attempts, whatever the wait allows (`busy_wait / POLL_MIN` at most, and this).
pub const ATTEMPTS_MAX: u32 = 10_000;

/// Whether `error` says another connection holds a lock we need.
pub(crate) fn is_busy(error: &rusqlite::Error) -> bool {
    matches!(
        error.sqlite_error_code(),
        Some(ErrorCode::DatabaseBusy | ErrorCode::DatabaseLocked)
    )
}

/// The pauses of one operation.
#[derive(Debug)]
pub(crate) struct Backoff {
    deadline: Instant,
    pause: Duration,
    attempts: u32,
}

impl Backoff {
    /// Allows retries for `busy_wait` from now.
    pub(crate) fn new(busy_wait: Duration) -> Self {
        Backoff {
            deadline: Instant::now() + busy_wait,
            pause: POLL_MIN,
            attempts: 0,
        }
    }

    /// Sleeps before the next attempt and returns `true`, or returns `false` when the wait or
    /// the attempts are spent.
    pub(crate) fn wait(&mut self) -> bool {
        let left = self.deadline.saturating_duration_since(Instant::now());
        if left.is_zero() || self.attempts >= ATTEMPTS_MAX {
            return false;
        }
        self.attempts += 1;
        std::thread::sleep(self.pause.min(left));
        self.pause = (self.pause * 2).min(POLL_MAX);
        true
    }

    /// How many times [`wait`](Self::wait) slept.
    pub(crate) fn attempts(&self) -> u32 {
        self.attempts
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // covers: Sq.Busy
    #[test]
    fn a_zero_wait_allows_no_retry() {
        let mut backoff = Backoff::new(Duration::ZERO);
        assert!(!backoff.wait());
        assert_eq!(backoff.attempts(), 0);
    }

    // covers: Sq.Busy
    #[test]
    fn the_wait_ends() {
        let mut backoff = Backoff::new(Duration::from_millis(5));
        let mut attempts = 0;
        while backoff.wait() {
            attempts += 1;
            assert!(attempts <= ATTEMPTS_MAX);
        }
        assert!(attempts >= 1);
        assert!(!backoff.wait(), "a spent wait stays spent");
    }
}
