//! The driver task of one VVM: waits for the next timer, store reply, command or service report,
//! hands it to the [`Lifecycle`] machine and executes what the machine asks for.

use std::collections::VecDeque;
use std::sync::Arc;

use tokio::sync::{oneshot, watch};
use tokio_util::sync::CancellationToken;
use tracing::Instrument;
use vvm_core::{
    Effect, Effects, Instant, Lifecycle, Problem, Slot, TimerKind, VvmConfig, VvmEvent,
};

use crate::error::VvmError;
use crate::executor::{Executor, Wake};
use crate::on_session::{BoxFuture, SessionSide};
use crate::pacing::Pacing;
use crate::pipeline::{Pipeline, Report, Timeouts};
use crate::refusals::Refusals;
use crate::services::{ServiceError, Services};
use crate::status::Status;
use crate::store::{LeaseStore, LeaseValue, SlotChange};

/// Most events the driver queues for itself (only "services stopped" when none ran).
const QUEUED_MAX: usize = 4;

pub(crate) struct Driver<S> {
    machine: Lifecycle,
    exec: Executor<S>,
    config: VvmConfig,
    services: Option<Services>,
    names: Vec<Arc<str>>,
    /// The first error message each service reported, by start index.
    errors: Vec<Option<ServiceError>>,
    timeouts: Timeouts,
    pipeline: Option<Pipeline>,
    shutdown: Option<oneshot::Receiver<()>>,
    /// A stop asked through a [`crate::StopHandle`]; `None` once seen (or when none can come).
    stop: Option<CancellationToken>,
    status: watch::Sender<Status>,
    queued: VecDeque<VvmEvent>,
    /// The change feed of every slot while the machine waits between rounds; `None` otherwise.
    changes: Option<SlotChange>,
    /// While leading: the watch of the record of the slot led, which resolves once the store
    /// says it is gone or another's (see [`record_vanished`]).
    own_record: Option<(Slot, BoxFuture<()>)>,
    /// Why each slot was last not won, for the acquisition error.
    refusals: Refusals,
    /// Acquisition failed: the error waits for the holders to be read
    /// ([`Refusals::read_holders`]) before it is raised.
    describing: bool,
    /// Spaces the rounds while the store fails (see the `pacing` module).
    pacing: Pacing,
    out: Effects,
    outcome: Option<Result<(), VvmError>>,
    /// How to get the session of a VVM on a session, until launch got it.
    session_start: Option<SessionStart>,
    /// The session of a VVM on a session, once launched.
    session: Option<OnSession>,
    /// Resolves when that session is lost; `None` once it did (or without a session).
    session_lost: Option<BoxFuture<Option<vvm_core::LossReason>>>,
    /// That session's kill deadline, published to the services as it moves.
    session_deadlines: Option<tokio::sync::watch::Receiver<Option<Instant>>>,
    /// Opens the VVM's own session anew (`None` for a shared session or on a lease).
    opener: Option<Opener>,
    /// The machine asked for a fresh session (`Effect::OpenSession`), worth opening until then.
    reopen: Option<Instant>,
}

/// Where a VVM on a session gets its session at launch.
pub(crate) enum SessionStart {
    /// A session shared with other VVMs, open already.
    Shared(Arc<dyn SessionSide>),
    /// Its own session, opened by this opener at launch, and again when it is lost while the
    /// VVM campaigns (`Effect::OpenSession`).
    Own(Opener),
}

/// Opens a VVM's own session, trying within the window given.
pub(crate) type Opener = Box<
    dyn Fn(
            std::time::Duration,
        ) -> BoxFuture<Result<Arc<dyn SessionSide>, crate::session::SessionError>>
        + Send,
>;

/// The session of a launched VVM on a session, as the driver watches it.
struct OnSession {
    side: Arc<dyn SessionSide>,
    /// The lifecycle vouched that nothing of this VVM acts any more (its `DisarmKiller`).
    clean: bool,
}

/// What woke the driver besides the machine's own inputs.
enum Woken {
    /// An event for the machine.
    Event(VvmEvent),
    /// The session's kill deadline moved: only the status changes.
    DeadlineMoved,
}

