//! One exact-effect test per transition of `specs/leadership.md`. Operation and timer ids are
//! deterministic (one counter per machine), so every expectation is the complete effect list.

use core::time::Duration;

use vvm_core::*;

const SLOT: Slot = Slot(1);
const ME: Incarnation = Incarnation(0xA11CE);
const OTHER: Incarnation = Incarnation(0xB0B);

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

fn token(revision: u64) -> FencingToken {
    FencingToken {
        slot: SLOT,
        revision: Revision(revision),
    }
}

struct Harness {
    machine: Leadership,
    out: Effects,
}

impl Harness {
    fn new() -> Self {
        Harness {
            machine: Leadership::new(LeaseConfig::default(), ME),
            out: Effects::new(),
        }
    }

    fn on(&mut self, event: LeaseEvent) -> Vec<Effect> {
        self.out.clear();
        self.machine.handle(&event, &mut self.out);
        self.out.as_slice().to_vec()
    }

    fn reply(&mut self, now: Instant, op: u64, reply: Reply) -> Vec<Effect> {
        self.on(LeaseEvent::Reply {
            now,
            op: OpId(op),
            reply,
        })
    }

    fn fire(&mut self, now: Instant, seq: u64) -> Vec<Effect> {
        self.on(LeaseEvent::Timer {
            now,
            timer: timer(seq),
        })
    }

    fn release(&mut self, now: Instant) -> Vec<Effect> {
        self.on(LeaseEvent::Release { now })
    }

    /// Acquire at t0 (insert op 1), confirmed as revision 5: renew timer 2 at t0 + 5 s.
    fn leading() -> Self {
        let mut h = Harness::new();
        h.on(LeaseEvent::Acquire {
            now: t0(),
            slot: SLOT,
        });
        h.reply(t0() + ms(10), 1, Reply::Written(Revision(5)));
        h
    }

    /// Leading, then the renewal (CAS op 3) sent at t0 + 5 s.
    fn renewing() -> Self {
        let mut h = Harness::leading();
        h.fire(t0() + secs(5), 2);
        h
    }
}

fn cas(op: u64, expected: u64) -> Effect {
    Effect::CompareAndSwap {
        op: OpId(op),
        slot: SLOT,
        expected: Revision(expected),
        ttl: secs(20),
    }
}

fn cad(op: u64, expected: u64) -> Effect {
    Effect::CompareAndDelete {
        op: OpId(op),
        slot: SLOT,
        expected: Revision(expected),
    }
}

// covers: Lease.Acquire
#[test]
fn l1_acquire_from_idle_inserts_our_record_with_the_lease_as_ttl() {
    let mut h = Harness::new();
    let effects = h.on(LeaseEvent::Acquire {
        now: t0(),
        slot: SLOT,
    });
    assert_eq!(
        effects,
        [Effect::Insert {
            op: OpId(1),
            slot: SLOT,
            ttl: secs(20)
        }]
    );
    assert!(h.machine.in_flight());
}

// covers: Lease.Release
#[test]
fn l2_release_without_a_lease_reports_released_at_once() {
    let mut h = Harness::new();
    assert_eq!(
        h.release(t0()),
        [Effect::Released {
            slot: None,
            deleted: false
        }]
    );
    assert!(h.machine.is_idle());
}

// covers: Lease.Acquire, processKillThreshold, Lease.RenewInterval, Lease.FencingToken
#[test]
fn l3_won_insert_arms_the_killer_from_the_send_time_and_the_renew_timer() {
    let mut h = Harness::new();
    h.on(LeaseEvent::Acquire {
        now: t0(),
        slot: SLOT,
    });
    // The reply arrives 3 s after the send: the deadline is still anchored to the send.
    let effects = h.reply(t0() + secs(3), 1, Reply::Written(Revision(5)));
    assert_eq!(
        effects,
        [
            Effect::ArmKiller {
                at: t0() + secs(16)
            },
            Effect::Acquired { token: token(5) },
            Effect::SetTimer {
                timer: timer(2),
                at: t0() + secs(5)
            },
        ]
    );
    assert_eq!(h.machine.token(), Some(token(5)));
    assert_eq!(h.machine.deadline(), Some(t0() + secs(16)));
}

