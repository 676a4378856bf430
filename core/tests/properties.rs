//! Random event sequences into each machine — stale and duplicated replies, arbitrary forward time
//! jumps, errors, unknown outcomes — and the invariants that must hold after every step.

use std::collections::HashMap;

use core::time::Duration;

use proptest::prelude::*;
use vvm_core::*;

const ME: Incarnation = Incarnation(1);
const OTHER: Incarnation = Incarnation(2);
const STEPS_MAX: usize = 150;

/// One random input. Indices pick among operations / timers seen so far (modulo their count), so
/// that most events are relevant while stale and duplicated ones still occur.
#[derive(Clone, Debug)]
enum Step {
    Advance(u64),
    Acquire(u32),
    Release,
    Launch,
    Shutdown,
    ServicesStarted,
    ServiceFailed(u16),
    ServicesStopped,
    /// A change feed reported a slot's record changed (lifecycle only).
    SlotChanged,
    /// The store said our record is gone or another's.
    Vanished,
    Fire(usize),
    Reply(usize, ReplyKind),
}

#[derive(Clone, Copy, Debug)]
enum ReplyKind {
    Written(u8),
    Rejected,
    /// Refused with this many milliseconds left (0 included: the floor of the wait).
    Held(u16),
    Deleted,
    FoundOurs(u8),
    FoundOther,
    FoundNone,
    Failed,
    Unknown,
}

fn step() -> impl Strategy<Value = Step> {
    let reply = prop_oneof![
        (0u8..3).prop_map(ReplyKind::Written),
        Just(ReplyKind::Rejected),
        (0u16..3_000).prop_map(ReplyKind::Held),
        Just(ReplyKind::Deleted),
        (0u8..3).prop_map(ReplyKind::FoundOurs),
        Just(ReplyKind::FoundOther),
        Just(ReplyKind::FoundNone),
        Just(ReplyKind::Failed),
        Just(ReplyKind::Unknown),
    ];
    prop_oneof![
        3 => (0u64..60_000).prop_map(Step::Advance),
        1 => (1u32..3).prop_map(Step::Acquire),
        1 => Just(Step::Release),
        1 => Just(Step::Launch),
        1 => Just(Step::Shutdown),
        1 => Just(Step::ServicesStarted),
        1 => (0u16..3).prop_map(Step::ServiceFailed),
        1 => Just(Step::ServicesStopped),
        1 => Just(Step::SlotChanged),
        1 => Just(Step::Vanished),
        3 => any::<usize>().prop_map(Step::Fire),
        6 => (any::<usize>(), reply).prop_map(|(i, r)| Step::Reply(i, r)),
    ]
}

/// What the test knows about operations, to judge the machine from outside.
#[derive(Default)]
struct World {
    now_ms: u64,
    /// Every operation emitted, with the send time of the write it stands for (a `Get` inherits
    /// the send time of the write whose outcome it resolves).
    ops: Vec<(OpId, u64)>,
    sent_ms: HashMap<OpId, u64>,
    timers: Vec<TimerId>,
    /// Last revision the "store" handed out: written revisions only grow, like a real store's.
    revision: u64,
    /// Send time of the write whose reply last produced Acquired/Renewed.
    confirmed_send_ms: Option<u64>,
    last_token: Option<FencingToken>,
    last_deadline: Option<Instant>,
    replied_to: Option<OpId>,
}

fn at(ms: u64) -> Instant {
    Instant::from_nanos(ms * 1_000_000)
}

