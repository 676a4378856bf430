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

use std::time::{Duration, Instant};

use criterion::{criterion_group, criterion_main, Criterion};
use etcd_client::{Compare, CompareOp, Txn, TxnOp};
use tokio::runtime::Runtime;
use vvm::{Incarnation, Lease, LeaseStore, LeaseValue, Slot};
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

criterion_group!(benches, etcd);
criterion_main!(benches);
