//! One exact-effect test per transition of `specs/session.md`. Operation, timer and session ids
//! are deterministic (counters in the machine), so every expectation is the complete effect list.
//!
//! Times for `L = 20 s`: keepalive `L/4` = 5 s, kill deadline `0.8·L` = 16 s, guard `0.75·L` =
//! 15 s, retries 1 s, 2 s, then 4 s, store-call timeout 0.5 s.

use core::time::Duration;

use vvm_core::SessionEffect as E;
use vvm_core::*;

const ME: Incarnation = Incarnation(0xA11CE);
const OTHER: Incarnation = Incarnation(0xB0B);
const ID: SessionId = SessionId(1);

fn secs(s: u64) -> Duration {
    Duration::from_secs(s)
}

fn ms(ms: u64) -> Duration {
    Duration::from_millis(ms)
}

/// `t0` for every test: well away from the origin so that earlier-than-t0 bugs show.
fn t0() -> Instant {
    Instant::from_nanos(1_000_000_000_000)
}

fn timer(seq: u64) -> TimerId {
    TimerId {
        kind: TimerKind::Lease,
        seq,
    }
}

fn ours(revision: u64) -> Reply {
    Reply::Found(Some(Record {
        incarnation: ME,
        revision: Revision(revision),
    }))
}

fn theirs(revision: u64) -> Reply {
    Reply::Found(Some(Record {
        incarnation: OTHER,
        revision: Revision(revision),
    }))
}

fn keep_alive(op: u64, expected: u64) -> SessionEffect {
    E::KeepAlive {
        op: OpId(op),
        id: ID,
        expected: Revision(expected),
        ttl: secs(20),
    }
}

fn delete(op: u64, expected: u64) -> SessionEffect {
    E::Delete {
        op: OpId(op),
        id: ID,
        expected: Revision(expected),
    }
}

fn lost(reason: LossReason, holdings: u32) -> SessionEffect {
    E::Lost {
        id: ID,
        reason,
        holdings,
    }
}

const CLOSED_NOTHING_DELETED: SessionEffect = E::Closed {
    id: Some(ID),
    deleted: false,
};

struct Harness {
    machine: Session,
    out: SessionEffects,
}

impl Harness {
    fn new() -> Self {
        Harness {
            machine: Session::new(LeaseConfig::default(), ME),
            out: SessionEffects::new(),
        }
    }

    fn on(&mut self, event: SessionEvent) -> Vec<SessionEffect> {
        self.out.clear();
        self.machine.handle(&event, &mut self.out);
        self.out.as_slice().to_vec()
    }

    fn reply(&mut self, now: Instant, op: u64, reply: Reply) -> Vec<SessionEffect> {
        self.on(SessionEvent::Reply {
            now,
            op: OpId(op),
            reply,
        })
    }

    fn fire(&mut self, now: Instant, seq: u64) -> Vec<SessionEffect> {
        self.on(SessionEvent::Timer {
            now,
            timer: timer(seq),
        })
    }

    fn open(&mut self, now: Instant) -> Vec<SessionEffect> {
        self.on(SessionEvent::Open { now })
    }

    fn close(&mut self, now: Instant) -> Vec<SessionEffect> {
        self.on(SessionEvent::Close { now })
    }

    fn attach(&mut self, now: Instant, holding: u32) -> Vec<SessionEffect> {
        self.on(SessionEvent::Attach {
            now,
            holding: HoldingId(holding),
        })
    }

    fn detach(&mut self, now: Instant, holding: u32) -> Vec<SessionEffect> {
        self.on(SessionEvent::Detach {
            now,
            holding: HoldingId(holding),
        })
    }

    fn detach_unused(&mut self, now: Instant, holding: u32) -> Vec<SessionEffect> {
        self.on(SessionEvent::DetachUnused {
            now,
            holding: HoldingId(holding),
        })
    }

    /// Open at t0 (create op 1), confirmed as revision 5: keepalive timer 2 at t0 + 5 s.
    fn alive() -> Self {
        let mut h = Harness::new();
        h.open(t0());
        h.reply(t0() + ms(10), 1, Reply::Written(Revision(5)));
        h
    }

    /// Alive with holdings 0 and 1 attached.
    fn holding_two() -> Self {
        let mut h = Harness::alive();
        h.attach(t0() + ms(20), 0);
        h.attach(t0() + ms(20), 1);
        h
    }

    /// Alive, then the keepalive (op 3) sent at t0 + 5 s.
    fn keeping_alive() -> Self {
        let mut h = Harness::alive();
        h.fire(t0() + secs(5), 2);
        h
    }

    /// Keeping alive, the keepalive failed at t0 + 5 s: retry timer 4 at t0 + 6 s.
    fn retry_wait() -> Self {
        let mut h = Harness::keeping_alive();
        h.reply(t0() + secs(5), 3, Reply::Failed);
        h
    }

