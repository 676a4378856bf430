//! One etcd watch per semaphore and store client, shared by every feed of that name.
//!
//! Every [`Watch`](vvm_runtime::Watch) and every queued acquire waits on the semaphore's feed
//! and takes a new feed after each wake. With a watch per feed, one update seen by 100
//! watchers of a client cost the member 100 watch creations (each with its two reads of the
//! gap, see [`range_changed`](super::feed::range_changed)) and the p99 of the notification grew
//! with the watchers. Here the feeds of one name share one watch, run by a task of the store:
//!
//! - **At the call** (not at the first poll, so that a change right after the call is not
//!   missed) the feed subscribes to the name's entry, or creates it and spawns its task with
//!   the revision the store knows now as the start. The task opens the watch at the current
//!   revision and compares the keys at both revisions, as an unshared feed does: a change in the
//!   gap wakes at once. Feeds that subscribe while the watch is being set up have later starts,
//!   which the same check covers; feeds that subscribe after it was set up are covered by its
//!   events (every write after their call has a higher revision than the watch's start).
//! - **Any event** on the semaphore's keys wakes every feed subscribed at that moment (and moves
//!   the store's known revision on, as an unshared feed does).
//! - **A watch that fails** (cancelled, compacted, its stream ended or broken) wakes every feed
//!   as "unknown" (which, as unshared, resolves no sooner than `UNKNOWN_PAUSE` after the wait
//!   began), after the entry left the hub: a later feed starts a new watch.
//! - **Lifetime**: the task ends [`LINGER`] after its last feed was dropped, when no new one
//!   came; the entry leaves the hub under the hub's lock, so no feed joins a task that is
//!   ending. A waiter that takes a new feed right after each wake (the usual loop) therefore
//!   keeps one watch open, not one per wake.
//!
//! Without a tokio runtime at the call (no task can be spawned) a feed falls back to a watch of
//! its own.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError, Weak};
use std::time::Duration;

use etcd_client::{KvClient, WatchClient, WatchOptions};
use tokio::sync::watch;
use vvm_runtime::SemaphoreChange;

use super::feed::{self, SeenRevision, UNKNOWN_PAUSE};

/// How long a shared watch outlives its last feed: a waiter's next feed, taken after it acted
/// on the wake (a describe, a grant), finds it still open.
pub(super) const LINGER: Duration = Duration::from_secs(1);

/// What the task tells the feeds: a change counter, and whether the last wake was "unknown".
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
struct Tick {
    changes: u64,
    unknown: bool,
}

/// The shared watches of one store client, by the semaphore's first key.
#[derive(Debug, Default)]
pub(super) struct FeedHub {
    entries: Mutex<HashMap<Vec<u8>, Arc<watch::Sender<Tick>>>>,
}

impl FeedHub {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<Vec<u8>, Arc<watch::Sender<Tick>>>> {
        // Every critical section leaves the map consistent; a poisoned lock is usable.
        self.entries.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// Where the shared watch of one semaphore looks.
pub(super) struct Range {
    pub(super) start: Vec<u8>,
    pub(super) end: Vec<u8>,
    /// The semaphore's name, for the log.
    pub(super) what: String,
}

/// The feed of one semaphore on the name's shared watch; see the module documentation.
pub(super) fn range_changed(
    hub: &Arc<FeedHub>,
    watch: WatchClient,
    kv: KvClient,
    seen: &Arc<SeenRevision>,
    range: Range,
) -> SemaphoreChange {
    let Ok(runtime) = tokio::runtime::Handle::try_current() else {
        return feed::range_changed(watch, kv, seen, range.start, range.end, range.what);
    };
    let mut ticks = {
        let mut entries = hub.lock();
        match entries.get(&range.start) {
            Some(entry) => entry.subscribe(),
            None => {
                let after = seen.get();
                let (sender, ticks) = watch::channel(Tick::default());
                let sender = Arc::new(sender);
                entries.insert(range.start.clone(), Arc::clone(&sender));
                let task = Task {
                    hub: Arc::downgrade(hub),
                    sender,
                    seen: Arc::clone(seen),
                    range,
                };
                runtime.spawn(task.run(watch, kv, after));
                ticks
            }
        }
    };
    Box::pin(async move {
        let began = tokio::time::Instant::now();
        // The task gone without a word (its runtime shut down): unknown.
        let unknown = match ticks.changed().await {
            Ok(()) => ticks.borrow().unknown,
            Err(_) => true,
        };
        if unknown {
            tokio::time::sleep_until(began + UNKNOWN_PAUSE).await;
        }
    })
}

struct Task {
    hub: Weak<FeedHub>,
    sender: Arc<watch::Sender<Tick>>,
    seen: Arc<SeenRevision>,
    range: Range,
}

impl Task {
    async fn run(self, watch: WatchClient, kv: KvClient, after: i64) {
        let why = self.watch(watch, kv, after).await;
        match &why {
            Some(why) => {
                tracing::debug!(semaphore = %self.range.what, why, "shared etcd watch ended")
            }
            None => tracing::trace!(semaphore = %self.range.what, "shared etcd watch closed"),
        }
        if let Some(hub) = self.hub.upgrade() {
            let mut entries = hub.lock();
            if entries
                .get(&self.range.start)
                .is_some_and(|entry| Arc::ptr_eq(entry, &self.sender))
            {
                entries.remove(&self.range.start);
            }
            // Under the hub's lock: every feed subscribed to this entry hears it, and no later
            // one can subscribe to it.
            if why.is_some() {
                self.wake(true);
            }
        }
    }

