//! `vvm run`: one VVM with a demo service or a command (see `exec`), until SIGINT/SIGTERM, a
//! problem, or the command's clean exit.

use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use std::sync::Arc;

use vvm::services::{START_TIMEOUT_DEFAULT, STOP_TIMEOUT_DEFAULT};
use vvm::{KillerThread, Service, ServiceContext, ServiceError, Services, Vvm, VvmConfig};

use super::clock::host_monotonic_ns;
use super::exec::{CommandStatus, ExecHooks, ExecService, GroupKiller};
use super::host::{listen_for_signals, Host};
use super::run_semaphore::{run_semaphore, Units};
use super::store::{open_store_waiting, AnyStore};
use super::systemd::Notifier;
use super::{fail, usage_error, RunArgs};

/// The file the demo service appends its acting lines to (see [`DemoService`]): for the tests
/// and checkers that prove no two processes acted at once.
pub const ACTING_LOG_VARIABLE: &str = "VVM_ACTING_LOG";

/// How often the demo service says it leads.
const REPORT_INTERVAL: Duration = Duration::from_secs(1);
/// How often the demo service appends to the acting log.
const ACTING_INTERVAL: Duration = Duration::from_millis(20);

/// The demo service: while it runs (that is, while its VVM leads) it prints its fencing token
/// every second and, when asked, appends `<host monotonic ns> <pid> <fencing token>` to an
/// acting log that a checker can use to prove no two processes acted on one slot at once.
struct DemoService {
    address: String,
    acting_log: Option<PathBuf>,
}

impl Service for DemoService {
    fn name(&self) -> std::borrow::Cow<'static, str> {
        "demo".into()
    }

    async fn run(self, mut context: ServiceContext) -> Result<(), ServiceError> {
        if context.token().is_none() {
            return Err(ServiceError::new("no valid fencing token at start"));
        }
        let mut log = match &self.acting_log {
            Some(path) => Some(
                std::fs::OpenOptions::new()
                    .create(true)
                    .append(true)
                    .open(path)
                    .map_err(|e| {
                        let what = format!("cannot open the acting log {}", path.display());
                        ServiceError::with_source(what, e)
                    })?,
            ),
            None => None,
        };
        let pid = std::process::id();
        // A line is written only with a token that is still valid (not lost, before the kill
        // deadline): that is what acting as leader means for this service.
        let append = |log: &mut Option<std::fs::File>,
                      context: &ServiceContext|
         -> Result<(), ServiceError> {
            let Some(token) = context.token() else {
                return Ok(());
            };
            if let Some(file) = log {
                let line = format!("{} {pid} {token}\n", host_monotonic_ns());
                // One write per line: appends of one line are not interleaved between processes.
                file.write_all(line.as_bytes())
                    .map_err(|e| ServiceError::with_source("cannot append to the acting log", e))?;
            }
            Ok(())
        };
        append(&mut log, &context)?;
        context.ready();
        let mut shutdown = context.shutdown();
        let mut report = tokio::time::interval(REPORT_INTERVAL);
        let mut acting = tokio::time::interval(ACTING_INTERVAL);
        loop {
            tokio::select! {
                _ = shutdown.requested() => return Ok(()),
                // Not `println!`, which panics when standard output is a closed pipe.
                _ = report.tick() => if let Some(token) = context.token() {
                    let _ = writeln!(
                        std::io::stdout(),
                        "leading slot={} fencing_token={token} address={} pid={pid}",
                        token.slot.0, self.address
                    );
                },
                _ = acting.tick(), if log.is_some() => append(&mut log, &context)?,
            }
        }
    }
}

/// A default address that tells processes of one host apart.
fn default_address() -> String {
    // The kernel's node name (uname), which is what /etc/hostname sets at boot.
    let uname = rustix::system::uname();
    let host = uname.nodename().to_string_lossy().trim().to_owned();
    let host = if host.is_empty() {
        "localhost".to_owned()
    } else {
        host
    };
    format!("{host}/pid-{}", std::process::id())
}

/// Time the exec service has beyond `--grace` to reap its command before the pipeline gives up
/// on it and aborts its task.
const STOP_MARGIN: Duration = Duration::from_secs(5);