    /// Keeping alive, the keepalive's outcome unknown: `Get` op 4 in flight.
    fn keep_resolving() -> Self {
        let mut h = Harness::keeping_alive();
        h.reply(t0() + secs(5), 3, Reply::Unknown);
        h
    }
}

// covers: Session.Open, Session.FreshId
#[test]
fn s1_open_from_closed_creates_a_record_under_a_fresh_id_with_the_lease_as_ttl() {
    let mut h = Harness::new();
    assert_eq!(
        h.open(t0()),
        [E::Create {
            op: OpId(1),
            id: ID,
            ttl: secs(20)
        }]
    );
    assert!(h.machine.in_flight());
    assert_eq!(h.machine.id(), Some(ID));
}

// covers: Session.FreshId
#[test]
fn s1_a_machine_made_after_an_id_opens_under_the_next_one() {
    let lease = LeaseConfig::new(secs(20)).expect("valid");
    let mut machine = Session::after(lease, Incarnation(7), SessionId(41));
    let mut out = SessionEffects::new();
    machine.handle(&SessionEvent::Open { now: t0() }, &mut out);
    assert_eq!(
        out.as_slice(),
        [E::Create {
            op: OpId(1),
            id: SessionId(42),
            ttl: secs(20)
        }]
    );
}

// covers: Session.FreshId, Session.LossOfAllHoldings
#[test]
fn s1_open_after_a_loss_uses_the_next_id() {
    let mut h = Harness::keeping_alive();
    h.reply(t0() + secs(5), 3, Reply::Rejected);
    assert!(h.machine.is_lost());
    assert_eq!(
        h.open(t0() + secs(6)),
        [E::Create {
            op: OpId(4),
            id: SessionId(2),
            ttl: secs(20)
        }]
    );
}

// covers: Session.FreshId
#[test]
fn s1_open_after_a_close_uses_the_next_id() {
    let mut h = Harness::alive();
    h.close(t0() + secs(1));
    h.reply(t0() + secs(1), 3, Reply::Deleted);
    assert!(h.machine.is_closed());
    let effects = h.open(t0() + secs(2));
    assert!(
        matches!(
            effects[..],
            [E::Create {
                id: SessionId(2),
                ..
            }]
        ),
        "{effects:?}"
    );
}

// covers: Session.LossOfAllHoldings
#[test]
fn s2_a_lost_session_opens_anew_only_once_every_holding_is_detached() {
    let mut h = Harness::holding_two();
    h.fire(t0() + secs(5), 2);
    assert_eq!(
        h.reply(t0() + secs(5), 3, Reply::Rejected),
        [lost(LossReason::Overtaken, 2)]
    );
    assert_eq!(
        h.open(t0() + secs(6)),
        [E::NotOpened {
            id: ID,
            refusal: OpenRefusal::HoldingsRemain
        }]
    );
    assert_eq!(h.detach(t0() + secs(7), 1), []);
    assert!(!h
        .open(t0() + secs(7))
        .iter()
        .any(|e| matches!(e, E::Create { .. })));
    assert_eq!(h.detach(t0() + secs(8), 0), []);
    assert_eq!(
        h.open(t0() + secs(8)),
        [E::Create {
            op: OpId(4),
            id: SessionId(2),
            ttl: secs(20)
        }]
    );
}

// covers: Session.Close
#[test]
fn s3_close_without_a_session_reports_closed_at_once() {
    let mut h = Harness::new();
    assert_eq!(
        h.close(t0()),
        [E::Closed {
            id: None,
            deleted: false
        }]
    );
    assert!(h.machine.is_closed());
}

// covers: Session.Open, Session.KillDeadline, Session.KeepAliveInterval
#[test]
fn s4_created_session_arms_the_killer_from_the_send_time_and_the_keepalive_timer() {
    let mut h = Harness::new();
    h.open(t0());
    // The reply arrives 3 s after the send: the deadline is still anchored to the send.
    assert_eq!(
        h.reply(t0() + secs(3), 1, Reply::Written(Revision(5))),
        [
            E::ArmKiller {
                at: t0() + secs(16)
            },
            E::Opened {
                id: ID,
                revision: Revision(5)
            },
            E::SetTimer {
                timer: timer(2),
                at: t0() + secs(5)
            },
        ]
    );
    assert_eq!(h.machine.revision(), Some(Revision(5)));
    assert_eq!(h.machine.deadline(), Some(t0() + secs(16)));
    assert_eq!(
        h.machine.liveness().map(|live| live.anchor),
        Some(t0()),
        "anchored to the send"
    );
}

// covers: Session.CloseDuringOp, Session.Close
#[test]
fn s5_close_asked_during_the_create_deletes_the_record_once_it_is_confirmed() {
    let mut h = Harness::new();
    h.open(t0());
    assert_eq!(h.close(t0() + ms(1)), []);
    // Confirmed after the close was asked: deleted at once, the killer not armed.
    assert_eq!(
        h.reply(t0() + ms(5), 1, Reply::Written(Revision(5))),
        [delete(2, 5)]
    );
    assert_eq!(
        h.reply(t0() + ms(9), 2, Reply::Deleted),
        [
            E::DisarmKiller,
            E::Closed {
                id: Some(ID),
                deleted: true
            }
        ]
    );
    assert!(h.machine.is_closed());
}

