//! Leader discovery as a stream: who holds each watched slot, and every change of holder.
//!
//! [`observe`] returns an [`Observer`]. Its first answers describe every watched slot as it is
//! (holder or free); after that, [`Observer::next`] answers once per change of a slot's holder: a
//! slot taken, released or expired, passed to another incarnation, or its holder's services
//! asked to stop ([`LeaseValue::stopping`]: the holder still has the slot, so nobody else acts on
//! it yet, but it is no longer the one to send work to). A renewal by the same holder is not a
//! change. Between looks it waits for the earliest of
//!
//! - the store's change feed ([`LeaseStore::changed`]) — a deletion or a new holder is seen
//!   within milliseconds on stores that have one;
//! - the expiry of a held record, on the time the store itself reported left
//!   ([`LeaseStore::time_left`]) — a record that expires without being deleted (SQLite, memory)
//!   is reported free once the store says so;
//! - the resync interval ([`ObserveOptions::resync`]), a fallback for stores with neither, and a
//!   safety net for a feed that missed something.
//!
//! The feed is subscribed before the slots are read, so nothing that happens while they are
//! read is missed. A look costs two store calls per watched slot.
//!
//! Two limits of what an observer can see, both inherent to looking from outside: a holder that
//! releases and takes a slot again with the same incarnation between two looks is one tenure to
//! it; and a holder reported here may already have lost its lease — only the holder's own kill
//! deadline says when it stops acting (see `specs/runtime.md`).
//!
//! ```
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! use std::sync::Arc;
//! use vvm_runtime::observe::{observe, ObserveOptions};
//! # use vvm_runtime::{Lease, LeaseStore, LeaseValue, StoreError};
//! # use vvm_core::{Revision, Slot};
//! # use std::time::Duration;
//! # struct Empty;
//! # impl LeaseStore for Empty {
//! #   async fn insert_if_not_exists(&self, _: Slot, _: &LeaseValue, _: Duration) -> Result<Option<Revision>, StoreError> { Ok(None) }
//! #   async fn compare_and_swap(&self, _: Slot, _: &Lease, _: &LeaseValue, _: Duration) -> Result<Option<Revision>, StoreError> { Ok(None) }
//! #   async fn compare_and_delete(&self, _: Slot, _: &Lease) -> Result<bool, StoreError> { Ok(false) }
//! #   async fn get(&self, _: Slot) -> Result<Option<Lease>, StoreError> { Ok(None) }
//! # }
//! # let store = Arc::new(Empty);
//! let mut observer = observe(store, &[Slot(1), Slot(2)], ObserveOptions::default())?;
//! // The first answers: how the slots are now.
//! let first = observer.next().await?;
//! assert_eq!(first.slot, Slot(1));
//! assert!(first.holder.is_none());
//! # Ok(()) }
//! ```

use std::collections::VecDeque;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use vvm_core::{FencingToken, Slot, SLOTS_MAX};

use crate::store::{CallTimedOut, LeaseStore, LeaseValue, SlotChange, StoreError};
use crate::stream::{Pump, Stream};

/// Shortest resync interval accepted: a shorter one would turn observing into busy polling.
pub const RESYNC_MIN: Duration = Duration::from_millis(10);
/// Added to a record's reported time left before looking again, so that the look falls after
/// the expiry on the store's clock rather than a hair before it.
const EXPIRY_MARGIN: Duration = Duration::from_millis(1);

/// How an [`Observer`] looks at the store.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ObserveOptions {
    /// Longest wait between two looks when neither the feed nor an expiry wakes the observer.
    pub resync: Duration,
    /// Longest one store call may take; a slower call is reported as [`StoreError::Unknown`].
    pub call_timeout: Duration,
}

impl Default for ObserveOptions {
    /// A look at least every second; store calls time out after 5 s.
    fn default() -> Self {
        ObserveOptions {
            resync: Duration::from_secs(1),
            call_timeout: Duration::from_secs(5),
        }
    }
}

/// Why [`observe`] refused its arguments.
#[non_exhaustive]
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ObserveError {
    /// No slot to watch.
    #[error("no slot to observe")]
    NoSlots,
    /// More slots than [`SLOTS_MAX`].
    #[error("{count} slots to observe, more than the maximum of {max}")]
    TooManySlots {
        /// How many were given.
        count: usize,
        /// [`SLOTS_MAX`].
        max: u32,
    },
    /// Slot 0, or a slot given twice.
    #[error("slot {0} is 0 or given twice")]
    BadSlot(u32),
    /// A resync interval below [`RESYNC_MIN`].
    #[error("resync interval {resync:?} is shorter than {min:?}")]
    ResyncTooShort {
        /// The interval given.
        resync: Duration,
        /// [`RESYNC_MIN`].
        min: Duration,
    },
    /// A zero store-call timeout.
    #[error("the store-call timeout is zero")]
    ZeroCallTimeout,
}

