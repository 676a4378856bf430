//! A process's local monotonic clock, running at a rate that differs from true time.
//!
//! `local(t) = origin_local + (t − origin_true) · (1 + rate_ppm / 10⁶)`. The core only ever sees
//! local instants; the store and the oracle judge by true time. A rate error below 20 % keeps the
//! protocol safe; the simulator draws it within ±10 %.

/// Parts per million of a rate of one.
const PPM: u128 = 1_000_000;

/// A local clock: a linear function of true time.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LocalClock {
    origin_true_ns: u64,
    origin_local_ns: u64,
    /// Rate error in parts per million: `-100_000` runs 10 % slow.
    rate_ppm: i32,
}

impl LocalClock {
    /// A clock that reads `origin_local_ns` at true time `origin_true_ns` and then advances at
    /// `1 + rate_ppm/10⁶` local nanoseconds per true nanosecond.
    pub fn new(origin_true_ns: u64, origin_local_ns: u64, rate_ppm: i32) -> Self {
        assert!(
            rate_ppm.unsigned_abs() < 500_000,
            "rate error too large to model"
        );
        LocalClock {
            origin_true_ns,
            origin_local_ns,
            rate_ppm,
        }
    }

    fn rate(&self) -> u128 {
        (PPM as i128 + i128::from(self.rate_ppm)) as u128
    }

    /// The local reading at true time `true_ns` (never before the origin).
    pub fn local(&self, true_ns: u64) -> u64 {
        let elapsed = true_ns.saturating_sub(self.origin_true_ns);
        // In 64 bits while the product fits (runs of hours), which is exact and a fraction of
        // the cost of the 128-bit division: it is on every event of every process.
        let scaled = match elapsed.checked_mul(self.rate() as u64) {
            Some(product) => product / PPM as u64,
            None => (u128::from(elapsed) * self.rate() / PPM) as u64,
        };
        self.origin_local_ns + scaled
    }

    /// The earliest true time at which the local clock reads at least `local_ns`.
    pub fn true_at(&self, local_ns: u64) -> u64 {
        let ahead = local_ns.saturating_sub(self.origin_local_ns);
        let elapsed = match ahead.checked_mul(PPM as u64) {
            Some(product) => u128::from(product.div_ceil(self.rate() as u64)),
            None => (u128::from(ahead) * PPM).div_ceil(self.rate()),
        };
        let at = self.origin_true_ns + elapsed as u64;
        debug_assert!(self.local(at) >= local_ns || local_ns < self.origin_local_ns);
        at
    }

    /// The rate error in parts per million.
    pub fn rate_ppm(&self) -> i32 {
        self.rate_ppm
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn true_at_is_the_first_instant_reaching_a_reading() {
        for rate in [-100_000, -1, 0, 7, 100_000] {
            let clock = LocalClock::new(1_000, 5_000_000, rate);
            // The last two go past what 64-bit products hold: the 128-bit path.
            for local in [
                5_000_000,
                5_000_001,
                5_123_457,
                9_999_999_999,
                1 << 55,
                1 << 62,
            ] {
                let at = clock.true_at(local);
                assert!(clock.local(at) >= local);
                assert!(at == 1_000 || clock.local(at - 1) < local);
            }
        }
        let slow = LocalClock::new(0, 0, -100_000);
        assert_eq!(slow.local(1_000_000), 900_000);
        assert_eq!(slow.true_at(900_000), 1_000_000);
    }
}
