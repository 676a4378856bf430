//! The store conformance suite on a live FoundationDB cluster: the FoundationDB mapping under
//! the lease logic that `conformance_txkv.rs` checks in memory. Runs only with the
//! `foundationdb` feature (libfdb_c 7.3 installed) and `FDB_CLUSTER_FILE` naming a cluster file;
//! otherwise every case prints one line saying it was skipped. Each case works under its own key
//! prefix. Expiry is by observation on this process's clock, so letting time pass really sleeps.

use std::io::Write;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::OnceLock;
use std::time::Duration;

use vvm_adapters::foundationdb::{open, FdbStore, NetworkAutoStop};
use vvm_adapters::txkv::TxOptions;
use vvm_conformance::Harness;

struct Fdb {
    network: &'static NetworkAutoStop,
    cluster_file: PathBuf,
    case: String,
    namespaces: AtomicU64,
}

/// The network thread, started once for the whole test process and never stopped: the
/// process ends right after the tests.
fn network() -> &'static NetworkAutoStop {
    static NETWORK: OnceLock<NetworkAutoStop> = OnceLock::new();
    #[allow(unsafe_code)]
    // SAFETY: `boot` runs at most once per process (guarded by the OnceLock), before any other
    // FoundationDB call; the guard lives until the process exits.
    NETWORK.get_or_init(|| unsafe { vvm_adapters::foundationdb::boot() })
}

impl Fdb {
    /// The harness for the running case, or `None` after the skip line.
    fn start() -> Option<Fdb> {
        let case = std::thread::current()
            .name()
            .unwrap_or("conformance_fdb")
            .to_owned();
        let Some(cluster_file) = std::env::var_os("FDB_CLUSTER_FILE") else {
            // Written past the harness's output capture, so that the skip shows in every run.
            let _ = writeln!(
                std::io::stderr(),
                "skipped {case}: FDB_CLUSTER_FILE is not set (it names the cluster file of a live FoundationDB)"
            );
            return None;
        };
        Some(Fdb {
            network: network(),
            cluster_file: cluster_file.into(),
            case,
            namespaces: AtomicU64::new(0),
        })
    }
}

impl Harness for Fdb {
    type Store = FdbStore;

    async fn store(&self) -> FdbStore {
        let namespace = self.namespaces.fetch_add(1, Ordering::Relaxed);
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |elapsed| elapsed.as_nanos());
        let prefix = format!(
            "vvm-conformance/{}/{nanos}/{}/{namespace}/",
            std::process::id(),
            self.case
        );
        let options = TxOptions::default()
            .prefix(prefix)
            .expect("the prefix is short enough");
        open(self.network, Some(&self.cluster_file), options).expect("FoundationDB opens")
    }

    async fn client(&self, store: &FdbStore) -> FdbStore {
        store.clone()
    }

    fn short_ttl(&self) -> Duration {
        Duration::from_secs(2)
    }

    async fn pass(&self, duration: Duration) {
        tokio::time::sleep(duration).await;
    }

    fn lease(&self) -> Duration {
        Duration::from_secs(4)
    }
}

vvm_conformance::ttl_cases!(
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    match Fdb::start() {
        Some(fdb) => fdb,
        None => return,
    }
);
vvm_conformance::observe_cases!(
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    match Fdb::start() {
        Some(fdb) => fdb,
        None => return,
    }
);
vvm_conformance::elections_cases!(
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    match Fdb::start() {
        Some(fdb) => fdb,
        None => return,
    }
);
vvm_conformance::feed_cases!(
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    match Fdb::start() {
        Some(fdb) => fdb,
        None => return,
    }
);
