//! Leader election where everyone knows the leader's endpoint: a semaphore of limit 1 whose
//! owner's data is the leader's address. Candidates queue for it in order of arrival; anyone
//! watching its owners learns the new leader the moment it is granted.
//!
//! ```text
//! cargo run --features open --example recipe_leader [STORE-URL]    # default: memory:
//! cargo run --features open --example recipe_leader sqlite:/tmp/recipe_leader.sqlite
//! ```

use std::error::Error;
use std::time::Duration;

use vvm::adapters::open::open;
use vvm::{
    coordination::{CoordinationError, SemaphoreError, WatchKind},
    new_incarnation,
    session::LeaseValue,
    store::SemaphoreStore,
    AcquireOptions, Coordination, KillerThread, LeaseConfig, SessionHandle,
};

type BoxError = Box<dyn Error + Send + Sync>;

/// One process's coordination: its own session on the shared store.
async fn member<S: SemaphoreStore + Clone>(
    store: S,
    n: u64,
    killer: &KillerThread,
) -> Result<Coordination<S>, BoxError> {
    // A fresh incarnation per session: a restarted process is never mistaken for its former self.
    let value = LeaseValue::new(format!("10.0.0.{n}:7000"), new_incarnation());
    let session = SessionHandle::open(store, LeaseConfig::default(), value, killer).await?;
    Ok(Coordination::new(session))
}

/// Three candidates take turns leading; returns the leaders an observer saw, in order.
pub async fn run<S: SemaphoreStore + Clone>(
    store: S,
    killer: &KillerThread,
) -> Result<Vec<String>, BoxError> {
    let observer = member(store.clone(), 9, killer).await?;
    match observer.create("leader", 1, Vec::new()).await {
        Ok(()) | Err(CoordinationError::Refused(SemaphoreError::AlreadyExists(_))) => {}
        Err(error) => return Err(error.into()),
    }
    let mut leaders = observer.watch("leader", WatchKind::OWNERS)?;
    leaders.next().await?; // nobody leads yet

    let mut candidates = Vec::new();
    for n in 1..=3 {
        let coordination = member(store.clone(), n, killer).await?;
        let (step_down, asked) = tokio::sync::oneshot::channel::<()>();
        candidates.push(step_down);
        tokio::spawn(async move {
            let endpoint = format!("10.0.0.{n}:7000");
            let campaign = AcquireOptions::new(1).data(endpoint);
            if let Ok(Some(grant)) = coordination.acquire("leader", campaign).await {
                // Lead until asked to step down or the grant ends (lost session, forced delete).
                tokio::select! {
                    _ = asked => {}
                    _ = grant.ended() => {}
                }
                let _ = grant.release().await;
            }
        });
        // Arrive one after the other: the queue is in order of arrival.
        tokio::time::sleep(Duration::from_millis(20)).await;
    }

    let mut seen = Vec::new();
    for step_down in candidates {
        let leader = loop {
            let description = leaders.next().await?;
            if let Some(owner) = description.owners.first() {
                break String::from_utf8_lossy(&owner.data).into_owned();
            }
        };
        println!("leader: {leader}");
        seen.push(leader);
        let _ = step_down.send(());
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