// covers: Lease.ReleaseDuringOp
#[test]
fn l4_release_asked_during_insert_deletes_the_record_once_it_is_confirmed() {
    let mut h = Harness::new();
    h.on(LeaseEvent::Acquire {
        now: t0(),
        slot: SLOT,
    });
    assert_eq!(h.release(t0() + ms(1)), []);
    // Confirmed after the release was asked: deleted at once; the killer is not armed, because
    // nobody acts under a lease that is being released.
    let effects = h.reply(t0() + ms(5), 1, Reply::Written(Revision(5)));
    assert_eq!(effects, [cad(2, 5)]);
    assert_eq!(
        h.reply(t0() + ms(9), 2, Reply::Deleted),
        [Effect::Released {
            slot: Some(SLOT),
            deleted: true
        }]
    );
    assert!(h.machine.is_idle());
}

// covers: Lease.ReleaseDuringOp
#[test]
fn l4_release_asked_during_renewal_deletes_with_the_new_revision() {
    let mut h = Harness::renewing();
    assert_eq!(h.release(t0() + secs(5) + ms(1)), []);
    // The deadline of the last write confirmed before the release was asked stays in force.
    let effects = h.reply(t0() + secs(5) + ms(5), 3, Reply::Written(Revision(6)));
    assert_eq!(effects, [cad(4, 6)]);
}

// covers: Lease.Acquire
#[test]
fn l5_insert_rejected_means_the_slot_is_held() {
    let mut h = Harness::new();
    h.on(LeaseEvent::Acquire {
        now: t0(),
        slot: SLOT,
    });
    assert_eq!(
        h.reply(t0(), 1, Reply::Rejected),
        [Effect::NotAcquired {
            slot: SLOT,
            refusal: Refusal::Held
        }]
    );
    assert!(h.machine.is_idle());
}

// covers: Lease.ReleaseDuringOp
#[test]
fn l5_insert_rejected_after_a_release_was_asked_also_reports_released() {
    let mut h = Harness::new();
    h.on(LeaseEvent::Acquire {
        now: t0(),
        slot: SLOT,
    });
    h.release(t0());
    assert_eq!(
        h.reply(t0(), 1, Reply::Rejected),
        [
            Effect::NotAcquired {
                slot: SLOT,
                refusal: Refusal::Held
            },
            Effect::Released {
                slot: Some(SLOT),
                deleted: false
            }
        ]
    );
}

// covers: Lease.Acquire
#[test]
fn l6_insert_failed_is_not_acquired_for_a_store_failure() {
    let mut h = Harness::new();
    h.on(LeaseEvent::Acquire {
        now: t0(),
        slot: SLOT,
    });
    assert_eq!(
        h.reply(t0(), 1, Reply::Failed),
        [Effect::NotAcquired {
            slot: SLOT,
            refusal: Refusal::StoreFailed
        }]
    );
    assert!(h.machine.is_idle());
}

// covers: Lease.UnknownOutcome
#[test]
fn l7_insert_with_unknown_outcome_is_read_back() {
    let mut h = Harness::new();
    h.on(LeaseEvent::Acquire {
        now: t0(),
        slot: SLOT,
    });
    assert_eq!(
        h.reply(t0() + ms(500), 1, Reply::Unknown),
        [Effect::Get {
            op: OpId(2),
            slot: SLOT
        }]
    );
    assert!(h.machine.in_flight());
}

// covers: Lease.ReleaseDuringOp
#[test]
fn l8_release_while_in_flight_waits_for_the_reply() {
    let mut h = Harness::renewing();
    assert_eq!(h.release(t0() + secs(5)), []);
    assert!(h.machine.in_flight());
    assert!(matches!(
        h.machine.state(),
        LeaseState::Renewing {
            pending: Pending { release: true, .. },
            ..
        }
    ));
}

