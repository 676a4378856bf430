//! Service discovery: a semaphore of the largest limit whose owners are the live instances,
//! each publishing its endpoint as its data. Clients watch the owners; an instance that leaves
//! (a release, or its session's end) leaves the list.
//!
//! ```text
//! cargo run --features open --example recipe_discovery [STORE-URL]    # default: memory:
//! cargo run --features open --example recipe_discovery sqlite:/tmp/recipe_discovery.sqlite
//! ```

use std::error::Error;

use vvm::adapters::open::open;
use vvm::coordination::Description;
use vvm::{
    coordination::{CoordinationError, SemaphoreError, WatchKind},
    new_incarnation,
    session::LeaseValue,
    store::SemaphoreStore,
    AcquireOptions, Coordination, KillerThread, LeaseConfig, SessionHandle,
};

type BoxError = Box<dyn Error + Send + Sync>;

async fn member<S: SemaphoreStore + Clone>(
    store: S,
    n: u64,
    killer: &KillerThread,
) -> Result<Coordination<S>, BoxError> {
    // A fresh incarnation per session: a restarted process is never mistaken for its former self.
    let value = LeaseValue::new(format!("10.0.1.{n}:8080"), new_incarnation());
    let session = SessionHandle::open(store, LeaseConfig::default(), value, killer).await?;
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
pub async fn run<S: SemaphoreStore + Clone>(
    store: S,
    killer: &KillerThread,
) -> Result<Vec<Vec<String>>, BoxError> {
    let client = member(store.clone(), 9, killer).await?;
    match client.create("service/api", u64::MAX, Vec::new()).await {
        Ok(()) | Err(CoordinationError::Refused(SemaphoreError::AlreadyExists(_))) => {}
        Err(error) => return Err(error.into()),
    }
    let mut members = client.watch("service/api", WatchKind::OWNERS)?;
    let mut seen = vec![endpoints(&members.next().await?)];

    let mut registrations = Vec::new();
    for n in 1..=3 {
        let instance = member(store.clone(), n, killer).await?;
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
