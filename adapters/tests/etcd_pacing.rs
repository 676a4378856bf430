//! How often a candidate asks etcd while it cannot win, on a real etcd on loopback: waiting on a
//! dead holder's record (a lease etcd reports at 0 s until its lessor removes it), and while the
//! store fails (no permission on the prefix, the cluster down) — counted with a store wrapper
//! that counts every store call, and a tracing layer that counts WARN lines. Also which keys the
//! store writes: never another prefix's.
//!
//! Every bound is on a count over a window, never on how fast something happens; the waits that
//! must end are bounded generously (a loaded machine).

use vvm_test_support as common;
use vvm_test_support::etcd as etcd_support;
use vvm_test_support::hooked;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::TestKiller;
use etcd_support::{single, store};
use hooked::{Hooked, Hooks};
use tracing_subscriber::layer::{Context, Layer, SubscriberExt};
use vvm_adapters::etcd::cluster::EtcdCluster;
use vvm_adapters::etcd::{Credentials, EtcdError, EtcdStore};
use vvm_adapters::MemoryStore;
use vvm_core::{Incarnation, Slot, VvmConfig};
use vvm_runtime::{LeaseStore, LeaseValue, Services, Vvm};

/// etcd's shortest lease.
const LEASE: Duration = Duration::from_secs(2);
/// Store calls a candidate waiting on a dead holder's record may make per lease period.
const CALLS_PER_LEASE_MAX: u64 = 3;
/// The round interval of the failing-store tests: the old feed-driven retries came every 100 ms.
const ROUND: Duration = Duration::from_millis(300);
/// How long the failing-store tests count.
const WINDOW: Duration = Duration::from_secs(3);
/// Bound of every wait that must end (a loaded machine).
const LIMIT: Duration = Duration::from_secs(60);

/// Counts every store call made through it (the change feed is no call).
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

/// Counts the WARN events of the library's crates.
#[derive(Clone, Default)]
struct Warnings(Arc<AtomicU64>);

impl<S: tracing::Subscriber> Layer<S> for Warnings {
    fn on_event(&self, event: &tracing::Event<'_>, _: Context<'_, S>) {
        let meta = event.metadata();
        if *meta.level() <= tracing::Level::WARN && meta.target().starts_with("vvm") {
            self.0.fetch_add(1, Ordering::SeqCst);
        }
    }
}

fn value(address: &str) -> LeaseValue {
    LeaseValue {
        address: address.into(),
        incarnation: Incarnation(0xdead_beef),
        stopping: false,
    }
}

fn config(address: &str) -> vvm_core::VvmConfigBuilder {
    VvmConfig::builder(address)
        .lease(LEASE)
        .round_interval(ROUND)
        .acquire_forever()
}

async fn raw_client(cluster: &EtcdCluster) -> etcd_client::Client {
    etcd_client::Client::connect(cluster.endpoints(), None)
        .await
        .expect("a plain client connects")
}

/// A candidate waits for slot 1 on `store`, whose record's holder is dead (it never renews);
/// returns its store calls until it leads, and how many lease periods that took.
async fn calls_until_led<S: LeaseStore>(store: S) -> (u64, u64) {
    let killer = TestKiller::new();
    let counting = Counting::default();
    let store = Hooked {
        store,
        hooks: counting.clone(),
    };
    let started = tokio::time::Instant::now();
    let candidate = Vvm::provide(config("candidate:2"), store, Services::new())
        .expect("valid configuration")
        .with_killer(killer.thread.clone())
        .launch();
    let candidate = tokio::time::timeout(LIMIT, candidate)
        .await
        .expect("the candidate takes the dead holder's slot");
    let calls = counting.calls();
    let waited = started.elapsed();
    assert!(candidate.token().is_some(), "the candidate leads");
    candidate.shutdown().await.expect("clean shutdown");
    let periods = u64::try_from(waited.as_nanos().div_ceil(LEASE.as_nanos())).unwrap_or(u64::MAX);
    (calls, periods.max(1))
}

fn assert_calls_bounded(store: &str, calls: u64, periods: u64) {
    eprintln!(
        "{store}: {calls} store calls while waiting {periods} lease period(s) for a dead holder"
    );
    assert!(
        calls <= CALLS_PER_LEASE_MAX * periods,
        "{store}: {calls} store calls in {periods} lease period(s), more than {CALLS_PER_LEASE_MAX} per lease"
    );
}

