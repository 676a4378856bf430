//! Acquiring: the store's answer at once, or the wait in the queue for the grant; and the grant
//! itself, a holding of the session.

use std::sync::Arc;

use vvm_core::semaphore::{Description, Generation, OrderId, RequestId, SemaphoreName, Status};
use vvm_core::{FencingToken, HoldingId, LossReason};

use super::{expiry_look, AcquireOptions, CoordinationError, Inner};
use crate::semaphore_store::{
    next_request_id, Applied, SemaphoreChange, SemaphoreRequest, SemaphoreStore,
};
use crate::session::SessionError;

/// How a grant ended, as [`SemaphoreGrant::ended`] reports it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum GrantEnd {
    /// The session was lost (with why) or closed (`None`): nothing may act under the grant.
    SessionOver(Option<LossReason>),
    /// The grant is no longer held in the store: a forced delete (its units stay counted
    /// until this handle releases them or the session ends), a release by name, the
    /// session's expiry seen by another party, or the semaphore's or the session's record
    /// removed from outside.
    Ended,
}

/// The name claimed and the holding attached for one acquire; given back unless kept.
struct Claim<'a, S: SemaphoreStore + Clone> {
    inner: &'a Arc<Inner<S>>,
    name: SemaphoreName,
    holding: Option<HoldingId>,
    /// A request may be queued in the store: withdraw it when the acquire ends without a grant.
    queued: bool,
    kept: bool,
}

impl<S: SemaphoreStore + Clone> Drop for Claim<'_, S> {
    fn drop(&mut self) {
        if self.kept {
            return;
        }
        if self.queued {
            withdraw(self.inner, &self.name, self.holding);
        } else {
            give_back(self.inner, &self.name, self.holding);
        }
    }
}

/// Detaches `holding` and frees the name for the session's next acquire of it.
fn give_back<S>(inner: &Inner<S>, name: &SemaphoreName, holding: Option<HoldingId>) {
    if let Some(holding) = holding {
        inner.session.detach(holding);
    }
    inner.session.unclaim_semaphore(name);
}

/// Releases the session's request on `name` in the background (an acquire dropped while
/// waiting, a grant dropped without a release), then gives back the name and the holding: a
/// later acquire of the name cannot be released by it. A release that fails (a store blip) is
/// tried again, after pauses growing from [`RETRY_PAUSE_FIRST`] to [`RETRY_PAUSE_MAX`], until
/// it is done or the session ends (which ends the request too). Without a runtime the
/// request is left to end with the session.
pub(super) fn withdraw<S: SemaphoreStore + Clone>(
    inner: &Arc<Inner<S>>,
    name: &SemaphoreName,
    holding: Option<HoldingId>,
) {
    let Ok(runtime) = tokio::runtime::Handle::try_current() else {
        give_back(inner, name, holding);
        return;
    };
    let (inner, name) = (Arc::clone(inner), name.clone());
    runtime.spawn(async move {
        // One release for every try: numbered now, it ends the abandoned request and nothing
        // later, and the store applies it once however often it is sent.
        let release = SemaphoreRequest::release();
        let mut pauses = crate::jittered_backoff(RETRY_PAUSE_FIRST, RETRY_PAUSE_MAX);
        loop {
            let error = match inner.call(&name, release.clone()).await {
                Ok(_) => break,
                Err(error) => error,
            };
            if !transient(&error) {
                // The session is over (its end ends the request) or the semaphore is gone.
                tracing::debug!(semaphore = %name, error = %crate::ErrorChain(&error), "abandoned request not released; nothing is left to release");
                break;
            }
            tracing::debug!(semaphore = %name, error = %crate::ErrorChain(&error), "releasing an abandoned request failed; trying again");
            let pause = pauses.next().unwrap_or(RETRY_PAUSE_MAX);
            tokio::select! {
                () = tokio::time::sleep(pause) => {}
                _ = inner.session.lost() => break,
            }
        }
        give_back(&inner, &name, holding);
    });
}

/// The first pause before a call that failed in a store's trouble (a withdrawal, a queued
/// acquire's look) is made again.
const RETRY_PAUSE_FIRST: std::time::Duration = std::time::Duration::from_millis(20);
/// The longest: through an outage such a call is made once a second at most.
const RETRY_PAUSE_MAX: std::time::Duration = std::time::Duration::from_secs(1);

/// Whether a call that failed with `error` failed in the store's trouble (the store failed or
/// did not answer), which the session may ride out: then the call is worth making again while
/// the session lives. Everything else (the session over, a semaphore gone, its state
/// unreadable) is final.
fn transient(error: &CoordinationError) -> bool {
    matches!(
        error,
        CoordinationError::Store(_) | CoordinationError::TimedOut
    )
}

