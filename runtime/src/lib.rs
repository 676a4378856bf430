//! # vvm-runtime: executes what the core decides
//!
//! The runtime feeds events into the pure machines of [`vvm_core`] and performs their effects:
//! store calls (each under its own timeout), timers, the killer thread and the services.
//!
//! - [`Vvm`]: the host's typestate handle. `Vvm::provide` → [`Vvm<Provided>`] → `launch` →
//!   [`Vvm<Launched>`] → `shutdown`, which returns the first problem as a [`VvmError`]. Dropping a
//!   launched VVM starts the same shutdown in the background (see [`Vvm`]).
//! - The driver: one task per VVM. It waits for the next timer, store reply, shutdown request or
//!   service report, hands it to `Lifecycle::handle` and executes the effects; store calls run
//!   under `LeaseConfig::store_timeout()` each, a timeout counting as an unknown outcome.
//! - [`killer`]: one OS thread that ends the process when a kill deadline passes; injectable
//!   ([`Killer`]) and, for paused-time tests, driven by a manual clock ([`KillerThread::manual`]).
//! - [`services`]: the [`Service`] trait; services start in order once leadership is held and
//!   stop in reverse order.
//! - [`Elections`]: slots held on one session without a VVM around them; [`leaders`]: who holds what;
//!   [`observe()`]: every change of who holds what, pushed by the store's change feed;
//!   [`Vvm::subscribe`]: a VVM's own state as it changes.
//! - [`Clock`]: tokio's clock from one process-wide origin plus the host's suspended time
//!   (`CLOCK_BOOTTIME` on Linux), so `tokio::time::pause()` drives all and a suspend ages leases.
//!
//! A service reports readiness, then works until it is asked to stop; the `vvm` crate's README
//! runs one end to end on the memory store.
//!
//! ```
//! use std::borrow::Cow;
//! use vvm_runtime::{Service, ServiceContext, ServiceError, Services};
//!
//! struct Worker;
//!
//! impl Service for Worker {
//!     fn name(&self) -> Cow<'static, str> {
//!         Cow::Borrowed("worker")
//!     }
//!
//!     async fn run(self, mut context: ServiceContext) -> Result<(), ServiceError> {
//!         context.ready();
//!         context.shutdown().requested().await;
//!         Ok(())
//!     }
//! }
//!
//! let services = Services::new().with(Worker).unwrap().with(Worker).unwrap();
//! assert_eq!(services.len(), 2); // started in this order, stopped in reverse
//! ```
#![forbid(unsafe_code)]
#![deny(missing_debug_implementations)]
#![deny(missing_docs)]

mod backoff;
mod cause;
pub mod clock;
pub mod discovery;
mod driver;
pub mod elections;
mod error;
mod executor;
pub mod killer;
#[cfg(feature = "metrics")]
pub mod metrics;
pub mod observe;
mod on_session;
mod pacing;
mod pipeline;
mod refusals;
mod semaphore;
pub mod semaphore_names;
pub mod semaphore_store;
pub mod services;
pub mod session;
pub mod session_store;
mod snapshot;
mod status;
pub mod store;
mod stream;
mod vvm;

pub use backoff::jittered_backoff;
pub use cause::{Cause, ErrorChain};
pub use clock::{Clock, HostSuspend, ManualSuspend, SuspendSource, TimeSource};
pub use discovery::{leaders, SlotHolder};
pub use elections::{Elections, Tenure, Tenures, ELECTIONS_SLOTS_MAX};
pub use error::{ElectionsError, RefusalReason, ServicesError, SlotRefusal, VvmError};
pub use killer::{
    ExitKiller, KillReport, Killer, KillerEntry, KillerThread, ManualKillerTime, RecordingKiller,
    KILL_EXIT_CODE,
};
pub use observe::{observe, HolderChange, ObserveError, ObserveOptions, Observer};
pub use pacing::FAILING_PAUSE_ROUNDS_MAX;
pub use semaphore::{
    AcquireOptions, Coordination, CoordinationError, GrantEnd, LimitSet, SemaphoreGrant,
    ServeError, ServeTimeouts, Watch, WatchKind,
};
pub use semaphore_names::{
    NamesPage, NamesPageError, SemaphoreNames, UnreadableName, NAMES_PAGE_MAX,
};
pub use semaphore_store::{
    next_request_id, Applied, SemaphoreChange, SemaphoreRequest, SemaphoreStore,
    SemaphoreStoreError,
};
pub use services::{
    KillDeadlines, LossSignal, Service, ServiceContext, ServiceError, Services, ShutdownSignal,
    SERVICES_MAX,
};
pub use session::{Holding, SessionError, SessionHandle, SessionStatus, ACQUIRE_SENDS_MAX};
pub use session_store::{Acquired, MarkLost, SessionRecord, SessionStore, ACQUIRE_BATCH_MAX};
pub use snapshot::{VvmSnapshot, VvmSubscription};
pub use store::{
    CallTimedOut, Inserted, Lease, LeaseStore, LeaseValue, SlotChange, StoreError, ValueError,
};
pub use stream::Stream;
pub use vvm::{
    new_incarnation, IntoVvmConfig, Launched, ProblemFuture, Provided, StopHandle, Vvm, VvmState,
};
