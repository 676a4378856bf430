//! `vvm semaphore …`: create, list, describe (once or `--watch`), update, change the limit of and
//! delete semaphores from a shell, so that service discovery and configuration work without a
//! program of one's own.
//!
//! Each command opens a session of its own (every semaphore operation is one transaction of a
//! live session), does its one operation, and closes the session; a watch keeps its session
//! open until SIGINT or SIGTERM. The session holds nothing, so its kill deadline never has
//! anything to end but this short-lived process.

use std::io::Write;
use std::process::ExitCode;
use std::sync::Arc;

use vvm::coordination::NamesPage;
use vvm::coordination::{Description, DATA_BYTES_MAX};
use vvm::{
    coordination::{CoordinationError, WatchKind},
    session::LeaseValue,
    Coordination, KillerThread, LeaseConfig, SessionHandle,
};
use vvm_core::semaphore::SemaphoreError;

use super::status::StopSignals;
use super::store::{open_store, AnyStore};
use super::{fail, usage_error, SemaphoreAction, SemaphoreArgs};

/// Runs `vvm semaphore …`.
pub async fn semaphore(args: SemaphoreArgs) -> ExitCode {
    if let Err(message) = check(&args.action) {
        return usage_error(&message);
    }
    let url = match super::store::resolve(args.store.as_deref(), true) {
        Ok(url) => url,
        Err(message) => return usage_error(&message),
    };
    let lease = LeaseConfig::default();
    let store = match open_store(&url, &lease).await {
        Ok(store) => Arc::new(store),
        Err(e) => return e.exit(),
    };
    let value = LeaseValue::new(
        format!("vvm-semaphore/pid-{}", std::process::id()),
        vvm::new_incarnation(),
    );
    let session = match SessionHandle::open(store, lease, value, &KillerThread::global()).await {
        Ok(session) => session,
        Err(e) => {
            return fail(&format!(
                "cannot open a session: {}",
                super::error_chain(&e)
            ))
        }
    };
    let coordination = Coordination::new(session);
    let outcome = act(&coordination, &args.action).await;
    // Closing deletes the session record at once, rather than leaving it to its expiry.
    if let Err(e) = coordination.session().close().await {
        tracing::debug!(error = %vvm::store::ErrorChain(&e), "the session was not closed cleanly");
    }
    match outcome {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => fail(&super::error_chain(&e)),
    }
}

/// Refuses what the store would refuse anyway, before a session is opened: an invalid name, a
/// zero limit, data over the bound.
fn check(action: &SemaphoreAction) -> Result<(), String> {
    let name = match action {
        SemaphoreAction::List { .. } => return Ok(()),
        SemaphoreAction::Create { name, .. }
        | SemaphoreAction::Describe { name, .. }
        | SemaphoreAction::Update { name, .. }
        | SemaphoreAction::Delete { name, .. }
        | SemaphoreAction::SetLimit { name, .. } => name,
    };
    vvm::coordination::SemaphoreName::new(name)
        .map_err(|e| format!("invalid semaphore name: {}", super::error_chain(&e)))?;
    match action {
        SemaphoreAction::Create { limit: 0, .. } => Err("--limit must be at least 1".to_owned()),
        SemaphoreAction::SetLimit { limit: 0, .. } => {
            Err("the limit must be at least 1".to_owned())
        }
        SemaphoreAction::Create { data, .. } | SemaphoreAction::Update { data, .. }
            if data.len() > DATA_BYTES_MAX =>
        {
            Err(format!(
                "--data is {} bytes; a semaphore's data is at most {DATA_BYTES_MAX}",
                data.len()
            ))
        }
        _ => Ok(()),
    }
}

