//! What a waiting candidate costs the store: a VVM waits for a slot whose holder renews it for
//! several lease periods, through a wrapper that counts every store call the candidate makes.
//! With the feed quiet on renewals and the next try timed by the record's expiry, the candidate
//! makes at most 2 calls per lease period (a count, not a timing); it still takes the slot as
//! soon as the holder releases it.

use vvm_test_support as common;
use vvm_test_support::hooked;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use common::TestKiller;
use hooked::{Hooked, Hooks, NoFeed};
use vvm_adapters::{MemoryStore, SqliteStore};
use vvm_core::{Slot, VvmConfig};
use vvm_runtime::{Inserted, LeaseStore, Services, StoreError, Vvm};

/// The shortest lease: renewals every 0.5 s.
const LEASE: Duration = Duration::from_secs(2);
/// Short rounds: a candidate that fell back to them would make 20 calls per lease.
const ROUND: Duration = Duration::from_millis(100);
/// Lease periods the candidate waits through.
const PERIODS: u32 = 5;
/// The bound under test.
const CALLS_PER_LEASE_MAX: u64 = 2;

/// Counts every store call made through it (the change feed is no call and is not counted).
#[derive(Clone, Default)]
struct Counting(Arc<AtomicU64>);

impl Counting {
    fn calls(&self) -> u64 {
        self.0.load(Ordering::SeqCst)
    }
}

impl Hooks for Counting {
    async fn before(&self) {
        self.0.fetch_add(1, Ordering::SeqCst);
    }
}

fn config(address: &str) -> VvmConfig {
    VvmConfig::builder(address)
        .lease(LEASE)
        .round_interval(ROUND)
        .acquisition(Duration::from_secs(600))
        .build()
        .expect("valid configuration")
}

/// A holder renews slot 1 for [`PERIODS`] lease periods while a candidate waits for it through
/// a counting store; returns the candidate's calls while waiting. Then the holder releases and
/// the candidate must take the slot.
async fn calls_while_waiting<S: LeaseStore + Clone>(store: S) -> u64 {
    let killer = TestKiller::new();
    let holder = Vvm::provide(config("holder:1"), store.clone(), Services::new())
        .expect("valid configuration")
        .with_killer(killer.thread.clone())
        .launch()
        .await;
    assert!(holder.token().is_some(), "the holder leads");
    let counting = Counting::default();
    let store = Hooked {
        store,
        hooks: counting.clone(),
    };
    let candidate = Vvm::provide(config("candidate:2"), store, Services::new())
        .expect("valid configuration")
        .with_killer(killer.thread.clone())
        .launch();
    let candidate = tokio::spawn(candidate);
    tokio::time::sleep(LEASE * PERIODS).await;
    let calls = counting.calls();
    assert!(!candidate.is_finished(), "the candidate still waits");
    holder.shutdown().await.expect("clean shutdown");
    // Generous: only that it comes, not how soon (the figures are in BENCHMARKS.md).
    let candidate = tokio::time::timeout(LEASE * 5, candidate)
        .await
        .expect("the candidate takes the released slot")
        .expect("the candidate's task");
    assert!(candidate.token().is_some(), "the candidate leads");
    candidate.shutdown().await.expect("clean shutdown");
    calls
}

fn assert_bounded(store: &str, calls: u64) {
    let periods = u64::from(PERIODS);
    eprintln!("{store}: {calls} store calls while waiting {periods} lease periods");
    assert!(
        calls <= CALLS_PER_LEASE_MAX * periods,
        "{store}: {calls} store calls in {periods} lease periods, more than {CALLS_PER_LEASE_MAX} per lease"
    );
    // Not idle either: it tried again at each expiry it learnt (one refusal per try).
    assert!(
        calls >= periods / 2,
        "{store}: only {calls} calls in {periods} lease periods"
    );
}

// covers: St.FeedIgnoresRenewals, VVM.TryAtExpiry
#[tokio::test(start_paused = true)]
async fn a_waiting_candidate_makes_at_most_two_memory_store_calls_per_lease() {
    let calls = calls_while_waiting(MemoryStore::new()).await;
    assert_bounded("memory", calls);
}

