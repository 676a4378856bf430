//! The runtime's metrics, recorded through the [`metrics`] facade (feature `metrics`).
//!
//! Nothing is recorded until the host installs a recorder (the `vvm` binary installs a
//! Prometheus one for `--metrics-addr`); without a recorder every call here is a no-op of the
//! facade. Without the feature the hooks in the driver and the executor are compiled out.
//!
//! | name | type | labels | meaning |
//! |---|---|---|---|
//! | `vvm_leader` | gauge | `slot` | 1 from the acquisition of `slot` until its loss or release, 0 after |
//! | `vvm_lease_margin_seconds` | gauge | | seconds left until the earliest kill deadline armed by this process; NaN while none is armed |
//! | `vvm_store_call_duration_seconds` | histogram | `operation`, `outcome` | latency of each store call, its timeout included |
//! | `vvm_acquisitions_total` | counter | `slot` | leaderships acquired |
//! | `vvm_losses_total` | counter | `slot`, `reason` | leaderships lost (`overtaken`, `renewal_failed`, `deadline_passed`) |
//! | `vvm_releases_total` | counter | `slot`, `deleted` | leaderships released at shutdown; `deleted` tells whether the record was removed |
//! | `vvm_renewal_failures_total` | counter | `slot`, `outcome` | compare-and-swap calls (renewals, claims) that failed or timed out, each one a retry |
//!
//! `operation` is one of `insert`, `compare_and_swap`, `compare_and_delete`, `get`; `outcome`
//! one of `written`, `rejected`, `deleted`, `found`, `failed`, `unknown` (a timeout is
//! `unknown`).
//!
//! The lease margin is set whenever a kill deadline is armed or disarmed; a host that scrapes
//! calls [`refresh_lease_margin`] first so that the value is current at the scrape. Nothing
//! here touches the killer: the deadlines are copied into a table of this module.

use std::future::Future;
use std::pin::Pin;
use std::sync::{Mutex, PoisonError};
use std::time::Instant as StdInstant;

use vvm_core::{Effect, Incarnation, Instant, LossReason, OpId, Reply, Slot, SLOTS_MAX};

use crate::clock::{Clock, TimeSource};

/// Name of the leader gauge.
pub const LEADER: &str = "vvm_leader";
/// Name of the lease margin gauge.
pub const LEASE_MARGIN_SECONDS: &str = "vvm_lease_margin_seconds";
/// Name of the store-call latency histogram.
pub const STORE_CALL_DURATION_SECONDS: &str = "vvm_store_call_duration_seconds";
/// Name of the acquisitions counter.
pub const ACQUISITIONS_TOTAL: &str = "vvm_acquisitions_total";
/// Name of the losses counter.
pub const LOSSES_TOTAL: &str = "vvm_losses_total";
/// Name of the releases counter.
pub const RELEASES_TOTAL: &str = "vvm_releases_total";
/// Name of the renewal failures counter.
pub const RENEWAL_FAILURES_TOTAL: &str = "vvm_renewal_failures_total";

/// Most VVMs of one process whose kill deadlines the lease margin follows; the deadlines of
/// further ones are left out of the gauge (a bound on the table, far above any real host).
pub const DEADLINES_MAX: usize = 64;

/// The armed kill deadline of each VVM of this process, by incarnation.
static DEADLINES: Mutex<Vec<(Incarnation, Instant)>> = Mutex::new(Vec::new());

/// Gives every metric its description (the `# HELP` line of the Prometheus text) and unit.
/// Call it once after installing a recorder.
pub fn describe() {
    use metrics::Unit;
    metrics::describe_gauge!(
        LEADER,
        "1 while this process holds leadership of the slot, 0 after a loss or release"
    );
    metrics::describe_gauge!(
        LEASE_MARGIN_SECONDS,
        Unit::Seconds,
        "seconds left until the earliest kill deadline armed by this process; NaN while none is armed"
    );
    metrics::describe_histogram!(
        STORE_CALL_DURATION_SECONDS,
        Unit::Seconds,
        "latency of store calls by operation and outcome, timeouts included"
    );
    metrics::describe_counter!(ACQUISITIONS_TOTAL, "leaderships acquired");
    metrics::describe_counter!(LOSSES_TOTAL, "leaderships lost, by reason");
    metrics::describe_counter!(RELEASES_TOTAL, "leaderships released at shutdown");
    metrics::describe_counter!(
        RENEWAL_FAILURES_TOTAL,
        "compare-and-swap calls (renewals, claims) that failed or timed out; each is retried"
    );
}

/// Sets `vvm_leader` of slots `1..=slots` (at most [`SLOTS_MAX`]) to 0, so that a process that
/// has not led yet shows the slots it campaigns for. For a host running one VVM, before launch.
pub fn campaigning(slots: u32) {
    for slot in 1..=slots.min(SLOTS_MAX) {
        metrics::gauge!(LEADER, "slot" => slot_label(Slot(slot))).set(0.0);
    }
    metrics::gauge!(LEASE_MARGIN_SECONDS).set(f64::NAN);
}

/// A store call with its latency, outcome and (for a failed renewal) retry recorded.
pub(crate) type TimedCall = Pin<Box<dyn Future<Output = (OpId, Reply)> + Send>>;

