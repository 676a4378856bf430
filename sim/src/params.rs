//! What a simulated run looks like: how many VVMs and slots, the lease, how long, and how hard
//! the faults hit. [`Params::random`] draws a different mix for every seed.

use core::time::Duration;

use super::rng::Rng;

/// One nanosecond-based second.
pub const SECOND_NS: u64 = 1_000_000_000;

/// How often and how hard faults hit. Rates are per million draws; gaps are the mean true time
/// between two faults of a kind on one process (zero: never).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Faults {
    /// A store call fails and writes nothing.
    pub fail_ppm: u32,
    /// A store call's outcome is unknown and it wrote nothing.
    pub unknown_lost_ppm: u32,
    /// A store call's outcome is unknown but it wrote.
    pub unknown_committed_ppm: u32,
    /// A store call never answers (it may or may not have written); only the timeout ends it.
    pub hang_ppm: u32,
    /// A store call is slow: its latency is drawn up to `slow_latency_max_ns`.
    pub slow_ppm: u32,
    /// Latency bound of slow calls (at most `0.3·L`).
    pub slow_latency_max_ns: u64,
    /// Latency bound of ordinary calls.
    pub latency_max_ns: u64,
    /// Mean gap between process pauses.
    pub pause_gap_ns: u64,
    /// Longest pause (at most `3·L`).
    pub pause_max_ns: u64,
    /// A process pauses right after sending a store call (the pause that hurts most: the
    /// request is out, the reply waits, the clock runs on).
    pub pause_on_call_ppm: u32,
    /// Mean gap between crashes (SIGKILL, no release).
    pub crash_gap_ns: u64,
    /// Mean gap between graceful stops asked by the host.
    pub stop_gap_ns: u64,
    /// Mean gap between store outages (all calls fail or hang).
    pub outage_gap_ns: u64,
    /// Longest store outage.
    pub outage_max_ns: u64,
    /// Largest clock-rate error, parts per million (at most 100 000 = 10 %).
    pub skew_ppm_max: u32,
    /// A service fails to start or fails while running.
    pub service_fail_ppm: u32,
}

impl Faults {
    /// No faults at all, clocks exact.
    pub fn none() -> Self {
        Faults {
            fail_ppm: 0,
            unknown_lost_ppm: 0,
            unknown_committed_ppm: 0,
            hang_ppm: 0,
            slow_ppm: 0,
            slow_latency_max_ns: 0,
            latency_max_ns: 0,
            pause_gap_ns: 0,
            pause_max_ns: 0,
            pause_on_call_ppm: 0,
            crash_gap_ns: 0,
            stop_gap_ns: 0,
            outage_gap_ns: 0,
            outage_max_ns: 0,
            skew_ppm_max: 0,
            service_fail_ppm: 0,
        }
    }
}

/// The shape of one run.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Params {
    /// VVMs running at once (each restarts as a new incarnation after it ends).
    pub processes: u32,
    /// Slots `1..=slots`.
    pub slots: u32,
    /// The lease `L`.
    pub lease: Duration,
    /// Pause between acquisition rounds.
    pub round_interval: Duration,
    /// How long one launch keeps trying to acquire.
    pub acquisition: Duration,
    /// True time simulated.
    pub duration_ns: u64,
    /// Processes start at a random instant in `0..=start_spread_ns`.
    pub start_spread_ns: u64,
    /// Whether a process that ended (crash, kill, shutdown) is started again.
    pub restart: bool,
    /// Longest wait before a restart.
    pub restart_delay_max_ns: u64,
    /// Whether the host shuts a VVM down when it raises a problem (otherwise services keep
    /// running until the killer ends the process).
    pub shutdown_on_problem: bool,
    /// Longest wait of the host between a problem and its shutdown call.
    pub host_delay_max_ns: u64,
    /// Longest time services take to start or to stop.
    pub service_delay_max_ns: u64,
    /// The faults.
    pub faults: Faults,
    /// Whether the store knows a holder is dead (the SQLite lock, `~Sq.DeadHolder~`).
    pub dead_holder: DeadHolder,
}

/// What the store knows of a record's holder.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DeadHolder {
    /// Nothing: a live record is taken only at its expiry.
    Unknown,
    /// The kernel's fact: an insert over another holder's live record takes it at once when
    /// the writer incarnation's process is gone (crashed or killed, its services with it).
    Known,
    /// Unsound on purpose: also when the writer's leadership ended (lost or released) while its
    /// services may still be stopping — as if the lock were let go at the loss.
    FreedAtLoss,
}

impl Params {
    /// `processes` VVMs over `slots` slots with the default lease, no faults and no restarts:
    /// the base that scenarios change what they need on.
    pub fn calm(processes: u32, slots: u32) -> Self {
        let lease = vvm_core::LEASE_DEFAULT;
        Params {
            processes,
            slots,
            lease,
            round_interval: vvm_core::ROUND_INTERVAL_DEFAULT,
            acquisition: vvm_core::ACQUISITION_DEFAULT,
            duration_ns: 10 * lease.as_nanos() as u64,
            start_spread_ns: 0,
            restart: false,
            restart_delay_max_ns: lease.as_nanos() as u64 / 10,
            shutdown_on_problem: true,
            host_delay_max_ns: 0,
            service_delay_max_ns: 0,
            faults: Faults::none(),
            dead_holder: DeadHolder::Unknown,
        }
    }

