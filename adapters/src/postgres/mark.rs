//! Liveness marks of sessions ([`TxKv::take_mark`](crate::txkv::TxKv::take_mark)) as
//! session-level advisory locks (`death=advisory-lock`).
//!
//! | mark | PostgreSQL |
//! |---|---|
//! | take | a connection of its own per session, kept for the session's life: `pg_advisory_lock(k)`, `k` a 64-bit FNV-1a hash of the schema and the session record's key; the connection is made in advance (one kept ready per store handle), so a take fits a session call's timeout |
//! | epoch | the server's start (`pg_postmaster_start_time()`, microseconds): a restarted server, or a standby promoted in its place, holds none of the locks taken before |
//! | free? | inside the waiter's transaction: `pg_try_advisory_xact_lock(k)` when the epoch is the server's, else "cannot tell" |
//! | freed (wake-up) | a connection blocked in `pg_advisory_lock(k)`, which the server grants when the holder's connection ends: one per mark and store handle, shared by every feed waiting on it and kept a second after the last ([`freed`]) |
//! | lost | the holder's connection ended while the mark was not released |
//! | release | the connection closed after the session's record was deleted |
//! | `vvm run` | the supervisor inherits the connection's socket ([`let_children_inherit_session_marks`]) and keeps it until the command's tree is gone: a killed `vvm` frees the lock only after its tree ended, as SQLite's session locks |
//!
//! When this is sound, and when not, is in `specs/stores.md` (`Pg.Marks`).

use std::collections::{BTreeMap, HashMap};
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use tokio::sync::watch;
use tokio_postgres::error::SqlState;
use tokio_postgres::{Client, NoTls};

use super::{failed, lock, map_error, PgError, Shared, Stage};
use crate::txkv::{MarkFuture, TxError};

/// How long after a take the next mark's connection is made.
const SPARE_DELAY: std::time::Duration = std::time::Duration::from_secs(1);

/// The statement that reads the epoch: the server's start, in microseconds since 1970.
pub(super) const EPOCH_SQL: &str =
    "SELECT (extract(epoch FROM pg_postmaster_start_time()) * 1000000)::int8";

/// A duplicate of the socket of every mark this process holds, on every store handle, by the
/// mark's id: what [`let_children_inherit_session_marks`] hands down.
static SOCKETS: Mutex<BTreeMap<u64, OwnedFd>> = Mutex::new(BTreeMap::new());
/// The id of the next mark taken.
static NEXT_ID: AtomicU64 = AtomicU64::new(0);

/// Lets the children this process starts from now on inherit the sockets of the session marks
/// it holds (duplicates, close-on-exec otherwise), so that a mark stays held while such a child
/// lives, also after this process died — `vvm run`'s supervisor keeps them until the last
/// process of the command's tree is gone. Returns the descriptors' numbers, for that process to
/// keep them from its own children.
///
/// # Errors
/// When a descriptor's flags cannot be changed; the others are still changed.
pub fn let_children_inherit_session_marks() -> std::io::Result<Vec<i32>> {
    let sockets = lock(&SOCKETS);
    let mut fds = Vec::with_capacity(sockets.len());
    let mut failed = None;
    for fd in sockets.values() {
        match rustix::io::fcntl_setfd(fd, rustix::io::FdFlags::empty()) {
            Ok(()) => fds.push(fd.as_raw_fd()),
            Err(error) => failed = Some(error),
        }
    }
    match failed {
        Some(error) => Err(error.into()),
        None => Ok(fds),
    }
}

/// What became of a mark this process took.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Fate {
    Held,
    Lost,
    Released,
}

/// A mark held: its connection, and its fate for [`Marks::lost`].
struct Held {
    /// Dropped to release the lock (the connection then ends).
    _client: Client,
    fate: watch::Sender<Fate>,
    epoch: Vec<u8>,
    /// Its socket's duplicate in [`SOCKETS`].
    id: u64,
}

/// The marks this process holds, by mark, and a connection made ready for the next one.
#[derive(Default)]
pub(super) struct Marks {
    held: std::sync::Mutex<HashMap<Vec<u8>, Held>>,
    /// Made in advance (when the store opens, and after each take): taking a mark is then two
    /// statements, well within a session call's timeout (L/40), not a connection's set-up.
    spare: std::sync::Mutex<Option<Spare>>,
    /// Waits for others' marks, each shared by every feed of the handle ([`freed`]).
    waits: std::sync::Mutex<Waits>,
}

/// A connection for the next mark, its epoch read.
struct Spare {
    client: Client,
    id: u64,
    fate: watch::Sender<Fate>,
    epoch: Vec<u8>,
    /// Its socket's duplicate, into [`SOCKETS`] once it holds a mark.
    copy: OwnedFd,
}

