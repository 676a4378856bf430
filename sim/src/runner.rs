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
