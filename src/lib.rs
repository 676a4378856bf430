//! # vvm
//!
//! Runs service work only while it holds leadership of one of `N` slots in a shared store, keeps
//! the lease renewed, ends its own process before the lease could pass to someone else, and shuts
//! down in a strict order: services, then the leadership monitor, then the release of the key.
//!
//! **Which one do I use?**
//!
//! | you want | use |
//! |---|---|
//! | services that run only while this process leads | [`Vvm`]: [`provide`](Vvm::provide) → [`launch`](Vvm::launch) → [`shutdown`](Vvm::shutdown) |
//! | slots held without services around them | [`Elections`] |
//! | counted semaphores, queues, owners' data, watches | [`Coordination`] on a [`SessionHandle`] |
//! | who leads, once or on every change | [`discovery::leaders`], [`observe`] |
//! | a store | [`adapters`]: `memory` (default), `sqlite`, `etcd`, `etcd-tls`, `postgres`, `foundationdb` features; `open` turns a URL into any of them |
//!
//! The root holds the application API only; each other item has one home: [`config`],
//! [`lifecycle`], [`services`], [`elections`], [`discovery`], [`session`], [`coordination`],
//! [`killer`], [`time`]; [`store`] is for those who write a store; `testing` (feature `testing`)
//! holds test aids that end nothing. The `cli` feature builds the `vvm` host binary. The README's
//! quick start, a complete program on the memory store, is compiled and run with the tests.
//!
//! ```
//! # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! use vvm::adapters::MemoryStore;
//! use vvm::{Services, Vvm, VvmConfig};
//!
//! // No services: the VVM only holds a slot.
//! let vvm = Vvm::provide(VvmConfig::builder("10.0.0.7:7000"), MemoryStore::new(), Services::new())?;
//! let stop = vvm.stop_handle();
//! let vvm = vvm.launch().await;
//! stop.stop(); // from anywhere, e.g. a signal handler
//! vvm.shutdown().await?; // services, monitor, then the release of the key
//! # Ok(()) }
//! ```
//!
//! **A store from a URL, for every API.** With the `open` feature, one call turns a URL
//! (`memory:`, `sqlite:PATH`, `etcd://HOST:PORT`, `fdb:`) into a store that a [`Vvm`],
//! [`Elections`] and [`Coordination`] all accept; clones share it:
//!
//! ```
//! # #[cfg(feature = "open")]
//! # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! use vvm::adapters::open::open;
//! use vvm::session::LeaseValue;
//! use vvm::{AcquireOptions, Coordination, Elections, KillerThread, LeaseConfig};
//! use vvm::{new_incarnation, Services, SessionHandle, Slot, Vvm, VvmConfig};
//!
//! let lease = LeaseConfig::default();
//! let store = open("memory:", &lease).await?; // or "sqlite:/var/lib/app/vvm.sqlite", "etcd://10.0.0.1:2379"
//! let killer = KillerThread::global(); // ends this process before a lost lease could pass on
//!
//! // Services that run only while this process leads slot 1.
//! let config = VvmConfig::builder("10.0.0.7:7000");
//! let vvm = Vvm::provide(config, store.clone(), Services::new())?.launch().await;
//!
//! // A slot held without services around it.
//! let elections = Elections::start(store.clone(), "10.0.0.7:7000", lease, &killer)?;
//! let token = elections.acquire(Slot(2)).await?;
//! assert_eq!(token.slot, Slot(2));
//!
//! // Units of a counted semaphore, held on a session.
//! let me = LeaseValue::new("10.0.0.7:7000", new_incarnation());
//! let session = SessionHandle::open(store.clone(), lease, me, &killer).await?;
//! let coordination = Coordination::new(session);
//! coordination.create("workers", 2, Vec::new()).await?;
//! let grant = coordination.acquire("workers", AcquireOptions::new(1)).await?;
//! assert!(grant.is_some(), "1 of 2 units");
//!
//! // Everything given back: the process may live on.
//! grant.expect("granted").release().await?;
//! coordination.session().close().await?;
//! elections.release_all().await?;
//! vvm.shutdown().await?;
//! # Ok(()) }
//! # #[cfg(not(feature = "open"))]
//! # fn main() {}
//! ```
#![forbid(unsafe_code)]
#![deny(missing_debug_implementations)]
#![deny(missing_docs)]

// The application API: what a program that runs work under leadership names. Everything else
// has one home in a module below; nothing is reachable by two paths.
pub use vvm_core::{FencingToken, LeaseConfig, LossReason, Phase, Problem, Slot, VvmConfig};
// The function only: `vvm_runtime::observe` names its module too.
pub use vvm_runtime::observe::observe;
pub use vvm_runtime::{
    new_incarnation, AcquireOptions, Coordination, Elections, KillerThread, Launched, Observer,
    SemaphoreGrant, Service, ServiceContext, ServiceError, Services, SessionHandle, StopHandle,
    Stream, Tenure, Vvm, VvmError, Watch,
};

/// Configuration beyond [`VvmConfig`] and [`LeaseConfig`]: the builder, its errors and bounds.
pub mod config {
    pub use vvm_core::{
        validate_address, ConfigError, VvmConfigBuilder, ACQUISITION_DEFAULT, ACQUISITION_FOREVER,
        ACQUISITION_MAX, ADDRESS_MAX_BYTES, LEASE_DEFAULT, LEASE_MAX, LEASE_MIN,
        RENEWAL_CALLS_PER_LEASE_MAX, RETRY_DOUBLINGS_MAX, ROUND_INTERVAL_DEFAULT, SLOTS_MAX,
    };
    pub use vvm_runtime::IntoVvmConfig;
}

