//! Watches: snapshots of a semaphore as its data or owners change, ending at the latest state.

use std::collections::HashMap;
use std::pin::Pin;
use std::sync::{Arc, Mutex, OnceLock, Weak};
use std::task::{Context, Poll};

use futures_util::future::{FutureExt, Shared};
use tokio::sync::Notify;
use vvm_core::semaphore::{Description, SemaphoreName};

use super::{expiry_look, CoordinationError, Inner};
use crate::semaphore_store::{SemaphoreChange, SemaphoreRequest, SemaphoreStore};
use crate::session::lock;
use crate::stream::{Pump, Stream};

/// What a [`Watch`] reports a change of.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct WatchKind {
    /// The semaphore's own data.
    pub data: bool,
    /// Its owners: who, how many units, their data; and the limit they share.
    pub owners: bool,
}

impl WatchKind {
    /// Changes of the data only: a configuration.
    pub const DATA: WatchKind = WatchKind {
        data: true,
        owners: false,
    };
    /// Changes of the owners only: a leader, the members of a service.
    pub const OWNERS: WatchKind = WatchKind {
        data: false,
        owners: true,
    };
    /// Changes of either.
    pub const ALL: WatchKind = WatchKind {
        data: true,
        owners: true,
    };

    /// Whether `after` differs from `before` in what this kind watches (with neither set:
    /// in anything). A semaphore being deleted has no owner any more, whatever units its
    /// former owners still hold; a new limit changes what the owners may hold, so it counts as
    /// a change of the owners.
    fn differs(self, before: &Description, after: &Description) -> bool {
        let data = before.data != after.data;
        let owners = (before.owners != after.owners)
            || (before.deleting != after.deleting)
            || (before.limit != after.limit);
        match (self.data, self.owners) {
            (false, false) => before != after,
            _ => (self.data && data) || (self.owners && owners),
        }
    }
}

/// Snapshots of one semaphore, from [`Coordination::watch`](super::Coordination::watch).
///
/// The first [`next`](Self::next) answers the state now; each later one waits until what the
/// [`WatchKind`] names differs from the snapshot it answered last, then answers the state at
/// that moment. A reader slower than the changes skips the snapshots in between but never
/// misses the last: the change feed is subscribed before each read, so a change after a read
/// always wakes the next wait; and a read that failed or was abandoned leaves no wait armed, so
/// the next call reads again at once instead of waiting for a change that already happened.
///
/// The watches of one name on one [`Coordination`](super::Coordination) handle share their
/// reads: one subscription to the feed and one describe transaction per change, however many
/// watches wake — the first one woken reads, the others take that read; each snapshot handed
/// out was read after what woke the watch (or after its first call). A watch whose shared read
/// failed or was abandoned (its reader dropped) makes the read itself: only the reader's own
/// call is answered with the read's error. Waiting costs no store call beyond that one read
/// per wake-up (and one at the soonest expiry of a party's session, which removes the parties
/// of dead sessions).
///
/// A semaphore being deleted (a forced delete while it had owners) is answered once with
/// [`Description::deleting`] set; the watch ends with an error when its record is gone
/// ([`CoordinationError::NotFound`])
/// or the session ends ([`CoordinationError::Session`]).
pub struct Watch<S: SemaphoreStore + Clone> {
    name: SemaphoreName,
    kind: WatchKind,
    pump: Pump<Looking<S>, Result<Description, CoordinationError>>,
}

/// What a watch knows between two answers.
struct Looking<S: SemaphoreStore + Clone> {
    inner: Arc<Inner<S>>,
    reads: Arc<Reads>,
    kind: WatchKind,
    last: Option<Description>,
    /// The read that answered last, whose feed subscription and expiry the next wait waits on;
    /// `None` while no read completed since the last wake-up.
    read: Option<Arc<Read>>,
}

impl<S: SemaphoreStore + Clone> std::fmt::Debug for Watch<S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Watch")
            .field("name", &self.name)
            .field("kind", &self.kind)
            .finish_non_exhaustive()
    }
}

impl<S: SemaphoreStore + Clone> Watch<S> {
    pub(super) fn new(inner: Arc<Inner<S>>, name: SemaphoreName, kind: WatchKind) -> Self {
        let looking = Looking {
            reads: inner.watches.reads(&name),
            inner,
            kind,
            last: None,
            read: None,
        };
        Watch {
            name,
            kind,
            pump: Pump::new(looking, |mut looking| {
                Box::pin(async move {
                    let answer = looking.next().await;
                    (looking, Some(answer))
                })
            }),
        }
    }

    /// The semaphore watched.
    pub fn name(&self) -> &SemaphoreName {
        &self.name
    }

