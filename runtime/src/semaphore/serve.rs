//! Services under a grant: they start once the grant is held, run while it is held and its
//! session is live, and stop before the grant is released — the same rules a VVM's services
//! follow under a slot's leadership.
//!
//! The order is fixed, as for a VVM: the services stop (last to first, each within the stop
//! timeout), and only then is the grant released, so no other owner is granted these units
//! while a service of ours may still act. Services read:
//!
//! - the **token**, the grant's [`SemaphoreGrant::token`]: `FencingToken { slot: Slot(0),
//!   revision: <the grant's generation> }`, printed `0:<generation>` — slot 0 because a
//!   semaphore has no slots; the revision rises with every grant of the semaphore, so a resource
//!   can refuse a former owner's writes. `None` once the grant ended or the session's kill
//!   deadline passed;
//! - the **kill deadline**, which is the session's: it moves with each confirmed keepalive;
//! - the **loss** signal, when the grant ends underneath (the session lost or closed, a forced
//!   delete, the session's expiry seen by another party).
//!
//! After a stop that was not clean (a service aborted after its stop timeout, one that
//! panicked), the grant is **not** released: whatever the service left behind may still act, so
//! its units stay taken until the session ends. The session is abandoned: no keepalive any more
//! and no close, so its kill deadline stays armed where it is and ends the process by then (every
//! other holding of the session sees it lost) — see [`ServeError::UncleanStop`].

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;
use vvm_core::Phase;

use super::grant::withdraw;
use super::{CoordinationError, GrantEnd, SemaphoreGrant};
use crate::clock::{Clock, TimeSource};
use crate::error::ServiceError;
use crate::pipeline::{Pipeline, Report, Timeouts};
use crate::semaphore_store::SemaphoreStore;
use crate::services::{Services, START_TIMEOUT_DEFAULT, STOP_TIMEOUT_DEFAULT};
use crate::session::SessionStatus;
use crate::status::Status;

/// How long services under a grant get to start and to stop.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ServeTimeouts {
    /// Time each service has to report readiness.
    pub start: Duration,
    /// Time each service has to return once asked to stop; then its task is aborted.
    pub stop: Duration,
}

impl Default for ServeTimeouts {
    fn default() -> Self {
        ServeTimeouts {
            start: START_TIMEOUT_DEFAULT,
            stop: STOP_TIMEOUT_DEFAULT,
        }
    }
}

/// Why services under a grant ended other than by the stop asked for.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ServeError {
    /// The grant ended underneath: the services were stopped at once.
    #[error("the grant of the semaphore ended: {0:?}")]
    GrantEnded(GrantEnd),
    /// The session could not run services: not live, or its kill deadline already passed. No
    /// service was started; the grant was released.
    #[error("the session cannot run services (not live, or past its kill deadline)")]
    SessionNotLive,
    /// Service `index` (in start order) failed while starting or running; the others were
    /// stopped.
    #[error("service {index} failed")]
    ServiceFailed {
        /// Its position in the start order.
        index: u16,
        /// What it reported.
        #[source]
        source: ServiceError,
    },
    /// Every service ended by itself although no stop was asked.
    #[error("the services ended by themselves")]
    ServicesEnded,
    /// A service did not return by itself when asked to stop (aborted after the stop timeout,
    /// panicked): the grant is left held until the session ends, since what the service left
    /// behind may still act, and the session is abandoned, so that its kill deadline ends the
    /// process.
    #[error("a service did not stop cleanly: the grant is left to end with the session")]
    UncleanStop,
    /// The services stopped cleanly but the release did not succeed: the grant ends with the
    /// session.
    #[error("releasing the grant failed")]
    Release(#[source] CoordinationError),
}

