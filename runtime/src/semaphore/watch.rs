//! Watches: snapshots of a semaphore as its data or owners change, ending at the latest state.

use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use vvm_core::semaphore::{Description, SemaphoreName};

use super::{expiry_look, CoordinationError, Inner};
use crate::semaphore_store::{SemaphoreChange, SemaphoreRequest, SemaphoreStore};
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
/// Waiting costs no store call beyond one read per wake-up (and
/// one at the soonest expiry of a party's session, which removes the parties of dead
/// sessions).
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
    name: SemaphoreName,
    kind: WatchKind,
    last: Option<Description>,
    change: Option<SemaphoreChange>,
    look: Option<tokio::time::Instant>,
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
            inner,
            name: name.clone(),
            kind,
            last: None,
            change: None,
            look: None,
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
    /// it began goes on with the next call (or the stream), which answers it.
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
        let store = self.inner.session.store();
        loop {
            if let (Some(change), Some(_)) = (self.change.as_mut(), self.last.as_ref()) {
                let look = self.look;
                let timer = async {
                    match look {
                        Some(at) => tokio::time::sleep_until(at).await,
                        None => std::future::pending().await,
                    }
                };
                tokio::select! {
                    () = change.as_mut() => {}
                    () = timer => {}
                    _ = self.inner.session.lost() => {}
                }
            }
            // Whatever woke the wait is answered by this read: until it completes, no wait is
            // armed, so a read that fails or is dropped is made again at the next call.
            self.change = None;
            // Subscribed before the read: a change after it wakes the next wait.
            let change = store.semaphore_changed(&self.name);
            let applied = self
                .inner
                .call(&self.name, SemaphoreRequest::Describe)
                .await?;
            self.change = Some(change);
            self.look = expiry_look(&applied);
            let description = applied
                .description
                .ok_or_else(|| CoordinationError::NotFound(self.name.clone()))?;
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