/// Resolves when the session is lost, with why; pending without a session, and once it did.
async fn session_lost(
    lost: &mut Option<BoxFuture<Option<vvm_core::LossReason>>>,
) -> vvm_core::LossReason {
    let Some(watch) = lost.as_mut() else {
        return std::future::pending().await;
    };
    let reason = watch.await;
    *lost = None;
    match reason {
        Some(reason) => reason,
        // Closed or never opened: nothing to lose any more.
        None => std::future::pending().await,
    }
}

/// Resolves when the session's kill deadline moves; pending without a session.
async fn deadline_moved(deadlines: &mut Option<tokio::sync::watch::Receiver<Option<Instant>>>) {
    match deadlines.as_mut() {
        Some(deadlines) => {
            if deadlines.changed().await.is_err() {
                // The session's task ended: its last deadline stays what was published.
                std::future::pending::<()>().await;
            }
        }
        None => std::future::pending().await,
    }
}

/// What one transition asks of the service pipeline, done after its status is published.
#[derive(Default)]
struct ServiceActions {
    /// Start these services.
    start: Option<Services>,
    /// Ask the running services to stop.
    stop: bool,
}

/// Resolves when the handle asks for shutdown or goes away; pending once it did.
async fn shutdown_asked(shutdown: &mut Option<oneshot::Receiver<()>>) {
    match shutdown.as_mut() {
        // Sent or dropped: both mean "shut down".
        Some(rx) => {
            let _ = rx.await;
            *shutdown = None;
        }
        None => std::future::pending().await,
    }
}

/// Resolves once a stop handle asked to stop; pending once it did, or when no handle can ask.
async fn stop_asked(stop: &mut Option<CancellationToken>) {
    match stop.as_ref() {
        Some(token) => token.cancelled().await,
        None => std::future::pending::<()>().await,
    }
    *stop = None;
}

/// Resolves when the store reports a change of a slot's record; pending while nothing is
/// watched, and after it resolved once.
async fn slot_changed(changes: &mut Option<SlotChange>) {
    match changes.as_mut() {
        Some(change) => {
            change.await;
            *changes = None;
        }
        None => std::future::pending().await,
    }
}

/// How the driver (or an `Elections` task) knows its own record of the slot it leads.
#[derive(Clone)]
pub(crate) enum Mine {
    /// On a lease: by its value (each renewal writes a new revision).
    Value(LeaseValue),
    /// On a session: by the holding's revision, its fencing token, which keepalives of the
    /// session never change (the value is the session's, shared by every holding of it).
    Revision(vvm_core::Revision),
}

impl Mine {
    fn is(&self, lease: &crate::store::Lease) -> bool {
        match self {
            Mine::Value(own) => {
                lease.value.incarnation == own.incarnation && lease.value.address == own.address
            }
            Mine::Revision(revision) => lease.revision == *revision,
        }
    }
}

/// Resolves once the store says that the record under `slot` is gone or is not `mine` (another
/// holder, another incarnation, another tenure): removed from outside while this VVM leads. The
/// store's change feed of that one slot wakes it (on SQLite a file notification, on etcd a
/// watch of the key: no poll of the record of its own); each wake reads the record once, within
/// the store-call timeout. The feed is subscribed before each read, so a removal right after a
/// read that found our record is not missed; a read that fails or finds ours (a renewal, our
/// stopping mark) waits for the next change. A renewal's refusal (or the session's loss) stays
/// the fallback for a store without a feed, and for a read that did not answer.
pub(crate) fn record_vanished<S: LeaseStore>(
    store: Arc<S>,
    slot: Slot,
    mine: Mine,
    timeout: std::time::Duration,
) -> BoxFuture<()> {
    Box::pin(async move {
        loop {
            let change = store.changed(&[slot]);
            match tokio::time::timeout(timeout, store.get(slot)).await {
                Ok(Ok(None)) => return,
                Ok(Ok(Some(lease))) if !mine.is(&lease) => return,
                _ => {}
            }
            change.await;
        }
    })
}

