//! One exact-effect test per transition of `specs/lifecycle.md`.

use core::time::Duration;

use vvm_core::*;

const ME: Incarnation = Incarnation(0xA11CE);

fn secs(s: u64) -> Duration {
    Duration::from_secs(s)
}

fn ms(ms: u64) -> Duration {
    Duration::from_millis(ms)
}

fn t0() -> Instant {
    Instant::from_nanos(1_000_000_000_000)
}

fn config(slots: u32) -> VvmConfig {
    VvmConfig::builder("10.0.0.1:7000")
        .slots(slots)
        .build()
        .unwrap()
}

fn token(slot: u32, revision: u64) -> FencingToken {
    FencingToken {
        slot: Slot(slot),
        revision: Revision(revision),
    }
}

fn insert(op: u64, slot: u32) -> Effect {
    Effect::Insert {
        op: OpId(op),
        slot: Slot(slot),
        ttl: secs(20),
    }
}

fn cad(op: u64, expected: u64) -> Effect {
    Effect::CompareAndDelete {
        op: OpId(op),
        slot: Slot(1),
        expected: Revision(expected),
    }
}

fn lease_timer(seq: u64) -> TimerId {
    TimerId {
        kind: TimerKind::Lease,
        seq,
    }
}

struct Harness {
    vvm: Lifecycle,
    out: Effects,
}

impl Harness {
    fn new(config: &VvmConfig) -> Self {
        Harness {
            vvm: Lifecycle::new(config, ME),
            out: Effects::new(),
        }
    }

    fn on(&mut self, event: VvmEvent) -> Vec<Effect> {
        self.out.clear();
        self.vvm.handle(&event, &mut self.out);
        self.out.as_slice().to_vec()
    }

    fn reply(&mut self, now: Instant, op: u64, reply: Reply) -> Vec<Effect> {
        self.on(VvmEvent::Reply {
            now,
            op: OpId(op),
            reply,
        })
    }

    /// Launched at t0 and leading slot 1 at revision 5 (insert op 1, renew timer 2); services
    /// asked to start.
    fn starting() -> Self {
        let mut h = Harness::new(&config(1));
        h.on(VvmEvent::Launch { now: t0() });
        h.reply(t0(), 1, Reply::Written(Revision(5)));
        h
    }

    fn running() -> Self {
        let mut h = Harness::starting();
        h.on(VvmEvent::ServicesStarted { now: t0() + ms(10) });
        h
    }
}

// covers: VVM.LaunchVVM
#[test]
fn v1_launch_tries_slot_one() {
    let mut h = Harness::new(&config(3));
    assert_eq!(h.on(VvmEvent::Launch { now: t0() }), [insert(1, 1)]);
    assert_eq!(h.vvm.phase(), Phase::AcquiringLeadership);
    // A second launch is not acted on.
    assert_eq!(h.on(VvmEvent::Launch { now: t0() }), []);
}

// covers: VVM.LaunchVVM
#[test]
fn v2_won_slot_starts_the_services_with_its_token() {
    let mut h = Harness::new(&config(1));
    h.on(VvmEvent::Launch { now: t0() });
    assert_eq!(
        h.reply(t0() + ms(3), 1, Reply::Written(Revision(5))),
        [
            Effect::ArmKiller {
                at: t0() + secs(16)
            },
            Effect::Acquired { token: token(1, 5) },
            Effect::SetTimer {
                timer: lease_timer(2),
                at: t0() + secs(5)
            },
            Effect::StartServices { token: token(1, 5) },
        ]
    );
    assert_eq!(h.vvm.phase(), Phase::StartingServices);
}

// covers: VVM.tryToAcquireLeadership
#[test]
fn v3_a_held_slot_moves_on_to_the_next() {
    let mut h = Harness::new(&config(3));
    h.on(VvmEvent::Launch { now: t0() });
    assert_eq!(
        h.reply(t0(), 1, Reply::Rejected),
        [
            Effect::NotAcquired {
                slot: Slot(1),
                refusal: Refusal::Held
            },
            insert(2, 2)
        ]
    );
}

// covers: VVM.tryToAcquireLeadership
#[test]
fn v4_v6_after_the_last_slot_it_waits_a_round_and_starts_again_at_slot_one() {
    let mut h = Harness::new(&config(2));
    h.on(VvmEvent::Launch { now: t0() });
    h.reply(t0(), 1, Reply::Rejected);
    let round = TimerId {
        kind: TimerKind::Round,
        seq: 1,
    };
    assert_eq!(
        h.reply(t0() + ms(5), 2, Reply::Failed),
        [
            Effect::NotAcquired {
                slot: Slot(2),
                refusal: Refusal::StoreFailed
            },
            Effect::SetTimer {
                timer: round,
                at: t0() + ms(1_005)
            }
        ]
    );
    assert_eq!(
        h.on(VvmEvent::Timer {
            now: t0() + ms(1_005),
            timer: round
        }),
        [insert(3, 1)]
    );
}

// covers: VVM.TryAtChange
#[test]
fn v6a_a_slot_change_between_rounds_starts_the_next_round_at_once() {
    let mut h = Harness::new(&config(2));
    h.on(VvmEvent::Launch { now: t0() });
    h.reply(t0(), 1, Reply::Rejected);
    h.reply(t0() + ms(5), 2, Reply::Rejected);
    assert!(h.vvm.waits_for_round());
    assert_eq!(
        h.on(VvmEvent::SlotChanged { now: t0() + ms(40) }),
        [insert(3, 1)]
    );
    assert!(!h.vvm.waits_for_round());
    assert_eq!(h.vvm.phase(), Phase::AcquiringLeadership);
    // The round timer set before is stale now: it starts nothing.
    let round = TimerId {
        kind: TimerKind::Round,
        seq: 1,
    };
    assert_eq!(
        h.on(VvmEvent::Timer {
            now: t0() + ms(1_005),
            timer: round
        }),
        []
    );
    // The round goes on as usual: slot 1 won.
    assert_eq!(
        h.reply(t0() + ms(41), 3, Reply::Written(Revision(9)))
            .last(),
        Some(&Effect::StartServices { token: token(1, 9) })
    );
}

