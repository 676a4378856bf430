//! The change feed of the etcd store: one etcd watch per waiting future.
//!
//! # Starting point
//!
//! [`LeaseStore::changed`](vvm_runtime::LeaseStore::changed) is synchronous, so no request can
//! run at the call. Instead the store remembers the highest cluster revision any of its
//! responses carried (a lower bound of "now" at the call), and the watch starts right after it:
//! every change committed after the call has a higher revision, so none is missed, whenever
//! the watch is actually established. Changes between that revision and the call are replayed
//! too, which can only wake the waiter once too often. The event that wakes a feed moves that
//! revision on as well, so the next feed does not replay it (even when every call of the waiter
//! failed in between). A store that has never had an answer
//! knows no revision: its feed resolves after [`UNKNOWN_PAUSE`] (the waiter looks again, and
//! its next feed starts from the revision of that look).
//!
//! # What wakes
//!
//! One watch covers the range from the lowest to the highest watched key (keys in between that
//! are not watched are ignored), with the previous value of every event:
//! - a `DELETE` of a watched key: released, or removed by etcd when its lease expired;
//! - a `PUT` whose value differs from the previous one: another holder (a renewal by the same
//!   holder writes the same bytes and does not wake);
//! - a `PUT` without a previous value on a key that existed before (the previous value was
//!   compacted away): the store cannot tell, so it wakes;
//! - the watch cancelled by the server (compaction past its start revision, lost leader), its
//!   stream ended or failed, or the watch could not be established (the client's request
//!   timeout bounds that): the state is unknown, so it wakes — not before [`UNKNOWN_PAUSE`]
//!   after the wait began, so that a cluster that is down is not asked again in a tight loop.
//!
//! A VVM candidate stops watching while its store calls fail, and spaces its rounds with a
//! backoff instead (the runtime's pacing): what wakes "unknown" then would only make it try faster.
//!
//! A `PUT` that creates a key does not wake: the key was absent when the watch started, and a
//! waiter refused after the call was refused by that record or a later one, whose own changes
//! come as later events.
//!
//! # Resources
//!
//! The watch lives inside the returned future: no task is spawned. Dropping the future drops
//! the gRPC stream, and etcd removes its watcher when the stream is reset.

use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use etcd_client::{Event, EventType, GetOptions, KvClient, WatchClient, WatchOptions};
use vvm_core::Slot;
use vvm_runtime::SlotChange;

use super::vanished::Vanished;
use super::EtcdClientError;

/// The client's error and its causes, for the feed's diagnostic (logged, never returned).
pub(super) fn chain(error: etcd_client::Error) -> String {
    vvm_runtime::ErrorChain(&EtcdClientError(error)).to_string()
}

/// Shortest wait of a feed that ends without having seen a change (unknown state: error,
/// cancellation, no revision known): bounds how often a waiter asks a cluster that is down.
pub const UNKNOWN_PAUSE: Duration = Duration::from_millis(100);

/// The highest cluster revision seen in any response of one store (and its clones).
#[derive(Debug, Default)]
pub(super) struct SeenRevision(AtomicI64);

impl SeenRevision {
    /// Notes the revision of a response header.
    pub(super) fn note(&self, header: Option<&etcd_client::ResponseHeader>) {
        if let Some(header) = header {
            self.note_revision(header.revision());
        }
    }

    pub(super) fn note_revision(&self, revision: i64) {
        self.0.fetch_max(revision, Ordering::AcqRel);
    }

    pub(super) fn get(&self) -> i64 {
        self.0.load(Ordering::Acquire)
    }
}

/// Why a feed resolved.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Wake {
    /// A watched record was deleted.
    Deleted,
    /// A watched record now holds another value.
    Replaced,
    /// The feed cannot tell what happened.
    Unknown(String),
}

