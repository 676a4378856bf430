//! Semaphores on the memory, SQLite and etcd stores (etcd: one member started on loopback, when
//! `etcd` is installed):
//!
//! - `semaphores/acquire_release/<store>`: an uncontended acquire (granted at once) and its
//!   release, as two store transactions through [`SemaphoreStore::semaphore`]; operations per
//!   second = 1 / the time;
//! - `handoff/<store>` (printed, not criterion): from the owner's release to the grant seen by
//!   the next waiter's `Coordination::acquire`, which waits on the store's change feed; p50 and
//!   p99 over [`HANDOFFS`] hand-offs between two sessions (for SQLite and etcd two connections,
//!   as two processes would have).
//! - `broadcast/<store>` (printed): from a data update to the moment the first, and the last, of
//!   [`WATCHERS`] watchers saw it; p50 and p99 over [`UPDATES`] updates, the writer and the
//!   watchers on two clients of the store.
//!
//! - `idle/sqlite` (printed, with `-- --idle GRANTS WATCHES`, nothing else runs then): the CPU
//!   this process uses over [`IDLE_SPAN`] while GRANTS served grants (each awaiting
//!   `SemaphoreGrant::ended`) and WATCHES watches of the data (each awaiting `Watch::next`) wait
//!   on one SQLite store and nothing changes but the session's keepalives, from `/proc/self/stat`.
//!
//! - With the `postgres` feature, `handoff/postgres` and `broadcast/postgres` on a PostgreSQL
//!   server it starts on loopback (`test-support/src/postgres.rs`), two store handles (each with its
//!   own connections and listening connection) as two processes would have.
//!
//! Run: `cargo bench --bench semaphores` (`-- --quick` for a short run; `-- --latencies` for the
//! printed hand-off and broadcast figures only). PostgreSQL too: `cargo bench --features postgres
//! --bench semaphores -- --latencies`.

use std::time::{Duration, Instant};

use criterion::Criterion;
use tokio::runtime::Runtime;
use vvm::adapters::{MemoryStore, SqliteStore};
use vvm::coordination::SemaphoreName;
use vvm::{
    coordination::WatchKind,
    lifecycle::Incarnation,
    session::{LeaseValue, SessionId, SessionKey},
    store::{SemaphoreRequest, SemaphoreStore},
    testing::RecordingKiller,
    AcquireOptions, Coordination, KillerThread, LeaseConfig, SessionHandle,
};
use vvm_adapters::etcd::cluster::{find_etcd, ClusterOptions, EtcdCluster};
use vvm_adapters::etcd::EtcdStore;

#[cfg(feature = "postgres")]
use vvm_test_support::postgres as postgres_support;

/// A PostgreSQL server on loopback, when built with `postgres` (`None` said once without it).
#[cfg(feature = "postgres")]
type Postgres = Option<postgres_support::PgServer>;
#[cfg(not(feature = "postgres"))]
type Postgres = Option<()>;

#[cfg(feature = "postgres")]
fn postgres() -> Postgres {
    postgres_support::PgServer::start("semaphores bench")
}

#[cfg(not(feature = "postgres"))]
fn postgres() -> Postgres {
    None
}

/// Two handles of the PostgreSQL store on `server`, in schema `schema`.
#[cfg(feature = "postgres")]
async fn postgres_pair(
    server: &postgres_support::PgServer,
    schema: &str,
) -> (
    vvm_adapters::postgres::PgStore,
    vvm_adapters::postgres::PgStore,
) {
    let open = || async {
        let config =
            vvm_adapters::postgres::PgConfig::new("127.0.0.1", server.port(), "vvm", "postgres")
                .and_then(|config| config.schema(schema))
                .expect("the configuration is valid");
        vvm_adapters::postgres::open(config, vvm_adapters::txkv::TxOptions::default())
            .await
            .expect("the store opens")
    };
    (open().await, open().await)
}

const TTL: Duration = Duration::from_secs(3600);
/// Hand-offs measured per store.
const HANDOFFS: usize = 200;
/// Watchers of one semaphore's data.
const WATCHERS: usize = 100;
/// Updates measured per store.
const UPDATES: usize = 100;
/// How long the idle cost is measured.
const IDLE_SPAN: Duration = Duration::from_secs(10);

