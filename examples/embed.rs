//! A service author's whole use of vvm: one service that works only while this process leads
//! slot 1 of 1, shut down on Ctrl-C or after a few seconds. Run with `cargo run --example embed`.

use std::time::Duration;

use vvm::{Service, ServiceContext, ServiceError, Services, Vvm, VvmConfig};
use vvm_adapters::MemoryStore;

/// Writes one heartbeat a second, guarded by the fencing token, until asked to stop.
struct Heartbeat;

impl Service for Heartbeat {
    async fn run(self, mut context: ServiceContext) -> Result<(), ServiceError> {
        let Some(token) = context.token() else {
            return Err(ServiceError::new("started without a valid fencing token"));
        };
        context.ready();
        let mut shutdown = context.shutdown();
        let mut tick = tokio::time::interval(Duration::from_secs(1));
        loop {
            tokio::select! {
                () = shutdown.requested() => return Ok(()),
                _ = tick.tick() => tracing::info!(slot = token.slot.0, revision = token.revision.0, "heartbeat"),
            }
        }
    }
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    // Colours only for a person at a terminal: a pipe or a file gets plain text, and `NO_COLOR`
    // turns them off everywhere (https://no-color.org).
    let colour = std::io::IsTerminal::is_terminal(&std::io::stdout())
        && std::env::var_os("NO_COLOR").is_none_or(|value| value.is_empty());
    tracing_subscriber::fmt()
        .with_max_level(tracing::Level::INFO)
        .with_ansi(colour)
        .init();
    let config = VvmConfig::builder("127.0.0.1:7000").lease(Duration::from_secs(10));
    let services = Services::new().with(Heartbeat)?;
    let vvm = Vvm::provide(config, MemoryStore::new(), services)?
        .launch()
        .await;
    tokio::select! {
        problem = vvm.problem() => tracing::error!(%problem, "problem"),
        _ = tokio::signal::ctrl_c() => tracing::info!("interrupted"),
        () = tokio::time::sleep(Duration::from_secs(3)) => tracing::info!("done"),
    }
    vvm.shutdown().await?;
    Ok(())
}
