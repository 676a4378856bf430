//! One exact-effect test per transition of `specs/holding.md`: leadership of a slot held as a
//! holding of a session.

use core::time::Duration;

use vvm_core::*;

fn t0() -> Instant {
    Instant::from_nanos(1_000_000_000_000)
}

fn insert(op: u64, slot: u32) -> Effect {
    Effect::Insert {
        op: OpId(op),
        slot: Slot(slot),
        ttl: Duration::ZERO,
    }
}

fn cad(op: u64, slot: u32, expected: u64) -> Effect {
    Effect::CompareAndDelete {
        op: OpId(op),
        slot: Slot(slot),
        expected: Revision(expected),
    }
}

fn token(slot: u32, revision: u64) -> FencingToken {
    FencingToken {
        slot: Slot(slot),
        revision: Revision(revision),
    }
}

struct Harness {
    machine: SessionLeadership,
    out: Effects,
}

impl Harness {
    fn new() -> Self {
        Harness {
            machine: SessionLeadership::new(),
            out: Effects::new(),
        }
    }

    fn on(&mut self, event: HoldingEvent) -> Vec<Effect> {
        self.out.clear();
        self.machine.handle(&event, &mut self.out);
        self.out.as_slice().to_vec()
    }

    fn acquire(&mut self, slot: u32) -> Vec<Effect> {
        self.on(HoldingEvent::Acquire {
            now: t0(),
            slot: Slot(slot),
        })
    }

    fn reply(&mut self, op: u64, reply: Reply) -> Vec<Effect> {
        self.on(HoldingEvent::Reply {
            now: t0(),
            op: OpId(op),
            reply,
        })
    }

    fn release(&mut self) -> Vec<Effect> {
        self.on(HoldingEvent::Release { now: t0() })
    }

    fn lose(&mut self, reason: LossReason) -> Vec<Effect> {
        self.on(HoldingEvent::SessionLost { now: t0(), reason })
    }

    fn vanish(&mut self) -> Vec<Effect> {
        self.on(HoldingEvent::Vanished { now: t0() })
    }

    /// Holding slot 2 at revision 7 (acquire op 1).
    fn holding() -> Self {
        let mut h = Harness::new();
        h.acquire(2);
        h.reply(1, Reply::Written(Revision(7)));
        h
    }
}

// covers: Holding.AcquireThroughSession
#[test]
fn h1_acquire_is_one_insert_without_a_time_to_live() {
    let mut h = Harness::new();
    assert_eq!(h.acquire(3), [insert(1, 3)]);
    assert!(h.machine.in_flight());
    // Acquire outside Idle is ignored (H14).
    assert_eq!(h.acquire(4), []);
}

// covers: Holding.Release
#[test]
fn h2_release_while_idle_finishes_at_once() {
    let mut h = Harness::new();
    assert_eq!(
        h.release(),
        [Effect::Released {
            slot: None,
            deleted: false
        }]
    );
    assert!(h.machine.is_idle());
}

// covers: Holding.AcquireThroughSession, Holding.Token, Holding.NoRenewal
#[test]
fn h3_written_acquire_is_held_with_the_revision_as_token_and_nothing_else() {
    let mut h = Harness::new();
    h.acquire(2);
    assert_eq!(
        h.reply(1, Reply::Written(Revision(7))),
        [Effect::Acquired { token: token(2, 7) }]
    );
    assert_eq!(h.machine.token(), Some(token(2, 7)));
    assert!(h.machine.is_held());
    assert!(!h.machine.in_flight());
}

// covers: Holding.ReleaseDuringAcquire
#[test]
fn h4_h8_release_asked_during_the_acquire_deletes_what_it_wrote() {
    let mut h = Harness::new();
    h.acquire(2);
    assert_eq!(h.release(), []);
    assert_eq!(h.reply(1, Reply::Written(Revision(7))), [cad(2, 2, 7)]);
    assert!(h.machine.is_releasing());
    assert_eq!(
        h.machine.token(),
        None,
        "no token for a holding being released"
    );
    assert_eq!(
        h.reply(2, Reply::Deleted),
        [Effect::Released {
            slot: Some(Slot(2)),
            deleted: true
        }]
    );
}