async fn act(
    coordination: &Coordination<Arc<AnyStore>>,
    action: &SemaphoreAction,
) -> Result<(), CoordinationError> {
    match action {
        SemaphoreAction::List { json } => list(coordination, *json).await,
        SemaphoreAction::Create {
            name,
            limit,
            data,
            if_missing: true,
        } => create_if_missing(coordination, name, *limit, data.as_bytes()).await,
        SemaphoreAction::Create {
            name, limit, data, ..
        } => coordination.create(name, *limit, data.as_bytes()).await,
        SemaphoreAction::Update { name, data } => {
            if !coordination.update_data(name, data.as_bytes()).await? {
                tracing::info!(semaphore = %name, "the data was already that: nothing changed");
            }
            Ok(())
        }
        SemaphoreAction::Delete { name, force } => coordination.delete(name, *force).await,
        SemaphoreAction::SetLimit { name, limit } => {
            let set = coordination.set_limit(name, *limit).await?;
            tracing::info!(
                semaphore = %name,
                previous = set.previous,
                limit = *limit,
                granted = set.granted,
                "{}",
                if set.previous == *limit {
                    "the limit was already that: nothing changed"
                } else {
                    "the limit changed"
                }
            );
            Ok(())
        }
        SemaphoreAction::Describe { name, watch, json } => {
            if !*watch {
                let description = coordination.describe(name).await?;
                print(&description, *json);
                return Ok(());
            }
            let mut watch = coordination.watch(name, WatchKind::ALL)?;
            let mut stop = StopSignals::new();
            loop {
                tokio::select! {
                    next = watch.next() => {
                        if !print_stamped(&next?, *json) {
                            // Standard output closed (`| head -1`): the watch is over.
                            return Ok(());
                        }
                    }
                    () = stop.asked() => return Ok(()),
                }
            }
        }
    }
}

/// Prints the names of every semaphore, a page of the store at a time as it is read (so the
/// memory used is one page's, however many there are); stops quietly when standard output is
/// closed (`| head -1`).
async fn list(
    coordination: &Coordination<Arc<AnyStore>>,
    json: bool,
) -> Result<(), CoordinationError> {
    let mut page = Some(NamesPage::first());
    while let Some(this) = page {
        let names = coordination.semaphore_names(&this).await?;
        let mut stdout = std::io::stdout().lock();
        for name in &names.names {
            let written = if json {
                writeln!(stdout, "{}", serde_json::json!({ "name": name.as_str() }))
            } else {
                writeln!(stdout, "{name}")
            };
            if written.is_err() {
                return Ok(());
            }
        }
        if stdout.flush().is_err() {
            return Ok(());
        }
        page = this.next(&names);
    }
    Ok(())
}

/// Creates `name` with `limit` units and `data` unless it exists; says which (an existing one
/// is left as it is). Two runs that both find it
/// missing both try: one creates it, the other finds it made (the store decides, in one
/// transaction each), so no limit is ever changed under a holder.
pub(super) async fn create_if_missing(
    coordination: &Coordination<Arc<AnyStore>>,
    name: &str,
    limit: u64,
    data: &[u8],
) -> Result<(), CoordinationError> {
    match coordination.create(name, limit, data).await {
        Ok(()) => {
            tracing::info!(
                semaphore = name,
                limit,
                "created the semaphore: it did not exist"
            );
            Ok(())
        }
        Err(CoordinationError::Refused(SemaphoreError::AlreadyExists(_))) => {
            let existing = coordination.describe(name).await?;
            if existing.limit != limit {
                tracing::warn!(
                    semaphore = name,
                    limit = existing.limit,
                    asked = limit,
                    "the semaphore exists with another limit, which stays (--limit only creates)"
                );
            }
            Ok(())
        }
        Err(e) => Err(e),
    }
}

/// Prints one snapshot; `false` when standard output is closed.
fn print(description: &Description, json: bool) -> bool {
    let text = if json {
        json_snapshot(description).to_string()
    } else {
        text_snapshot(description)
    };
    let mut stdout = std::io::stdout().lock();
    writeln!(stdout, "{text}")
        .and_then(|()| stdout.flush())
        .is_ok()
}