// covers: Lease.UnknownOutcome, Lease.Incarnation, processKillThreshold
#[test]
fn l9_unknown_insert_found_ours_is_claimed_and_anchored_to_the_claim() {
    let mut h = Harness::new();
    h.on(LeaseEvent::Acquire {
        now: t0(),
        slot: SLOT,
    });
    h.reply(t0() + ms(500), 1, Reply::Unknown);
    let record = Record {
        incarnation: ME,
        revision: Revision(7),
    };
    // Ours — but possibly an earlier insert of this process that landed late: not adopted,
    // claimed with a compare-and-swap on the revision found.
    let found = t0() + secs(2);
    assert_eq!(h.reply(found, 2, Reply::Found(Some(record))), [cas(3, 7)]);
    assert_eq!(h.machine.held(), None);
    assert!(h.machine.in_flight());
    assert_eq!(
        h.reply(found + ms(3), 3, Reply::Written(Revision(8))),
        [
            Effect::ArmKiller {
                at: found + secs(16)
            },
            Effect::Acquired { token: token(8) },
            Effect::SetTimer {
                timer: timer(4),
                at: found + secs(5)
            },
        ]
    );
}

// covers: Lease.ReleaseDuringOp, Lease.UnknownOutcome
#[test]
fn l9r_a_record_read_back_as_ours_after_a_release_was_asked_is_deleted() {
    let mut h = Harness::new();
    h.on(LeaseEvent::Acquire {
        now: t0(),
        slot: SLOT,
    });
    h.reply(t0(), 1, Reply::Unknown);
    h.release(t0());
    let record = Record {
        incarnation: ME,
        revision: Revision(7),
    };
    assert_eq!(h.reply(t0(), 2, Reply::Found(Some(record))), [cad(3, 7)]);
}

// covers: VVM.TryAtExpiry
#[test]
fn l5a_an_insert_refused_with_time_left_is_not_acquired() {
    let mut h = Harness::new();
    h.on(LeaseEvent::Acquire {
        now: t0(),
        slot: SLOT,
    });
    assert_eq!(
        h.reply(t0(), 1, Reply::Held(secs(3))),
        [Effect::NotAcquired {
            slot: SLOT,
            refusal: Refusal::Held
        }]
    );
    assert!(h.machine.is_idle());
}

// covers: Lease.UnknownOutcome
#[test]
fn l9b_l9c_a_claim_that_does_not_confirm_is_not_acquired() {
    for (reply, refusal) in [
        (Reply::Rejected, Refusal::Held),
        (Reply::Failed, Refusal::StoreFailed),
        (Reply::Unknown, Refusal::StoreFailed),
        (Reply::Written(Revision(7)), Refusal::StoreFailed),
    ] {
        let mut h = Harness::new();
        h.on(LeaseEvent::Acquire {
            now: t0(),
            slot: SLOT,
        });
        h.reply(t0(), 1, Reply::Unknown);
        let record = Record {
            incarnation: ME,
            revision: Revision(7),
        };
        h.reply(t0(), 2, Reply::Found(Some(record)));
        assert_eq!(
            h.reply(t0(), 3, reply),
            [Effect::NotAcquired {
                slot: SLOT,
                refusal
            }],
            "{reply:?}"
        );
        assert!(h.machine.is_idle());
    }
}

// covers: Lease.Incarnation
#[test]
fn l10_unknown_insert_found_a_predecessors_record_is_not_adopted() {
    // A restarted process at the same address has a new incarnation: the old record is not ours.
    let mut h = Harness::new();
    h.on(LeaseEvent::Acquire {
        now: t0(),
        slot: SLOT,
    });
    h.reply(t0(), 1, Reply::Unknown);
    let record = Record {
        incarnation: OTHER,
        revision: Revision(7),
    };
    assert_eq!(
        h.reply(t0(), 2, Reply::Found(Some(record))),
        [Effect::NotAcquired {
            slot: SLOT,
            refusal: Refusal::Held
        }]
    );
    assert!(h.machine.is_idle());
}

