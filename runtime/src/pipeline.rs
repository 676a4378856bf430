//! The service pipeline: one task per launch starts the services one after another, each only
//! after the previous one reported readiness, then watches them; on stop it signals them from
//! last to first and waits for each (bounded by the stop timeout, then aborted). It reports to
//! the driver through a small bounded channel: at most one start outcome, at most one failure
//! and one "stopped".

use std::future::{poll_fn, Future};
use std::pin::Pin;
use std::sync::Arc;
use std::task::Poll;
use std::time::Duration;

use crate::services::{ServiceContext, ServiceError, Services, ShutdownSignal};
use crate::status::Status;
use tokio::sync::{mpsc, oneshot, watch};
use tokio::task::JoinHandle;
use tokio_util::sync::{CancellationToken, DropGuard};
use tracing::Instrument;

/// How long services get to start and to stop.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Timeouts {
    pub(crate) start: Duration,
    pub(crate) stop: Duration,
}

/// What the pipeline tells the driver.
#[derive(Debug)]
pub(crate) enum Report {
    /// Every service reported readiness.
    Started,
    /// Service `index` failed (while starting or later). Only the first failure is reported.
    Failed { index: u16, error: ServiceError },
    /// Every started service has ended. `clean` when each returned by itself: none was
    /// aborted after its stop timeout, none panicked or was cancelled.
    Stopped { clean: bool },
}

/// The driver's side of a running pipeline.
pub(crate) struct Pipeline {
    stop: Option<oneshot::Sender<()>>,
    reports: mpsc::Receiver<Report>,
    task: JoinHandle<()>,
}

impl Pipeline {
    /// Starts `services` in order; each reads its token, the deadline and the loss from
    /// `tenure`.
    pub(crate) fn start(
        services: Services,
        tenure: watch::Receiver<Status>,
        timeouts: Timeouts,
    ) -> Self {
        let (stop, stop_rx) = oneshot::channel();
        let (report_tx, reports) = mpsc::channel(4);
        // The pipeline and its services log inside the VVM's span (address, slot).
        let span = tracing::Span::current();
        let task =
            tokio::spawn(run(services, tenure, timeouts, stop_rx, report_tx).instrument(span));
        Pipeline {
            stop: Some(stop),
            reports,
            task,
        }
    }

    /// Asks the services to stop; a [`Report::Stopped`] follows.
    pub(crate) fn stop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
    }

    /// The next report; `None` once the pipeline task has ended.
    pub(crate) async fn report(&mut self) -> Option<Report> {
        self.reports.recv().await
    }

    /// Takes the reports to come, for whoever waits for the services after the pipeline's
    /// owner is gone; this pipeline reports nothing more.
    pub(crate) fn take_reports(&mut self) -> mpsc::Receiver<Report> {
        let (_, none) = mpsc::channel(1);
        std::mem::replace(&mut self.reports, none)
    }

    /// Waits for the pipeline task itself, after [`Report::Stopped`].
    pub(crate) async fn join(&mut self) {
        // The task only sends and returns after `Stopped`; a panic there is already logged.
        let _ = (&mut self.task).await;
    }
}

struct Running {
    index: u16,
    name: Arc<str>,
    shutdown: CancellationToken,
    /// Asks the service to stop when the pipeline is dropped without stopping it.
    _shutdown_on_drop: DropGuard,
    task: Option<JoinHandle<Result<(), ServiceError>>>,
}

// Dropping a JoinHandle detaches its task. Should the pipeline itself unwind or be dropped
// while a service still runs, that service must not run on unseen (the VVM would release its
// record beside it): abort it. The driver then reports the stop as not clean.
impl Drop for Running {
    fn drop(&mut self) {
        if let Some(task) = self.task.take() {
            task.abort();
        }
    }
}

/// Whether a joined service returned by itself (with or without an error).
fn returned(joined: &Result<Result<(), ServiceError>, tokio::task::JoinError>) -> bool {
    joined.is_ok()
}

fn outcome(
    name: &str,
    joined: Result<Result<(), ServiceError>, tokio::task::JoinError>,
    early: &str,
) -> ServiceError {
    match joined {
        Ok(Err(error)) => error,
        Ok(Ok(())) => ServiceError::new(format!("{name} {early}")),
        Err(join) if join.is_panic() => ServiceError::with_source(format!("{name} panicked"), join),
        Err(join) => ServiceError::with_source(format!("{name} was cancelled"), join),
    }
}

enum Start {
    Ready,
    Failed(ServiceError),
    Stop,
}

