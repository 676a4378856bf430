//! Failover on the memory store, in real time: the holder "dies" (every store call of its from
//! then on never returns, as for a process that was SIGKILLed) at a random point of its renewal
//! cycle, while a candidate waits. Measured: from the record's expiry on the store's clock
//! (the time left the store reported at the death, added to the moment of death) to the
//! candidate's services started. A negative figure would be a takeover before expiry — a safety
//! violation — and aborts the run.
//!
//! Run: `cargo bench --bench failover` (`VVM_BENCH_KILLS=N` for N deaths, default 20; lease 2 s,
//! so a run takes about N × 2.5 s). Prints every figure, then p50, p90, p99 and max.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use vvm_test_support::hooked;

use hooked::{Hooked, Hooks};
use tokio::sync::oneshot;
use vvm::{
    store::LeaseStore,
    testing::RecordingKiller,
    time::{Clock, Instant, TimeSource},
    KillerThread, Service, ServiceContext, ServiceError, Services, Slot, Vvm, VvmConfig,
};
use vvm_adapters::MemoryStore;

const LEASE: Duration = Duration::from_secs(2);
const SLOT: Slot = Slot(1);
const KILLS_DEFAULT: usize = 20;

/// A store client that can die: after [`Mortal::die`] no call of it returns.
#[derive(Clone, Default)]
struct Mortal(Arc<AtomicBool>);

impl Mortal {
    fn die(&self) {
        self.0.store(true, Ordering::SeqCst);
    }
}

impl Hooks for Mortal {
    async fn before(&self) {
        if self.0.load(Ordering::SeqCst) {
            std::future::pending::<()>().await;
        }
    }
}

/// Stamps the moment the services start.
struct Stamp(Option<oneshot::Sender<Instant>>);

impl Service for Stamp {
    async fn run(mut self, mut context: ServiceContext) -> Result<(), ServiceError> {
        if let Some(stamp) = self.0.take() {
            let _ = stamp.send(Clock.now());
        }
        context.ready();
        context.shutdown().requested().await;
        Ok(())
    }
}

fn config(address: &str) -> VvmConfig {
    VvmConfig::builder(address)
        .lease(LEASE)
        .acquire_forever()
        .build()
        .expect("valid configuration")
}

/// One death at `offset` into the holder's tenure; the failover in nanoseconds.
async fn failover(offset: Duration) -> i128 {
    let (killer, _time) = KillerThread::manual(RecordingKiller::new());
    let store = MemoryStore::new();
    let mortal = Mortal::default();
    let holder_store = Hooked {
        store: store.clone(),
        hooks: mortal.clone(),
    };
    let holder = Vvm::provide(config("holder:1"), holder_store, Services::new())
        .expect("valid configuration")
        .with_killer(killer.clone())
        .launch()
        .await;
    assert!(holder.token().is_some(), "the holder leads");
    let (stamp, started) = oneshot::channel();
    let services = Services::new()
        .with(Stamp(Some(stamp)))
        .expect("one service");
    let candidate = Vvm::provide(config("candidate:2"), store.clone(), services)
        .expect("valid configuration")
        .with_killer(killer);
    let candidate = tokio::spawn(candidate.launch());
    tokio::time::sleep(offset).await;

    mortal.die();
    let died = Clock.now();
    let left = store
        .time_left(SLOT)
        .await
        .expect("the memory store answers")
        .expect("the holder's record is live");
    let expiry = died.as_nanos() as i128 + left.as_nanos() as i128;
    let started = started.await.expect("the candidate's services start");
    let failover = started.as_nanos() as i128 - expiry;
    assert!(
        failover >= 0,
        "the candidate started {} µs before the record expired",
        -failover / 1000
    );
    let candidate = candidate.await.expect("the candidate's launch");
    candidate.shutdown().await.expect("clean shutdown");
    drop(holder);
    failover
}

fn percentile(sorted: &[i128], p: f64) -> f64 {
    let rank = ((p / 100.0) * sorted.len() as f64).ceil().max(1.0) as usize;
    sorted[rank.min(sorted.len()) - 1] as f64 / 1e6
}

fn main() {
    // `cargo bench` passes `--bench`; `cargo test --benches` passes nothing: run one death then.
    let benching = std::env::args().any(|arg| arg == "--bench");
    let kills = if benching {
        std::env::var("VVM_BENCH_KILLS")
            .ok()
            .and_then(|n| n.parse().ok())
            .unwrap_or(KILLS_DEFAULT)
    } else {
        1
    };
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_time()
        .build()
        .expect("a tokio runtime");
    // Offsets spread over a renewal cycle (L/4) by a fixed-seed generator.
    let mut seed: u64 = 0x9e37_79b9_7f4a_7c15;
    let mut figures = Vec::with_capacity(kills);
    for kill in 0..kills {
        seed = seed
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1_442_695_040_888_963_407);
        let offset = LEASE / 4 + (LEASE / 4).mul_f64((seed >> 11) as f64 / (1u64 << 53) as f64);
        let figure = runtime.block_on(failover(offset));
        println!(
            "memory failover {kill:>3}: death at +{:>4} ms, successor {:.3} ms after expiry",
            offset.as_millis(),
            figure as f64 / 1e6
        );
        figures.push(figure);
    }
    figures.sort_unstable();
    println!(
        "memory failover from expiry, {} deaths: p50 {:.3} ms, p90 {:.3} ms, p99 {:.3} ms, max {:.3} ms",
        figures.len(),
        percentile(&figures, 50.0),
        percentile(&figures, 90.0),
        percentile(&figures, 99.0),
        percentile(&figures, 100.0)
    );
}