// covers: Holding.LossFromSession
#[test]
fn h5_h9_an_acquire_written_after_the_session_was_lost_is_not_acted_on() {
    let mut h = Harness::new();
    h.acquire(2);
    assert_eq!(h.lose(LossReason::Overtaken), []);
    assert_eq!(
        h.reply(1, Reply::Written(Revision(7))),
        [Effect::NotAcquired {
            slot: Slot(2),
            refusal: Refusal::StoreFailed
        }]
    );
    assert_eq!(h.machine.token(), None);
    assert!(h.machine.is_idle());
}

// covers: Holding.ReleaseDuringAcquire
#[test]
fn h4_release_wins_over_a_loss_noted_during_the_acquire() {
    let mut h = Harness::new();
    h.acquire(2);
    h.lose(LossReason::RenewalFailed);
    h.release();
    assert_eq!(h.reply(1, Reply::Written(Revision(7))), [cad(2, 2, 7)]);
}

// covers: Holding.AcquireThroughSession
#[test]
fn h6_refused_acquire_is_not_acquired_as_held() {
    for reply in [Reply::Rejected, Reply::Held(Duration::from_secs(3))] {
        let mut h = Harness::new();
        h.acquire(2);
        assert_eq!(
            h.reply(1, reply),
            [Effect::NotAcquired {
                slot: Slot(2),
                refusal: Refusal::Held
            }]
        );
        assert!(h.machine.is_idle());
    }
    let mut h = Harness::new();
    h.acquire(2);
    h.release();
    assert_eq!(
        h.reply(1, Reply::Rejected),
        [
            Effect::NotAcquired {
                slot: Slot(2),
                refusal: Refusal::Held
            },
            Effect::Released {
                slot: Some(Slot(2)),
                deleted: false
            }
        ]
    );
}

// covers: Holding.AcquireThroughSession
#[test]
fn h7_failed_or_unknown_acquire_is_not_acquired_and_not_read_back() {
    let stray = Reply::Found(Some(Record {
        incarnation: Incarnation(1),
        revision: Revision(1),
    }));
    for reply in [Reply::Failed, Reply::Unknown, Reply::Deleted, stray] {
        let mut h = Harness::new();
        h.acquire(2);
        assert_eq!(
            h.reply(1, reply),
            [Effect::NotAcquired {
                slot: Slot(2),
                refusal: Refusal::StoreFailed
            }],
            "{reply:?}"
        );
        assert!(h.machine.is_idle());
    }
}

// covers: Holding.LossFromSession
#[test]
fn h10_a_lost_session_loses_the_holding_with_its_reason_and_deletes_nothing() {
    let mut h = Harness::holding();
    assert_eq!(
        h.lose(LossReason::RenewalFailed),
        [Effect::Lost {
            slot: Slot(2),
            reason: LossReason::RenewalFailed
        }]
    );
    assert_eq!(h.machine.token(), None);
    // A release afterwards deletes nothing: the record went with the session.
    assert_eq!(
        h.release(),
        [Effect::Released {
            slot: None,
            deleted: false
        }]
    );
}

// covers: Holding.Release
#[test]
fn h11_h12_release_deletes_the_holding_at_its_revision() {
    let mut h = Harness::holding();
    assert_eq!(h.release(), [cad(2, 2, 7)]);
    assert_eq!(h.release(), [], "a second release while deleting (H14)");
    assert_eq!(
        h.reply(2, Reply::Rejected),
        [Effect::Released {
            slot: Some(Slot(2)),
            deleted: false
        }]
    );
    assert!(h.machine.is_idle());
}

// covers: Holding.LossFromSession
#[test]
fn h13_a_loss_while_idle_or_releasing_changes_nothing() {
    let mut h = Harness::new();
    assert_eq!(h.lose(LossReason::Overtaken), []);
    let mut h = Harness::holding();
    h.release();
    assert_eq!(h.lose(LossReason::Overtaken), []);
    assert_eq!(
        h.reply(2, Reply::Deleted),
        [Effect::Released {
            slot: Some(Slot(2)),
            deleted: true
        }]
    );
}

