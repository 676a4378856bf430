//! Adversarial scenarios, each a named run of the simulator with its faults aimed by hand. Every
//! scenario also passes the oracle: no two acting leaders per slot, tokens increasing.
//!
//! Times are true time from the start of the run; the lease is the default `L = 20 s`, renewals
//! every 5 s, kill deadline 16 s after the send of the last confirmed write, acquisition rounds
//! every second.

use core::time::Duration;
use std::collections::BTreeSet;
use std::mem::discriminant;

use vvm_core::{
    ConfigError, Effect, Incarnation, LeaseConfig, LossReason, Reply, Slot, VvmConfig, VvmEvent,
    LEASE_DEFAULT,
};
use vvm_sim::oracle::{Interval, ProcessId};
use vvm_sim::params::{Fate, Outcome, Params, SECOND_NS};
use vvm_sim::store::{Answer, Call, Writer};
use vvm_sim::trace::{Death, Note};
use vvm_sim::Sim;

const S: u64 = SECOND_NS;
const MS: u64 = SECOND_NS / 1000;
const L: u64 = 20 * S;
const SLOT: Slot = Slot(1);

/// A traced simulation of `processes` VVMs over `slots` slots, nothing random unless asked.
fn sim(processes: u32, slots: u32, change: impl FnOnce(&mut Params)) -> Sim {
    let mut params = Params::calm(processes, slots);
    params.duration_ns = 10 * L;
    change(&mut params);
    assert_eq!(params.lease, LEASE_DEFAULT);
    let mut sim = Sim::new(7, params);
    sim.keep_trace();
    sim
}

/// Runs until `until_ns`, then checks the oracle and returns the acting intervals so far.
fn run_checked(sim: &mut Sim, until_ns: u64) -> Vec<Interval> {
    sim.run_until(until_ns);
    let (violations, intervals) = sim.check();
    assert!(violations.is_empty(), "oracle: {violations:#?}");
    intervals
}

/// The one process acting as leader of `slot` now.
fn holder(sim: &Sim, slot: Slot) -> ProcessId {
    match sim.acting(slot)[..] {
        [(process, _)] => process,
        ref other => panic!("expected one leader of {slot:?}, found {other:?}"),
    }
}

/// Effects a process emitted, with the true time of each.
fn effects_of(sim: &Sim, process: ProcessId) -> Vec<(u64, Effect)> {
    sim.trace()
        .iter()
        .filter_map(|note| match note {
            Note::Handled {
                at_ns,
                process: p,
                effects,
                ..
            } if *p == process => Some(effects.iter().map(move |e| (*at_ns, *e))),
            _ => None,
        })
        .flatten()
        .collect()
}

/// Events a process handled, with the true time of each.
fn events_of(sim: &Sim, process: ProcessId) -> Vec<(u64, VvmEvent)> {
    sim.trace()
        .iter()
        .filter_map(|note| match note {
            Note::Handled {
                at_ns,
                process: p,
                event,
                ..
            } if *p == process => Some((*at_ns, *event)),
            _ => None,
        })
        .collect()
}

fn death_of(sim: &Sim, process: ProcessId) -> Option<(u64, Death)> {
    sim.trace().iter().find_map(|note| match note {
        Note::Died {
            at_ns,
            process: p,
            death,
        } if *p == process => Some((*at_ns, *death)),
        _ => None,
    })
}

/// The first acting interval on `slot` that starts at or after `from_ns` by someone else.
fn successor(intervals: &[Interval], slot: Slot, from_ns: u64, not: ProcessId) -> Interval {
    *intervals
        .iter()
        .find(|i| i.token.slot == slot && i.start_ns >= from_ns && i.process != not)
        .unwrap_or_else(|| panic!("nobody took {slot:?} after {from_ns} ns: {intervals:#?}"))
}

/// When the last record `process` wrote expires: store time of its last write + L.
fn record_expiry(sim: &Sim, process: ProcessId) -> u64 {
    sim.trace()
        .iter()
        .rev()
        .find_map(|note| match note {
            Note::Store {
                at_ns,
                process: p,
                answer: Some(Answer::Reply(Reply::Written(_))),
                ..
            } if *p == process => Some(*at_ns + L),
            _ => None,
        })
        .expect("the process wrote")
}