// covers: Lease.UnknownOutcome
#[test]
fn l11_unknown_insert_not_found_or_unreadable_is_not_acquired() {
    for reply in [Reply::Found(None), Reply::Failed, Reply::Unknown] {
        let mut h = Harness::new();
        h.on(LeaseEvent::Acquire {
            now: t0(),
            slot: SLOT,
        });
        h.reply(t0(), 1, Reply::Unknown);
        assert_eq!(
            h.reply(t0(), 2, reply),
            [Effect::NotAcquired {
                slot: SLOT,
                refusal: Refusal::StoreFailed
            }],
            "{reply:?}"
        );
        assert!(h.machine.is_idle());
    }
}

// covers: Lease.RenewInterval
#[test]
fn l12_renew_timer_sends_compare_and_swap_on_our_revision() {
    let mut h = Harness::leading();
    assert_eq!(h.fire(t0() + secs(5), 2), [cas(3, 5)]);
    // Sending does not move the deadline.
    assert_eq!(h.machine.deadline(), Some(t0() + secs(16)));
}

// covers: Lease.PreRenewalGuard
#[test]
fn l12_pre_renewal_guard_only_moves_the_deadline_earlier() {
    let mut h = Harness::leading();
    // A timer firing early (0.5 s after the send): now + 0.75·L is before the deadline.
    let effects = h.fire(t0() + ms(500), 2);
    assert_eq!(
        effects,
        [
            Effect::ArmKiller {
                at: t0() + ms(15_500)
            },
            cas(3, 5)
        ]
    );
    assert_eq!(h.machine.deadline(), Some(t0() + ms(15_500)));
}

// covers: Lease.RenewInterval, processKillThreshold, Lease.DeadlineOnlyLaterOnConfirm, Lease.FencingToken
#[test]
fn l13_confirmed_renewal_moves_the_deadline_to_its_send_time_plus_0_8_l() {
    let mut h = Harness::renewing();
    let sent = t0() + secs(5);
    let effects = h.reply(sent + secs(2), 3, Reply::Written(Revision(6)));
    assert_eq!(
        effects,
        [
            Effect::ArmKiller {
                at: sent + secs(16)
            },
            Effect::Renewed { token: token(6) },
            Effect::SetTimer {
                timer: timer(4),
                at: sent + secs(5)
            },
        ]
    );
    assert_eq!(h.machine.token(), Some(token(6)));
}

// covers: Lease.LostOnReject, VVM.LossKeepsRecord
#[test]
fn l14_rejected_renewal_is_lost_at_once_and_deletes_nothing() {
    let mut h = Harness::renewing();
    let effects = h.reply(t0() + secs(5), 3, Reply::Rejected);
    assert_eq!(
        effects,
        [Effect::Lost {
            slot: SLOT,
            reason: LossReason::Overtaken
        }]
    );
    assert_eq!(h.machine.held(), None);
    assert!(h.machine.is_idle(), "nothing in flight: no delete was sent");

    // With a release asked meanwhile, the release ends at once, having deleted nothing.
    let mut h = Harness::renewing();
    h.release(t0() + secs(5));
    assert_eq!(
        h.reply(t0() + secs(5), 3, Reply::Rejected),
        [
            Effect::Lost {
                slot: SLOT,
                reason: LossReason::Overtaken
            },
            Effect::Released {
                slot: Some(SLOT),
                deleted: false
            }
        ]
    );
}

// covers: Lease.Retry, Lease.DeadlineOnlyLaterOnConfirm
#[test]
fn l15_failed_renewal_waits_l_over_20_and_keeps_the_deadline() {
    let mut h = Harness::renewing();
    let now = t0() + secs(5) + ms(100);
    assert_eq!(
        h.reply(now, 3, Reply::Failed),
        [Effect::SetTimer {
            timer: timer(4),
            at: now + secs(1)
        }]
    );
    assert_eq!(h.machine.deadline(), Some(t0() + secs(16)));
    // The retry is a compare-and-swap on the same revision.
    assert_eq!(h.fire(now + secs(1), 4), [cas(5, 5)]);
}

