//! A successor taking every holding of a SIGKILLed process: a child process opens a session and
//! acquires `HOLDINGS` slots (default 100 000) with the lease `LEASE_S` seconds (default 4); the
//! parent SIGKILLs it and times, from the kill, its own first acquire and its last. On SQLite the
//! first acquire ends the dead session at once — its lock is free (`Sq.SessionLock`) — with every
//! holding in one transaction, so every slot is free from then on; on etcd it waits for the
//! session's lease to expire. Both sides acquire in batches (`SessionHandle::acquire_many`: one
//! SQLite transaction per 1 024 slots).
//!
//! ```text
//! cargo run --release --example session_takeover -- sqlite 100000 4
//! cargo run --release --example session_takeover -- etcd 10000 4   # a throw-away etcd on loopback
//! ```

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use vvm::adapters::etcd::cluster::{ClusterOptions, EtcdCluster};
use vvm::adapters::etcd::{EtcdOptions, EtcdStore};
use vvm::adapters::SqliteStore;
use vvm::{
    lifecycle::Incarnation, session::LeaseValue, store::SessionStore, testing::RecordingKiller,
    KillerThread, LeaseConfig, SessionHandle, Slot,
};

type Error = Box<dyn std::error::Error>;

fn main() -> Result<(), Error> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    if args.first().map(String::as_str) == Some("--hold") {
        // The child: `--hold sqlite|etcd WHERE HOLDINGS LEASE_S`.
        let [_, store, place, holdings, lease] = &args[..] else {
            return Err("usage: --hold sqlite|etcd WHERE HOLDINGS LEASE_S".into());
        };
        let (holdings, lease) = (holdings.parse()?, lease.parse()?);
        return runtime.block_on(async {
            match store.as_str() {
                "sqlite" => hold(SqliteStore::open(place)?, holdings, lease).await,
                _ => hold(etcd(place).await?, holdings, lease).await,
            }
        });
    }
    let store = args.first().map_or("sqlite", String::as_str).to_owned();
    let holdings: u32 = args.get(1).map_or(Ok(100_000), |n| n.parse())?;
    let lease: u64 = args.get(2).map_or(Ok(4), |n| n.parse())?;
    let scratch = std::env::temp_dir().join(format!("vvm-takeover-{}", std::process::id()));
    std::fs::create_dir_all(&scratch)?;
    let result = runtime.block_on(async {
        match store.as_str() {
            "sqlite" => {
                let path = scratch.join("vvm.sqlite");
                let place = path.to_string_lossy().into_owned();
                take_over(SqliteStore::open(&path)?, "sqlite", &place, holdings, lease).await
            }
            "etcd" => {
                let cluster = EtcdCluster::start(ClusterOptions::new(1)?).await?;
                let place = cluster.endpoints().join(",");
                let measured =
                    take_over(etcd(&place).await?, "etcd", &place, holdings, lease).await;
                drop(cluster);
                measured
            }
            other => Err(format!("unknown store {other:?}: sqlite or etcd").into()),
        }
    });
    let _ = std::fs::remove_dir_all(&scratch);
    result
}

async fn etcd(endpoints: &str) -> Result<EtcdStore, Error> {
    Ok(EtcdStore::connect(EtcdOptions::new(endpoints.split(','))?).await?)
}

fn value(n: u64) -> LeaseValue {
    LeaseValue {
        address: format!("10.0.0.{n}:7000"),
        incarnation: Incarnation(u64::from(std::process::id()) << 8 | n),
        stopping: false,
    }
}

/// The child: holds `holdings` slots on one session, says "ready", and waits to be killed.
async fn hold<S: SessionStore + Clone>(store: S, holdings: u32, lease: u64) -> Result<(), Error> {
    let killer = KillerThread::new(RecordingKiller::new());
    let lease = LeaseConfig::new(Duration::from_secs(lease))?;
    let session = SessionHandle::open(store, lease, value(1), &killer).await?;
    let slots: Vec<Slot> = (0..holdings).map(Slot).collect();
    let held = session.acquire_many(&slots).await?;
    if held.iter().any(Option::is_none) {
        return Err("a slot is held".into());
    }
    println!("ready");
    std::future::pending::<()>().await;
    Ok(())
}

/// The parent: starts the holder, kills it, takes every slot.
async fn take_over<S: SessionStore + Clone>(
    store: S,
    kind: &str,
    place: &str,
    holdings: u32,
    lease: u64,
) -> Result<(), Error> {
    let mut child = Command::new(std::env::current_exe()?)
        .args([
            "--hold",
            kind,
            place,
            &holdings.to_string(),
            &lease.to_string(),
        ])
        .stdout(Stdio::piped())
        .spawn()?;
    let stdout = child.stdout.take().ok_or("no stdout")?;
    let ready = tokio::task::spawn_blocking(move || {
        let mut line = String::new();
        BufReader::new(stdout).read_line(&mut line).map(|_| line)
    })
    .await??;
    if ready.trim() != "ready" {
        return Err(format!("the holder said {ready:?}").into());
    }
    child.kill()?; // SIGKILL
    let killed = Instant::now();
    child.wait()?;
    let killer = KillerThread::new(RecordingKiller::new());
    let config = LeaseConfig::new(Duration::from_secs(lease))?;
    let session = SessionHandle::open(store, config, value(2), &killer).await?;
    let mut taken = Vec::with_capacity(holdings as usize);
    // Every holding ends with the session at once (on SQLite, ended by the first acquire, which
    // finds its lock free): wait for the first, then take the rest.
    let first = loop {
        if let Some(holding) = session.acquire(Slot(0)).await? {
            taken.push(holding);
            break killed.elapsed();
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    };
    // The rest in batches (one transaction per batch on SQLite); a slot still held is asked for
    // again after a pause.
    let mut left: Vec<Slot> = (1..holdings).map(Slot).collect();
    while !left.is_empty() {
        let answers = session.acquire_many(&left).await?;
        let mut refused = Vec::new();
        for (slot, holding) in left.iter().zip(answers) {
            match holding {
                Some(holding) => taken.push(holding),
                None => refused.push(*slot),
            }
        }
        left = refused;
        if !left.is_empty() {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }
    let all = killed.elapsed();
    println!(
        "{kind}: {holdings} holdings, L = {lease} s; SIGKILL of the holder → first slot taken {first:?} ({:.2}·L), all taken {all:?} ({:.1} µs per slot after the first)",
        first.as_secs_f64() / lease as f64,
        (all - first).as_secs_f64() * 1e6 / f64::from(holdings.saturating_sub(1).max(1)),
    );
    Ok(())
}
