//! The host's handle of one VVM. Its type says what may be done with it:
//! [`Vvm<Provided>`] can only be launched, [`Vvm<Launched>`] can only be watched and shut down,
//! and both transitions consume the handle, so "shutdown before launch", "launch twice" and
//! "use after shutdown" do not compile.
//!
//! **Dropping** a [`Vvm<Provided>`] does nothing: nothing was started. **Dropping** a
//! [`Vvm<Launched>`] starts the same shutdown as [`Vvm::shutdown`] (services, monitor, release)
//! in the background on the driver task and logs its outcome instead of returning it; the lease
//! is released as long as the tokio runtime keeps running. Only [`Vvm::shutdown`] lets the host
//! wait for the end and learn the problem.
//!
//! **On a session.** [`Vvm::provide`] leads its slot by the per-slot lease protocol (its own
//! renewals, its own kill deadline). [`Vvm::provide_on_session`] holds it as a holding of a
//! session of its own instead, and [`Vvm::provide_on_shared_session`] as a holding of a
//! [`SessionHandle`] several VVMs of the process share: acquired through the session, never
//! renewed by the VVM, lost when the session is lost, released by deleting the holding; the
//! kill deadline the services read is the session's.
//!
//! *Why sharing is offered.* Sharing makes one keepalive per `L/4` and one kill deadline serve
//! every VVM of the process instead of one each. What it costs is that a lost session stops
//! every VVM on it at once — but the killer is process-wide: whichever VVM's deadline passes
//! ends the whole process, so VVMs of one process never outlive each other's deadlines anyway.
//! For the same reason a VVM whose services stopped without being vouched for gives the shared
//! session up (no more keepalives, the deadline kept, see `~Rt.SessionUncleanStop~` in
//! `specs/runtime.md`): the others see it lost and stop in order before the killer ends the
//! process at that deadline, rather than being ended mid-work. A VVM that must not share this
//! fate uses a session of its own — or a process of its own, as with leases.

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::sync::{oneshot, watch};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use vvm_core::{
    ConfigError, FencingToken, Incarnation, Instant, Lifecycle, Phase, VvmConfig, VvmConfigBuilder,
};

use crate::driver::{Driver, SessionStart};
use crate::error::VvmError;
use crate::executor::Executor;
use crate::killer::KillerThread;
use crate::on_session::{OnSession, SessionSide};
use crate::pipeline::Timeouts;
use crate::services::{valid_token, Services, START_TIMEOUT_DEFAULT, STOP_TIMEOUT_DEFAULT};
use crate::session::SessionHandle;
use crate::session_store::SessionStore;
use crate::snapshot::VvmSubscription;
use crate::status::Status;
use crate::store::{LeaseStore, LeaseValue};

mod sealed {
    pub trait Sealed {}
}

/// A state of [`Vvm`]. Sealed: only [`Provided`] and [`Launched`] exist.
pub trait VvmState: sealed::Sealed {}

/// Everything a launch needs, with the store's type erased.
type Start = Box<dyn FnOnce(Launch) -> JoinHandle<Result<(), VvmError>> + Send>;

struct Launch {
    config: VvmConfig,
    services: Services,
    timeouts: Timeouts,
    killer: KillerThread,
    shutdown: oneshot::Receiver<()>,
    stop: CancellationToken,
    status: watch::Sender<Status>,
}

/// State of a VVM that is configured and not started.
pub struct Provided {
    config: VvmConfig,
    services: Services,
    timeouts: Timeouts,
    killer: Option<KillerThread>,
    stop: CancellationToken,
    start: Start,
}