// covers: Session.CloseDuringOp
#[test]
fn s5_close_asked_during_a_keepalive_deletes_with_the_new_revision() {
    let mut h = Harness::keeping_alive();
    assert_eq!(h.close(t0() + secs(5) + ms(1)), []);
    assert_eq!(
        h.reply(t0() + secs(5) + ms(5), 3, Reply::Written(Revision(6))),
        [delete(4, 6)]
    );
}

// covers: Session.Open
#[test]
fn s6_create_refused_means_the_id_is_taken() {
    for reply in [Reply::Rejected, Reply::Held(secs(3))] {
        let mut h = Harness::new();
        h.open(t0());
        assert_eq!(
            h.reply(t0() + ms(5), 1, reply),
            [E::NotOpened {
                id: ID,
                refusal: OpenRefusal::Taken
            }],
            "{reply:?}"
        );
        assert!(h.machine.is_closed());
    }
    // With a close asked meanwhile, the close finishes too.
    let mut h = Harness::new();
    h.open(t0());
    h.close(t0());
    assert_eq!(
        h.reply(t0() + ms(5), 1, Reply::Rejected),
        [
            E::NotOpened {
                id: ID,
                refusal: OpenRefusal::Taken
            },
            CLOSED_NOTHING_DELETED
        ]
    );
}

// covers: Session.Open
#[test]
fn s7_create_failed_means_no_session() {
    for reply in [Reply::Failed, Reply::Deleted, Reply::Found(None)] {
        let mut h = Harness::new();
        h.open(t0());
        assert_eq!(
            h.reply(t0() + ms(5), 1, reply),
            [E::NotOpened {
                id: ID,
                refusal: OpenRefusal::StoreFailed
            }],
            "{reply:?}"
        );
        assert!(h.machine.is_closed());
    }
}

// covers: Session.UnknownOutcome
#[test]
fn s8_create_with_an_unknown_outcome_is_read_back() {
    let mut h = Harness::new();
    h.open(t0());
    assert_eq!(
        h.reply(t0() + ms(500), 1, Reply::Unknown),
        [E::Get {
            op: OpId(2),
            id: ID
        }]
    );
    assert!(h.machine.in_flight());
}

// covers: Session.UnknownOutcome, Session.KillDeadline, Session.DeadlineOnlyLaterOnConfirm
#[test]
fn s9_create_read_back_as_ours_opens_anchored_to_the_create_send_time() {
    let mut h = Harness::new();
    h.open(t0());
    h.reply(t0() + ms(500), 1, Reply::Unknown);
    assert_eq!(
        h.reply(t0() + secs(1), 2, ours(7)),
        [
            E::ArmKiller {
                at: t0() + secs(16)
            },
            E::Opened {
                id: ID,
                revision: Revision(7)
            },
            E::SetTimer {
                timer: timer(3),
                at: t0() + secs(5)
            },
        ]
    );
    // With a close asked meanwhile: that very record is deleted.
    let mut h = Harness::new();
    h.open(t0());
    h.reply(t0() + ms(500), 1, Reply::Unknown);
    h.close(t0() + ms(600));
    assert_eq!(h.reply(t0() + secs(1), 2, ours(7)), [delete(3, 7)]);
}

// covers: Session.UnknownOutcome
#[test]
fn s10_create_read_back_as_someone_elses_means_taken() {
    let mut h = Harness::new();
    h.open(t0());
    h.reply(t0() + ms(500), 1, Reply::Unknown);
    assert_eq!(
        h.reply(t0() + secs(1), 2, theirs(7)),
        [E::NotOpened {
            id: ID,
            refusal: OpenRefusal::Taken
        }]
    );
    assert!(h.machine.is_closed());
}

// covers: Session.UnknownOutcome
#[test]
fn s11_create_read_back_as_absent_or_unreadable_means_no_session() {
    for reply in [
        Reply::Found(None),
        Reply::Failed,
        Reply::Unknown,
        Reply::Written(Revision(9)),
    ] {
        let mut h = Harness::new();
        h.open(t0());
        h.reply(t0() + ms(500), 1, Reply::Unknown);
        assert_eq!(
            h.reply(t0() + secs(1), 2, reply),
            [E::NotOpened {
                id: ID,
                refusal: OpenRefusal::StoreFailed
            }],
            "{reply:?}"
        );
    }
}