fn key(n: u64) -> SessionKey {
    SessionKey {
        incarnation: Incarnation(n),
        id: SessionId(1),
    }
}

fn value(n: u64) -> LeaseValue {
    LeaseValue::new(format!("10.0.0.{n}:7000"), Incarnation(n))
}

fn scratch(name: &str) -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(format!("vvm-bench-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("a scratch directory");
    dir.join("store.sqlite")
}

fn acquire_release<S, Fut>(c: &mut Criterion, label: &str, open: impl FnOnce() -> Fut)
where
    S: SemaphoreStore,
    Fut: std::future::Future<Output = S>,
{
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a runtime");
    let name = SemaphoreName::new("lock").expect("a name");
    let store = runtime.block_on(open());
    runtime.block_on(async {
        store
            .create_session(key(1), &value(1), TTL)
            .await
            .expect("runs")
            .expect("created");
        let create = SemaphoreRequest::Create {
            limit: 1,
            data: Vec::new(),
        };
        store
            .semaphore(key(1), &name, create)
            .await
            .expect("created");
    });
    c.bench_function(&format!("semaphores/acquire_release/{label}"), |b| {
        b.iter(|| {
            runtime.block_on(async {
                let acquire = SemaphoreRequest::Acquire {
                    request: vvm::store::next_request_id(),
                    count: 1,
                    data: b"10.0.0.1:7000".to_vec(),
                    timeout_ms: 0,
                    ephemeral: false,
                };
                store
                    .semaphore(key(1), &name, acquire)
                    .await
                    .expect("granted");
                store
                    .semaphore(key(1), &name, SemaphoreRequest::release())
                    .await
                    .expect("released");
            })
        })
    });
}

/// A single etcd member on loopback, or `None` (said once) when etcd is not installed.
fn etcd(runtime: &Runtime) -> Option<EtcdCluster> {
    if find_etcd().is_none() {
        println!("etcd is not installed: no etcd figures");
        return None;
    }
    let options = ClusterOptions::new(1).expect("valid cluster options");
    Some(
        runtime
            .block_on(EtcdCluster::start(options))
            .expect("etcd starts"),
    )
}

async fn etcd_store(cluster: &EtcdCluster, prefix: &str) -> EtcdStore {
    let options = cluster
        .store_options()
        .expect("options")
        .prefix(prefix)
        .expect("prefix");
    EtcdStore::connect(options)
        .await
        .expect("the store connects")
}

fn benches(c: &mut Criterion, cluster: Option<&EtcdCluster>) {
    acquire_release(c, "memory", || async { MemoryStore::new() });
    let path = scratch("semaphores-throughput");
    acquire_release(c, "sqlite", || async {
        SqliteStore::open(&path).expect("opens")
    });
    if let Some(cluster) = cluster {
        acquire_release(c, "etcd", || etcd_store(cluster, "bench/throughput/"));
    }
}

async fn member<S: SemaphoreStore + Clone>(store: S, n: u64) -> Coordination<S> {
    let killer = KillerThread::new(RecordingKiller::new());
    let session = SessionHandle::open(store, LeaseConfig::default(), value(n), &killer)
        .await
        .expect("the session opens");
    Coordination::new(session)
}

/// Hand-offs between two members, each waiting on its own client of the store.
async fn handoffs<S: SemaphoreStore + Clone + 'static>(first: S, second: S) -> Vec<Duration> {
    let mut members = [member(first, 1).await, member(second, 2).await];
    members[0]
        .create("lock", 1, Vec::new())
        .await
        .expect("created");
    let mut grant = members[0]
        .acquire("lock", AcquireOptions::new(1))
        .await
        .expect("runs")
        .expect("free");
    let mut latencies = Vec::with_capacity(HANDOFFS);
    for _ in 0..HANDOFFS {
        let next = members[1].clone();
        let waiting = tokio::spawn(async move {
            let grant = next.acquire("lock", AcquireOptions::new(1)).await;
            (Instant::now(), grant)
        });
        while members[0]
            .describe("lock")
            .await
            .expect("read")
            .waiters
            .is_empty()
        {
            tokio::time::sleep(Duration::from_micros(200)).await;
        }
        let released = Instant::now();
        grant.release().await.expect("released");
        let (granted, next) = waiting.await.expect("joined");
        latencies.push(granted.duration_since(released));
        grant = next.expect("runs").expect("granted");
        members.swap(0, 1);
    }
    grant.release().await.expect("released");
    latencies
}

