//! Services: the work a VVM runs while it leads, started in declaration order and stopped in
//! reverse order (by the pipeline, see `pipeline.rs`).

use std::borrow::Cow;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{oneshot, watch};
use tokio_util::sync::CancellationToken;
use vvm_core::{FencingToken, Instant};

use crate::clock::{Clock, TimeSource};
pub use crate::error::ServiceError;
use crate::error::ServicesError;
use crate::status::Status;

/// Most services one VVM runs; the core numbers them with a `u16`.
pub const SERVICES_MAX: usize = 1024;
/// Default time a service has to report readiness.
pub const START_TIMEOUT_DEFAULT: Duration = Duration::from_secs(60);
/// Default time a service has to finish after it was asked to stop; then its task is aborted.
pub const STOP_TIMEOUT_DEFAULT: Duration = Duration::from_secs(30);

/// What a running service is handed: the fencing token, the readiness report, the loss signal
/// and the shutdown signal.
#[derive(Debug)]
pub struct ServiceContext {
    pub(crate) tenure: watch::Receiver<Status>,
    pub(crate) ready: Option<oneshot::Sender<()>>,
    pub(crate) shutdown: ShutdownSignal,
}

/// The token of the last confirmed write while this VVM may act on it: `None` once leadership
/// was lost or the kill deadline has passed on the runtime's [`Clock`].
pub(crate) fn valid_token(status: &Status) -> Option<FencingToken> {
    if status.lost {
        return None;
    }
    let deadline = status.deadline?;
    (Clock.now() < deadline).then_some(status.token?)
}

impl ServiceContext {
    /// The fencing token of the last confirmed write; pass it with writes so that a stale
    /// leader's writes are refused. `None` once leadership was lost or the kill deadline has
    /// passed: from then on nothing may be written as leader.
    pub fn token(&self) -> Option<FencingToken> {
        valid_token(&self.tenure.borrow())
    }

    /// A signal that resolves once leadership is lost. It comes before the stop signal (a loss
    /// stops the services at once), so a service can tell a loss from a planned shutdown.
    pub fn lost(&self) -> LossSignal {
        LossSignal {
            rx: self.tenure.clone(),
        }
    }

    /// Reports that the service is up; the next service starts only after this. Later calls
    /// do nothing.
    pub fn ready(&mut self) {
        if let Some(ready) = self.ready.take() {
            // The pipeline may have stopped waiting (shutdown during start); nothing to tell.
            let _ = ready.send(());
        }
    }

    /// A signal that resolves once the service is asked to stop; clone it into sub-tasks.
    pub fn shutdown(&self) -> ShutdownSignal {
        self.shutdown.clone()
    }

    /// The kill deadline armed last, on the runtime's [`Clock`]: past it this process is ended
    /// unless a renewal moved it. `None` before the first is armed.
    pub fn kill_deadline(&self) -> Option<Instant> {
        self.tenure.borrow().deadline
    }

    /// The kill deadline as it moves, for a service that hands its work to another process:
    /// that process can then end itself by the same deadline, also when this one is stopped
    /// and cannot (see [`KillDeadlines`]).
    pub fn kill_deadlines(&self) -> KillDeadlines {
        KillDeadlines {
            rx: self.tenure.clone(),
            last: self.kill_deadline(),
        }
    }
}

/// Changes of the kill deadline, from [`ServiceContext::kill_deadlines`]. A reader that falls
/// behind sees only the latest deadline. A confirmed renewal moves it later; the guard before a
/// renewal can move it earlier, and this process's own killer stays the bound in that case.
#[derive(Clone, Debug)]
pub struct KillDeadlines {
    rx: watch::Receiver<Status>,
    last: Option<Instant>,
}

impl KillDeadlines {
    /// The deadline this reader holds: the last one returned by [`changed`](Self::changed), or
    /// the one armed when it was made.
    pub fn current(&self) -> Option<Instant> {
        self.last
    }