// covers: Session.CloseDuringOp, Session.Attach
#[test]
fn s12_close_during_a_call_is_noted_and_attaching_is_refused_from_then_on() {
    let mut h = Harness::keeping_alive();
    assert_eq!(h.close(t0() + secs(5)), []);
    assert_eq!(
        h.attach(t0() + secs(5), 0),
        [E::AttachRefused {
            holding: HoldingId(0),
            refusal: AttachRefusal::Closing
        }]
    );
    let mut h = Harness::keep_resolving();
    assert_eq!(h.close(t0() + secs(5)), []);
    assert_eq!(h.reply(t0() + secs(5), 4, Reply::Failed), [delete(5, 5)]);
}

// covers: Session.Close, Session.LossOfAllHoldings
#[test]
fn s13_close_with_holdings_attached_is_refused_in_every_state_that_can_have_them() {
    let refused = [E::CloseRefused {
        id: ID,
        holdings: 2,
    }];
    // Alive.
    let mut h = Harness::holding_two();
    let before = h.machine.clone();
    assert_eq!(h.close(t0() + secs(1)), refused);
    assert_eq!(h.machine, before, "a refused close changes nothing");
    // KeepingAlive: refused, and not noted for later either.
    h.fire(t0() + secs(5), 2);
    assert_eq!(h.close(t0() + secs(5)), refused);
    assert_eq!(h.reply(t0() + secs(5), 3, Reply::Unknown).len(), 1);
    // KeepResolving.
    assert_eq!(h.close(t0() + secs(5)), refused);
    h.reply(t0() + secs(5), 4, Reply::Failed);
    // RetryWait.
    assert_eq!(h.close(t0() + secs(5)), refused);
    // Lost.
    h.fire(t0() + secs(6), 5);
    h.reply(t0() + secs(6), 6, Reply::Rejected);
    assert!(h.machine.is_lost());
    assert_eq!(h.close(t0() + secs(7)), refused);
    assert_eq!(h.machine.holdings(), 2);
}

// covers: Session.KeepAliveInterval, Session.CostGrowth
#[test]
fn s14_keepalive_timer_sends_one_call_on_our_revision() {
    let mut h = Harness::alive();
    assert_eq!(h.fire(t0() + secs(5), 2), [keep_alive(3, 5)]);
    // Sending does not move the deadline.
    assert_eq!(h.machine.deadline(), Some(t0() + secs(16)));
}

// covers: Session.PreKeepAliveGuard
#[test]
fn s14_pre_keepalive_guard_only_moves_the_deadline_earlier() {
    let mut h = Harness::alive();
    // A timer firing early (0.5 s after the send): now + 0.75·L is before the deadline.
    assert_eq!(
        h.fire(t0() + ms(500), 2),
        [
            E::ArmKiller {
                at: t0() + ms(15_500)
            },
            keep_alive(3, 5)
        ]
    );
    assert_eq!(h.machine.deadline(), Some(t0() + ms(15_500)));
}

// covers: Session.KeepAliveInterval, Session.KillDeadline, Session.DeadlineOnlyLaterOnConfirm
#[test]
fn s15_confirmed_keepalive_moves_the_deadline_to_its_send_time_plus_0_8_l() {
    let mut h = Harness::keeping_alive();
    let sent = t0() + secs(5);
    assert_eq!(
        h.reply(sent + secs(2), 3, Reply::Written(Revision(6))),
        [
            E::ArmKiller {
                at: sent + secs(16)
            },
            E::KeptAlive {
                id: ID,
                revision: Revision(6)
            },
            E::SetTimer {
                timer: timer(4),
                at: sent + secs(5)
            },
        ]
    );
    assert_eq!(h.machine.revision(), Some(Revision(6)));
    // A store that keeps the record's revision across a keepalive (etcd's lease keepalive)
    // confirms it just the same.
    let mut h = Harness::keeping_alive();
    assert_eq!(
        h.reply(sent + secs(2), 3, Reply::Written(Revision(5))),
        [
            E::ArmKiller {
                at: sent + secs(16)
            },
            E::KeptAlive {
                id: ID,
                revision: Revision(5)
            },
            E::SetTimer {
                timer: timer(4),
                at: sent + secs(5)
            },
        ]
    );
}

// covers: Session.LossOfAllHoldings, Session.CostGrowth
#[test]
fn s16_rejected_keepalive_loses_every_holding_with_one_effect_and_deletes_nothing() {
    let mut h = Harness::holding_two();
    h.fire(t0() + secs(5), 2);
    assert_eq!(
        h.reply(t0() + secs(5), 3, Reply::Rejected),
        [lost(LossReason::Overtaken, 2)]
    );
    assert!(h.machine.is_lost() && !h.machine.in_flight());
    // The holdings stay until the runtime detaches them; nothing more may attach.
    assert!(h.machine.is_attached(HoldingId(0)) && h.machine.is_attached(HoldingId(1)));
    assert_eq!(
        h.attach(t0() + secs(5), 2),
        [E::AttachRefused {
            holding: HoldingId(2),
            refusal: AttachRefusal::NotAlive
        }]
    );
    // With a close asked meanwhile (no holdings), the close ends at once, deleting nothing.
    let mut h = Harness::keeping_alive();
    h.close(t0() + secs(5));
    assert_eq!(
        h.reply(t0() + secs(5), 3, Reply::Rejected),
        [
            E::DisarmKiller,
            lost(LossReason::Overtaken, 0),
            CLOSED_NOTHING_DELETED
        ]
    );
    assert!(h.machine.is_closed());
}

