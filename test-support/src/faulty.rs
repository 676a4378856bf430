//! A memory store whose every call first asks a [`Hook`] what goes wrong with it: the session
//! tests count, fail, delay or randomise calls through it.

use std::time::Duration;

use vvm_adapters::MemoryStore;
use vvm_core::semaphore::SemaphoreName;
use vvm_core::{Revision, SessionKey, Slot};
use vvm_runtime::{
    Acquired, Applied, Lease, LeaseStore, LeaseValue, SemaphoreChange, SemaphoreRequest,
    SemaphoreStore, SemaphoreStoreError, SessionRecord, SessionStore, SlotChange, StoreError,
};

/// Which call the hook is asked about.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Call {
    /// `LeaseStore::insert_if_not_exists`.
    Insert,
    /// `LeaseStore::compare_and_swap`.
    Swap,
    /// `LeaseStore::compare_and_delete`.
    Delete,
    /// `LeaseStore::get`.
    Get,
    /// `SessionStore::create_session`.
    CreateSession,
    /// `SessionStore::keep_alive`.
    KeepAlive,
    /// `SessionStore::delete_session`.
    DeleteSession,
    /// `SessionStore::get_session`.
    GetSession,
    /// `SessionStore::acquire`.
    Acquire,
    /// A semaphore transaction.
    Semaphore,
}

/// What happens to one call.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fault {
    /// The call runs normally.
    None,
    /// Fails; nothing is applied.
    Fail,
    /// Applied, then reported as unknown.
    UnknownApplied,
    /// Not applied, reported as unknown.
    UnknownLost,
    /// Applied after this long.
    Delay(Duration),
    /// Applied at once, answered after this long: a caller that gives up meanwhile never
    /// learns what was written.
    LateAnswer(Duration),
}

/// Decides the fate of each call.
pub trait Hook: Clone + Send + Sync + 'static {
    /// What goes wrong with this call.
    fn fault(&self, call: Call) -> Fault;
}

/// The failure a [`Fault`] reports.
#[derive(Debug)]
pub struct Injected;

impl std::fmt::Display for Injected {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("failure injected")
    }
}

impl std::error::Error for Injected {}

/// The memory store behind a [`Hook`].
#[derive(Clone, Default)]
pub struct Faulty<H> {
    /// The store that serves the calls the hook lets through.
    pub store: MemoryStore,
    /// Decides what happens to each call.
    pub hook: H,
}

impl<H: Hook> Faulty<H> {
    /// `run` as the hook decides; a fault is a [`StoreError`], in whatever error the call
    /// returns.
    async fn run<T, E: From<StoreError>>(
        &self,
        call: Call,
        run: impl std::future::Future<Output = Result<T, E>>,
    ) -> Result<T, E> {
        match self.hook.fault(call) {
            Fault::None => run.await,
            Fault::Fail => Err(StoreError::failed(Injected).into()),
            Fault::UnknownLost => Err(StoreError::unknown(Injected).into()),
            Fault::UnknownApplied => {
                run.await?;
                Err(StoreError::unknown(Injected).into())
            }
            Fault::Delay(delay) => {
                tokio::time::sleep(delay).await;
                run.await
            }
            Fault::LateAnswer(delay) => {
                let answer = run.await;
                tokio::time::sleep(delay).await;
                answer
            }
        }
    }
}

impl<H: Hook> LeaseStore for Faulty<H> {
    async fn insert_if_not_exists(
        &self,
        key: Slot,
        value: &LeaseValue,
        ttl: Duration,
    ) -> Result<Option<Revision>, StoreError> {
        let run = self.store.insert_if_not_exists(key, value, ttl);
        self.run(Call::Insert, run).await
    }

    async fn compare_and_swap(
        &self,
        key: Slot,
        expected: &Lease,
        new_value: &LeaseValue,
        ttl: Duration,
    ) -> Result<Option<Revision>, StoreError> {
        let run = self.store.compare_and_swap(key, expected, new_value, ttl);
        self.run(Call::Swap, run).await
    }

    async fn compare_and_delete(&self, key: Slot, expected: &Lease) -> Result<bool, StoreError> {
        let run = self.store.compare_and_delete(key, expected);
        self.run(Call::Delete, run).await
    }

    async fn get(&self, key: Slot) -> Result<Option<Lease>, StoreError> {
        self.run(Call::Get, self.store.get(key)).await
    }

    // The feed is no call: it passes through, so that a VVM on this store watches its own
    // record and wakes at a release as it would on the memory store itself.
    fn changed(&self, keys: &[Slot]) -> SlotChange {
        self.store.changed(keys)
    }

    fn has_change_feed(&self) -> bool {
        self.store.has_change_feed()
    }
}

impl<H: Hook> SessionStore for Faulty<H> {
    async fn create_session(
        &self,
        key: SessionKey,
        value: &LeaseValue,
        ttl: Duration,
    ) -> Result<Option<Revision>, StoreError> {
        let run = self.store.create_session(key, value, ttl);
        self.run(Call::CreateSession, run).await
    }

    async fn keep_alive(
        &self,
        key: SessionKey,
        expected: Revision,
        ttl: Duration,
    ) -> Result<Option<Revision>, StoreError> {
        let run = self.store.keep_alive(key, expected, ttl);
        self.run(Call::KeepAlive, run).await
    }

    async fn delete_session(
        &self,
        key: SessionKey,
        expected: Revision,
    ) -> Result<bool, StoreError> {
        let run = self.store.delete_session(key, expected);
        self.run(Call::DeleteSession, run).await
    }

    async fn get_session(&self, key: SessionKey) -> Result<Option<SessionRecord>, StoreError> {
        self.run(Call::GetSession, self.store.get_session(key))
            .await
    }

    async fn acquire(&self, slot: Slot, key: SessionKey) -> Result<Acquired, StoreError> {
        self.run(Call::Acquire, self.store.acquire(slot, key)).await
    }
}

impl<H: Hook> SemaphoreStore for Faulty<H> {
    async fn semaphore(
        &self,
        session: SessionKey,
        name: &SemaphoreName,
        request: SemaphoreRequest,
    ) -> Result<Applied, SemaphoreStoreError> {
        let run = self.store.semaphore(session, name, request);
        self.run(Call::Semaphore, run).await
    }

    fn semaphore_changed(&self, name: &SemaphoreName) -> SemaphoreChange {
        self.store.semaphore_changed(name)
    }

    /// Passed on as it is: no test injects faults into a listing.
    async fn semaphore_names(
        &self,
        page: &vvm_runtime::NamesPage,
    ) -> Result<vvm_runtime::SemaphoreNames, StoreError> {
        self.store.semaphore_names(page).await
    }
}