/// Asks a VVM to stop from anywhere, at any moment of its life — also while
/// [`Vvm::launch`] is still campaigning for a slot, which no other handle can reach.
///
/// After [`stop`](Self::stop), a pending `launch()` returns promptly with a [`Vvm<Launched>`]
/// whose [`Vvm::shutdown`] awaits the same outcome as any shutdown: services that never started
/// are not started, an insert in flight is resolved and released if it won (or left to its
/// time-to-live when its outcome stays unknown). On a launched VVM it starts the shutdown; the
/// host still awaits it with `shutdown()`. Cloneable, cheap, and it never blocks.
///
/// Here another VVM holds the only slot, so the second one campaigns until it is stopped:
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// use std::time::Duration;
/// use vvm_adapters::MemoryStore;
/// use vvm_core::VvmConfig;
/// use vvm_runtime::{Services, Vvm};
///
/// let store = MemoryStore::new();
/// let holder = VvmConfig::builder("10.0.0.6:7000").slots(1);
/// let holder = Vvm::provide(holder, store.clone(), Services::new())?.launch().await;
///
/// let config = VvmConfig::builder("10.0.0.7:7000").slots(1).acquire_forever();
/// let vvm = Vvm::provide(config, store, Services::new())?;
/// let stop = vvm.stop_handle();
/// tokio::spawn(async move {
///     // A host waits for a signal here, e.g. `tokio::signal::ctrl_c().await`.
///     tokio::time::sleep(Duration::from_millis(50)).await;
///     stop.stop(); // reaches the VVM even while it still campaigns
/// });
/// let vvm = vvm.launch().await;
/// assert_eq!(vvm.token(), None); // stopped before it won a slot
/// vvm.shutdown().await?;
/// holder.shutdown().await?;
/// # Ok(()) }
/// ```
#[derive(Clone, Debug)]
pub struct StopHandle {
    token: CancellationToken,
}

impl StopHandle {
    /// Asks the VVM to stop. Later calls do nothing.
    pub fn stop(&self) {
        self.token.cancel();
    }

    /// Whether a stop was asked.
    pub fn is_stopped(&self) -> bool {
        self.token.is_cancelled()
    }
}

/// State of a VVM whose driver runs: leading with services up, or with a problem raised.
pub struct Launched {
    shutdown: oneshot::Sender<()>,
    status: watch::Receiver<Status>,
    task: Option<JoinHandle<Result<(), VvmError>>>,
}

impl sealed::Sealed for Provided {}
impl sealed::Sealed for Launched {}
impl VvmState for Provided {}
impl VvmState for Launched {}

/// One VVM: runs its services only while it holds leadership of one of the configured slots.
///
/// # Dropping
///
/// Dropping a [`Vvm<Provided>`] does nothing: nothing was started. Dropping a [`Vvm<Launched>`]
/// (or abandoning `launch` before it returns) starts the same shutdown as [`Vvm::shutdown`] in the
/// background on the driver task and logs its outcome; the lease is released as long as the tokio
/// runtime keeps running. Only [`Vvm::shutdown`] lets the host wait for the end and learn the
/// problem. The kill deadline stays armed either way.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// use std::time::Duration;
/// use vvm_adapters::MemoryStore;
/// use vvm_core::VvmConfig;
/// use vvm_runtime::{Services, Vvm};
///
/// let config = VvmConfig::builder("10.0.0.7:7000").slots(3);
/// let vvm = Vvm::provide(config, MemoryStore::new(), Services::new())?.launch().await;
/// let problem = vvm.problem();
/// // Lead until a problem is raised, or (a host would wait for a signal) a tenth of a second.
/// tokio::select! { _ = problem => {}, _ = tokio::time::sleep(Duration::from_millis(100)) => {} }
/// vvm.shutdown().await?;
/// # Ok(()) }
/// ```
pub struct Vvm<S: VvmState> {
    state: S,
}

impl std::fmt::Debug for Provided {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Provided")
            .field("address", &self.config.address())
            .field("services", &self.services.names())
            .finish_non_exhaustive()
    }
}

impl std::fmt::Debug for Launched {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let status = self.status.borrow();
        f.debug_struct("Launched")
            .field("phase", &status.phase)
            .field("token", &valid_token(&status))
            .field("problem", &status.problem)
            .finish_non_exhaustive()
    }
}

impl<S: VvmState + std::fmt::Debug> std::fmt::Debug for Vvm<S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_tuple("Vvm").field(&self.state).finish()
    }
}

/// A configuration, or what builds one.
pub trait IntoVvmConfig {
    /// The validated configuration.
    fn into_vvm_config(self) -> Result<VvmConfig, ConfigError>;
}

impl IntoVvmConfig for VvmConfig {
    fn into_vvm_config(self) -> Result<VvmConfig, ConfigError> {
        Ok(self)
    }
}

impl IntoVvmConfig for VvmConfigBuilder {
    fn into_vvm_config(self) -> Result<VvmConfig, ConfigError> {
        self.build()
    }
}