// covers: Verify.Scenarios
// covers: Lease.Acquire, Lease.Incarnation
/// A leader SIGKILLed without a release: nobody takes over before its record expires; a successor
/// acts within `L` + one acquisition round of the kill.
#[test]
fn leader_killed_without_release_is_replaced_after_its_lease_only() {
    let mut sim = sim(2, 1, |_| {});
    run_checked(&mut sim, 12 * S);
    let leader = holder(&sim, SLOT);
    sim.crash(leader.index);
    let killed_ns = sim.now_ns();
    let intervals = run_checked(&mut sim, 5 * L);
    let expiry_ns = record_expiry(&sim, leader);
    let next = successor(&intervals, SLOT, killed_ns, leader);
    assert!(
        next.start_ns >= expiry_ns,
        "{next} started before the record expired at {expiry_ns}"
    );
    assert!(
        next.start_ns <= killed_ns + L + S,
        "{next} came later than L + one round after the kill at {killed_ns}"
    );
}

// covers: Verify.Scenarios
// covers: VVM.Shutdown, Lease.Release, Lease.ReleaseDuringOp
/// A graceful stop: services stop first, then the monitor, then the release; never the release
/// first. The release frees the slot at once, so a successor does not wait for expiry. Once with
/// nothing in flight, once with a renewal in flight (the release waits for its reply).
#[test]
fn graceful_stop_stops_services_then_the_monitor_then_releases() {
    for (stop_at_ns, slow_ns) in [(7 * S, 0), (10 * S, 300 * MS)] {
        let mut sim = sim(2, 1, |p| p.service_delay_max_ns = 2 * S);
        sim.set_fate_hook(Box::new(move |call| {
            matches!(call.call, Call::Slot(Effect::CompareAndSwap { .. })).then_some(Fate {
                to_store_ns: 0,
                outcome: Outcome::Apply,
                back_ns: slow_ns,
            })
        }));
        run_checked(&mut sim, stop_at_ns - 1);
        let leader = holder(&sim, SLOT);
        run_checked(&mut sim, stop_at_ns);
        sim.shutdown(leader.index);
        let intervals = run_checked(&mut sim, 3 * L);

        let order: Vec<&str> = effects_of(&sim, leader)
            .iter()
            .filter(|(at, _)| *at >= stop_at_ns)
            .filter_map(|(_, e)| match e {
                Effect::StopServices => Some("stop services"),
                Effect::MonitorStopped => Some("monitor stopped"),
                Effect::CompareAndDelete { .. } => Some("release"),
                Effect::Released { .. } => Some("released"),
                Effect::Finished { .. } => Some("finished"),
                _ => None,
            })
            .collect();
        assert_eq!(
            order,
            [
                "stop services",
                "monitor stopped",
                "release",
                "released",
                "finished"
            ]
        );
        let stopped_ns = events_of(&sim, leader)
            .iter()
            .find(|(_, e)| matches!(e, VvmEvent::ServicesStopped { .. }))
            .expect("services stopped")
            .0;
        let released_ns = sim
            .trace()
            .iter()
            .find_map(|n| match n {
                Note::Store {
                    at_ns,
                    process,
                    answer: Some(Answer::Reply(Reply::Deleted)),
                    ..
                } if *process == leader => Some(*at_ns),
                _ => None,
            })
            .expect("the record was deleted");
        assert!(
            stopped_ns <= released_ns,
            "released before the services stopped"
        );
        let next = successor(&intervals, SLOT, stop_at_ns, leader);
        assert!(
            next.start_ns < released_ns + 2 * S,
            "the release did not free the slot: {next}"
        );
    }
}

