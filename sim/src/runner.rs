//! Running many seeds on every core, and the environment variables that choose them.

use std::any::Any;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::time::{Duration, Instant};

/// The number in the environment variable `name`, if it is set.
///
/// # Panics
///
/// When the variable is set to something that is not a number.
pub fn env_u64(name: &str) -> Option<u64> {
    let text = std::env::var(name).ok()?;
    Some(
        text.trim()
            .parse()
            .unwrap_or_else(|_| panic!("{name}={text} is not a number")),
    )
}

/// The seeds `first..first + count`, run on every core.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Seeds {
    /// The first seed.
    pub first: u64,
    /// How many.
    pub count: u64,
}

/// What running [`Seeds`] gave.
#[derive(Debug)]
pub struct Ran<T> {
    /// Each seed with its outcome, in no particular order.
    pub outcomes: Vec<(u64, T)>,
    /// Wall time taken.
    pub elapsed: Duration,
    /// Threads used.
    pub threads: u64,
}

impl Seeds {
    /// `VVM_SIM_FIRST_SEED` (default 0) and `VVM_SIM_SEEDS` (default `count_default`).
    pub fn from_env(count_default: u64) -> Self {
        Seeds {
            first: env_u64("VVM_SIM_FIRST_SEED").unwrap_or(0),
            count: env_u64("VVM_SIM_SEEDS").unwrap_or(count_default),
        }
    }

    /// Runs `run` on every seed, one thread per core, each thread taking every n-th seed.
    pub fn run<T: Send>(self, run: impl Fn(u64) -> T + Sync) -> Ran<T> {
        let threads = std::thread::available_parallelism().map_or(1, |n| n.get()) as u64;
        let wall = Instant::now();
        let run = &run;
        let outcomes = std::thread::scope(|scope| {
            let workers: Vec<_> = (0..threads)
                .map(|worker| {
                    scope.spawn(move || {
                        (self.first + worker..self.first + self.count)
                            .step_by(threads as usize)
                            .map(|seed| (seed, run(seed)))
                            .collect::<Vec<_>>()
                    })
                })
                .collect();
            workers
                .into_iter()
                .flat_map(|w| w.join().expect("a seed worker panicked outside a seed"))
                .collect()
        });
        Ran {
            outcomes,
            elapsed: wall.elapsed(),
            threads,
        }
    }
}

/// Runs `run`, turning a panic (a broken assertion inside a machine) into its message.
pub fn catching<T>(run: impl FnOnce() -> T) -> Result<T, String> {
    catch_unwind(AssertUnwindSafe(run)).map_err(|panic| panic_text(&*panic))
}

/// The message of a panic payload.
pub fn panic_text(panic: &(dyn Any + Send)) -> String {
    panic
        .downcast_ref::<String>()
        .cloned()
        .or_else(|| panic.downcast_ref::<&str>().map(|s| (*s).to_owned()))
        .unwrap_or_default()
}

/// Counts of a run that add up over seeds.
pub trait Totals: Default + std::fmt::Debug + Send {
    /// Adds `more` to these counts (the highest of maxima).
    fn add(&mut self, more: &Self);
}

/// What one seed did.
#[derive(Debug)]
pub struct Outcome<T> {
    /// Lease periods simulated.
    pub lease_periods: u64,
    /// Its counts.
    pub stats: T,
    /// What failed, if anything: the violations, or the panic of a machine.
    pub failure: Option<String>,
}

/// Runs one seed of `lease_periods` lease periods: `run` builds and runs a simulation and
/// returns its violations, itself and its counts; a panic inside a machine (a broken assertion)
/// counts as a failure too.
pub fn run_one<W, T: Default>(
    lease_periods: u64,
    run: impl FnOnce() -> (Vec<crate::oracle::Violation>, W, T),
) -> (Outcome<T>, Option<W>) {
    match catching(run) {
        Ok((violations, sim, stats)) => {
            let failure = (!violations.is_empty()).then(|| describe(&violations));
            let outcome = Outcome {
                lease_periods,
                stats,
                failure,
            };
            (outcome, Some(sim))
        }
        Err(text) => {
            let outcome = Outcome {
                lease_periods,
                stats: T::default(),
                failure: Some(format!("panicked: {text}")),
            };
            (outcome, None)
        }
    }
}

/// The first violations, one a line.
pub fn describe(violations: &[crate::oracle::Violation]) -> String {
    let mut text = String::new();
    for violation in violations.iter().take(5) {
        text.push_str(&format!("\n    {violation}"));
    }
    if violations.len() > 5 {
        text.push_str(&format!("\n    ... and {} more", violations.len() - 5));
    }
    text
}

/// The command that replays `seed` of the test target `test` with a trace.
pub fn replay_command(test: &str, seed: u64) -> String {
    format!("VVM_SIM_SEED={seed} cargo test -p vvm-sim --test {test} -- replay --nocapture")
}

/// Runs the seeds of the environment ([`Seeds::from_env`], `count_default` from 0 by default)
/// of the simulation `name` (test target `test`) on every core, prints what they did, and fails
/// naming each failing seed with the command that replays it. Returns the counts of every seed
/// together and how many seeds ran.
pub fn run_seeds<T: Totals>(
    name: &str,
    test: &str,
    count_default: u64,
    run: impl Fn(u64) -> Outcome<T> + Sync,
) -> (T, u64) {
    let seeds = Seeds::from_env(count_default);
    let ran = seeds.run(run);
    let mut total = T::default();
    let mut lease_periods = 0;
    let mut failures = Vec::new();
    for (seed, outcome) in &ran.outcomes {
        total.add(&outcome.stats);
        lease_periods += outcome.lease_periods;
        if let Some(failure) = &outcome.failure {
            let replay = replay_command(test, *seed);
            failures.push(format!("seed {seed} failed:{failure}\n  replay: {replay}"));
        }
    }
    let wall_s = ran.elapsed.as_secs_f64();
    println!(
        "{name}: {} seeds from {}, {lease_periods} lease periods in {wall_s:.2} s on {} \
         threads = {:.0} seeds, {:.0} lease periods per wall second; {total:?}",
        seeds.count,
        seeds.first,
        ran.threads,
        seeds.count as f64 / wall_s,
        lease_periods as f64 / wall_s,
    );
    failures.sort();
    assert!(
        failures.is_empty(),
        "{} of {} seeds failed:\n{}",
        failures.len(),
        seeds.count,
        failures.join("\n")
    );
    (total, seeds.count)
}

/// Prints the last `context` of `notes` (all of them when `everything`).
pub fn print_notes<'a>(
    notes: impl Iterator<Item = &'a crate::trace::Note>,
    everything: bool,
    context: usize,
) {
    let notes: Vec<_> = notes.collect();
    let shown = if everything { notes.len() } else { context };
    for note in notes.iter().rev().take(shown).rev() {
        println!("{note}");
    }
}
