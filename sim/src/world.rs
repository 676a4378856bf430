//! The one simulated world every simulation runs in: processes that start, pause, crash and
//! restart as new incarnations, each with its own local clock and killer; one [`StoreModel`]
//! that applies every call atomically at the instant it arrives; one fault injector (fates of
//! calls, outages, cut-off processes); one event queue in virtual time, one seeded generator,
//! one trace and one [`Oracle`].
//!
//! What a process runs and what the oracle is shown is a [`Scenario`]'s: the VVM lifecycle
//! ([`crate::Vvms`]), holdings under a session ([`crate::session::Sessions`]) or a semaphore's
//! units under a session ([`crate::semaphore::Semaphores`]). The world calls the scenario with
//! itself (`fn(&mut World<Self>, …)`), so a scenario reads and changes its processes, the store
//! and the oracle through the world's methods.
//!
//! Every VVM or session process is driven as the runtime drives it: store calls under the
//! store-call timeout of its lease, a killer that fires at the local kill deadline even while
//! the process is paused (before anything else of the same instant), a process whose deadline
//! passed while it handled an input ended at once.

use std::collections::{HashSet, VecDeque};

use vvm_core::{Incarnation, LeaseConfig};

use crate::clock::LocalClock;
use crate::oracle::{Interval, Oracle, ProcessId, Violation};
use crate::params::{Fate, Outcome, Params};
use crate::queue::{EventQueue, Ticket};
use crate::rng::Rng;
use crate::store::{Answer, Call, Effects, StoreModel, Writer};
use crate::trace::{Death, Note};

/// Decides the fate of chosen store calls instead of the fault model (scenarios aim faults).
pub type FateHook = Box<dyn FnMut(&Sent) -> Option<Fate>>;

/// A store call as the fate hook sees it.
#[derive(Clone, Copy, Debug)]
pub struct Sent {
    /// Who sends it.
    pub process: ProcessId,
    /// When (true time).
    pub at_ns: u64,
    /// The call.
    pub call: Call,
}

/// What processes run in a [`World`], and what its oracle is shown. Each hook gets the world.
pub trait Scenario: Sized {
    /// The state of one process start beside what the world keeps (clock, killer, pause).
    type Proc;
    /// An input of a process, before it carries a time.
    type Input: Copy;
    /// An event of the scenario's own (not of one process).
    type Event;

    /// Processes, lease, timing and faults.
    fn base(&self) -> &Params;
    /// Whether a killer fires at its deadline (`false` only in runs unsound on purpose).
    fn killer_works(&self) -> bool {
        true
    }
    /// Whether a call reaching the store after its caller's timeout gave up is dropped.
    fn drops_stale(&self, call: &Call) -> bool {
        let _ = call;
        false
    }
    /// Whether the store knows the writer `holder` of a slot record is dead (its lock is free),
    /// from the processes running at `places`.
    fn holder_dead(&self, places: &[Place<Self>], holder: Writer) -> bool {
        let _ = (places, holder);
        false
    }
    /// A new process start at `index`: its state (it may draw from the world's generator).
    fn spawn(world: &mut World<Self>, index: u32, incarnation: Incarnation) -> Self::Proc;
    /// The input a started process is first given.
    fn launch() -> Self::Input;
    /// Runs one input through a process (alive, not paused).
    fn handle(world: &mut World<Self>, id: ProcessId, input: Self::Input);
    /// The host asks process `id` to stop gracefully (the random stops of the fault model).
    fn stop(world: &mut World<Self>, id: ProcessId);
    /// Process `id` ended with everything it ran; `proc` is what it was.
    fn died(world: &mut World<Self>, id: ProcessId, proc: Self::Proc, death: Death) {
        let _ = (world, id, proc, death);
    }
    /// The store's answer to `call` reaches its caller as this input.
    fn answered(call: &Call, answer: Answer) -> Self::Input;
    /// What an applied call did beyond its answer (a semaphore's grants and feed).
    fn applied(world: &mut World<Self>, caller: ProcessId, effects: Effects) {
        let _ = (world, caller, effects);
    }
    /// Handles an event of the scenario's own.
    fn event(world: &mut World<Self>, event: Self::Event);
}

