//! `vvm run --semaphore NAME --count K`: the demo service or a command run under a grant of `K`
//! units of a semaphore instead of a slot's leadership, so that at most the semaphore's limit in
//! units run at once across every `vvm` on the store.
//!
//! The process opens one session (one keepalive every `L/4`, one kill deadline on the killer:
//! the command's process group for a command), queues for the units in order of arrival with
//! this run's address as its data (so `vvm semaphore describe` lists who runs), and runs the
//! service under the grant ([`vvm::SemaphoreGrant::serve`]): the command gets `VVM_SLOT=0` and
//! `VVM_FENCING_TOKEN=0:<the grant's number>` (the grant's token), its supervisor follows the session's kill deadline, and
//! on SIGINT/SIGTERM, the command's clean exit or the end of the grant the command stops first,
//! then the grant is released, then the session closed.

use std::process::ExitCode;
use std::sync::Arc;

use tokio::sync::Notify;
use vvm::{
    coordination::{CoordinationError, ServeError, ServeTimeouts},
    new_incarnation,
    session::{LeaseValue, SessionError},
    AcquireOptions, Coordination, KillerThread, Service, Services, SessionHandle, VvmConfig,
};

use super::host::{listen_for_signals, Host};
use super::store::AnyStore;
use super::systemd::Notifier;
use super::{error_chain, fail};

/// Pause between two tries to close a session whose last request is being withdrawn.
const CLOSE_RETRY: std::time::Duration = std::time::Duration::from_millis(10);

/// What the semaphore run takes.
pub(super) struct Units {
    /// The semaphore.
    pub(super) name: String,
    /// Units of it.
    pub(super) count: u64,
    /// Create it with this limit when it does not exist (`--limit`).
    pub(super) limit: Option<u64>,
    /// Make it an ephemeral one when it does not exist (`--ephemeral`).
    pub(super) ephemeral: bool,
}