/// One snapshot of a watch, stamped with the time (UTC) as `vvm status --watch` stamps its
/// lines: before the header line, or as `"time"` in the JSON object; `false` when standard
/// output is closed.
fn print_stamped(description: &Description, json: bool) -> bool {
    let time = humantime::format_rfc3339_millis(std::time::SystemTime::now()).to_string();
    let text = if json {
        let mut object = json_snapshot(description);
        if let Some(map) = object.as_object_mut() {
            map.insert("time".into(), time.into());
        }
        object.to_string()
    } else {
        format!("{time} {}", text_snapshot(description))
    };
    let mut stdout = std::io::stdout().lock();
    writeln!(stdout, "{text}")
        .and_then(|()| stdout.flush())
        .is_ok()
}

/// A limit as a person reads it: `unlimited` for an ephemeral semaphore's.
fn shown_limit(limit: u64) -> String {
    if limit == vvm_core::semaphore::EPHEMERAL_LIMIT {
        "unlimited".to_owned()
    } else {
        limit.to_string()
    }
}

/// A waiter's timeout as a person reads it: `forever` for one that waits as long as it lives.
fn shown_timeout(timeout_ms: u64) -> String {
    if timeout_ms == u64::MAX {
        "forever".to_owned()
    } else {
        timeout_ms.to_string()
    }
}

/// `data` as text when it is UTF-8, else as hexadecimal digits after `0x`.
fn shown_data(data: &[u8]) -> String {
    match std::str::from_utf8(data) {
        Ok(text) => text.to_owned(),
        Err(_) => {
            let hex: String = data.iter().map(|b| format!("{b:02x}")).collect();
            format!("0x{hex}")
        }
    }
}

/// One block: a header line, then one line per owner and per waiter. A semaphore being deleted
/// says so; its owners are former owners whose units stay counted until they stop.
fn text_snapshot(d: &Description) -> String {
    let mut text = format!(
        "semaphore {} count={}/{} fencing_token={}{}{} data={:?}",
        d.name,
        d.count,
        shown_limit(d.limit),
        d.generation.fencing_token(),
        if d.ephemeral { " ephemeral" } else { "" },
        if d.deleting { " being-deleted" } else { "" },
        shown_data(&d.data)
    );
    for owner in &d.owners {
        text.push_str(&format!(
            "\n  owner  order={} session={} count={} fencing_token={} data={:?}",
            owner.order_id.0,
            owner.session,
            owner.count,
            owner.token.fencing_token(),
            shown_data(&owner.data)
        ));
    }
    for waiter in &d.waiters {
        text.push_str(&format!(
            "\n  waiter order={} session={} count={} timeout_ms={} data={:?}",
            waiter.order_id.0,
            waiter.session,
            waiter.count,
            shown_timeout(waiter.timeout_ms),
            shown_data(&waiter.data)
        ));
    }
    text
}

/// `{"name", "data", "count", "limit", "ephemeral", "deleting", "fencing_token", "owners": [...],
/// "waiters": [...]}`.
fn json_snapshot(d: &Description) -> serde_json::Value {
    let owners: Vec<_> = d
        .owners
        .iter()
        .map(|o| {
            serde_json::json!({
                "order": o.order_id.0, "session": o.session.to_string(), "count": o.count,
                "fencing_token": o.token.fencing_token().to_string(), "data": shown_data(&o.data),
            })
        })
        .collect();
    let waiters: Vec<_> = d
        .waiters
        .iter()
        .map(|w| {
            serde_json::json!({
                "order": w.order_id.0, "session": w.session.to_string(), "count": w.count,
                "timeout_ms": w.timeout_ms, "data": shown_data(&w.data),
            })
        })
        .collect();
    serde_json::json!({
        "name": d.name.to_string(),
        "data": shown_data(&d.data),
        "count": d.count,
        "limit": d.limit,
        "ephemeral": d.ephemeral,
        "deleting": d.deleting,
        "fencing_token": d.generation.fencing_token().to_string(),
        "owners": owners,
        "waiters": waiters,
    })
}
