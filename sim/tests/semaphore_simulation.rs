//! Deterministic simulation of processes that acquire and release units of one counted
//! semaphore under their sessions (the real `Session` machine and the real
//! `vvm_core::semaphore` methods in one store transaction each), under the leadership
//! simulator's seeded faults plus services slow to stop. The oracle checks what users see: the
//! owners whose services run never hold more than the limit together; grants go in queue order;
//! a waiter the store grants is woken by the feed within its push delay, and none still waits on
//! a grant at the end of a run.
//!
//! - `cargo test -p vvm-sim --test semaphore_simulation` runs the default seeds (see
//!   [`SEEDS_DEFAULT`]); `VVM_SIM_SEEDS` and `VVM_SIM_FIRST_SEED` choose others.
//! - A failing seed prints the command that replays it with a trace:
//!   `VVM_SIM_SEED=<seed> cargo test -p vvm-sim --test semaphore_simulation -- replay --nocapture`
//!   (`VVM_SIM_TRACE=1` prints the whole trace of a passing seed too; `VVM_SIM_RULE=` one of
//!   `killer-ignored`, `grant-when-fits`, `release-not-woken` replays it with that rule broken;
//!   `VVM_SIM_STALE_CALLS=1` with stale semaphore calls applied).

use vvm_sim::oracle::Violation;
use vvm_sim::runner::{describe, env_u64, print_notes, run_one, run_seeds, Outcome};
use vvm_sim::semaphore::{Rule, SemaphoreParams, SemaphoreSim, SemaphoreStats};

/// Seeds run by default.
const SEEDS_DEFAULT: u64 = 30_000;
/// Seeds an unsound variant may take to be caught.
const UNSOUND_SEEDS_MAX: u64 = 5_000;
/// Lines of the trace printed before the first violation.
const TRACE_CONTEXT_MAX: usize = 400;

/// Runs `seed` under `rule`; a panic inside a machine counts as a failure too.
fn run_seed(seed: u64, rule: Rule, trace: bool) -> (Outcome<SemaphoreStats>, Option<SemaphoreSim>) {
    run_seed_with(seed, rule, false, trace)
}

/// Runs `seed` under `rule`, with stale semaphore calls applied if `stale`.
fn run_seed_with(
    seed: u64,
    rule: Rule,
    stale: bool,
    trace: bool,
) -> (Outcome<SemaphoreStats>, Option<SemaphoreSim>) {
    let mut params = SemaphoreParams::random(seed);
    params.rule = rule;
    params.stale_calls = stale;
    let lease_periods = params.base.duration_ns / params.base.lease_ns();
    run_one(lease_periods, || {
        let mut sim = SemaphoreSim::new(seed, params);
        if trace {
            sim.keep_trace();
        }
        sim.run();
        let stats = sim.stats();
        (sim.check(), sim, stats)
    })
}

// covers: Verify.SemaphoreSafety, Verify.SemaphoreOrder, Verify.SemaphoreWakeup
/// Runs the seeds of the environment ([`SEEDS_DEFAULT`] from 0 by default) on every core: the
/// owners whose services run hold at most the limit, grants go in queue order, granted waiters
/// are woken within the feed's delay and none still waits on its grant at the end, no grant is
/// handed to services at or after the kill deadline. Fails naming each failing seed with the
/// command that replays it.
#[test]
fn seeds() {
    let (total, count) = run_seeds(
        "semaphore simulation",
        "semaphore_simulation",
        SEEDS_DEFAULT,
        |seed| run_seed(seed, Rule::Sound, false).0,
    );
    // What the claims rest on happened, and often: requests queued and granted from the queue,
    // owners sharing the semaphore, timeouts, sessions lost and processes killed while owning.
    assert!(
        total.grants > count
            && total.queued > count
            && total.granted_from_queue > count
            && total.shared > count
            && total.timed_out > count / 10
            && total.losses_while_owning > count / 100
            && total.killed_while_owning > count / 100,
        "the runs exercised too little to mean anything: {total:?}"
    );
}

