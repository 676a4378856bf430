//! A configuration that workers watch: a semaphore's own data. An administrator updates it;
//! each worker's watch delivers the latest version (a slow worker skips versions in between,
//! never the last one).
//!
//! ```text
//! cargo run --example recipe_config
//! ```

use std::error::Error;

use vvm::adapters::MemoryStore;
use vvm::{
    Coordination, CoordinationError, Incarnation, KillerThread, LeaseConfig, LeaseValue,
    RecordingKiller, SemaphoreError, SemaphoreStore, SessionHandle, WatchKind,
};

type BoxError = Box<dyn Error + Send + Sync>;

async fn member<S: SemaphoreStore + Clone>(store: S, n: u64) -> Result<Coordination<S>, BoxError> {
    // A service uses `KillerThread::global()`.
    let killer = KillerThread::new(RecordingKiller::new());
    let value = LeaseValue::new(format!("10.0.2.{n}:9000"), Incarnation(n));
    let session = SessionHandle::open(store, LeaseConfig::default(), value, &killer).await?;
    Ok(Coordination::new(session))
}

/// Three workers follow the configuration while it goes from v1 to v3; returns the version
/// each worker ended with.
pub async fn run<S: SemaphoreStore + Clone>(store: S) -> Result<Vec<String>, BoxError> {
    let admin = member(store.clone(), 1).await?;
    match admin.create("config", 1, b"v1".to_vec()).await {
        Ok(()) | Err(CoordinationError::Refused(SemaphoreError::AlreadyExists(_))) => {}
        Err(error) => return Err(error.into()),
    }
    let mut workers = Vec::new();
    for n in 2..=4 {
        let worker = member(store.clone(), n).await?;
        let mut config = worker.watch("config", WatchKind::DATA)?;
        let first = config.next().await?; // the configuration now
        workers.push(tokio::spawn(async move {
            let _session = worker; // the watch lives as long as the worker's session
            let mut current = first.data;
            while current != b"v3" {
                current = config.next().await?.data;
                println!("worker {n}: {}", String::from_utf8_lossy(&current));
            }
            Ok::<_, CoordinationError>(String::from_utf8_lossy(&current).into_owned())
        }));
    }
    admin.update_data("config", b"v2".to_vec()).await?;
    admin.update_data("config", b"v3".to_vec()).await?;
    let mut ended = Vec::new();
    for worker in workers {
        ended.push(worker.await??);
    }
    Ok(ended)
}

#[tokio::main]
async fn main() -> Result<(), BoxError> {
    run(MemoryStore::new()).await?;
    Ok(())
}
