//! systemd notifications of `vvm run` (`Type=notify`), through the `sd-notify` crate.
//!
//! - `READY=1` once this process leads and its service is up (so a standby that campaigns stays
//!   "activating" until it leads);
//! - `WATCHDOG=1` after each confirmed renewal (the kill deadline moved later while the token
//!   is valid), only when systemd asked for a watchdog (`WATCHDOG_USEC`, and `WATCHDOG_PID` unset
//!   or ours): a process whose renewals stall stops pinging, so systemd sees it hang even when
//!   its runtime still answers;
//! - `STOPPING=1` when the shutdown starts.
//!
//! Outside systemd (`NOTIFY_SOCKET` unset) nothing is sent and no thread is started.
//!
//! A datagram send blocks when the manager does not read, so the sends happen on one thread of
//! their own, fed through a bounded queue: a message that does not fit is dropped, never waited
//! for (a lost ping only brings the watchdog's verdict nearer, which is the safe direction).

use std::sync::mpsc::{sync_channel, SyncSender};
use std::time::Duration;

use sd_notify::NotifyState;
use tokio::sync::oneshot;

/// Most messages waiting for the sender thread.
const QUEUE_MAX: usize = 16;

/// Longest wait at exit for the queued messages (above all `STOPPING=1`) to be sent.
pub const FLUSH_WAIT_MAX: Duration = Duration::from_secs(1);

/// What is told to the service manager, or a request to confirm that everything before it was.
#[derive(Debug)]
enum Message {
    /// `READY=1` with the status line that says what this process leads.
    Ready(String),
    Watchdog,
    Stopping,
    /// A `STATUS=` line alone (`systemctl status` shows the last one).
    Status(String),
    Flushed(oneshot::Sender<()>),
}

/// Sends notifications to systemd, or nothing outside it.
#[derive(Debug)]
pub struct Notifier {
    /// `None` outside systemd.
    queue: Option<SyncSender<Message>>,
    /// The watchdog timeout systemd asked for, if any.
    watchdog: Option<Duration>,
}

impl Notifier {
    /// A notifier for the environment this process was started in.
    pub fn from_env() -> Notifier {
        if std::env::var_os("NOTIFY_SOCKET").is_none() {
            return Notifier {
                queue: None,
                watchdog: None,
            };
        }
        let (queue, messages) = sync_channel::<Message>(QUEUE_MAX);
        let spawned = std::thread::Builder::new()
            .name("vvm-sd-notify".into())
            .spawn(move || {
                for message in messages {
                    let message = match message {
                        Message::Flushed(done) => {
                            // The waiter may have given up; nothing to tell then.
                            let _ = done.send(());
                            continue;
                        }
                        message => message,
                    };
                    // One datagram per message: a state and the status line that explains it.
                    let (state, status) = match &message {
                        Message::Ready(text) => (Some(NotifyState::Ready), Some(text.as_str())),
                        Message::Watchdog => (Some(NotifyState::Watchdog), None),
                        Message::Stopping => (Some(NotifyState::Stopping), Some("Shutting down")),
                        Message::Status(text) => (None, Some(text.as_str())),
                        Message::Flushed(_) => continue,
                    };
                    let states: Vec<NotifyState<'_>> = state
                        .into_iter()
                        .chain(status.map(NotifyState::Status))
                        .collect();
                    if let Err(e) = sd_notify::notify(&states) {
                        tracing::debug!(error = %vvm::store::ErrorChain(&e), "systemd notification failed");
                    }
                }
            });
        match spawned {
            Ok(_) => Notifier {
                queue: Some(queue),
                watchdog: sd_notify::watchdog_enabled(),
            },
            Err(e) => {
                tracing::warn!(error = %vvm::store::ErrorChain(&e), "cannot start the systemd notifier: notifications are off");
                Notifier {
                    queue: None,
                    watchdog: None,
                }
            }
        }
    }

    /// Whether systemd expects watchdog pings.
    pub fn watchdog_enabled(&self) -> bool {
        self.queue.is_some() && self.watchdog.is_some()
    }

    /// `READY=1`: leading, services up.
    ///
    /// `status` is the `STATUS=` line sent with it (who leads, since when).
    pub fn ready(&self, status: String) {
        self.send(Message::Ready(status));
    }

    /// `WATCHDOG=1`, when the watchdog is on: a renewal was confirmed.
    pub fn watchdog(&self) {
        if self.watchdog_enabled() {
            self.send(Message::Watchdog);
        }
    }

    /// `STATUS=`: what the process does now (campaigning, waiting for a holder).
    pub fn status(&self, status: String) {
        self.send(Message::Status(status));
    }

    /// `STOPPING=1`: the shutdown starts.
    pub fn stopping(&self) {
        self.send(Message::Stopping);
    }

    /// Waits up to [`FLUSH_WAIT_MAX`] for the messages queued so far to be sent: the process is
    /// about to exit, which would drop them.
    pub async fn flush(&self) {
        let (done, sent) = oneshot::channel();
        if self.send(Message::Flushed(done)) {
            // Timed out or the thread is gone: either way nothing more can be done.
            let _ = tokio::time::timeout(FLUSH_WAIT_MAX, sent).await;
        }
    }

    /// Queues `message`; whether it was queued.
    fn send(&self, message: Message) -> bool {
        let Some(queue) = &self.queue else {
            return false;
        };
        match queue.try_send(message) {
            Ok(()) => true,
            Err(e) => {
                tracing::debug!(error = %vvm::store::ErrorChain(&e), "systemd notification dropped");
                false
            }
        }
    }
}