/// The advisory lock key of `mark` in `schema`: FNV-1a, stable across versions and processes.
pub(super) fn lock_key(schema: &str, mark: &[u8]) -> i64 {
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    for byte in b"vvm mark\0"
        .iter()
        .chain(schema.as_bytes())
        .chain(b"\0")
        .chain(mark)
    {
        hash ^= u64::from(*byte);
        hash = hash.wrapping_mul(0x0100_0000_01b3);
    }
    i64::from_ne_bytes(hash.to_ne_bytes())
}

fn epoch_bytes(micros: i64) -> Vec<u8> {
    micros.to_be_bytes().to_vec()
}

impl Marks {
    /// Whether this process holds `mark`.
    pub(super) fn holds(&self, mark: &[u8]) -> bool {
        lock(&self.held).contains_key(mark)
    }

    /// Takes `mark` on a connection of its own (see the module documentation) and answers its
    /// epoch; the epoch it was taken in when held already.
    pub(super) async fn take(shared: &Arc<Shared>, mark: &[u8]) -> Result<Vec<u8>, TxError> {
        if let Some(held) = lock(&shared.marks.held).get(mark) {
            return Ok(held.epoch.clone());
        }
        let ready = lock(&shared.marks.spare).take();
        let spare = match ready {
            Some(spare) if !spare.client.is_closed() => spare,
            _ => Spare::open(shared).await?,
        };
        // The next session's, made a moment later: a connection's set-up (a backend forked on
        // the server) would otherwise compete with this session's first calls, which have L/40.
        let next = shared.clone();
        tokio::spawn(async move {
            tokio::time::sleep(SPARE_DELAY).await;
            Marks::prepare(&next).await;
        });
        let Spare {
            client,
            id,
            fate,
            epoch,
            copy,
        } = spare;
        let key = lock_key(&shared.config.schema, mark);
        client
            .execute("SELECT pg_advisory_lock($1)", &[&key])
            .await
            .map_err(|error| map_error(error, Stage::Before))?;
        lock(&SOCKETS).insert(id, copy);
        tracing::debug!(key, "session mark taken");
        lock(&shared.marks.held).insert(
            mark.to_vec(),
            Held {
                _client: client,
                fate,
                epoch: epoch.clone(),
                id,
            },
        );
        Ok(epoch)
    }

    /// Makes a connection ready for the next mark, unless one is; an error leaves it to the
    /// take, which then connects itself.
    pub(super) async fn prepare(shared: &Arc<Shared>) {
        if !shared.config.marks || lock(&shared.marks.spare).is_some() {
            return;
        }
        match Spare::open(shared).await {
            Ok(spare) => {
                let mut slot = lock(&shared.marks.spare);
                if slot.is_none() {
                    *slot = Some(spare);
                }
            }
            Err(error) => {
                tracing::debug!(error = %vvm_runtime::ErrorChain(&error), "cannot make a connection ready for a session's mark");
            }
        }
    }

    /// Releases `mark`: its connection closes, which frees the lock.
    pub(super) fn release(&self, mark: &[u8]) {
        if let Some(held) = lock(&self.held).remove(mark) {
            held.fate.send_replace(Fate::Released);
            lock(&SOCKETS).remove(&held.id);
        }
    }

    /// Resolves when `mark`, held, is lost; pending when not held or once released.
    pub(super) fn lost(&self, mark: &[u8]) -> MarkFuture {
        let Some(mut fate) = lock(&self.held).get(mark).map(|held| held.fate.subscribe()) else {
            return Box::pin(std::future::pending());
        };
        Box::pin(async move {
            if fate
                .wait_for(|fate| *fate != Fate::Held)
                .await
                .ok()
                .map(|f| *f)
                == Some(Fate::Lost)
            {
                tracing::warn!("a session's mark was lost: its connection ended");
                return;
            }
            std::future::pending().await
        })
    }
}

impl Spare {
    /// A connection for a mark (see [`connect_holding`]), its epoch read and the server told
    /// not to end it when idle (servers before 14 do not know the setting: a server that ends
    /// idle sessions would end the mark with it, safe but stopping the holder for nothing).
    async fn open(shared: &Arc<Shared>) -> Result<Spare, TxError> {
        let (client, id, fate, copy) = connect_holding(shared).await?;
        let _ = client.batch_execute("SET idle_session_timeout = 0").await;
        let micros: i64 = client
            .query_one(EPOCH_SQL, &[])
            .await
            .map_err(failed)?
            .try_get(0)
            .map_err(failed)?;
        Ok(Spare {
            client,
            id,
            fate,
            epoch: epoch_bytes(micros),
            copy,
        })
    }
}