/// Resolves when the watch of the record led resolves; pending while there is none, and after
/// it resolved once (the loss it reports ends the leading).
async fn own_record_vanished(watch: &mut Option<(Slot, BoxFuture<()>)>) {
    match watch.as_mut() {
        Some((_, vanished)) => {
            vanished.await;
            *watch = None;
        }
        None => std::future::pending().await,
    }
}

/// The next report of the pipeline; pending while there is none.
async fn report(pipeline: &mut Option<Pipeline>) -> Option<Report> {
    match pipeline.as_mut() {
        Some(pipeline) => pipeline.report().await,
        None => std::future::pending().await,
    }
}

impl<S: LeaseStore> Driver<S> {
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn new(
        machine: Lifecycle,
        exec: Executor<S>,
        config: VvmConfig,
        services: Services,
        timeouts: Timeouts,
        shutdown: oneshot::Receiver<()>,
        stop: CancellationToken,
        status: watch::Sender<Status>,
    ) -> Self {
        let names = services.names();
        let pacing = Pacing::new(config.round_interval(), Instant::from_nanos(u64::MAX));
        let mut exec = exec;
        if !exec.store().has_change_feed() {
            // Without a feed nothing tells of a release: rounds stay the bound on the wait.
            exec.cap_time_left(config.round_interval());
        }
        Driver {
            machine,
            exec,
            config,
            errors: vec![None; names.len()],
            names,
            services: Some(services),
            timeouts,
            pipeline: None,
            shutdown: Some(shutdown),
            stop: Some(stop),
            status,
            queued: VecDeque::with_capacity(QUEUED_MAX),
            changes: None,
            own_record: None,
            refusals: Refusals::default(),
            describing: false,
            pacing,
            out: Effects::new(),
            outcome: None,
            session_start: None,
            session: None,
            session_lost: None,
            session_deadlines: None,
            opener: None,
            reopen: None,
        }
    }

    /// Holds the slot as a holding of the session `start` gives, at launch.
    pub(crate) fn on_session(mut self, start: SessionStart) -> Self {
        self.session_start = Some(start);
        self
    }

    /// Gets the session of a VVM on a session; the error when its own could not be opened.
    async fn start_session(&mut self) -> Result<(), VvmError> {
        let side = match self.session_start.take() {
            None => return Ok(()),
            Some(SessionStart::Shared(side)) => side,
            Some(SessionStart::Own(opener)) => {
                let opened = opener(self.config.acquisition()).await;
                self.opener = Some(opener);
                opened.map_err(|error| VvmError::SessionNotOpened {
                    source: crate::Cause::new(error),
                })?
            }
        };
        self.install_session(side);
        Ok(())
    }

    /// Executes the store effects on `side` from now on and watches its loss and deadline.
    fn install_session(&mut self, side: Arc<dyn SessionSide>) {
        self.exec.on_session(side.clone());
        let deadlines = side.kill_deadlines();
        self.status
            .send_modify(|status| status.deadline = *deadlines.borrow());
        self.session_lost = Some(side.lost());
        self.session_deadlines = Some(deadlines);
        self.session = Some(OnSession { side, clean: false });
    }

    /// The own session was lost while the VVM campaigned, holding nothing: a fresh one is opened
    /// within what is left of the acquisition (`Effect::OpenSession`, V27/V28). Nothing of this
    /// VVM acted under the lost one — a holding its acquire may have won after the loss is
    /// dropped as never used — so, with nothing attached, the lost session's kill deadline is
    /// gone (`Session.NothingActingNoDeadline`) and the process is not ended by it.
    async fn reopen_session(&mut self, until: Instant) -> VvmEvent {
        self.exec.drop_unused_holding();
        self.session = None;
        self.session_lost = None;
        self.session_deadlines = None;
        let now = self.exec.now();
        let reason = vvm_core::LossReason::RenewalFailed;
        let Some(opener) = self.opener.as_ref() else {
            return VvmEvent::SessionLost { now, reason };
        };
        tracing::info!("the session was lost while campaigning; opening a fresh one");
        let open = opener(until.saturating_since(now));
        let opened = tokio::select! {
            opened = open => opened,
            () = shutdown_asked(&mut self.shutdown) => return VvmEvent::Shutdown { now: self.exec.now() },
            () = stop_asked(&mut self.stop) => return VvmEvent::Shutdown { now: self.exec.now() },
        };
        let now = self.exec.now();
        match opened {
            Ok(side) => {
                self.install_session(side);
                VvmEvent::SessionOpened { now }
            }
            Err(error) => {
                tracing::warn!(error = %crate::ErrorChain(&error), "no fresh session opened before the acquisition's end");
                VvmEvent::SessionLost { now, reason }
            }
        }
    }

