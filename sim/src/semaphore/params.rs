//! The shape of a run of semaphores, the rules it may break on purpose, and its counts.

use crate::params::Params;
use crate::rng::Rng;

/// How the runtime and store treat the rules a semaphore's users depend on; all but
/// [`Rule::Sound`] are broken on purpose, for the simulator to show it catches them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Rule {
    /// As the runtime and the stores do it.
    Sound,
    /// Unsound: the killer never fires; an owner whose session was lost acts on past its kill
    /// deadline, after its units passed to others.
    KillerIgnored,
    /// Unsound, in the store: a new acquire that fits in the free units is granted at once
    /// even when others are queued.
    GrantWhenFits,
    /// Unsound, in the store: a release's write does not wake the feed, so the waiters it
    /// grants are not told.
    ReleaseNotWoken,
}

/// The shape of one run of semaphores.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SemaphoreParams {
    /// Processes, lease, timing and faults, as for the leadership simulator (its slots unused).
    pub base: Params,
    /// The semaphore's limit.
    pub limit: u64,
    /// The runtime's and the store's rule.
    pub rule: Rule,
    /// Longest delay from a write of the semaphore to its feed waking a subscriber: the store's
    /// push delay.
    pub feed_delay_max_ns: u64,
    /// Longest time an owner holds before it stops its services and releases.
    pub hold_max_ns: u64,
    /// Longest pause between a process's acquires.
    pub think_max_ns: u64,
    /// Services that are slow to stop, per million stops.
    pub slow_stop_ppm: u32,
    /// Longest stop of slow services.
    pub slow_stop_max_ns: u64,
    /// Whether a process draws a new count for every acquire (as the sound runs do), or keeps
    /// one count per process start.
    pub counts_vary: bool,
    /// Whether a semaphore call may reach the store after its caller's timeout gave up on it
    /// (session calls always may). Every call names its request, so such a stale call acts on
    /// nothing the session asked since (`sim/tests/semaphore_simulation.rs`,
    /// `stale_semaphore_calls_act_on_nothing_newer`).
    pub stale_calls: bool,
}

impl SemaphoreParams {
    /// A run drawn from `seed`: 3–6 processes on a semaphore of limit 1–4, over 10–20 lease
    /// periods, with the leadership simulator's mix of faults.
    pub fn random(seed: u64) -> Self {
        let mut rng = Rng::new(seed ^ 0x5E3A_F0E5_EED5_0002);
        let mut base = Params::random(seed ^ 0x0A11_0F17_5E3A_F0E5);
        let l = base.lease_ns();
        base.processes = rng.between(3, 6) as u32;
        base.slots = 1;
        base.duration_ns = rng.between(10, 20) * l;
        // The host's graceful stops are not part of this scenario: its processes end by a
        // crash or their killer.
        base.faults.stop_gap_ns = 0;
        SemaphoreParams {
            base,
            limit: rng.between(1, 4),
            rule: Rule::Sound,
            feed_delay_max_ns: rng.between(0, l / 100),
            hold_max_ns: rng.between(l / 10, 3 * l),
            think_max_ns: rng.between(0, l),
            slow_stop_ppm: rng.between(0, 100_000) as u32,
            slow_stop_max_ns: 2 * l,
            counts_vary: true,
            stale_calls: false,
        }
    }
}

/// Counts of what happened in a run.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SemaphoreStats {
    /// Events handled by session machines and acquires.
    pub events: u64,
    /// Store calls sent.
    pub store_calls: u64,
    /// Acquires sent.
    pub acquires: u64,
    /// Grants seen by their process (services started on them).
    pub grants: u64,
    /// Requests that waited in the queue.
    pub queued: u64,
    /// Grants, at the store, of a request that had waited in the queue.
    pub granted_from_queue: u64,
    /// Waits ended by their timeout without a grant.
    pub timed_out: u64,
    /// Most units held at once by owners whose services ran.
    pub units_max: u64,
    /// Instants at which two or more owners' services ran at once.
    pub shared: u64,
    /// Sessions lost while services ran under their grant.
    pub losses_while_owning: u64,
    /// Processes ended by their killer while services ran under their grant.
    pub killed_while_owning: u64,
    /// Processes crashed.
    pub crashed: u64,
    /// Processes started.
    pub starts: u64,
}

impl crate::runner::Totals for SemaphoreStats {
    /// Adds `more` to these counts (the highest of the maxima).
    fn add(&mut self, more: &SemaphoreStats) {
        self.events += more.events;
        self.store_calls += more.store_calls;
        self.acquires += more.acquires;
        self.grants += more.grants;
        self.queued += more.queued;
        self.granted_from_queue += more.granted_from_queue;
        self.timed_out += more.timed_out;
        self.units_max = self.units_max.max(more.units_max);
        self.shared += more.shared;
        self.losses_while_owning += more.losses_while_owning;
        self.killed_while_owning += more.killed_while_owning;
        self.crashed += more.crashed;
        self.starts += more.starts;
    }
}