// covers: Lease.Retry, Lease.RetryUntilDeadline, VVM.LossKeepsRecord
#[test]
fn l16_renewals_are_retried_with_backoff_until_no_answer_could_beat_the_deadline() {
    // L = 20 s: leading from t0, deadline t0 + 16 s; store-call timeout 0.5 s.
    let mut h = Harness::renewing();
    let mut now = t0() + secs(5);
    let mut op = 3;
    let mut seq = 4;
    // Backoff 1 s, 2 s, 4 s: retries at 6 s, 8 s and 12 s, each answer due before 16 s.
    for (backoff, _) in [(1, 6), (2, 8), (4, 12)] {
        assert_eq!(
            h.reply(now, op, Reply::Failed),
            [Effect::SetTimer {
                timer: timer(seq),
                at: now + secs(backoff)
            }]
        );
        now = now + secs(backoff);
        assert_eq!(h.fire(now, seq), [cas(op + 2, 5)]);
        op += 2;
        seq += 2;
    }
    assert_eq!(now, t0() + secs(12));
    assert_eq!(h.machine.deadline(), Some(t0() + secs(16)));
    // The next retry would be sent at 16 s: its answer cannot come before the deadline.
    assert_eq!(
        h.reply(now, op, Reply::Failed),
        [Effect::Lost {
            slot: SLOT,
            reason: LossReason::RenewalFailed
        }]
    );
    assert!(h.machine.is_idle(), "the record is left to expire");
}

// covers: Lease.RetryUntilDeadline
#[test]
fn l15_a_store_hiccup_shorter_than_the_margin_keeps_leadership() {
    // Three failed attempts within 3 s (the old budget was two retries): still leading, and the
    // next confirmed write moves the deadline as usual.
    let mut h = Harness::renewing();
    let mut now = t0() + secs(5);
    h.reply(now, 3, Reply::Failed);
    now = now + secs(1);
    h.fire(now, 4);
    h.reply(now, 5, Reply::Failed);
    now = now + secs(2);
    h.fire(now, 6);
    assert_eq!(
        h.reply(now, 7, Reply::Unknown),
        [Effect::Get {
            op: OpId(8),
            slot: SLOT
        }]
    );
    assert_eq!(
        h.reply(now, 8, Reply::Failed),
        [Effect::SetTimer {
            timer: timer(9),
            at: now + secs(4)
        }]
    );
    now = now + secs(4);
    assert_eq!(h.fire(now, 9), [cas(10, 5)]);
    let effects = h.reply(now + ms(3), 10, Reply::Written(Revision(6)));
    assert_eq!(effects[0], Effect::ArmKiller { at: now + secs(16) });
    assert_eq!(h.machine.token(), Some(token(6)));
}