/// Updates of one semaphore's data, each timed until the first and until every one of the
/// watchers saw it (the spread is the waking of the watchers, their read being shared).
async fn broadcasts<S: SemaphoreStore + Clone + 'static>(
    writer: S,
    readers: S,
) -> (Vec<Duration>, Vec<Duration>) {
    let writer = member(writer, 1).await;
    let readers = member(readers, 2).await;
    writer
        .create("config", 1, b"0".to_vec())
        .await
        .expect("created");
    let (seen_tx, mut seen) = tokio::sync::mpsc::unbounded_channel();
    for _ in 0..WATCHERS {
        let mut watch = readers.watch("config", WatchKind::DATA).expect("a watch");
        watch.next().await.expect("the first snapshot");
        let seen_tx = seen_tx.clone();
        tokio::spawn(async move {
            while let Ok(snapshot) = watch.next().await {
                if seen_tx.send((snapshot.data, Instant::now())).is_err() {
                    break;
                }
            }
        });
    }
    let mut latencies = Vec::with_capacity(UPDATES);
    let mut firsts = Vec::with_capacity(UPDATES);
    for round in 1..=UPDATES {
        let data = round.to_string().into_bytes();
        let sent = Instant::now();
        writer
            .update_data("config", data.clone())
            .await
            .expect("updated");
        let (mut count, mut first, mut last) = (0, None::<Instant>, sent);
        while count < WATCHERS {
            let (got, at) = seen.recv().await.expect("the watchers run");
            if got == data {
                count += 1;
                first = Some(first.map_or(at, |first| first.min(at)));
                last = last.max(at);
            }
        }
        latencies.push(last.duration_since(sent));
        firsts.push(first.unwrap_or(last).duration_since(sent));
    }
    (firsts, latencies)
}

/// The broadcast figures of one store: until the first watcher, until all of them.
fn report_broadcast(store: &str, (firsts, latencies): (Vec<Duration>, Vec<Duration>)) {
    report_as(
        &format!("broadcast/{store}"),
        "update -> first of 100 watchers notified",
        firsts,
    );
    report_as(
        &format!("broadcast/{store}"),
        "update -> all 100 watchers notified",
        latencies,
    );
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    let at = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[at.min(sorted.len() - 1)]
}

fn report(label: &str, latencies: Vec<Duration>) {
    report_as(
        &format!("handoff/{label}"),
        "release -> next waiter's grant",
        latencies,
    );
}

fn report_as(label: &str, what: &str, mut latencies: Vec<Duration>) {
    latencies.sort();
    println!(
        "{label}: {what} over {} runs: p50 {:?}, p99 {:?}, max {:?}",
        latencies.len(),
        percentile(&latencies, 0.50),
        percentile(&latencies, 0.99),
        latencies.last().copied().unwrap_or_default(),
    );
}

fn broadcast_latency(runtime: &Runtime, cluster: Option<&EtcdCluster>, postgres: &Postgres) {
    let memory = MemoryStore::new();
    report_broadcast(
        "memory",
        runtime.block_on(broadcasts(memory.clone(), memory)),
    );
    let path = scratch("semaphores-broadcast");
    let open = || SqliteStore::open(&path).expect("opens");
    report_broadcast("sqlite", runtime.block_on(broadcasts(open(), open())));
    if let Some(cluster) = cluster {
        let latencies = runtime.block_on(async {
            let writer = etcd_store(cluster, "bench/broadcast/").await;
            let readers = etcd_store(cluster, "bench/broadcast/").await;
            broadcasts(writer, readers).await
        });
        report_broadcast("etcd", latencies);
    }
    #[cfg(feature = "postgres")]
    if let Some(server) = postgres {
        let latencies = runtime.block_on(async {
            let (writer, readers) = postgres_pair(server, "broadcast").await;
            broadcasts(writer, readers).await
        });
        report_broadcast("postgres", latencies);
    }
    let _ = postgres;
}