/// The first seed under `rule` whose failure mentions `expected`, with its failure.
fn caught(rule: Rule, expected: &str) -> (u64, String) {
    let found = (0..UNSOUND_SEEDS_MAX).find_map(|seed| {
        let (outcome, _) = run_seed(seed, rule, false);
        outcome
            .failure
            .filter(|failure| failure.contains(expected))
            .map(|failure| (seed, failure))
    });
    found.unwrap_or_else(|| {
        panic!("no seed of {UNSOUND_SEEDS_MAX} found \"{expected}\" under {rule:?}")
    })
}

// covers: Verify.SemaphoreCanFail
/// A killer that never fires: an owner whose session was lost acts on while its units pass to
/// others, and more units run than the limit.
#[test]
fn an_ignored_killer_is_caught() {
    let (seed, failure) = caught(Rule::KillerIgnored, "owners act with");
    println!("semaphore simulation: an ignored killer makes seed {seed} fail:{failure}");
}

// covers: Verify.SemaphoreCanFail
/// A store that grants whatever fits: a later request is granted past a queued one.
#[test]
fn a_grant_past_the_queue_is_caught() {
    let (seed, failure) = caught(Rule::GrantWhenFits, "grant out of queue order");
    println!("semaphore simulation: granting past the queue makes seed {seed} fail:{failure}");
}

// covers: Verify.SemaphoreCanFail
/// A release whose write does not wake the feed: the waiter it grants is not told.
#[test]
fn a_grant_not_woken_is_caught() {
    let (seed, failure) = caught(Rule::ReleaseNotWoken, "not woken");
    println!("semaphore simulation: a release not woken makes seed {seed} fail:{failure}");
}

/// Semaphore calls that reach the store after their caller's timeout gave up on them
/// (`SemaphoreParams::stale_calls`) act on nothing the session asked since: every call names
/// its request, so a late release leaves the session's later grant alone and a late acquire is
/// refused. Without request ids, 61 of these 2 000 seeds failed (the first, seed 9, with owners
/// acting with 4 units on a semaphore of 3).
// covers: Sem.RequestIds, Verify.SemaphoreSafety
#[test]
fn stale_semaphore_calls_act_on_nothing_newer() {
    let failures: Vec<String> = (0..2_000)
        .filter_map(|seed| {
            let mut params = SemaphoreParams::random(seed);
            params.stale_calls = true;
            let mut sim = SemaphoreSim::new(seed, params);
            sim.run();
            let violations = sim.check();
            (!violations.is_empty()).then(|| format!("seed {seed}:{}", describe(&violations)))
        })
        .collect();
    assert!(
        failures.is_empty(),
        "{} of 2000 seeds failed with stale calls, the first:\n{}",
        failures.len(),
        failures[0]
    );
}

// covers: Verify.Replay
/// Replays `VVM_SIM_SEED` (default: seed 0) with a trace, printing its last lines up to the
/// first violation.
#[test]
fn replay() {
    let seed = env_u64("VVM_SIM_SEED").unwrap_or(0);
    let params = SemaphoreParams::random(seed);
    println!("seed {seed}: {params:#?}");
    let rule = match std::env::var("VVM_SIM_RULE").as_deref() {
        Err(_) | Ok("sound") => Rule::Sound,
        Ok("killer-ignored") => Rule::KillerIgnored,
        Ok("grant-when-fits") => Rule::GrantWhenFits,
        Ok("release-not-woken") => Rule::ReleaseNotWoken,
        Ok(other) => panic!("VVM_SIM_RULE={other} names no rule"),
    };
    let stale = std::env::var_os("VVM_SIM_STALE_CALLS").is_some();
    let (outcome, sim) = run_seed_with(seed, rule, stale, true);
    let Some(sim) = sim else {
        panic!("seed {seed} failed: {:?}", outcome.failure);
    };
    let violations = sim.check();
    let everything = std::env::var_os("VVM_SIM_TRACE").is_some();
    if outcome.failure.is_some() || everything {
        let until_ns = violations
            .first()
            .and_then(Violation::process_at)
            .map_or(u64::MAX, |(_, at_ns)| at_ns);
        let notes = sim.trace().iter().filter(|note| note.at_ns() <= until_ns);
        print_notes(notes, everything, TRACE_CONTEXT_MAX);
    }
    if let Some(failure) = &outcome.failure {
        panic!("seed {seed} failed:{failure}");
    }
    println!("seed {seed} passed: {:?}", outcome.stats);
}