    /// The next snapshot: the state now on the first call, then the latest state once it
    /// differs from the last snapshot answered in what the kind watches. The same answers as
    /// the watch's [`Stream`] (which never ends: an error is answered and the watch goes on).
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: dropping the future (a `timeout`, a `select!`) loses no change. The look
    /// it began goes on with the next call (or the stream), which answers it. Dropping the
    /// watch while it reads for the other watches of the name leaves them to read again.
    pub async fn next(&mut self) -> Result<Description, CoordinationError> {
        match self.pump.next().await {
            Some(answer) => answer,
            // The step always answers: the watch never ends by itself.
            None => Err(CoordinationError::NotFound(self.name.clone())),
        }
    }
}

impl<S: SemaphoreStore + Clone> Stream for Watch<S> {
    type Item = Result<Description, CoordinationError>;

    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        self.get_mut().pump.poll_next(cx)
    }
}

impl<S: SemaphoreStore + Clone> Looking<S> {
    /// One answer of the watch. A read dropped (or failed) leaves no wait armed, so the next
    /// call reads at once.
    async fn next(&mut self) -> Result<Description, CoordinationError> {
        loop {
            // The reads that may answer: those started after what woke this wait, or after
            // this call when no wait is armed (the first call, or after a failed read).
            let after = match (self.read.as_ref(), self.last.as_ref()) {
                (Some(read), Some(_)) => {
                    let look = read.look;
                    let timer = async {
                        match look {
                            Some(at) => tokio::time::sleep_until(at).await,
                            None => std::future::pending().await,
                        }
                    };
                    let woke = tokio::select! {
                        () = read.feed.change.clone() => Woke::Feed,
                        () = timer => Woke::Look,
                        _ = self.inner.session.lost() => Woke::Lost,
                    };
                    self.reads.woken(read, woke)
                }
                _ => self.reads.started(),
            };
            // Whatever woke the wait is answered by this read: until it completes, no wait is
            // armed, so a read that fails or is dropped is made again at the next call.
            self.read = None;
            let read = self.reads.after(after, &self.inner).await?;
            self.read = Some(Arc::clone(&read));
            let description = read
                .description
                .clone()
                .ok_or_else(|| CoordinationError::NotFound(self.reads.name.clone()))?;
            let news = match &self.last {
                None => true,
                Some(last) => self.kind.differs(last, &description),
            };
            if news {
                self.last = Some(description.clone());
                return Ok(description);
            }
        }
    }
}

/// The reads of the watched names of one [`Coordination`](super::Coordination) handle: a name's
/// [`Reads`] lives while a watch of it does.
#[derive(Default)]
pub(super) struct Watches(Arc<Mutex<HashMap<SemaphoreName, Weak<Reads>>>>);

impl Watches {
    /// The reads of `name` shared by its watches on this handle: the live ones, or new ones.
    fn reads(&self, name: &SemaphoreName) -> Arc<Reads> {
        let mut names = lock(&self.0);
        if let Some(reads) = names.get(name).and_then(Weak::upgrade) {
            return reads;
        }
        let reads = Arc::new(Reads {
            name: name.clone(),
            names: Arc::clone(&self.0),
            state: Mutex::default(),
            ended: Notify::new(),
        });
        names.insert(name.clone(), Arc::downgrade(&reads));
        reads
    }
}

/// The reads of one semaphore shared by its watches on one handle: at most one in flight, and
/// the latest one completed, which every watch that may take it takes instead of reading.
struct Reads {
    name: SemaphoreName,
    /// Where these reads are listed, for the last watch to take them out.
    names: Arc<Mutex<HashMap<SemaphoreName, Weak<Reads>>>>,
    state: Mutex<ReadsState>,
    /// A read ended: completed, failed or abandoned.
    ended: Notify,
}

#[derive(Default)]
struct ReadsState {
    /// Reads started: each read's number, in the order they started.
    started: u64,
    /// The read numbered `started` is in flight.
    reading: bool,
    /// The latest read that completed.
    last: Option<Arc<Read>>,
}

/// One completed read of a semaphore, shared by the watches that take it.
struct Read {
    /// Its number among the reads of the name ([`ReadsState::started`]).
    number: u64,
    /// The state read; `None` when the semaphore does not exist.
    description: Option<Description>,
    /// When to look again at the latest: the soonest expiry of a party's session.
    look: Option<tokio::time::Instant>,
    /// The reads started when a watch first woke at `look`: those numbered above it began
    /// after that moment, so they answer the look of every watch that waits on this read.
    looked: OnceLock<u64>,
    /// The feed subscribed before the read: a change after the read wakes it.
    feed: Arc<Feed>,
}

/// One subscription to the semaphore's change feed, shared by the reads made while it had not
/// resolved: every watch of the name then waits on the same one, whichever read it took last.
struct Feed {
    change: Shared<SemaphoreChange>,
    /// The reads started when a watch first woke from this feed: those numbered above it began
    /// after the change that woke it, so they answer it for every watch that waits on it. Once
    /// set, the feed is not given to new reads (they subscribe anew).
    woken: OnceLock<u64>,
}

