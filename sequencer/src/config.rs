//! How the sequencer's tasks treat storage: timeouts, retries and backoff.

use std::time::Duration;

/// Largest timeout or backoff accepted, in milliseconds (10 minutes).
pub const SEQ_DURATION_MAX_MS: u64 = 600_000;
/// Most retries accepted per storage step.
pub const SEQ_RETRIES_LIMIT: u32 = 100;
/// Most PLog events one replay call may feed before the actualizer starts a fresh call (each
/// call then has a bounded amount of work to do within its timeout).
pub const REPLAY_PAGE_EVENTS_MAX: usize = 1_000_000;

/// A [`SeqConfig`] that cannot work.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum SeqConfigError {
    /// A duration is zero.
    #[error("{what} must be at least 1 ms")]
    Zero {
        /// Which setting.
        what: &'static str,
    },
    /// A value is above its limit.
    #[error("{what} is {value}, more than the supported {max}")]
    TooLarge {
        /// Which setting.
        what: &'static str,
        /// The value.
        value: u64,
        /// The limit.
        max: u64,
    },
    /// A call timeout is not longer than the storage's own wait for a lock (see
    /// [`SeqStorage::lock_wait_ms`](super::SeqStorage::lock_wait_ms)).
    #[error(
        "{what} ({timeout_ms} ms) must be longer than the storage's lock wait ({lock_wait_ms} ms)"
    )]
    TimeoutBelowLockWait {
        /// Which setting.
        what: &'static str,
        /// The timeout.
        timeout_ms: u64,
        /// How long one storage call may wait for a lock by itself.
        lock_wait_ms: u64,
    },
    /// The first backoff is longer than the longest.
    #[error("backoff_initial_ms ({initial}) is above backoff_max_ms ({max})")]
    Backoff {
        /// The first backoff.
        initial: u64,
        /// The longest backoff.
        max: u64,
    },
}

/// Timeouts, retries and backoff of the flusher and the actualizer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SeqConfig {
    /// Timeout of one read or write call.
    pub call_timeout_ms: u64,
    /// Timeout of one replay call (at most [`replay_page_events`](Self::replay_page_events)
    /// events).
    pub replay_call_timeout_ms: u64,
    /// Events per replay call.
    pub replay_page_events: usize,
    /// Retries of one failed step (a batch write, the offset read, a replay call) before the
    /// task gives the step up: the flusher until the next flush or refused `start`, the
    /// actualizer until the next `start`.
    pub retries_max: u32,
    /// Longest wait before the first retry; doubles per retry. Each wait is a random point
    /// between half of this ceiling and all of it (see [`backoff`](Self::backoff)).
    pub backoff_initial_ms: u64,
    /// Longest wait between retries: the ceiling stops doubling here.
    pub backoff_max_ms: u64,
    /// How long `shutdown` may take: stopping the tasks, then a last flush.
    pub shutdown_timeout_ms: u64,
}

impl Default for SeqConfig {
    fn default() -> Self {
        SeqConfig {
            call_timeout_ms: 5_000,
            replay_call_timeout_ms: 60_000,
            replay_page_events: 10_000,
            retries_max: 5,
            backoff_initial_ms: 10,
            backoff_max_ms: 1_000,
            shutdown_timeout_ms: 2_000,
        }
    }
}

fn in_range(what: &'static str, value: u64, max: u64) -> Result<(), SeqConfigError> {
    if value == 0 {
        return Err(SeqConfigError::Zero { what });
    }
    if value > max {
        return Err(SeqConfigError::TooLarge { what, value, max });
    }
    Ok(())
}

impl SeqConfig {
    /// Checks every value against its limit.
    pub fn validate(&self) -> Result<(), SeqConfigError> {
        in_range("call_timeout_ms", self.call_timeout_ms, SEQ_DURATION_MAX_MS)?;
        in_range(
            "replay_call_timeout_ms",
            self.replay_call_timeout_ms,
            SEQ_DURATION_MAX_MS,
        )?;
        in_range(
            "replay_page_events",
            self.replay_page_events as u64,
            REPLAY_PAGE_EVENTS_MAX as u64,
        )?;
        in_range(
            "backoff_initial_ms",
            self.backoff_initial_ms,
            SEQ_DURATION_MAX_MS,
        )?;
        in_range("backoff_max_ms", self.backoff_max_ms, SEQ_DURATION_MAX_MS)?;
        in_range(
            "shutdown_timeout_ms",
            self.shutdown_timeout_ms,
            SEQ_DURATION_MAX_MS,
        )?;
        if u64::from(self.retries_max) > u64::from(SEQ_RETRIES_LIMIT) {
            return Err(SeqConfigError::TooLarge {
                what: "retries_max",
                value: u64::from(self.retries_max),
                max: u64::from(SEQ_RETRIES_LIMIT),
            });
        }
        if self.backoff_initial_ms > self.backoff_max_ms {
            return Err(SeqConfigError::Backoff {
                initial: self.backoff_initial_ms,
                max: self.backoff_max_ms,
            });
        }
        Ok(())
    }