/// Who holds a slot, as read from the store.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Holder {
    /// The record: the holder's address and incarnation, and whether its services are being
    /// asked to stop ([`LeaseValue::stopping`]).
    pub value: LeaseValue,
    /// The fencing token of the record as read (its revision changes with every renewal).
    pub token: FencingToken,
    /// How long the record had left on the store's clock when read; `None` when the store does
    /// not tell.
    pub time_left: Option<Duration>,
}

/// A slot's holder: how it was first seen, or how it changed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HolderChange {
    /// The slot.
    pub slot: Slot,
    /// Its holder now; `None` when the slot is free (released, expired or never taken).
    pub holder: Option<Holder>,
}

/// A stream of [`HolderChange`]s for a set of slots (a [`Stream`] that never ends: a failed look
/// is answered with its error and the next one looks again); see the [module docs](self).
pub struct Observer<S: LeaseStore> {
    slots: Vec<Slot>,
    pump: Pump<Looking<S>, Result<HolderChange, StoreError>>,
}

impl<S: LeaseStore> std::fmt::Debug for Observer<S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Observer")
            .field("slots", &self.slots)
            .finish_non_exhaustive()
    }
}

/// What an observer knows between two answers.
struct Looking<S: LeaseStore> {
    store: Arc<S>,
    slots: Vec<Slot>,
    options: ObserveOptions,
    /// The holder each slot had at the last look (`None`: free), `None` before the first look.
    known: Option<Vec<Option<LeaseValue>>>,
    /// Changes found by the last look, not yet answered; at most one per slot.
    pending: VecDeque<HolderChange>,
    /// Subscribed before the look whose result it covers.
    feed: Option<SlotChange>,
    /// The earliest reported expiry of a held slot, as a wait from the last look.
    next_expiry: Option<Duration>,
    /// When the last look started: looks are at least [`RESYNC_MIN`] apart, so a feed that
    /// keeps resolving (a store it cannot reach) does not turn into a busy loop.
    last_look: Option<tokio::time::Instant>,
    /// Per slot: when the record of the holder last seen there was due to expire, as far as the
    /// looks could tell (its time left added to the start of the look that read it); kept after
    /// the holder is gone, to tell a release from an expiry.
    expiries: Vec<Option<tokio::time::Instant>>,
    /// When the look that last found each slot's holder gone started.
    gone_at: Vec<Option<tokio::time::Instant>>,
}

/// How the holder of a slot that is now free went away, as an observer can tell it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Departure {
    /// The record was gone before it could have expired: it was deleted (released, or taken
    /// away by an operator).
    Released,
    /// The record was gone at or after its expiry (give or take [`DEPARTURE_LEEWAY`]).
    Expired,
    /// The store did not tell how long the record had left, or no holder was seen.
    Unknown,
}

/// How much earlier than its reported expiry a record may be found gone and still count as
/// expired: the store's clock and the observer's are not one clock.
pub const DEPARTURE_LEEWAY: Duration = Duration::from_millis(200);

/// Watches `slots` of `store`; see the [module docs](self).
pub fn observe<S: LeaseStore>(
    store: Arc<S>,
    slots: &[Slot],
    options: ObserveOptions,
) -> Result<Observer<S>, ObserveError> {
    if slots.is_empty() {
        return Err(ObserveError::NoSlots);
    }
    if slots.len() > SLOTS_MAX as usize {
        return Err(ObserveError::TooManySlots {
            count: slots.len(),
            max: SLOTS_MAX,
        });
    }
    for (index, slot) in slots.iter().enumerate() {
        if slot.0 == 0 || slots[..index].contains(slot) {
            return Err(ObserveError::BadSlot(slot.0));
        }
    }
    if options.resync < RESYNC_MIN {
        return Err(ObserveError::ResyncTooShort {
            resync: options.resync,
            min: RESYNC_MIN,
        });
    }
    if options.call_timeout.is_zero() {
        return Err(ObserveError::ZeroCallTimeout);
    }
    let looking = Looking {
        store,
        slots: slots.to_vec(),
        options,
        known: None,
        expiries: vec![None; slots.len()],
        gone_at: vec![None; slots.len()],
        pending: VecDeque::with_capacity(slots.len()),
        feed: None,
        next_expiry: None,
        last_look: None,
    };
    Ok(Observer {
        slots: slots.to_vec(),
        pump: Pump::new(looking, |mut looking| {
            Box::pin(async move {
                let answer = looking.next().await;
                (looking, Some(answer))
            })
        }),
    })
}

