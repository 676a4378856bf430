//! The watches of a [`PgKv`](super::PgKv): one listening connection per store handle, shared by
//! every watch through a map of key → waiters.

use std::collections::HashMap;
use std::future::{poll_fn, Future};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::task::Poll;
use std::time::Duration;

use tokio::sync::Notify;
use tokio::task::JoinHandle;
use tokio_postgres::AsyncMessage;

use super::{failed, lock, Connector, PgError, Shared, WATCHES_MAX, WATCH_REREAD};
use crate::txkv::TxError;

/// First pause before connecting again after the listening connection was lost or refused;
/// doubles up to [`RECONNECT_PAUSE_MAX`].
const RECONNECT_PAUSE_FIRST: Duration = Duration::from_millis(50);
/// Longest pause between two attempts to connect the listener.
const RECONNECT_PAUSE_MAX: Duration = Duration::from_secs(2);

/// The waiters of one key: an id (to unregister) and the waiter's own [`Notify`].
type KeyWaiters = Vec<(u64, Arc<Notify>)>;

/// The waiters, by key: each has its own [`Notify`], so a wake-up before it waits is kept.
#[derive(Default)]
struct Waiters {
    by_key: Mutex<HashMap<Vec<u8>, KeyWaiters>>,
    count: Mutex<usize>,
    next: AtomicU64,
}

impl Waiters {
    fn wake(&self, key: &[u8]) {
        if let Some(list) = lock(&self.by_key).get(key) {
            for (_, notify) in list {
                notify.notify_one();
            }
        }
    }

    /// Notifications may have been lost: every waiter reads its key again.
    fn wake_all(&self) {
        for list in lock(&self.by_key).values() {
            for (_, notify) in list {
                notify.notify_one();
            }
        }
    }

    /// A payload is the changed key in hex; an empty one (a key too long for a payload) or one
    /// that is not hex wakes everyone.
    fn wake_payload(&self, payload: &str) {
        match decode_hex(payload) {
            Some(key) if !key.is_empty() => self.wake(&key),
            _ => self.wake_all(),
        }
    }
}

fn decode_hex(text: &str) -> Option<Vec<u8>> {
    if !text.len().is_multiple_of(2) {
        return None;
    }
    (0..text.len())
        .step_by(2)
        .map(|at| u8::from_str_radix(text.get(at..at + 2)?, 16).ok())
        .collect()
}

/// A registration; unregisters when dropped.
struct Registration {
    waiters: Arc<Waiters>,
    key: Vec<u8>,
    id: u64,
    notify: Arc<Notify>,
}

impl Drop for Registration {
    fn drop(&mut self) {
        let mut by_key = lock(&self.waiters.by_key);
        if let Some(list) = by_key.get_mut(&self.key) {
            list.retain(|(id, _)| *id != self.id);
            if list.is_empty() {
                by_key.remove(&self.key);
            }
        }
        drop(by_key);
        let mut count = lock(&self.waiters.count);
        *count = count.saturating_sub(1);
    }
}

/// The listening side of a store handle; its task stops when the handle is dropped.
pub(super) struct Listener {
    driver: tokio_postgres::Config,
    connector: Connector,
    channel: String,
    waiters: Arc<Waiters>,
    task: Mutex<Option<JoinHandle<()>>>,
}

impl Drop for Listener {
    fn drop(&mut self) {
        if let Some(task) = lock(&self.task).take() {
            task.abort();
        }
    }
}

impl Listener {
    pub(super) fn new(
        driver: tokio_postgres::Config,
        connector: Connector,
        channel: String,
    ) -> Listener {
        Listener {
            driver,
            connector,
            channel,
            waiters: Arc::default(),
            task: Mutex::new(None),
        }
    }

    pub(super) fn waiting(&self) -> usize {
        *lock(&self.waiters.count)
    }