// covers: Verify.Scenarios
// covers: LeadershipMonitor, processKillThreshold, Lease.RetryUntilDeadline
/// A holder cut off from the store: its renewals hang and time out; it keeps retrying with
/// backoff while an answer could still beat its deadline, its services run on (the host does
/// not react) and it is killed at its deadline — strictly before anyone else acquires the slot.
#[test]
fn holder_cut_off_from_the_store_dies_before_a_successor_acquires() {
    let mut sim = sim(3, 1, |p| p.shutdown_on_problem = false);
    run_checked(&mut sim, 11 * S);
    let leader = holder(&sim, SLOT);
    sim.cut_off(leader.index, 11 * S, u64::MAX);
    let intervals = run_checked(&mut sim, 5 * L);
    let (died_ns, death) = death_of(&sim, leader).expect("the cut-off holder died");
    assert_eq!(death, Death::Killer);
    // Last confirmed renewal sent at 10 s: deadline 26 s on its (exact) clock.
    assert_eq!(died_ns, 26 * S);
    let next = successor(&intervals, SLOT, 11 * S, leader);
    assert!(
        died_ns < next.start_ns,
        "{next} acquired before the holder died at {died_ns}"
    );
    // Renewal at 15 s; each attempt times out after 0.5 s and so does its read-back; retries
    // after 1 s, 2 s and 4 s: at 17 s, 20 s and 25 s (25.5 s < 26 s). No further retry could
    // be answered in time, and the killer comes before the loss would be noticed.
    let swaps: Vec<u64> = effects_of(&sim, leader)
        .iter()
        .filter(|(at_ns, e)| *at_ns > 11 * S && matches!(e, Effect::CompareAndSwap { .. }))
        .map(|(at_ns, _)| *at_ns)
        .collect();
    assert_eq!(swaps, [15 * S, 17 * S, 20 * S, 25 * S]);
}

// covers: Verify.Scenarios
// covers: Lease.StoreTimeout, processKillThreshold
/// A renewal that hangs forever while the process itself stalls (its runtime blocked on the
/// call): the killer does not wait for the renewal path and fires at the deadline.
#[test]
fn renew_call_that_hangs_forever_cannot_delay_the_killer() {
    let mut sim = sim(1, 1, |_| {});
    sim.set_fate_hook(Box::new(|call| {
        (call.at_ns >= 14 * S).then_some(Fate::now(Outcome::Hang { commit: false }))
    }));
    run_checked(&mut sim, 14 * S);
    let leader = holder(&sim, SLOT);
    run_checked(&mut sim, 15 * S);
    assert!(matches!(
        effects_of(&sim, leader).last(),
        Some((at, Effect::CompareAndSwap { .. })) if *at == 15 * S
    ));
    sim.pause(leader.index, 3 * L);
    let intervals = run_checked(&mut sim, 5 * L);
    // The last confirmed renewal was sent at 10 s.
    assert_eq!(death_of(&sim, leader), Some((26 * S, Death::Killer)));
    assert_eq!(intervals.last().map(|i| i.end_ns), Some(26 * S));
}

// covers: Verify.Scenarios
// covers: Lease.UnknownOutcome, Lease.Incarnation
/// An insert that timed out but committed is resolved by reading it back and claimed with a
/// compare-and-swap: the deadline counts from the claim's send time, never from an attempt whose
/// record may have landed earlier. A restarted process (same address, new incarnation) whose insert outcome
/// is unknown reads back its predecessor's record and does not adopt it.
#[test]
fn insert_timed_out_but_committed_is_resolved_by_reading_back() {
    let mut sim = sim(1, 1, |p| p.restart = true);
    let mut inserts = 0;
    sim.set_fate_hook(Box::new(move |call| {
        if !matches!(call.call, Call::Slot(Effect::Insert { .. })) {
            return None;
        }
        inserts += 1;
        // The first insert commits but its answer is lost; later ones are lost entirely.
        Some(if inserts == 1 {
            Fate {
                to_store_ns: 0,
                outcome: Outcome::Hang { commit: true },
                back_ns: 0,
            }
        } else {
            Fate::now(Outcome::UnknownLost)
        })
    }));
    run_checked(&mut sim, 3 * S);
    let first = holder(&sim, SLOT);
    let effects = effects_of(&sim, first);
    let timeout = LeaseConfig::default().store_timeout().as_nanos() as u64;
    assert!(
        matches!(effects[1], (at, Effect::Get { .. }) if at == timeout),
        "{effects:?}"
    );
    assert!(
        matches!(effects[2], (at, Effect::CompareAndSwap { .. }) if at == timeout),
        "{effects:?}"
    );
    assert!(effects.contains(&(
        timeout,
        Effect::ArmKiller {
            at: at_local(&sim, first, timeout + 16 * S)
        }
    )));

    // Its successor has the same address and a new incarnation.
    sim.crash(first.index);
    sim.run_until(3 * S + 1);
    let intervals = run_checked(&mut sim, 3 * S + L - S);
    assert!(
        intervals.iter().all(|i| i.process == first),
        "the restart adopted its predecessor's record: {intervals:?}"
    );
    let (second, _) = sim.process(first.index).expect("restarted");
    assert_ne!(second, first);
    assert!(effects_of(&sim, second).iter().any(|(_, e)| matches!(
        e,
        Effect::NotAcquired {
            refusal: vvm_core::Refusal::Held,
            ..
        }
    )));
}

