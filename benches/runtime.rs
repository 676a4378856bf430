//! The runtime around the core: one VVM on the memory store renewing its lease as fast as the
//! driver, the executor and the store allow. Tokio's clock is paused, so the wait between
//! renewals costs no wall time; what is measured is the work per renewal (timer firing, core
//! transition, compare-and-swap on the store, reply, core transition, re-armed timer and killer).
//!
//! Graceful hand-off on the memory store, in real time: a holder shuts down while a candidate
//! waits between rounds (rounds of 100 ms); measured from the call of `shutdown` to the
//! candidate's services started. Once with the store's change feed, once through a wrapper that
//! hides it (what every store did before feeds: the candidate waits for its next round). Then
//! the same for VVMs that hold their slot as a holding of a session of their own
//! (`Vvm::provide_on_session`), on the memory store and on an SQLite file: the holder's shutdown
//! releases the holding and closes its session; the candidate's session acquires the slot.
//!
//! Run: `cargo bench --bench runtime`.

use std::time::Duration;

use vvm_test_support::hooked;

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use hooked::NoFeed;
use vvm::{
    store::{LeaseStore, SessionStore},
    testing::RecordingKiller,
    KillerThread, Services, Vvm, VvmConfig,
};
use vvm_adapters::{MemoryStore, SqliteStore};

const LEASE: Duration = Duration::from_secs(20);
const RENEWALS: u64 = 1_000;

/// Wall time of `RENEWALS` renewals of one launched VVM.
fn renewals_wall_time() -> Duration {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .start_paused(true)
        .build()
        .expect("a tokio runtime");
    runtime.block_on(async {
        // A killer whose clock never moves: the paused clock jumps hours ahead, the process must
        // not be ended for it.
        let (killer, _time) = KillerThread::manual(RecordingKiller::new());
        let config = VvmConfig::builder("bench:1").lease(LEASE);
        let vvm = Vvm::provide(config, MemoryStore::new(), Services::new())
            .expect("valid configuration")
            .with_killer(killer)
            .launch()
            .await;
        let first = vvm.token().expect("leading").revision;
        let started = std::time::Instant::now();
        // The clock advances by itself from timer to timer while the runtime is idle.
        tokio::time::sleep(LEASE / 4 * RENEWALS as u32 + LEASE / 8).await;
        let elapsed = started.elapsed();
        let last = vvm.token().expect("still leading").revision;
        assert!(last.0 >= first.0 + RENEWALS, "{first:?} → {last:?}");
        vvm.shutdown().await.expect("clean shutdown");
        elapsed
    })
}

fn renewals(c: &mut Criterion) {
    let mut group = c.benchmark_group("runtime");
    group.throughput(Throughput::Elements(RENEWALS));
    group.sample_size(20);
    group.bench_function("renewals on the memory store (paused clock)", |b| {
        b.iter_custom(|iterations| (0..iterations).map(|_| renewals_wall_time()).sum())
    });
    group.finish();
}

const ROUND: Duration = Duration::from_millis(100);

/// Wall time from the holder's `shutdown` to the candidate's services started.
async fn handoff<S: LeaseStore + Clone>(store: S, pause: Duration) -> Duration {
    let (killer, _time) = KillerThread::manual(RecordingKiller::new());
    let config = |address: &str| {
        VvmConfig::builder(address)
            .lease(LEASE)
            .round_interval(ROUND)
            .build()
            .expect("valid configuration")
    };
    let holder = Vvm::provide(config("bench:1"), store.clone(), Services::new())
        .expect("valid configuration")
        .with_killer(killer.clone())
        .launch()
        .await;
    let candidate = Vvm::provide(config("bench:2"), store, Services::new())
        .expect("valid configuration")
        .with_killer(killer)
        .launch();
    let candidate = tokio::spawn(candidate);
    // Somewhere in the candidate's round.
    tokio::time::sleep(pause).await;
    let started = std::time::Instant::now();
    holder.shutdown().await.expect("clean shutdown");
    let candidate = candidate.await.expect("the candidate's task");
    let elapsed = started.elapsed();
    assert!(candidate.token().is_some(), "the candidate leads");
    candidate.shutdown().await.expect("clean shutdown");
    elapsed
}

/// [`handoff`] for two VVMs each on a session of its own.
async fn handoff_on_sessions<S: SessionStore + Clone + Send + Sync + 'static>(
    store: S,
    pause: Duration,
) -> Duration {
    let (killer, _time) = KillerThread::manual(RecordingKiller::new());
    let config = |address: &str| {
        VvmConfig::builder(address)
            .lease(LEASE)
            .round_interval(ROUND)
            .build()
            .expect("valid configuration")
    };
    let holder = Vvm::provide_on_session(config("bench:1"), store.clone(), Services::new())
        .expect("valid configuration")
        .with_killer(killer.clone())
        .launch()
        .await;
    assert!(holder.token().is_some(), "the holder leads");
    let candidate = Vvm::provide_on_session(config("bench:2"), store, Services::new())
        .expect("valid configuration")
        .with_killer(killer)
        .launch();
    let candidate = tokio::spawn(candidate);
    tokio::time::sleep(pause).await;
    let started = std::time::Instant::now();
    holder.shutdown().await.expect("clean shutdown");
    let candidate = candidate.await.expect("the candidate's task");
    let elapsed = started.elapsed();
    assert!(candidate.token().is_some(), "the candidate leads");
    candidate.shutdown().await.expect("clean shutdown");
    elapsed
}

fn handoffs(c: &mut Criterion) {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_time()
        .build()
        .expect("a tokio runtime");
    let mut group = c.benchmark_group("handoff");
    group.sample_size(30);
    // Pauses spread over the round, so that the fallback's wait is sampled across it.
    let pause = |i: u64| ROUND / 10 * (1 + (i % 9) as u32) + Duration::from_millis(5);
    group.bench_function("memory, change feed", |b| {
        b.iter_custom(|iterations| {
            (0..iterations)
                .map(|i| runtime.block_on(handoff(MemoryStore::new(), pause(i))))
                .sum()
        })
    });
    group.bench_function("memory, rounds of 100 ms (no feed)", |b| {
        b.iter_custom(|iterations| {
            (0..iterations)
                .map(|i| {
                    runtime.block_on(handoff(NoFeed::rounds_only(MemoryStore::new()), pause(i)))
                })
                .sum()
        })
    });
    group.bench_function("memory, VVMs on sessions", |b| {
        b.iter_custom(|iterations| {
            (0..iterations)
                .map(|i| runtime.block_on(handoff_on_sessions(MemoryStore::new(), pause(i))))
                .sum()
        })
    });
    let dir = std::env::temp_dir().join(format!("vvm-bench-handoff-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("a scratch directory");
    let sqlite = SqliteStore::open(dir.join("handoff.sqlite")).expect("the store opens");
    group.bench_function("SQLite, VVMs on sessions", |b| {
        b.iter_custom(|iterations| {
            (0..iterations)
                .map(|i| runtime.block_on(handoff_on_sessions(sqlite.clone(), pause(i))))
                .sum()
        })
    });
    group.finish();
    let _ = std::fs::remove_dir_all(dir);
}

criterion_group!(benches, renewals, handoffs);
criterion_main!(benches);
