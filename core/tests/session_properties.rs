//! Random event sequences into the session machine — stale and duplicated replies, forward time
//! jumps, errors, unknown outcomes, attaches and detaches, opens and closes at any moment — and
//! the rules that must hold after every step, judged from the effects alone.

use std::collections::{BTreeSet, HashMap};

use core::time::Duration;

use proptest::prelude::*;
use vvm_core::SessionEffect as E;
use vvm_core::*;

const ME: Incarnation = Incarnation(1);
const OTHER: Incarnation = Incarnation(2);
const STEPS_MAX: usize = 200;

#[derive(Clone, Debug)]
enum Step {
    Advance(u64),
    Open,
    Close,
    /// Fire a timer seen so far (index modulo their count) — never before it is due.
    Fire(usize),
    Reply(usize, ReplyKind),
    Attach(u32),
    Detach(u32),
    DetachUnused(u32),
}

#[derive(Clone, Copy, Debug)]
enum ReplyKind {
    Written(u8),
    Rejected,
    Held,
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
        Just(ReplyKind::Held),
        Just(ReplyKind::Deleted),
        (0u8..3).prop_map(ReplyKind::FoundOurs),
        Just(ReplyKind::FoundOther),
        Just(ReplyKind::FoundNone),
        Just(ReplyKind::Failed),
        Just(ReplyKind::Unknown),
    ];
    // Mostly a few small ids, so that duplicates and detaches of attached ones happen; now and
    // then one at or past the bound.
    let holding = prop_oneof![9 => 0u32..4, 1 => (HOLDINGS_MAX - 1)..(HOLDINGS_MAX + 2)];
    prop_oneof![
        3 => (0u64..12_000).prop_map(Step::Advance),
        1 => Just(Step::Open),
        1 => Just(Step::Close),
        3 => any::<usize>().prop_map(Step::Fire),
        6 => (any::<usize>(), reply).prop_map(|(i, r)| Step::Reply(i, r)),
        2 => holding.clone().prop_map(Step::Attach),
        1 => holding.clone().prop_map(Step::Detach),
        1 => holding.prop_map(Step::DetachUnused),
    ]
}

fn at(ms: u64) -> Instant {
    Instant::from_nanos(ms * 1_000_000)
}

/// What the test knows about the machine, from its effects alone.
#[derive(Default)]
struct World {
    now_ms: u64,
    /// Every store call emitted, for replies (stale ones included).
    ops: Vec<OpId>,
    /// Send time of the write each call stands for (a `Get` inherits the resolved write's).
    sent: HashMap<OpId, Instant>,
    /// Which calls belong to the keepalive path (a keepalive, or the read resolving one).
    keepalive_path: BTreeSet<OpId>,
    /// Send times of the keepalive path's calls.
    keepalive_calls: Vec<Instant>,
    timers: Vec<(TimerId, Instant)>,
    revision: u64,
    /// The call the machine waits for, as seen from outside.
    outstanding: Option<OpId>,
    /// The reply delivered by this step, if any.
    replied_to: Option<OpId>,
    /// Send time of the write behind the last Opened / KeptAlive.
    confirmed_send: Option<Instant>,
    last_deadline: Option<Instant>,
    /// Holdings the machine said it attached and the test has not detached.
    attached: BTreeSet<u32>,
    /// Whether the session was lost before the event observed.
    lost_before: bool,
    /// Since the loss, a holding that may have acted was detached.
    acted_since_loss: bool,
}