/// One running process.
pub struct Live<S: Scenario> {
    /// Which start.
    pub id: ProcessId,
    /// Its value in store records.
    pub writer: Writer,
    /// Its local clock.
    pub clock: LocalClock,
    paused_until_ns: Option<u64>,
    inbox: VecDeque<S::Input>,
    /// Local kill deadline and the number of the arming that set it.
    pub killer: Option<(u64, u64)>,
    armings: u64,
    /// What the scenario keeps of it.
    pub proc: S::Proc,
}

/// One position: a process that restarts as new incarnations.
pub struct Place<S: Scenario> {
    generation: u32,
    /// The running start, if any.
    pub live: Option<Live<S>>,
    rate_override: Option<i32>,
}

enum Ev<S: Scenario> {
    Input(ProcessId, S::Input),
    /// A store call reaches the store; with the time and place of its caller's timeout when
    /// that is not queued yet (it is only when the answer does not come first).
    Arrive(ProcessId, Writer, Call, Fate, Option<(u64, Ticket)>),
    Kill(ProcessId, u64),
    Resume(ProcessId),
    Start(u32),
    RandomPause(ProcessId),
    RandomCrash(ProcessId),
    RandomStop(ProcessId),
    Own(S::Event),
}

/// Counts the world keeps for every scenario.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Counts {
    /// Store calls sent.
    pub store_calls: u64,
    /// Processes started.
    pub starts: u64,
    /// Processes ended by their killer.
    pub killed: u64,
    /// Processes crashed.
    pub crashed: u64,
}

/// The simulated world of scenario `S`.
pub struct World<S: Scenario> {
    /// The scenario: its parameters, counts and the state it keeps beside the processes.
    pub s: S,
    /// The one generator every random choice comes from.
    pub rng: Rng,
    now_ns: u64,
    queue: EventQueue<Ev<S>>,
    /// The store.
    pub store: StoreModel,
    /// The positions.
    pub places: Vec<Place<S>>,
    /// The oracle of what users see.
    pub oracle: Oracle,
    trace: Option<Vec<Note>>,
    fate_hook: Option<FateHook>,
    outages: Vec<(u64, u64, Outcome)>,
    cut_off: Vec<(u32, u64, u64)>,
    incarnations: HashSet<u64>,
    store_timeout_ns: u64,
    /// Counts so far.
    pub counts: Counts,
}

impl<S: Scenario> World<S> {
    /// A world of `scenario` on `store` whose every random choice comes from `seed`. Processes
    /// start within the start spread; random store outages are laid out in advance.
    pub fn of(seed: u64, scenario: S, store: StoreModel) -> Self {
        let base = scenario.base();
        let lease = LeaseConfig::new(base.lease).expect("simulation lease is valid");
        let processes = base.processes;
        let mut world = World {
            store_timeout_ns: lease.store_timeout().as_nanos() as u64,
            s: scenario,
            rng: Rng::new(seed),
            now_ns: 0,
            queue: EventQueue::default(),
            store,
            places: (0..processes)
                .map(|_| Place {
                    generation: 0,
                    live: None,
                    rate_override: None,
                })
                .collect(),
            oracle: Oracle::default(),
            trace: None,
            fate_hook: None,
            outages: Vec::new(),
            cut_off: Vec::new(),
            incarnations: HashSet::new(),
            counts: Counts::default(),
        };
        for index in 0..processes {
            let at_ns = world.rng.between(0, world.s.base().start_spread_ns);
            world.schedule(at_ns, Ev::Start(index));
        }
        let faults = world.s.base().faults.clone();
        let duration_ns = world.s.base().duration_ns;
        if faults.outage_gap_ns > 0 {
            let mut at_ns = world.rng.between(0, 2 * faults.outage_gap_ns);
            while at_ns < duration_ns {
                let until_ns = at_ns + world.rng.between(0, faults.outage_max_ns);
                let outcome = if world.rng.chance(500_000) {
                    Outcome::Fail
                } else {
                    Outcome::Hang { commit: false }
                };
                world.outages.push((at_ns, until_ns, outcome));
                at_ns = until_ns + world.rng.between(0, 2 * faults.outage_gap_ns);
            }
        }
        world
    }

