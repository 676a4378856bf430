//! `vvm status`: who holds each slot, read straight from the store.

use std::process::ExitCode;
use std::time::Duration;

use vvm::discovery::leaders;

use vvm::LeaseStore;

use super::store::open_store;
use super::{fail, StatusArgs};

/// Longest a read of one slot may take.
const READ_TIMEOUT: Duration = Duration::from_secs(5);

/// Runs `vvm status`.
pub async fn status(args: StatusArgs) -> ExitCode {
    let store = match open_store(&args.store, &vvm::LeaseConfig::default()).await {
        Ok(store) => store,
        Err(e) => return e.exit(),
    };
    let table = match leaders(&store, args.slots, READ_TIMEOUT).await {
        Ok(table) => table,
        Err(e) => return fail(&e.to_string()),
    };
    println!(
        "{:<6} {:<32} {:<18} {:>10} {:>10}",
        "slot", "holder", "incarnation", "revision", "time left"
    );
    for row in table {
        match row.holder {
            Some((value, token)) => {
                let left = store
                    .time_left(row.slot)
                    .await
                    .ok()
                    .flatten()
                    .map_or_else(|| "?".to_owned(), |d| format!("{:.1}s", d.as_secs_f64()));
                println!(
                    "{:<6} {:<32} {:<18} {:>10} {:>10}",
                    row.slot.0,
                    value.address,
                    format!("{:016x}", value.incarnation.0),
                    token.revision.0,
                    left
                );
            }
            None => println!(
                "{:<6} {:<32} {:<18} {:>10} {:>10}",
                row.slot.0, "(free)", "-", "-", "-"
            ),
        }
    }
    ExitCode::SUCCESS
}
