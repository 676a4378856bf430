//! The recipes of `examples/`: the three coordination recipes on the memory store and on
//! SQLite, and the fenced writes on SQLite and a real etcd on loopback.

use vvm_test_support::etcd as etcd_support;

#[allow(dead_code)]
#[path = "../examples/recipe_leader.rs"]
mod recipe_leader;

#[allow(dead_code)]
#[path = "../examples/recipe_discovery.rs"]
mod recipe_discovery;

#[allow(dead_code)]
#[path = "../examples/recipe_config.rs"]
mod recipe_config;

#[allow(dead_code)]
#[path = "../examples/recipe_guard.rs"]
mod recipe_guard;

use vvm::adapters::{MemoryStore, SqliteStore};
use vvm::{testing::RecordingKiller, KillerThread};
use vvm_conformance::ScratchDir;

/// A killer that records instead of ending the test process (the recipes' `main` uses
/// `KillerThread::global()`).
fn killer() -> KillerThread {
    KillerThread::new(RecordingKiller::new())
}

fn sqlite(dir: &ScratchDir) -> SqliteStore {
    SqliteStore::open(dir.file("store.sqlite")).expect("the store opens")
}

const LEADERS: [&str; 3] = ["10.0.0.1:7000", "10.0.0.2:7000", "10.0.0.3:7000"];

/// Everyone learns each leader's endpoint, in the candidates' order of arrival.
// covers: Sem.Store.Wait, Sem.Store.Watch
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leader_election_on_memory_and_sqlite() {
    let seen = recipe_leader::run(MemoryStore::new(), &killer())
        .await
        .expect("runs");
    assert_eq!(seen, LEADERS);
    let dir = ScratchDir::new("vvm-recipe-leader");
    let seen = recipe_leader::run(sqlite(&dir), &killer())
        .await
        .expect("runs");
    assert_eq!(seen, LEADERS);
}

/// Instances appear as they register and disappear as they leave.
// covers: Sem.Store.Watch
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn service_discovery_on_memory_and_sqlite() {
    let all = ["10.0.1.1:8080", "10.0.1.2:8080", "10.0.1.3:8080"];
    for store in ["memory", "sqlite"] {
        let dir = ScratchDir::new("vvm-recipe-discovery");
        let seen = match store {
            "memory" => recipe_discovery::run(MemoryStore::new(), &killer()).await,
            _ => recipe_discovery::run(sqlite(&dir), &killer()).await,
        }
        .expect("runs");
        assert_eq!(
            seen.first().map(Vec::len),
            Some(0),
            "{store}: empty at first"
        );
        assert_eq!(seen[seen.len() - 2], all, "{store}: every instance");
        assert_eq!(
            seen.last().expect("a list"),
            &[all[0], all[2]],
            "{store}: the second left"
        );
    }
}

/// Every worker ends at the latest configuration.
// covers: Sem.Store.Watch
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn configuration_on_memory_and_sqlite() {
    let ended = recipe_config::run(MemoryStore::new(), &killer())
        .await
        .expect("runs");
    assert_eq!(ended, ["v3", "v3", "v3"]);
    let dir = ScratchDir::new("vvm-recipe-config");
    let ended = recipe_config::run(sqlite(&dir), &killer())
        .await
        .expect("runs");
    assert_eq!(ended, ["v3", "v3", "v3"]);
}

/// A leader's guarded write lands; after its session was ended from outside and another was
/// elected, its late write under the old token is refused by the store, and the new leader's
/// stays.
// covers: Guard.Recipe
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fenced_writes_on_sqlite_and_etcd() {
    let expected = vec![("A", true), ("B", true), ("A late", false)];
    let dir = ScratchDir::new("vvm-recipe-guard");
    let store = vvm::adapters::open::AnyStore::Sqlite(sqlite(&dir));
    let (writes, config) = recipe_guard::run(store, &killer()).await.expect("runs");
    assert_eq!(writes, expected, "sqlite");
    assert_eq!(config.as_deref(), Some("from 10.0.0.2"), "sqlite");

    let Some(cluster) = etcd_support::single("fenced_writes_on_sqlite_and_etcd").await else {
        return;
    };
    let store = etcd_support::store(&cluster, "recipe-guard/").await;
    let store = vvm::adapters::open::AnyStore::Etcd(Box::new(store));
    let (writes, config) = recipe_guard::run(store, &killer()).await.expect("runs");
    assert_eq!(writes, expected, "etcd");
    assert_eq!(config.as_deref(), Some("from 10.0.0.2"), "etcd");
}
