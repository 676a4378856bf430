//! What a waiting `vvm run` says while it campaigns: who holds each slot it wants and how long
//! that holder's record has left (or, for `--semaphore`, its place in the queue and who holds
//! the units), once at the start and again at every change — so that a standby's log shows
//! what it waits for, not only that it waits.

use std::sync::Arc;
use std::time::Duration;

use vvm::Slot;
use vvm::{
    discovery::{HolderChange, ObserveOptions},
    observe,
};

use super::store::AnyStore;
use super::systemd::Notifier;

/// Longest wait between two looks when the store's feed says nothing (the holder's expiry is
/// looked at anyway): a log line, not a decision, depends on it, so a slow look costs little —
/// and a standby that looks seldom costs nothing while it waits.
const RESYNC: Duration = Duration::from_secs(30);
/// Longest a look may take.
const CALL_TIMEOUT: Duration = Duration::from_secs(5);

/// Logs the holders of `slots`; never resolves (the campaign that it runs beside drops it).
/// Records written under `own_address` are this process's own and are not reported.
/// Each change is also the `STATUS=` line systemd shows (see [`Notifier::status`]).
pub async fn report(store: Arc<AnyStore>, slots: u32, own_address: String, notifier: &Notifier) {
    {
        let slots: Vec<Slot> = (1..=slots).map(Slot).collect();
        let options = ObserveOptions {
            resync: RESYNC,
            call_timeout: CALL_TIMEOUT,
        };
        let Ok(mut observer) = observe(store, &slots, options) else {
            return std::future::pending().await;
        };
        // A record vvm did not write (corrupt, or foreign: an etcd key without a lease) is
        // what the candidate waits on, maybe for ever: said once, at WARN, naming it.
        let mut foreign_said: Option<String> = None;
        loop {
            match observer.next().await {
                Ok(change) => {
                    if let Some(status) = log_change(&change, &own_address) {
                        notifier.status(status);
                    }
                }
                Err(e @ vvm::store::StoreError::Corrupt { slot, .. }) => {
                    let why = vvm::store::ErrorChain(&e).to_string();
                    if foreign_said.as_deref() != Some(why.as_str()) {
                        tracing::warn!(slot, error = %why, "waiting: the slot holds a record vvm did not write; it is never taken over while it lasts");
                        notifier.status(format!(
                            "Waiting: slot {slot} holds a record vvm did not write"
                        ));
                        foreign_said = Some(why);
                    }
                    tokio::time::sleep(RESYNC).await;
                }
                Err(e) => {
                    tracing::debug!(error = %vvm::store::ErrorChain(&e), "cannot tell who holds the slot");
                    tokio::time::sleep(RESYNC).await;
                }
            }
        }
    }
}

/// Logs one change; returns the status line for systemd.
fn log_change(change: &HolderChange, own_address: &str) -> Option<String> {
    match &change.holder {
        Some(holder) if holder.value.address == own_address => return None,
        Some(holder) => tracing::info!(
            slot = change.slot.0,
            holder = %holder.value.address,
            fencing_token = %holder.token,
            left = %holder.time_left.map_or_else(|| "?".to_owned(), |left| format!("{:.1}s", left.as_secs_f64())),
            "waiting: the slot is held; it passes on when released, or when its holder stops renewing"
        ),
        None => tracing::info!(slot = change.slot.0, "the slot is free: trying to take it"),
    }
    Some(match &change.holder {
        Some(holder) => format!(
            "Waiting: slot {} is held by {} (fencing token {})",
            change.slot.0, holder.value.address, holder.token
        ),
        None => format!("Slot {} is free: taking it", change.slot.0),
    })
}

/// Logs this run's place in the queue of semaphore `name` and who holds its units, at the start
/// and at every change of owners; never resolves (the acquire it runs beside drops it). Its own
/// request is the waiter of `session`.
pub async fn report_queue(
    coordination: vvm::Coordination<Arc<AnyStore>>,
    name: String,
    session: vvm_core::SessionKey,
    notifier: &Notifier,
) {
    // Every change, the queue's included (neither kind set): this run's own request queued, a
    // waiter ahead gone, the owners changed — woken by the store's feed, never by looking.
    let Ok(mut watch) = coordination.watch(&name, vvm::coordination::WatchKind::default()) else {
        return std::future::pending().await;
    };
    let mut said = String::new();
    loop {
        let description = match watch.next().await {
            Ok(description) => description,
            Err(e) => {
                tracing::debug!(error = %vvm::store::ErrorChain(&e), "cannot tell who holds the units");
                tokio::time::sleep(RESYNC).await;
                continue;
            }
        };
        let Some(place) = description
            .waiters
            .iter()
            .position(|waiter| waiter.session == session)
        else {
            // Not queued yet (or granted already): nothing to say.
            continue;
        };
        let holders: Vec<String> = description
            .owners
            .iter()
            .map(|owner| {
                format!(
                    "{} ({})",
                    String::from_utf8_lossy(&owner.data),
                    units_text(owner.count)
                )
            })
            .collect();
        let holders = if holders.is_empty() {
            "nobody".to_owned()
        } else {
            holders.join(", ")
        };
        let line = format!(
            "{}/{} in use, held by {holders}; place {} of {} in the queue",
            description.count,
            description.limit,
            place + 1,
            description.waiters.len()
        );
        if line != said {
            tracing::info!(
                semaphore = %name,
                place = place + 1,
                queued = description.waiters.len(),
                in_use = description.count,
                limit = description.limit,
                holders = %holders,
                "waiting: the units are held; they pass on in order of arrival"
            );
            notifier.status(format!("Waiting for {name}: {line}"));
            said = line;
        }
    }
}

/// `1 unit`, `3 units`.
pub(super) fn units_text(count: u64) -> String {
    if count == 1 {
        "1 unit".to_owned()
    } else {
        format!("{count} units")
    }
}