// covers: VVM.TryAtChange
#[test]
fn v6d_a_slot_change_outside_acquisition_changes_nothing() {
    // Provided, StartingServices, Running.
    let mut provided = Harness::new(&config(1));
    assert_eq!(provided.on(VvmEvent::SlotChanged { now: t0() }), []);
    assert_eq!(provided.vvm.phase(), Phase::Provided);
    for mut h in [Harness::starting(), Harness::running()] {
        let before = h.vvm.clone();
        assert_eq!(h.on(VvmEvent::SlotChanged { now: t0() + ms(20) }), []);
        assert_eq!(h.vvm, before);
    }
}

/// What a record vanishing under a leader gives: the loss, the problem, and (while the
/// services start or run) their stop.
fn vanished(stop: bool) -> Vec<Effect> {
    let mut effects = vec![
        Effect::Lost {
            slot: Slot(1),
            reason: LossReason::Overtaken,
        },
        Effect::ProblemRaised {
            problem: Problem::LeadershipLost {
                slot: Slot(1),
                reason: LossReason::Overtaken,
            },
        },
    ];
    if stop {
        effects.push(Effect::StopServices);
    }
    effects
}

// covers: VVM.VanishedStops, Lease.VanishedLoses
#[test]
fn v6b_a_vanished_record_stops_the_services_at_once_without_a_delete() {
    for mut h in [Harness::starting(), Harness::running()] {
        assert_eq!(h.vvm.watches_own_record(), Some(Slot(1)));
        let now = t0() + ms(300);
        assert_eq!(h.on(VvmEvent::RecordVanished { now }), vanished(true));
        assert_eq!(h.vvm.phase(), Phase::StoppingServices);
        assert_eq!(h.vvm.token(), None);
        assert!(h.vvm.leadership().is_idle(), "no renewal, no delete");
        assert_eq!(h.vvm.watches_own_record(), None);
        // The renew timer set at the win is stale now; a second word changes nothing.
        assert_eq!(
            h.on(VvmEvent::Timer {
                now: t0() + secs(5),
                timer: lease_timer(2)
            }),
            []
        );
        assert_eq!(h.on(VvmEvent::RecordVanished { now }), []);
        // The services stopped, the shutdown finishes without a delete and keeps the deadline.
        assert_eq!(
            h.on(VvmEvent::ServicesStopped {
                now: now + ms(50),
                clean: true
            }),
            [
                Effect::MonitorStopped,
                Effect::Released {
                    slot: None,
                    deleted: false
                },
                Effect::Finished {
                    problem: Some(Problem::LeadershipLost {
                        slot: Slot(1),
                        reason: LossReason::Overtaken
                    })
                }
            ]
        );
    }
}

// covers: VVM.VanishedStops, Lease.VanishedLoses
#[test]
fn v6b_a_vanished_record_with_a_renewal_in_flight_or_awaited_loses_at_once() {
    let renew = t0() + secs(5);
    // A swap in flight: its late answer is stale.
    let mut h = Harness::running();
    h.on(VvmEvent::Timer {
        now: renew,
        timer: lease_timer(2),
    });
    assert_eq!(
        h.on(VvmEvent::RecordVanished { now: renew + ms(1) }),
        vanished(true)
    );
    assert_eq!(h.reply(renew + ms(2), 3, Reply::Written(Revision(7))), []);
    assert!(h.vvm.leadership().is_idle());
    // Its outcome being read back.
    let mut h = Harness::running();
    h.on(VvmEvent::Timer {
        now: renew,
        timer: lease_timer(2),
    });
    h.reply(renew, 3, Reply::Unknown);
    assert_eq!(
        h.on(VvmEvent::RecordVanished { now: renew + ms(1) }),
        vanished(true)
    );
    assert_eq!(h.reply(renew + ms(2), 4, Reply::Found(None)), []);
    // Waiting to retry a failed swap.
    let mut h = Harness::running();
    h.on(VvmEvent::Timer {
        now: renew,
        timer: lease_timer(2),
    });
    h.reply(renew, 3, Reply::Failed);
    assert!(matches!(
        h.vvm.leadership().state(),
        LeaseState::RetryWait { .. }
    ));
    assert_eq!(
        h.on(VvmEvent::RecordVanished { now: renew + ms(1) }),
        vanished(true)
    );
}

// covers: VVM.VanishedStops
#[test]
fn v6e_a_vanished_record_while_the_services_stop_is_the_loss_if_first() {
    let mut h = Harness::running();
    let now = t0() + ms(300);
    assert_eq!(h.on(VvmEvent::Shutdown { now }), [Effect::StopServices]);
    assert_eq!(h.vvm.watches_own_record(), Some(Slot(1)));
    assert_eq!(
        h.on(VvmEvent::RecordVanished { now: now + ms(1) }),
        vanished(false)
    );
    assert_eq!(h.vvm.phase(), Phase::StoppingServices);
    // Nothing held: the release deletes nothing, and the deadline stays armed.
    assert_eq!(
        h.on(VvmEvent::ServicesStopped {
            now: now + ms(50),
            clean: true
        }),
        [
            Effect::MonitorStopped,
            Effect::Released {
                slot: None,
                deleted: false
            },
            Effect::Finished {
                problem: Some(Problem::LeadershipLost {
                    slot: Slot(1),
                    reason: LossReason::Overtaken
                })
            }
        ]
    );
    // Running after a service failed: the services stop, the first problem stays (V6b).
    let mut h = Harness::running();
    h.on(VvmEvent::ServiceFailed { now, index: 0 });
    let mut expected = vanished(true);
    expected.remove(1);
    assert_eq!(
        h.on(VvmEvent::RecordVanished { now: now + ms(1) }),
        expected
    );
}