    fn register(&self, key: &[u8]) -> Result<Registration, TxError> {
        {
            let mut count = lock(&self.waiters.count);
            if *count >= WATCHES_MAX {
                return Err(failed(PgError::TooManyWatches));
            }
            *count += 1;
        }
        let id = self.waiters.next.fetch_add(1, Ordering::Relaxed);
        let notify = Arc::new(Notify::new());
        lock(&self.waiters.by_key)
            .entry(key.to_vec())
            .or_default()
            .push((id, notify.clone()));
        let registration = Registration {
            waiters: self.waiters.clone(),
            key: key.to_vec(),
            id,
            notify,
        };
        // Started with the first watch, and again if it ever ended.
        let mut task = lock(&self.task);
        if task.as_ref().is_none_or(JoinHandle::is_finished) {
            *task = Some(tokio::spawn(listen(
                self.driver.clone(),
                self.connector.clone(),
                self.channel.clone(),
                self.waiters.clone(),
            )));
        }
        Ok(registration)
    }
}

/// Resolves once the value under `key` differs from `seen` (`None`: from what it first reads).
pub(super) async fn wait(
    shared: &Arc<Shared>,
    key: Vec<u8>,
    seen: Option<Option<Vec<u8>>>,
) -> Result<(), TxError> {
    // Registered before the first read: a change after that read is notified.
    let registration = shared.listener.register(&key)?;
    let baseline = match seen {
        Some(value) => value,
        None => shared.read(&key).await?,
    };
    loop {
        if shared.read(&key).await? != baseline {
            return Ok(());
        }
        // Whatever woke it (a notification, a reconnect, the bound), it reads again.
        let _ = tokio::time::timeout(WATCH_REREAD, registration.notify.notified()).await;
    }
}

/// The listening connection: `LISTEN`, then every notification wakes its key's waiters; lost,
/// it connects again, and every waiter reads its key once the new `LISTEN` holds.
async fn listen(
    driver: tokio_postgres::Config,
    connector: Connector,
    channel: String,
    waiters: Arc<Waiters>,
) {
    let mut pause = RECONNECT_PAUSE_FIRST;
    loop {
        match driver.connect(connector.clone()).await {
            Ok((client, mut connection)) => {
                // The channel is `vvm.` and a checked schema name: nothing to escape.
                let statement = format!("LISTEN \"{channel}\"");
                let mut listening = Some(Box::pin(client.batch_execute(&statement)));
                loop {
                    let event = poll_fn(|cx| {
                        if let Some(request) = listening.as_mut() {
                            if let Poll::Ready(done) = request.as_mut().poll(cx) {
                                return Poll::Ready(Err(done));
                            }
                        }
                        connection.poll_message(cx).map(Ok)
                    })
                    .await;
                    match event {
                        Err(Ok(())) => {
                            listening = None;
                            pause = RECONNECT_PAUSE_FIRST;
                            waiters.wake_all();
                        }
                        Err(Err(error)) => {
                            tracing::warn!(%error, "PostgreSQL LISTEN failed");
                            break;
                        }
                        Ok(Some(Ok(AsyncMessage::Notification(notification)))) => {
                            waiters.wake_payload(notification.payload());
                        }
                        Ok(Some(Ok(_))) => {}
                        Ok(Some(Err(error))) => {
                            tracing::warn!(%error, "PostgreSQL listening connection lost");
                            break;
                        }
                        Ok(None) => break,
                    }
                }
            }
            Err(error) => tracing::warn!(%error, "PostgreSQL listening connection refused"),
        }
        // Whatever was notified while no connection listened is lost.
        waiters.wake_all();
        tokio::time::sleep(pause).await;
        pause = (pause * 2).min(RECONNECT_PAUSE_MAX);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // covers: Pg.Feed
    #[test]
    fn payloads_wake_their_key_and_others_wake_everyone() {
        assert_eq!(decode_hex("6b31"), Some(b"k1".to_vec()));
        assert_eq!(decode_hex("6b3"), None);
        assert_eq!(decode_hex("zz"), None);
        let waiters = Waiters::default();
        let one = Arc::new(Notify::new());
        let two = Arc::new(Notify::new());
        lock(&waiters.by_key).insert(b"k1".to_vec(), vec![(0, one.clone())]);
        lock(&waiters.by_key).insert(b"k2".to_vec(), vec![(1, two.clone())]);
        let woken = |notify: &Arc<Notify>| {
            let notified = notify.notified();
            let mut notified = std::pin::pin!(notified);
            notified.as_mut().enable()
        };
        waiters.wake_payload("6b31");
        assert!(woken(&one));
        assert!(!woken(&two));
        waiters.wake_payload("");
        assert!(woken(&one) && woken(&two));
    }
}