/// Runs `vvm run`.
pub async fn run(args: RunArgs) -> ExitCode {
    let address = args.address.clone().unwrap_or_else(default_address);
    let config = match VvmConfig::builder(address.clone())
        .slots(args.slots)
        .lease(args.lease)
        .acquisition(args.acquire)
        .round_interval(args.round)
        .build()
    {
        Ok(config) => config,
        Err(e) => {
            let command = <crate::Cli as clap::CommandFactory>::command();
            let argv: Vec<std::ffi::OsString> = std::env::args_os().collect();
            let name = |long: &str| super::args::source(&command, &argv, long);
            return usage_error(&super::args::config_error(&e, name));
        }
    };
    // A command that cannot be started must not take a slot, nor even open the store.
    if let Some(program) = args.command.first() {
        if let Err(e) = super::program::check(program, std::env::var_os("PATH")) {
            super::log::line(&e.to_string());
            return ExitCode::from(e.exit_code());
        }
    }
    // `--containment strict` is a promise about the command's tree: refused before campaigning.
    if !args.command.is_empty()
        && matches!(
            args.containment,
            super::exec::ContainmentMode::Strict | super::exec::ContainmentMode::Cgroup
        )
    {
        if let Err(e) = super::supervise::cgroup::probe() {
            return fail(&format!(
                "--containment {}: {e}; run as root or in a delegated cgroup (systemd \
                 Delegate=yes), or use --containment auto",
                match args.containment {
                    super::exec::ContainmentMode::Cgroup => "cgroup",
                    _ => "strict",
                }
            ));
        }
    }
    let url = match super::store::resolve(args.store.as_deref(), true) {
        Ok(url) => url,
        Err(message) => return usage_error(&message),
    };
    // The first line says where: two `vvm run` meet only on one store.
    match &args.semaphore {
        Some(semaphore) => tracing::info!(
            store = %super::store::shown(&url),
            address = %config.address(),
            semaphore,
            count = args.count,
            lease = %humantime::format_duration(args.lease),
            "starting"
        ),
        None => tracing::info!(
            store = %super::store::shown(&url),
            address = %config.address(),
            slots = args.slots,
            lease = %humantime::format_duration(args.lease),
            "starting"
        ),
    }
    let store = match open_store_waiting(
        &url,
        config.lease(),
        args.store_unavailable,
        args.acquire,
        args.round,
    )
    .await
    {
        Ok(store) => store,
        Err(code) => return code,
    };
    if args.limit == Some(0) {
        return usage_error("--limit must be at least 1");
    }
    let units = args.semaphore.clone().map(|name| Units {
        name,
        count: args.count,
        limit: args.limit,
        ephemeral: args.ephemeral,
    });
    let ops = match args.metrics_addr {
        Some(addr) => match super::ops::start(addr, args.lease, args.slots).await {
            Ok(ops) => Some(ops.state),
            Err(e) => return fail(&e),
        },
        None => None,
    };
    // Test-only, so in no help, completion or manual page: a variable, not a flag.
    let acting_log = std::env::var_os(ACTING_LOG_VARIABLE)
        .filter(|path| !path.is_empty())
        .map(PathBuf::from);
    if acting_log.is_some() && (args.hold || !args.command.is_empty()) {
        return usage_error(&format!(
            "{ACTING_LOG_VARIABLE} is for the demo service only (no command, no --hold): unset it"
        ));
    }
    if args.hold {
        let host = Host {
            ops,
            busy_code: args.busy_code,
            ..Host::default()
        };
        return match units {
            Some(units) => {
                run_semaphore(units, config, store, super::hold::HoldService, host).await
            }
            None => run_vvm(config, store, super::hold::HoldService, host).await,
        };
    }
    if args.command.is_empty() {
        let service = DemoService {
            address,
            acting_log,
        };
        let host = Host {
            ops,
            busy_code: args.busy_code,
            ..Host::default()
        };
        return match units {
            Some(units) => run_semaphore(units, config, store, service, host).await,
            None => run_vvm(config, store, service, host).await,
        };
    }
    if let Err(e) = super::exec::become_subreaper() {
        return fail(&format!("cannot watch over the command's processes: {e}"));
    }
    let hooks = ExecHooks::default();
    let service = ExecService::new(
        args.command.clone(),
        args.grace,
        address,
        args.containment,
        hooks.clone(),
    );
    let host = Host {
        killer: Some(KillerThread::new(GroupKiller::new(hooks.group))),
        stop_timeout: STOP_TIMEOUT_DEFAULT.max(args.grace.saturating_add(STOP_MARGIN)),
        finished: Some(hooks.finished),
        force: Some(hooks.force),
        status: Some(hooks.status),
        ops,
        busy_code: args.busy_code,
    };
    match units {
        Some(units) => run_semaphore(units, config, store, service, host).await,
        None => run_vvm(config, store, service, host).await,
    }
}

/// The acquisition ended with every slot held by another live record: someone else runs, and
/// nothing failed (a store that failed, or a slot won too late, is a problem instead).
fn is_busy(problem: &vvm::VvmError) -> bool {
    match problem {
        vvm::VvmError::AcquisitionFailed { refusals, .. } => {
            !refusals.is_empty()
                && refusals.iter().all(|refusal| {
                    matches!(
                        refusal.reason,
                        vvm::lifecycle::RefusalReason::Held
                            | vvm::lifecycle::RefusalReason::HeldBy(_)
                    )
                })
        }
        _ => false,
    }
}

