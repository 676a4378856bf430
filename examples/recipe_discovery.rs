//! Service discovery: a semaphore of the largest limit whose owners are the live instances,
//! each publishing its endpoint as its data. Clients watch the owners; an instance that leaves
//! (a release, or its session's end) leaves the list.
//!
//! ```text
//! cargo run --example recipe_discovery
//! ```

use std::error::Error;

use vvm::adapters::MemoryStore;
use vvm::semaphore::Description;
use vvm::{
    AcquireOptions, Coordination, CoordinationError, Incarnation, KillerThread, LeaseConfig,
    LeaseValue, RecordingKiller, SemaphoreError, SemaphoreStore, SessionHandle, WatchKind,
};

type BoxError = Box<dyn Error + Send + Sync>;

async fn member<S: SemaphoreStore + Clone>(store: S, n: u64) -> Result<Coordination<S>, BoxError> {
    // A service uses `KillerThread::global()`.
    let killer = KillerThread::new(RecordingKiller::new());
    let value = LeaseValue::new(format!("10.0.1.{n}:8080"), Incarnation(n));
    let session = SessionHandle::open(store, LeaseConfig::default(), value, &killer).await?;
    Ok(Coordination::new(session))
}

fn endpoints(description: &Description) -> Vec<String> {
    let mut list: Vec<String> = description
        .owners
        .iter()
        .map(|o| String::from_utf8_lossy(&o.data).into_owned())
        .collect();
    list.sort();
    list
}

/// Three instances register, one leaves; returns the lists a client saw.
pub async fn run<S: SemaphoreStore + Clone>(store: S) -> Result<Vec<Vec<String>>, BoxError> {
    let client = member(store.clone(), 9).await?;
    match client.create("service/api", u64::MAX, Vec::new()).await {
        Ok(()) | Err(CoordinationError::Refused(SemaphoreError::AlreadyExists(_))) => {}
        Err(error) => return Err(error.into()),
    }
    let mut members = client.watch("service/api", WatchKind::OWNERS)?;
    let mut seen = vec![endpoints(&members.next().await?)];

    let mut registrations = Vec::new();
    for n in 1..=3 {
        let instance = member(store.clone(), n).await?;
        let register = AcquireOptions::new(1)
            .data(format!("10.0.1.{n}:8080"))
            .timeout(std::time::Duration::ZERO); // granted at once: the limit never runs out
        let grant = instance.acquire("service/api", register).await?;
        registrations.push((instance, grant.ok_or("registration refused")?));
    }
    while seen.last().map_or(0, Vec::len) < 3 {
        seen.push(endpoints(&members.next().await?));
    }
    // The second instance leaves.
    let (_, grant) = registrations.remove(1);
    grant.release().await?;
    seen.push(endpoints(&members.next().await?));
    for list in &seen {
        println!("instances: {list:?}");
    }
    Ok(seen)
}

#[tokio::main]
async fn main() -> Result<(), BoxError> {
    run(MemoryStore::new()).await?;
    Ok(())
}
