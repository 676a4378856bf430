//! `vvm status`: who holds each slot, read straight from the store; with `--watch`, one more
//! line per change of holder (pushed by the store's change feed, see [`vvm::observe`]); with
//! `--json`, machine-readable lines.
//!
//! Status only reads: it never creates or writes anything — no store, no schema, no companion
//! or lock file (a `sqlite:` store is opened read-only). A `sqlite:` path that does not exist is
//! an error, not a new empty store that would then report every slot free; with `--watch` it is
//! waited for, so that a watcher can be started before the first `vvm run`.

use std::io::Write;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use vvm::Slot;
use vvm::{
    discovery::{Departure, Holder, HolderChange, ObserveOptions},
    observe,
};
use vvm_adapters::url::StoreUrl;

use super::store::open_store_read_only;
use super::{fail, usage_error, StatusArgs};

/// Longest a read of one slot may take.
const READ_TIMEOUT: Duration = Duration::from_secs(5);
/// Longest wait between two looks while watching, when the store's feed does not wake first.
const WATCH_RESYNC: Duration = Duration::from_secs(1);

/// How often a watcher looks for a store that does not exist yet.
const APPEAR_POLL: Duration = Duration::from_millis(200);

/// Runs `vvm status`.
pub async fn status(args: StatusArgs) -> ExitCode {
    // Only a watch ends by a signal with success; a one-shot status keeps the default actions.
    let mut stop = if args.watch {
        StopSignals::new()
    } else {
        StopSignals::none()
    };
    let url = match super::store::resolve(args.store.as_deref(), false) {
        Ok(url) => url,
        Err(message) => return usage_error(&message),
    };
    if let Ok(StoreUrl::Sqlite(sqlite)) = StoreUrl::parse(&url) {
        if !sqlite.path.exists() {
            if !args.watch {
                return fail(&format!(
                    "no store at {}: nothing to show (status never creates a store)",
                    sqlite.path.display()
                ));
            }
            // A watcher may start before the first `vvm run`: it waits for the store, which
            // appears complete in one step (see `Sq.CreateAtomic`).
            super::log::line(&format!(
                "no store at {} yet: waiting for it to appear",
                sqlite.path.display()
            ));
            while !sqlite.path.exists() {
                tokio::select! {
                    () = tokio::time::sleep(APPEAR_POLL) => {}
                    () = stop.asked() => return ExitCode::SUCCESS,
                }
            }
        }
    }
    if args.slots == 0 || args.slots > vvm_core::SLOTS_MAX {
        return usage_error(&format!(
            "--slots must be between 1 and {}, not {}",
            vvm_core::SLOTS_MAX,
            args.slots
        ));
    }
    // A store that does not exist yet where the URL points (a PostgreSQL schema never made) is
    // not created: a one-shot status says there is nothing to show, a watch waits for it.
    let mut said = false;
    let store = loop {
        match open_store_read_only(&url, &vvm::LeaseConfig::default()).await {
            Ok(store) => break Arc::new(store),
            Err(e) => {
                let Some(absent) = e.absent() else {
                    return e.exit();
                };
                if !args.watch {
                    return fail(&format!(
                        "{absent}: nothing to show (status never creates a store)"
                    ));
                }
                if !said {
                    said = true;
                    super::log::line(&format!("{absent}: waiting for it to appear"));
                }
                tokio::select! {
                    () = tokio::time::sleep(APPEAR_POLL) => {}
                    () = stop.asked() => return ExitCode::SUCCESS,
                }
            }
        }
    };
    let mut slots: Vec<Slot> = (1..=args.slots).map(Slot).collect();
    let options = ObserveOptions {
        resync: WATCH_RESYNC,
        call_timeout: READ_TIMEOUT,
    };
    // A slot whose record cannot be read is named and left out, so that the others are still
    // shown (and watched): one bad record must not hide every holder. Each pass leaves out one
    // more slot, so there are at most as many passes as slots.
    let mut corrupt: Vec<(Slot, String)> = Vec::new();
    let (mut observer, table) = loop {
        let mut observer = match observe(Arc::clone(&store), &slots, options) {
            Ok(observer) => observer,
            Err(e) => return usage_error(&e.to_string()),
        };
        let mut table = Vec::with_capacity(slots.len());
        let mut bad = None;
        for _ in &slots {
            tokio::select! {
                change = observer.next() => match change {
                    Ok(change) => table.push(change),
                    Err(e @ vvm::store::StoreError::Corrupt { slot, .. }) => {
                        bad = Some((Slot(slot), super::error_chain(&e)));
                        break;
                    }
                    Err(e) => return fail(&super::error_chain(&e)),
                },
                () = stop.asked() => return ExitCode::SUCCESS,
            }
        }
        let Some((slot, why)) = bad else {
            break (observer, table);
        };
        slots.retain(|kept| *kept != slot);
        corrupt.push((slot, why));
        if slots.is_empty() {
            break (observer, Vec::new());
        }
    };
    corrupt.sort_by_key(|(slot, _)| *slot);
    let mut out = Output::new(args.json);
    let mut events = Events::new(args.slots, &table);
    if out.table(&table, &corrupt).is_err() {
        return ExitCode::SUCCESS;
    }
    for (_, why) in &corrupt {
        super::log::line(&format!("cannot show its holder: {why}"));
    }
    if !args.watch {
        return match corrupt.is_empty() {
            true => ExitCode::SUCCESS,
            false => ExitCode::FAILURE,
        };
    }
    if slots.is_empty() {
        // Nothing left to watch: every slot's record is corrupt.
        return ExitCode::FAILURE;
    }
    loop {
        tokio::select! {
            change = observer.next() => match change {
                Ok(change) => {
                    let event = events.classify(&change, &observer);
                    // A closed standard output (`vvm status --watch | head -3`) ends the watch.
                    if out.change(&change, event).is_err() {
                        return ExitCode::SUCCESS;
                    }
                }
                // The store may come back: say so and keep watching.
                Err(e) => super::log::line(&format!(
                    "reading the store failed: {}",
                    super::error_chain(&e)
                )),
            },
            () = stop.asked() => return ExitCode::SUCCESS,
        }
    }
}

