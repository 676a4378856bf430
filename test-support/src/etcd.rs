//! Real etcd for the tests: a single node or a 3-member cluster on free loopback ports, each in a
//! fresh temporary directory, killed and removed when the value is dropped (also when the test
//! panics). The processes come from [`vvm_adapters::etcd::cluster`].
//!
//! Without an `etcd` executable on `PATH` a test prints one line saying it was skipped and why,
//! and returns — except under CI (`CI=true`), where the test command installs etcd, so its
//! absence is a failure.

use std::time::Duration;

use vvm_adapters::etcd::cluster::{find_etcd, ClusterOptions, EtcdCluster};
use vvm_adapters::etcd::{EtcdOptions, EtcdStore};

/// How long a start or restart may take until every running member is healthy.
pub const START_LIMIT: Duration = Duration::from_secs(30);

/// Whether etcd tests may run; prints the skip line when they may not.
/// Panics under CI, where etcd must be present.
pub fn available(test: &str) -> bool {
    if find_etcd().is_some() {
        return true;
    }
    let ci = std::env::var("CI").is_ok_and(|value| value == "true" || value == "1");
    assert!(
        !ci,
        "{test}: etcd is not installed, and under CI the etcd tests must run (scripts/test.sh installs etcd-server)"
    );
    skipped(&format!(
        "skipped {test}: etcd is not installed (apt-get install etcd-server, or run scripts/test.sh as root)"
    ));
    false
}

/// Prints `line` past the test harness's output capture, so that a skip shows in every run.
pub fn skipped(line: &str) {
    use std::io::Write;
    let _ = writeln!(std::io::stderr(), "{line}");
}

/// A started cluster of `members`, or `None` (after the skip line) without etcd.
pub async fn start(test: &str, members: usize) -> Option<EtcdCluster> {
    let options = ClusterOptions::new(members).expect("cluster options are valid");
    start_with(test, options).await
}

/// A 3-member cluster with etcd's own default timing (100 ms heartbeat, 1 s election timeout)
/// instead of the harness's quick one: on a loaded machine a 500 ms election timeout lets
/// starved members depose each other again and again, and a test about surviving the loss of
/// one member would measure that instead.
pub async fn three_steady(test: &str) -> Option<EtcdCluster> {
    let options = ClusterOptions::new(3)
        .and_then(|options| options.timing(Duration::from_millis(100), Duration::from_millis(1000)))
        .expect("cluster options are valid");
    start_with(test, options).await
}

/// A cluster started with `options`, or `None` (after the skip line) without etcd.
pub async fn start_with(test: &str, options: ClusterOptions) -> Option<EtcdCluster> {
    if !available(test) {
        return None;
    }
    let options = options
        .start_timeout(START_LIMIT)
        .expect("cluster options are valid");
    Some(
        EtcdCluster::start(options)
            .await
            .unwrap_or_else(|error| panic!("{test}: could not start etcd: {error}")),
    )
}

/// A single node.
pub async fn single(test: &str) -> Option<EtcdCluster> {
    start(test, 1).await
}

/// A 3-member cluster.
pub async fn three(test: &str) -> Option<EtcdCluster> {
    start(test, 3).await
}

/// A store on every member of `cluster`, under `prefix`.
pub async fn store(cluster: &EtcdCluster, prefix: &str) -> EtcdStore {
    let options: EtcdOptions = cluster
        .store_options()
        .and_then(|options| options.prefix(prefix).map_err(Into::into))
        .expect("store options are valid");
    EtcdStore::connect(options)
        .await
        .expect("the store connects")
}