    /// A VVM on a session is done with it: the holding (released already, or lost) is dropped,
    /// which detaches it, then the session is closed or abandoned (see `SessionSide::finish`).
    async fn finish_session(&mut self) {
        if let Some(session) = self.session.take() {
            let _ = self.exec.take_holding();
            session.side.finish(session.clean).await;
            self.session_lost = None;
            self.session_deadlines = None;
        }
    }

    /// Runs the VVM from launch to the end of its shutdown; returns the first problem.
    pub(crate) async fn run(mut self, span: tracing::Span) -> Result<(), VvmError> {
        async move {
            if let Err(error) = self.start_session().await {
                tracing::warn!(error = %crate::ErrorChain(&error), "not launched");
                self.status.send_modify(|status| {
                    status.problem = Some(error.clone());
                    status.finished = true;
                });
                return Err(error);
            }
            let now = self.exec.now();
            let until = now.saturating_add(self.config.acquisition());
            self.pacing = Pacing::new(self.config.round_interval(), until);
            self.feed(VvmEvent::Launch { now });
            loop {
                if let Some(outcome) = self.outcome.take() {
                    self.drain_pipeline().await;
                    self.finish_session().await;
                    self.status.send_modify(|status| status.finished = true);
                    return outcome;
                }
                let event = match self.queued.pop_front() {
                    Some(event) => event,
                    None => match self.next_event().await {
                        Woken::Event(event) => event,
                        Woken::DeadlineMoved => {
                            self.publish_deadline();
                            continue;
                        }
                    },
                };
                self.feed(event);
                if let Some(until) = self.reopen.take() {
                    let event = self.reopen_session(until).await;
                    self.queue(event);
                }
                if self.describing {
                    self.raise_acquisition_failed().await;
                }
            }
        }
        .instrument(span)
        .await
    }

    /// Raises the acquisition error once the holders of the refused slots are read; an outcome
    /// already settled on the bare error gets this one instead.
    async fn raise_acquisition_failed(&mut self) {
        self.describing = false;
        let timeout = self.config.lease().store_timeout();
        self.refusals.read_holders(self.exec.store(), timeout).await;
        let error = self.error(Problem::AcquisitionFailed);
        tracing::warn!(error = %crate::ErrorChain(&error), "problem raised");
        if let Some(Err(VvmError::AcquisitionFailed { .. })) = &self.outcome {
            self.outcome = Some(Err(error.clone()));
        }
        self.status.send_modify(|status| {
            status.problem.get_or_insert(error);
        });
    }

    /// The machine stops services before it finishes; should a pipeline still exist anyway, it
    /// is stopped and awaited here so that no service outlives the driver.
    async fn drain_pipeline(&mut self) {
        if let Some(mut pipeline) = self.pipeline.take() {
            tracing::error!("finished with services still running; stopping them");
            pipeline.stop();
            while pipeline.report().await.is_some() {}
            pipeline.join().await;
        }
    }

