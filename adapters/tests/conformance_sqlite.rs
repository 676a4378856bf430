//! The store conformance suite on the SQLite store, twice:
//! - `paused_clock`: every case, elections included, with the store's expiry judged by tokio's
//!   paused clock (an injected [`StoreClock`]), so that letting time pass costs nothing;
//! - `boot_clock`: the TTL, observe and session cases with the default clock (`CLOCK_BOOTTIME`
//!   and the boot id) and a real short TTL that the cases sleep through.
//!
//! Every store is a new file in a scratch directory; extra clients are further connections to
//! the same file, as separate processes would have. Their lock wait is longer than the default
//! so that a machine busy with other builds does not turn a slow lock into a failed case.

use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use vvm_adapters::sqlite::{ClockError, StoreClock};
use vvm_adapters::SqliteStore;
use vvm_conformance::{Harness, ScratchDir};
use vvm_runtime::{clock::Clock, clock::TimeSource};

/// The lock wait of the test stores.
const BUSY_WAIT: Duration = Duration::from_secs(2);

/// Expiry by tokio's clock (paused in these tests), as one fixed boot.
#[derive(Clone, Copy, Debug)]
struct TokioClock;

impl StoreClock for TokioClock {
    fn boot_id(&self) -> &str {
        "0000-tokio"
    }

    fn since_boot(&self) -> Result<Duration, ClockError> {
        Ok(Duration::from_nanos(Clock.now().as_nanos()))
    }
}

/// Files in one scratch directory; `paused` selects the clock.
struct Sqlite {
    dir: ScratchDir,
    files: AtomicU64,
    paused: bool,
}

impl Sqlite {
    fn new(paused: bool) -> Self {
        Sqlite {
            dir: ScratchDir::new("vvm-conformance-sqlite"),
            files: AtomicU64::new(0),
            paused,
        }
    }

    fn open(&self, path: PathBuf) -> SqliteStore {
        let builder = SqliteStore::builder().busy_wait(BUSY_WAIT);
        let builder = if self.paused {
            builder.clock(TokioClock)
        } else {
            builder
        };
        builder.open(path).expect("the store opens")
    }
}

impl Harness for Sqlite {
    type Store = SqliteStore;

    async fn store(&self) -> SqliteStore {
        let n = self.files.fetch_add(1, Ordering::Relaxed);
        self.open(self.dir.file(&format!("store-{n}.sqlite")))
    }

    async fn client(&self, store: &SqliteStore) -> SqliteStore {
        self.open(store.path().to_owned())
    }

    fn short_ttl(&self) -> Duration {
        if self.paused {
            Duration::from_secs(10)
        } else {
            Duration::from_millis(300)
        }
    }

    async fn pass(&self, duration: Duration) {
        tokio::time::sleep(duration).await;
    }

    fn lease(&self) -> Duration {
        Duration::from_secs(20)
    }
}

mod paused_clock {
    use super::*;

    vvm_conformance::ttl_cases!(
        #[tokio::test(start_paused = true)]
        Sqlite::new(true)
    );
    vvm_conformance::elections_cases!(
        #[tokio::test(start_paused = true)]
        Sqlite::new(true)
    );
    vvm_conformance::observe_cases!(
        #[tokio::test(start_paused = true)]
        Sqlite::new(true)
    );
    vvm_conformance::feed_cases!(
        #[tokio::test(start_paused = true)]
        Sqlite::new(true)
    );
    // covers: Sq.Sessions
    vvm_conformance::session_cases!(
        #[tokio::test(start_paused = true)]
        Sqlite::new(true)
    );
    vvm_conformance::semaphore_cases!(
        #[tokio::test(start_paused = true)]
        Sqlite::new(true)
    );
}

// covers: Sq.BootClock, Sq.Atomic
mod boot_clock {
    use super::*;

    vvm_conformance::ttl_cases!(
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        Sqlite::new(false)
    );
    vvm_conformance::observe_cases!(
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        Sqlite::new(false)
    );
    vvm_conformance::session_cases!(
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        Sqlite::new(false)
    );
    vvm_conformance::semaphore_cases!(
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        Sqlite::new(false)
    );
}