impl World {
    fn reply(&mut self, index: usize, kind: ReplyKind, live: Option<Liveness>) -> (OpId, Reply) {
        let op = self.ops[index % self.ops.len()];
        let mut ours = |bump: u8| {
            // A revision not above ours (bump 0) only for a keepalive of a live session.
            let bump = if live.is_some() { bump } else { bump.max(1) };
            let revision = if bump == 0 {
                live.map_or(self.revision, |live| live.revision.0)
            } else {
                self.revision + u64::from(bump)
            };
            self.revision = self.revision.max(revision);
            Revision(revision)
        };
        let reply = match kind {
            ReplyKind::Written(bump) => Reply::Written(ours(bump)),
            ReplyKind::Rejected => Reply::Rejected,
            ReplyKind::Held => Reply::Held(Duration::from_millis(300)),
            ReplyKind::Deleted => Reply::Deleted,
            ReplyKind::FoundOurs(bump) => Reply::Found(Some(Record {
                incarnation: ME,
                revision: ours(bump),
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
        (op, reply)
    }

    /// Records what the machine emitted for `event` and checks the rules.
    fn observe(&mut self, event: &SessionEvent, out: &SessionEffects, session: &Session) {
        let now = event.now();
        let lease = *session.lease();
        if self.replied_to.is_some() && self.replied_to == self.outstanding {
            self.outstanding = None;
        }
        let confirmed = out
            .iter()
            .any(|e| matches!(e, E::Opened { .. } | E::KeptAlive { .. }));
        let holdings_before = self.attached.len() as u32;
        let mut calls = 0;
        for effect in out {
            match *effect {
                E::Create { op, .. } | E::KeepAlive { op, .. } | E::Delete { op, .. } => {
                    calls += 1;
                    self.call(op, now);
                    if matches!(effect, E::KeepAlive { .. }) {
                        self.keepalive_path.insert(op);
                        self.keepalive_calls.push(now);
                    }
                    if matches!(effect, E::Create { .. }) {
                        assert_eq!(holdings_before, 0, "a new session opened over holdings");
                    }
                    if matches!(effect, E::Delete { .. }) {
                        assert_eq!(holdings_before, 0, "record deleted under holdings");
                    }
                }
                E::Get { op, .. } => {
                    calls += 1;
                    let resolved = self.replied_to.expect("a Get only follows a reply");
                    let sent = self.sent[&resolved];
                    self.call(op, sent);
                    self.sent.insert(op, sent);
                    if self.keepalive_path.contains(&resolved) {
                        self.keepalive_path.insert(op);
                        self.keepalive_calls.push(now);
                    }
                }
                E::SetTimer { timer, at } => self.timers.push((timer, at)),
                E::Opened { .. } | E::KeptAlive { .. } => {
                    let op = self.replied_to.expect("a confirmation follows a reply");
                    self.confirmed_send = Some(self.sent[&op]);
                }
                E::ArmKiller { at: deadline } => {
                    // covers: Session.DeadlineOnlyLaterOnConfirm
                    if let Some(previous) = self.last_deadline {
                        assert!(
                            deadline <= previous || confirmed,
                            "deadline moved later without a confirmed write: {event:?} -> {out:?}"
                        );
                    }
                    self.last_deadline = Some(deadline);
                }
                E::Lost { holdings, .. } => {
                    // covers: Session.LossOfAllHoldings
                    assert_eq!(holdings, holdings_before, "the loss counts every holding");
                }
                E::Attached { holding } => {
                    assert!(
                        session.liveness().is_some_and(|live| now < live.deadline),
                        "attached outside an alive session"
                    );
                    assert!(self.attached.insert(holding.0), "attached twice");
                }
                E::DisarmKiller => {
                    // covers: Session.NothingActingNoDeadline
                    let deleted = out
                        .iter()
                        .any(|e| matches!(e, E::Closed { deleted: true, .. }));
                    let lost_bare = out.iter().any(|e| matches!(e, E::Lost { holdings: 0, .. }));
                    let last_unused = matches!(event, SessionEvent::DetachUnused { holding, .. } if self.attached.contains(&holding.0))
                        && self.lost_before
                        && holdings_before == 1
                        && !self.acted_since_loss;
                    assert!(
                        deleted || lost_bare || last_unused,
                        "disarmed with something that may act, and no confirmed delete: {event:?} -> {out:?}"
                    );
                }
                _ => {}
            }
        }
        let disarmed = out.iter().any(|e| matches!(e, E::DisarmKiller));
        match *event {
            SessionEvent::Detach { holding, .. } => {
                if self.attached.remove(&holding.0) && self.lost_before {
                    self.acted_since_loss = true;
                }
            }
            SessionEvent::DetachUnused { holding, .. } => {
                let last = self.attached.remove(&holding.0) && self.attached.is_empty();
                // The other way round: nothing left that acted, so the deadline goes.
                assert_eq!(
                    disarmed,
                    last && self.lost_before && !self.acted_since_loss,
                    "an unused detach disarms exactly when it is the last after a loss with nothing that acted"
                );
            }
            _ => {
                if !self.lost_before && session.is_lost() {
                    self.acted_since_loss = false;
                    assert_eq!(
                        disarmed,
                        holdings_before == 0,
                        "a loss disarms exactly when nothing is attached"
                    );
                }
            }
        }
        // covers: Session.OneInFlight
        assert!(calls <= 1, "{calls} store calls in one step: {out:?}");
        assert_eq!(
            session.in_flight(),
            self.outstanding.is_some(),
            "in flight as seen from outside"
        );
        // covers: Session.KillDeadline
        if let Some(live) = session.liveness() {
            let send = self
                .confirmed_send
                .expect("alive implies a confirmed write");
            assert_eq!(live.anchor, send);
            assert!(live.deadline <= send + lease.kill_after());
            assert!(live.deadline < send + lease.lease());
            assert_eq!(Some(live.deadline), self.last_deadline);
        }
        assert_eq!(session.holdings(), self.attached.len() as u32);
        assert!(
            self.attached
                .iter()
                .all(|&h| session.is_attached(HoldingId(h))),
            "holdings as seen from outside"
        );
    }

    fn call(&mut self, op: OpId, sent: Instant) {
        assert_eq!(
            self.outstanding, None,
            "a store call sent while another is in flight"
        );
        self.outstanding = Some(op);
        self.ops.push(op);
        self.sent.insert(op, sent);
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

    // covers: Session.Invariants, Session.StaleReply, Session.OneInFlight, Session.CallsBound
    #[test]
    fn session_rules_hold_under_random_events(steps in prop::collection::vec(step(), 1..STEPS_MAX)) {
        let lease = LeaseConfig::new(Duration::from_secs(20)).unwrap();
        let mut session = Session::new(lease, ME);
        let mut world = World::default();
        let mut out = SessionEffects::new();
        for step in steps {
            out.clear();
            world.replied_to = None;
            let now = at(world.now_ms);
            let event = match step {
                Step::Advance(ms) => { world.now_ms += ms; continue; }
                Step::Open => SessionEvent::Open { now },
                Step::Close => SessionEvent::Close { now },
                Step::Fire(i) => {
                    if world.timers.is_empty() { continue; }
                    let (timer, due) = world.timers[i % world.timers.len()];
                    // A timer never fires early: time moves to its due time if need be.
                    world.now_ms = world.now_ms.max(due.as_nanos() / 1_000_000);
                    SessionEvent::Timer { now: at(world.now_ms).max(due), timer }
                }
                Step::Reply(i, kind) => {
                    if world.ops.is_empty() { continue; }
                    let (op, reply) = world.reply(i, kind, session.liveness());
                    world.replied_to = Some(op);
                    SessionEvent::Reply { now, op, reply }
                }
                Step::Attach(h) => SessionEvent::Attach { now, holding: HoldingId(h) },
                Step::Detach(h) => SessionEvent::Detach { now, holding: HoldingId(h) },
                Step::DetachUnused(h) => SessionEvent::DetachUnused { now, holding: HoldingId(h) },
            };
            world.lost_before = session.is_lost();
            let before = session.clone();
            session.handle(&event, &mut out);
            world.observe(&event, &out, &session);
            // A reply or firing no state waits for changes nothing.
            let awaited = world.replied_to.is_some_and(|op| Some(op) == before_outstanding(&before, op));
            if matches!(event, SessionEvent::Reply { .. }) && !awaited {
                prop_assert_eq!(&session, &before);
                prop_assert!(out.is_empty());
            }
        }
        // The keepalive path's calls within any one lease stay under the bound.
        let calls = &world.keepalive_calls;
        for &from in calls {
            let within = calls.iter().filter(|&&t| t >= from && t < from + lease.lease()).count();
            prop_assert!(within as u32 <= RENEWAL_CALLS_PER_LEASE_MAX, "{} calls within one lease", within);
        }
    }
}

/// `op` if `before` was waiting for it.
fn before_outstanding(before: &Session, op: OpId) -> Option<OpId> {
    use vvm_core::SessionState as S;
    let waited = match *before.state() {
        S::Opening { pending, .. }
        | S::OpenResolving { pending, .. }
        | S::KeepingAlive { pending, .. }
        | S::KeepResolving { pending, .. } => pending.op,
        S::Closing { op, .. } => op,
        _ => return None,
    };
    (waited == op).then_some(op)
}
