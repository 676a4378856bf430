//! The runtime around the core: one VVM on the memory store renewing its lease as fast as the
//! driver, the executor and the store allow. Tokio's clock is paused, so the wait between
//! renewals costs no wall time; what is measured is the work per renewal (timer firing, core
//! transition, compare-and-swap on the store, reply, core transition, re-armed timer and killer).
//!
//! Run: `cargo bench --bench runtime`.

use std::time::Duration;

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use vvm::{KillerThread, RecordingKiller, Services, Vvm, VvmConfig};
use vvm_adapters::MemoryStore;

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

criterion_group!(benches, renewals);
criterion_main!(benches);