    /// Keeps a [`Note`] of everything from now on.
    pub fn keep_trace(&mut self) {
        self.trace.get_or_insert_with(Vec::new);
    }

    /// What happened so far (empty unless [`keep_trace`](Self::keep_trace) was called).
    pub fn trace(&self) -> &[Note] {
        self.trace.as_deref().unwrap_or(&[])
    }

    /// Lets `hook` choose the fate of store calls; `None` from it falls back to the fault model.
    pub fn set_fate_hook(&mut self, hook: FateHook) {
        self.fate_hook = Some(hook);
    }

    /// Every store call arriving in `[from_ns, until_ns)` gets `outcome` (the store is down).
    pub fn outage(&mut self, from_ns: u64, until_ns: u64, outcome: Outcome) {
        self.outages.push((from_ns, until_ns, outcome));
    }

    /// Calls of process `index` arriving in `[from_ns, until_ns)` are lost on the way: not
    /// applied, never answered (the process is cut off from the store).
    pub fn cut_off(&mut self, index: u32, from_ns: u64, until_ns: u64) {
        self.cut_off.push((index, from_ns, until_ns));
    }

    /// The next start of process `index` runs its clock at this rate error.
    pub fn set_rate(&mut self, index: u32, rate_ppm: i32) {
        self.places[index as usize].rate_override = Some(rate_ppm);
    }

    /// True time now.
    #[inline]
    pub fn now_ns(&self) -> u64 {
        self.now_ns
    }

    /// The store.
    pub fn store(&self) -> &StoreModel {
        &self.store
    }

    /// The store, to change records underneath the processes.
    pub fn store_mut(&mut self) -> &mut StoreModel {
        &mut self.store
    }

    /// The store writer (address and incarnation) of the running process at `index`.
    pub fn writer(&self, index: u32) -> Option<Writer> {
        Some(self.places[index as usize].live.as_ref()?.writer)
    }

    /// Whether the process at `index` is paused now.
    pub fn is_paused(&self, index: u32) -> bool {
        self.places[index as usize]
            .live
            .as_ref()
            .is_some_and(|live| live.paused_until_ns.is_some())
    }

    /// The running processes.
    pub fn lives(&self) -> impl Iterator<Item = &Live<S>> {
        self.places.iter().filter_map(|place| place.live.as_ref())
    }

    /// Runs until true time `until_ns` (events at exactly `until_ns` included).
    pub fn run_until(&mut self, until_ns: u64) {
        while self
            .queue
            .next_at_ns()
            .is_some_and(|at_ns| at_ns <= until_ns)
        {
            let (at_ns, ev) = self.queue.pop().expect("peeked");
            debug_assert!(at_ns >= self.now_ns, "time ran backwards");
            self.now_ns = at_ns;
            self.dispatch(ev);
        }
        self.now_ns = self.now_ns.max(until_ns);
    }

    /// Runs for the whole duration of the parameters.
    pub fn run(&mut self) {
        self.run_until(self.s.base().duration_ns);
    }

    /// Every violation the oracle saw so far, and every interval of acting recorded (open ones
    /// closed now).
    pub fn check_oracle(&self) -> (Vec<Violation>, Vec<Interval>) {
        let mut oracle = self.oracle.clone();
        let intervals = oracle.clone().finish(self.now_ns);
        (oracle.check(self.now_ns), intervals)
    }

    /// Crashes process `index` now (SIGKILL: no release, in-flight calls still land).
    pub fn crash(&mut self, index: u32) {
        if let Some(id) = self.places[index as usize].live.as_ref().map(|l| l.id) {
            self.die(id, Death::Crash);
        }
    }