// covers: Lease.CallsBound
#[test]
fn renewal_store_calls_per_lease_period_stay_within_the_bound() {
    // The worst the renewal path can be driven to: every attempt's outcome unknown, read back
    // as committed by us (so the streak never ends in a loss by rejection), timers fired exactly
    // when due, answers instant. Count store calls in every window of one lease.
    for lease_s in [2, 20, 600] {
        let lease = LeaseConfig::new(secs(lease_s)).unwrap();
        let mut machine = Leadership::new(lease, ME);
        let mut out = Effects::new();
        let mut now = t0();
        let mut calls: Vec<Instant> = Vec::new();
        let mut revision = 1;
        let mut pending: Option<Effect> = None;
        let mut timer_at: Option<(TimerId, Instant)> = None;
        machine.handle(&LeaseEvent::Acquire { now, slot: SLOT }, &mut out);
        let mut events = 0;
        loop {
            for effect in out.as_slice() {
                match *effect {
                    Effect::Insert { .. } | Effect::CompareAndSwap { .. } | Effect::Get { .. } => {
                        calls.push(now);
                        pending = Some(*effect);
                    }
                    Effect::SetTimer { timer, at } => timer_at = Some((timer, at)),
                    _ => {}
                }
            }
            out.clear();
            events += 1;
            if events > 10_000 || machine.is_idle() && pending.is_none() {
                break;
            }
            let event = match pending.take() {
                Some(Effect::Insert { op, .. }) => LeaseEvent::Reply {
                    now,
                    op,
                    reply: Reply::Written(Revision(revision)),
                },
                Some(Effect::CompareAndSwap { op, .. }) => LeaseEvent::Reply {
                    now,
                    op,
                    reply: Reply::Unknown,
                },
                Some(Effect::Get { op, .. }) => {
                    revision += 1;
                    let record = Record {
                        incarnation: ME,
                        revision: Revision(revision),
                    };
                    LeaseEvent::Reply {
                        now,
                        op,
                        reply: Reply::Found(Some(record)),
                    }
                }
                _ => {
                    let Some((timer, at)) = timer_at.take() else {
                        break;
                    };
                    now = at;
                    LeaseEvent::Timer { now, timer }
                }
            };
            machine.handle(&event, &mut out);
        }
        assert!(calls.len() > 5, "the run renewed ({} calls)", calls.len());
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

// covers: Lease.ReleaseDuringOp
#[test]
fn l17_failed_renewal_with_release_asked_releases_instead_of_retrying() {
    let mut h = Harness::renewing();
    h.release(t0() + secs(5));
    assert_eq!(h.reply(t0() + secs(5), 3, Reply::Failed), [cad(4, 5)]);
    assert_eq!(
        h.reply(t0() + secs(5), 4, Reply::Deleted),
        [Effect::Released {
            slot: Some(SLOT),
            deleted: true
        }]
    );
}

// covers: Lease.UnknownOutcome
#[test]
fn l18_renewal_with_unknown_outcome_is_read_back() {
    let mut h = Harness::renewing();
    assert_eq!(
        h.reply(t0() + secs(5), 3, Reply::Unknown),
        [Effect::Get {
            op: OpId(4),
            slot: SLOT
        }]
    );
    assert_eq!(h.machine.deadline(), Some(t0() + secs(16)));
}

// covers: Lease.UnknownOutcome, Lease.DeadlineOnlyLaterOnConfirm
#[test]
fn l19_unknown_renewal_found_committed_retries_from_it_and_confirms_nothing() {
    let mut h = Harness::renewing();
    let sent = t0() + secs(5);
    h.reply(sent + ms(250), 3, Reply::Unknown);
    let record = Record {
        incarnation: ME,
        revision: Revision(6),
    };
    // Committed — but maybe by an earlier attempt that landed late: nothing is confirmed and
    // the deadline stays; the retry (after the backoff) swaps from the revision found.
    let found = sent + secs(1);
    assert_eq!(
        h.reply(found, 4, Reply::Found(Some(record))),
        [Effect::SetTimer {
            timer: timer(5),
            at: found + secs(1)
        }]
    );
    assert_eq!(h.machine.deadline(), Some(t0() + secs(16)));
    assert_eq!(h.machine.token(), Some(token(6)));
    let retry = found + secs(1);
    assert_eq!(h.fire(retry, 5), [cas(6, 6)]);
    assert_eq!(
        h.reply(retry + ms(2), 6, Reply::Written(Revision(7))),
        [
            Effect::ArmKiller {
                at: retry + secs(16)
            },
            Effect::Renewed { token: token(7) },
            Effect::SetTimer {
                timer: timer(7),
                at: retry + secs(5)
            },
        ]
    );
}

// covers: Lease.UnknownOutcome, Lease.Release
#[test]
fn l19a_a_committed_read_back_after_a_release_was_asked_deletes_that_revision() {
    let mut h = Harness::renewing();
    let now = t0() + secs(5);
    h.release(now);
    h.reply(now, 3, Reply::Unknown);
    let record = Record {
        incarnation: ME,
        revision: Revision(9),
    };
    assert_eq!(h.reply(now, 4, Reply::Found(Some(record))), [cad(5, 9)]);
}

// covers: Lease.RetryUntilDeadline, VVM.LossKeepsRecord
#[test]
fn l19_a_committed_read_back_with_no_time_left_is_lost_without_a_delete() {
    // The read-back comes so late that a retry could not be answered before the deadline.
    let mut h = Harness::renewing();
    h.reply(t0() + secs(5), 3, Reply::Unknown);
    let record = Record {
        incarnation: ME,
        revision: Revision(9),
    };
    assert_eq!(
        h.reply(t0() + secs(15), 4, Reply::Found(Some(record))),
        [Effect::Lost {
            slot: SLOT,
            reason: LossReason::RenewalFailed
        }]
    );
    assert!(h.machine.is_idle());
}

// covers: Lease.NoTokenAfterDeadline
#[test]
fn l24_an_insert_confirmed_after_its_deadline_hands_out_no_token() {
    let mut h = Harness::new();
    h.on(LeaseEvent::Acquire {
        now: t0(),
        slot: SLOT,
    });
    assert_eq!(
        h.reply(t0() + secs(16), 1, Reply::Written(Revision(5))),
        [Effect::NotAcquired {
            slot: SLOT,
            refusal: Refusal::DeadlinePassed
        }]
    );
    assert!(h.machine.is_idle());
}

// covers: Lease.NoTokenAfterDeadline, VVM.LossKeepsRecord
#[test]
fn l25_a_renewal_confirmed_after_its_deadline_loses_leadership() {
    let mut h = Harness::renewing();
    let sent = t0() + secs(5);
    assert_eq!(
        h.reply(sent + secs(16), 3, Reply::Written(Revision(6))),
        [Effect::Lost {
            slot: SLOT,
            reason: LossReason::DeadlinePassed
        }]
    );
    assert_eq!(h.machine.held(), None);
    assert!(h.machine.is_idle(), "the record is left to expire");
}

// covers: Lease.UnknownOutcome, Lease.Retry
#[test]
fn l20_unknown_renewal_not_committed_counts_as_a_failed_attempt() {
    let not_committed = Reply::Found(Some(Record {
        incarnation: ME,
        revision: Revision(5),
    }));
    for reply in [not_committed, Reply::Failed, Reply::Unknown] {
        let mut h = Harness::renewing();
        let now = t0() + secs(5);
        h.reply(now, 3, Reply::Unknown);
        assert_eq!(
            h.reply(now, 4, reply),
            [Effect::SetTimer {
                timer: timer(5),
                at: now + secs(1)
            }],
            "{reply:?}"
        );
        assert_eq!(h.machine.deadline(), Some(t0() + secs(16)));
    }
}

// covers: Lease.LostOnReject, Lease.Incarnation, VVM.LossKeepsRecord
#[test]
fn l21_unknown_renewal_found_someone_else_or_nothing_is_lost() {
    let other = Reply::Found(Some(Record {
        incarnation: OTHER,
        revision: Revision(9),
    }));
    for reply in [other, Reply::Found(None)] {
        let mut h = Harness::renewing();
        h.reply(t0() + secs(5), 3, Reply::Unknown);
        assert_eq!(
            h.reply(t0() + secs(5), 4, reply),
            [Effect::Lost {
                slot: SLOT,
                reason: LossReason::Overtaken
            }],
            "{reply:?}"
        );
        assert!(h.machine.is_idle());
    }
}

// covers: Lease.Release
#[test]
fn l22_release_while_holding_or_waiting_to_retry_deletes_our_record() {
    let mut holding = Harness::leading();
    assert_eq!(holding.release(t0() + secs(1)), [cad(3, 5)]);

    let mut waiting = Harness::renewing();
    waiting.reply(t0() + secs(5), 3, Reply::Failed);
    assert_eq!(waiting.release(t0() + secs(5)), [cad(5, 5)]);
}

// covers: Lease.Release
#[test]
fn l23_release_reply_reports_whether_our_record_was_deleted() {
    let mut h = Harness::leading();
    h.release(t0() + secs(1));
    assert_eq!(
        h.reply(t0() + secs(1), 3, Reply::Rejected),
        [Effect::Released {
            slot: Some(SLOT),
            deleted: false
        }]
    );
    assert!(h.machine.is_idle());
}

// covers: Lease.LostOnReject
#[test]
fn l23_cleanup_after_a_loss_reports_nothing_unless_a_release_was_asked() {
    let mut h = Harness::renewing();
    h.reply(t0() + secs(5), 3, Reply::Rejected);
    assert_eq!(h.reply(t0() + secs(5), 4, Reply::Rejected), []);
    assert!(h.machine.is_idle());
    // A later release finds nothing to release.
    assert_eq!(
        h.release(t0() + secs(6)),
        [Effect::Released {
            slot: None,
            deleted: false
        }]
    );
}

// covers: Lease.StaleReply
#[test]
fn stale_replies_and_timers_change_nothing() {
    let mut h = Harness::renewing();
    let before = h.machine.clone();
    assert_eq!(h.reply(t0() + secs(6), 1, Reply::Written(Revision(99))), []);
    assert_eq!(h.reply(t0() + secs(6), 42, Reply::Rejected), []);
    assert_eq!(h.fire(t0() + secs(6), 2), []);
    assert_eq!(
        h.on(LeaseEvent::Acquire {
            now: t0(),
            slot: Slot(2)
        }),
        []
    );
    assert_eq!(h.machine, before);
}

// covers: Lease.FencingToken
#[test]
fn a_renewal_reply_with_a_revision_not_above_ours_is_a_failed_attempt() {
    let mut h = Harness::renewing();
    let now = t0() + secs(5);
    assert_eq!(
        h.reply(now, 3, Reply::Written(Revision(5))),
        [Effect::SetTimer {
            timer: timer(4),
            at: now + secs(1)
        }]
    );
    assert_eq!(h.machine.token(), Some(token(5)));
}

// covers: Lease.VanishedLoses
#[test]
fn l26_a_vanished_record_is_lost_at_once_in_every_leading_state_and_deletes_nothing() {
    let lost = [Effect::Lost {
        slot: SLOT,
        reason: LossReason::Overtaken,
    }];
    let now = t0() + secs(5) + ms(1);
    // Holding: the renew timer left set is stale.
    let mut h = Harness::leading();
    assert_eq!(h.on(LeaseEvent::Vanished { now }), lost);
    assert!(h.machine.is_idle(), "no delete, no renewal");
    assert_eq!(h.fire(t0() + secs(5), 2), []);
    // Renewing: the swap's late answer is stale.
    let mut h = Harness::renewing();
    assert_eq!(h.on(LeaseEvent::Vanished { now }), lost);
    assert!(h.machine.is_idle());
    assert_eq!(h.reply(now, 3, Reply::Written(Revision(9))), []);
    assert_eq!(h.machine.token(), None);
    // Reading a renewal's outcome back.
    let mut h = Harness::renewing();
    h.reply(t0() + secs(5), 3, Reply::Unknown);
    assert_eq!(h.on(LeaseEvent::Vanished { now }), lost);
    assert_eq!(h.reply(now, 4, Reply::Found(None)), []);
    // Waiting to retry.
    let mut h = Harness::renewing();
    h.reply(t0() + secs(5), 3, Reply::Failed);
    assert_eq!(h.on(LeaseEvent::Vanished { now }), lost);
    assert!(h.machine.is_idle());
}

// covers: Lease.VanishedLoses
#[test]
fn l26a_a_vanished_record_outside_leading_changes_nothing() {
    // Idle, inserting, a release in flight, a renewal with a release asked.
    let mut h = Harness::new();
    assert_eq!(h.on(LeaseEvent::Vanished { now: t0() }), []);
    h.on(LeaseEvent::Acquire {
        now: t0(),
        slot: SLOT,
    });
    let before = h.machine.clone();
    assert_eq!(h.on(LeaseEvent::Vanished { now: t0() }), []);
    assert_eq!(h.machine, before);
    let mut h = Harness::leading();
    assert_eq!(h.release(t0() + secs(1)), [cad(3, 5)]);
    assert_eq!(
        h.on(LeaseEvent::Vanished {
            now: t0() + secs(1)
        }),
        []
    );
    assert_eq!(
        h.reply(t0() + secs(1), 3, Reply::Rejected),
        [Effect::Released {
            slot: Some(SLOT),
            deleted: false
        }]
    );
    let mut h = Harness::renewing();
    h.release(t0() + secs(5));
    let before = h.machine.clone();
    assert_eq!(
        h.on(LeaseEvent::Vanished {
            now: t0() + secs(5)
        }),
        []
    );
    assert_eq!(h.machine, before);
}