/// The owner entry of our session in `description`, if it owns. An owner of a semaphore
/// being deleted owns nothing: its grant ended with the forced delete, and its entry only keeps
/// its units counted until it leaves.
fn owned(
    inner_key: vvm_core::SessionKey,
    description: &Description,
) -> Option<(OrderId, Generation)> {
    if description.deleting {
        return None;
    }
    description
        .owners
        .iter()
        .find(|o| o.session == inner_key)
        .map(|o| (o.order_id, o.token))
}

fn waits(key: vvm_core::SessionKey, description: &Description) -> bool {
    description.waiters.iter().any(|w| w.session == key)
}

pub(super) async fn acquire<S: SemaphoreStore + Clone>(
    inner: &Arc<Inner<S>>,
    name: SemaphoreName,
    options: AcquireOptions,
) -> Result<Option<SemaphoreGrant<S>>, CoordinationError> {
    if !inner.session.claim_semaphore(&name) {
        return Err(CoordinationError::AlreadyHeld(name));
    }
    let mut claim = Claim {
        inner,
        name: name.clone(),
        holding: None,
        queued: false,
        kept: false,
    };
    claim.holding = Some(
        inner
            .session
            .attach()
            .await
            .map_err(CoordinationError::Session)?,
    );
    let store = inner.session.store();
    let deadline = tokio::time::Instant::now().checked_add(options.timeout);
    // Subscribed before the acquire: a grant right after it is not missed.
    let mut change: SemaphoreChange = store.semaphore_changed(&name);
    let acquire_request = next_request_id();
    let request = SemaphoreRequest::Acquire {
        request: acquire_request,
        count: options.count,
        data: options.data.clone(),
        timeout_ms: options.timeout_ms(),
        ephemeral: options.ephemeral,
    };
    // Marked before the call: a caller that gives up while it runs (a `timeout`, a
    // `select!`) drops the claim, which then withdraws whatever the store may have queued or
    // granted. A release cannot reach a later request.
    claim.queued = true;
    let applied = match inner.call(&name, request).await {
        Ok(applied) => applied,
        Err(error) => {
            // An acquire whose outcome is unknown may have been written (granted or queued):
            // the claim withdraws it with a release numbered after it, so that it holds no
            // units until the session ends.
            claim.queued = matches!(
                error,
                CoordinationError::Store(crate::StoreError::Unknown { .. })
                    | CoordinationError::TimedOut
            );
            return Err(error);
        }
    };
    let mut look = expiry_look(&applied);
    let status = applied.outcome.map(|o| o.status);
    let granted = match status {
        Some(Status::Granted { order_id, token }) => Some((order_id, token)),
        Some(Status::NotGranted) => {
            claim.queued = false;
            return Ok(None);
        }
        Some(Status::Queued { .. }) => None,
        // Not an acquire's status: the store broke the contract; nothing is held.
        _ => return Ok(None),
    };
    let (order_id, token) = match granted {
        Some(granted) => granted,
        None => {
            let waited = wait(
                inner,
                &name,
                acquire_request,
                deadline,
                &mut change,
                &mut look,
            )
            .await;
            match waited {
                Ok(Some(granted)) => granted,
                Ok(None) => {
                    claim.queued = false;
                    return Ok(None);
                }
                // The claim withdraws whatever may still be queued.
                Err(error) => return Err(error),
            }
        }
    };
    claim.queued = false;
    claim.kept = true;
    let holding = claim.holding.unwrap_or(HoldingId(0));
    let grant = SemaphoreGrant {
        inner: Arc::clone(inner),
        name,
        order_id,
        token,
        timeout_ms: options.timeout_ms(),
        holding,
        done: false,
    };
    tracing::debug!(
        semaphore = %grant.name,
        order_id = order_id.0,
        fencing_token = %grant.token(),
        "semaphore granted"
    );
    Ok(Some(grant))
}