/// A [`Vvm`]'s states and what it reports: the typestate markers, its snapshot and
/// subscription, why an acquisition was refused, the parts of a fencing token.
pub mod lifecycle {
    pub use vvm_core::{FencingTokenError, Incarnation, Revision};
    pub use vvm_runtime::{
        ProblemFuture, Provided, RefusalReason, SlotRefusal, VvmSnapshot, VvmState,
        VvmSubscription, FAILING_PAUSE_ROUNDS_MAX,
    };
}

/// What a [`Service`] reads from its context, and the services' bounds.
pub mod services {
    pub use vvm_runtime::services::{
        KillDeadlines, LossSignal, ShutdownSignal, SERVICES_MAX, START_TIMEOUT_DEFAULT,
        STOP_TIMEOUT_DEFAULT,
    };
    pub use vvm_runtime::ServicesError;
}

/// Slots held without services around them: [`Elections`]' tenures, errors
/// and bounds.
pub mod elections {
    pub use vvm_runtime::{ElectionsError, Tenures, ELECTIONS_SLOTS_MAX};
}

/// Who holds which slot: one look ([`leaders`](discovery::leaders)) or every change ([`observe`]).
pub mod discovery {
    pub use vvm_runtime::discovery::{leaders, SlotHolder};
    pub use vvm_runtime::observe::{
        Departure, Holder, HolderChange, ObserveError, ObserveOptions, DEPARTURE_LEEWAY, RESYNC_MIN,
    };
}

/// Sessions: one liveness for many holdings ([`SessionHandle`]).
pub mod session {
    pub use vvm_core::{SessionId, SessionKey, HOLDINGS_MAX};
    pub use vvm_runtime::{Holding, LeaseValue, SessionError, SessionStatus, ACQUIRE_SENDS_MAX};
}

/// Counted semaphores on sessions ([`Coordination`]): grants, watches,
/// serving, names, and the semaphores' vocabulary as every store runs it.
pub mod coordination {
    pub use vvm_core::semaphore::{
        Changes, DecodeError, Description, Generation, Grant, NameError, OrderId, Outcome, Owner,
        RequestId, Semaphore, SemaphoreError, SemaphoreName, Status, Violation, Waiter,
        DATA_BYTES_MAX, ENCODED_BYTES_MAX, EPHEMERAL_LIMIT, NAME_BYTES_MAX, PARTIES_MAX,
        PARTY_DATA_BYTES_MAX,
    };
    pub use vvm_runtime::{
        CoordinationError, GrantEnd, LimitSet, NamesPage, NamesPageError, SemaphoreNames,
        ServeError, ServeTimeouts, UnreadableName, WatchKind, NAMES_PAGE_MAX,
    };
}

/// The killer that ends the process at a kill deadline ([`KillerThread`]
/// is the handle every API takes).
pub mod killer {
    pub use vvm_runtime::killer::{
        write_kill_message, ExitKiller, KillReport, Killer, KillerEntry, KILL_EXIT_CODE,
        KILL_MESSAGE, PASSED_BATCH_MAX, RECORDS_MAX, WAIT_ARMED_MAX,
    };
}

/// Time as vvm reads it: the boot clock (it counts suspend) and its sources.
pub mod time {
    pub use vvm_core::Instant;
    pub use vvm_runtime::clock::{
        boot_instant, instant_from_std, origin, Clock, HostSuspend, SuspendSource, TimeSource,
    };
}

/// For store authors: the contracts a store implements ([`LeaseStore`](store::LeaseStore),
/// [`SessionStore`](store::SessionStore), [`SemaphoreStore`](store::SemaphoreStore)), their
/// records and errors, and the helpers the built-in stores share. The crate `vvm-conformance`
/// holds the suite every built-in store passes, one test per case for a store written anywhere:
/// implement its `Harness` and call one macro per part (`ttl_cases!`, `session_cases!`, …).
pub mod store {
    pub use vvm_runtime::semaphore_store::{transact, undecodable, Write};
    pub use vvm_runtime::store::VALUE_MAX_BYTES;
    pub use vvm_runtime::{
        jittered_backoff, next_request_id, Acquired, Applied, CallTimedOut, Cause, ErrorChain,
        Inserted, Lease, LeaseStore, SemaphoreChange, SemaphoreRequest, SemaphoreStore,
        SemaphoreStoreError, SessionRecord, SessionStore, SlotChange, StoreError, ValueError,
        ACQUIRE_BATCH_MAX,
    };
}

/// Test aids (feature `testing`): a killer that records instead of killing, manual time for
/// the killer and for suspend. Never for production: they end nothing.
#[cfg(feature = "testing")]
pub mod testing {
    pub use vvm_runtime::{ManualKillerTime, ManualSuspend, RecordingKiller};
}

/// The runtime's metrics (feature `metrics`): names and the calls that describe them.
#[cfg(feature = "metrics")]
pub use vvm_runtime::metrics;

/// The lease stores, each behind the feature of its name (`memory`, the default; `sqlite`,
/// `etcd`, `etcd-tls`, `foundationdb`, `postgres`), store URLs (`url`) and opening the store a URL names
/// (`open`).
#[doc(inline)]
pub use vvm_adapters as adapters;

/// The README's examples, compiled and run by `cargo test --doc`.
#[doc = include_str!("../README.md")]
#[cfg(doctest)]
pub struct ReadmeDoctests;