/// The feed of `names` (the keys of the watched slots), starting after the revision `seen`
/// knows now.
pub(super) fn changed(
    watch: WatchClient,
    seen: &Arc<SeenRevision>,
    vanished: &Arc<Vanished>,
    names: Vec<Vec<u8>>,
    slots: &[Slot],
) -> SlotChange {
    let mut names = names;
    names.sort_unstable();
    names.dedup();
    // Read at the call, not at the first poll: see the module documentation.
    let after = seen.get();
    let seen = Arc::clone(seen);
    let vanished = Arc::clone(vanished);
    let slots: Vec<u32> = slots.iter().map(|slot| slot.0).collect();
    Box::pin(async move {
        if names.is_empty() {
            return std::future::pending().await;
        }
        let began = tokio::time::Instant::now();
        let wake = watch_until_change(watch, &seen, &vanished, &names, after).await;
        tracing::debug!(?slots, ?wake, "etcd change feed resolved");
        if matches!(wake, Wake::Unknown(_)) {
            tokio::time::sleep_until(began + UNKNOWN_PAUSE).await;
        }
    })
}

async fn watch_until_change(
    mut watch: WatchClient,
    seen: &SeenRevision,
    vanished: &Vanished,
    names: &[Vec<u8>],
    after: i64,
) -> Wake {
    if after <= 0 {
        return Wake::Unknown("no revision of the cluster known yet".into());
    }
    let (Some(first), Some(last)) = (names.first(), names.last()) else {
        return Wake::Unknown("no keys".into());
    };
    // The range [first, last + "\0") holds exactly the keys from `first` to `last`.
    let mut end = last.clone();
    end.push(0);
    let options = WatchOptions::new()
        .with_range(end)
        .with_start_revision(after.saturating_add(1))
        .with_prev_key();
    let mut stream = match watch.watch(first.clone(), Some(options)).await {
        Ok(stream) => stream,
        Err(error) => return Wake::Unknown(format!("watch not established: {}", chain(error))),
    };
    loop {
        let response = match stream.message().await {
            Ok(Some(response)) => response,
            Ok(None) => return Wake::Unknown("watch stream ended".into()),
            Err(error) => return Wake::Unknown(format!("watch stream failed: {}", chain(error))),
        };
        if response.compact_revision() != 0 {
            return Wake::Unknown(format!(
                "watch start compacted away (compacted up to {})",
                response.compact_revision()
            ));
        }
        if response.canceled() {
            return Wake::Unknown(format!("watch cancelled: {}", response.cancel_reason()));
        }
        for event in response.events() {
            note(vanished, names, event);
        }
        if let Some((wake, revision)) = response
            .events()
            .iter()
            .find_map(|event| wakes(names, event))
        {
            // The next feed starts after this event: the waiter acts on it now, and a store
            // whose calls fail (so that no answer moves the start on) must not be woken by the
            // same event again and again.
            seen.note_revision(revision);
            return wake;
        }
    }
}

/// Notes a write or a deletion of a key of `names` (sorted) for the judgement of records
/// removed from outside: every renewal is seen here, though none wakes (see `vanished`).
fn note(vanished: &Vanished, names: &[Vec<u8>], event: &Event) {
    let Some(kv) = event.kv() else {
        return;
    };
    if names
        .binary_search_by(|name| name.as_slice().cmp(kv.key()))
        .is_err()
    {
        return;
    }
    match event.event_type() {
        EventType::Put => vanished.put(kv.key(), kv.mod_revision()),
        EventType::Delete => {
            let previous = event.prev_kv().map(|previous| previous.mod_revision());
            vanished.deleted(kv.key(), kv.mod_revision(), previous);
        }
    }
}

/// Whether `event` wakes a waiter on `names` (sorted), and the event's revision.
fn wakes(names: &[Vec<u8>], event: &Event) -> Option<(Wake, i64)> {
    let Some(kv) = event.kv() else {
        return Some((Wake::Unknown("event without a key".into()), 0));
    };
    names
        .binary_search_by(|name| name.as_slice().cmp(kv.key()))
        .ok()?;
    let wake = match event.event_type() {
        EventType::Delete => Wake::Deleted,
        EventType::Put => match event.prev_kv() {
            Some(previous) if previous.value() == kv.value() => return None,
            Some(_) => Wake::Replaced,
            // Created: absent when the watch started (see the module documentation).
            None if kv.version() == 1 => return None,
            None => Wake::Unknown("previous value compacted away".into()),
        },
    };
    Some((wake, kv.mod_revision()))
}