// covers: Holding.Vanished
#[test]
fn h15_a_record_removed_from_outside_loses_the_holding_at_once_and_deletes_nothing() {
    let mut h = Harness::holding();
    assert_eq!(
        h.vanish(),
        [Effect::Lost {
            slot: Slot(2),
            reason: LossReason::Overtaken
        }]
    );
    assert_eq!(h.machine.token(), None);
    assert!(h.machine.is_idle());
    assert_eq!(
        h.release(),
        [Effect::Released {
            slot: None,
            deleted: false
        }],
        "nothing of ours is left to delete"
    );
}

// covers: Holding.Vanished
#[test]
fn h16_a_vanished_record_changes_nothing_while_idle_acquiring_or_releasing() {
    let mut h = Harness::new();
    assert_eq!(h.vanish(), []);
    h.acquire(2);
    assert_eq!(h.vanish(), [], "the acquire's reply decides");
    assert_eq!(
        h.reply(1, Reply::Written(Revision(7))),
        [Effect::Acquired { token: token(2, 7) }]
    );
    h.release();
    assert_eq!(h.vanish(), [], "a release finishes by its reply");
    assert_eq!(
        h.reply(2, Reply::Deleted),
        [Effect::Released {
            slot: Some(Slot(2)),
            deleted: true
        }]
    );
}

// covers: Holding.StaleReply
#[test]
fn h14_stale_replies_are_ignored_in_every_state() {
    let mut h = Harness::new();
    assert_eq!(h.reply(9, Reply::Written(Revision(1))), []);
    h.acquire(2);
    assert_eq!(h.reply(9, Reply::Written(Revision(1))), []);
    h.reply(1, Reply::Written(Revision(7)));
    assert_eq!(h.reply(1, Reply::Written(Revision(8))), []);
    assert_eq!(h.machine.token(), Some(token(2, 7)));
    h.release();
    assert_eq!(h.reply(1, Reply::Deleted), []);
    assert!(h.machine.is_releasing());
}

// covers: Holding.NoRenewal
#[test]
fn no_event_in_any_state_writes_a_timer_a_swap_a_read_or_a_kill_deadline() {
    let replies = [
        Reply::Written(Revision(7)),
        Reply::Rejected,
        Reply::Held(Duration::from_secs(1)),
        Reply::Deleted,
        Reply::Found(None),
        Reply::Failed,
        Reply::Unknown,
    ];
    // Every sequence of three events out of a small alphabet, from idle.
    let mut alphabet = vec![
        HoldingEvent::Acquire {
            now: t0(),
            slot: Slot(1),
        },
        HoldingEvent::Release { now: t0() },
        HoldingEvent::SessionLost {
            now: t0(),
            reason: LossReason::Overtaken,
        },
    ];
    for op in 1..=2 {
        for reply in replies {
            alphabet.push(HoldingEvent::Reply {
                now: t0(),
                op: OpId(op),
                reply,
            });
        }
    }
    let mut seen = 0;
    for a in &alphabet {
        for b in &alphabet {
            for c in &alphabet {
                let mut h = Harness::new();
                for event in [a, b, c] {
                    for effect in h.on(*event) {
                        seen += 1;
                        assert!(
                            !matches!(
                                effect,
                                Effect::SetTimer { .. }
                                    | Effect::CompareAndSwap { .. }
                                    | Effect::Get { .. }
                                    | Effect::ArmKiller { .. }
                                    | Effect::DisarmKiller
                                    | Effect::Renewed { .. }
                            ),
                            "{effect:?} after {a:?}, {b:?}, {c:?}"
                        );
                    }
                }
            }
        }
    }
    assert!(seen > 0, "the sequences produced effects to check");
}

#[test]
fn the_doc_comment_table_is_the_spec_table() {
    let table = |text: &str, prefix: &str| -> Vec<String> {
        text.lines()
            .filter_map(|line| line.strip_prefix(prefix))
            .filter(|line| line.starts_with('|'))
            .map(str::to_owned)
            .collect()
    };
    let doc = table(include_str!("../src/holding/mod.rs"), "//! ");
    let spec = table(include_str!("../../specs/holding.md"), "");
    assert!(doc.len() > 10, "the table was found");
    assert_eq!(doc, spec);
}