    async fn next_event(&mut self) -> Woken {
        let event = tokio::select! {
            // A loss first: a reply that arrived with it must not start services (V19, H9).
            biased;
            reason = session_lost(&mut self.session_lost) => VvmEvent::SessionLost { now: self.exec.now(), reason },
            () = deadline_moved(&mut self.session_deadlines) => return Woken::DeadlineMoved,
            wake = self.exec.next() => match wake {
                Wake::Reply { op, reply } => VvmEvent::Reply { now: self.exec.now(), op, reply },
                Wake::Timer(timer) => VvmEvent::Timer { now: self.exec.now(), timer },
            },
            () = shutdown_asked(&mut self.shutdown) => VvmEvent::Shutdown { now: self.exec.now() },
            () = stop_asked(&mut self.stop) => VvmEvent::Shutdown { now: self.exec.now() },
            () = slot_changed(&mut self.changes) => VvmEvent::SlotChanged { now: self.exec.now() },
            () = own_record_vanished(&mut self.own_record) => {
                tracing::warn!("the record of the slot led is gone or names another holder: removed from outside");
                VvmEvent::RecordVanished { now: self.exec.now() }
            }
            report = report(&mut self.pipeline) => self.on_report(report).await,
        };
        Woken::Event(event)
    }

    /// The session's kill deadline moved: services read it from the status.
    fn publish_deadline(&mut self) {
        if let Some(deadlines) = self.session_deadlines.as_mut() {
            let deadline = *deadlines.borrow_and_update();
            self.status.send_if_modified(|status| {
                let changed = deadline.is_some() && status.deadline != deadline;
                if changed {
                    status.deadline = deadline;
                }
                changed
            });
        }
    }

    async fn on_report(&mut self, report: Option<Report>) -> VvmEvent {
        let now = self.exec.now();
        match report {
            Some(Report::Started) => VvmEvent::ServicesStarted { now },
            Some(Report::Failed { index, error }) => {
                if let Some(slot) = self.errors.get_mut(usize::from(index)) {
                    slot.get_or_insert(error);
                }
                VvmEvent::ServiceFailed { now, index }
            }
            Some(Report::Stopped { clean }) => {
                if let Some(mut pipeline) = self.pipeline.take() {
                    pipeline.join().await;
                }
                // Published with the transition it causes (see `feed`).
                VvmEvent::ServicesStopped { now, clean }
            }
            // The pipeline ends only after reporting `Stopped`, and is dropped then: ending
            // without that report means its task vanished (a panic). Its services were
            // aborted as it unwound; nothing of that stop can be vouched for.
            None => {
                if let Some(mut pipeline) = self.pipeline.take() {
                    pipeline.join().await;
                }
                tracing::error!("the service pipeline ended without reporting; services aborted");
                VvmEvent::ServicesStopped { now, clean: false }
            }
        }
    }

    /// Hands `event` to the machine and executes its effects. Everything the transition
    /// changes in the [`Status`] (phase, token, deadline, running, problem, ...) is published in
    /// one step after the effects, so that no observer — `launch` waiting for "running", a
    /// subscriber, a service — ever sees one part of a transition without the rest. Services
    /// are started or asked to stop only after that publication: they see their token and
    /// deadline from the start, and a loss before the request to stop.
    fn feed(&mut self, event: VvmEvent) {
        if let (VvmEvent::ServicesStopped { clean: false, .. }, Some(session)) =
            (event, self.session.as_ref())
        {
            // Nobody vouches for what ran: from now on the session's deadline must not move
            // later, so it is given up before the release (it keeps the holding's record live
            // for the delete until it expires).
            session.side.abandon();
        }
        self.out.clear();
        self.machine.handle(&event, &mut self.out);
        let phase = self.machine.phase();
        tracing::debug!(?event, ?phase, effects = ?self.out.as_slice(), "transition");
        // Before the feed is watched: a round with a failed store call stops the watch.
        let stretched = self.pacing.note(event.now(), self.out.as_slice());
        // Before the effects: an insert about to be sent is covered by the feed.
        self.watch_slots();
        self.watch_own_record();
        let mut next = self.status.borrow().clone();
        if matches!(event, VvmEvent::ServicesStopped { .. }) {
            next.services_running = false;
        }
        let mut services = ServiceActions::default();
        let effects = self.out.clone();
        for effect in &effects {
            let effect = match (*effect, stretched) {
                (Effect::SetTimer { timer, .. }, Some(at)) if timer.kind == TimerKind::Round => {
                    Effect::SetTimer { timer, at }
                }
                (effect, _) => effect,
            };
            if let (Effect::DisarmKiller, Some(session)) = (effect, self.session.as_mut()) {
                // The session's deadline is the session's to remove: the lifecycle vouches that
                // nothing of this VVM acts any more, so the session may close cleanly.
                session.clean = true;
                continue;
            }
            if !self.exec.execute(&effect) {
                self.notify(&effect, &mut next, &mut services);
            }
        }
        next.phase = phase;
        next.deadline = self.exec.deadline().or(next.deadline);
        self.status.send_if_modified(|status| {
            let changed = *status != next;
            *status = next;
            changed
        });
        if let Some(start) = services.start {
            let tenure = self.status.subscribe();
            self.pipeline = Some(Pipeline::start(start, tenure, self.timeouts));
        }
        if services.stop {
            if let Some(pipeline) = self.pipeline.as_mut() {
                pipeline.stop();
            }
        }
    }