// covers: VVM.VanishedStops
#[test]
fn v6f_a_vanished_record_when_not_leading_changes_nothing() {
    // Provided, acquiring, between rounds, after a loss, while releasing, shut down.
    let mut provided = Harness::new(&config(1));
    assert_eq!(provided.vvm.watches_own_record(), None);
    assert_eq!(provided.on(VvmEvent::RecordVanished { now: t0() }), []);
    let mut h = Harness::new(&config(1));
    h.on(VvmEvent::Launch { now: t0() });
    assert_eq!(h.vvm.watches_own_record(), None);
    let before = h.vvm.clone();
    assert_eq!(h.on(VvmEvent::RecordVanished { now: t0() }), []);
    assert_eq!(h.vvm, before);
    h.reply(t0(), 1, Reply::Held(secs(3)));
    assert!(h.vvm.waits_for_round());
    let before = h.vvm.clone();
    assert_eq!(h.on(VvmEvent::RecordVanished { now: t0() }), []);
    assert_eq!(h.vvm, before);
    // Releasing: the delete in flight decides.
    let mut h = Harness::running();
    let now = t0() + ms(300);
    h.on(VvmEvent::Shutdown { now });
    h.on(VvmEvent::ServicesStopped { now, clean: true });
    assert_eq!(h.vvm.phase(), Phase::CleaningElections);
    assert_eq!(h.vvm.watches_own_record(), None);
    assert_eq!(h.on(VvmEvent::RecordVanished { now }), []);
    assert_eq!(
        h.reply(now, 3, Reply::Deleted),
        [
            Effect::Released {
                slot: Some(Slot(1)),
                deleted: true
            },
            Effect::DisarmKiller,
            Effect::Finished { problem: None }
        ]
    );
    assert_eq!(h.on(VvmEvent::RecordVanished { now }), []);
}

// covers: VVM.TryAtChange, VVM.SubscribeBeforeInsert
#[test]
fn v6c_v4a_a_change_during_a_round_starts_the_next_round_when_it_ends() {
    let mut h = Harness::new(&config(2));
    h.on(VvmEvent::Launch { now: t0() });
    assert!(h.vvm.watches_slots());
    // The insert is in flight: no second one, but the change is noted.
    assert_eq!(h.on(VvmEvent::SlotChanged { now: t0() }), []);
    h.reply(t0(), 1, Reply::Held(secs(10)));
    // The round ends without a timer: slot 1 is tried again at once.
    assert_eq!(
        h.reply(t0() + ms(1), 2, Reply::Held(secs(10))),
        [
            Effect::NotAcquired {
                slot: Slot(2),
                refusal: Refusal::Held
            },
            insert(3, 1)
        ]
    );
    assert!(!h.vvm.waits_for_round());
    // The fresh round forgot the change: it ends waiting for the expiry.
    h.reply(t0() + ms(2), 3, Reply::Held(secs(10)));
    let effects = h.reply(t0() + ms(3), 4, Reply::Held(secs(10)));
    assert!(matches!(effects[1], Effect::SetTimer { .. }), "{effects:?}");
    assert!(h.vvm.waits_for_round());
    assert!(h.vvm.watches_slots());
}

// covers: VVM.TryAtExpiry
#[test]
fn v4_a_round_refused_with_time_left_waits_for_the_earliest_expiry() {
    let mut h = Harness::new(&config(2));
    h.on(VvmEvent::Launch { now: t0() });
    h.reply(t0() + ms(2), 1, Reply::Held(secs(7)));
    // Expiries t0+7.002 s and t0+3.005 s: the earlier one, past the 1 s round interval.
    assert_eq!(
        h.reply(t0() + ms(5), 2, Reply::Held(secs(3))),
        [
            Effect::NotAcquired {
                slot: Slot(2),
                refusal: Refusal::Held
            },
            Effect::SetTimer {
                timer: TimerId {
                    kind: TimerKind::Round,
                    seq: 1
                },
                at: t0() + ms(3_005)
            }
        ]
    );
}

// covers: VVM.TryAtExpiry
#[test]
fn v4_a_slot_refused_without_time_left_keeps_the_round_interval() {
    let mut h = Harness::new(&config(2));
    h.on(VvmEvent::Launch { now: t0() });
    h.reply(t0(), 1, Reply::Held(secs(7)));
    // Slot 2 says nothing of its expiry: the round interval (1 s) is the next try.
    let effects = h.reply(t0(), 2, Reply::Rejected);
    assert_eq!(
        effects[1],
        Effect::SetTimer {
            timer: TimerId {
                kind: TimerKind::Round,
                seq: 1
            },
            at: t0() + secs(1)
        }
    );
    // An expiry sooner than the interval wins over it; a store failure is blind too.
    let mut h = Harness::new(&config(2));
    h.on(VvmEvent::Launch { now: t0() });
    h.reply(t0(), 1, Reply::Failed);
    let effects = h.reply(t0(), 2, Reply::Held(ms(300)));
    assert_eq!(
        effects[1],
        Effect::SetTimer {
            timer: TimerId {
                kind: TimerKind::Round,
                seq: 1
            },
            at: t0() + ms(300)
        }
    );
}

// covers: VVM.TryAtExpiry
#[test]
fn v4_the_expiry_wait_is_bounded_below_and_by_the_acquisition_end() {
    let config = VvmConfig::builder("a")
        .acquisition(secs(2))
        .build()
        .unwrap();
    let mut h = Harness::new(&config);
    h.on(VvmEvent::Launch { now: t0() });
    let effects = h.reply(t0(), 1, Reply::Held(Duration::ZERO));
    assert_eq!(
        effects[1],
        Effect::SetTimer {
            timer: TimerId {
                kind: TimerKind::Round,
                seq: 1
            },
            at: t0() + EXPIRY_RETRY_MIN
        }
    );
    h.on(VvmEvent::Timer {
        now: t0() + EXPIRY_RETRY_MIN,
        timer: TimerId {
            kind: TimerKind::Round,
            seq: 1,
        },
    });
    let effects = h.reply(t0() + ms(1), 2, Reply::Held(secs(60)));
    assert_eq!(
        effects[1],
        Effect::SetTimer {
            timer: TimerId {
                kind: TimerKind::Round,
                seq: 2
            },
            at: t0() + secs(2)
        }
    );
}

// covers: VVM.tryToAcquireLeadership
#[test]
fn v4_the_round_timer_never_goes_past_the_acquisition_end() {
    let config = VvmConfig::builder("a")
        .acquisition(secs(2))
        .round_interval(secs(5))
        .build()
        .unwrap();
    let mut h = Harness::new(&config);
    h.on(VvmEvent::Launch { now: t0() });
    let effects = h.reply(t0() + ms(100), 1, Reply::Rejected);
    assert_eq!(
        effects[1],
        Effect::SetTimer {
            timer: TimerId {
                kind: TimerKind::Round,
                seq: 1
            },
            at: t0() + secs(2)
        }
    );
}