/// A fresh incarnation: 64 random bits from the operating system's generator (`getrandom`), so
/// that two VVMs, of one process or of several, practically never share one.
///
/// ```
/// assert_ne!(vvm_runtime::new_incarnation(), vvm_runtime::new_incarnation());
/// ```
pub fn new_incarnation() -> Incarnation {
    match getrandom::u64() {
        Ok(random) => Incarnation(random),
        Err(error) => {
            // Only without any entropy source (a kernel older than 3.17 with no /dev/urandom):
            // the time, the process and a per-process counter still tell VVMs apart.
            static COUNTER: AtomicU64 = AtomicU64::new(0);
            tracing::warn!(%error, "no random incarnation; using time, process id and a counter");
            let nanos = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap_or_default()
                .as_nanos() as u64;
            let count = COUNTER.fetch_add(1, Ordering::Relaxed);
            Incarnation(nanos ^ (u64::from(std::process::id()) << 40) ^ count.rotate_right(16))
        }
    }
}

impl Vvm<Provided> {
    /// Validates `config` and wires the VVM; starts nothing.
    pub fn provide<S: LeaseStore>(
        config: impl IntoVvmConfig,
        store: S,
        services: Services,
    ) -> Result<Self, ConfigError> {
        let config = config.into_vvm_config()?;
        let store = Arc::new(store);
        let start: Start = Box::new(move |launch: Launch| {
            let incarnation = new_incarnation();
            let own = LeaseValue {
                address: config_address(&launch.config),
                incarnation,
                stopping: false,
            };
            let span =
                tracing::info_span!("vvm", address = %own.address, slot = tracing::field::Empty);
            let entry = launch.killer.register(&own.address);
            let exec = Executor::new(store, own, *launch.config.lease(), entry);
            let machine = Lifecycle::new(&launch.config, incarnation);
            let driver = Driver::new(
                machine,
                exec,
                launch.config,
                launch.services,
                launch.timeouts,
                launch.shutdown,
                launch.stop,
                launch.status,
            );
            tokio::spawn(driver.run(span))
        });
        let timeouts = Timeouts {
            start: START_TIMEOUT_DEFAULT,
            stop: STOP_TIMEOUT_DEFAULT,
        };
        Ok(Vvm {
            state: Provided {
                config,
                services,
                timeouts,
                killer: None,
                stop: CancellationToken::new(),
                start,
            },
        })
    }

    /// Validates `config` and wires a VVM that holds its slot as a holding of its **own
    /// session** on `store`; starts nothing. At launch the session is opened (its lease, store
    /// timeout and kill deadline are the configuration's lease and this VVM's killer); the slot
    /// is acquired through it, with no renewal of its own; the services read the session's kill
    /// deadline; a loss of the session stops them. At shutdown the services stop, the holding
    /// is released, then the session is closed, which removes the kill deadline once its delete
    /// is confirmed — unless a stop was not clean or something was lost: then the session is
    /// given up (no more keepalives) and its deadline stays. See the module documentation.
    pub fn provide_on_session<S>(
        config: impl IntoVvmConfig,
        store: S,
        services: Services,
    ) -> Result<Self, ConfigError>
    where
        S: SessionStore + Clone + Send + Sync + 'static,
    {
        Vvm::wire_on_session(config, store, None, services)
    }

    /// Validates `config` and wires a VVM that holds its slot as a holding of `session`, which
    /// other VVMs of this process may share; starts nothing. The session is its owner's to
    /// close: this VVM only releases its holding at shutdown. The session's address is what the
    /// store shows as the slot's holder, and its killer is the one that ends the process.
    ///
    /// A loss of the session stops every VVM on it. A VVM whose services stopped without being
    /// vouched for (aborted, vanished) gives the session up — no more keepalives, its deadline
    /// kept — so the others lose it too and stop before the killer ends the process (which it
    /// would end at that deadline anyway). See the module documentation for why.
    pub fn provide_on_shared_session<S>(
        config: impl IntoVvmConfig,
        session: SessionHandle<S>,
        services: Services,
    ) -> Result<Self, ConfigError>
    where
        S: SessionStore + Clone + Send + Sync + 'static,
    {
        let store = session.store().clone();
        Vvm::wire_on_session(config, store, Some(session), services)
    }

