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