/// A connection of its own for a mark: a stream this process opens (so that a duplicate of its
/// socket can go into [`SOCKETS`]) handed to the driver. Answers the client, the mark's id, its
/// fate (which turns to lost when the connection ends while held) and the duplicate.
async fn connect_holding(
    shared: &Arc<Shared>,
) -> Result<(Client, u64, watch::Sender<Fate>, OwnedFd), TxError> {
    let config = &shared.config;
    let timeout = config.connect_timeout;
    let connect = async {
        if config.host.starts_with('/') {
            let path = format!("{}/.s.PGSQL.{}", config.host, config.port);
            let stream = tokio::net::UnixStream::connect(path).await?;
            let copy = rustix::io::fcntl_dupfd_cloexec(stream.as_fd(), 0)?;
            Ok::<_, std::io::Error>((Stream::Unix(stream), copy))
        } else {
            let stream =
                tokio::net::TcpStream::connect((config.host.as_str(), config.port)).await?;
            stream.set_nodelay(true)?;
            let copy = rustix::io::fcntl_dupfd_cloexec(stream.as_fd(), 0)?;
            Ok((Stream::Tcp(stream), copy))
        }
    };
    let (stream, copy) = tokio::time::timeout(timeout, connect)
        .await
        .map_err(|_| {
            failed(PgError::MarkConnect(std::io::Error::new(
                std::io::ErrorKind::TimedOut,
                "the connect timeout passed",
            )))
        })?
        .map_err(|error| failed(PgError::MarkConnect(error)))?;
    let (client, connection) = shared
        .driver
        .connect_raw(stream, NoTls)
        .await
        .map_err(failed)?;
    let id = NEXT_ID.fetch_add(1, Ordering::Relaxed);
    let (fate, _) = watch::channel(Fate::Held);
    let told = fate.clone();
    tokio::spawn(async move {
        // Ends when the connection ends: closed by a release, or lost.
        let _ = connection.await;
        lock(&SOCKETS).remove(&id);
        told.send_if_modified(|fate| {
            let lost = *fate == Fate::Held;
            if lost {
                *fate = Fate::Lost;
            }
            lost
        });
    });
    Ok((client, id, fate, copy))
}

/// The stream of a mark's connection.
enum Stream {
    Tcp(tokio::net::TcpStream),
    Unix(tokio::net::UnixStream),
}

impl tokio::io::AsyncRead for Stream {
    fn poll_read(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &mut tokio::io::ReadBuf<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        match self.get_mut() {
            Stream::Tcp(stream) => std::pin::Pin::new(stream).poll_read(cx, buf),
            Stream::Unix(stream) => std::pin::Pin::new(stream).poll_read(cx, buf),
        }
    }
}

impl tokio::io::AsyncWrite for Stream {
    fn poll_write(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &[u8],
    ) -> std::task::Poll<std::io::Result<usize>> {
        match self.get_mut() {
            Stream::Tcp(stream) => std::pin::Pin::new(stream).poll_write(cx, buf),
            Stream::Unix(stream) => std::pin::Pin::new(stream).poll_write(cx, buf),
        }
    }

    fn poll_flush(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        match self.get_mut() {
            Stream::Tcp(stream) => std::pin::Pin::new(stream).poll_flush(cx),
            Stream::Unix(stream) => std::pin::Pin::new(stream).poll_flush(cx),
        }
    }

    fn poll_shutdown(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        match self.get_mut() {
            Stream::Tcp(stream) => std::pin::Pin::new(stream).poll_shutdown(cx),
            Stream::Unix(stream) => std::pin::Pin::new(stream).poll_shutdown(cx),
        }
    }
}

/// Resolves when `mark`, taken in `epoch`, may have been freed: a connection of its own waits
/// for the lock (see the module documentation). Pending when the server is of another epoch,
/// or cannot be asked (the TTL covers it then), and for a mark this process holds.
pub(super) fn freed(shared: &Arc<Shared>, mark: &[u8], epoch: &[u8]) -> MarkFuture {
    if shared.marks.holds(mark) {
        // This process's own: freed only by its release, after which the record is gone.
        return Box::pin(std::future::pending());
    }
    let shared = shared.clone();
    let key = lock_key(&shared.config.schema, mark);
    let epoch = epoch.to_vec();
    Box::pin(async move {
        if tokio::runtime::Handle::try_current().is_err() {
            // Polled outside tokio, where no wait can run (nor any call of this store): the
            // feed's watches and the TTL remain.
            return std::future::pending().await;
        }
        let mut found = subscribe(&shared, key, epoch);
        // An error: the wait ended without being granted the lock (it said why), and cannot tell.
        if found.wait_for(|found| *found == Found::Freed).await.is_ok() {
            return;
        }
        std::future::pending().await
    })
}

/// What a shared wait for a mark found.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Found {
    Waiting,
    Freed,
    /// The server is not of the mark's epoch: its lock says nothing of the mark.
    CannotTell,
}