// covers: VVM.StandbyForever
#[test]
fn v4_a_standby_forever_keeps_waiting_rounds_however_late_it_is() {
    let config = VvmConfig::builder("a").acquire_forever().build().unwrap();
    let mut h = Harness::new(&config);
    h.on(VvmEvent::Launch { now: t0() });
    let mut now = t0();
    let mut op = 1;
    // Rounds a hundred years apart: each refusal waits for the next round, none gives up.
    for round in 1..=5u64 {
        now = now + Duration::from_secs(100 * 365 * 86_400);
        assert_eq!(
            h.reply(now, op, Reply::Rejected),
            [
                Effect::NotAcquired {
                    slot: Slot(1),
                    refusal: Refusal::Held
                },
                Effect::SetTimer {
                    timer: TimerId {
                        kind: TimerKind::Round,
                        seq: round
                    },
                    at: now + secs(1)
                }
            ]
        );
        assert_eq!(h.vvm.problem(), None);
        op += 1;
        assert_eq!(h.on(VvmEvent::SlotChanged { now }), [insert(op, 1)]);
    }
    // Still stoppable at once: the shutdown waits only for the insert in flight.
    assert_eq!(h.on(VvmEvent::Shutdown { now }), [Effect::MonitorStopped]);
    assert_eq!(h.vvm.phase(), Phase::StoppingMonitor);
    assert_eq!(h.vvm.problem(), None);
}

// covers: VVM.tryToAcquireLeadership, VVM.updateProblem
#[test]
fn v5_acquisition_ends_with_a_problem_when_its_duration_is_over() {
    let config = VvmConfig::builder("a")
        .acquisition(secs(1))
        .build()
        .unwrap();
    let mut h = Harness::new(&config);
    h.on(VvmEvent::Launch { now: t0() });
    assert_eq!(
        h.reply(t0() + secs(1), 1, Reply::Rejected),
        [
            Effect::NotAcquired {
                slot: Slot(1),
                refusal: Refusal::Held
            },
            Effect::ProblemRaised {
                problem: Problem::AcquisitionFailed
            }
        ]
    );
    assert_eq!(h.vvm.phase(), Phase::Idle);
    assert_eq!(h.vvm.problem(), Some(Problem::AcquisitionFailed));
}

// covers: VVM.LaunchVVM
#[test]
fn v7_services_started_completes_the_launch() {
    let mut h = Harness::starting();
    assert_eq!(
        h.on(VvmEvent::ServicesStarted { now: t0() }),
        [Effect::Running { token: token(1, 5) }]
    );
    assert_eq!(h.vvm.phase(), Phase::Running);
}

// covers: VVM.updateProblem
#[test]
fn v8_a_service_failing_to_start_is_the_problem() {
    let mut h = Harness::starting();
    assert_eq!(
        h.on(VvmEvent::ServiceFailed {
            now: t0(),
            index: 2
        }),
        [Effect::ProblemRaised {
            problem: Problem::ServiceStartFailed { index: 2 }
        }]
    );
    assert_eq!(h.vvm.phase(), Phase::Running);
}

// covers: VVM.updateProblem
#[test]
fn v9_a_running_service_failure_is_the_problem_and_only_the_first_counts() {
    let mut h = Harness::running();
    assert_eq!(
        h.on(VvmEvent::ServiceFailed {
            now: t0(),
            index: 0
        }),
        [Effect::ProblemRaised {
            problem: Problem::ServiceFailed { index: 0 }
        }]
    );
    assert_eq!(
        h.on(VvmEvent::ServiceFailed {
            now: t0(),
            index: 1
        }),
        []
    );
    assert_eq!(h.vvm.problem(), Some(Problem::ServiceFailed { index: 0 }));
}

// covers: LeadershipMonitor, VVM.updateProblem, VVM.LossKeepsRecord
#[test]
fn v10_a_leadership_loss_is_the_problem_and_stops_the_services_without_a_delete() {
    let mut h = Harness::running();
    let renew = t0() + secs(5);
    h.on(VvmEvent::Timer {
        now: renew,
        timer: lease_timer(2),
    });
    let lost = Problem::LeadershipLost {
        slot: Slot(1),
        reason: LossReason::Overtaken,
    };
    assert_eq!(
        h.reply(renew, 3, Reply::Rejected),
        [
            Effect::Lost {
                slot: Slot(1),
                reason: LossReason::Overtaken
            },
            Effect::ProblemRaised { problem: lost },
            Effect::StopServices
        ]
    );
    assert_eq!(h.vvm.phase(), Phase::StoppingServices);
    assert_eq!(h.vvm.problem(), Some(lost));
    assert_eq!(h.vvm.token(), None);
    // Once the services stopped, the shutdown finishes by itself: nothing to delete, and the
    // kill deadline stays armed (no DisarmKiller after a loss).
    assert_eq!(
        h.on(VvmEvent::ServicesStopped {
            now: renew + secs(1),
            clean: true
        }),
        [
            Effect::MonitorStopped,
            Effect::Released {
                slot: None,
                deleted: false
            },
            Effect::Finished {
                problem: Some(lost)
            }
        ]
    );
    assert_eq!(h.vvm.phase(), Phase::Shutdown);
}

// covers: LeadershipMonitor, VVM.LossKeepsRecord
#[test]
fn v10_a_renewal_given_up_stops_the_services_and_leaves_the_record() {
    // Every renewal fails until no retry could beat the deadline (t0 + 16 s).
    let mut h = Harness::running();
    let mut now = t0() + secs(5);
    h.on(VvmEvent::Timer {
        now,
        timer: lease_timer(2),
    });
    let mut op = 3;
    let mut seq = 4;
    for backoff in [1, 2, 4] {
        h.reply(now, op, Reply::Failed);
        now = now + secs(backoff);
        h.on(VvmEvent::Timer {
            now,
            timer: lease_timer(seq),
        });
        op += 2;
        seq += 2;
    }
    let effects = h.reply(now, op, Reply::Failed);
    assert_eq!(
        effects,
        [
            Effect::Lost {
                slot: Slot(1),
                reason: LossReason::RenewalFailed
            },
            Effect::ProblemRaised {
                problem: Problem::LeadershipLost {
                    slot: Slot(1),
                    reason: LossReason::RenewalFailed
                }
            },
            Effect::StopServices
        ]
    );
    assert!(h.vvm.leadership().is_idle(), "no delete in flight");
}