impl<S: SemaphoreStore + Clone> SemaphoreGrant<S> {
    /// Runs `services` while this grant is held, until `stop` resolves, a service fails or the
    /// grant ends; then stops them and, once they stopped cleanly, releases the grant.
    /// `Ok(())` after a stop asked through `stop`, a clean stop and a confirmed release (or a
    /// grant already gone); the first problem otherwise.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// use std::borrow::Cow;
    /// use vvm_adapters::MemoryStore;
    /// use vvm_core::{Incarnation, LeaseConfig};
    /// use vvm_runtime::{AcquireOptions, Coordination, KillerThread, LeaseValue, RecordingKiller};
    /// use vvm_runtime::{Service, ServiceContext, ServiceError, Services, SessionHandle};
    ///
    /// struct Worker;
    /// impl Service for Worker {
    ///     fn name(&self) -> Cow<'static, str> {
    ///         "worker".into()
    ///     }
    ///     async fn run(self, mut context: ServiceContext) -> Result<(), ServiceError> {
    ///         assert!(context.token().is_some()); // the grant's fencing token, while held
    ///         context.ready();
    ///         context.shutdown().requested().await;
    ///         Ok(())
    ///     }
    /// }
    ///
    /// let store = MemoryStore::new();
    /// let killer = KillerThread::new(RecordingKiller::new());
    /// let value = LeaseValue::new("10.0.0.1:7000", Incarnation(1));
    /// let session = SessionHandle::open(store, LeaseConfig::default(), value, &killer).await?;
    /// let coordination = Coordination::new(session);
    /// coordination.create("workers", 2, Vec::new()).await?;
    /// let grant = coordination.acquire("workers", AcquireOptions::new(1)).await?.expect("fits");
    /// let services = Services::new().with(Worker)?;
    /// let stop = tokio::time::sleep(std::time::Duration::from_millis(20));
    /// grant.serve(services, Default::default(), stop).await?;
    /// assert!(coordination.describe("workers").await?.owners.is_empty()); // released
    /// # Ok(()) }
    /// ```
    ///
    /// # Cancel safety
    ///
    /// Dropping the future (a `select!`, a timeout) before it returned does not release the
    /// grant beside running services: they are asked to stop, and the grant is released in the
    /// background once each returned by itself (after an unclean stop the session is
    /// abandoned, as `serve` would). No other owner is granted these units meanwhile.
    pub async fn serve(
        self,
        services: Services,
        timeouts: ServeTimeouts,
        stop: impl Future<Output = ()>,
    ) -> Result<(), ServeError> {
        let session = &self.inner.session;
        let mut deadlines = session.kill_deadlines();
        let deadline = *deadlines.borrow_and_update();
        let live = matches!(session.status(), SessionStatus::Open { .. });
        if !live || deadline.is_none_or(|deadline| Clock.now() >= deadline) {
            // Nothing may act under the grant: give it back, as a stop before the start would.
            let _ = self.release().await;
            return Err(ServeError::SessionNotLive);
        }
        let token = self.token();
        let (tenure, tenure_rx) = watch::channel(Status {
            phase: Phase::Running,
            running: true,
            services_running: true,
            token: Some(token),
            deadline,
            ..Status::default()
        });
        let timeouts = Timeouts {
            start: timeouts.start,
            stop: timeouts.stop,
        };
        tracing::info!(semaphore = %self.name, fencing_token = %token, "starting services under the grant");
        let pipeline = Pipeline::start(services, tenure_rx, timeouts);
        // From here the grant is released only once the services stopped, even if this future
        // is dropped on the way (see `Serving`).
        let mut serving = Serving {
            grant: self,
            pipeline,
            tenure,
            finished: false,
        };
        let mut problem: Option<ServeError> = None;
        let mut stopping = false;
        // The deadline stream ends with the session's task; then the last one stays the bound.
        let mut deadlines_open = true;
        let clean = {
            let Serving {
                grant,
                pipeline,
                tenure,
                ..
            } = &mut serving;
            let ended = grant.ended();
            tokio::pin!(ended, stop);
            let mut grant_over = false;
            loop {
                tokio::select! {
                    report = pipeline.report() => match report {
                        Some(Report::Started) => tracing::info!("services ready under the grant"),
                        Some(Report::Failed { index, error }) => {
                            problem.get_or_insert(ServeError::ServiceFailed { index, source: error });
                            stopping = true;
                            pipeline.stop();
                        }
                        Some(Report::Stopped { clean }) => {
                            if !stopping {
                                problem.get_or_insert(ServeError::ServicesEnded);
                            }
                            break clean;
                        }
                        // The pipeline task is gone without a report: nothing is known of
                        // its services, so the stop cannot count as clean.
                        None => break false,
                    },
                    end = &mut ended, if !grant_over => {
                        grant_over = true;
                        tracing::warn!(semaphore = %grant.name, ?end, "the grant ended: stopping the services");
                        // First the token goes (services see the loss), then the stop.
                        tenure.send_modify(|status| {
                            status.lost = true;
                            status.stopping = true;
                        });
                        problem.get_or_insert(ServeError::GrantEnded(end));
                        stopping = true;
                        pipeline.stop();
                    }
                    () = &mut stop, if !stopping => {
                        tracing::info!(semaphore = %grant.name, "stopping the services under the grant");
                        tenure.send_modify(|status| status.stopping = true);
                        stopping = true;
                        pipeline.stop();
                    }
                    changed = deadlines.changed(), if deadlines_open => match changed {
                        Ok(()) => {
                            let deadline = *deadlines.borrow_and_update();
                            // A disarmed deadline (a clean close) is not passed on: the last
                            // armed one stays the bound for whatever still runs.
                            if deadline.is_some() {
                                tenure.send_modify(|status| status.deadline = deadline);
                            }
                        }
                        Err(_) => deadlines_open = false,
                    },
                }
            }
        };
        serving.pipeline.join().await;
        serving.finished = true;
        serving.tenure.send_modify(|status| {
            status.services_running = false;
            status.running = false;
        });
        let grant = &mut serving.grant;
        if !clean {
            tracing::error!(semaphore = %grant.name, "a service did not stop cleanly: the grant is left to end with the session");
            // Not released and not detached: the units stay taken. The session is abandoned —
            // no keepalive any more, not closed — so its kill deadline stays where it is and
            // ends the process, as a VVM's unclean stop does.
            grant.done = true;
            grant.inner.session.abandon();
            return Err(ServeError::UncleanStop);
        }
        match grant.release_in_place().await {
            Ok(released) => {
                tracing::info!(released, "grant released after the services stopped");
            }
            Err(error) => {
                problem.get_or_insert(ServeError::Release(error));
            }
        }
        match problem {
            None => Ok(()),
            // A grant that ended underneath has nothing left to release; that is not a second
            // problem, and the first one is what the caller learns.
            Some(problem) => Err(problem),
        }
    }
}