async fn start_one(
    running: &mut Running,
    ready: oneshot::Receiver<()>,
    stop: &mut oneshot::Receiver<()>,
    timeout: Duration,
    clean: &mut bool,
) -> Start {
    let Some(task) = running.task.as_mut() else {
        return Start::Failed(ServiceError::new("not started"));
    };
    let ended = tokio::select! {
        biased;
        _ = &mut *stop => return Start::Stop,
        ready = ready => match ready {
            Ok(()) => return Start::Ready,
            // The context was dropped without readiness: the task is ending; take its result.
            Err(_) => task.await,
        },
        joined = &mut *task => joined,
        _ = tokio::time::sleep(timeout) => {
            return Start::Failed(ServiceError::new(format!("did not report readiness within {timeout:?}")));
        }
    };
    running.task = None;
    *clean &= returned(&ended);
    Start::Failed(outcome(
        &running.name,
        ended,
        "ended before reporting readiness",
    ))
}

/// Resolves with the first running service whose task ends (and whether it returned by itself);
/// pending while none can.
async fn first_ended(running: &mut [Running]) -> (u16, ServiceError, bool) {
    poll_fn(|cx| {
        for service in running.iter_mut() {
            let Some(task) = service.task.as_mut() else {
                continue;
            };
            if let Poll::Ready(joined) = Pin::new(task).poll(cx) {
                service.task = None;
                let clean = returned(&joined);
                let error = outcome(&service.name, joined, "ended before it was asked to stop");
                return Poll::Ready((service.index, error, clean));
            }
        }
        Poll::Pending
    })
    .await
}

async fn run(
    services: Services,
    tenure: watch::Receiver<Status>,
    timeouts: Timeouts,
    mut stop: oneshot::Receiver<()>,
    reports: mpsc::Sender<Report>,
) {
    let mut running: Vec<Running> = Vec::with_capacity(services.len());
    let mut failed = false;
    let mut stop_asked = false;
    let mut clean = true;
    for (index, entry) in services.entries.into_iter().enumerate() {
        // `Services::with` keeps the count within SERVICES_MAX, far below u16::MAX.
        let index = u16::try_from(index).unwrap_or(u16::MAX);
        let (ready_tx, ready_rx) = oneshot::channel();
        let shutdown = CancellationToken::new();
        let context = ServiceContext {
            tenure: tenure.clone(),
            ready: Some(ready_tx),
            shutdown: ShutdownSignal {
                token: shutdown.clone(),
            },
        };
        tracing::debug!(index, name = %entry.name, "starting service");
        let span = tracing::info_span!("service", index, name = %entry.name);
        let task = tokio::spawn(entry.service.run_boxed(context).instrument(span));
        running.push(Running {
            index,
            name: entry.name,
            _shutdown_on_drop: shutdown.clone().drop_guard(),
            shutdown,
            task: Some(task),
        });
        let Some(current) = running.last_mut() else {
            break;
        };
        match start_one(current, ready_rx, &mut stop, timeouts.start, &mut clean).await {
            Start::Ready => tracing::info!(index, name = %current.name, "service ready"),
            Start::Failed(error) => {
                tracing::warn!(index, name = %current.name, error = %crate::ErrorChain(&error), "service failed to start");
                failed = true;
                let _ = reports.send(Report::Failed { index, error }).await;
                break;
            }
            Start::Stop => {
                stop_asked = true;
                break;
            }
        }
    }
    if !failed && !stop_asked {
        let _ = reports.send(Report::Started).await;
    }
    while !stop_asked {
        tokio::select! {
            _ = &mut stop => stop_asked = true,
            (index, error, returned) = first_ended(&mut running) => {
                clean &= returned;
                tracing::warn!(index, error = %crate::ErrorChain(&error), "service failed");
                if !failed {
                    failed = true;
                    let _ = reports.send(Report::Failed { index, error }).await;
                }
            }
        }
    }
    if let Some((index, error)) = stop_all(&mut running, timeouts.stop, &mut clean).await {
        if !failed {
            let _ = reports.send(Report::Failed { index, error }).await;
        }
    }
    let _ = reports.send(Report::Stopped { clean }).await;
}

/// Stops the services from last to first; returns the first that failed while stopping and
/// clears `clean` for any that did not return by itself.
async fn stop_all(
    running: &mut [Running],
    timeout: Duration,
    clean: &mut bool,
) -> Option<(u16, ServiceError)> {
    let mut first = None;
    for service in running.iter_mut().rev() {
        service.shutdown.cancel();
        let Some(task) = service.task.as_mut() else {
            continue;
        };
        match tokio::time::timeout(timeout, &mut *task).await {
            Ok(Ok(Ok(()))) => {
                tracing::info!(index = service.index, name = %service.name, "service stopped")
            }
            Ok(joined) => {
                *clean &= returned(&joined);
                let error = outcome(&service.name, joined, "");
                tracing::warn!(index = service.index, name = %service.name, error = %crate::ErrorChain(&error), "service failed while stopping");
                first.get_or_insert((service.index, error));
            }
            Err(_) => {
                tracing::error!(index = service.index, name = %service.name, ?timeout, "service did not stop in time; aborting it");
                task.abort();
                let _ = task.await;
                *clean = false;
                let error = ServiceError::new(format!("did not stop within {timeout:?}"));
                first.get_or_insert((service.index, error));
            }
        }
        service.task = None;
    }
    first
}