/// The feed of one semaphore: every event on a key in `[start, end)` (its state key and its
/// party keys) after the revision `seen` knows now wakes it, a put as a deletion (a state
/// written, a party joined or left, a party's lease ended); whatever it cannot tell wakes it
/// too, not before [`UNKNOWN_PAUSE`] after the wait began.
///
/// A watch whose start revision is already past is *unsynced* in etcd: its events, even those
/// committed after it was set up, come only when etcd's watch loop catches it up, every
/// 100 ms. So the watch starts at the current revision `R` (its creation answer says which),
/// and the gap between the call's revision `A` and `R` is checked by reading the semaphore's
/// keys at both revisions (keys and `mod_revision`s): any write or deletion in between makes
/// them differ, and wakes at once.
pub(super) fn range_changed(
    watch: WatchClient,
    kv: KvClient,
    seen: &Arc<SeenRevision>,
    start: Vec<u8>,
    end: Vec<u8>,
    what: String,
) -> vvm_runtime::SemaphoreChange {
    // Read at the call, not at the first poll: see the module documentation.
    let after = seen.get();
    let seen = Arc::clone(seen);
    Box::pin(async move {
        let began = tokio::time::Instant::now();
        let wake = watch_range(watch, kv, &seen, start, end, after).await;
        tracing::debug!(semaphore = %what, ?wake, "etcd semaphore feed resolved");
        if matches!(wake, Wake::Unknown(_)) {
            tokio::time::sleep_until(began + UNKNOWN_PAUSE).await;
        }
    })
}

/// The keys in `[start, end)` at `revision`, each with its `mod_revision`.
async fn keys_at(
    kv: &mut KvClient,
    start: &[u8],
    end: &[u8],
    revision: i64,
) -> Result<Vec<(Vec<u8>, i64)>, etcd_client::Error> {
    let options = GetOptions::new()
        .with_range(end.to_vec())
        .with_keys_only()
        .with_revision(revision);
    let response = kv.get(start.to_vec(), Some(options)).await?;
    Ok(response
        .kvs()
        .iter()
        .map(|kv| (kv.key().to_vec(), kv.mod_revision()))
        .collect())
}

/// Whether a key in `[start, end)` was written or deleted between the revisions `after` and
/// `now`: the keys and their `mod_revision`s differ.
pub(super) async fn gap_changed(
    kv: &mut KvClient,
    start: &[u8],
    end: &[u8],
    after: i64,
    now: i64,
) -> Result<bool, etcd_client::Error> {
    let then = keys_at(kv, start, end, after).await?;
    let now = keys_at(kv, start, end, now).await?;
    Ok(then != now)
}

async fn watch_range(
    mut watch: WatchClient,
    mut kv: KvClient,
    seen: &SeenRevision,
    start: Vec<u8>,
    end: Vec<u8>,
    after: i64,
) -> Wake {
    if after <= 0 {
        return Wake::Unknown("no revision of the cluster known yet".into());
    }
    let options = WatchOptions::new().with_range(end.clone());
    let mut stream = match watch.watch(start.clone(), Some(options)).await {
        Ok(stream) => stream,
        Err(error) => return Wake::Unknown(format!("watch not established: {}", chain(error))),
    };
    loop {
        let response = match stream.message().await {
            Ok(Some(response)) => response,
            Ok(None) => return Wake::Unknown("watch stream ended".into()),
            Err(error) => return Wake::Unknown(format!("watch stream failed: {}", chain(error))),
        };
        if response.canceled() {
            return Wake::Unknown(format!("watch cancelled: {}", response.cancel_reason()));
        }
        if response.created() {
            let Some(now) = response.header().map(|header| header.revision()) else {
                return Wake::Unknown("watch created without a revision".into());
            };
            if now > after {
                match gap_changed(&mut kv, &start, &end, after, now).await {
                    Ok(false) => {}
                    Ok(true) => {
                        seen.note_revision(now);
                        return Wake::Replaced;
                    }
                    Err(error) => {
                        return Wake::Unknown(format!(
                            "the keys before the watch cannot be read: {}",
                            chain(error)
                        ))
                    }
                }
            }
        }
        if let Some(event) = response.events().first() {
            let revision = event.kv().map_or(0, |kv| kv.mod_revision());
            // As for slots: the next feed starts after this event.
            seen.note_revision(revision);
            return match event.event_type() {
                EventType::Delete => Wake::Deleted,
                EventType::Put => Wake::Replaced,
            };
        }
    }
}