// covers: Et.TimeLeft, St.DeadHolderCalls
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_candidate_waiting_on_a_dead_etcd_holder_makes_at_most_3_calls_per_lease() {
    let Some(cluster) =
        single("a_candidate_waiting_on_a_dead_etcd_holder_makes_at_most_3_calls_per_lease").await
    else {
        return;
    };
    let holder = store(&cluster, "dead-holder/").await;
    holder
        .insert_if_not_exists(Slot(1), &value("holder:1"), LEASE)
        .await
        .expect("the insert runs")
        .expect("the slot is free");
    // The holder dies here: its record is never renewed.
    let (calls, periods) = calls_until_led(store(&cluster, "dead-holder/").await).await;
    assert_calls_bounded("etcd", calls, periods);
}

// covers: St.DeadHolderCalls
#[tokio::test(start_paused = true)]
async fn a_candidate_waiting_on_a_dead_memory_holder_makes_at_most_3_calls_per_lease() {
    let store = MemoryStore::new();
    store
        .set(Slot(1), &value("holder:1"), LEASE)
        .expect("a record");
    let (calls, periods) = calls_until_led(store).await;
    assert_calls_bounded("memory", calls, periods);
}

/// Launches a candidate on `store` for [`WINDOW`] while the store fails; returns its store
/// calls and the library's WARN lines in that window, and the launch (still campaigning).
async fn failing_window<S: LeaseStore>(
    store: S,
    killer: &TestKiller,
) -> (
    u64,
    u64,
    vvm_runtime::StopHandle,
    tokio::task::JoinHandle<Vvm<vvm_runtime::Launched>>,
) {
    let warnings = Warnings::default();
    let subscriber = tracing_subscriber::registry().with(warnings.clone());
    let _guard = tracing::subscriber::set_default(subscriber);
    let counting = Counting::default();
    let store = Hooked {
        store,
        hooks: counting.clone(),
    };
    let vvm = Vvm::provide(config("candidate:2"), store, Services::new())
        .expect("valid configuration")
        .with_killer(killer.thread.clone());
    let stop = vvm.stop_handle();
    let launch = tokio::spawn(vvm.launch());
    let started = Instant::now();
    tokio::time::sleep(WINDOW).await;
    let (calls, warns) = (counting.calls(), warnings.0.load(Ordering::SeqCst));
    eprintln!(
        "{calls} store calls and {warns} WARN lines in {:?} (round {ROUND:?})",
        started.elapsed()
    );
    assert!(!launch.is_finished(), "the candidate still campaigns");
    (calls, warns, stop, launch)
}

/// Never faster than the round: at most one try per round interval over the window, plus the
/// first; and the failure said once.
fn assert_paced(calls: u64, warns: u64) {
    let rounds = u64::try_from(WINDOW.as_nanos() / ROUND.as_nanos()).unwrap_or(u64::MAX);
    assert!(
        calls <= rounds + 1,
        "{calls} store calls in {WINDOW:?}: faster than one per round of {ROUND:?}"
    );
    assert!(calls >= 2, "only {calls} store calls in {WINDOW:?}");
    assert_eq!(
        warns, 1,
        "{warns} WARN lines: the failure must be said once"
    );
}

// covers: VVM.FailingStoreBackoff
#[tokio::test]
async fn without_permission_on_the_prefix_a_candidate_backs_off_and_warns_once() {
    let Some(cluster) =
        single("without_permission_on_the_prefix_a_candidate_backs_off_and_warns_once").await
    else {
        return;
    };
    let mut raw = raw_client(&cluster).await;
    raw.user_add("root", "root-secret", None).await.unwrap();
    raw.user_grant_role("root", "root").await.unwrap();
    raw.user_add("vvm", "vvm-secret", None).await.unwrap();
    raw.role_add("team-a").await.unwrap();
    let permission = etcd_client::Permission::read_write("team-a/").with_prefix();
    raw.role_grant_permission("team-a", permission)
        .await
        .unwrap();
    raw.user_grant_role("vvm", "team-a").await.unwrap();
    raw.auth_enable().await.unwrap();
    // Authenticated, but under a prefix the user may neither read, write nor watch.
    let options = cluster
        .store_options()
        .unwrap()
        .prefix("team-b/")
        .unwrap()
        .credentials(Credentials::new("vvm", "vvm-secret"));
    let store = EtcdStore::connect(options)
        .await
        .expect("the store connects");
    let killer = TestKiller::new();
    let (calls, warns, stop, launch) = failing_window(store, &killer).await;
    stop.stop();
    let vvm = tokio::time::timeout(LIMIT, launch)
        .await
        .expect("the launch ends after the stop")
        .expect("the launch task");
    assert!(vvm.token().is_none());
    let _ = vvm.shutdown().await;
    assert_paced(calls, warns);
}