// covers: Session.Retry, Session.DeadlineOnlyLaterOnConfirm
#[test]
fn s17_failed_keepalive_waits_l_over_20_and_keeps_the_deadline() {
    for reply in [
        Reply::Failed,
        Reply::Written(Revision(4)),
        Reply::Deleted,
        Reply::Found(None),
        Reply::Held(secs(1)),
    ] {
        let mut h = Harness::keeping_alive();
        let now = t0() + secs(5) + ms(100);
        assert_eq!(
            h.reply(now, 3, reply),
            [E::SetTimer {
                timer: timer(4),
                at: now + secs(1)
            }],
            "{reply:?}"
        );
        assert_eq!(h.machine.deadline(), Some(t0() + secs(16)));
        assert_eq!(h.fire(now + secs(1), 4), [keep_alive(5, 5)]);
    }
}

// covers: Session.Retry, Session.RetryUntilDeadline, Session.LossOfAllHoldings
#[test]
fn s18_keepalive_failing_until_the_deadline_cannot_be_met_loses_the_session() {
    let mut h = Harness::holding_two();
    let mut now = t0() + secs(5);
    h.fire(now, 2);
    let (mut op, mut seq) = (3, 4);
    // Backoffs 1, 2, 4 s: retries at 6, 8, 12 s; the one after would be sent at 16 s.
    for backoff in [1, 2, 4] {
        assert_eq!(
            h.reply(now, op, Reply::Failed),
            [E::SetTimer {
                timer: timer(seq),
                at: now + secs(backoff)
            }]
        );
        now = now + secs(backoff);
        assert_eq!(h.fire(now, seq), [keep_alive(op + 2, 5)]);
        op += 2;
        seq += 2;
    }
    assert_eq!(now, t0() + secs(12));
    assert_eq!(
        h.reply(now, op, Reply::Failed),
        [lost(LossReason::RenewalFailed, 2)]
    );
    assert!(h.machine.is_lost());
}

// covers: Session.RetryUntilDeadline
#[test]
fn s17_a_retry_is_scheduled_only_if_its_answer_can_come_before_the_deadline() {
    // Failed at 14.4 s: retry at 15.4 s + 0.5 s timeout = 15.9 s < 16 s: scheduled.
    let mut h = Harness::keeping_alive();
    let now = t0() + ms(14_400);
    assert_eq!(
        h.reply(now, 3, Reply::Failed),
        [E::SetTimer {
            timer: timer(4),
            at: now + secs(1)
        }]
    );
    // Failed at 14.5 s: 15.5 s + 0.5 s = 16 s, not before the deadline: lost.
    let mut h = Harness::keeping_alive();
    assert_eq!(
        h.reply(t0() + ms(14_500), 3, Reply::Failed),
        [E::DisarmKiller, lost(LossReason::RenewalFailed, 0)]
    );
}

// covers: Session.CloseDuringOp
#[test]
fn s19_failed_keepalive_with_close_asked_closes_instead_of_retrying() {
    let mut h = Harness::keeping_alive();
    h.close(t0() + secs(5));
    assert_eq!(h.reply(t0() + secs(5), 3, Reply::Failed), [delete(4, 5)]);
    assert_eq!(
        h.reply(t0() + secs(5), 4, Reply::Deleted),
        [
            E::DisarmKiller,
            E::Closed {
                id: Some(ID),
                deleted: true
            }
        ]
    );
}

// covers: Session.UnknownOutcome
#[test]
fn s20_keepalive_with_an_unknown_outcome_is_read_back() {
    let mut h = Harness::keeping_alive();
    assert_eq!(
        h.reply(t0() + secs(5) + ms(500), 3, Reply::Unknown),
        [E::Get {
            op: OpId(4),
            id: ID
        }]
    );
    assert_eq!(h.machine.deadline(), Some(t0() + secs(16)));
}

// covers: Session.UnknownOutcome, Session.Retry, Session.DeadlineOnlyLaterOnConfirm
#[test]
fn s21_keepalive_read_back_as_committed_confirms_nothing_and_retries_from_the_revision_found() {
    let mut h = Harness::keep_resolving();
    let now = t0() + secs(6);
    assert_eq!(
        h.reply(now, 4, ours(9)),
        [E::SetTimer {
            timer: timer(5),
            at: now + secs(1)
        }]
    );
    assert_eq!(h.machine.revision(), Some(Revision(9)));
    assert_eq!(
        h.machine.deadline(),
        Some(t0() + secs(16)),
        "not moved: unconfirmed"
    );
    assert_eq!(h.fire(now + secs(1), 5), [keep_alive(6, 9)]);
}

