//! The shape of a run of sessions, the rules it may break on purpose, and its counts.

use crate::params::Params;
use crate::rng::Rng;

use crate::store::KeepAlives;

/// How the runtime treats the rules a lost session's holdings depend on; all but
/// [`Rule::Sound`] are broken on purpose, for the simulator to show it catches them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Rule {
    /// As the runtime does it.
    Sound,
    /// Unsound: at the loss every holding is detached at once, while its services still stop;
    /// the process then opens a new session, whose later kill deadline replaces the one they
    /// run under.
    DetachAtLoss,
    /// Unsound: the killer never fires; a process runs on past its kill deadline.
    KillerIgnored,
    /// Unsound, in the store: a holding expires a lease after its acquire, as a record of its
    /// own, although its session's keepalives keep its services acting.
    HoldingsExpireAlone,
}

/// The shape of one run of sessions.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SessionParams {
    /// Processes, slots, lease, timing and faults, as for the leadership simulator.
    pub base: Params,
    /// How the store answers keepalives.
    pub keepalives: KeepAlives,
    /// The runtime's rule.
    pub rule: Rule,
    /// Services that are slow to stop, per million stops.
    pub slow_stop_ppm: u32,
    /// Longest stop of slow services.
    pub slow_stop_max_ns: u64,
}

impl SessionParams {
    /// A run drawn from `seed`: 2–3 processes, each holding every one of 2–3 slots under its
    /// session when it can, over 10–20 lease periods, with the leadership simulator's mix of
    /// faults.
    pub fn random(seed: u64) -> Self {
        let mut rng = Rng::new(seed ^ 0x5E55_1075_EED5_0001);
        let mut base = Params::random(seed ^ 0x0A11_0F17_5E55_1075);
        let l = base.lease_ns();
        base.processes = rng.between(2, 3) as u32;
        base.slots = rng.between(2, 3) as u32;
        base.duration_ns = rng.between(10, 20) * l;
        SessionParams {
            base,
            keepalives: if rng.chance(500_000) {
                KeepAlives::Keep
            } else {
                KeepAlives::Bump
            },
            rule: Rule::Sound,
            slow_stop_ppm: rng.between(0, 100_000) as u32,
            slow_stop_max_ns: 2 * l,
        }
    }
}

/// Counts of what happened in a run.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SessionStats {
    /// Events handled by session machines and holdings.
    pub events: u64,
    /// Store calls sent.
    pub store_calls: u64,
    /// Sessions opened.
    pub opened: u64,
    /// Keepalives confirmed.
    pub keepalives: u64,
    /// Holdings handed out (services started on them).
    pub acquisitions: u64,
    /// Sessions lost.
    pub losses: u64,
    /// Sessions lost while services ran under their holdings.
    pub losses_while_acting: u64,
    /// Processes ended by their killer.
    pub killed: u64,
    /// Processes ended by their killer while services ran under their holdings.
    pub killed_while_acting: u64,
    /// Processes crashed.
    pub crashed: u64,
    /// Processes started.
    pub starts: u64,
    /// Slots acted on by one process start after another.
    pub handovers: u64,
}

impl crate::runner::Totals for SessionStats {
    /// Adds `more` to these counts.
    fn add(&mut self, more: &SessionStats) {
        self.events += more.events;
        self.store_calls += more.store_calls;
        self.opened += more.opened;
        self.keepalives += more.keepalives;
        self.acquisitions += more.acquisitions;
        self.losses += more.losses;
        self.losses_while_acting += more.losses_while_acting;
        self.killed += more.killed;
        self.killed_while_acting += more.killed_while_acting;
        self.crashed += more.crashed;
        self.starts += more.starts;
        self.handovers += more.handovers;
    }
}