/// The local instant of `process` at true time `true_ns` (all scenario clocks are exact, so only
/// the origin differs).
fn at_local(sim: &Sim, process: ProcessId, true_ns: u64) -> vvm_core::Instant {
    let started = sim
        .trace()
        .iter()
        .find_map(|n| match n {
            Note::Handled {
                at_ns,
                process: p,
                event: VvmEvent::Launch { now },
                ..
            } if *p == process => Some((*at_ns, *now)),
            _ => None,
        })
        .expect("launched");
    vvm_core::Instant::from_nanos(started.1.as_nanos() + true_ns - started.0)
}

// covers: Verify.Scenarios
// covers: Lease.LostOnReject
/// The lease taken away underneath (overwritten by someone else, or deleted): the next renewal
/// is rejected and leadership is lost at once — no retry, and the cleanup cannot delete the
/// stranger's record.
#[test]
fn lease_taken_away_underneath_is_lost_at_once_without_retries() {
    for overwrite in [true, false] {
        let mut sim = sim(1, 1, |p| p.shutdown_on_problem = false);
        run_checked(&mut sim, 7 * S);
        let leader = holder(&sim, SLOT);
        let stranger = Writer {
            address: 99,
            incarnation: Incarnation(99),
        };
        if overwrite {
            sim.store_mut().overwrite(SLOT, stranger, L, 7 * S);
        } else {
            sim.store_mut().delete(SLOT);
        }
        run_checked(&mut sim, 3 * L);
        let after: Vec<Effect> = effects_of(&sim, leader)
            .into_iter()
            .filter(|(at, _)| *at > 7 * S)
            .map(|(_, e)| e)
            .collect();
        let swaps = after
            .iter()
            .filter(|e| matches!(e, Effect::CompareAndSwap { .. }))
            .count();
        assert_eq!(swaps, 1, "retried after a rejection: {after:?}");
        assert!(after.contains(&Effect::Lost {
            slot: SLOT,
            reason: LossReason::Overtaken
        }));
        assert!(!after.iter().any(|e| matches!(e, Effect::SetTimer { .. })));
        let record = sim.store().live(SLOT, 3 * S + 7 * S);
        if overwrite {
            assert_eq!(
                record.map(|r| r.writer),
                Some(stranger),
                "the stranger's record went"
            );
        }
    }
}

// covers: Verify.Scenarios
// covers: processKillThreshold, Lease.DeadlineOnlyLaterOnConfirm
/// A pause longer than `L`, once while holding and once right after a renewal was sent (which the
/// store applied): the killer fires during the pause at the old deadline, and no service ever
/// sees a renewed token after the pause began.
#[test]
fn pause_longer_than_the_lease_ends_in_the_killer_before_any_renewed_token() {
    for pause_at_ns in [11 * S, 15 * S] {
        let mut sim = sim(2, 1, |_| {});
        // The renewal sent at 15 s is applied at once; its answer arrives during the pause.
        sim.set_fate_hook(Box::new(|call| {
            (call.at_ns == 15 * S).then_some(Fate {
                to_store_ns: 0,
                outcome: Outcome::Apply,
                back_ns: MS,
            })
        }));
        run_checked(&mut sim, pause_at_ns);
        let leader = holder(&sim, SLOT);
        sim.pause(leader.index, L + L / 2);
        let intervals = run_checked(&mut sim, 5 * L);
        assert_eq!(death_of(&sim, leader), Some((26 * S, Death::Killer)));
        let late: Vec<_> = effects_of(&sim, leader)
            .into_iter()
            .filter(|(at, e)| *at > pause_at_ns && matches!(e, Effect::Renewed { .. }))
            .collect();
        assert!(late.is_empty(), "renewed after the pause: {late:?}");
        successor(&intervals, SLOT, 26 * S, leader);
    }
}