    /// Waits until another deadline is armed and returns it; `None` once the VVM is gone. A
    /// disarmed deadline (after the release) is not reported: the last armed one stays the
    /// bound for whatever still runs.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: the reader moves on only when a deadline is returned; a deadline armed while no
    /// call waited is returned by the next call.
    pub async fn changed(&mut self) -> Option<Instant> {
        let last = self.last;
        let status = self
            .rx
            .wait_for(|status| status.deadline.is_some() && status.deadline != last)
            .await
            .ok()?;
        self.last = status.deadline;
        self.last
    }
}

/// Resolves when the service is asked to stop (also when the VVM is gone).
#[derive(Clone, Debug)]
pub struct ShutdownSignal {
    pub(crate) token: CancellationToken,
}

impl ShutdownSignal {
    /// Waits until the stop is asked.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: a stop asked stays asked; the next call resolves at once.
    pub async fn requested(&mut self) {
        // The pipeline cancels the token when it asks, and when it is dropped.
        self.token.cancelled().await;
    }

    /// Whether the stop was asked already.
    pub fn is_requested(&self) -> bool {
        self.token.is_cancelled()
    }
}

/// Resolves when the VVM loses leadership (also when the VVM is gone).
#[derive(Clone, Debug)]
pub struct LossSignal {
    pub(crate) rx: watch::Receiver<Status>,
}

impl LossSignal {
    /// Waits until leadership is lost. Pending forever for a VVM that shuts down without a
    /// loss, until the VVM is gone.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: a loss stays a loss; the next call resolves at once.
    pub async fn occurred(&mut self) {
        // An error means the driver is gone: nothing will lead for these services any more.
        let _ = self.rx.wait_for(|status| status.lost).await;
    }

    /// Whether leadership was lost already.
    pub fn is_lost(&self) -> bool {
        self.rx.borrow().lost
    }
}

/// A unit of work that runs only while its VVM leads.
///
/// `run` calls [`ServiceContext::ready`] once it is up, then works until
/// [`ShutdownSignal::requested`] resolves, and returns. An error before readiness is a start
/// failure; returning (with or without an error) before the stop was asked is a failure of a
/// running service. Both become the VVM's problem.
pub trait Service: Send + 'static {
    /// Name used in logs and errors.
    fn name(&self) -> Cow<'static, str> {
        Cow::Borrowed(std::any::type_name::<Self>())
    }

    /// Runs the service until it is asked to stop.
    fn run(self, context: ServiceContext) -> impl Future<Output = Result<(), ServiceError>> + Send;
}

pub(crate) type Run = Pin<Box<dyn Future<Output = Result<(), ServiceError>> + Send>>;

/// Object-safe form of [`Service`], so that one VVM can hold services of different types.
pub(crate) trait ErasedService: Send {
    fn run_boxed(self: Box<Self>, context: ServiceContext) -> Run;
}

impl<S: Service> ErasedService for S {
    fn run_boxed(self: Box<Self>, context: ServiceContext) -> Run {
        Box::pin((*self).run(context))
    }
}

pub(crate) struct Entry {
    pub(crate) name: Arc<str>,
    pub(crate) service: Box<dyn ErasedService>,
}

/// The services of one VVM, in start order.
#[derive(Default)]
pub struct Services {
    pub(crate) entries: Vec<Entry>,
}

impl std::fmt::Debug for Services {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_list()
            .entries(self.entries.iter().map(|e| &e.name))
            .finish()
    }
}

impl Services {
    /// No services.
    pub fn new() -> Self {
        Services::default()
    }

    /// Appends `service`; it starts after every service added before it.
    pub fn with(mut self, service: impl Service) -> Result<Self, ServicesError> {
        if self.entries.len() >= SERVICES_MAX {
            return Err(ServicesError::TooMany { max: SERVICES_MAX });
        }
        let name = Arc::from(service.name().as_ref());
        self.entries.push(Entry {
            name,
            service: Box::new(service),
        });
        Ok(self)
    }

    /// Number of services.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    pub(crate) fn names(&self) -> Vec<Arc<str>> {
        self.entries.iter().map(|e| e.name.clone()).collect()
    }
}