impl World {
    fn reply(
        &mut self,
        index: usize,
        kind: ReplyKind,
        held: Option<Held>,
    ) -> Option<(OpId, Reply)> {
        if self.ops.is_empty() {
            return None;
        }
        let (op, _) = self.ops[index % self.ops.len()];
        let ours = |bump: u8, world: &mut World| {
            // A stale revision (bump 0) only makes sense for a swap of a held lease; a store
            // always gives an insert a revision above every earlier one.
            let bump = if held.is_some() { bump } else { bump.max(1) };
            let base = held.map_or(world.revision, |h| h.revision.0);
            let revision = if bump == 0 {
                base
            } else {
                world.revision + u64::from(bump)
            };
            world.revision = world.revision.max(revision);
            revision
        };
        let reply = match kind {
            ReplyKind::Written(bump) => Reply::Written(Revision(ours(bump, self))),
            ReplyKind::Rejected => Reply::Rejected,
            ReplyKind::Held(ms) => Reply::Held(Duration::from_millis(u64::from(ms))),
            ReplyKind::Deleted => Reply::Deleted,
            ReplyKind::FoundOurs(bump) => Reply::Found(Some(Record {
                incarnation: ME,
                revision: Revision(ours(bump, self)),
            })),
            ReplyKind::FoundOther => {
                self.revision += 1;
                Reply::Found(Some(Record {
                    incarnation: OTHER,
                    revision: Revision(self.revision),
                }))
            }
            ReplyKind::FoundNone => Reply::Found(None),
            ReplyKind::Failed => Reply::Failed,
            ReplyKind::Unknown => Reply::Unknown,
        };
        self.replied_to = Some(op);
        Some((op, reply))
    }

