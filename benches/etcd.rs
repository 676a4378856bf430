//! etcd compare-and-swap latency, on a single node and on a 3-member cluster on loopback that
//! the benchmark starts itself (`etcd` must be on `PATH`; without it the benchmark says so and
//! measures nothing).
//!
//! - `raw_txn`: one etcd transaction comparing value and `mod_revision` and putting the value —
//!   what the store's swap costs at least;
//! - `store_cas`: [`EtcdStore::compare_and_swap`] as a VVM renews: a lease grant, then that
//!   transaction binding the record to the new lease (the old lease is revoked in the
//!   background).
//!
//! `cargo bench --bench etcd`
//!
//! With `-- --handoff` it measures instead, on a 3-member cluster, how long a waiting VVM takes
//! to have its services started (series of [`SAMPLES`] each; median, p90, p99, max):
//! - graceful hand-off: from the holder's `shutdown()` (services stopped, then its record
//!   deleted) to the successor's service starting;
//! - failover: a record whose holder is gone (written with the lease as TTL and never renewed)
//!   is removed by etcd when its lease expires; from etcd's `DELETE` event (seen by a watch of
//!   this benchmark) to the successor's service starting, and from the write to that start.
//!
//! The successor's rounds are 60 s apart, so that only the store's change feed can wake it.
//! With `-- --handoff-rounds` the same series run with the feed hidden from the successor (the
//! polling fallback of a store without a feed) and rounds of 1 s, the default.
//!
//! `cargo bench --bench etcd -- --handoff` and `cargo bench --bench etcd -- --handoff-rounds`

use std::time::{Duration, Instant};

use vvm_test_support::hooked;

use criterion::{criterion_group, Criterion};
use etcd_client::{Compare, CompareOp, EventType, Txn, TxnOp, WatchOptions};
use hooked::NoFeed;
use tokio::runtime::Runtime;
use tokio::sync::mpsc;
use vvm::{
    lifecycle::Incarnation,
    session::LeaseValue,
    store::{Lease, LeaseStore},
    testing::RecordingKiller,
    KillerThread, Service, ServiceContext, ServiceError, Services, Slot, Vvm, VvmConfig,
};
use vvm_adapters::etcd::cluster::{find_etcd, ClusterOptions, EtcdCluster};
use vvm_adapters::etcd::EtcdStore;

const TTL: Duration = Duration::from_secs(20);

fn start(runtime: &Runtime, members: usize) -> EtcdCluster {
    let options = ClusterOptions::new(members).expect("valid cluster options");
    runtime
        .block_on(EtcdCluster::start(options))
        .expect("etcd starts")
}

fn bench_cluster(c: &mut Criterion, runtime: &Runtime, members: usize) {
    let cluster = start(runtime, members);
    let mut group = c.benchmark_group(format!("etcd_{members}_member"));
    group
        .sample_size(30)
        .measurement_time(Duration::from_secs(5));

    let mut client = runtime
        .block_on(etcd_client::Client::connect(cluster.endpoints(), None))
        .expect("a client connects");
    let put = runtime
        .block_on(client.put("bench/raw", "v", None))
        .expect("a put");
    let mut revision = put.header().map_or(0, |header| header.revision());
    group.bench_function("raw_txn", |b| {
        b.iter_custom(|iters| {
            let started = Instant::now();
            for _ in 0..iters {
                let txn = Txn::new()
                    .when([
                        Compare::value("bench/raw", CompareOp::Equal, "v"),
                        Compare::mod_revision("bench/raw", CompareOp::Equal, revision),
                    ])
                    .and_then([TxnOp::put("bench/raw", "v", None)]);
                let response = runtime.block_on(client.txn(txn)).expect("the txn runs");
                assert!(response.succeeded());
                revision = response.header().map_or(0, |header| header.revision());
            }
            started.elapsed()
        });
    });

    let store = runtime.block_on(async {
        let options = cluster
            .store_options()
            .expect("options")
            .prefix("bench/")
            .expect("prefix");
        EtcdStore::connect(options)
            .await
            .expect("the store connects")
    });
    let value = LeaseValue {
        address: "bench:7000".into(),
        incarnation: Incarnation(1),
        stopping: false,
    };
    let revision = runtime
        .block_on(store.insert_if_not_exists(Slot(1), &value, TTL))
        .expect("insert")
        .expect("the slot is free");
    let mut held = Lease {
        value: value.clone(),
        revision,
    };
    group.bench_function("store_cas", |b| {
        b.iter_custom(|iters| {
            let started = Instant::now();
            for _ in 0..iters {
                let swapped = runtime.block_on(store.compare_and_swap(Slot(1), &held, &value, TTL));
                held.revision = swapped.expect("the swap runs").expect("the lease is ours");
            }
            started.elapsed()
        });
    });
    group.finish();
}