// covers: St.FeedIgnoresRenewals, St.InsertOrTimeLeft, VVM.TryAtExpiry
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiting_candidate_makes_at_most_two_sqlite_store_calls_per_lease() {
    let dir = std::env::temp_dir().join(format!("vvm-waiting-candidate-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("a scratch directory");
    let store = SqliteStore::open(dir.join("leases.sqlite")).expect("the store opens");
    let calls = calls_while_waiting(store).await;
    let _ = std::fs::remove_dir_all(&dir);
    assert_bounded("SQLite", calls);
}

/// Deletes the record under the slot right after the first insert it sees refused — a release
/// that lands between the refusal and the candidate's wait.
struct ReleaseAfterRefusal {
    store: MemoryStore,
    armed: std::sync::atomic::AtomicBool,
}

impl Hooks for ReleaseAfterRefusal {
    fn after_insert(&self, key: Slot, inserted: &Result<Inserted, StoreError>) {
        if matches!(inserted, Ok(Inserted::Held { .. })) && self.armed.swap(false, Ordering::SeqCst)
        {
            self.store.delete(key);
        }
    }
}

// covers: VVM.SubscribeBeforeInsert
#[tokio::test(start_paused = true)]
async fn a_release_between_the_refusal_and_the_wait_is_not_missed() {
    let inner = MemoryStore::new();
    inner
        .set(Slot(1), &common::foreign("holder:1"), LEASE)
        .expect("a record");
    let store = Hooked {
        store: inner.clone(),
        hooks: ReleaseAfterRefusal {
            store: inner,
            armed: std::sync::atomic::AtomicBool::new(true),
        },
    };
    let killer = TestKiller::new();
    let started = tokio::time::Instant::now();
    let candidate = Vvm::provide(config("candidate:2"), store, Services::new())
        .expect("valid configuration")
        .with_killer(killer.thread.clone())
        .launch()
        .await;
    assert!(candidate.token().is_some(), "the candidate leads");
    // The refused record would have expired a lease after the start: the feed, subscribed
    // before the insert, saw the deletion instead (paused clock: no time passes otherwise).
    assert!(
        started.elapsed() < LEASE / 2,
        "the candidate waited {:?} for a slot released right after its refusal",
        started.elapsed()
    );
    candidate.shutdown().await.expect("clean shutdown");
}

// covers: VVM.TryAtExpiry
#[tokio::test(start_paused = true)]
async fn without_a_feed_a_candidate_keeps_its_rounds_despite_the_time_left() {
    let store = NoFeed::new(MemoryStore::new());
    let killer = TestKiller::new();
    let holder = Vvm::provide(config("holder:1"), store.clone(), Services::new())
        .expect("valid configuration")
        .with_killer(killer.thread.clone())
        .launch()
        .await;
    let candidate = Vvm::provide(config("candidate:2"), store, Services::new())
        .expect("valid configuration")
        .with_killer(killer.thread.clone())
        .launch();
    let candidate = tokio::spawn(candidate);
    tokio::time::sleep(LEASE / 4).await;
    holder.shutdown().await.expect("clean shutdown");
    let released = tokio::time::Instant::now();
    let candidate = candidate.await.expect("the candidate's task");
    assert!(candidate.token().is_some(), "the candidate leads");
    // Nothing told it of the release: its next round (100 ms) did, not the record's expiry
    // (more than 1 s away on this paused clock).
    assert!(
        released.elapsed() <= ROUND,
        "the candidate waited {:?} after the release",
        released.elapsed()
    );
    candidate.shutdown().await.expect("clean shutdown");
}

// covers: St.DeadHolderCalls
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_candidate_waiting_on_a_dead_sqlite_holder_makes_at_most_3_calls_per_lease() {
    let dir = std::env::temp_dir().join(format!("vvm-dead-holder-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("a scratch directory");
    let path = dir.join("leases.sqlite");
    {
        let holder = SqliteStore::open(&path).expect("the store opens");
        holder
            .insert_if_not_exists(Slot(1), &common::foreign("holder:1"), LEASE)
            .await
            .expect("the insert runs")
            .expect("the slot is free");
        // The holder dies here: its store is closed and the record never renewed.
    }
    let counting = Counting::default();
    let store = Hooked {
        store: SqliteStore::open(&path).expect("the store opens"),
        hooks: counting.clone(),
    };
    let killer = TestKiller::new();
    let started = tokio::time::Instant::now();
    let candidate = Vvm::provide(config("candidate:2"), store, Services::new())
        .expect("valid configuration")
        .with_killer(killer.thread.clone())
        .launch();
    let candidate = tokio::time::timeout(LEASE * 10, candidate)
        .await
        .expect("the candidate takes the dead holder's slot");
    let calls = counting.calls();
    let periods = u64::try_from(started.elapsed().as_nanos().div_ceil(LEASE.as_nanos()))
        .unwrap_or(u64::MAX)
        .max(1);
    assert!(candidate.token().is_some(), "the candidate leads");
    candidate.shutdown().await.expect("clean shutdown");
    let _ = std::fs::remove_dir_all(&dir);
    eprintln!(
        "SQLite: {calls} store calls while waiting {periods} lease period(s) for a dead holder"
    );
    assert!(
        calls <= 3 * periods,
        "SQLite: {calls} store calls in {periods} lease period(s), more than 3 per lease"
    );
}