    /// Checks every value against its limit (as [`validate`](Self::validate)) and the call
    /// timeouts against the storage's own lock wait
    /// ([`SeqStorage::lock_wait_ms`](super::SeqStorage::lock_wait_ms)): each must be longer, so
    /// that a call waiting for a lock fails by itself before the sequencer gives up on it.
    pub fn validate_for(&self, lock_wait_ms: u64) -> Result<(), SeqConfigError> {
        self.validate()?;
        for (what, timeout_ms) in [
            ("call_timeout_ms", self.call_timeout_ms),
            ("replay_call_timeout_ms", self.replay_call_timeout_ms),
        ] {
            if timeout_ms <= lock_wait_ms {
                return Err(SeqConfigError::TimeoutBelowLockWait {
                    what,
                    timeout_ms,
                    lock_wait_ms,
                });
            }
        }
        Ok(())
    }

    /// The longest wait before retry number `retry` (0-based): `backoff_initial_ms` doubled per
    /// retry, capped at `backoff_max_ms`.
    pub fn backoff_ceiling(&self, retry: u32) -> Duration {
        let factor = 1u64.checked_shl(retry.min(32)).unwrap_or(u64::MAX);
        Duration::from_millis(
            self.backoff_initial_ms
                .saturating_mul(factor)
                .min(self.backoff_max_ms),
        )
    }

    /// The waits before retries 0, 1, 2, …: each a random point between half of
    /// [`backoff_ceiling`](Self::backoff_ceiling) and all of it (equal jitter), so never above
    /// `backoff_max_ms`. Endless: the caller counts retries against `retries_max`.
    ///
    /// Why random, when the core's lease retries are not: those are inputs of the pure
    /// machines, replayed exactly by the model checks and simulations, and the kill deadline is
    /// computed from the same values; nothing of that holds here. The sequencer's retries are
    /// runtime sleeps that no deadline or replay depends on, and many sequencers (one per
    /// leader, on every host) share one storage: an outage fails all of them at once, and
    /// identical doubling schedules would bring their retries back in waves at the same
    /// instants. The random half spreads them ([`jittered_backoff`](vvm_runtime::jittered_backoff)).
    pub fn backoff(&self) -> impl Iterator<Item = Duration> + Send + use<> {
        vvm_runtime::jittered_backoff(
            Duration::from_millis(self.backoff_initial_ms),
            Duration::from_millis(self.backoff_max_ms),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // covers: Seq.ConfigValid
    #[test]
    fn bad_configs_are_refused_and_backoff_doubles_up_to_its_cap() {
        assert_eq!(SeqConfig::default().validate(), Ok(()));
        let bad = [
            SeqConfig {
                call_timeout_ms: 0,
                ..SeqConfig::default()
            },
            SeqConfig {
                retries_max: SEQ_RETRIES_LIMIT + 1,
                ..SeqConfig::default()
            },
            SeqConfig {
                backoff_initial_ms: 50,
                backoff_max_ms: 10,
                ..SeqConfig::default()
            },
            SeqConfig {
                shutdown_timeout_ms: SEQ_DURATION_MAX_MS + 1,
                ..SeqConfig::default()
            },
            SeqConfig {
                replay_page_events: 0,
                ..SeqConfig::default()
            },
        ];
        for c in bad {
            assert!(c.validate().is_err(), "{c:?}");
        }
        let c = SeqConfig::default();
        assert_eq!(c.backoff_ceiling(0), Duration::from_millis(10));
        assert_eq!(c.backoff_ceiling(3), Duration::from_millis(80));
        assert_eq!(c.backoff_ceiling(40), Duration::from_millis(1_000));
    }

    // covers: Seq.TimeoutsValid
    #[test]
    fn call_timeouts_must_outlast_the_storage_lock_wait() {
        let c = SeqConfig {
            call_timeout_ms: 100,
            replay_call_timeout_ms: 1_000,
            ..SeqConfig::default()
        };
        assert_eq!(c.validate_for(0), Ok(()));
        assert_eq!(c.validate_for(99), Ok(()));
        assert_eq!(
            c.validate_for(100),
            Err(SeqConfigError::TimeoutBelowLockWait {
                what: "call_timeout_ms",
                timeout_ms: 100,
                lock_wait_ms: 100
            })
        );
        let c = SeqConfig {
            call_timeout_ms: 2_000,
            ..c
        };
        assert_eq!(
            c.validate_for(1_000),
            Err(SeqConfigError::TimeoutBelowLockWait {
                what: "replay_call_timeout_ms",
                timeout_ms: 1_000,
                lock_wait_ms: 1_000
            })
        );
        let bad_alone = SeqConfig {
            call_timeout_ms: 0,
            ..c
        };
        assert!(matches!(
            bad_alone.validate_for(0),
            Err(SeqConfigError::Zero { .. })
        ));
    }

    // covers: Seq.ConfigValid
    #[test]
    fn the_backoff_follows_the_configured_ceilings() {
        let c = SeqConfig::default();
        for (retry, pause) in c.backoff().take(12).enumerate() {
            let ceiling = c.backoff_ceiling(u32::try_from(retry).unwrap());
            assert!(
                ceiling / 2 <= pause && pause <= ceiling,
                "{retry}: {pause:?} of {ceiling:?}"
            );
        }
    }
}