// covers: Verify.Scenarios
// covers: Lease.PreRenewalGuard
/// A pause shorter than the margin (here `0.5·L`, the margin being `0.8·L − L/4`), on clocks 10 %
/// slow and 10 % fast: leadership is kept without a gap, nobody is killed, nothing is lost.
#[test]
fn pause_shorter_than_the_margin_keeps_leadership() {
    for rate_ppm in [-100_000, 0, 100_000] {
        let mut sim = sim(2, 1, |_| {});
        sim.set_rate(0, rate_ppm);
        sim.set_rate(1, rate_ppm);
        run_checked(&mut sim, 11 * S);
        let leader = holder(&sim, SLOT);
        sim.pause(leader.index, L / 2);
        let intervals = run_checked(&mut sim, 6 * L);
        assert!(
            intervals.iter().all(|i| i.process == leader),
            "{intervals:#?}"
        );
        assert_eq!(
            sim.stats().killed + sim.stats().losses,
            0,
            "{:?}",
            sim.stats()
        );
        assert_eq!(holder(&sim, SLOT), leader);
    }
}

// covers: Verify.Scenarios
// covers: VVM.tryToAcquireLeadership, LeadershipMonitor
/// The store down for longer than `L`: every leader loses its slot and ends; after the store is
/// back, every slot has one leader within `L` + one round, and they stay (no crash loop).
#[test]
fn store_down_longer_than_the_lease_then_one_leader_per_slot() {
    for down in [Outcome::Fail, Outcome::Hang { commit: false }] {
        let slots = 3;
        let mut sim = sim(5, slots, |p| {
            p.restart = true;
            p.duration_ns = 12 * L;
        });
        let (down_ns, up_ns) = (12 * S, 12 * S + L + L / 2);
        sim.outage(down_ns, up_ns, down);
        let before = run_checked(&mut sim, down_ns);
        let leaders: BTreeSet<ProcessId> = before.iter().map(|i| i.process).collect();
        assert_eq!(leaders.len(), slots as usize);
        let intervals = run_checked(&mut sim, 12 * L);
        for i in intervals.iter().filter(|i| leaders.contains(&i.process)) {
            assert!(
                i.end_ns <= down_ns + L,
                "{i} outlived the outage start by L"
            );
        }
        let recovered_by_ns = up_ns + L + S + sim.params().restart_delay_max_ns;
        for slot in 1..=slots {
            let slot = Slot(slot);
            let next = successor(
                &intervals,
                slot,
                up_ns,
                leaders.iter().copied().next().unwrap(),
            );
            assert!(next.start_ns <= recovered_by_ns, "{next} too late");
            // One tenure from recovery to the end: nobody killed, nothing lost on the way.
            let after: Vec<_> = intervals
                .iter()
                .filter(|i| i.token.slot == slot && i.start_ns >= up_ns)
                .collect();
            assert!(
                after.iter().all(|i| i.process == next.process),
                "{after:#?}"
            );
            assert_eq!(sim.acting(slot).len(), 1);
        }
    }
}

// covers: Verify.Scenarios
// covers: Lease.Retry, Lease.UnknownOutcome
/// One slow renewal, slower than the store timeout but well inside the margin: it counts as
/// failed (or is read back), is retried after `L/20`, and leadership is kept — once with the
/// request slow (applied after the retry) and once with only the answer slow.
#[test]
fn one_slow_renewal_shorter_than_the_margin_is_retried_without_abdication() {
    for (to_store_ns, back_ns) in [(3 * S, 0), (0, 3 * S)] {
        let mut sim = sim(2, 1, |_| {});
        let mut slowed = false;
        sim.set_fate_hook(Box::new(move |call| {
            let first_late_swap = matches!(call.call, Call::Slot(Effect::CompareAndSwap { .. }))
                && call.at_ns >= 15 * S;
            (first_late_swap && !std::mem::replace(&mut slowed, true)).then_some(Fate {
                to_store_ns,
                outcome: Outcome::Apply,
                back_ns,
            })
        }));
        run_checked(&mut sim, 14 * S);
        let leader = holder(&sim, SLOT);
        let intervals = run_checked(&mut sim, 6 * L);
        assert!(
            intervals.iter().all(|i| i.process == leader),
            "{intervals:#?}"
        );
        assert_eq!(sim.stats().killed + sim.stats().losses, 0);
        let renewal: Vec<Effect> = effects_of(&sim, leader)
            .into_iter()
            .filter(|(at, _)| (15 * S..17 * S).contains(at))
            .map(|(_, e)| e)
            .filter(|e| !matches!(e, Effect::ArmKiller { .. } | Effect::SetTimer { .. }))
            .collect();
        assert!(
            matches!(
                renewal[..2],
                [Effect::CompareAndSwap { .. }, Effect::Get { .. }]
            ),
            "{renewal:?}"
        );
        assert!(
            renewal.iter().any(|e| matches!(e, Effect::Renewed { .. })),
            "{renewal:?}"
        );
    }
}

