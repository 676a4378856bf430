//! Helpers shared by the tests of the workspace's crates (and the benchmarks), written once:
//!
//! - at the root of this crate, what the runtime's tests share: configurations, a killer that
//!   records on a clock the test moves, sessions, and services that record what happened to them;
//! - [`faulty`]: a memory store whose calls fail, hang or are delayed on demand;
//! - [`hooked`]: any store seen through hooks that count, hang or act on its calls;
//! - `etcd` (feature `etcd`): real etcd members and clusters on loopback;
//! - [`postgres`]: a real PostgreSQL server in a temporary directory.
//!
//! A dev-dependency only (`publish = false`): nothing here is for production code.
#![forbid(unsafe_code)]

#[cfg(feature = "etcd")]
pub mod etcd;
pub mod faulty;
pub mod hooked;
pub mod postgres;

use std::borrow::Cow;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::Notify;
use vvm_core::{Incarnation, LeaseConfig, VvmConfig};
use vvm_runtime::{
    clock::Clock, clock::TimeSource, Coordination, KillerThread, LeaseValue, ManualKillerTime,
    RecordingKiller, SemaphoreStore, Service, ServiceContext, ServiceError, SessionHandle,
    SessionStore,
};

/// The lease of every test VVM: renew every 5 s, retry after 1 s, store calls time out after
/// 0.5 s, kill deadline 16 s after a confirmed write.
pub const LEASE: Duration = Duration::from_secs(20);

/// A VVM of `address` for `slots` slots, with the lease [`LEASE`], acquisitions of 3 s in rounds
/// of 1 s.
pub fn config(address: &str, slots: u32) -> VvmConfig {
    VvmConfig::builder(address)
        .slots(slots)
        .lease(LEASE)
        .acquisition(Duration::from_secs(3))
        .round_interval(Duration::from_secs(1))
        .build()
        .expect("test configuration is valid")
}

/// A VVM that campaigns for one slot as long as a test may want (120 s), in rounds of 1 s.
pub fn campaign_config(address: &str) -> VvmConfig {
    VvmConfig::builder(address)
        .lease(LEASE)
        .acquisition(Duration::from_secs(120))
        .round_interval(Duration::from_secs(1))
        .build()
        .expect("test configuration is valid")
}

/// A killer that only records, on a clock the test moves.
pub struct TestKiller {
    /// The killer thread the VVMs and sessions arm.
    pub thread: KillerThread,
    /// The killer's clock.
    pub time: ManualKillerTime,
    /// What the killer would have killed.
    pub recorder: RecordingKiller,
}

impl TestKiller {
    /// A recording killer whose clock stands still until the test moves it.
    #[allow(clippy::new_without_default)]
    pub fn new() -> Self {
        let recorder = RecordingKiller::new();
        let (thread, time) = KillerThread::manual(recorder.clone());
        TestKiller {
            thread,
            time,
            recorder,
        }
    }

    /// Moves the killer's clock to the driver's present.
    pub fn catch_up(&self) {
        self.time.set(Clock.now());
    }
}

/// A session of the process `10.0.0.n:7000` (incarnation `n`) on `store`, with the lease
/// [`LEASE`] and its kill deadline on `killer`.
pub async fn open_session<S>(store: &S, n: u64, killer: &TestKiller) -> SessionHandle<S>
where
    S: SessionStore + Clone + Send + Sync + 'static,
{
    let value = LeaseValue::new(format!("10.0.0.{n}:7000"), Incarnation(n));
    let lease = LeaseConfig::new(LEASE).expect("valid");
    SessionHandle::open(store.clone(), lease, value, &killer.thread)
        .await
        .expect("the session opens")
}

/// Semaphores on a new [`open_session`].
pub async fn coordination<S>(store: &S, n: u64, killer: &TestKiller) -> Coordination<S>
where
    S: SemaphoreStore + Clone + Send + Sync + 'static,
{
    Coordination::new(open_session(store, n, killer).await)
}

/// A value written by someone else.
pub fn foreign(address: &str) -> LeaseValue {
    LeaseValue {
        address: address.into(),
        incarnation: Incarnation(0xdead_beef),
        stopping: false,
    }
}

/// Lets the paused clock run forward by `duration`, with every task acting on the way.
pub async fn pass(duration: Duration) {
    tokio::time::sleep(duration).await;
}

/// What services did, in order.
#[derive(Clone, Default)]
pub struct Journal(Arc<Mutex<Vec<String>>>);

impl Journal {
    /// Appends one entry.
    pub fn push(&self, entry: String) {
        self.0.lock().unwrap().push(entry);
    }

    /// The entries so far, oldest first.
    pub fn entries(&self) -> Vec<String> {
        self.0.lock().unwrap().clone()
    }
}

/// Ready at once, runs until asked to stop.
pub struct Worker {
    /// The service's name, also in its journal entries.
    pub name: &'static str,
    /// Where it records its start and stop.
    pub journal: Journal,
}

impl Service for Worker {
    fn name(&self) -> Cow<'static, str> {
        Cow::Borrowed(self.name)
    }

    async fn run(self, mut context: ServiceContext) -> Result<(), ServiceError> {
        self.journal.push(format!("start {}", self.name));
        context.ready();
        context.shutdown().requested().await;
        self.journal.push(format!("stop {}", self.name));
        Ok(())
    }
}

/// Fails before reporting readiness.
pub struct FailsToStart {
    /// The error it fails with.
    pub message: &'static str,
    /// Where it records its start.
    pub journal: Journal,
}

impl Service for FailsToStart {
    fn name(&self) -> Cow<'static, str> {
        Cow::Borrowed("fails-to-start")
    }

    async fn run(self, _context: ServiceContext) -> Result<(), ServiceError> {
        self.journal.push("start fails-to-start".into());
        Err(ServiceError::new(self.message))
    }
}

/// Ready at once; fails when `trigger` is notified.
pub struct FailsLater {
    /// Notified to make the service fail.
    pub trigger: Arc<Notify>,
}

impl Service for FailsLater {
    fn name(&self) -> Cow<'static, str> {
        Cow::Borrowed("fails-later")
    }

    async fn run(self, mut context: ServiceContext) -> Result<(), ServiceError> {
        context.ready();
        let mut shutdown = context.shutdown();
        tokio::select! {
            () = shutdown.requested() => Ok(()),
            () = self.trigger.notified() => Err(ServiceError::new("disk full")),
        }
    }
}

/// Never reports readiness and never ends by itself.
pub struct NeverReady;

impl Service for NeverReady {
    fn name(&self) -> Cow<'static, str> {
        Cow::Borrowed("never-ready")
    }

    async fn run(self, _context: ServiceContext) -> Result<(), ServiceError> {
        std::future::pending().await
    }
}

/// Ready at once; ignores the request to stop.
pub struct IgnoresStop;

impl Service for IgnoresStop {
    fn name(&self) -> Cow<'static, str> {
        Cow::Borrowed("ignores-stop")
    }

    async fn run(self, mut context: ServiceContext) -> Result<(), ServiceError> {
        context.ready();
        std::future::pending().await
    }
}