// covers: Session.UnknownOutcome, Session.Retry
#[test]
fn s22_keepalive_read_back_as_unchanged_or_unreadable_retries() {
    for reply in [ours(5), ours(4), Reply::Failed, Reply::Unknown] {
        let mut h = Harness::keep_resolving();
        let now = t0() + secs(6);
        assert_eq!(
            h.reply(now, 4, reply),
            [E::SetTimer {
                timer: timer(5),
                at: now + secs(1)
            }],
            "{reply:?}"
        );
        assert_eq!(h.fire(now + secs(1), 5), [keep_alive(6, 5)], "{reply:?}");
    }
}

// covers: Session.UnknownOutcome, Session.LossOfAllHoldings
#[test]
fn s23_keepalive_read_back_as_gone_or_someone_elses_loses_the_session() {
    for reply in [Reply::Found(None), theirs(9)] {
        let mut h = Harness::holding_two();
        h.fire(t0() + secs(5), 2);
        h.reply(t0() + secs(5), 3, Reply::Unknown);
        assert_eq!(
            h.reply(t0() + secs(6), 4, reply),
            [lost(LossReason::Overtaken, 2)],
            "{reply:?}"
        );
        assert!(h.machine.is_lost());
    }
}

// covers: Session.Close
#[test]
fn s24_close_with_nothing_in_flight_deletes_our_record() {
    let mut h = Harness::alive();
    assert_eq!(h.close(t0() + secs(1)), [delete(3, 5)]);
    assert!(h.machine.in_flight());
    let mut h = Harness::retry_wait();
    assert_eq!(h.close(t0() + ms(5_500)), [delete(5, 5)]);
}

// covers: Session.NoSessionAfterDeadline
#[test]
fn s25_a_create_confirmed_after_its_deadline_opens_nothing() {
    let mut h = Harness::new();
    h.open(t0());
    assert_eq!(
        h.reply(t0() + secs(16), 1, Reply::Written(Revision(5))),
        [E::NotOpened {
            id: ID,
            refusal: OpenRefusal::DeadlinePassed
        }]
    );
    assert!(h.machine.is_closed());
    // The same through a read-back.
    let mut h = Harness::new();
    h.open(t0());
    h.reply(t0() + secs(1), 1, Reply::Unknown);
    assert_eq!(
        h.reply(t0() + secs(17), 2, ours(5)),
        [E::NotOpened {
            id: ID,
            refusal: OpenRefusal::DeadlinePassed
        }]
    );
}

// covers: Session.NoSessionAfterDeadline, Session.LossOfAllHoldings
#[test]
fn s26_a_keepalive_confirmed_after_its_deadline_loses_the_session() {
    let mut h = Harness::holding_two();
    h.fire(t0() + secs(5), 2);
    assert_eq!(
        h.reply(t0() + secs(21), 3, Reply::Written(Revision(6))),
        [lost(LossReason::DeadlinePassed, 2)]
    );
    assert!(h.machine.is_lost());
}

// covers: Session.Close
#[test]
fn s27_the_killer_is_disarmed_only_after_a_confirmed_delete() {
    for reply in [Reply::Rejected, Reply::Failed, Reply::Unknown] {
        let mut h = Harness::alive();
        h.close(t0() + secs(1));
        assert_eq!(
            h.reply(t0() + secs(1), 3, reply),
            [CLOSED_NOTHING_DELETED],
            "{reply:?}"
        );
        assert!(h.machine.is_closed());
    }
    let mut h = Harness::alive();
    h.close(t0() + secs(1));
    assert_eq!(h.close(t0() + secs(1)), [], "asked twice: reported once");
    assert_eq!(
        h.reply(t0() + secs(1), 3, Reply::Deleted),
        [
            E::DisarmKiller,
            E::Closed {
                id: Some(ID),
                deleted: true
            }
        ]
    );
}

// covers: Session.Close, Session.LossOfAllHoldings
#[test]
fn s28_a_lost_session_without_holdings_closes_without_deleting() {
    let mut h = Harness::holding_two();
    h.fire(t0() + secs(5), 2);
    h.reply(t0() + secs(5), 3, Reply::Rejected);
    h.detach(t0() + secs(6), 0);
    h.detach(t0() + secs(6), 1);
    assert_eq!(h.close(t0() + secs(6)), [CLOSED_NOTHING_DELETED]);
    assert!(h.machine.is_closed());
}