// covers: Verify.Scenarios, Verify.Liveness
// covers: VVM.tryToAcquireLeadership, Lease.FencingToken
/// `N` slots, `M > N` processes, holders crashed at random: every slot is refilled each time and
/// never has two holders; at the end every slot has exactly one.
#[test]
fn holders_killed_at_random_every_slot_is_refilled_with_one_holder() {
    let (slots, processes) = (3, 7);
    let mut sim = sim(processes, slots, |p| {
        p.restart = true;
        p.duration_ns = 40 * L;
        p.restart_delay_max_ns = L / 4;
    });
    let mut rng = vvm_sim::rng::Rng::new(11);
    let mut crash_ns = 10 * S;
    let mut crashes = 0;
    while crash_ns < 34 * L {
        run_checked(&mut sim, crash_ns);
        let slot = Slot(rng.between(1, u64::from(slots)) as u32);
        if let [(victim, _)] = sim.acting(slot)[..] {
            sim.crash(victim.index);
            crashes += 1;
            let intervals = run_checked(&mut sim, crash_ns + L + 2 * S);
            successor(&intervals, slot, crash_ns, victim);
        }
        // Sometimes the next crash hits a fresh holder, sometimes a settled one.
        crash_ns = sim.now_ns() + rng.between(0, L);
    }
    assert!(crashes >= 10, "only {crashes} crashes");
    run_checked(&mut sim, 40 * L);
    for slot in 1..=slots {
        assert_eq!(sim.acting(Slot(slot)).len(), 1, "slot {slot}");
    }
}

// covers: Verify.Scenarios
// covers: VVMConfig.Orch, Config.Validation
/// Every invalid configuration is rejected, each kind of mistake with its own error.
#[test]
fn every_invalid_configuration_is_rejected_with_its_own_error() {
    let ok = || VvmConfig::builder("10.0.0.1:7000");
    let secs = Duration::from_secs;
    let cases: Vec<(Result<VvmConfig, ConfigError>, &str)> = vec![
        (
            ok().lease(Duration::from_millis(1999)).build(),
            "LeaseTooShort",
        ),
        (ok().lease(secs(24 * 3600 + 1)).build(), "LeaseTooLong"),
        (
            ok().store_timeout(Duration::ZERO).build(),
            "StoreTimeoutOutOfRange",
        ),
        (
            ok().store_timeout(secs(1)).build(),
            "StoreTimeoutOutOfRange",
        ),
        (ok().slots(0).build(), "NoSlots"),
        (ok().slots(1025).build(), "TooManySlots"),
        (VvmConfig::builder("").build(), "EmptyAddress"),
        (
            VvmConfig::builder("a".repeat(256)).build(),
            "AddressTooLong",
        ),
        (
            VvmConfig::builder("a\u{7}b").build(),
            "AddressHasControlCharacter",
        ),
        (
            ok().acquisition(secs(7 * 24 * 3600 + 1)).build(),
            "AcquisitionTooLong",
        ),
        (
            ok().round_interval(Duration::ZERO).build(),
            "RoundIntervalZero",
        ),
    ];
    let mut kinds = BTreeSet::new();
    let mut errors = Vec::new();
    for (result, expected) in cases {
        let error = result.expect_err(expected);
        assert!(
            format!("{error:?}").starts_with(expected),
            "{error:?} is not {expected}"
        );
        assert!(!error.to_string().is_empty());
        kinds.insert(expected);
        errors.push(discriminant(&error));
    }
    // The lease type alone says the same.
    assert!(matches!(
        LeaseConfig::new(Duration::from_millis(1999)),
        Err(ConfigError::LeaseTooShort { .. })
    ));
    assert!(matches!(
        LeaseConfig::new(secs(24 * 3600 + 1)),
        Err(ConfigError::LeaseTooLong { .. })
    ));
    assert!(matches!(
        LeaseConfig::default().with_store_timeout(LeaseConfig::default().retry_interval()),
        Err(ConfigError::StoreTimeoutOutOfRange { .. })
    ));
    // Distinct mistakes, distinct errors: as many error kinds as kinds of mistake.
    let distinct: Vec<_> = errors.iter().fold(Vec::new(), |mut seen, d| {
        if !seen.contains(d) {
            seen.push(*d);
        }
        seen
    });
    assert_eq!(distinct.len(), kinds.len());
    // The boundaries themselves are valid.
    assert!(ok().lease(secs(2)).slots(1024).build().is_ok());
    assert!(ok()
        .lease(secs(24 * 3600))
        .acquisition(vvm_core::ACQUISITION_MAX)
        .build()
        .is_ok());
    assert!(VvmConfig::builder("a".repeat(255)).build().is_ok());
}

