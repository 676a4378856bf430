//! `vvm run`: one VVM with a demo service, until SIGINT/SIGTERM or a problem.

use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use tokio::signal::unix::{signal, SignalKind};
use vvm::{Service, ServiceContext, ServiceError, Services, Vvm, VvmConfig};

use super::clock::host_monotonic_ns;
use super::store::{open_store, AnyStore};
use super::{fail, usage_error, RunArgs};

/// How often the demo service says it leads.
const REPORT_INTERVAL: Duration = Duration::from_secs(1);
/// How often the demo service appends to the acting log.
const ACTING_INTERVAL: Duration = Duration::from_millis(20);

/// The demo service: while it runs (that is, while its VVM leads) it prints its fencing token
/// every second and, when asked, appends `<host monotonic ns> <pid> <slot> <revision>` to an
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
        let token = context.token();
        let mut log = match &self.acting_log {
            Some(path) => Some(
                std::fs::OpenOptions::new()
                    .create(true)
                    .append(true)
                    .open(path)
                    .map_err(|e| {
                        ServiceError::new(format!("acting log {}: {e}", path.display()))
                    })?,
            ),
            None => None,
        };
        let pid = std::process::id();
        let append = |log: &mut Option<std::fs::File>| -> Result<(), ServiceError> {
            if let Some(file) = log {
                let line = format!(
                    "{} {pid} {} {}\n",
                    host_monotonic_ns(),
                    token.slot.0,
                    token.revision.0
                );
                // One write per line: appends of one line are not interleaved between processes.
                file.write_all(line.as_bytes())
                    .map_err(|e| ServiceError::new(format!("acting log: {e}")))?;
            }
            Ok(())
        };
        append(&mut log)?;
        context.ready();
        let mut shutdown = context.shutdown();
        let mut report = tokio::time::interval(REPORT_INTERVAL);
        let mut acting = tokio::time::interval(ACTING_INTERVAL);
        loop {
            tokio::select! {
                _ = shutdown.requested() => return Ok(()),
                _ = report.tick() => println!(
                    "leading slot={} revision={} address={} pid={pid}",
                    token.slot.0, token.revision.0, self.address
                ),
                _ = acting.tick(), if log.is_some() => append(&mut log)?,
            }
        }
    }
}

/// A default address that tells processes of one host apart.
fn default_address() -> String {
    let host = std::fs::read_to_string("/etc/hostname")
        .ok()
        .map(|h| h.trim().to_owned())
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "localhost".to_owned());
    format!("{host}/pid-{}", std::process::id())
}

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
        Err(e) => return usage_error(&e.to_string()),
    };
    let store = match open_store(&args.store, config.lease()).await {
        Ok(store) => store,
        Err(e) => return e.exit(),
    };
    let service = DemoService {
        address,
        acting_log: args.acting_log.clone(),
    };
    run_vvm(config, store, service).await
}

async fn run_vvm(config: VvmConfig, store: AnyStore, service: DemoService) -> ExitCode {
    let services = match Services::new().with(service) {
        Ok(services) => services,
        Err(e) => return fail(&e.to_string()),
    };
    let vvm = match Vvm::provide(config, store, services) {
        Ok(vvm) => vvm,
        Err(e) => return usage_error(&e.to_string()),
    };
    let (mut terminate, mut interrupt) = match (
        signal(SignalKind::terminate()),
        signal(SignalKind::interrupt()),
    ) {
        (Ok(t), Ok(i)) => (t, i),
        (Err(e), _) | (_, Err(e)) => return fail(&format!("cannot listen for signals: {e}")),
    };
    tracing::info!("launching");
    let vvm = vvm.launch().await;
    tokio::select! {
        _ = vvm.problem() => {}
        _ = terminate.recv() => tracing::info!("SIGTERM: shutting down"),
        _ = interrupt.recv() => tracing::info!("SIGINT: shutting down"),
    }
    match vvm.shutdown().await {
        Ok(()) => {
            tracing::info!("shut down cleanly");
            ExitCode::SUCCESS
        }
        Err(problem) => fail(&problem.to_string()),
    }
}