// covers: LeadershipMonitor, VVM.updateProblem
#[test]
fn v10a_a_loss_while_services_stop_keeps_the_first_problem() {
    let mut h = Harness::running();
    let renew = t0() + secs(5);
    h.on(VvmEvent::Timer {
        now: renew,
        timer: lease_timer(2),
    });
    h.on(VvmEvent::Shutdown { now: renew });
    assert_eq!(
        h.reply(renew, 3, Reply::Rejected),
        [
            Effect::Lost {
                slot: Slot(1),
                reason: LossReason::Overtaken
            },
            Effect::ProblemRaised {
                problem: Problem::LeadershipLost {
                    slot: Slot(1),
                    reason: LossReason::Overtaken
                }
            }
        ]
    );
    assert_eq!(h.vvm.phase(), Phase::StoppingServices);
}

// covers: VVM.Shutdown
#[test]
fn v11_shutdown_stops_the_services_first() {
    let mut h = Harness::running();
    assert_eq!(
        h.on(VvmEvent::Shutdown { now: t0() }),
        [Effect::StopServices]
    );
    assert_eq!(h.vvm.phase(), Phase::StoppingServices);

    let mut starting = Harness::starting();
    assert_eq!(
        starting.on(VvmEvent::Shutdown { now: t0() }),
        [Effect::StopServices]
    );
}

// covers: VVM.ShutdownAnyState, Lease.ReleaseDuringOp
#[test]
fn v12_shutdown_during_acquisition_waits_for_the_insert_and_releases_a_win() {
    let mut h = Harness::new(&config(1));
    h.on(VvmEvent::Launch { now: t0() });
    // No services ran; the monitor stops at once and the release waits for the insert's reply.
    assert_eq!(
        h.on(VvmEvent::Shutdown { now: t0() }),
        [Effect::MonitorStopped]
    );
    assert_eq!(h.vvm.phase(), Phase::StoppingMonitor);
    // The insert won after all: deleted at once, no services, no killer armed.
    assert_eq!(
        h.reply(t0() + ms(2), 1, Reply::Written(Revision(5))),
        [cad(2, 5)]
    );
    assert_eq!(h.vvm.phase(), Phase::CleaningElections);
    assert_eq!(
        h.reply(t0() + ms(4), 2, Reply::Deleted),
        [
            Effect::Released {
                slot: Some(Slot(1)),
                deleted: true
            },
            Effect::Finished { problem: None }
        ]
    );
    assert_eq!(h.vvm.phase(), Phase::Shutdown);
}

// covers: VVM.ShutdownAnyState
#[test]
fn v12_shutdown_during_acquisition_finishes_when_the_insert_loses() {
    let mut h = Harness::new(&config(2));
    h.on(VvmEvent::Launch { now: t0() });
    h.on(VvmEvent::Shutdown { now: t0() });
    // Slot 1 was held: no next slot is tried during shutdown.
    assert_eq!(
        h.reply(t0(), 1, Reply::Rejected),
        [
            Effect::NotAcquired {
                slot: Slot(1),
                refusal: Refusal::Held
            },
            Effect::Released {
                slot: Some(Slot(1)),
                deleted: false
            },
            Effect::Finished { problem: None }
        ]
    );
}

// covers: VVM.ShutdownAnyState
#[test]
fn v12_v14_shutdown_after_a_failed_acquisition_finishes_with_its_problem() {
    let config = VvmConfig::builder("a")
        .acquisition(secs(1))
        .build()
        .unwrap();
    let mut h = Harness::new(&config);
    h.on(VvmEvent::Launch { now: t0() });
    h.reply(t0() + secs(1), 1, Reply::Rejected);
    assert_eq!(
        h.on(VvmEvent::Shutdown {
            now: t0() + secs(2)
        }),
        [
            Effect::MonitorStopped,
            Effect::Released {
                slot: None,
                deleted: false
            },
            Effect::Finished {
                problem: Some(Problem::AcquisitionFailed)
            }
        ]
    );
}

// covers: VVM.ShutdownAnyState
#[test]
fn v12_shutdown_between_rounds_finishes_at_once() {
    let mut h = Harness::new(&config(1));
    h.on(VvmEvent::Launch { now: t0() });
    h.reply(t0(), 1, Reply::Rejected);
    assert_eq!(h.vvm.phase(), Phase::AcquiringLeadership);
    assert_eq!(
        h.on(VvmEvent::Shutdown { now: t0() }),
        [
            Effect::MonitorStopped,
            Effect::Released {
                slot: None,
                deleted: false
            },
            Effect::Finished { problem: None }
        ]
    );
}

// covers: VVM.Shutdown
#[test]
fn v13_v17_services_stopped_then_monitor_stopped_then_release_then_finished() {
    let mut h = Harness::running();
    h.on(VvmEvent::Shutdown {
        now: t0() + secs(1),
    });
    assert_eq!(
        h.on(VvmEvent::ServicesStopped {
            now: t0() + secs(1),
            clean: true,
        }),
        [Effect::MonitorStopped, cad(3, 5)]
    );
    assert_eq!(h.vvm.phase(), Phase::CleaningElections);
    assert_eq!(
        h.reply(t0() + secs(1), 3, Reply::Deleted),
        [
            Effect::Released {
                slot: Some(Slot(1)),
                deleted: true
            },
            Effect::DisarmKiller,
            Effect::Finished { problem: None }
        ]
    );
    assert_eq!(h.vvm.phase(), Phase::Shutdown);
}

// covers: VVM.DisarmAfterCleanRelease
#[test]
fn v17_an_unclean_stop_or_an_unconfirmed_release_keeps_the_deadline() {
    // A service was aborted (or panicked): the deadline stays although the record was deleted.
    let mut h = Harness::running();
    h.on(VvmEvent::Shutdown { now: t0() });
    h.on(VvmEvent::ServicesStopped {
        now: t0(),
        clean: false,
    });
    assert_eq!(
        h.reply(t0(), 3, Reply::Deleted),
        [
            Effect::Released {
                slot: Some(Slot(1)),
                deleted: true
            },
            Effect::Finished { problem: None }
        ]
    );
    // Clean stop, but the delete was not confirmed (timed out): the deadline stays.
    let mut h = Harness::running();
    h.on(VvmEvent::Shutdown { now: t0() });
    h.on(VvmEvent::ServicesStopped {
        now: t0(),
        clean: true,
    });
    assert_eq!(
        h.reply(t0(), 3, Reply::Unknown),
        [
            Effect::Released {
                slot: Some(Slot(1)),
                deleted: false
            },
            Effect::Finished { problem: None }
        ]
    );
}