impl<S: LeaseStore> Observer<S> {
    /// The slots watched, in the order their first answers come.
    pub fn slots(&self) -> &[Slot] {
        &self.slots
    }

    /// How the holder last seen on `slot` went away, judged when a look found it gone: meant
    /// for right after [`next`](Self::next) reported `slot` free. [`Departure::Unknown`] while
    /// a look is under way (one whose `next` was dropped before it answered).
    pub fn departure(&self, slot: Slot) -> Departure {
        self.pump
            .state()
            .map_or(Departure::Unknown, |looking| looking.departure(slot))
    }

    /// The next change. The first answers are the state of every slot, in the order given to
    /// [`observe`]; then one answer per change of holder. A failed look returns its error and
    /// leaves the observer usable: the next call looks again (and reports what changed since
    /// the last successful look). The same answers as the observer's [`Stream`].
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: dropping the future (a `select!` or a timeout) loses no change; the look it
    /// began goes on with the next call, which answers it.
    pub async fn next(&mut self) -> Result<HolderChange, StoreError> {
        match self.pump.next().await {
            Some(answer) => answer,
            // The step always answers: an observer never ends by itself.
            None => Err(StoreError::unknown(ObserverEnded)),
        }
    }
}

impl<S: LeaseStore> Stream for Observer<S> {
    type Item = Result<HolderChange, StoreError>;

    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        self.get_mut().pump.poll_next(cx)
    }
}

/// An observer asked for an answer after it ended (which it never does by itself).
#[derive(Debug, thiserror::Error)]
#[error("the observer ended")]
struct ObserverEnded;

impl<S: LeaseStore> Looking<S> {
    fn departure(&self, slot: Slot) -> Departure {
        let Some(index) = self.slots.iter().position(|&s| s == slot) else {
            return Departure::Unknown;
        };
        match (self.expiries[index], self.gone_at[index]) {
            (Some(expiry), Some(gone)) if gone + DEPARTURE_LEEWAY < expiry => Departure::Released,
            (Some(_), Some(_)) => Departure::Expired,
            _ => Departure::Unknown,
        }
    }

    /// One answer of the observer.
    async fn next(&mut self) -> Result<HolderChange, StoreError> {
        loop {
            if let Some(change) = self.pending.pop_front() {
                return Ok(change);
            }
            if self.known.is_some() {
                self.wait().await;
            }
            self.look().await?;
        }
    }

    /// Waits for the feed, the earliest expiry or the resync interval, whichever comes first.
    /// Without a feed — the last one resolved and the look after it was cancelled — it does
    /// not wait: that look is still due.
    async fn wait(&mut self) {
        let wait = self
            .next_expiry
            .map_or(self.options.resync, |left| left.min(self.options.resync));
        let Some(feed) = self.feed.as_mut() else {
            return;
        };
        let fired = tokio::select! {
            () = feed => true,
            () = tokio::time::sleep(wait) => false,
        };
        if fired {
            // A resolved feed is never polled again.
            self.feed = None;
        }
    }

    /// Reads every slot and queues the differences from the last look.
    async fn look(&mut self) -> Result<(), StoreError> {
        if let Some(last) = self.last_look {
            tokio::time::sleep_until(last + RESYNC_MIN).await;
        }
        self.last_look = Some(tokio::time::Instant::now());
        // Subscribed first: a change made while the slots are read wakes the next wait.
        self.feed = Some(self.store.changed(&self.slots));
        let mut seen = Vec::with_capacity(self.slots.len());
        let mut next_expiry: Option<Duration> = None;
        let started = tokio::time::Instant::now();
        for (index, &slot) in self.slots.iter().enumerate() {
            let holder = read(&*self.store, self.options.call_timeout, slot).await?;
            match holder.as_ref().map(|holder| holder.time_left) {
                Some(Some(left)) => {
                    let wake = left.saturating_add(EXPIRY_MARGIN);
                    next_expiry = Some(next_expiry.map_or(wake, |earliest| earliest.min(wake)));
                    self.expiries[index] = Some(started + left);
                }
                Some(None) => {
                    // The store did not tell, or the record went away between the read and
                    // the time-left call (a release at that instant): an expiry known for the
                    // same holder from an earlier look still stands, so that its departure is
                    // still judged released or expired.
                    let known = self.known.as_ref().and_then(|known| known[index].as_ref());
                    let same = known
                        .zip(holder.as_ref())
                        .is_some_and(|(known, holder)| known.same_holder(&holder.value));
                    if !same {
                        self.expiries[index] = None;
                    }
                }
                None => self.gone_at[index] = Some(started),
            }
            seen.push(HolderChange { slot, holder });
        }
        self.next_expiry = next_expiry;
        let first = self.known.is_none();
        let known = self.known.get_or_insert_with(|| vec![None; seen.len()]);
        for (index, change) in seen.into_iter().enumerate() {
            let identity = change.holder.as_ref().map(|holder| holder.value.clone());
            if first || known[index] != identity {
                known[index] = identity;
                self.pending.push_back(change);
            }
        }
        Ok(())
    }
}

