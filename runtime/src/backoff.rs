//! Pauses between retries outside the core's machines, with jitter.
//!
//! The core's renewal retries are pure functions of the lease, without jitter: the kill deadline
//! is computed from them and the model checks and simulations replay them exactly (see the
//! crate `vvm_core`). Retries that no deadline or replay depends on — the sequencer's storage
//! calls, a transactional store's conflicting attempts — are better spread: many processes
//! failing at one moment would otherwise retry in waves at the same instants.

use std::time::Duration;

use backon::{BackoffBuilder, ExponentialBuilder};

/// The pauses before retries 0, 1, 2, …: each a random point between half of its ceiling and
/// the ceiling ("equal jitter"), where the ceiling starts at `first` and doubles up to `max`.
/// Never above `max`; endless (the caller counts its retries).
///
/// It is `backon`'s exponential backoff over half the ceiling, whose jitter adds up to as much
/// again.
///
/// ```
/// use std::time::Duration;
///
/// let ms = Duration::from_millis;
/// let pauses: Vec<Duration> = vvm_runtime::jittered_backoff(ms(10), ms(40)).take(4).collect();
/// for (pause, ceiling) in pauses.iter().zip([ms(10), ms(20), ms(40), ms(40)]) {
///     assert!(ceiling / 2 <= *pause && *pause <= ceiling);
/// }
/// ```
pub fn jittered_backoff(first: Duration, max: Duration) -> impl Iterator<Item = Duration> + Send {
    let first = first.min(max);
    ExponentialBuilder::new()
        .with_min_delay(first / 2)
        .with_max_delay(max / 2)
        .with_factor(2.0)
        .with_jitter()
        .without_max_times()
        .build()
        // Endless as built; should it ever end, the longest pause stays.
        .chain(std::iter::repeat(max))
        .enumerate()
        // backon computes in `f32`: a pause may miss its bounds by a rounding error, which the
        // exact ceiling takes back.
        .map(move |(retry, pause)| {
            let ceiling = ceiling(first, max, retry);
            pause.clamp(ceiling / 2, ceiling)
        })
}

/// The ceiling of retry `retry`: `first` doubled per retry, at most `max`.
fn ceiling(first: Duration, max: Duration, retry: usize) -> Duration {
    let doublings = u32::try_from(retry.min(31)).unwrap_or(31);
    first.saturating_mul(1 << doublings).min(max)
}

#[cfg(test)]
mod tests {
    use super::*;

    // covers: Seq.ConfigValid, Tx.Retry
    #[test]
    fn pauses_lie_between_half_their_ceiling_and_the_ceiling_and_vary() {
        let ms = Duration::from_millis;
        for (first, max) in [
            (ms(10), ms(1_000)),
            (ms(1), ms(1)),
            (ms(2), ms(100)),
            (ms(7), ms(600_000)),
        ] {
            let schedules: Vec<Vec<Duration>> = (0..50)
                .map(|_| jittered_backoff(first, max).take(40).collect())
                .collect();
            for retry in 0..40 {
                let ceiling = first.saturating_mul(1 << retry.min(31)).min(max);
                let pauses: Vec<Duration> = schedules.iter().map(|s| s[retry]).collect();
                for pause in &pauses {
                    assert!(
                        ceiling / 2 <= *pause && *pause <= ceiling,
                        "{first:?}..{max:?} retry {retry}: {pause:?} of {ceiling:?}"
                    );
                }
                // 50 schedules alike at one retry means no jitter.
                assert!(
                    pauses.iter().any(|pause| *pause != pauses[0]),
                    "{first:?}..{max:?} retry {retry}: every pause is {:?}",
                    pauses[0]
                );
            }
        }
    }
}