// covers: VVM.ServicesVanished
#[test]
fn v9a_services_that_end_unasked_are_a_problem_and_never_clean() {
    // While starting: launch must not wait for a start report that never comes.
    let mut h = Harness::starting();
    assert_eq!(
        h.on(VvmEvent::ServicesStopped {
            now: t0(),
            clean: false
        }),
        [Effect::ProblemRaised {
            problem: Problem::ServicesVanished
        }]
    );
    assert_eq!(h.vvm.phase(), Phase::Running);
    // The host shuts down: nothing left to stop; the release is confirmed, yet the deadline
    // stays, since what the vanished pipeline left behind cannot be vouched for.
    assert_eq!(
        h.on(VvmEvent::Shutdown { now: t0() }),
        [Effect::StopServices]
    );
    h.on(VvmEvent::ServicesStopped {
        now: t0(),
        clean: true,
    });
    assert_eq!(
        h.reply(t0(), 3, Reply::Deleted),
        [
            Effect::Released {
                slot: Some(Slot(1)),
                deleted: true
            },
            Effect::Finished {
                problem: Some(Problem::ServicesVanished)
            }
        ]
    );
    // While running.
    let mut h = Harness::running();
    assert_eq!(
        h.on(VvmEvent::ServicesStopped {
            now: t0(),
            clean: false
        }),
        [Effect::ProblemRaised {
            problem: Problem::ServicesVanished
        }]
    );
}

// covers: VVM.Shutdown, Lease.ReleaseDuringOp
#[test]
fn v15_v16_a_renewal_in_flight_is_waited_for_before_the_release() {
    let mut h = Harness::running();
    let renew = t0() + secs(5);
    h.on(VvmEvent::Timer {
        now: renew,
        timer: lease_timer(2),
    });
    h.on(VvmEvent::Shutdown { now: renew });
    // The monitor stops: no new renewal will be sent; the one in flight is waited for.
    assert_eq!(
        h.on(VvmEvent::ServicesStopped {
            now: renew,
            clean: true
        }),
        [Effect::MonitorStopped]
    );
    assert_eq!(h.vvm.phase(), Phase::StoppingMonitor);
    // It committed: the release deletes the new revision (no new deadline, no new timer).
    assert_eq!(
        h.reply(renew + ms(1), 3, Reply::Written(Revision(6))),
        [cad(4, 6)]
    );
    assert_eq!(h.vvm.phase(), Phase::CleaningElections);
    assert_eq!(
        h.reply(renew + ms(2), 4, Reply::Deleted),
        [
            Effect::Released {
                slot: Some(Slot(1)),
                deleted: true
            },
            Effect::DisarmKiller,
            Effect::Finished { problem: None }
        ]
    );
}

// covers: VVM.Shutdown, LeadershipMonitor
#[test]
fn v17_shutdown_after_a_loss_returns_the_loss() {
    let mut h = Harness::running();
    let renew = t0() + secs(5);
    h.on(VvmEvent::Timer {
        now: renew,
        timer: lease_timer(2),
    });
    h.reply(renew, 3, Reply::Rejected);
    // The loss already stopped the services; the host's shutdown adds nothing.
    assert_eq!(h.on(VvmEvent::Shutdown { now: renew }), []);
    let lost = Problem::LeadershipLost {
        slot: Slot(1),
        reason: LossReason::Overtaken,
    };
    assert_eq!(
        h.on(VvmEvent::ServicesStopped {
            now: renew,
            clean: true
        }),
        [
            Effect::MonitorStopped,
            Effect::Released {
                slot: None,
                deleted: false
            },
            Effect::Finished {
                problem: Some(lost)
            }
        ]
    );
}

// covers: LeadershipMonitor
#[test]
fn v10_a_loss_while_services_start_stops_them_and_is_never_running() {
    let mut h = Harness::starting();
    let renew = t0() + secs(5);
    h.on(VvmEvent::Timer {
        now: renew,
        timer: lease_timer(2),
    });
    let effects = h.reply(renew, 3, Reply::Rejected);
    assert_eq!(effects.last(), Some(&Effect::StopServices));
    assert_eq!(h.on(VvmEvent::ServicesStarted { now: renew }), []);
    assert_eq!(h.vvm.phase(), Phase::StoppingServices);
}

// covers: VVM.ShutdownAnyState
#[test]
fn v18_a_second_shutdown_is_a_no_op() {
    let mut h = Harness::running();
    h.on(VvmEvent::Shutdown { now: t0() });
    assert_eq!(h.on(VvmEvent::Shutdown { now: t0() }), []);
    h.on(VvmEvent::ServicesStopped {
        now: t0(),
        clean: true,
    });
    h.reply(t0(), 3, Reply::Deleted);
    assert_eq!(h.vvm.phase(), Phase::Shutdown);
    assert_eq!(h.on(VvmEvent::Shutdown { now: t0() }), []);
    assert_eq!(h.reply(t0(), 3, Reply::Deleted), []);
}

// covers: VVM.updateProblem
#[test]
fn a_service_failing_while_being_stopped_is_still_reported_if_first() {
    let mut h = Harness::running();
    h.on(VvmEvent::Shutdown { now: t0() });
    assert_eq!(
        h.on(VvmEvent::ServiceFailed {
            now: t0(),
            index: 1
        }),
        [Effect::ProblemRaised {
            problem: Problem::ServiceFailed { index: 1 }
        }]
    );
}

// ---- On a session (`Lifecycle::on_session`, rows V19–V26 and the shared rows) ----

fn acquire(op: u64, slot: u32) -> Effect {
    Effect::Insert {
        op: OpId(op),
        slot: Slot(slot),
        ttl: Duration::ZERO,
    }
}

fn release(op: u64, slot: u32, expected: u64) -> Effect {
    Effect::CompareAndDelete {
        op: OpId(op),
        slot: Slot(slot),
        expected: Revision(expected),
    }
}

impl Harness {
    fn on_session(slots: u32) -> Self {
        Harness {
            vvm: Lifecycle::on_session(&config(slots)),
            out: Effects::new(),
        }
    }

    /// On a session, holding slot 1 at revision 5 (acquire op 1), services running.
    fn running_on_session() -> Self {
        let mut h = Harness::on_session(1);
        h.on(VvmEvent::Launch { now: t0() });
        h.reply(t0(), 1, Reply::Written(Revision(5)));
        h.on(VvmEvent::ServicesStarted { now: t0() });
        h
    }

