//! Readings of a process clock that runs at a fixed rate of true time, for the model checks:
//! both start at 0, and a rate is in parts per million of true time.

/// The local reading at true time `true_ns` of a clock running at `rate_ppm`.
pub fn local(rate_ppm: u64, true_ns: u64) -> u64 {
    (u128::from(true_ns) * u128::from(rate_ppm) / 1_000_000) as u64
}

/// The first true instant at which a clock running at `rate_ppm` reads `local_ns`.
pub fn true_at(rate_ppm: u64, local_ns: u64) -> u64 {
    (u128::from(local_ns) * 1_000_000).div_ceil(u128::from(rate_ppm)) as u64
}