// covers: Verify.Scenarios
// covers: processKillThreshold
/// Answers that arrive late — held back by a pause of the process, or slower than usual but inside
/// the store timeout — still confirm the write, and the deadline counts from the send, never from
/// the answer.
#[test]
fn late_answers_keep_the_deadline_anchored_to_the_send() {
    let mut sim = sim(1, 1, |_| {});
    sim.set_fate_hook(Box::new(|_| {
        Some(Fate {
            to_store_ns: 0,
            outcome: Outcome::Apply,
            back_ns: 400 * MS,
        })
    }));
    // The insert goes out at 0; the process pauses at once and handles its answer at 10 s.
    sim.run_until(0);
    let (process, _) = sim.process(0).expect("started");
    sim.pause(0, 10 * S);
    run_checked(&mut sim, 20 * S);
    let arms: Vec<(u64, Effect)> = effects_of(&sim, process)
        .into_iter()
        .filter(|(_, e)| matches!(e, Effect::ArmKiller { .. }))
        .collect();
    let arm = |at_ns: u64, deadline_ns: u64| {
        let at = at_local(&sim, process, deadline_ns);
        (at_ns, Effect::ArmKiller { at })
    };
    // Insert sent at 0, answered at 10 s: deadline 16 s. The renewal that was due at 5 s goes out
    // on resume at 10 s and is answered at 10.4 s: deadline 26 s.
    assert_eq!(
        arms[..2],
        [arm(10 * S, 16 * S), arm(10 * S + 400 * MS, 26 * S)]
    );
}

// covers: Verify.Scenarios
/// An insert of this incarnation that timed out and landed late (after the slot came free) leaves
/// a record of ours nobody waits for. A later attempt whose outcome is unknown reads that record
/// back; adopting it with the later attempt's send time as the anchor would put the deadline past
/// the record's expiry, and a contender would act while the adopter still does. The core claims
/// such a record with a compare-and-swap instead.
#[test]
fn stale_insert_of_the_same_incarnation_is_not_adopted_as_fresh() {
    let mut sim = sim(3, 1, |p| p.duration_ns = 3 * L);
    // p0 holds from 0 and stops at 8 s. p1's insert sent at 4 s is slow and lands at 9 s, on the
    // free slot; its inserts in between fail. p2 (the contender) fails until 29 s.
    sim.at(8 * S, |sim| sim.shutdown(0));
    sim.set_fate_hook(Box::new(|call| {
        let insert = matches!(call.call, Call::Slot(Effect::Insert { .. }));
        match (call.process.index, call.at_ns) {
            (1, at) if insert && at == 4 * S => Some(Fate {
                to_store_ns: 5 * S,
                outcome: Outcome::Apply,
                back_ns: 0,
            }),
            (1, at) if insert && (4 * S..9 * S).contains(&at) => Some(Fate::now(Outcome::Fail)),
            // Its own orphan record lives until 29 s; its attempt at 24.5 s hangs, and the
            // read-back finds the orphan: adopted, it would be renewed only at 29.5 s.
            (1, at) if insert && (24 * S..25 * S).contains(&at) => {
                Some(Fate::now(Outcome::Hang { commit: false }))
            }
            (2, at) if insert && at < 29 * S => Some(Fate::now(Outcome::Fail)),
            _ => None,
        }
    }));
    run_checked(&mut sim, 3 * L);
}