    fn session_lost(&mut self, reason: LossReason) -> Vec<Effect> {
        self.on(VvmEvent::SessionLost { now: t0(), reason })
    }
}

// covers: VVM.OnSession
#[test]
fn on_session_launch_acquires_through_the_session_and_starts_services_without_a_timer() {
    let mut h = Harness::on_session(2);
    assert!(h.vvm.is_on_session());
    assert_eq!(h.on(VvmEvent::Launch { now: t0() }), [acquire(1, 1)]);
    assert_eq!(
        h.reply(t0(), 1, Reply::Rejected),
        [
            Effect::NotAcquired {
                slot: Slot(1),
                refusal: Refusal::Held
            },
            acquire(2, 2)
        ]
    );
    assert_eq!(
        h.reply(t0(), 2, Reply::Written(Revision(9))),
        [
            Effect::Acquired { token: token(2, 9) },
            Effect::StartServices { token: token(2, 9) }
        ]
    );
    assert_eq!(
        h.on(VvmEvent::ServicesStarted { now: t0() }),
        [Effect::Running { token: token(2, 9) }]
    );
    assert_eq!(h.vvm.token(), Some(token(2, 9)));
    assert!(h.vvm.leadership().is_idle(), "the lease machine never acts");
    // A lease timer means nothing to a holding (fast path).
    assert_eq!(
        h.on(VvmEvent::Timer {
            now: t0() + secs(5),
            timer: lease_timer(1)
        }),
        []
    );
}

// covers: VVM.VanishedStops, Holding.Vanished
#[test]
fn v6b_on_a_session_a_vanished_holding_stops_the_services_at_once_and_never_says_clean() {
    let mut h = Harness::on_session(1);
    h.on(VvmEvent::Launch { now: t0() });
    assert_eq!(h.vvm.watches_own_record(), None, "nothing held yet");
    h.reply(t0(), 1, Reply::Written(Revision(9)));
    assert_eq!(h.vvm.watches_own_record(), Some(Slot(1)), "starting");
    h.on(VvmEvent::ServicesStarted { now: t0() });
    assert_eq!(h.vvm.watches_own_record(), Some(Slot(1)), "running");
    assert_eq!(h.on(VvmEvent::RecordVanished { now: t0() }), vanished(true));
    assert_eq!(h.vvm.token(), None);
    assert_eq!(h.vvm.watches_own_record(), None);
    assert_eq!(h.on(VvmEvent::RecordVanished { now: t0() }), []);
    // Nothing of ours is left to delete; the session is not vouched for (no DisarmKiller).
    assert_eq!(
        h.on(VvmEvent::ServicesStopped {
            now: t0(),
            clean: true
        }),
        [
            Effect::MonitorStopped,
            Effect::Released {
                slot: None,
                deleted: false
            },
            Effect::Finished {
                problem: Some(Problem::LeadershipLost {
                    slot: Slot(1),
                    reason: LossReason::Overtaken
                })
            }
        ]
    );
}

// covers: VVM.OnSession, VVM.SessionCleanFinish
#[test]
fn v26_clean_shutdown_on_a_session_releases_the_holding_then_says_clean() {
    let mut h = Harness::running_on_session();
    assert_eq!(
        h.on(VvmEvent::Shutdown { now: t0() }),
        [Effect::StopServices]
    );
    assert_eq!(
        h.on(VvmEvent::ServicesStopped {
            now: t0(),
            clean: true
        }),
        [Effect::MonitorStopped, release(2, 1, 5)]
    );
    assert_eq!(h.vvm.phase(), Phase::CleaningElections);
    assert_eq!(
        h.reply(t0(), 2, Reply::Deleted),
        [
            Effect::Released {
                slot: Some(Slot(1)),
                deleted: true
            },
            Effect::DisarmKiller,
            Effect::Finished { problem: None }
        ]
    );
}

// covers: VVM.SessionCleanFinish
#[test]
fn v26_a_stop_that_was_not_clean_on_a_session_does_not_say_clean() {
    let mut h = Harness::running_on_session();
    h.on(VvmEvent::Shutdown { now: t0() });
    h.on(VvmEvent::ServicesStopped {
        now: t0(),
        clean: false,
    });
    assert_eq!(
        h.reply(t0(), 2, Reply::Deleted),
        [
            Effect::Released {
                slot: Some(Slot(1)),
                deleted: true
            },
            Effect::Finished { problem: None }
        ]
    );
}

// covers: VVM.SessionLossStops, VVM.SessionCleanFinish
#[test]
fn v22_a_lost_session_stops_the_services_and_never_says_clean() {
    let mut h = Harness::running_on_session();
    let problem = Problem::LeadershipLost {
        slot: Slot(1),
        reason: LossReason::RenewalFailed,
    };
    assert_eq!(
        h.session_lost(LossReason::RenewalFailed),
        [
            Effect::Lost {
                slot: Slot(1),
                reason: LossReason::RenewalFailed
            },
            Effect::ProblemRaised { problem },
            Effect::StopServices
        ]
    );
    assert_eq!(h.vvm.token(), None);
    // V23: a second loss report changes nothing.
    assert_eq!(h.session_lost(LossReason::Overtaken), []);
    assert_eq!(
        h.on(VvmEvent::ServicesStopped {
            now: t0(),
            clean: true
        }),
        [
            Effect::MonitorStopped,
            Effect::Released {
                slot: None,
                deleted: false
            },
            Effect::Finished {
                problem: Some(problem)
            }
        ]
    );
}

// covers: VVM.SessionLossStops
#[test]
fn v19_v20_a_session_lost_during_the_acquire_ends_acquisition_even_if_it_was_written() {
    let mut h = Harness::on_session(3);
    h.on(VvmEvent::Launch { now: t0() });
    assert_eq!(h.session_lost(LossReason::Overtaken), []);
    assert_eq!(
        h.reply(t0(), 1, Reply::Written(Revision(5))),
        [
            Effect::NotAcquired {
                slot: Slot(1),
                refusal: Refusal::StoreFailed
            },
            Effect::ProblemRaised {
                problem: Problem::AcquisitionFailed
            }
        ]
    );
    assert_eq!(h.vvm.phase(), Phase::Idle);
    assert_eq!(h.vvm.token(), None);
}