fn etcd(c: &mut Criterion) {
    if find_etcd().is_none() {
        println!(
            "skipped the etcd benchmarks: etcd is not installed (apt-get install etcd-server)"
        );
        return;
    }
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("a runtime");
    bench_cluster(c, &runtime, 1);
    bench_cluster(c, &runtime, 3);
}

/// Samples of each hand-off series.
const SAMPLES: usize = 25;
/// The lease of the hand-off VVMs (etcd grants whole seconds, at least 2 s).
const LEASE: Duration = Duration::from_secs(4);
/// Their rounds: long enough that only the change feed wakes a waiting VVM.
const ROUND: Duration = Duration::from_secs(60);
/// The successor's rounds when its feed is hidden: the default round interval.
const ROUND_WITHOUT_FEED: Duration = Duration::from_secs(1);

/// Sends the time its `run` began, then serves until asked to stop.
struct Started(mpsc::UnboundedSender<Instant>);

impl Service for Started {
    async fn run(self, mut context: ServiceContext) -> Result<(), ServiceError> {
        let _ = self.0.send(Instant::now());
        context.ready();
        context.shutdown().requested().await;
        Ok(())
    }
}

async fn connect(cluster: &EtcdCluster, prefix: &str) -> EtcdStore {
    let options = cluster
        .store_options()
        .expect("options")
        .prefix(prefix)
        .expect("prefix");
    EtcdStore::connect(options)
        .await
        .expect("the store connects")
}

fn config(address: &str, round: Duration) -> VvmConfig {
    VvmConfig::builder(address)
        .lease(LEASE)
        .store_timeout(Duration::from_millis(190))
        .round_interval(round)
        .build()
        .expect("valid configuration")
}

/// Launches the successor in the background; its service reports its start on the receiver.
async fn successor(
    cluster: &EtcdCluster,
    prefix: &str,
    feed: bool,
) -> (
    tokio::task::JoinHandle<Vvm<vvm::Launched>>,
    mpsc::UnboundedReceiver<Instant>,
) {
    let (sender, started) = mpsc::unbounded_channel();
    let services = Services::new().with(Started(sender)).expect("one service");
    let store = connect(cluster, prefix).await;
    let killer = KillerThread::new(RecordingKiller::new());
    let vvm = if feed {
        let vvm = Vvm::provide(config("successor:2", ROUND), store, services)
            .expect("valid configuration")
            .with_killer(killer);
        tokio::spawn(vvm.launch())
    } else {
        let round = ROUND_WITHOUT_FEED;
        let vvm = Vvm::provide(
            config("successor:2", round),
            NoFeed::rounds_only(store),
            services,
        )
        .expect("valid configuration")
        .with_killer(killer);
        tokio::spawn(vvm.launch())
    };
    (vvm, started)
}

/// The holder's `shutdown()` → the successor's service started.
async fn handoff(cluster: &EtcdCluster, prefix: &str, feed: bool, pause: Duration) -> Duration {
    let holder = Vvm::provide(
        config("holder:1", ROUND),
        connect(cluster, prefix).await,
        Services::new(),
    )
    .expect("valid configuration")
    .with_killer(KillerThread::new(RecordingKiller::new()))
    .launch()
    .await;
    assert!(holder.token().is_some(), "the holder leads");
    let (successor, mut started) = successor(cluster, prefix, feed).await;
    // Refused, the successor waits on its feed (or its next round).
    tokio::time::sleep(pause).await;
    let released = Instant::now();
    holder.shutdown().await.expect("clean shutdown");
    let at = started
        .recv()
        .await
        .expect("the successor's service starts");
    let successor = successor.await.expect("the successor's task");
    successor.shutdown().await.expect("clean shutdown");
    at.duration_since(released)
}

