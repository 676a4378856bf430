//! Coordination at run time: semaphores on a session, with grants that live as long as the
//! session, queued acquires that wait for their grant, and watches.
//!
//! A [`Coordination`] wraps a [`SessionHandle`] on a [`SemaphoreStore`]. Every operation is one
//! store transaction under the store-call timeout ([`SemaphoreStore::semaphore`]); the session
//! must be live in the store for it (else [`CoordinationError::SessionGone`] and nothing is
//! written).
//!
//! - [`acquire`](Coordination::acquire) returns a [`SemaphoreGrant`] at once when the count fits
//!   and nobody is queued; otherwise the request queues, in order of arrival, and the call waits
//!   for its grant: woken by the semaphore's change feed (no polling), and at the soonest expiry
//!   of another party's session (whose parties the store then removes). When the timeout
//!   passes first, the request leaves the queue ([`Semaphore::cancel_waiter_timeout`]) and the
//!   answer is `Ok(None)` — unless it was granted just before, and then it keeps its grant. A
//!   timeout of zero tries once and never queues.
//! - A grant is a holding of the session: the session neither closes nor opens anew while it
//!   exists, and a lost session ends it ([`SemaphoreGrant::ended`]). Its
//!   [`token`](SemaphoreGrant::token) rises with every grant of the semaphore.
//! - [`watch`](Coordination::watch) gives snapshots of a semaphore as its data or owners change;
//!   a reader that is slower than the changes skips intermediate snapshots but always gets the
//!   latest one.
//!
//! [`Semaphore::cancel_waiter_timeout`]: vvm_core::Semaphore::cancel_waiter_timeout
//!
//! ```
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! use std::time::Duration;
//! use vvm_adapters::MemoryStore;
//! use vvm_core::{Incarnation, LeaseConfig};
//! use vvm_runtime::{AcquireOptions, Coordination, KillerThread, LeaseValue, RecordingKiller};
//! use vvm_runtime::{SessionHandle, WatchKind};
//!
//! let store = MemoryStore::new();
//! let killer = KillerThread::new(RecordingKiller::new());
//! let value = LeaseValue::new("10.0.0.1:7000", Incarnation(1));
//! let session = SessionHandle::open(store, LeaseConfig::default(), value, &killer).await?;
//! let coordination = Coordination::new(session);
//!
//! coordination.create("config", 1, b"v1".to_vec()).await?;
//! let mut watch = coordination.watch("config", WatchKind::DATA)?;
//! assert_eq!(watch.next().await?.data, b"v1");
//! coordination.update_data("config", b"v2".to_vec()).await?;
//! assert_eq!(watch.next().await?.data, b"v2");
//!
//! let options = AcquireOptions::new(1).data(b"10.0.0.1:7000").timeout(Duration::ZERO);
//! let grant = coordination.acquire("config", options).await?.expect("free");
//! assert_eq!(coordination.describe("config").await?.owners[0].data, b"10.0.0.1:7000");
//! assert!(grant.release().await?);
//! coordination.delete("config", false).await?;
//! # Ok(()) }
//! ```

mod error;
mod grant;
mod serve;
mod watch;

use std::sync::Arc;
use std::time::Duration;

use vvm_core::semaphore::{Description, Outcome, SemaphoreName, Status};

use crate::semaphore_names::{NamesPage, SemaphoreNames};
use crate::semaphore_store::{Applied, SemaphoreRequest, SemaphoreStore};
use crate::session::{SessionError, SessionHandle, SessionStatus};

pub use error::CoordinationError;
pub use grant::{GrantEnd, SemaphoreGrant};
pub use serve::{ServeError, ServeTimeouts};
pub use watch::{Watch, WatchKind};

/// The least pause before looking again at a party's expiry: a store's time left is never
/// taken as a reason to spin.
const EXPIRY_LOOK_MIN: Duration = Duration::from_millis(1);

/// How an acquire asks: `count` units, the data the grant publishes, how long it may wait in
/// the queue, and whether a missing semaphore is made as an ephemeral one.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AcquireOptions {
    count: u64,
    data: Vec<u8>,
    timeout: Duration,
    ephemeral: bool,
}

