//! The errors a VVM hands back to its host.

use std::borrow::Cow;
use std::time::Duration;

use vvm_core::{ConfigError, LossReason, Problem, Slot};

use crate::cause::Cause;

/// The first problem of a VVM, as returned by
/// [`Vvm::<Launched>::shutdown`](crate::Vvm::shutdown) and resolved by
/// [`Vvm::<Launched>::problem`](crate::Vvm::problem).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum VvmError {
    /// No slot was won within the acquisition duration.
    #[error("no slot out of {slots} was acquired within {acquisition:?}{}", refusals_text(.refusals))]
    AcquisitionFailed {
        /// How many slots were walked.
        slots: u32,
        /// How long acquisition kept trying.
        acquisition: Duration,
        /// Why each slot was not won, as last seen, in slot order (slots never tried are
        /// absent).
        refusals: Vec<SlotRefusal>,
    },
    /// A service failed to start; the source is the service's own error.
    #[error("service #{index} `{name}` failed to start")]
    ServiceStartFailed {
        /// Position in the start order.
        index: u16,
        /// The service's name.
        name: String,
        /// What the service reported.
        source: ServiceError,
    },
    /// Leadership of the slot was lost while the VVM ran.
    #[error("leadership of slot {} was lost: {}", .slot.0, describe(*.reason))]
    LeadershipLost {
        /// The slot that was held.
        slot: Slot,
        /// Why it was lost.
        reason: LossReason,
    },
    /// A running service failed; the source is the service's own error.
    #[error("service #{index} `{name}` failed")]
    ServiceFailed {
        /// Position in the start order.
        index: u16,
        /// The service's name.
        name: String,
        /// What the service reported.
        source: ServiceError,
    },
    /// The services ended without being asked to and without saying which failed: the task
    /// running them vanished (it panicked). Whatever they left behind was aborted.
    #[error("the services ended without being asked to (their pipeline task vanished)")]
    ServicesVanished,
    /// The session of a VVM on its own session could not be opened, so nothing was acquired.
    #[error("the VVM's session could not be opened")]
    SessionNotOpened {
        /// Why: the [`SessionError`](crate::SessionError), kept whole
        /// ([`Cause::downcast_ref`] gets it back).
        source: Cause,
    },
    /// `launch` was not polled inside a tokio runtime, so nothing could be started.
    #[error("launch needs a tokio runtime")]
    NoRuntime,
    /// The driver task ended without completing the shutdown (it panicked or its runtime was
    /// shut down); whether the lease was released is unknown.
    #[error("the VVM's driver ended before its shutdown completed")]
    DriverGone,
}

/// Why one slot was not won during acquisition, as last seen.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SlotRefusal {
    /// The slot.
    pub slot: Slot,
    /// Why.
    pub reason: RefusalReason,
}

/// Why a slot was not won.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum RefusalReason {
    /// Another live record holds it.
    #[error("held by another live record")]
    Held,
    /// The VVM at this address holds it (its record, read when acquisition failed).
    #[error("held by {0}")]
    HeldBy(String),
    /// The store failed, or its record could not be read as a lease (corrupt, or written by
    /// something else): the store's own words.
    #[error("{0}")]
    Store(String),
    /// Won only after the deadline the insert would set (the process was paused).
    #[error("won too late to be used (the process was paused)")]
    TooLate,
}

/// Slots named in an acquisition error at most; the rest are counted.
const REFUSALS_SHOWN_MAX: usize = 4;

fn refusals_text(refusals: &[SlotRefusal]) -> String {
    let mut text = String::new();
    for (index, refusal) in refusals.iter().take(REFUSALS_SHOWN_MAX).enumerate() {
        let separator = if index == 0 { ": " } else { "; " };
        text.push_str(&format!(
            "{separator}slot {}: {}",
            refusal.slot.0, refusal.reason
        ));
    }
    if refusals.len() > REFUSALS_SHOWN_MAX {
        text.push_str(&format!(
            "; and {} more",
            refusals.len() - REFUSALS_SHOWN_MAX
        ));
    }
    text
}

fn describe(reason: LossReason) -> &'static str {
    match reason {
        LossReason::Overtaken => "the record changed, expired or was deleted",
        LossReason::RenewalFailed => {
            "renewals kept failing until none could be confirmed before the kill deadline"
        }
        LossReason::DeadlinePassed => {
            "a renewal was confirmed only after its kill deadline (the process was paused)"
        }
        LossReason::Abandoned => {
            "its session was given up after services stopped without being vouched for; the process ends at the kill deadline"
        }
        LossReason::MarkLost => {
            "the connection holding its session's liveness mark broke, so others may take over at once; the process ends now"
        }
    }
}