    fn wire_on_session<S>(
        config: impl IntoVvmConfig,
        store: S,
        shared: Option<SessionHandle<S>>,
        services: Services,
    ) -> Result<Self, ConfigError>
    where
        S: SessionStore + Clone + Send + Sync + 'static,
    {
        let config = config.into_vvm_config()?;
        let start: Start = Box::new(move |launch: Launch| {
            let lease = *launch.config.lease();
            let own = LeaseValue {
                address: config_address(&launch.config),
                incarnation: new_incarnation(),
                stopping: false,
            };
            let span =
                tracing::info_span!("vvm", address = %own.address, slot = tracing::field::Empty);
            // Never armed: the kill deadline is the session's.
            let entry = launch.killer.register(&own.address);
            let exec = Executor::new(Arc::new(store.clone()), own.clone(), lease, entry);
            let session = match shared {
                Some(handle) => {
                    let side: Arc<dyn SessionSide> = Arc::new(OnSession { handle, own: false });
                    SessionStart::Shared(side)
                }
                None => {
                    let killer = launch.killer.clone();
                    // The store's trouble while it opens is ridden out within the window the
                    // driver gives (what is left of the acquisition), as a candidate's on a
                    // per-slot lease; a session lost while campaigning is opened anew.
                    SessionStart::Own(Box::new(move |window| {
                        let (store, own, killer) = (store.clone(), own.clone(), killer.clone());
                        Box::pin(async move {
                            let handle =
                                SessionHandle::open_within(store, lease, own, &killer, window)
                                    .await?;
                            let side: Arc<dyn SessionSide> =
                                Arc::new(OnSession { handle, own: true });
                            Ok(side)
                        })
                    }))
                }
            };
            let machine = match session {
                SessionStart::Own(_) => Lifecycle::on_own_session(&launch.config),
                SessionStart::Shared(_) => Lifecycle::on_session(&launch.config),
            };
            let driver = Driver::new(
                machine,
                exec,
                launch.config,
                launch.services,
                launch.timeouts,
                launch.shutdown,
                launch.stop,
                launch.status,
            )
            .on_session(session);
            tokio::spawn(driver.run(span))
        });
        Ok(Vvm {
            state: Provided {
                config,
                services,
                timeouts: Timeouts {
                    start: START_TIMEOUT_DEFAULT,
                    stop: STOP_TIMEOUT_DEFAULT,
                },
                killer: None,
                stop: CancellationToken::new(),
                start,
            },
        })
    }

    /// A handle that stops this VVM at any moment, also during [`launch`](Self::launch); see
    /// [`StopHandle`].
    pub fn stop_handle(&self) -> StopHandle {
        StopHandle {
            token: self.state.stop.clone(),
        }
    }

    /// Uses `killer` instead of the process-wide [`KillerThread::global`] one.
    pub fn with_killer(mut self, killer: KillerThread) -> Self {
        self.state.killer = Some(killer);
        self
    }

    /// How long each service has to report readiness (default 60 s) and to stop (default 30 s).
    pub fn with_service_timeouts(mut self, start: Duration, stop: Duration) -> Self {
        self.state.timeouts = Timeouts { start, stop };
        self
    }

    /// The configuration.
    pub fn config(&self) -> &VvmConfig {
        &self.state.config
    }

    /// Starts the VVM and returns once leadership is held and every service is up, once a
    /// problem was raised (then [`Vvm::problem`] is resolved already), or once a
    /// [`StopHandle`] asked to stop (then [`Vvm::shutdown`] awaits the end). Must run inside a
    /// tokio runtime; outside one the VVM is launched with [`VvmError::NoRuntime`] as its
    /// problem.
    ///
    /// # Cancel safety
    ///
    /// Dropping the future drops the VVM's handle, which asks its driver to shut down: the services
    /// stop in order and the slot is released in the background, exactly as by
    /// [`shutdown`](Vvm::shutdown).
    pub async fn launch(self) -> Vvm<Launched> {
        let Provided {
            config,
            services,
            timeouts,
            killer,
            stop,
            start,
        } = self.state;
        let (shutdown, shutdown_rx) = oneshot::channel();
        let (status_tx, mut status) = watch::channel(Status::default());
        if tokio::runtime::Handle::try_current().is_err() {
            status_tx.send_modify(|s| {
                s.problem = Some(VvmError::NoRuntime);
                s.finished = true;
            });
            return Vvm {
                state: Launched {
                    shutdown,
                    status,
                    task: None,
                },
            };
        }
        let launch = Launch {
            config,
            services,
            timeouts,
            killer: killer.unwrap_or_else(KillerThread::global),
            shutdown: shutdown_rx,
            stop: stop.clone(),
            status: status_tx,
        };
        let task = start(launch);
        // An error means the driver is gone; `shutdown` reports that. A stop asked meanwhile
        // has reached the driver too, which is shutting down: the host awaits it.
        tokio::select! {
            _ = status.wait_for(|s| s.running || s.problem.is_some() || s.finished) => {}
            () = stop.cancelled() => {}
        }
        Vvm {
            state: Launched {
                shutdown,
                status,
                task: Some(task),
            },
        }
    }
}