    /// Pauses process `index` now for `duration_ns`: it handles nothing meanwhile, its killer
    /// still fires.
    pub fn pause(&mut self, index: u32, duration_ns: u64) {
        let now_ns = self.now_ns;
        let Some(live) = self.places[index as usize].live.as_mut() else {
            return;
        };
        let until_ns = now_ns + duration_ns;
        let until_ns = live.paused_until_ns.map_or(until_ns, |u| u.max(until_ns));
        live.paused_until_ns = Some(until_ns);
        let id = live.id;
        self.note(|| Note::Paused {
            at_ns: now_ns,
            process: id,
            until_ns,
        });
        self.schedule(until_ns, Ev::Resume(id));
    }

    /// Queues an event of the scenario's own at true time `at_ns`.
    pub fn schedule_own(&mut self, at_ns: u64, event: S::Event) {
        self.schedule(at_ns, Ev::Own(event));
    }

    /// Queues `input` for `id` at true time `at_ns`.
    #[inline]
    pub fn schedule_input(&mut self, at_ns: u64, id: ProcessId, input: S::Input) {
        self.schedule(at_ns, Ev::Input(id, input));
    }

    /// Queues `input` for `id` at the true time its local clock reads `local_ns`.
    #[inline]
    pub fn at_local(&mut self, id: ProcessId, local_ns: u64, input: S::Input) {
        let at_ns = self.live(id).clock.true_at(local_ns);
        self.schedule(at_ns, Ev::Input(id, input));
    }

    #[inline]
    fn schedule(&mut self, at_ns: u64, ev: Ev<S>) {
        let ticket = self.queue.reserve();
        self.schedule_reserved(at_ns, ticket, ev);
    }

    #[inline]
    fn schedule_reserved(&mut self, at_ns: u64, ticket: Ticket, ev: Ev<S>) {
        // Killers fire before anything else happening at the same instant.
        let rank = u8::from(!matches!(ev, Ev::Kill(..)));
        self.queue
            .push_reserved(at_ns.max(self.now_ns), rank, ticket, ev);
    }

    /// Whether a trace is kept.
    pub fn tracing(&self) -> bool {
        self.trace.is_some()
    }

    /// Keeps the note `note` makes, if a trace is kept.
    #[inline]
    pub fn note(&mut self, note: impl FnOnce() -> Note) {
        if let Some(trace) = self.trace.as_mut() {
            trace.push(note());
        }
    }

    /// Keeps a line of text about `id`, if a trace is kept.
    #[inline]
    pub fn line(&mut self, id: ProcessId, text: impl FnOnce() -> String) {
        let at_ns = self.now_ns;
        self.note(|| Note::Line {
            at_ns,
            process: id,
            text: text(),
        });
    }

    /// The running process `id`, if it still runs.
    #[inline]
    pub fn live_mut(&mut self, id: ProcessId) -> Option<&mut Live<S>> {
        self.places[id.index as usize]
            .live
            .as_mut()
            .filter(|live| live.id == id)
    }

    /// The running process `id`, which must still run.
    #[inline]
    pub fn live(&mut self, id: ProcessId) -> &mut Live<S> {
        self.live_mut(id).expect("running")
    }

    /// What the scenario keeps of the running process `id`.
    #[inline]
    pub fn proc(&mut self, id: ProcessId) -> &mut S::Proc {
        &mut self.live(id).proc
    }

    /// The local clock reading of `id` now.
    #[inline]
    pub fn local_ns(&mut self, id: ProcessId) -> u64 {
        let now_ns = self.now_ns;
        self.live(id).clock.local(now_ns)
    }