    /// While acquiring, watches every slot's feed so that a change starts the next round at
    /// once (`SlotChanged`); otherwise watches nothing. It is called after the machine handled
    /// an event and *before* its effects run, so the feed exists before the insert it covers is
    /// sent: a change between the store's refusal and the wait is never missed. A feed that
    /// fired is subscribed afresh at the next event (the one it caused), before that event's
    /// inserts.
    ///
    /// While the store fails, nothing is watched: a failing store's feed cannot tell what
    /// happened and would only start rounds faster than the backoff.
    fn watch_slots(&mut self) {
        if !self.machine.watches_slots() || self.pacing.failing() {
            self.changes = None;
        } else if self.changes.is_none() {
            let slots: Vec<Slot> = (1..=self.config.slots()).map(Slot).collect();
            self.changes = Some(self.exec.store().changed_for_candidate(&slots));
        }
    }

    /// While the machine leads (`watches_own_record`), on a lease or on a session, watches the
    /// record of the slot it leads, so that a removal from outside is a loss at once
    /// (`RecordVanished`, V6b); otherwise watches nothing.
    fn watch_own_record(&mut self) {
        match self.machine.watches_own_record() {
            Some(slot) => {
                if self
                    .own_record
                    .as_ref()
                    .is_none_or(|(watched, _)| *watched != slot)
                {
                    let timeout = self.config.lease().store_timeout();
                    let mine = match (self.machine.is_on_session(), self.machine.token()) {
                        (true, Some(token)) => Mine::Revision(token.revision),
                        _ => Mine::Value(self.exec.own().clone()),
                    };
                    let watch = record_vanished(self.exec.shared_store(), slot, mine, timeout);
                    self.own_record = Some((slot, watch));
                }
            }
            None => self.own_record = None,
        }
    }