    fn wake(&self, unknown: bool) {
        self.sender.send_modify(|tick| {
            tick.changes += 1;
            tick.unknown = unknown;
        });
    }

    /// Runs the watch until it fails (`Some(why)`) or no feed is left for [`LINGER`] (`None`,
    /// the entry removed under the hub's lock).
    async fn watch(&self, mut watch: WatchClient, mut kv: KvClient, after: i64) -> Option<String> {
        if after <= 0 {
            return Some("no revision of the cluster known yet".into());
        }
        let Range { start, end, .. } = &self.range;
        let options = WatchOptions::new().with_range(end.clone());
        let mut stream = match watch.watch(start.clone(), Some(options)).await {
            Ok(stream) => stream,
            Err(error) => return Some(format!("watch not established: {}", feed::chain(error))),
        };
        // Since when no feed is subscribed, if none is; events are handled meanwhile, so a
        // feed that subscribes during the linger is woken by the next change at once.
        let mut idle_since: Option<tokio::time::Instant> = None;
        loop {
            let linger = async {
                match idle_since {
                    Some(since) => tokio::time::sleep_until(since + LINGER).await,
                    None => std::future::pending().await,
                }
            };
            let message = tokio::select! {
                message = stream.message() => message,
                () = self.sender.closed(), if idle_since.is_none() => {
                    idle_since = Some(tokio::time::Instant::now());
                    continue;
                }
                () = linger => {
                    idle_since = None;
                    let hub = self.hub.upgrade()?;
                    let mut entries = hub.lock();
                    if self.sender.receiver_count() == 0 {
                        if entries
                            .get(start)
                            .is_some_and(|entry| Arc::ptr_eq(entry, &self.sender))
                        {
                            entries.remove(start);
                        }
                        return None;
                    }
                    continue;
                }
            };
            let response = match message {
                Ok(Some(response)) => response,
                Ok(None) => return Some("watch stream ended".into()),
                Err(error) => return Some(format!("watch stream failed: {}", feed::chain(error))),
            };
            if response.canceled() {
                return Some(format!("watch cancelled: {}", response.cancel_reason()));
            }
            if response.created() {
                let Some(now) = response.header().map(|header| header.revision()) else {
                    return Some("watch created without a revision".into());
                };
                if now > after {
                    match feed::gap_changed(&mut kv, start, end, after, now).await {
                        Ok(false) => {}
                        Ok(true) => {
                            self.seen.note_revision(now);
                            self.wake(false);
                        }
                        Err(error) => {
                            return Some(format!(
                                "the keys before the watch cannot be read: {}",
                                feed::chain(error)
                            ))
                        }
                    }
                }
            }
            if let Some(revision) = response
                .events()
                .iter()
                .map(|event| event.kv().map_or(0, |kv| kv.mod_revision()))
                .max()
            {
                // As for an unshared feed: later feeds start after this event.
                self.seen.note_revision(revision);
                self.wake(false);
            }
        }
    }
}