fn handoff_latency(runtime: &Runtime, cluster: Option<&EtcdCluster>, postgres: &Postgres) {
    let memory = MemoryStore::new();
    report("memory", runtime.block_on(handoffs(memory.clone(), memory)));
    let path = scratch("semaphores-handoff");
    let open = || SqliteStore::open(&path).expect("opens");
    report("sqlite", runtime.block_on(handoffs(open(), open())));
    if let Some(cluster) = cluster {
        let latencies = runtime.block_on(async {
            let first = etcd_store(cluster, "bench/handoff/").await;
            let second = etcd_store(cluster, "bench/handoff/").await;
            handoffs(first, second).await
        });
        report("etcd", latencies);
    }
    #[cfg(feature = "postgres")]
    if let Some(server) = postgres {
        let latencies = runtime.block_on(async {
            let (first, second) = postgres_pair(server, "handoff").await;
            handoffs(first, second).await
        });
        report("postgres", latencies);
    }
    let _ = postgres;
}

/// This process's user + system CPU time, from `/proc/self/stat` (clock ticks of 10 ms).
fn cpu_time() -> Duration {
    let stat = std::fs::read_to_string("/proc/self/stat").expect("/proc/self/stat");
    // The fields after the command's name, which ends at the last `)`.
    let fields: Vec<&str> = stat[stat.rfind(')').expect("a stat line") + 2..]
        .split(' ')
        .collect();
    let ticks: u64 =
        fields[11].parse::<u64>().expect("utime") + fields[12].parse::<u64>().expect("stime");
    Duration::from_millis(ticks * 10)
}

/// The CPU `grants` served grants and `watches` watches cost while nothing changes.
async fn idle(grants: u32, watches: usize) {
    let path = scratch("semaphores-idle");
    let store = SqliteStore::open(&path).expect("opens");
    let owners = member(store.clone(), 1).await;
    let watchers = member(store, 2).await;
    // One semaphore per grant: a session holds one grant per name.
    let mut tasks = Vec::new();
    for index in 0..grants {
        let name = format!("served-{index}");
        owners.create(&name, 1, Vec::new()).await.expect("created");
        let grant = owners
            .acquire(&name, AcquireOptions::new(1))
            .await
            .expect("runs")
            .expect("granted");
        tasks.push(tokio::spawn(async move {
            grant.ended().await;
            grant
        }));
    }
    owners
        .create("watched", 1, Vec::new())
        .await
        .expect("created");
    for _ in 0..watches {
        let mut watch = watchers.watch("watched", WatchKind::DATA).expect("a watch");
        watch.next().await.expect("the first snapshot");
        tasks.push(tokio::spawn(async move {
            let _ = watch.next().await;
            panic!("a watch saw a change while nothing changed");
        }));
    }
    tokio::time::sleep(Duration::from_secs(1)).await;
    let before = cpu_time();
    tokio::time::sleep(IDLE_SPAN).await;
    let used = cpu_time() - before;
    println!(
        "idle/sqlite: {grants} served grants and {watches} watches waiting: {used:?} of CPU over {IDLE_SPAN:?} = {:.2} % of a core",
        used.as_secs_f64() / IDLE_SPAN.as_secs_f64() * 100.0
    );
    assert!(tasks.iter().all(|task| !task.is_finished()), "a wait ended");
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    if let Some(at) = args.iter().position(|arg| arg == "--idle") {
        let number = |index: usize| {
            args.get(at + index)
                .and_then(|n| n.parse().ok())
                .unwrap_or(0)
        };
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .expect("a runtime");
        runtime.block_on(idle(number(1) as u32, number(2)));
        return;
    }
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("a runtime");
    let cluster = etcd(&runtime);
    let postgres = postgres();
    if !args.iter().any(|arg| arg == "--latencies") {
        let mut criterion = Criterion::default().configure_from_args();
        benches(&mut criterion, cluster.as_ref());
    }
    handoff_latency(&runtime, cluster.as_ref(), &postgres);
    broadcast_latency(&runtime, cluster.as_ref(), &postgres);
    if !args.iter().any(|arg| arg == "--latencies") {
        criterion::Criterion::default()
            .configure_from_args()
            .final_summary();
    }
}