impl AcquireOptions {
    /// `count` units, no data, waiting as long as it takes, on an existing semaphore.
    pub fn new(count: u64) -> Self {
        AcquireOptions {
            count,
            data: Vec::new(),
            timeout: Duration::MAX,
            ephemeral: false,
        }
    }

    /// What the grant publishes among the owners (an endpoint, a host name).
    pub fn data(mut self, data: impl Into<Vec<u8>>) -> Self {
        self.data = data.into();
        self
    }

    /// How long the request may wait in the queue; zero tries once and never queues.
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }

    /// A semaphore that does not exist is made by this acquire as an ephemeral one (limit
    /// `u64::MAX`, deleted when its last party leaves).
    pub fn ephemeral(mut self) -> Self {
        self.ephemeral = true;
        self
    }

    /// The timeout as the store keeps it: whole milliseconds, rounded up, so that a short
    /// positive timeout still queues.
    fn timeout_ms(&self) -> u64 {
        let ms = self.timeout.as_millis();
        let rounded = if self.timeout > Duration::from_millis(ms as u64) {
            ms + 1
        } else {
            ms
        };
        u64::try_from(rounded).unwrap_or(u64::MAX)
    }
}

/// What [`Coordination::set_limit`] did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LimitSet {
    /// The limit before the change (the same as the one asked when nothing changed).
    pub previous: u64,
    /// Waiters the raise granted.
    pub granted: usize,
}

/// What a [`Coordination`] and its grants and watches share.
struct Inner<S> {
    session: SessionHandle<S>,
    /// The reads each watched name's watches share.
    watches: watch::Watches,
}

/// Semaphores on one session. Cloning shares the session; so does another `Coordination` on
/// the same session: the store keeps one party per semaphore and session, and every handle of
/// the session sees the same names held or being acquired
/// ([`CoordinationError::AlreadyHeld`]).
pub struct Coordination<S> {
    inner: Arc<Inner<S>>,
}

impl<S> Clone for Coordination<S> {
    fn clone(&self) -> Self {
        Coordination {
            inner: Arc::clone(&self.inner),
        }
    }
}

impl<S> std::fmt::Debug for Coordination<S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Coordination")
            .field("session", &self.inner.session)
            .finish_non_exhaustive()
    }
}

impl<S: SemaphoreStore + Clone> Coordination<S> {
    /// Semaphores on `session`.
    pub fn new(session: SessionHandle<S>) -> Self {
        Coordination {
            inner: Arc::new(Inner {
                session,
                watches: watch::Watches::default(),
            }),
        }
    }

    /// The session.
    pub fn session(&self) -> &SessionHandle<S> {
        &self.inner.session
    }

    /// Creates the semaphore `name` of `limit` units with `data`.
    ///
    /// # Cancel safety
    ///
    /// One store transaction: dropping the future while it runs leaves it applied or not
    /// (as an answer lost to a timeout would); nothing else is left behind.
    pub async fn create(
        &self,
        name: &str,
        limit: u64,
        data: impl Into<Vec<u8>>,
    ) -> Result<(), CoordinationError> {
        let name = SemaphoreName::new(name)?;
        let data = data.into();
        self.inner
            .call(&name, SemaphoreRequest::Create { limit, data })
            .await?;
        Ok(())
    }

    /// Acquires `options.count` units of `name`: `Ok(Some(grant))` when granted (at once, or
    /// after waiting in the queue), `Ok(None)` when the timeout passed first (or, with a zero
    /// timeout, when it could not be granted at once). A request in the queue rides out what
    /// the session rides out: a look at the semaphore that fails in the store's trouble is made
    /// again while the session lives.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: dropping the future at any point — during its first store call too —
    /// leaves nothing held. Whatever the store may have queued or granted for it is withdrawn
    /// in the background, by a release numbered after the acquire (so it cannot end a later
    /// acquire's grant); until that is done, an acquire of the name by this session is refused
    /// ([`CoordinationError::AlreadyHeld`]).
    pub async fn acquire(
        &self,
        name: &str,
        options: AcquireOptions,
    ) -> Result<Option<SemaphoreGrant<S>>, CoordinationError> {
        let name = SemaphoreName::new(name)?;
        grant::acquire(&self.inner, name, options).await
    }

