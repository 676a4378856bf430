//! The store conformance suite on etcd: every case against its own etcd on loopback (a single
//! node; a 3-member cluster for the observe cases), started by the case and killed when it
//! ends. etcd judges expiry on its own clock, so letting time pass really sleeps. Without etcd
//! installed every case prints one line saying it was skipped (under CI it fails instead).

use vvm_test_support::etcd as etcd_support;

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use vvm_adapters::etcd::cluster::EtcdCluster;
use vvm_adapters::EtcdStore;
use vvm_conformance::Harness;

/// etcd looks for expired leases every 0.5 s and then commits their revocation: a record is
/// gone this long after its TTL at the latest, on an idle loopback node.
const EXPIRY_SLACK: Duration = Duration::from_millis(1500);

struct Etcd {
    cluster: EtcdCluster,
    namespaces: AtomicU64,
}

impl Etcd {
    /// A single node for the running case, or `None` after the skip line.
    async fn start() -> Option<Etcd> {
        Self::start_members(1).await
    }

    /// A cluster of `members` for the running case, or `None` after the skip line.
    async fn start_members(members: usize) -> Option<Etcd> {
        let case = std::thread::current()
            .name()
            .unwrap_or("conformance_etcd")
            .to_owned();
        let cluster = etcd_support::start(&case, members).await?;
        Some(Etcd {
            cluster,
            namespaces: AtomicU64::new(0),
        })
    }
}

impl Harness for Etcd {
    type Store = EtcdStore;

    async fn store(&self) -> EtcdStore {
        let namespace = self.namespaces.fetch_add(1, Ordering::Relaxed);
        etcd_support::store(&self.cluster, &format!("conformance/{namespace}/")).await
    }

    async fn client(&self, store: &EtcdStore) -> EtcdStore {
        etcd_support::store(&self.cluster, store.prefix()).await
    }

    fn short_ttl(&self) -> Duration {
        vvm_adapters::etcd::TTL_MIN
    }

    async fn pass(&self, duration: Duration) {
        tokio::time::sleep(duration).await;
    }

    async fn expire(&self) {
        self.pass(self.short_ttl() + EXPIRY_SLACK).await;
    }

    fn lease(&self) -> Duration {
        Duration::from_secs(4)
    }

    fn waits_out_ended_owners(&self) -> bool {
        true
    }

    /// Every case starts its own etcd node and the cases run side by side: on two loaded cores a
    /// lease grant plus a transaction (each with a disk sync) can take longer than `L/40` =
    /// 100 ms. Just below the retry interval (`L/20` = 200 ms).
    fn store_timeout(&self) -> Option<Duration> {
        Some(Duration::from_millis(190))
    }
}

vvm_conformance::ttl_cases!(
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    match Etcd::start().await {
        Some(etcd) => etcd,
        None => return,
    }
);
vvm_conformance::elections_cases!(
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    match Etcd::start().await {
        Some(etcd) => etcd,
        None => return,
    }
);
vvm_conformance::feed_cases!(
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    match Etcd::start().await {
        Some(etcd) => etcd,
        None => return,
    }
);

/// Observing runs on a 3-member cluster: the observer's client and the writer's may talk to
/// different members, so a change reaches the observer through the cluster's replication.
mod three_members {
    use super::*;

    vvm_conformance::observe_cases!(
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        match Etcd::start_members(3).await {
            Some(etcd) => etcd,
            None => return,
        }
    );
}
vvm_conformance::session_cases!(
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    match Etcd::start().await {
        Some(etcd) => etcd,
        None => return,
    }
);
// covers: Et.Semaphores
vvm_conformance::semaphore_cases!(
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    match Etcd::start().await {
        Some(etcd) => etcd,
        None => return,
    }
);