// covers: Session.Attach
#[test]
fn s29_holdings_attach_in_every_alive_state() {
    let attached = |holding| {
        [E::Attached {
            holding: HoldingId(holding),
        }]
    };
    let mut h = Harness::alive();
    assert_eq!(h.attach(t0() + secs(1), 0), attached(0));
    h.fire(t0() + secs(5), 2);
    assert_eq!(h.attach(t0() + secs(5), 1), attached(1));
    h.reply(t0() + secs(5), 3, Reply::Unknown);
    assert_eq!(h.attach(t0() + secs(5), 2), attached(2));
    h.reply(t0() + secs(5), 4, Reply::Failed);
    assert_eq!(
        h.attach(t0() + secs(5), HOLDINGS_MAX - 1),
        attached(HOLDINGS_MAX - 1)
    );
    assert_eq!(h.machine.holdings(), 4);
}

// covers: Session.Attach
#[test]
fn s30_every_other_attach_is_refused_with_its_reason_and_changes_nothing() {
    let refused = |holding, refusal| {
        vec![E::AttachRefused {
            holding: HoldingId(holding),
            refusal,
        }]
    };
    // Closed, opening.
    let mut h = Harness::new();
    assert_eq!(h.attach(t0(), 0), refused(0, AttachRefusal::NotAlive));
    h.open(t0());
    assert_eq!(h.attach(t0(), 0), refused(0, AttachRefusal::NotAlive));
    // Twice, out of range, past the deadline.
    let mut h = Harness::alive();
    h.attach(t0() + secs(1), 3);
    let before = h.machine.clone();
    assert_eq!(
        h.attach(t0() + secs(1), 3),
        refused(3, AttachRefusal::Attached)
    );
    assert_eq!(
        h.attach(t0() + secs(1), HOLDINGS_MAX),
        refused(HOLDINGS_MAX, AttachRefusal::OutOfRange)
    );
    assert_eq!(
        h.attach(t0() + secs(16), 4),
        refused(4, AttachRefusal::NotAlive)
    );
    assert_eq!(h.machine, before);
    // Closing.
    h.detach(t0() + secs(1), 3);
    h.close(t0() + secs(1));
    assert_eq!(
        h.attach(t0() + secs(1), 0),
        refused(0, AttachRefusal::Closing)
    );
    assert_eq!(h.machine.holdings(), 0);
}

// covers: Session.Attach
#[test]
fn s31_detach_removes_a_holding_silently_and_ignores_one_not_attached() {
    let mut h = Harness::holding_two();
    assert_eq!(h.detach(t0() + secs(1), 0), []);
    assert!(!h.machine.is_attached(HoldingId(0)));
    assert_eq!(h.machine.holdings(), 1);
    let before = h.machine.clone();
    assert_eq!(h.detach(t0() + secs(1), 0), []);
    assert_eq!(h.detach(t0() + secs(1), HOLDINGS_MAX + 7), []);
    assert_eq!(h.machine, before);
    // Once every holding is detached, close deletes as usual.
    h.detach(t0() + secs(1), 1);
    assert_eq!(h.close(t0() + secs(1)), [delete(3, 5)]);
}

// covers: Session.StaleReply
#[test]
fn stale_replies_and_timers_change_nothing() {
    let mut h = Harness::keeping_alive();
    let before = h.machine.clone();
    assert_eq!(h.reply(t0() + secs(6), 1, Reply::Written(Revision(99))), []);
    assert_eq!(h.reply(t0() + secs(6), 42, Reply::Rejected), []);
    assert_eq!(h.fire(t0() + secs(6), 2), []);
    assert_eq!(h.open(t0() + secs(6)), []);
    assert_eq!(h.machine, before);
    // A lost session ignores replies and timers of its last life.
    h.reply(t0() + secs(6), 3, Reply::Rejected);
    let before = h.machine.clone();
    assert_eq!(h.reply(t0() + secs(7), 3, Reply::Written(Revision(9))), []);
    assert_eq!(h.fire(t0() + secs(7), 2), []);
    assert_eq!(h.machine, before);
}

// covers: Session.CostGrowth
#[test]
fn a_keepalive_and_a_loss_cost_the_same_with_every_holding_attached() {
    // The same life with no holding and with HOLDINGS_MAX holdings: identical effects on every
    // step but the count the loss reports.
    let life = |holdings: u32| {
        let mut h = Harness::alive();
        for holding in 0..holdings {
            assert_eq!(h.attach(t0() + secs(1), holding).len(), 1);
        }
        let log = vec![
            h.fire(t0() + secs(5), 2),
            h.reply(t0() + secs(5), 3, Reply::Written(Revision(6))),
            h.fire(t0() + secs(10), 4),
            h.reply(t0() + secs(10), 5, Reply::Rejected),
        ];
        (log, h.machine.holdings())
    };
    let (none, left) = life(0);
    assert_eq!(left, 0);
    let (all, left) = life(HOLDINGS_MAX);
    assert_eq!(left, HOLDINGS_MAX);
    assert_eq!(none[..3], all[..3]);
    // Without a holding the deadline goes with the loss (S32); that is the one difference.
    assert_eq!(none[3], [E::DisarmKiller, lost(LossReason::Overtaken, 0)]);
    assert_eq!(all[3], [lost(LossReason::Overtaken, HOLDINGS_MAX)]);
}