    /// A run whose size, timing and fault mix are all drawn from `seed`: some seeds are calm,
    /// some are storms, most are in between.
    pub fn random(seed: u64) -> Self {
        let mut rng = Rng::new(seed ^ 0x5E_ED0F_F417_5A11);
        let lease_ns = rng.between(2, 30) * SECOND_NS;
        let l = lease_ns;
        let slots = rng.between(1, 3) as u32;
        // Mostly more VVMs than slots: contenders are what turn a stale leader into two leaders.
        let processes = slots + rng.between(0, 4).max(1) as u32 - u32::from(rng.chance(100_000));
        // Intensity in 0..=4: 0 is calm, 4 a storm.
        let intensity = rng.between(0, 4) as u32;
        let ppm = |rng: &mut Rng, max: u32| rng.between(0, u64::from(max * intensity)) as u32;
        let gap = |rng: &mut Rng, base: u64| {
            if intensity == 0 || rng.chance(200_000) {
                0
            } else {
                base / u64::from(intensity) + rng.between(0, base)
            }
        };
        let faults = Faults {
            fail_ppm: ppm(&mut rng, 10_000),
            unknown_lost_ppm: ppm(&mut rng, 5_000),
            unknown_committed_ppm: ppm(&mut rng, 5_000),
            hang_ppm: ppm(&mut rng, 3_000),
            slow_ppm: ppm(&mut rng, 10_000),
            slow_latency_max_ns: l * 3 / 10,
            latency_max_ns: rng.between(0, l / 200),
            pause_gap_ns: gap(&mut rng, 6 * l),
            pause_max_ns: rng.between(l / 10, 3 * l),
            pause_on_call_ppm: ppm(&mut rng, 8_000),
            crash_gap_ns: gap(&mut rng, 15 * l),
            stop_gap_ns: gap(&mut rng, 20 * l),
            outage_gap_ns: gap(&mut rng, 30 * l),
            outage_max_ns: rng.between(l / 10, 2 * l),
            skew_ppm_max: if rng.chance(100_000) {
                0
            } else {
                rng.between(0, 100_000) as u32
            },
            service_fail_ppm: ppm(&mut rng, 5_000),
        };
        Params {
            processes,
            slots,
            lease: Duration::from_nanos(lease_ns),
            round_interval: Duration::from_nanos(rng.between(l / 40, l / 2)),
            acquisition: Duration::from_nanos(rng.between(l, 6 * l)),
            duration_ns: rng.between(20, 40) * l,
            start_spread_ns: rng.between(0, l),
            restart: true,
            restart_delay_max_ns: rng.between(0, l),
            shutdown_on_problem: true,
            host_delay_max_ns: rng.between(0, l / 4),
            service_delay_max_ns: rng.between(0, l / 10),
            faults,
            // Every other seed: stores that know a dead holder (SQLite) and stores that do not.
            // From the seed, not the generator, so that every other draw stays as it was.
            dead_holder: if seed.is_multiple_of(2) {
                DeadHolder::Known
            } else {
                DeadHolder::Unknown
            },
        }
    }

    /// `L` in nanoseconds.
    pub fn lease_ns(&self) -> u64 {
        self.lease.as_nanos() as u64
    }
}

/// What happens to one store call.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Fate {
    /// Time from sending to the store applying it.
    pub to_store_ns: u64,
    /// Whether it is applied and what the caller hears.
    pub outcome: Outcome,
    /// Time from the store to the caller hearing the answer.
    pub back_ns: u64,
}

/// Whether a store call is applied and what its caller hears.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// Applied; the caller hears the store's reply.
    Apply,
    /// Not applied; the caller hears `Failed`.
    Fail,
    /// Not applied; the caller hears `Unknown`.
    UnknownLost,
    /// Applied; the caller hears `Unknown`.
    UnknownCommitted,
    /// Applied if `commit`; the caller hears nothing and its timeout turns that into `Unknown`.
    Hang {
        /// Whether the store applied it.
        commit: bool,
    },
}

impl Fate {
    /// Applied at once, answered at once.
    pub const fn prompt() -> Self {
        Fate {
            to_store_ns: 0,
            outcome: Outcome::Apply,
            back_ns: 0,
        }
    }

    /// Applied at once with `outcome`.
    pub const fn now(outcome: Outcome) -> Self {
        Fate {
            to_store_ns: 0,
            outcome,
            back_ns: 0,
        }
    }

    /// Draws a fate from the fault rates.
    pub fn draw(faults: &Faults, rng: &mut Rng) -> Self {
        let latency = if rng.chance(faults.slow_ppm) {
            rng.between(0, faults.slow_latency_max_ns)
        } else {
            rng.between(0, faults.latency_max_ns)
        };
        let to_store_ns = rng.between(0, latency);
        let mut roll = rng.below(1_000_000) as u32;
        let mut pick = |ppm: u32| {
            let hit = roll < ppm;
            roll = roll.saturating_sub(ppm);
            hit
        };
        let outcome = if pick(faults.fail_ppm) {
            Outcome::Fail
        } else if pick(faults.unknown_lost_ppm) {
            Outcome::UnknownLost
        } else if pick(faults.unknown_committed_ppm) {
            Outcome::UnknownCommitted
        } else if pick(faults.hang_ppm) {
            Outcome::Hang {
                commit: rng.chance(500_000),
            }
        } else {
            Outcome::Apply
        };
        Fate {
            to_store_ns,
            outcome,
            back_ns: latency - to_store_ns,
        }
    }
}