/// SIGINT and SIGTERM, watched from creation on: a signal that arrives while a line is being
/// written is not lost (a stream created per wait would miss it).
pub(super) struct StopSignals {
    interrupt: Option<tokio::signal::unix::Signal>,
    terminate: Option<tokio::signal::unix::Signal>,
}

impl StopSignals {
    pub(super) fn new() -> Self {
        use tokio::signal::unix::{signal, SignalKind};
        StopSignals {
            interrupt: signal(SignalKind::interrupt()).ok(),
            terminate: signal(SignalKind::terminate()).ok(),
        }
    }

    /// Watches nothing: [`asked`](Self::asked) never resolves.
    fn none() -> Self {
        StopSignals {
            interrupt: None,
            terminate: None,
        }
    }

    /// Resolves at the first SIGINT or SIGTERM; pending forever for a signal that could not be
    /// watched (its default action then ends the process).
    pub(super) async fn asked(&mut self) {
        async fn recv(signal: &mut Option<tokio::signal::unix::Signal>) {
            match signal {
                Some(signal) => {
                    signal.recv().await;
                }
                None => std::future::pending().await,
            }
        }
        tokio::select! {
            () = recv(&mut self.interrupt) => {}
            () = recv(&mut self.terminate) => {}
        }
    }
}

/// Writes to standard output and reports a failed write (a closed pipe) instead of panicking.
struct Output {
    json: bool,
}

impl Output {
    fn new(json: bool) -> Self {
        Output { json }
    }

    /// The slots as they are, in slot order — `rows` read, `corrupt` named with why their
    /// record cannot be read: a table, or one JSON object `{"slots": [...]}` (a corrupt slot
    /// has `"holder": null` and `"corrupt": why`).
    fn table(&mut self, rows: &[HolderChange], corrupt: &[(Slot, String)]) -> std::io::Result<()> {
        let mut entries: Vec<(Slot, Result<&HolderChange, &str>)> = rows
            .iter()
            .map(|row| (row.slot, Ok(row)))
            .chain(corrupt.iter().map(|(slot, why)| (*slot, Err(why.as_str()))))
            .collect();
        entries.sort_by_key(|(slot, _)| *slot);
        let mut stdout = std::io::stdout().lock();
        if self.json {
            let slots: Vec<serde_json::Value> = entries
                .iter()
                .map(|(slot, entry)| match entry {
                    Ok(row) => json_row(row),
                    Err(why) => {
                        serde_json::json!({ "slot": slot.0, "holder": null, "corrupt": why })
                    }
                })
                .collect();
            writeln!(stdout, "{}", serde_json::json!({ "slots": slots }))?;
        } else {
            writeln!(
                stdout,
                "{:<6} {:<32} {:<18} {:>14} {:>10}",
                "slot", "holder", "incarnation", "fencing token", "time left"
            )?;
            for (slot, entry) in &entries {
                match entry {
                    Ok(row) => writeln!(stdout, "{}", text_row(row))?,
                    Err(_) => writeln!(
                        stdout,
                        "{:<6} {:<32} {:<18} {:>14} {:>10}",
                        slot.0, "(corrupt record)", "-", "-", "-"
                    )?,
                }
            }
        }
        stdout.flush()
    }