/// Every call of `process` from `from_ns` on fails at once (the holder cut off from the store,
/// the others served).
fn cut_off(sim: &mut Sim, process: u32, from_ns: u64) {
    sim.set_fate_hook(Box::new(move |call| {
        (call.process.index == process && call.at_ns >= from_ns).then_some(Fate::now(Outcome::Fail))
    }));
}

// covers: Net.ClockRate
/// The clock-rate assumption (`specs/partitions.md`, 1), kept and broken. A holder cut off from
/// the store gives up once no renewal could be confirmed before its deadline — here 12 s
/// (`0.6·L`) after its last confirmed send, on its own clock — and its services stop then; the
/// store lets the successor in at the record's expiry, `L` after that send in true time. On a
/// clock 15 % slow the holder stops at 14.1 s of true time, with the killer's `0.8·L` (18.8 s)
/// still before the expiry; 30 % slow breaks the killer's bound (22.9 s) while services that stop
/// at the loss still end in time (17.1 s); 45 % slow (21.8 s) gives two leaders for 1.8 s, which the
/// oracle names and no process can see — hence the bound in the spec.
#[test]
fn a_clock_slower_than_the_assumption_lets_a_cut_off_holder_act_past_its_record() {
    for (rate_ppm, broken) in [(-150_000, false), (-300_000, false), (-450_000, true)] {
        let mut sim = sim(2, 1, |_| {});
        sim.set_rate(0, rate_ppm);
        sim.set_rate(1, rate_ppm);
        run_checked(&mut sim, 11 * S);
        let leader = holder(&sim, SLOT);
        cut_off(&mut sim, leader.index, 12 * S);
        sim.run_until(5 * L);
        let (violations, intervals) = sim.check();
        let two_leaders = violations
            .iter()
            .any(|v| matches!(v, vvm_sim::oracle::Violation::TwoLeaders { .. }));
        assert_eq!(
            two_leaders, broken,
            "clock {rate_ppm} ppm: {violations:#?}\n{intervals:#?}"
        );
        // Kept or broken, the successor comes in at the record's expiry, not before.
        successor(&intervals, SLOT, record_expiry(&sim, leader), leader);
    }
}

// covers: Net.SlowCalls
/// The assumption on call times (`specs/partitions.md`, 3) broken: from 12 s on every call takes
/// `L/10` each way (the store-call timeout is `L/40`). Safety holds — the deadline is anchored to
/// the send, and an answer that comes too late moves nothing — but liveness does not: no renewal
/// is confirmed in time, so the holder stops at its kill deadline, and whoever takes the slot
/// next loses it the same way.
#[test]
fn calls_slower_than_the_lease_allows_cost_leadership_never_safety() {
    let mut sim = sim(3, 1, |p| p.restart = true);
    run_checked(&mut sim, 11 * S);
    let leader = holder(&sim, SLOT);
    sim.set_fate_hook(Box::new(|call| {
        (call.at_ns >= 12 * S).then_some(Fate {
            to_store_ns: L / 10,
            outcome: Outcome::Apply,
            back_ns: L / 10,
        })
    }));
    let intervals = run_checked(&mut sim, 10 * L);
    let late: Vec<_> = intervals
        .iter()
        .filter(|i| i.process == leader && i.end_ns > 12 * S + 4 * L / 5 + L / 20)
        .collect();
    assert!(
        late.is_empty(),
        "the holder outlived its deadline: {late:#?}"
    );
    let stats = sim.stats();
    assert!(
        stats.killed + stats.losses >= 1,
        "leadership kept with calls slower than the timeout: {stats:?}"
    );
    assert!(
        intervals
            .iter()
            .all(|i| i.end_ns - i.start_ns <= L || i.start_ns < 12 * S),
        "a tenure begun after the calls slowed lasted past one lease: {intervals:#?}"
    );
}