/// A grant whose services run. Dropped before they stopped — the caller of
/// [`SemaphoreGrant::serve`] gave up on it (a `select!`, a timeout) — it finishes in the
/// background what `serve` would have done: the services are asked to stop and, only once each
/// returned by itself, the grant is released; after an unclean stop the session is abandoned
/// (as `serve` does). So no other owner is granted these units while a service of ours may act.
struct Serving<S: SemaphoreStore + Clone> {
    grant: SemaphoreGrant<S>,
    pipeline: Pipeline,
    tenure: watch::Sender<Status>,
    /// The services have stopped: what is left is `serve`'s to do.
    finished: bool,
}

impl<S: SemaphoreStore + Clone> Drop for Serving<S> {
    fn drop(&mut self) {
        if self.finished {
            return;
        }
        tracing::info!(semaphore = %self.grant.name, "serve was dropped: stopping the services before the grant is released");
        self.tenure.send_modify(|status| status.stopping = true);
        self.pipeline.stop();
        // The grant's own drop would withdraw it now, beside services that may still act.
        self.grant.done = true;
        let inner = Arc::clone(&self.grant.inner);
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            // Nobody can wait for the services: the units stay taken until the session ends,
            // and its kill deadline ends the process.
            inner.session.abandon();
            return;
        };
        let (name, holding) = (self.grant.name.clone(), self.grant.holding);
        let mut reports = self.pipeline.take_reports();
        // Kept until the services stopped: they read the token and the deadline from it.
        let tenure = std::mem::replace(&mut self.tenure, watch::channel(Status::default()).0);
        runtime.spawn(async move {
            let clean = loop {
                match reports.recv().await {
                    Some(Report::Stopped { clean }) => break clean,
                    Some(_) => {}
                    None => break false,
                }
            };
            drop(tenure);
            if clean {
                withdraw(&inner, &name, Some(holding));
            } else {
                tracing::error!(semaphore = %name, "a service did not stop cleanly: the grant is left to end with the session");
                inner.session.abandon();
            }
        });
    }
}