    /// One change: the time (UTC), what happened and the table row, or one JSON object per
    /// line with `time` and `event` added.
    fn change(&mut self, change: &HolderChange, event: Event) -> std::io::Result<()> {
        let mut stdout = std::io::stdout().lock();
        let time = humantime::format_rfc3339_millis(std::time::SystemTime::now());
        if self.json {
            let mut row = json_row(change);
            if let Some(object) = row.as_object_mut() {
                object.insert("time".into(), time.to_string().into());
                object.insert("event".into(), event.name().into());
            }
            writeln!(stdout, "{row}")?;
        } else {
            writeln!(stdout, "{time} {:<10} {}", event.name(), text_row(change))?;
        }
        stdout.flush()
    }
}

fn text_row(row: &HolderChange) -> String {
    match &row.holder {
        Some(Holder {
            value,
            token,
            time_left,
        }) => format!(
            "{:<6} {:<32} {:<18} {:>14} {:>10}{}",
            row.slot.0,
            value.address,
            format!("{:016x}", value.incarnation.0),
            token.to_string(),
            time_left.map_or_else(|| "?".to_owned(), |d| format!("{:.1}s", d.as_secs_f64())),
            if value.stopping { " stopping" } else { "" }
        ),
        None => format!(
            "{:<6} {:<32} {:<18} {:>14} {:>10}",
            row.slot.0, "(free)", "-", "-", "-"
        ),
    }
}

/// `{"slot": 1, "holder": null}` or `{"slot": 1, "holder": {"address": ..., "incarnation":
/// "16 hex digits", "fencing_token": "slot:revision", "time_left_ms": n | null, "stopping": bool}}`.
fn json_row(row: &HolderChange) -> serde_json::Value {
    let holder = row.holder.as_ref().map(|holder| {
        serde_json::json!({
            "address": holder.value.address,
            "incarnation": format!("{:016x}", holder.value.incarnation.0),
            "fencing_token": holder.token.to_string(),
            "time_left_ms": holder.time_left.map(|left| u64::try_from(left.as_millis()).unwrap_or(u64::MAX)),
            "stopping": holder.value.stopping,
        })
    });
    serde_json::json!({ "slot": row.slot.0, "holder": holder })
}

/// What a change of holder was, as far as a watcher can tell.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Event {
    /// A free slot got a holder.
    Taken,
    /// The holder's record went away before it could have expired: it was deleted.
    Released,
    /// The holder's record went away at or after its expiry.
    Expired,
    /// The holder's services were asked to stop: it still has the slot, and releases it once
    /// they stopped.
    Stopping,
    /// Another holder has the slot now (the old record expired or was released between looks).
    PassedOn,
    /// The holder went away, and the store did not say when its record was due to expire.
    Gone,
}

impl Event {
    fn name(self) -> &'static str {
        match self {
            Event::Taken => "taken",
            Event::Released => "released",
            Event::Expired => "expired",
            Event::Stopping => "stopping",
            Event::PassedOn => "passed-on",
            Event::Gone => "gone",
        }
    }
}

/// The last holder seen per slot.
struct Events {
    held: Vec<Option<vvm::session::LeaseValue>>,
}

impl Events {
    /// The holders of `table`, kept by slot number (of `slots`; slots not in it are free).
    fn new(slots: u32, table: &[HolderChange]) -> Self {
        let mut held = vec![None; slots as usize];
        for row in table {
            if let Some(entry) = held.get_mut(row.slot.0.saturating_sub(1) as usize) {
                *entry = row.holder.as_ref().map(|holder| holder.value.clone());
            }
        }
        Events { held }
    }

    /// Holders are reported only on a change, so a slot with another holder before and after
    /// changed hands, and the same holder now marked stopping is stopping; a free slot's holder
    /// went away as the observer judged it.
    fn classify<S: vvm::store::LeaseStore>(
        &mut self,
        change: &HolderChange,
        observer: &vvm::Observer<S>,
    ) -> Event {
        let index = change.slot.0.saturating_sub(1) as usize;
        let before = self.held.get(index).cloned().flatten();
        let event = match (&change.holder, &before) {
            (Some(_), None) => Event::Taken,
            (Some(now), Some(before)) if now.value.stopping && now.value.same_holder(before) => {
                Event::Stopping
            }
            (Some(_), Some(_)) => Event::PassedOn,
            (None, _) => match observer.departure(change.slot) {
                Departure::Released => Event::Released,
                Departure::Expired => Event::Expired,
                _ => Event::Gone,
            },
        };
        if let Some(entry) = self.held.get_mut(index) {
            *entry = change.holder.as_ref().map(|holder| holder.value.clone());
        }
        event
    }
}