    fn dispatch(&mut self, ev: Ev<S>) {
        match ev {
            Ev::Input(id, input) => self.deliver(id, input),
            Ev::Arrive(id, writer, call, fate, timeout) => {
                self.arrive(id, writer, call, fate, timeout)
            }
            Ev::Kill(id, arming) => {
                let fires = self
                    .live_mut(id)
                    .is_some_and(|live| live.killer.is_some_and(|(_, n)| n == arming));
                if fires && self.s.killer_works() {
                    self.die(id, Death::Killer);
                }
            }
            Ev::Resume(id) => self.resume(id),
            Ev::Start(index) => self.start(index),
            Ev::RandomPause(id) => {
                if self
                    .live_mut(id)
                    .is_some_and(|l| l.paused_until_ns.is_none())
                {
                    let duration_ns = self.pause_duration();
                    self.pause(id.index, duration_ns);
                }
                let gap_ns = self.s.base().faults.pause_gap_ns;
                self.random_next(id, gap_ns, Ev::RandomPause(id));
            }
            Ev::RandomCrash(id) => {
                if self.live_mut(id).is_some() {
                    self.die(id, Death::Crash);
                }
            }
            Ev::RandomStop(id) => {
                if self.live_mut(id).is_some() {
                    S::stop(self, id);
                }
            }
            Ev::Own(event) => S::event(self, event),
        }
    }

    /// A pause length: mostly short, often near the kill threshold or the lease where the
    /// protocol's margins are thinnest, sometimes as long as allowed.
    fn pause_duration(&mut self) -> u64 {
        let l = self.s.base().lease_ns();
        let max = self.s.base().faults.pause_max_ns;
        let duration_ns = match self.rng.below(10) {
            0..=3 => self.rng.between(0, l / 20),
            4..=6 => self.rng.between(l * 13 / 20, l * 19 / 20),
            7 | 8 => self.rng.between(l * 9 / 10, l * 6 / 5),
            _ => self.rng.between(0, max),
        };
        duration_ns.min(max)
    }

    fn random_next(&mut self, id: ProcessId, gap_ns: u64, ev: Ev<S>) {
        if gap_ns > 0 && self.live_mut(id).is_some() {
            let at_ns = self.now_ns + self.rng.between(1, 2 * gap_ns);
            self.schedule(at_ns, ev);
        }
    }

    fn start(&mut self, index: u32) {
        let place = &mut self.places[index as usize];
        if place.live.is_some() {
            return;
        }
        let id = ProcessId {
            index,
            generation: place.generation,
        };
        place.generation += 1;
        let rate_override = place.rate_override;
        let skew = self.s.base().faults.skew_ppm_max;
        let rate_ppm = match rate_override {
            Some(rate) => rate,
            // The extremes are the interesting part: a tenth of the starts sit on them.
            None if self.rng.chance(100_000) => {
                if self.rng.chance(500_000) {
                    skew as i32
                } else {
                    -(skew as i32)
                }
            }
            None => self.rng.signed(skew) as i32,
        };
        let mut incarnation = self.rng.next_u64();
        while !self.incarnations.insert(incarnation) {
            incarnation = self.rng.next_u64();
        }
        let incarnation = Incarnation(incarnation);
        let origin_local_ns = self.rng.between(0, 1 << 40);
        let proc = S::spawn(self, index, incarnation);
        self.places[index as usize].live = Some(Live {
            id,
            writer: Writer {
                address: index,
                incarnation,
            },
            clock: LocalClock::new(self.now_ns, origin_local_ns, rate_ppm),
            paused_until_ns: None,
            inbox: VecDeque::new(),
            killer: None,
            armings: 0,
            proc,
        });
        self.counts.starts += 1;
        let now_ns = self.now_ns;
        self.note(|| Note::Started {
            at_ns: now_ns,
            process: id,
            incarnation,
            rate_ppm,
        });
        self.deliver(id, S::launch());
        let faults = self.s.base().faults.clone();
        self.random_next(id, faults.pause_gap_ns, Ev::RandomPause(id));
        self.random_next(id, faults.crash_gap_ns, Ev::RandomCrash(id));
        self.random_next(id, faults.stop_gap_ns, Ev::RandomStop(id));
    }