fn config_address(config: &VvmConfig) -> String {
    config.address().to_owned()
}

impl Vvm<Launched> {
    /// A future that resolves with the first problem. Cloneable; every clone resolves with the
    /// same error. It never resolves for a VVM that shuts down without a problem.
    pub fn problem(&self) -> ProblemFuture {
        ProblemFuture::new(self.state.status.clone())
    }

    /// The first problem, if one was raised already.
    pub fn current_problem(&self) -> Option<VvmError> {
        self.state.status.borrow().problem.clone()
    }

    /// The fencing token of the last confirmed write, while this VVM may act on it: `None`
    /// before leadership was acquired, once it was lost, and once the kill deadline has passed.
    pub fn token(&self) -> Option<FencingToken> {
        valid_token(&self.state.status.borrow())
    }

    /// Whether leadership was lost (the services are being, or have been, stopped).
    pub fn is_lost(&self) -> bool {
        self.state.status.borrow().lost
    }

    /// A stream of this VVM's state (phase, services running, token, kill deadline, problem):
    /// each call gives an independent subscriber that starts at the state now.
    pub fn subscribe(&self) -> VvmSubscription {
        VvmSubscription::new(self.state.status.clone())
    }

    /// Where the VVM is in its life.
    pub fn phase(&self) -> Phase {
        self.state.status.borrow().phase
    }

    /// The kill deadline this VVM armed last, on the clock of [`crate::Clock`].
    pub fn kill_deadline(&self) -> Option<Instant> {
        self.state.status.borrow().deadline
    }

    /// Stops the services (last first), the leadership monitor, releases the lease and returns
    /// the first problem, if any.
    ///
    /// # Cancel safety
    ///
    /// The shutdown is asked before the first await: dropping the future loses only its result; the
    /// driver carries the shutdown through in order in the background.
    pub async fn shutdown(self) -> Result<(), VvmError> {
        let Launched {
            shutdown,
            status,
            task,
        } = self.state;
        // The driver may be gone already; then the join below tells why.
        let _ = shutdown.send(());
        let Some(task) = task else {
            return status.borrow().problem.clone().map_or(Ok(()), Err);
        };
        match task.await {
            Ok(outcome) => outcome,
            Err(_) => Err(VvmError::DriverGone),
        }
    }
}

/// Resolves with the first problem of a launched VVM; see [`Vvm::problem`].
pub struct ProblemFuture {
    status: watch::Receiver<Status>,
    wait: Option<Pin<Box<dyn Future<Output = Option<VvmError>> + Send>>>,
    never: bool,
}

impl ProblemFuture {
    fn new(status: watch::Receiver<Status>) -> Self {
        ProblemFuture {
            status,
            wait: None,
            never: false,
        }
    }
}

impl Clone for ProblemFuture {
    fn clone(&self) -> Self {
        ProblemFuture::new(self.status.clone())
    }
}

impl std::fmt::Debug for ProblemFuture {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ProblemFuture").finish_non_exhaustive()
    }
}

impl Future for ProblemFuture {
    type Output = VvmError;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<VvmError> {
        if self.never {
            return Poll::Pending;
        }
        let mut status = self.status.clone();
        let wait = self.wait.get_or_insert_with(|| {
            Box::pin(async move {
                let waited = status
                    .wait_for(|s| s.problem.is_some() || s.finished)
                    .await
                    .map(|s| s.problem.clone());
                match waited {
                    Ok(problem) => problem,
                    // The driver vanished without finishing: that is the problem.
                    Err(_) if !status.borrow().finished => Some(VvmError::DriverGone),
                    Err(_) => status.borrow().problem.clone(),
                }
            })
        });
        match wait.as_mut().poll(cx) {
            Poll::Ready(Some(error)) => Poll::Ready(error),
            Poll::Ready(None) => {
                // Finished without a problem: there never will be one.
                self.never = true;
                Poll::Pending
            }
            Poll::Pending => Poll::Pending,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // covers: Rt.Incarnation
    #[test]
    fn every_vvm_of_a_process_gets_its_own_incarnation() {
        let incarnations: std::collections::HashSet<_> =
            (0..1000).map(|_| new_incarnation()).collect();
        assert_eq!(incarnations.len(), 1000);
    }
}