impl VvmError {
    /// The core's view of this error, when it is one of the core's problems.
    pub fn problem(&self) -> Option<Problem> {
        match *self {
            VvmError::AcquisitionFailed { .. } => Some(Problem::AcquisitionFailed),
            VvmError::ServiceStartFailed { index, .. } => {
                Some(Problem::ServiceStartFailed { index })
            }
            VvmError::LeadershipLost { slot, reason } => {
                Some(Problem::LeadershipLost { slot, reason })
            }
            VvmError::ServiceFailed { index, .. } => Some(Problem::ServiceFailed { index }),
            VvmError::ServicesVanished => Some(Problem::ServicesVanished),
            VvmError::NoRuntime | VvmError::DriverGone | VvmError::SessionNotOpened { .. } => None,
        }
    }
}

/// A service list that cannot be used.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ServicesError {
    /// More services than [`SERVICES_MAX`](crate::SERVICES_MAX).
    #[error("more than {max} services")]
    TooMany {
        /// The maximum.
        max: usize,
    },
}

/// Why an [`Elections`](crate::Elections) call did not win, hold or release a slot.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ElectionsError {
    /// Another live record holds the slot.
    #[error("slot {} is held by someone else", .0 .0)]
    Held(Slot),
    /// The store failed, or an unknown outcome could not be resolved.
    #[error("the store failed while acquiring slot {}", .0 .0)]
    StoreFailed(Slot),
    /// The insert was confirmed only after the kill deadline it would set (the process was
    /// paused); the record is left to expire.
    #[error("slot {} was won too late to be used (the process was paused)", .0 .0)]
    TooLate(Slot),
    /// This handle holds the slot already (or held it and lost it, and it was not released
    /// yet): a slot is held at most once per handle.
    #[error("slot {} is held by this handle already", .0 .0)]
    AlreadyHeld(Slot),
    /// Slots are numbered from 1, as a VVM's are: slot 0 is refused before any store call.
    #[error("slot {} is not a slot (slots are numbered from 1)", .0 .0)]
    InvalidSlot(Slot),
    /// The handle holds as many slots as it may
    /// ([`ELECTIONS_SLOTS_MAX`](crate::elections::ELECTIONS_SLOTS_MAX)).
    #[error("this handle holds {max} slots already, the most it may")]
    TooManySlots {
        /// The bound.
        max: usize,
    },
    /// The session of this handle was lost, and with it every slot it held. Nothing is
    /// acquired until every lost slot is released (the caller's acknowledgement that nothing
    /// acts under them any more); the lost session's kill deadline stays armed.
    #[error("the session was lost ({0:?}): every slot it held is lost")]
    Lost(LossReason),
    /// The store did not confirm a release: the record stays until its session ends (or
    /// expires), and when it was the last slot held, the kill deadline stays armed.
    #[error("the store did not confirm the release; the kill deadline may still fire")]
    ReleaseUnconfirmed,
    /// The handle was cleaned up (or its task is gone); it acquires nothing any more.
    #[error("the elections were cleaned up")]
    Closed,
    /// The handle was not created inside a tokio runtime.
    #[error("elections need a tokio runtime")]
    NoRuntime,
    /// The address cannot be written into a lease record; checked as
    /// [`VvmConfig`](vvm_core::VvmConfig) checks it.
    #[error("the address cannot be used")]
    InvalidAddress(#[source] ConfigError),
}

/// What a service reports when it fails: a message saying what failed and, if an error caused
/// it, that error, kept whole as the [`source`](std::error::Error::source). Both reach the host
/// unchanged (inside [`VvmError::ServiceFailed`](crate::VvmError::ServiceFailed)).
///
/// ```
/// use vvm_runtime::{ErrorChain, ServiceError};
///
/// let io = std::io::Error::other("disk full");
/// let error = ServiceError::with_source("cannot write the journal", io);
/// assert_eq!(error.to_string(), "cannot write the journal");
/// assert_eq!(ErrorChain(&error).to_string(), "cannot write the journal: disk full");
/// assert!(error.cause().unwrap().downcast_ref::<std::io::Error>().is_some());
/// ```
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{message}")]
pub struct ServiceError {
    message: Cow<'static, str>,
    #[source]
    source: Option<Cause>,
}

impl ServiceError {
    /// An error with this message and no underlying error.
    pub fn new(message: impl Into<Cow<'static, str>>) -> Self {
        ServiceError {
            message: message.into(),
            source: None,
        }
    }

    /// An error with this message, caused by `source`.
    pub fn with_source(
        message: impl Into<Cow<'static, str>>,
        source: impl std::error::Error + Send + Sync + 'static,
    ) -> Self {
        ServiceError {
            message: message.into(),
            source: Some(Cause::new(source)),
        }
    }

    /// The message, without the cause.
    pub fn message(&self) -> &str {
        &self.message
    }

    /// The underlying error, if there is one.
    pub fn cause(&self) -> Option<&Cause> {
        self.source.as_ref()
    }
}
