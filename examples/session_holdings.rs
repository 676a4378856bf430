//! What a session costs per holding, in a real process on the real clock: one session with
//! `HOLDINGS` holdings (default 100 000) on a store, kept alive for `SECONDS` (default 40 = 2 L
//! with L = 20 s), then the CPU time the process spent in that steady state and the resident
//! memory the holdings added.
//!
//! ```text
//! cargo run --release --example session_holdings -- memory 100000 40
//! cargo run --release --example session_holdings -- txkv 100000 40
//! cargo run --release --example session_holdings -- sqlite 100000 40 # a file in a scratch directory
//! cargo run --release --example session_holdings -- etcd 10000 40   # a throw-away etcd on loopback
//! ```
//!
//! The CPU figure is this process's only (for etcd, the server's is its own).
//!
//! It prints one line per phase; nothing here asserts a figure (see BENCHMARKS.md).

use std::time::{Duration, Instant};

use vvm::adapters::txkv::{MemoryKv, TxLeaseStore, TxOptions};
use vvm::adapters::MemoryStore;
use vvm::{
    lifecycle::Incarnation, session::LeaseValue, store::SessionStore, testing::RecordingKiller,
    KillerThread, LeaseConfig, SessionHandle, Slot,
};

/// Clock ticks per second of `/proc/self/stat` (`CLK_TCK`, 100 on Linux).
const TICKS_PER_SECOND: f64 = 100.0;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let store = args.first().map_or("memory", String::as_str).to_owned();
    let holdings: u32 = args.get(1).map_or(Ok(100_000), |n| n.parse())?;
    let seconds: u64 = args.get(2).map_or(Ok(40), |n| n.parse())?;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    runtime.block_on(async move {
        match store.as_str() {
            "memory" => measure(MemoryStore::new(), holdings, seconds).await,
            "txkv" => {
                let store = TxLeaseStore::new(MemoryKv::new(), TxOptions::default());
                measure(store, holdings, seconds).await
            }
            "sqlite" => {
                let dir = std::env::temp_dir().join(format!("vvm-holdings-{}", std::process::id()));
                std::fs::create_dir_all(&dir)?;
                let store = vvm::adapters::SqliteStore::open(dir.join("vvm.sqlite"))?;
                let measured = measure(store, holdings, seconds).await;
                let _ = std::fs::remove_dir_all(&dir);
                measured
            }
            "etcd" => {
                let options = vvm::adapters::etcd::cluster::ClusterOptions::new(1)?;
                let cluster = vvm::adapters::etcd::cluster::EtcdCluster::start(options).await?;
                let store = vvm::adapters::EtcdStore::connect(cluster.store_options()?).await?;
                let measured = measure(store, holdings, seconds).await;
                drop(cluster);
                measured
            }
            other => Err(format!("unknown store {other:?}: memory, txkv, sqlite or etcd").into()),
        }
    })
}

async fn measure<S: SessionStore + Clone>(
    store: S,
    holdings: u32,
    seconds: u64,
) -> Result<(), Box<dyn std::error::Error>> {
    let killer = KillerThread::new(RecordingKiller::new());
    let value = LeaseValue {
        address: "10.0.0.1:7000".into(),
        incarnation: Incarnation(std::process::id().into()),
        stopping: false,
    };
    let lease = LeaseConfig::new(Duration::from_secs(20))?;
    let rss_before = rss_kib()?;
    let session = SessionHandle::open(store, lease, value, &killer).await?;
    let started = Instant::now();
    let mut held = Vec::with_capacity(holdings as usize);
    for slot in 0..holdings {
        match session.acquire(Slot(slot)).await? {
            Some(holding) => held.push(holding),
            None => return Err(format!("slot {slot} is held by someone else").into()),
        }
    }
    let acquired = started.elapsed();
    let rss_after = rss_kib()?;
    println!(
        "acquired {holdings} holdings in {acquired:?} ({:.1} µs each); resident memory +{} KiB ({:.0} bytes per holding)",
        acquired.as_secs_f64() * 1e6 / f64::from(holdings.max(1)),
        rss_after.saturating_sub(rss_before),
        (rss_after.saturating_sub(rss_before) as f64) * 1024.0 / f64::from(holdings.max(1)),
    );
    let cpu_before = cpu_seconds()?;
    let steady = Instant::now();
    tokio::time::sleep(Duration::from_secs(seconds)).await;
    let cpu = cpu_seconds()? - cpu_before;
    let wall = steady.elapsed().as_secs_f64();
    println!(
        "steady state: {wall:.1} s, CPU {cpu:.2} s = {:.3} % of a core, with {holdings} holdings kept alive",
        cpu * 100.0 / wall
    );
    let released = Instant::now();
    drop(held);
    session.close().await?;
    println!(
        "closed (holdings left to the session) in {:?}",
        released.elapsed()
    );
    Ok(())
}

/// The process's resident memory, from `/proc/self/status`.
fn rss_kib() -> Result<u64, Box<dyn std::error::Error>> {
    let status = std::fs::read_to_string("/proc/self/status")?;
    status
        .lines()
        .find_map(|line| line.strip_prefix("VmRSS:"))
        .and_then(|rest| rest.split_whitespace().next())
        .ok_or("no VmRSS line")?
        .parse()
        .map_err(Into::into)
}

/// User plus system CPU time of the process, from `/proc/self/stat`.
fn cpu_seconds() -> Result<f64, Box<dyn std::error::Error>> {
    let stat = std::fs::read_to_string("/proc/self/stat")?;
    // Fields after the command name (which may hold spaces) start at state, field 3.
    let rest = stat.rsplit_once(')').ok_or("malformed stat")?.1;
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let utime: f64 = fields.get(11).ok_or("no utime")?.parse()?;
    let stime: f64 = fields.get(12).ok_or("no stime")?.parse()?;
    Ok((utime + stime) / TICKS_PER_SECOND)
}