    /// Ends this session's hold or queued request on `name`, whatever acquired it; `Ok(true)`
    /// when there was one. A [`SemaphoreGrant`] of it then reports itself ended.
    ///
    /// # Cancel safety
    ///
    /// One store transaction: dropping the future while it runs leaves it applied or not
    /// (as an answer lost to a timeout would); nothing else is left behind.
    pub async fn release(&self, name: &str) -> Result<bool, CoordinationError> {
        let name = SemaphoreName::new(name)?;
        let applied = self.inner.call(&name, SemaphoreRequest::release()).await?;
        Ok(applied.outcome.is_some_and(|o| {
            matches!(o.status, Status::Released { .. } | Status::Withdrawn { .. })
        }))
    }

    /// Sets the semaphore's own data (no ownership needed); `Ok(true)` when it differed.
    ///
    /// # Cancel safety
    ///
    /// One store transaction: dropping the future while it runs leaves it applied or not
    /// (as an answer lost to a timeout would); nothing else is left behind.
    pub async fn update_data(
        &self,
        name: &str,
        data: impl Into<Vec<u8>>,
    ) -> Result<bool, CoordinationError> {
        let name = SemaphoreName::new(name)?;
        let data = data.into();
        let applied = self
            .inner
            .call(&name, SemaphoreRequest::UpdateData { data })
            .await?;
        Ok(applied.outcome.is_some_and(|o| o.changes.data))
    }

    /// Changes the limit of `name` in place, under its owners and waiters: a raise grants
    /// waiters from the head of the queue while they fit, as a release does (their acquires
    /// return their grants); a lowering goes down to the units in use at the lowest, and to the
    /// largest queued request. Returns the limit before and how many waiters were granted; the
    /// same limit changes nothing.
    ///
    /// Refused ([`CoordinationError::Refused`], nothing changed) below the units in use
    /// ([`LimitBelowUse`](vvm_core::semaphore::SemaphoreError::LimitBelowUse)) or a queued
    /// request ([`LimitBelowRequest`](vvm_core::semaphore::SemaphoreError::LimitBelowRequest)),
    /// for 0 ([`LimitZero`](vvm_core::semaphore::SemaphoreError::LimitZero)), for an ephemeral
    /// semaphore ([`EphemeralLimit`](vvm_core::semaphore::SemaphoreError::EphemeralLimit)) and
    /// for one being deleted
    /// ([`BeingDeleted`](vvm_core::semaphore::SemaphoreError::BeingDeleted));
    /// [`CoordinationError::NotFound`] when there is no such semaphore.
    ///
    /// # Cancel safety
    ///
    /// One store transaction: dropping the future while it runs leaves it applied or not
    /// (as an answer lost to a timeout would); nothing else is left behind.
    pub async fn set_limit(&self, name: &str, limit: u64) -> Result<LimitSet, CoordinationError> {
        let name = SemaphoreName::new(name)?;
        let applied = self
            .inner
            .call(&name, SemaphoreRequest::SetLimit { limit })
            .await?;
        match applied.outcome {
            Some(Outcome {
                status: Status::LimitSet { previous },
                granted,
                ..
            }) => Ok(LimitSet {
                previous,
                granted: granted.len(),
            }),
            // The store answers every applied limit change with its outcome.
            _ => Err(CoordinationError::NotFound(name)),
        }
    }

    /// Deletes `name`: refused while it has owners or waiters unless `force`, which ends them
    /// all (their acquires and grants end with [`CoordinationError::NotFound`] or
    /// [`GrantEnd::Ended`]). Forced while it has owners, it is *being deleted* until the last of
    /// them has released or its session ended: their units stay counted, and acquires and the
    /// creation of the name are refused
    /// ([`BeingDeleted`](vvm_core::semaphore::SemaphoreError::BeingDeleted)).
    ///
    /// # Cancel safety
    ///
    /// One store transaction: dropping the future while it runs leaves it applied or not
    /// (as an answer lost to a timeout would); nothing else is left behind.
    pub async fn delete(&self, name: &str, force: bool) -> Result<(), CoordinationError> {
        let name = SemaphoreName::new(name)?;
        self.inner
            .call(&name, SemaphoreRequest::Delete { force })
            .await?;
        Ok(())
    }