    /// Records what the machine emitted and checks the leadership invariants.
    fn observe(&mut self, out: &Effects, leadership: &Leadership) {
        let lease = *leadership.lease();
        let mut confirmed_now = false;
        for effect in out {
            match *effect {
                Effect::Insert { op, .. }
                | Effect::CompareAndSwap { op, .. }
                | Effect::CompareAndDelete { op, .. } => {
                    self.ops.push((op, self.now_ms));
                    self.sent_ms.insert(op, self.now_ms);
                }
                Effect::Get { op, .. } => {
                    let resolved = self.replied_to.and_then(|r| self.sent_ms.get(&r).copied());
                    let sent = resolved.expect("a Get only follows a reply to a write");
                    self.ops.push((op, sent));
                    self.sent_ms.insert(op, sent);
                }
                Effect::SetTimer { timer, .. } => self.timers.push(timer),
                Effect::Acquired { token } | Effect::Renewed { token } => {
                    // covers: Lease.FencingToken
                    if let Some(last) = self.last_token {
                        assert!(
                            token.revision > last.revision,
                            "fencing revision went from {last:?} to {token:?}"
                        );
                    }
                    self.last_token = Some(token);
                    let op = self.replied_to.expect("a confirmation follows a reply");
                    self.confirmed_send_ms = Some(self.sent_ms[&op]);
                    confirmed_now = true;
                }
                _ => {}
            }
        }
        for effect in out {
            if let Effect::ArmKiller { at: deadline } = *effect {
                // covers: Lease.DeadlineOnlyLaterOnConfirm
                if let Some(previous) = self.last_deadline {
                    let confirmed = confirmed_now
                        || out
                            .iter()
                            .any(|e| matches!(e, Effect::CompareAndDelete { .. }));
                    assert!(
                        deadline <= previous || confirmed,
                        "deadline moved later without a confirmed write"
                    );
                }
                self.last_deadline = Some(deadline);
            }
        }
        if let Some(held) = leadership.held() {
            let send = at(self
                .confirmed_send_ms
                .expect("leading implies a confirmed write"));
            // covers: processKillThreshold
            assert!(
                held.deadline <= send + lease.kill_after(),
                "deadline beyond last confirmed send + 0.8 L"
            );
            assert!(
                held.deadline < send + lease.lease(),
                "deadline not before last confirmed send + L"
            );
            assert_eq!(held.anchor, send);
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 384, ..ProptestConfig::default() })]

    // covers: Lease.Invariants, Lease.StaleReply
    #[test]
    fn leadership_invariants_hold_under_random_events(steps in prop::collection::vec(step(), 1..STEPS_MAX)) {
        let lease = LeaseConfig::new(Duration::from_secs(20)).unwrap();
        let mut machine = Leadership::new(lease, ME);
        let mut world = World::default();
        let mut out = Effects::new();
        for step in steps {
            out.clear();
            let now = at(world.now_ms);
            let event = match step {
                Step::Advance(ms) => { world.now_ms += ms; continue; }
                Step::Acquire(slot) => LeaseEvent::Acquire { now, slot: Slot(slot) },
                Step::Release | Step::Shutdown => LeaseEvent::Release { now },
                Step::Vanished => LeaseEvent::Vanished { now },
                Step::Fire(i) if !world.timers.is_empty() => {
                    LeaseEvent::Timer { now, timer: world.timers[i % world.timers.len()] }
                }
                Step::Reply(i, kind) => match world.reply(i, kind, machine.held()) {
                    Some((op, reply)) => LeaseEvent::Reply { now, op, reply },
                    None => continue,
                },
                _ => continue,
            };
            let before = machine.clone();
            machine.handle(&event, &mut out);
            world.observe(&out, &machine);
            if out.is_empty() && !matches!(event, LeaseEvent::Release { .. }) {
                // No effect means nothing happened, apart from a release flag being noted.
                assert!(machine == before || matches!(event, LeaseEvent::Reply { .. } | LeaseEvent::Timer { .. }));
            }
        }
    }

    // covers: VVM.Invariants, VVM.updateProblem, VVM.Shutdown
    #[test]
    fn lifecycle_invariants_hold_under_random_events(steps in prop::collection::vec(step(), 1..STEPS_MAX)) {
        let config = VvmConfig::builder("10.0.0.1:7000").slots(2).acquisition(Duration::from_secs(30)).build().unwrap();
        let mut vvm = Lifecycle::new(&config, ME);
        let mut world = World::default();
        let mut out = Effects::new();
        let mut log: Vec<Effect> = Vec::new();
        let mut problem: Option<Problem> = None;
        let mut services_running = false;
        let mut lost = false;
        for step in steps {
            out.clear();
            let now = at(world.now_ms);
            let event = match step {
                Step::Advance(ms) => { world.now_ms += ms; continue; }
                Step::Launch | Step::Acquire(_) => VvmEvent::Launch { now },
                Step::Shutdown | Step::Release => VvmEvent::Shutdown { now },
                Step::ServicesStarted => VvmEvent::ServicesStarted { now },
                Step::ServiceFailed(index) => VvmEvent::ServiceFailed { now, index },
                Step::ServicesStopped => VvmEvent::ServicesStopped { now, clean: true },
                Step::SlotChanged => VvmEvent::SlotChanged { now },
                Step::Vanished => VvmEvent::RecordVanished { now },
                Step::Fire(i) if !world.timers.is_empty() => {
                    VvmEvent::Timer { now, timer: world.timers[i % world.timers.len()] }
                }
                Step::Reply(i, kind) => match world.reply(i, kind, vvm.leadership().held()) {
                    Some((op, reply)) => VvmEvent::Reply { now, op, reply },
                    None => continue,
                },
                Step::Fire(_) => continue,
            };
            let waited_for_round = vvm.waits_for_round();
            let watched = vvm.watches_own_record();
            vvm.handle(&event, &mut out);
            // covers: VVM.VanishedStops
            // The store's word that the record vanished ends the leading of a watching VVM at
            // once (nothing held, nothing watched any more, services stopping) and is ignored
            // by every other.
            if matches!(event, VvmEvent::RecordVanished { .. }) {
                if watched.is_some() {
                    assert!(vvm.leadership().is_idle(), "still leading: {:?}", vvm.leadership());
                    assert_eq!(vvm.watches_own_record(), None);
                    assert_eq!(vvm.phase(), Phase::StoppingServices, "{out:?}");
                    assert!(matches!(out.as_slice().first(), Some(Effect::Lost { .. })), "{out:?}");
                } else {
                    assert!(out.is_empty(), "RecordVanished while not watching: {out:?}");
                }
            }
            world.observe(&out, vvm.leadership());
            // covers: VVM.TryAtChange
            // A change report only ever starts a round (one insert at slot 1) from RoundWait.
            if matches!(event, VvmEvent::SlotChanged { .. }) {
                if waited_for_round {
                    assert!(
                        matches!(out.as_slice(), [Effect::Insert { slot: Slot(1), .. }]),
                        "SlotChanged in RoundWait: {out:?}"
                    );
                } else {
                    assert!(out.is_empty(), "SlotChanged outside RoundWait: {out:?}");
                }
            }
            // covers: VVM.TryAtExpiry
            // A round timer always lies in the future: no refusal (however little time its
            // record has left) makes a candidate retry without waiting.
            for effect in out.iter() {
                if let Effect::SetTimer { timer, at } = *effect {
                    if timer.kind == TimerKind::Round {
                        assert!(at > now, "round timer at {at:?} not after {now:?}");
                    }
                }
            }
            // covers: Verify.Safety, VVM.LossKeepsRecord, VVM.DisarmAfterCleanRelease
            // Acting means services running: from StartServices until their stop is reported.
            // While they may run, no record of ours is deleted and the killer is never disarmed.
            if matches!(event, VvmEvent::ServicesStopped { .. }) {
                services_running = false;
            }
            for effect in &out {
                match *effect {
                    Effect::StartServices { .. } => services_running = true,
                    Effect::CompareAndDelete { .. } => assert!(
                        !services_running,
                        "record deleted while services may run: {event:?} -> {out:?}"
                    ),
                    Effect::DisarmKiller => assert!(
                        !services_running,
                        "killer disarmed while services may run: {event:?} -> {out:?}"
                    ),
                    Effect::Lost { .. } => lost = true,
                    _ => {}
                }
            }
            // The problem is write-once.
            if let Some(first) = problem {
                assert_eq!(vvm.problem(), Some(first));
            }
            problem = vvm.problem();
            log.extend_from_slice(out.as_slice());
        }
        // Emitted at most once each.
        let count = |f: fn(&Effect) -> bool| log.iter().filter(|e| f(e)).count();
        assert!(count(|e| matches!(e, Effect::ProblemRaised { .. })) <= 1);
        assert!(count(|e| matches!(e, Effect::MonitorStopped)) <= 1);
        assert!(count(|e| matches!(e, Effect::Finished { .. })) <= 1);
        assert!(count(|e| matches!(e, Effect::StopServices)) <= 1);
        // Fixed shutdown order: StopServices < MonitorStopped < Finished, nothing after Finished,
        // and after MonitorStopped no renewal or insert is ever sent.
        let position = |f: fn(&Effect) -> bool| log.iter().position(f);
        let stop = position(|e| matches!(e, Effect::StopServices));
        let monitor = position(|e| matches!(e, Effect::MonitorStopped));
        let finished = position(|e| matches!(e, Effect::Finished { .. }));
        if let (Some(s), Some(m)) = (stop, monitor) { assert!(s < m); }
        if let Some(f) = finished {
            assert!(monitor.is_some_and(|m| m < f));
            assert_eq!(f, log.len() - 1);
        }
        if let Some(m) = monitor {
            assert!(!log[m..].iter().any(|e| matches!(e, Effect::CompareAndSwap { .. } | Effect::Insert { .. } | Effect::StartServices { .. })));
            // A started service set is always stopped before the monitor.
            if log[..m].iter().any(|e| matches!(e, Effect::StartServices { .. })) {
                assert!(stop.is_some_and(|s| s < m));
            }
        }
        if let Some(Effect::Finished { problem: reported }) = finished.map(|f| log[f]) {
            assert_eq!(reported, vvm.problem());
        }
        // The deadline is removed at most once, right before Finished, never after a loss.
        let disarm = position(|e| matches!(e, Effect::DisarmKiller));
        assert!(count(|e| matches!(e, Effect::DisarmKiller)) <= 1);
        if let Some(d) = disarm {
            assert_eq!(Some(d + 1), finished, "DisarmKiller right before Finished");
            assert!(!lost, "the killer was disarmed after a loss");
        }
    }
}
