//! A configuration that workers watch: a semaphore's own data. An administrator updates it;
//! each worker's watch delivers the latest version (a slow worker skips versions in between,
//! never the last one).
//!
//! ```text
//! cargo run --features open --example recipe_config [STORE-URL]    # default: memory:
//! cargo run --features open --example recipe_config sqlite:/tmp/recipe_config.sqlite
//! ```

use std::error::Error;

use vvm::adapters::open::open;
use vvm::{
    coordination::{CoordinationError, SemaphoreError, WatchKind},
    new_incarnation,
    session::LeaseValue,
    store::SemaphoreStore,
    Coordination, KillerThread, LeaseConfig, SessionHandle,
};

type BoxError = Box<dyn Error + Send + Sync>;

async fn member<S: SemaphoreStore + Clone>(
    store: S,
    n: u64,
    killer: &KillerThread,
) -> Result<Coordination<S>, BoxError> {
    // A fresh incarnation per session: a restarted process is never mistaken for its former self.
    let value = LeaseValue::new(format!("10.0.2.{n}:9000"), new_incarnation());
    let session = SessionHandle::open(store, LeaseConfig::default(), value, killer).await?;
    Ok(Coordination::new(session))
}

/// Three workers follow the configuration while it goes from v1 to v3; returns the version
/// each worker ended with.
pub async fn run<S: SemaphoreStore + Clone>(
    store: S,
    killer: &KillerThread,
) -> Result<Vec<String>, BoxError> {
    let admin = member(store.clone(), 1, killer).await?;
    match admin.create("config", 1, b"v1".to_vec()).await {
        Ok(()) | Err(CoordinationError::Refused(SemaphoreError::AlreadyExists(_))) => {}
        Err(error) => return Err(error.into()),
    }
    let mut workers = Vec::new();
    for n in 2..=4 {
        let worker = member(store.clone(), n, killer).await?;
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
    // The process-wide killer: this process ends before a session it cannot keep could let
    // another leader act beside it.
    let killer = KillerThread::global();
    let url = std::env::args()
        .nth(1)
        .unwrap_or_else(|| "memory:".to_owned());
    let store = open(&url, &LeaseConfig::default()).await?;
    run(store, &killer).await?;
    Ok(())
}