// covers: Session.CallsBound
#[test]
fn keepalive_store_calls_per_lease_period_stay_within_the_bound() {
    // The worst the keepalive path can be driven to: every outcome unknown, read back as
    // committed by us (so the streak never ends by rejection), timers fired exactly when due,
    // answers instant. Count store calls in every window of one lease.
    for lease_s in [2, 20, 600] {
        let lease = LeaseConfig::new(secs(lease_s)).unwrap();
        let mut machine = Session::new(lease, ME);
        let mut out = SessionEffects::new();
        let mut now = t0();
        let mut calls: Vec<Instant> = Vec::new();
        let mut revision = 1;
        let mut pending: Option<SessionEffect> = None;
        let mut timer_at: Option<(TimerId, Instant)> = None;
        machine.handle(&SessionEvent::Open { now }, &mut out);
        for _ in 0..10_000 {
            for effect in out.as_slice() {
                match *effect {
                    E::Create { .. } | E::KeepAlive { .. } | E::Get { .. } => {
                        calls.push(now);
                        pending = Some(*effect);
                    }
                    E::SetTimer { timer, at } => timer_at = Some((timer, at)),
                    _ => {}
                }
            }
            out.clear();
            if !machine.in_flight() && machine.liveness().is_none() {
                break;
            }
            let event = match pending.take() {
                Some(E::Create { op, .. }) => SessionEvent::Reply {
                    now,
                    op,
                    reply: Reply::Written(Revision(revision)),
                },
                Some(E::KeepAlive { op, .. }) => SessionEvent::Reply {
                    now,
                    op,
                    reply: Reply::Unknown,
                },
                Some(E::Get { op, .. }) => {
                    revision += 1;
                    SessionEvent::Reply {
                        now,
                        op,
                        reply: ours(revision),
                    }
                }
                _ => {
                    let Some((timer, at)) = timer_at.take() else {
                        break;
                    };
                    now = at;
                    SessionEvent::Timer { now, timer }
                }
            };
            machine.handle(&event, &mut out);
        }
        assert!(
            calls.len() > 5,
            "the run kept alive ({} calls)",
            calls.len()
        );
        let most = calls
            .iter()
            .map(|&from| {
                calls
                    .iter()
                    .filter(|&&t| t >= from && t < from + lease.lease())
                    .count()
            })
            .max()
            .unwrap();
        assert!(
            most as u32 <= RENEWAL_CALLS_PER_LEASE_MAX,
            "{most} store calls within one lease of {lease_s} s"
        );
    }
}

// covers: Session.NothingActingNoDeadline
#[test]
fn s32_s33_a_lost_session_keeps_its_deadline_only_while_something_may_act_under_it() {
    // Lost with nothing attached: the deadline goes at once (S32).
    let mut h = Harness::keeping_alive();
    assert_eq!(
        h.reply(t0() + secs(5), 3, Reply::Rejected),
        [E::DisarmKiller, lost(LossReason::Overtaken, 0)]
    );
    // Lost with two attached, both never handed out: the deadline goes with the last (S33).
    let mut h = Harness::holding_two();
    h.fire(t0() + secs(5), 2);
    assert_eq!(
        h.reply(t0() + secs(5), 3, Reply::Rejected),
        [lost(LossReason::Overtaken, 2)]
    );
    assert_eq!(h.detach_unused(t0() + secs(6), 0), []);
    assert_eq!(h.detach_unused(t0() + secs(6), 1), [E::DisarmKiller]);
    // One of them acted: its detach keeps the deadline, whatever the order (S31, S33).
    for acted_first in [true, false] {
        let mut h = Harness::holding_two();
        h.fire(t0() + secs(5), 2);
        h.reply(t0() + secs(5), 3, Reply::Rejected);
        let (a, b) = if acted_first {
            (
                h.detach(t0() + secs(6), 0),
                h.detach_unused(t0() + secs(6), 1),
            )
        } else {
            (
                h.detach_unused(t0() + secs(6), 1),
                h.detach(t0() + secs(6), 0),
            )
        };
        assert_eq!((a, b), (vec![], vec![]), "acted first: {acted_first}");
    }
    // Detached before the loss, having acted: its services stopped, nothing is attached at
    // the loss, so the deadline goes (S32).
    let mut h = Harness::holding_two();
    h.detach(t0() + secs(1), 0);
    h.detach(t0() + secs(1), 1);
    h.fire(t0() + secs(5), 2);
    assert_eq!(
        h.reply(t0() + secs(5), 3, Reply::Rejected),
        [E::DisarmKiller, lost(LossReason::Overtaken, 0)]
    );
    // Unused detaches while alive change nothing.
    let mut h = Harness::holding_two();
    assert_eq!(h.detach_unused(t0() + secs(1), 0), []);
    assert_eq!(h.detach_unused(t0() + secs(1), 1), []);
    assert_eq!(h.machine.holdings(), 0);
}
