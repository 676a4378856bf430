//! What a launched VVM's handle, its services and its subscribers read of the driver: one
//! value, published whole after each transition.

use vvm_core::{FencingToken, Instant, Phase};

use crate::error::VvmError;

/// What the handle sees of the driver.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Status {
    pub(crate) phase: Phase,
    pub(crate) running: bool,
    /// Services may be running: from their start until the pipeline reports them stopped.
    pub(crate) services_running: bool,
    pub(crate) token: Option<FencingToken>,
    pub(crate) deadline: Option<Instant>,
    pub(crate) problem: Option<VvmError>,
    pub(crate) finished: bool,
    /// Leadership was lost: no token is valid any more.
    pub(crate) lost: bool,
    /// The services were asked to stop (a shutdown, a problem or a loss): from then on this VVM
    /// no longer presents itself as the leader to observers, though its services may still use
    /// the token while they stop.
    pub(crate) stopping: bool,
}

impl Default for Status {
    fn default() -> Self {
        Status {
            phase: Phase::Provided,
            running: false,
            services_running: false,
            token: None,
            deadline: None,
            problem: None,
            finished: false,
            lost: false,
            stopping: false,
        }
    }
}

/// Logs the end of a leadership in words a reader of the log follows: a candidate that never
/// held a slot stopped campaigning; a holder released its record, or left it to expire; a
/// holder that had lost its slot before (`held`: the slot of this tenure, if one was held) has
/// nothing left to release.
pub(crate) fn log_released(
    slot: Option<vvm_core::Slot>,
    deleted: bool,
    held: Option<vvm_core::Slot>,
) {
    match (slot, deleted, held) {
        (Some(slot), true, _) => {
            tracing::info!(slot = slot.0, "leadership released: the record is deleted");
        }
        (Some(slot), false, Some(held)) if held == slot => tracing::info!(
            slot = slot.0,
            "leadership given up: the record could not be deleted and is left to expire"
        ),
        (None, _, Some(held)) => tracing::info!(
            slot = held.0,
            "stopped after leadership was lost: nothing left to release"
        ),
        _ => tracing::info!("stopped campaigning: no slot was held"),
    }
}