    /// The process ends with everything it runs: its killer fired, or it crashed.
    pub fn die(&mut self, id: ProcessId, death: Death) {
        if self.live_mut(id).is_none() {
            return;
        }
        let live = self.places[id.index as usize].live.take().expect("running");
        self.oracle.stop(id, self.now_ns);
        match death {
            Death::Killer => self.counts.killed += 1,
            Death::Crash => self.counts.crashed += 1,
        }
        S::died(self, id, live.proc, death);
        let now_ns = self.now_ns;
        self.note(|| Note::Died {
            at_ns: now_ns,
            process: id,
            death,
        });
        self.restart_later(id.index);
    }

    /// The process ends after its shutdown finished.
    pub fn exit(&mut self, id: ProcessId) {
        let now_ns = self.now_ns;
        self.places[id.index as usize].live = None;
        self.oracle.stop(id, now_ns);
        self.note(|| Note::Exited {
            at_ns: now_ns,
            process: id,
        });
        self.restart_later(id.index);
    }

    fn restart_later(&mut self, index: u32) {
        if self.s.base().restart {
            let delay_max_ns = self.s.base().restart_delay_max_ns;
            let at_ns = self.now_ns + self.rng.between(0, delay_max_ns);
            self.schedule(at_ns, Ev::Start(index));
        }
    }

    /// An input reaches a process: handled now, or queued while it is paused.
    pub fn deliver(&mut self, id: ProcessId, input: S::Input) {
        let Some(live) = self.live_mut(id) else {
            return;
        };
        if live.paused_until_ns.is_some() {
            live.inbox.push_back(input);
            return;
        }
        S::handle(self, id, input);
    }

    fn resume(&mut self, id: ProcessId) {
        let now_ns = self.now_ns;
        let Some(live) = self.live_mut(id) else {
            return;
        };
        if live.paused_until_ns.is_some_and(|until| until > now_ns) {
            return; // a longer pause was asked meanwhile
        }
        live.paused_until_ns = None;
        // Everything that arrived during the pause is handled now, in arrival order, unless the
        // process dies on the way.
        while let Some(input) = self.live_mut(id).and_then(|live| live.inbox.pop_front()) {
            S::handle(self, id, input);
        }
    }

    /// Arms the killer of `id` at its local `at_ns`, replacing the one armed before.
    pub fn arm_killer(&mut self, id: ProcessId, at_ns: u64) {
        let live = self.live(id);
        live.armings += 1;
        let arming = live.armings;
        live.killer = Some((at_ns, arming));
        let at_true_ns = live.clock.true_at(at_ns);
        self.schedule(at_true_ns, Ev::Kill(id, arming));
    }

    /// Whether the kill deadline of `id` has passed on its clock (a deadline armed in the
    /// past, by a confirmation that came too late, fires at once).
    #[inline]
    pub fn overdue(&mut self, id: ProcessId) -> bool {
        let now_ns = self.now_ns;
        self.live_mut(id).is_some_and(|live| {
            live.killer
                .is_some_and(|(at, _)| live.clock.local(now_ns) >= at)
        })
    }

    /// Ends `id` by its killer if its deadline has passed (and killers work); true when it did.
    pub fn kill_if_overdue(&mut self, id: ProcessId) -> bool {
        let fires = self.overdue(id) && self.s.killer_works();
        if fires {
            self.die(id, Death::Killer);
        }
        fires
    }

    /// Flags `id` if it hands `what` to services at or after its kill deadline: once it has
    /// passed, the process may no longer act, and services that saw it would act on it.
    pub fn check_fresh(&mut self, id: ProcessId, what: impl FnOnce() -> String) {
        if !self.s.killer_works() {
            return;
        }
        let now_ns = self.now_ns;
        let live = self.live(id);
        let now_local = live.clock.local(now_ns);
        let killer = live.killer;
        if killer.is_none_or(|(deadline, _)| now_local >= deadline) {
            let text = format!(
                "{id} handed {} to services at local {now_local} ns, at or after its kill \
                 deadline {killer:?}",
                what()
            );
            self.oracle.flag_late_token(id, now_ns, text);
        }
    }