/// The shared waits of one store handle, by lock key and epoch.
type Waits = HashMap<(i64, Vec<u8>), Arc<watch::Sender<Found>>>;

/// How long a shared wait outlives its last waiter: a feed's next round, taken after the look a
/// change made, finds it still blocked on the server instead of connecting again.
const WAIT_LINGER: std::time::Duration = std::time::Duration::from_secs(1);

/// Joins the wait for the lock `key` of `epoch`, or starts it: one connection blocked on the
/// server per mark and store handle, however many feeds wait on it and however often they go
/// round.
fn subscribe(shared: &Arc<Shared>, key: i64, epoch: Vec<u8>) -> watch::Receiver<Found> {
    let id = (key, epoch);
    let mut waits = lock(&shared.marks.waits);
    if let Some(sender) = waits.get(&id) {
        return sender.subscribe();
    }
    let (sender, receiver) = watch::channel(Found::Waiting);
    let sender = Arc::new(sender);
    waits.insert(id.clone(), Arc::clone(&sender));
    drop(waits);
    tokio::spawn(run_wait(Arc::clone(shared), id, sender));
    receiver
}

/// Runs a shared wait until the lock is granted, the wait fails, or its last waiter has been gone
/// for [`WAIT_LINGER`]. The entry leaves the map under its lock before the end, so no waiter
/// joins a wait that is ending; one freed or failed leaves at once (a later feed waits anew).
async fn run_wait(shared: Arc<Shared>, id: (i64, Vec<u8>), sender: Arc<watch::Sender<Found>>) {
    let leave = |shared: &Shared| {
        lock(&shared.marks.waits).remove(&id);
    };
    let wait = wait_free(&shared, id.0, &id.1);
    let mut wait = std::pin::pin!(wait);
    let result = loop {
        tokio::select! {
            result = &mut wait => break result,
            () = sender.closed() => {}
        }
        tokio::select! {
            result = &mut wait => break result,
            () = tokio::time::sleep(WAIT_LINGER) => {}
        }
        let mut waits = lock(&shared.marks.waits);
        if sender.receiver_count() == 0 {
            waits.remove(&id);
            return;
        }
    };
    match result {
        Ok(true) => {
            leave(&shared);
            sender.send_replace(Found::Freed);
        }
        Ok(false) => {
            // Kept while waited on, so that feeds do not connect again to learn the same.
            sender.send_replace(Found::CannotTell);
            loop {
                sender.closed().await;
                tokio::time::sleep(WAIT_LINGER).await;
                let mut waits = lock(&shared.marks.waits);
                if sender.receiver_count() == 0 {
                    waits.remove(&id);
                    return;
                }
            }
        }
        Err(error) => {
            tracing::debug!(error = %vvm_runtime::ErrorChain(&error), "cannot wait for a session's mark");
            leave(&shared);
        }
    }
}

/// `Ok(true)` once the lock `key` was granted to this waiter (and given back), `Ok(false)`
/// when the server is not of `epoch`.
async fn wait_free(shared: &Arc<Shared>, key: i64, epoch: &[u8]) -> Result<bool, PgError> {
    // The store's own TLS: a waiter need not hold marks to judge others' by theirs.
    let client = super::connect_client(&shared.driver, &shared.connector).await?;
    let micros: i64 = client.query_one(EPOCH_SQL, &[]).await?.try_get(0)?;
    if epoch_bytes(micros) != epoch {
        return Ok(false);
    }
    loop {
        // The connection's lock and statement timeouts end each wait; wait again then.
        match client.execute("SELECT pg_advisory_lock($1)", &[&key]).await {
            Ok(_) => break,
            Err(error)
                if error.code().is_some_and(|code| {
                    [SqlState::LOCK_NOT_AVAILABLE, SqlState::QUERY_CANCELED].contains(code)
                }) => {}
            Err(error) => return Err(error.into()),
        }
    }
    // Closing the connection would free it too; unlock first so that the holder's successor
    // does not wait for the close.
    client
        .execute("SELECT pg_advisory_unlock($1)", &[&key])
        .await?;
    Ok(true)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lock_keys_are_stable_and_differ_by_schema_and_mark() {
        let a = lock_key("vvm", b"vvm/slot/session/1-1");
        assert_eq!(a, lock_key("vvm", b"vvm/slot/session/1-1"));
        assert_ne!(a, lock_key("vvm2", b"vvm/slot/session/1-1"));
        assert_ne!(a, lock_key("vvm", b"vvm/slot/session/1-2"));
        // FNV-1a of a known input: every version must derive the same key, or a waiter would
        // ask for a lock nobody holds and judge a live holder dead.
        assert_eq!(a, -7_155_926_080_419_571_489);
    }
}