/// Runs `service` under a grant of `units`; the exit code follows `vvm run`'s.
pub(super) async fn run_semaphore(
    units: Units,
    config: VvmConfig,
    store: AnyStore,
    service: impl Service,
    host: Host,
) -> ExitCode {
    let address = config.address().to_owned();
    let killer = host.killer.clone().unwrap_or_else(KillerThread::global);
    let stop = Arc::new(Notify::new());
    let stop_signal = stop.clone();
    let (signals, mut signalled) =
        match listen_for_signals(move || stop_signal.notify_one(), host.force.clone()) {
            Ok(listening) => listening,
            Err(code) => return code,
        };
    let services = match Services::new().with(service) {
        Ok(services) => services,
        Err(e) => return fail(&error_chain(&e)),
    };
    let value = LeaseValue::new(address.clone(), new_incarnation());
    let session = tokio::select! {
        // A store blip while it opens is ridden out within the acquisition window.
        opened = SessionHandle::open_within(Arc::new(store), *config.lease(), value, &killer, config.acquisition()) => match opened {
            Ok(session) => session,
            Err(e) => return fail(&format!("cannot open a session: {}", error_chain(&e))),
        },
        _ = &mut signalled => return super::host::clean_exit(),
    };
    let coordination = Coordination::new(session);
    let notifier = Arc::new(Notifier::from_env());
    let name = units.name.as_str();
    tracing::info!(
        semaphore = name,
        count = units.count,
        "waiting for units of the semaphore"
    );
    notifier.status(format!(
        "Waiting for {} of {name}",
        super::waiting::units_text(units.count)
    ));
    if let Some(limit) = units.limit {
        if let Err(e) = super::semaphore::create_if_missing(&coordination, name, limit, b"").await {
            close(&coordination, config.lease()).await;
            return fail(&format!(
                "cannot create semaphore {name}: {}",
                error_chain(&e)
            ));
        }
    }
    let mut options = AcquireOptions::new(units.count)
        .data(address.into_bytes())
        .timeout(config.acquisition());
    if units.ephemeral {
        options = options.ephemeral();
    }
    let acquired = {
        let waiting = super::waiting::report_queue(
            coordination.clone(),
            name.to_owned(),
            coordination.session().key(),
            &notifier,
        );
        tokio::select! {
            acquired = coordination.acquire(name, options) => Some(acquired),
            // Dropping the acquire withdraws the request; nothing was started.
            _ = &mut signalled => None,
            // Never resolves: it only logs while the acquire waits.
            () = waiting => None,
        }
    };
    let Some(acquired) = acquired else {
        close(&coordination, config.lease()).await;
        return super::host::clean_exit();
    };
    let grant = match acquired {
        Ok(Some(grant)) => grant,
        Ok(None) => {
            close(&coordination, config.lease()).await;
            super::log::line(&format!(
                "{} of semaphore {name} {} not granted within --acquire: held by others",
                super::waiting::units_text(units.count),
                if units.count == 1 { "was" } else { "were" }
            ));
            return ExitCode::from(host.busy_code);
        }
        Err(CoordinationError::NotFound(_)) => {
            close(&coordination, config.lease()).await;
            return fail(&format!(
                "semaphore {name} does not exist: give --limit N to create it, or create it \
                 first, e.g. `vvm semaphore create {name} --limit 2`"
            ));
        }
        Err(e) => {
            close(&coordination, config.lease()).await;
            return fail(&format!(
                "cannot acquire semaphore {name}: {}",
                error_chain(&e)
            ));
        }
    };
    tracing::info!(
        semaphore = name,
        count = units.count,
        fencing_token = %grant.token(),
        "granted"
    );
    notifier.ready(format!(
        "Holding {} of {name} (fencing token {})",
        super::waiting::units_text(units.count),
        grant.token()
    ));
    let watchdog = notifier.watchdog_enabled().then(|| {
        tokio::spawn(ping_on_keepalive(
            coordination.session().kill_deadlines(),
            notifier.clone(),
        ))
    });
    let finished = host.finished.clone();
    let stopping = notifier.clone();
    let stop_asked = async move {
        let finished = async {
            match &finished {
                Some(finished) => finished.notified().await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            () = stop.notified() => {}
            () = finished => {}
        }
        stopping.stopping();
    };
    let timeouts = ServeTimeouts {
        start: vvm::services::START_TIMEOUT_DEFAULT,
        stop: host.stop_timeout,
    };
    let outcome = grant.serve(services, timeouts, stop_asked).await;
    if let Some(watchdog) = watchdog {
        watchdog.abort();
    }
    signals.abort();
    notifier.flush().await;
    match outcome {
        Ok(()) => {
            close(&coordination, config.lease()).await;
            tracing::info!("shut down cleanly");
            super::host::clean_exit()
        }
        Err(problem) => {
            // After an unclean stop the session must not close cleanly (its deadline stays
            // armed); the process ends now, and the record expires within the lease.
            if !matches!(problem, ServeError::UncleanStop) {
                close(&coordination, config.lease()).await;
            }
            let code = fail(&error_chain(&problem));
            match host
                .status
                .as_ref()
                .and_then(super::exec::CommandStatus::code)
            {
                Some(status) => ExitCode::from(status),
                None => super::host::interrupted_or(code),
            }
        }
    }
}

/// Closes the session, logging a close that did not delete its record (it then expires). A
/// request withdrawn in the background (an acquire ended by a signal) detaches its holding
/// only after its store call: the close is tried again until then, within a store-call timeout.
async fn close(coordination: &Coordination<Arc<AnyStore>>, lease: &vvm::LeaseConfig) {
    let session = coordination.session();
    let give_up = tokio::time::Instant::now() + lease.store_timeout();
    loop {
        match session.close().await {
            Ok(true) => return tracing::debug!("session closed"),
            Ok(false) => return tracing::info!("the session record had gone already"),
            Err(SessionError::HoldingsRemain { .. }) if tokio::time::Instant::now() < give_up => {
                tokio::time::sleep(CLOSE_RETRY).await;
            }
            Err(e) => {
                return tracing::warn!(error = %error_chain(&e), "the session was not closed; its record expires")
            }
        }
    }
}

/// Pings systemd's watchdog at every confirmed keepalive (each one moves the kill deadline
/// later).
async fn ping_on_keepalive(
    mut deadlines: tokio::sync::watch::Receiver<Option<vvm_core::Instant>>,
    notifier: Arc<Notifier>,
) {
    let mut last = *deadlines.borrow_and_update();
    while deadlines.changed().await.is_ok() {
        let deadline = *deadlines.borrow_and_update();
        if deadline > last {
            notifier.watchdog();
        }
        last = deadline;
    }
}