/// etcd's `DELETE` of an expired record → the successor's service started, and the write of
/// that record → the same start.
async fn failover(cluster: &EtcdCluster, prefix: &str, feed: bool) -> (Duration, Duration) {
    let gone = connect(cluster, prefix).await;
    let value = LeaseValue {
        address: "gone:1".into(),
        incarnation: Incarnation(1),
        stopping: false,
    };
    let written = Instant::now();
    let revision = gone
        .insert_if_not_exists(Slot(1), &value, LEASE)
        .await
        .expect("the insert runs")
        .expect("the slot is free");
    let mut raw = etcd_client::Client::connect(cluster.endpoints(), None)
        .await
        .expect("a plain client connects");
    let start = i64::try_from(revision.0).expect("a revision etcd gave") + 1;
    let mut watch = raw
        .watch(
            gone.key(Slot(1)),
            Some(WatchOptions::new().with_start_revision(start)),
        )
        .await
        .expect("the watch is set");
    let (successor, mut started) = successor(cluster, prefix, feed).await;
    let deleted = loop {
        let response = watch
            .message()
            .await
            .expect("the watch runs")
            .expect("the watch goes on");
        let deletion = response
            .events()
            .iter()
            .any(|event| event.event_type() == EventType::Delete);
        if deletion {
            break Instant::now();
        }
    };
    let at = started
        .recv()
        .await
        .expect("the successor's service starts");
    let successor = successor.await.expect("the successor's task");
    successor.shutdown().await.expect("clean shutdown");
    (
        at.saturating_duration_since(deleted),
        at.duration_since(written),
    )
}

fn summary(name: &str, mut samples: Vec<Duration>) {
    samples.sort_unstable();
    let at = |q: f64| {
        let index = ((samples.len() as f64 - 1.0) * q).round() as usize;
        samples[index.min(samples.len() - 1)]
    };
    println!(
        "{name}: n = {}, median {:.1} ms, p90 {:.1} ms, p99 {:.1} ms, min {:.1} ms, max {:.1} ms",
        samples.len(),
        at(0.5).as_secs_f64() * 1e3,
        at(0.9).as_secs_f64() * 1e3,
        at(0.99).as_secs_f64() * 1e3,
        samples[0].as_secs_f64() * 1e3,
        samples[samples.len() - 1].as_secs_f64() * 1e3,
    );
}

fn handoff_figures(feed: bool) {
    if find_etcd().is_none() {
        println!("skipped the etcd hand-off figures: etcd is not installed (apt-get install etcd-server)");
        return;
    }
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("a runtime");
    let cluster = start(&runtime, 3);
    let how = if feed {
        "change feed"
    } else {
        "no feed, rounds of 1 s"
    };
    println!("successor: {how}");
    let mut handoffs = Vec::with_capacity(SAMPLES);
    for sample in 0..SAMPLES {
        // Pauses spread over a round, so that the fallback's wait is sampled across it.
        let pause = Duration::from_millis(300 + 37 * (sample as u64 % 27));
        let prefix = format!("handoff/{sample}/");
        handoffs.push(runtime.block_on(handoff(&cluster, &prefix, feed, pause)));
    }
    summary(
        "graceful hand-off, holder's shutdown() -> successor's service started",
        handoffs,
    );
    let mut from_delete = Vec::with_capacity(SAMPLES);
    let mut from_write = Vec::with_capacity(SAMPLES);
    for sample in 0..SAMPLES {
        let prefix = format!("failover/{sample}/");
        let (delete, write) = runtime.block_on(failover(&cluster, &prefix, feed));
        from_delete.push(delete);
        from_write.push(write);
    }
    summary(
        "failover, etcd's DELETE at lease expiry -> successor's service started",
        from_delete,
    );
    summary(
        &format!(
            "failover, last write of the record (L = {LEASE:?}) -> successor's service started"
        ),
        from_write,
    );
}

criterion_group!(benches, etcd);

fn main() {
    if std::env::args().any(|arg| arg == "--handoff") {
        handoff_figures(true);
        return;
    }
    if std::env::args().any(|arg| arg == "--handoff-rounds") {
        handoff_figures(false);
        return;
    }
    benches();
    Criterion::default().configure_from_args().final_summary();
}