/// Reads `slot`'s holder and its time left, each call under `timeout`. (A function of its own:
/// the observer's state, which holds the feed's future, need not be shared across the await.)
async fn read<S: LeaseStore>(
    store: &S,
    timeout: Duration,
    slot: Slot,
) -> Result<Option<Holder>, StoreError> {
    let late = |call: &'static str| {
        StoreError::unknown(CallTimedOut {
            call,
            slot: slot.0,
            timeout,
        })
    };
    let lease = tokio::time::timeout(timeout, store.get(slot))
        .await
        .map_err(|_| late("reading"))??;
    let Some(lease) = lease else {
        return Ok(None);
    };
    let time_left = tokio::time::timeout(timeout, store.time_left(slot))
        .await
        .map_err(|_| late("reading the time left"))??;
    Ok(Some(Holder {
        token: FencingToken {
            slot,
            revision: lease.revision,
        },
        value: lease.value,
        time_left,
    }))
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::Mutex;

    use vvm_core::{Incarnation, Revision};

    use super::*;
    use crate::store::Lease;

    /// One slot's record, and a switch that makes the time-left call answer "not told", as a
    /// store does when the record went away between the read and that call.
    #[derive(Default)]
    struct OneRecord {
        record: Mutex<Option<Lease>>,
        untold: AtomicBool,
    }

    impl LeaseStore for OneRecord {
        async fn insert_if_not_exists(
            &self,
            _: Slot,
            _: &LeaseValue,
            _: Duration,
        ) -> Result<Option<Revision>, StoreError> {
            Ok(None)
        }

        async fn compare_and_swap(
            &self,
            _: Slot,
            _: &crate::store::Lease,
            _: &LeaseValue,
            _: Duration,
        ) -> Result<Option<Revision>, StoreError> {
            Ok(None)
        }

        async fn compare_and_delete(&self, _: Slot, _: &Lease) -> Result<bool, StoreError> {
            Ok(false)
        }

        async fn get(&self, _: Slot) -> Result<Option<Lease>, StoreError> {
            Ok(self.record.lock().unwrap().clone())
        }

        async fn time_left(&self, _: Slot) -> Result<Option<Duration>, StoreError> {
            if self.untold.load(Ordering::SeqCst) {
                return Ok(None);
            }
            Ok(Some(Duration::from_secs(10)))
        }
    }

    // covers: Obs.Changes
    /// A release that lands between a look's read and its time-left call leaves that look
    /// without a time left; the holder's departure is still judged from the expiry an earlier
    /// look saw, not reported as unknown.
    #[tokio::test(start_paused = true)]
    async fn a_release_between_the_read_and_the_time_left_is_still_judged_released() {
        let store = Arc::new(OneRecord::default());
        *store.record.lock().unwrap() = Some(Lease {
            value: LeaseValue::new("a", Incarnation(1)),
            revision: Revision(1),
        });
        let options = ObserveOptions {
            resync: RESYNC_MIN,
            call_timeout: Duration::from_secs(1),
        };
        let mut observer = observe(store.clone(), &[Slot(1)], options).unwrap();
        assert!(observer.next().await.unwrap().holder.is_some());
        store.untold.store(true, Ordering::SeqCst);
        // Looks that read the holder but are not told its time left: no change to answer.
        let quiet = tokio::time::timeout(RESYNC_MIN * 3, observer.next()).await;
        assert!(quiet.is_err(), "{quiet:?}");
        let record = store.record.lock().unwrap().take();
        assert!(record.is_some());
        let gone = observer.next().await.unwrap();
        assert_eq!(gone.holder, None);
        assert_eq!(observer.departure(Slot(1)), Departure::Released);
    }
}