/// Waits in the queue: woken by the feed, by the soonest expiry of another party, by the
/// session's end or by the timeout. `Ok(None)`: the timeout passed and the request left the
/// queue. `request`: the acquire that queued. A look that fails in the store's trouble is made
/// again (after pauses growing from [`RETRY_PAUSE_FIRST`] to [`RETRY_PAUSE_MAX`]) while the
/// session lives and the timeout has not passed: the request stays queued through what the
/// session rides out. A timeout's withdrawal that fails is answered with the store's error.
async fn wait<S: SemaphoreStore + Clone>(
    inner: &Arc<Inner<S>>,
    name: &SemaphoreName,
    request: RequestId,
    deadline: Option<tokio::time::Instant>,
    change: &mut SemaphoreChange,
    look: &mut Option<tokio::time::Instant>,
) -> Result<Option<(OrderId, Generation)>, CoordinationError> {
    let store = inner.session.store();
    let key = inner.session.key();
    let mut pauses = crate::jittered_backoff(RETRY_PAUSE_FIRST, RETRY_PAUSE_MAX);
    // When to look again after a look that failed: until then the feed and the party's
    // expiry wait too, so that a store failing at once is not asked in a loop.
    let mut retry: Option<tokio::time::Instant> = None;
    loop {
        let wake = match retry {
            Some(at) => [Some(at), deadline].into_iter().flatten().min(),
            None => [*look, deadline].into_iter().flatten().min(),
        };
        let timer = async {
            match wake {
                Some(at) => tokio::time::sleep_until(at).await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            () = change.as_mut() => {}
            () = timer => {}
            _ = inner.session.lost() => {
                inner.check_session()?;
                return Err(CoordinationError::Session(SessionError::Closed));
            }
        }
        let timed_out = deadline.is_some_and(|at| tokio::time::Instant::now() >= at);
        *change = store.semaphore_changed(name);
        let call = if timed_out {
            SemaphoreRequest::CancelWaiterTimeout { request }
        } else {
            SemaphoreRequest::Describe
        };
        let applied: Applied = match inner.call(name, call).await {
            Ok(applied) => applied,
            // At the timeout the caller is answered: the claim withdraws the request in the
            // background, as it does after any error.
            Err(error) if transient(&error) && !timed_out => {
                tracing::debug!(semaphore = %name, error = %crate::ErrorChain(&error), "a queued acquire's look failed; it stays queued and looks again");
                let pause = pauses.next().unwrap_or(RETRY_PAUSE_MAX);
                retry = tokio::time::Instant::now().checked_add(pause);
                continue;
            }
            Err(error) => return Err(error),
        };
        retry = None;
        pauses = crate::jittered_backoff(RETRY_PAUSE_FIRST, RETRY_PAUSE_MAX);
        *look = expiry_look(&applied);
        let Some(description) = applied.description.filter(|d| !d.deleting) else {
            // Deleted, or being deleted (which ended every queued request).
            return Err(CoordinationError::NotFound(name.clone()));
        };
        if let Some(granted) = owned(key, &description) {
            // Granted, also when the timeout came after the grant.
            return Ok(Some(granted));
        }
        if timed_out {
            return Ok(None);
        }
        if !waits(key, &description) {
            // Ended by someone else: a forced delete (and a new semaphore), or a release by
            // name through another handle of the session.
            return Err(CoordinationError::GrantEnded(name.clone()));
        }
    }
}

/// Units of a semaphore held by the session: a holding of it, so the session neither closes
/// nor opens anew while the grant exists. Release it with [`release`](Self::release); dropping
/// it releases it in the background (or, without a runtime, leaves the hold to end with the
/// session).
pub struct SemaphoreGrant<S: SemaphoreStore + Clone> {
    pub(super) inner: Arc<Inner<S>>,
    pub(super) name: SemaphoreName,
    order_id: OrderId,
    pub(super) token: Generation,
    timeout_ms: u64,
    pub(super) holding: HoldingId,
    /// Released, or left on purpose: the drop does nothing more.
    pub(super) done: bool,
}

impl<S: SemaphoreStore + Clone> std::fmt::Debug for SemaphoreGrant<S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SemaphoreGrant")
            .field("name", &self.name)
            .field("order_id", &self.order_id)
            .field("token", &self.token)
            .finish_non_exhaustive()
    }
}

impl<S: SemaphoreStore + Clone> SemaphoreGrant<S> {
    /// The semaphore.
    pub fn name(&self) -> &SemaphoreName {
        &self.name
    }

    /// The grant's place in the semaphore's order of arrival.
    pub fn order_id(&self) -> OrderId {
        self.order_id
    }

    /// The key of the session that holds the grant: its party in the semaphore.
    pub fn session(&self) -> vvm_core::SessionKey {
        self.inner.session.key()
    }

    /// The fencing token: slot 0, its revision the generation of this grant, above every
    /// earlier grant's of the semaphore. Pass it along with writes so that a resource can
    /// refuse a former owner's.
    pub fn token(&self) -> FencingToken {
        self.token.fencing_token()
    }

