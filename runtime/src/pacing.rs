//! How soon a candidate tries again after a round in which the store failed.
//!
//! The lifecycle machine waits one round interval after a round that learnt nothing (V4), and
//! the change feed may start a round sooner. While the store fails neither is a good guide: a
//! feed that cannot tell what happened (a watch refused for want of permission, a cluster that is
//! down) resolves after a short pause, and each resolution would start another round — another
//! try, another failure — far more often than the round interval. So after a round in which a
//! store call failed, the driver:
//!
//! - stretches the wait before the next round to a pause of [`jittered_backoff`] whose first
//!   ceiling is twice the round interval (so no pause is shorter than the round) and whose
//!   ceiling doubles up to [`FAILING_PAUSE_ROUNDS_MAX`] rounds; an expiry learnt in that round,
//!   or the end of the acquisition, keeps its own earlier time;
//! - stops watching the feed until a round passes without a failure (nothing a failing store's
//!   feed says is worth a try).
//!
//! A round without a failure, or a slot won, ends the streak: waits and the feed are as before.
//! None of it decides who holds a slot; it only spaces the tries.

use std::time::Duration;

use vvm_core::{Effect, Instant, Refusal, TimerKind};

use crate::backoff::jittered_backoff;

/// The longest pause between two rounds of a failing store, in round intervals.
pub const FAILING_PAUSE_ROUNDS_MAX: u32 = 8;

/// The pauses of one streak of failing rounds.
type Pauses = Box<dyn Iterator<Item = Duration> + Send>;

/// The pacing state of one candidate (see the module documentation).
pub(crate) struct Pacing {
    round_interval: Duration,
    /// The end of the acquisition: no wait is stretched past it.
    until: Instant,
    /// A store call of the current round failed.
    failed: bool,
    /// The pauses of the current streak of failing rounds; `None` while the store answers.
    streak: Option<Pauses>,
}

impl Pacing {
    /// Pacing for rounds of `round_interval`, in an acquisition that ends at `until`.
    pub(crate) fn new(round_interval: Duration, until: Instant) -> Self {
        Pacing {
            round_interval,
            until,
            failed: false,
            streak: None,
        }
    }

    /// Whether the last round ended with a failed store call: the feed is not watched then.
    pub(crate) fn failing(&self) -> bool {
        self.streak.is_some()
    }

    /// Notes what one transition of the machine says, at `now`, and returns the time its round
    /// timer must fire at instead, if it sets one that must wait longer.
    pub(crate) fn note(&mut self, now: Instant, effects: &[Effect]) -> Option<Instant> {
        let mut stretched = None;
        for effect in effects {
            match *effect {
                Effect::NotAcquired {
                    refusal: Refusal::StoreFailed,
                    ..
                } => self.failed = true,
                Effect::Acquired { .. } => {
                    self.failed = false;
                    self.streak = None;
                }
                Effect::SetTimer { timer, at } if timer.kind == TimerKind::Round => {
                    stretched = self.round_ended(now, at);
                }
                _ => {}
            }
        }
        stretched
    }

    /// A round ended at `now` with its next one set for `at`: the time to use instead, if later.
    fn round_ended(&mut self, now: Instant, at: Instant) -> Option<Instant> {
        if !std::mem::take(&mut self.failed) {
            if self.streak.take().is_some() {
                tracing::debug!("a round passed without a store failure; backoff ended");
            }
            return None;
        }
        let round = self.round_interval;
        let max = round.saturating_mul(FAILING_PAUSE_ROUNDS_MAX);
        let pauses = self
            .streak
            .get_or_insert_with(|| Box::new(jittered_backoff(round.saturating_mul(2), max)));
        let pause = pauses.next().unwrap_or(max);
        // Earlier than a blind round: an expiry learnt in this round, or the acquisition's end.
        if at < now.saturating_add(round) {
            return None;
        }
        let later = now.saturating_add(pause).min(self.until);
        tracing::debug!(
            pause_ms = u64::try_from(pause.as_millis()).unwrap_or(u64::MAX),
            "the store failed in this round; the next one waits"
        );
        (later > at).then_some(later)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use vvm_core::{Slot, TimerId};

    const ROUND: Duration = Duration::from_millis(100);

    fn failed_round(pacing: &mut Pacing, now: Instant) -> Instant {
        let at = now + ROUND;
        let effects = [
            Effect::NotAcquired {
                slot: Slot(1),
                refusal: Refusal::StoreFailed,
            },
            Effect::SetTimer {
                timer: TimerId {
                    kind: TimerKind::Round,
                    seq: 1,
                },
                at,
            },
        ];
        pacing.note(now, &effects).unwrap_or(at)
    }

    // covers: VVM.FailingStoreBackoff
    #[test]
    fn failing_rounds_wait_at_least_a_round_growing_to_a_bound_with_jitter() {
        let mut seen = Vec::new();
        for _ in 0..20 {
            let mut pacing = Pacing::new(ROUND, Instant::from_nanos(u64::MAX));
            let mut now = Instant::from_nanos(1_000);
            let mut waits = Vec::new();
            for _ in 0..10 {
                let next = failed_round(&mut pacing, now);
                waits.push(next.saturating_since(now));
                now = next;
                assert!(pacing.failing());
            }
            for (retry, wait) in waits.iter().enumerate() {
                let ceiling =
                    (ROUND * 2 * (1u32 << retry.min(10))).min(ROUND * FAILING_PAUSE_ROUNDS_MAX);
                assert!(
                    ROUND <= *wait && ceiling / 2 <= *wait && *wait <= ceiling,
                    "retry {retry}: waited {wait:?}"
                );
            }
            seen.push(waits);
        }
        assert!(seen.iter().any(|waits| *waits != seen[0]), "no jitter");
        // A round without a failure ends the streak: its timer is left alone.
        let mut pacing = Pacing::new(ROUND, Instant::from_nanos(u64::MAX));
        failed_round(&mut pacing, Instant::ZERO);
        let timer = Effect::SetTimer {
            timer: TimerId {
                kind: TimerKind::Round,
                seq: 2,
            },
            at: Instant::ZERO + ROUND,
        };
        assert_eq!(pacing.note(Instant::ZERO, &[timer]), None);
        assert!(!pacing.failing());
    }

    // covers: VVM.FailingStoreBackoff
    #[test]
    fn an_earlier_expiry_or_the_end_of_acquisition_is_kept() {
        let until = Instant::ZERO + ROUND * 3;
        let mut pacing = Pacing::new(ROUND, until);
        failed_round(&mut pacing, Instant::ZERO);
        let now = Instant::ZERO + ROUND * 2;
        // The acquisition ends before the pause would: it ends on time.
        assert!(failed_round(&mut pacing, now) <= until);
        // A round that learnt an expiry sooner than a round keeps it.
        let mut pacing = Pacing::new(ROUND, Instant::from_nanos(u64::MAX));
        let expiry = Instant::ZERO + ROUND / 2;
        let effects = [
            Effect::NotAcquired {
                slot: Slot(1),
                refusal: Refusal::StoreFailed,
            },
            Effect::SetTimer {
                timer: TimerId {
                    kind: TimerKind::Round,
                    seq: 1,
                },
                at: expiry,
            },
        ];
        assert_eq!(pacing.note(Instant::ZERO, &effects), None);
    }
}