    /// Sends a store call of `id` under the store-call timeout: on its timeout, or on an
    /// unknown outcome, the caller hears `Call::unknown`.
    pub fn send(&mut self, id: ProcessId, call: Call) {
        self.counts.store_calls += 1;
        let now_ns = self.now_ns;
        let sent = Sent {
            process: id,
            at_ns: now_ns,
            call,
        };
        let hooked = self.fate_hook.as_mut().and_then(|hook| hook(&sent));
        let fate = hooked.unwrap_or_else(|| Fate::draw(&self.s.base().faults, &mut self.rng));
        let timeout_ns = self.store_timeout_ns;
        let live = self.live(id);
        let writer = live.writer;
        let timeout_at_ns = live.clock.true_at(live.clock.local(now_ns) + timeout_ns);
        // The timeout waits in the call until the call reaches the store, and is queued only if
        // the answer does not come first: a third fewer events, the same run.
        let arrive_ns = now_ns + fate.to_store_ns;
        let arrival = self.queue.reserve();
        let timeout = self.queue.reserve();
        let deferred = (arrive_ns <= timeout_at_ns).then_some((timeout_at_ns, timeout));
        let arrive = Ev::Arrive(id, writer, call, fate, deferred);
        self.schedule_reserved(arrive_ns, arrival, arrive);
        if deferred.is_none() {
            let unknown = Ev::Input(id, S::answered(&call, call.unknown()));
            self.schedule_reserved(timeout_at_ns, timeout, unknown);
        }
        if self.rng.chance(self.s.base().faults.pause_on_call_ppm) {
            let duration_ns = self.pause_duration();
            self.pause(id.index, duration_ns);
        }
    }

    /// A store call reaches the store.
    fn arrive(
        &mut self,
        id: ProcessId,
        writer: Writer,
        call: Call,
        fate: Fate,
        timeout: Option<(u64, Ticket)>,
    ) {
        let now_ns = self.now_ns;
        let mut outcome = fate.outcome;
        if let Some(&(_, _, down)) = self
            .outages
            .iter()
            .find(|&&(from, until, _)| (from..until).contains(&now_ns))
        {
            outcome = down;
        }
        if self
            .cut_off
            .iter()
            .any(|&(index, from, until)| index == id.index && (from..until).contains(&now_ns))
        {
            outcome = Outcome::Hang { commit: false };
        }
        let apply = matches!(
            outcome,
            Outcome::Apply | Outcome::UnknownCommitted | Outcome::Hang { commit: true }
        );
        // A call whose caller's timeout already passed (its timeout is queued) is stale.
        let dropped = timeout.is_none() && self.s.drops_stale(&call);
        let (scenario, places) = (&self.s, &self.places);
        let dead = |holder| scenario.holder_dead(places, holder);
        let applied = (apply && !dropped).then(|| self.store.apply(&call, writer, now_ns, &dead));
        self.note(|| Note::Store {
            at_ns: now_ns,
            process: id,
            call,
            outcome,
            answer: applied.as_ref().map(|(answer, _)| *answer),
        });
        let applied = applied.map(|(answer, effects)| {
            S::applied(self, id, effects);
            answer
        });
        let answer = match outcome {
            Outcome::Apply => applied,
            Outcome::Fail => Some(call.failed()),
            Outcome::UnknownLost | Outcome::UnknownCommitted => Some(call.unknown()),
            Outcome::Hang { .. } => None,
        };
        if let Some((timeout_ns, ticket)) = timeout {
            if answer.is_none() || now_ns + fate.back_ns >= timeout_ns {
                let unknown = Ev::Input(id, S::answered(&call, call.unknown()));
                self.schedule_reserved(timeout_ns, ticket, unknown);
            }
        }
        if let Some(answer) = answer {
            let input = S::answered(&call, answer);
            self.schedule(now_ns + fate.back_ns, Ev::Input(id, input));
        }
    }
}