    /// A snapshot of `name`: data, units in use, limit, ephemeral flag, owners and waiters.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: it only reads.
    pub async fn describe(&self, name: &str) -> Result<Description, CoordinationError> {
        let name = SemaphoreName::new(name)?;
        let applied = self.inner.call(&name, SemaphoreRequest::Describe).await?;
        applied.description.ok_or(CoordinationError::NotFound(name))
    }

    /// One page of the names of the semaphores the store holds (created and not deleted),
    /// sorted by their bytes: the first page is [`NamesPage::first`], the next one
    /// [`NamesPage::next`]. One read under the store-call timeout; it needs no live session
    /// record, only a session that is not over. A semaphore whose last parties' sessions
    /// ended unseen is listed until the next operation on it removes them (an ephemeral one is
    /// then deleted).
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: it only reads.
    pub async fn semaphore_names(
        &self,
        page: &NamesPage,
    ) -> Result<SemaphoreNames, CoordinationError> {
        self.inner.check_session()?;
        let timeout = self.inner.session.lease().store_timeout();
        match tokio::time::timeout(timeout, self.inner.session.store().semaphore_names(page)).await
        {
            Ok(Ok(names)) => Ok(names),
            Ok(Err(error)) => Err(CoordinationError::Store(error)),
            Err(_) => Err(CoordinationError::TimedOut),
        }
    }

    /// Snapshots of `name` whenever what `kind` names changes; the first
    /// [`next`](Watch::next) is the state now.
    pub fn watch(&self, name: &str, kind: WatchKind) -> Result<Watch<S>, CoordinationError> {
        let name = SemaphoreName::new(name)?;
        Ok(Watch::new(Arc::clone(&self.inner), name, kind))
    }
}

impl<S: SemaphoreStore + Clone> Inner<S> {
    /// One store transaction under the store-call timeout, refused at once when the session is
    /// known to be over.
    async fn call(
        &self,
        name: &SemaphoreName,
        request: SemaphoreRequest,
    ) -> Result<Applied, CoordinationError> {
        self.check_session()?;
        let key = self.session.key();
        let timeout = self.session.lease().store_timeout();
        let call = self.session.store().semaphore(key, name, request);
        match tokio::time::timeout(timeout, call).await {
            Ok(Ok(applied)) => {
                if !applied.expired.is_empty() {
                    tracing::debug!(semaphore = %name, expired = applied.expired.len(), "parties of ended sessions removed");
                }
                Ok(applied)
            }
            Ok(Err(error)) => Err(match CoordinationError::from_store(error) {
                CoordinationError::SessionGone(key) => self
                    .session_over()
                    .unwrap_or(CoordinationError::SessionGone(key)),
                other => other,
            }),
            Err(_) => Err(CoordinationError::TimedOut),
        }
    }

    /// `Err` when the session is lost, closed or never opened.
    fn check_session(&self) -> Result<(), CoordinationError> {
        match self.session_over() {
            Some(error) => Err(error),
            None => Ok(()),
        }
    }

    fn session_over(&self) -> Option<CoordinationError> {
        let error = match self.session.status() {
            SessionStatus::Lost(reason) => SessionError::Lost(reason),
            SessionStatus::Closed => SessionError::Closed,
            SessionStatus::NotOpened(refusal) => SessionError::NotOpened(refusal),
            SessionStatus::Opening | SessionStatus::Open { .. } => return None,
        };
        Some(CoordinationError::Session(error))
    }
}

/// When to look again at the latest, given a store's `parties_expire_in`.
fn expiry_look(applied: &Applied) -> Option<tokio::time::Instant> {
    applied
        .parties_expire_in
        .and_then(|left| tokio::time::Instant::now().checked_add(left.max(EXPIRY_LOOK_MIN)))
}