    /// Lowers the count held or changes the data published, in place: the order id and the
    /// token stay. Raising the count is refused (it would jump the queue).
    ///
    /// # Cancel safety
    ///
    /// Dropping the future leaves the replace applied or not; the grant stays this grant
    /// either way, and is released as usual.
    pub async fn replace(
        &self,
        count: u64,
        data: impl Into<Vec<u8>>,
    ) -> Result<(), CoordinationError> {
        let request = SemaphoreRequest::Acquire {
            request: next_request_id(),
            count,
            data: data.into(),
            timeout_ms: self.timeout_ms,
            ephemeral: false,
        };
        let applied = self.inner.call(&self.name, request).await?;
        match applied.outcome.map(|o| o.status) {
            Some(Status::Granted { order_id, .. }) if order_id == self.order_id => Ok(()),
            // Our hold had ended: the acquire made a new request, which is not this grant.
            _ => {
                let _ = self
                    .inner
                    .call(&self.name, SemaphoreRequest::release())
                    .await;
                Err(CoordinationError::GrantEnded(self.name.clone()))
            }
        }
    }

    /// Resolves when the grant ends without a release of this handle: the session is lost
    /// or closed, or the grant is gone from the store (a forced delete, the session's expiry, the
    /// semaphore's or the session's record removed from outside).
    /// After a forced delete the grant's units stay counted until it is released (or the session
    /// ends), so that whatever still runs under it stays within the limit.
    /// Services acting under the grant must stop then.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: it only reads; call it again to go on waiting.
    pub async fn ended(&self) -> GrantEnd {
        let store = self.inner.session.store();
        let key = self.inner.session.key();
        loop {
            let mut change = store.semaphore_changed(&self.name);
            let applied = self
                .inner
                .call(&self.name, SemaphoreRequest::Describe)
                .await;
            let look = match &applied {
                Ok(applied) => {
                    let ours = applied
                        .description
                        .as_ref()
                        .and_then(|d| owned(key, d))
                        .is_some_and(|(order_id, _)| order_id == self.order_id);
                    if !ours {
                        return GrantEnd::Ended;
                    }
                    expiry_look(applied)
                }
                Err(CoordinationError::NotFound(_)) => return GrantEnd::Ended,
                // The store says our session's record is not live while the session itself
                // knows of no loss: removed from outside (`etcdctl lease revoke` of its lease,
                // `etcdctl del --prefix`, a `DELETE` in the file). Every party may take the
                // units from now on, and on etcd a lease whose keys alone were deleted would
                // keep the session alive for ever: the grant ends at once.
                Err(CoordinationError::SessionGone(_)) => return GrantEnd::Ended,
                Err(CoordinationError::Session(_)) => {
                    return GrantEnd::SessionOver(self.inner.session.lost().await);
                }
                // A failed look: try again at the next change or a store-call timeout later.
                Err(_) => tokio::time::Instant::now()
                    .checked_add(self.inner.session.lease().store_timeout()),
            };
            let timer = async {
                match look {
                    Some(at) => tokio::time::sleep_until(at).await,
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                () = change.as_mut() => {}
                () = timer => {}
                reason = self.inner.session.lost() => return GrantEnd::SessionOver(reason),
            }
        }
    }

    /// Releases the grant: `Ok(true)` when it was still held. A release that failed or
    /// whose outcome is unknown is answered as such and then tried again in the background
    /// until it is done or the session ends, as a dropped grant's is; the grant is detached
    /// from the session once the release is done.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: dropping the future releases the grant in the background, as dropping the
    /// grant does.
    pub async fn release(mut self) -> Result<bool, CoordinationError> {
        self.release_in_place().await
    }

    /// [`release`](Self::release) of a grant owned by something else: marked done once the
    /// store applied it; else the grant's drop releases it.
    pub(super) async fn release_in_place(&mut self) -> Result<bool, CoordinationError> {
        // Not marked done before the answer: a release dropped or failed on the way leaves the
        // grant's drop to release it.
        let applied = self
            .inner
            .call(&self.name, SemaphoreRequest::release())
            .await?;
        self.done = true;
        self.detach();
        Ok(applied.outcome.is_some_and(
            |o| matches!(o.status, Status::Released { order_id } if order_id == self.order_id),
        ))
    }

    fn detach(&mut self) {
        give_back(&self.inner, &self.name, Some(self.holding));
    }
}

impl<S: SemaphoreStore + Clone> Drop for SemaphoreGrant<S> {
    fn drop(&mut self) {
        if !self.done {
            self.done = true;
            withdraw(&self.inner, &self.name, Some(self.holding));
        }
    }
}