// covers: VVM.FailingStoreBackoff
#[tokio::test]
async fn with_etcd_down_a_standby_backs_off_warns_once_and_leads_when_it_returns() {
    let Some(mut cluster) =
        single("with_etcd_down_a_standby_backs_off_warns_once_and_leads_when_it_returns").await
    else {
        return;
    };
    let store = store(&cluster, "down/").await;
    cluster.kill(0).expect("the member is killed");
    let killer = TestKiller::new();
    let (calls, warns, _stop, launch) = failing_window(store, &killer).await;
    assert_paced(calls, warns);
    cluster.restart(0).expect("the member restarts");
    cluster
        .wait_healthy(etcd_support::START_LIMIT)
        .await
        .expect("the member is healthy again");
    // The backoff is bounded: the standby tries again and leads.
    let vvm = tokio::time::timeout(LIMIT, launch)
        .await
        .expect("the standby leads once etcd returns")
        .expect("the launch task");
    assert!(vvm.token().is_some(), "the standby leads");
    vvm.shutdown().await.expect("clean shutdown");
}

// covers: Et.KeysDistinct
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn prefixes_never_share_keys_and_foreign_keys_stay_untouched() {
    let Some(cluster) = single("prefixes_never_share_keys_and_foreign_keys_stay_untouched").await
    else {
        return;
    };
    let refused = cluster.store_options().unwrap().prefix("app1");
    assert!(
        matches!(refused, Err(EtcdError::PrefixEndsWithDigit { .. })),
        "{refused:?}"
    );
    let mut raw = raw_client(&cluster).await;
    let foreign = ["app", "app0", "app11x", "app1/2", "ap11", "app/1"];
    for key in foreign {
        raw.put(key, format!("foreign {key}"), None).await.unwrap();
    }
    let revisions = |response: etcd_client::GetResponse| {
        response
            .kvs()
            .first()
            .map(|kv| (kv.value().to_vec(), kv.mod_revision()))
    };
    let mut before = Vec::new();
    for key in foreign {
        before.push(revisions(raw.get(key, None).await.unwrap()));
    }
    let app = store(&cluster, "app").await;
    let app1 = store(&cluster, "app1/").await;
    assert_eq!(app.key(Slot(11)), b"app11");
    assert_eq!(app1.key(Slot(1)), b"app1/1");
    // All four hold "their" slot at once: four different keys.
    let ttl = Duration::from_secs(30);
    let pairs = [
        (&app, Slot(11)),
        (&app, Slot(1)),
        (&app1, Slot(1)),
        (&app1, Slot(11)),
    ];
    let mut held = Vec::new();
    for (store, slot) in pairs {
        let revision = store
            .insert_if_not_exists(slot, &value("a:1"), ttl)
            .await
            .expect("the insert runs")
            .unwrap_or_else(|| panic!("{:?} is free", String::from_utf8_lossy(&store.key(slot))));
        held.push(revision);
    }
    for ((store, slot), revision) in pairs.into_iter().zip(held) {
        let lease = vvm_runtime::Lease {
            value: value("a:1"),
            revision,
        };
        let renewed = store
            .compare_and_swap(slot, &lease, &value("a:1"), ttl)
            .await
            .expect("the swap runs")
            .expect("the swap applies");
        let lease = vvm_runtime::Lease {
            value: value("a:1"),
            revision: renewed,
        };
        assert!(store
            .compare_and_delete(slot, &lease)
            .await
            .expect("the delete runs"));
    }
    for (key, before) in foreign.iter().zip(before) {
        let after = revisions(raw.get(*key, None).await.unwrap());
        assert_eq!(after, before, "foreign key {key:?} changed");
    }
}