// covers: VVM.SessionLossStops
#[test]
fn v21_a_session_lost_between_rounds_ends_acquisition() {
    let mut h = Harness::on_session(1);
    h.on(VvmEvent::Launch { now: t0() });
    h.reply(t0(), 1, Reply::Rejected);
    assert!(h.vvm.waits_for_round());
    assert_eq!(
        h.session_lost(LossReason::Overtaken),
        [Effect::ProblemRaised {
            problem: Problem::AcquisitionFailed
        }]
    );
    assert_eq!(h.vvm.phase(), Phase::Idle);
    // The shutdown then finishes without saying clean: the session was lost.
    assert_eq!(
        h.on(VvmEvent::Shutdown { now: t0() }),
        [
            Effect::MonitorStopped,
            Effect::Released {
                slot: None,
                deleted: false
            },
            Effect::Finished {
                problem: Some(Problem::AcquisitionFailed)
            }
        ]
    );
}

// covers: VVM.OwnSessionReopens
#[test]
fn v20a_v21a_v27_an_own_session_lost_while_campaigning_is_opened_anew() {
    let until = t0() + secs(120); // the default acquisition
    let own = |slots| Harness {
        vvm: Lifecycle::on_own_session(&config(slots)),
        out: Effects::new(),
    };
    // Lost between rounds: a fresh session is asked for (V21a), then a fresh round (V27).
    let mut h = own(1);
    h.on(VvmEvent::Launch { now: t0() });
    h.reply(t0(), 1, Reply::Rejected);
    assert!(h.vvm.waits_for_round());
    assert_eq!(
        h.session_lost(LossReason::RenewalFailed),
        [Effect::OpenSession { until }]
    );
    assert_eq!(h.vvm.phase(), Phase::AcquiringLeadership);
    // Nothing but the open's outcome moves it (V30): a stale round timer, a change.
    assert_eq!(h.on(VvmEvent::SlotChanged { now: t0() }), []);
    assert_eq!(
        h.on(VvmEvent::SessionOpened {
            now: t0() + secs(3)
        }),
        [acquire(2, 1)]
    );
    // The fresh session serves as the first would: the loss is forgotten.
    assert_eq!(
        h.reply(t0() + secs(3), 2, Reply::Written(Revision(7))),
        [
            Effect::Acquired { token: token(1, 7) },
            Effect::StartServices { token: token(1, 7) }
        ]
    );
    h.on(VvmEvent::ServicesStarted {
        now: t0() + secs(3),
    });
    h.on(VvmEvent::Shutdown {
        now: t0() + secs(4),
    });
    h.on(VvmEvent::ServicesStopped {
        now: t0() + secs(4),
        clean: true,
    });
    assert_eq!(
        h.reply(t0() + secs(4), 3, Reply::Deleted),
        [
            Effect::Released {
                slot: Some(Slot(1)),
                deleted: true
            },
            Effect::DisarmKiller,
            Effect::Finished { problem: None }
        ],
        "a clean stop on the fresh session says clean"
    );

    // Lost during the acquire, which was written: it wins nothing (V19), and its reply asks
    // for a fresh session (V20a).
    let mut h = own(3);
    h.on(VvmEvent::Launch { now: t0() });
    assert_eq!(h.session_lost(LossReason::RenewalFailed), []);
    assert_eq!(
        h.reply(t0() + secs(1), 1, Reply::Written(Revision(5))),
        [
            Effect::NotAcquired {
                slot: Slot(1),
                refusal: Refusal::StoreFailed
            },
            Effect::OpenSession { until }
        ]
    );
    assert_eq!(h.vvm.token(), None);
    // None opened in time: the acquisition fails (V28).
    assert_eq!(
        h.on(VvmEvent::SessionLost {
            now: until,
            reason: LossReason::RenewalFailed
        }),
        [Effect::ProblemRaised {
            problem: Problem::AcquisitionFailed
        }]
    );
    assert_eq!(h.vvm.phase(), Phase::Idle);

    // A shutdown while the fresh session opens finishes at once (V29).
    let mut h = own(1);
    h.on(VvmEvent::Launch { now: t0() });
    h.reply(t0(), 1, Reply::Rejected);
    h.session_lost(LossReason::Overtaken);
    assert_eq!(
        h.on(VvmEvent::Shutdown { now: t0() }),
        [
            Effect::MonitorStopped,
            Effect::Released {
                slot: None,
                deleted: false
            },
            Effect::Finished { problem: None }
        ]
    );

    // At the acquisition's end, a loss ends it as on a shared session (V21).
    let mut h = own(1);
    h.on(VvmEvent::Launch { now: t0() });
    h.reply(t0(), 1, Reply::Rejected);
    assert_eq!(
        h.on(VvmEvent::SessionLost {
            now: until,
            reason: LossReason::Overtaken
        }),
        [Effect::ProblemRaised {
            problem: Problem::AcquisitionFailed
        }]
    );
}

// covers: VVM.OnSession
#[test]
fn v24_v25_a_lease_and_a_provided_vvm_ignore_a_session_loss() {
    let mut h = Harness::running();
    assert_eq!(h.session_lost(LossReason::Overtaken), []);
    assert_eq!(h.vvm.phase(), Phase::Running);
    assert!(h.vvm.token().is_some());
    let mut h = Harness::on_session(1);
    assert_eq!(h.session_lost(LossReason::Overtaken), []);
    assert_eq!(h.vvm.phase(), Phase::Provided);
}

// covers: VVM.OnSession
#[test]
fn on_session_shutdown_during_the_acquire_releases_what_it_wrote() {
    let mut h = Harness::on_session(1);
    h.on(VvmEvent::Launch { now: t0() });
    assert_eq!(
        h.on(VvmEvent::Shutdown { now: t0() }),
        [Effect::MonitorStopped]
    );
    assert_eq!(h.vvm.phase(), Phase::StoppingMonitor);
    assert_eq!(
        h.reply(t0(), 1, Reply::Written(Revision(5))),
        [release(2, 1, 5)]
    );
    assert_eq!(
        h.reply(t0(), 2, Reply::Deleted),
        [
            Effect::Released {
                slot: Some(Slot(1)),
                deleted: true
            },
            Effect::DisarmKiller,
            Effect::Finished { problem: None }
        ]
    );
}