    /// Acts on a notification; what it changes in the status goes to `next` and what it asks of
    /// the services to `services`, both carried out by [`feed`](Self::feed).
    fn notify(&mut self, effect: &Effect, next: &mut Status, services: &mut ServiceActions) {
        #[cfg(feature = "metrics")]
        crate::metrics::notified(effect);
        match *effect {
            Effect::Acquired { token } => {
                tracing::Span::current().record("slot", token.slot.0);
                tracing::info!(
                    slot = token.slot.0,
                    fencing_token = %token,
                    "leadership acquired"
                );
                next.token = Some(token);
            }
            Effect::Renewed { token } => {
                tracing::debug!(fencing_token = %token, "lease renewed");
                next.token = Some(token);
            }
            Effect::NotAcquired { slot, refusal } => {
                tracing::debug!(slot = slot.0, ?refusal, "slot not acquired");
                let failure = self.exec.failures().take(slot);
                self.refusals.note(slot, refusal, failure);
            }
            Effect::Lost { slot, reason } => {
                // Logged here, before the deadline: the killer itself never logs.
                let deadline_ns = self.exec.deadline().map(|at| at.as_nanos());
                let left_ms = self
                    .exec
                    .deadline()
                    .map(|at| at.saturating_since(self.exec.now()).as_millis());
                tracing::warn!(
                    slot = slot.0,
                    ?reason,
                    deadline_ns,
                    left_ms,
                    "leadership lost; stopping services, the process ends at the kill deadline if they have not stopped"
                );
                next.lost = true;
            }
            Effect::Released { slot, deleted } => {
                // The token of this VVM's tenure stays in its status once acquired.
                let held = next.token.map(|token| token.slot);
                crate::status::log_released(slot, deleted, held);
            }
            Effect::StartServices { token } => {
                tracing::debug!(fencing_token = %token, "starting services");
                services.start = Some(self.services.take().unwrap_or_default());
                next.services_running = true;
            }
            Effect::StopServices => {
                next.stopping = true;
                self.exec.mark_stopping();
                match self.pipeline {
                    Some(_) => services.stop = true,
                    None => {
                        // Services not started yet (or none) have nothing to stop.
                        if services.start.take().is_some() {
                            next.services_running = false;
                        }
                        self.queue(VvmEvent::ServicesStopped {
                            now: self.exec.now(),
                            clean: true,
                        });
                    }
                }
            }
            Effect::Running { token } => {
                tracing::info!(slot = token.slot.0, "running");
                next.running = true;
            }
            Effect::ProblemRaised {
                problem: Problem::AcquisitionFailed,
            } if self.status.borrow().problem.is_none() => {
                // Raised once the holders are read (see `run`), with their names.
                self.describing = true;
            }
            Effect::ProblemRaised { problem } => {
                let error = self.error(problem);
                tracing::warn!(error = %crate::ErrorChain(&error), "problem raised");
                next.problem.get_or_insert(error);
            }
            Effect::MonitorStopped => tracing::debug!("leadership monitor stopped"),
            Effect::OpenSession { until } => self.reopen = Some(until),
            Effect::Finished { problem } => {
                let outcome = match problem {
                    None => Ok(()),
                    Some(problem) => {
                        Err(next.problem.clone().unwrap_or_else(|| self.error(problem)))
                    }
                };
                // The problem was logged when raised; here only its one-line chain, never the
                // `Debug` text of the outcome.
                match &outcome {
                    Ok(()) => tracing::info!("shut down"),
                    Err(error) => {
                        tracing::info!(problem = %crate::ErrorChain(error), "shut down");
                    }
                }
                self.outcome = Some(outcome);
            }
            _ => tracing::error!(?effect, "effect not executed by the VVM driver"),
        }
    }

    fn queue(&mut self, event: VvmEvent) {
        if self.queued.len() < QUEUED_MAX {
            self.queued.push_back(event);
        } else {
            tracing::error!(?event, "driver queue full; event dropped");
        }
    }

    /// The host-facing error of a core problem, with the service's own message where relevant.
    fn error(&self, problem: Problem) -> VvmError {
        let service = |index: u16| {
            let name = self
                .names
                .get(usize::from(index))
                .map_or("?".into(), |n| n.to_string());
            // The pipeline records the error before it reports the failure; a missing one would
            // be a bug, told as such rather than hidden behind an empty message.
            let source = self
                .errors
                .get(usize::from(index))
                .and_then(Option::clone)
                .unwrap_or_else(|| ServiceError::new("(the service's error was not recorded)"));
            (name, source)
        };
        match problem {
            Problem::AcquisitionFailed => VvmError::AcquisitionFailed {
                slots: self.config.slots(),
                acquisition: self.config.acquisition(),
                refusals: self.refusals.list(),
            },
            Problem::LeadershipLost { slot, reason } => VvmError::LeadershipLost { slot, reason },
            Problem::ServicesVanished => VvmError::ServicesVanished,
            Problem::ServiceStartFailed { index } => {
                let (name, source) = service(index);
                VvmError::ServiceStartFailed {
                    index,
                    name,
                    source,
                }
            }
            Problem::ServiceFailed { index } => {
                let (name, source) = service(index);
                VvmError::ServiceFailed {
                    index,
                    name,
                    source,
                }
            }
        }
    }
}