/// Wraps the store call of `effect` so that its latency and outcome are recorded when it ends.
pub(crate) fn timed(effect: &Effect, call: TimedCall) -> TimedCall {
    let (operation, slot) = match *effect {
        Effect::Insert { slot, .. } => ("insert", slot),
        Effect::CompareAndSwap { slot, .. } => ("compare_and_swap", slot),
        Effect::CompareAndDelete { slot, .. } => ("compare_and_delete", slot),
        Effect::Get { slot, .. } => ("get", slot),
        _ => return call,
    };
    Box::pin(async move {
        let started = StdInstant::now();
        let (op, reply) = call.await;
        let outcome = outcome(&reply);
        metrics::histogram!(STORE_CALL_DURATION_SECONDS, "operation" => operation, "outcome" => outcome)
            .record(started.elapsed().as_secs_f64());
        if operation == "compare_and_swap" && matches!(reply, Reply::Failed | Reply::Unknown) {
            metrics::counter!(RENEWAL_FAILURES_TOTAL, "slot" => slot_label(slot), "outcome" => outcome)
                .increment(1);
        }
        (op, reply)
    })
}

fn outcome(reply: &Reply) -> &'static str {
    match reply {
        Reply::Written(_) => "written",
        // A refused insert that tells the record's time left is still a refusal.
        Reply::Rejected | Reply::Held(_) => "rejected",
        Reply::Deleted => "deleted",
        Reply::Found(_) => "found",
        Reply::Failed => "failed",
        Reply::Unknown => "unknown",
    }
}

fn slot_label(slot: Slot) -> String {
    slot.0.to_string()
}

/// Records what a notification effect says about leadership: acquired, lost, released.
pub(crate) fn notified(effect: &Effect) {
    match *effect {
        Effect::Acquired { token } => {
            let slot = slot_label(token.slot);
            metrics::gauge!(LEADER, "slot" => slot.clone()).set(1.0);
            metrics::counter!(ACQUISITIONS_TOTAL, "slot" => slot).increment(1);
        }
        Effect::Lost { slot, reason } => {
            let slot = slot_label(slot);
            let reason = match reason {
                LossReason::Overtaken => "overtaken",
                LossReason::RenewalFailed => "renewal_failed",
                LossReason::DeadlinePassed => "deadline_passed",
                LossReason::Abandoned => "abandoned",
                LossReason::MarkLost => "mark_lost",
            };
            metrics::gauge!(LEADER, "slot" => slot.clone()).set(0.0);
            metrics::counter!(LOSSES_TOTAL, "slot" => slot, "reason" => reason).increment(1);
        }
        Effect::Released {
            slot: Some(slot),
            deleted,
        } => {
            let slot = slot_label(slot);
            let deleted = if deleted { "true" } else { "false" };
            metrics::gauge!(LEADER, "slot" => slot.clone()).set(0.0);
            metrics::counter!(RELEASES_TOTAL, "slot" => slot, "deleted" => deleted).increment(1);
        }
        _ => {}
    }
}

/// Records the kill deadline the VVM `incarnation` has armed now (`None`: disarmed), and sets
/// the lease margin.
pub(crate) fn kill_deadline(incarnation: Incarnation, deadline: Option<Instant>) {
    let mut deadlines = DEADLINES.lock().unwrap_or_else(PoisonError::into_inner);
    let index = deadlines.iter().position(|(own, _)| *own == incarnation);
    match (index, deadline) {
        (Some(index), Some(at)) => deadlines[index].1 = at,
        (Some(index), None) => {
            deadlines.swap_remove(index);
        }
        (None, Some(at)) if deadlines.len() < DEADLINES_MAX => deadlines.push((incarnation, at)),
        (None, _) => {}
    }
    set_margin(&deadlines);
}

/// Sets the lease margin gauge from the deadlines armed and the current time: call it before
/// rendering the metrics so that the margin is that of the moment of the scrape.
pub fn refresh_lease_margin() {
    let deadlines = DEADLINES.lock().unwrap_or_else(PoisonError::into_inner);
    set_margin(&deadlines);
}

fn set_margin(deadlines: &[(Incarnation, Instant)]) {
    let margin = deadlines
        .iter()
        .map(|(_, at)| *at)
        .min()
        .map_or(f64::NAN, |at| {
            at.saturating_since(Clock.now()).as_secs_f64()
        });
    metrics::gauge!(LEASE_MARGIN_SECONDS).set(margin);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn armed(incarnation: Incarnation) -> Option<Instant> {
        DEADLINES
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .iter()
            .find(|(own, _)| *own == incarnation)
            .map(|(_, at)| *at)
    }

    // covers: Rt.Metrics
    #[test]
    fn the_margin_table_follows_arm_and_disarm_per_vvm() {
        // Incarnations no other test uses: the table is process-wide.
        let (a, b) = (Incarnation(u64::MAX - 1), Incarnation(u64::MAX - 2));
        kill_deadline(a, Some(Instant::from_nanos(5)));
        kill_deadline(b, Some(Instant::from_nanos(9)));
        assert_eq!(armed(a), Some(Instant::from_nanos(5)));
        // Arming again replaces, also with a later deadline (a confirmed renewal).
        kill_deadline(a, Some(Instant::from_nanos(7)));
        assert_eq!(armed(a), Some(Instant::from_nanos(7)));
        kill_deadline(a, None);
        assert_eq!(armed(a), None);
        assert_eq!(armed(b), Some(Instant::from_nanos(9)));
        kill_deadline(b, None);
        assert_eq!(armed(b), None);
        // Disarming what was never armed changes nothing.
        kill_deadline(a, None);
        assert_eq!(armed(a), None);
    }
}