/// How often the host looks for a confirmed renewal to ping systemd's watchdog for: a sixteenth
/// of the lease (a quarter of the renewal interval), at least 10 ms.
fn renewal_poll(lease: Duration) -> Duration {
    (lease / 16).max(Duration::from_millis(10))
}

async fn run_vvm(
    config: VvmConfig,
    store: AnyStore,
    service: impl Service,
    host: Host,
) -> ExitCode {
    let lease = config.lease().lease();
    let slots = config.slots();
    let address = config.address().to_owned();
    // One connection for the VVM and for the log of who holds the slot while it waits.
    let store = Arc::new(store);
    let waiting_store = store.clone();
    let services = match Services::new().with(service) {
        Ok(services) => services,
        Err(e) => return fail(&super::error_chain(&e)),
    };
    // A death signal beside the TTL is a session's (`death=advisory-lock`): the slot is then held
    // on a session of its own, whose mark tells the others when this process died.
    let provided = if store.takes_session_marks() {
        Vvm::provide_on_session(config, store, services)
    } else {
        Vvm::provide(config, store, services)
    };
    let vvm = match provided {
        Ok(vvm) => vvm,
        Err(e) => return usage_error(&e.to_string()),
    };
    let mut vvm = vvm.with_service_timeouts(START_TIMEOUT_DEFAULT, host.stop_timeout);
    if let Some(killer) = host.killer {
        vvm = vvm.with_killer(killer);
    }
    // Signals are watched from before the launch: a stop during the campaign ends it at once
    // instead of after the acquisition window, and no service starts after the signal.
    let stop = vvm.stop_handle();
    let stop_requested = stop.clone();
    let (signals, mut signalled) = match listen_for_signals(move || stop.stop(), host.force.clone())
    {
        Ok(listening) => listening,
        Err(code) => return code,
    };
    let notifier = Notifier::from_env();
    tracing::info!("campaigning for a slot");
    notifier.status(format!("Campaigning for a slot of {slots}"));
    let vvm = {
        let waiting = super::waiting::report(waiting_store, slots, address, &notifier);
        let launch = vvm.launch();
        tokio::pin!(waiting, launch);
        tokio::select! {
            vvm = &mut launch => vvm,
            () = &mut waiting => launch.await,
        }
    };
    // Launch also returns after a failed campaign or a stop during it: ready only when leading.
    if let Some(token) = vvm.token() {
        if vvm.current_problem().is_none() && !stop_requested.is_stopped() {
            let since = humantime::format_rfc3339_seconds(std::time::SystemTime::now());
            notifier.ready(format!(
                "Leading slot {} since {since} (fencing token {token})",
                token.slot.0
            ));
        }
    }
    let problem = vvm.problem();
    tokio::pin!(problem);
    let finished = async {
        match &host.finished {
            Some(finished) => finished.notified().await,
            None => std::future::pending().await,
        }
    };
    tokio::pin!(finished);
    // The kill deadline moves later only on a confirmed write: each move is a renewal to ping
    // the watchdog for. Polled well within the renewal interval (L/4).
    let mut renewals = tokio::time::interval(renewal_poll(lease));
    renewals.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut last_deadline = vvm.kill_deadline();
    // `/healthz` and `/leader` answer from a copy refreshed as often as the watchdog polls.
    let mut ops_refresh = tokio::time::interval(renewal_poll(lease));
    ops_refresh.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    // Any of them ends the wait; a signal has already asked the VVM to stop through its handle.
    loop {
        tokio::select! {
            _ = &mut problem => break,
            _ = &mut signalled => break,
            _ = &mut finished => break,
            _ = renewals.tick(), if notifier.watchdog_enabled() => {
                let deadline = vvm.kill_deadline();
                if deadline > last_deadline && vvm.token().is_some() {
                    notifier.watchdog();
                }
                last_deadline = deadline;
            }
            _ = ops_refresh.tick(), if host.ops.is_some() => {
                if let Some(ops) = &host.ops {
                    ops.update(&vvm);
                    if let Some(status) = &host.status {
                        ops.set_command_stopped(status.stopped());
                    }
                }
            }
        }
    }
    if let Some(ops) = &host.ops {
        ops.stopping();
    }
    notifier.stopping();
    let outcome = vvm.shutdown().await;
    signals.abort();
    notifier.flush().await;
    match outcome {
        Ok(()) => {
            tracing::info!("shut down cleanly");
            super::host::clean_exit()
        }
        Err(problem) if is_busy(&problem) => {
            super::log::line(&super::error_chain(&problem));
            ExitCode::from(host.busy_code)
        }
        Err(problem) => {
            let code = fail(&super::error_chain(&problem));
            // The command's own failing status is passed on, as `flock` or `timeout` do.
            match host.status.as_ref().and_then(CommandStatus::code) {
                Some(status) => ExitCode::from(status),
                None => super::host::interrupted_or(code),
            }
        }
    }
}