impl Feed {
    /// Whether a read starting now may wait on this subscription instead of a new one: made
    /// before the read, and no change seen since (a change not seen yet only wakes the read's
    /// watches once more, to read again).
    fn unresolved(&self) -> bool {
        self.woken.get().is_none() && self.change.peek().is_none()
    }
}

/// What woke a watch waiting on a read.
#[derive(Clone, Copy)]
enum Woke {
    /// The read's feed: a change after the read.
    Feed,
    /// The read's look: a party's session may have expired.
    Look,
    /// The session ended: the next read answers so.
    Lost,
}

impl Reads {
    /// The reads started until now: a read numbered above it begins after this call.
    fn started(&self) -> u64 {
        lock(&self.state).started
    }

    /// A watch woke from `read` for `woke`: the reads numbered above the returned one answer
    /// the wake-up. The first watch woken by a feed or a look fixes the number for every watch
    /// woken by the same, so that they all take the one read made after it.
    fn woken(&self, read: &Read, woke: Woke) -> u64 {
        let state = lock(&self.state);
        match woke {
            Woke::Feed => *read.feed.woken.get_or_init(|| state.started),
            Woke::Look => *read.looked.get_or_init(|| state.started),
            Woke::Lost => state.started,
        }
    }

    /// The first read numbered above `after` that completes: the latest one if it is, the one
    /// in flight if it is, else one made by this call (the others waiting for it). A read that
    /// fails is answered with its error to the call that made it only; whoever waited for it
    /// reads again, as after a read abandoned by a dropped watch.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: dropped while it waits, it leaves nothing; dropped while it reads, the read
    /// is abandoned and the calls that waited for it make one of their own.
    async fn after<S: SemaphoreStore + Clone>(
        &self,
        after: u64,
        inner: &Inner<S>,
    ) -> Result<Arc<Read>, CoordinationError> {
        loop {
            let ended = self.ended.notified();
            tokio::pin!(ended);
            let start = {
                let mut state = lock(&self.state);
                if let Some(read) = state.last.as_ref().filter(|read| read.number > after) {
                    return Ok(Arc::clone(read));
                }
                if state.reading {
                    // Woken by the end of the read in flight, whoever ends it: one that began
                    // after `after` answers, an older one makes room for a new read.
                    ended.as_mut().enable();
                    None
                } else {
                    state.started += 1;
                    state.reading = true;
                    let feed = state
                        .last
                        .as_ref()
                        .map(|read| &read.feed)
                        .filter(|feed| feed.unresolved())
                        .map(Arc::clone);
                    Some((state.started, feed))
                }
            };
            match start {
                None => ended.await,
                Some((number, feed)) => return self.read(number, feed, inner).await,
            }
        }
    }

    /// Read number `number`, made by this call for every watch that takes it, waiting on
    /// `feed` (a subscription made before it that saw no change) or on a new one.
    async fn read<S: SemaphoreStore + Clone>(
        &self,
        number: u64,
        feed: Option<Arc<Feed>>,
        inner: &Inner<S>,
    ) -> Result<Arc<Read>, CoordinationError> {
        let reading = Reading {
            reads: self,
            ended: false,
        };
        // Subscribed before the read: a change after it wakes the next wait.
        let feed = feed.unwrap_or_else(|| {
            Arc::new(Feed {
                change: inner.session.store().semaphore_changed(&self.name).shared(),
                woken: OnceLock::new(),
            })
        });
        let applied = inner.call(&self.name, SemaphoreRequest::Describe).await?;
        let read = Arc::new(Read {
            number,
            look: expiry_look(&applied),
            looked: OnceLock::new(),
            description: applied.description,
            feed,
        });
        reading.complete(Arc::clone(&read));
        Ok(read)
    }

    /// The read in flight ended, with `read` when it completed: the waiting calls look again.
    fn end(&self, read: Option<Arc<Read>>) {
        {
            let mut state = lock(&self.state);
            state.reading = false;
            if let Some(read) = read {
                state.last = Some(read);
            }
        }
        self.ended.notify_waiters();
    }
}

impl Drop for Reads {
    /// The last watch of the name is gone: its entry goes too (unless a new watch of the name
    /// listed new reads meanwhile).
    fn drop(&mut self) {
        let mut names = lock(&self.names);
        if names
            .get(&self.name)
            .is_some_and(|reads| reads.strong_count() == 0)
        {
            names.remove(&self.name);
        }
    }
}

/// A read in flight: ended when it completes, fails or is dropped, so that the calls waiting
/// for it never wait for a read nobody makes.
struct Reading<'a> {
    reads: &'a Reads,
    ended: bool,
}

impl Reading<'_> {
    fn complete(mut self, read: Arc<Read>) {
        self.ended = true;
        self.reads.end(Some(read));
    }
}

impl Drop for Reading<'_> {
    fn drop(&mut self) {
        if !self.ended {
            self.reads.end(None);
        }
    }
}
