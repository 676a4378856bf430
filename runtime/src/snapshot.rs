//! A launched VVM's own state as a stream: [`Vvm::subscribe`](crate::Vvm::subscribe).

use std::pin::Pin;
use std::task::{Context, Poll};

use tokio::sync::watch;
use vvm_core::{FencingToken, Instant, Phase};

use crate::error::VvmError;
use crate::services::valid_token;
use crate::status::Status;
use crate::stream::{Pump, Stream};

/// A VVM's state at one moment.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct VvmSnapshot {
    /// Where the VVM is in its life.
    pub phase: Phase,
    /// Whether its services may be running: from their start until the last of them has
    /// stopped. This, not the phase, is what "acting" means.
    pub services_running: bool,
    /// The fencing token of the last confirmed write while this VVM leads (see
    /// [`Vvm::token`](crate::Vvm::token)); `None` before acquisition, from the moment its
    /// services are asked to stop (a shutdown, a problem or a loss: a successor may lead as soon
    /// as the release is done), after a loss and once the kill deadline has passed.
    pub token: Option<FencingToken>,
    /// The kill deadline armed last, on the clock of [`crate::Clock`].
    pub kill_deadline: Option<Instant>,
    /// Leadership was lost.
    pub lost: bool,
    /// The first problem raised, if any.
    pub problem: Option<VvmError>,
    /// The VVM has finished: services stopped, monitor stopped, lease released or lost.
    pub finished: bool,
}

impl VvmSnapshot {
    fn of(status: &Status) -> Self {
        VvmSnapshot {
            phase: status.phase,
            services_running: status.services_running,
            token: valid_token(status).filter(|_| !status.stopping),
            kill_deadline: status.deadline,
            lost: status.lost,
            problem: status.problem.clone(),
            finished: status.finished,
        }
    }
}

/// Changes of one VVM's state, from [`Vvm::subscribe`](crate::Vvm::subscribe). Every
/// subscriber sees the latest state; states that follow each other quickly may be seen as one
/// (a slow subscriber never holds the VVM back, and memory stays bounded).
///
/// ```
/// # async fn watch(vvm: &vvm_runtime::Vvm<vvm_runtime::Launched>) {
/// let mut states = vvm.subscribe();
/// while let Some(state) = states.changed().await {
///     if state.finished {
///         break;
///     }
/// }
/// # }
/// ```
pub struct VvmSubscription {
    /// For [`current`](VvmSubscription::current), which reads and never marks.
    status: watch::Receiver<Status>,
    pump: Pump<watch::Receiver<Status>, VvmSnapshot>,
}

impl std::fmt::Debug for VvmSubscription {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("VvmSubscription")
            .field("current", &self.current())
            .finish_non_exhaustive()
    }
}

/// Another subscriber, from the state now.
impl Clone for VvmSubscription {
    fn clone(&self) -> Self {
        VvmSubscription::new(self.status.clone())
    }
}

impl VvmSubscription {
    pub(crate) fn new(status: watch::Receiver<Status>) -> Self {
        let mut changes = status.clone();
        changes.mark_unchanged();
        VvmSubscription {
            status,
            pump: Pump::new(changes, |mut changes| {
                Box::pin(async move {
                    let snapshot = match changes.changed().await {
                        Ok(()) => Some(VvmSnapshot::of(&changes.borrow_and_update())),
                        Err(_) => None,
                    };
                    (changes, snapshot)
                })
            }),
        }
    }

    /// The state now.
    pub fn current(&self) -> VvmSnapshot {
        VvmSnapshot::of(&self.status.borrow())
    }

    /// Waits for the next change and returns the state after it; `None` once the VVM's driver
    /// is gone and nothing will change any more (its last state stays readable by
    /// [`current`](Self::current)). The same answers as the subscription's [`Stream`], which
    /// ends then.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: a change made while no call waited is not lost; the next call returns the
    /// state after it.
    pub async fn changed(&mut self) -> Option<VvmSnapshot> {
        self.pump.next().await
    }
}

impl Stream for VvmSubscription {
    type Item = VvmSnapshot;

    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        self.get_mut().pump.poll_next(cx)
    }
}
