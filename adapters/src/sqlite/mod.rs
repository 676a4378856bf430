//! The embedded store: one SQLite file shared by the processes of one host.
//!
//! ```
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! use std::time::Duration;
//! use vvm_adapters::SqliteStore;
//! use vvm_core::{Incarnation, Slot};
//! use vvm_runtime::{LeaseStore, LeaseValue};
//!
//! // Every process of the host opens the same file.
//! let dir = std::env::temp_dir().join(format!("vvm-sqlite-doc-{}", std::process::id()));
//! std::fs::create_dir_all(&dir)?;
//! let store = SqliteStore::open(dir.join("vvm.sqlite"))?;
//! let value = LeaseValue::new("10.0.0.1:7000", Incarnation(1));
//! let won = store.insert_if_not_exists(Slot(1), &value, Duration::from_secs(20)).await?;
//! assert!(won.is_some());
//! let other = LeaseValue::new("10.0.0.2:7000", Incarnation(2));
//! let lost = store.insert_if_not_exists(Slot(1), &other, Duration::from_secs(20)).await?;
//! assert_eq!(lost, None); // the slot is held until its lease ends
//! # drop(store);
//! # std::fs::remove_dir_all(&dir)?;
//! # Ok(()) }
//! ```
//!
//! **Atomicity.** Every write operation is one `BEGIN IMMEDIATE` transaction: the write lock is
//! taken first, then the record is read, judged and written, then committed. Two processes
//! can never both see a slot free. `get` is one read transaction (WAL readers take no lock).
//!
//! **Expiry** is judged by [`StoreClock`], by default [`BootClock`]: `CLOCK_BOOTTIME` plus the
//! boot id, never the wall clock. The clock is read after the lock is taken, so a later
//! transaction never sees an earlier time than a committed one.
//!
//! **One machine.** That clock is one machine's, so a file belongs to one machine: the first
//! open records the machine id ([`host_machine_id`], or the one given to
//! [`SqliteStoreBuilder::machine_id`]), and opening the file from another machine fails with
//! [`SqliteStoreError::OtherMachine`], leaving the file unchanged. Several hosts need a store
//! that judges expiry for all of them: etcd or FoundationDB.
//!
//! **Revisions** come from one counter in the file that deletes do not reset, so they strictly
//! increase per key (and across keys), also across delete and re-insert and across reboots
//! (see [`REVISION_BOOT_GAP`]).
//!
//! **Durability.** `journal_mode=WAL` with `synchronous=NORMAL`: a commit appends to the log
//! without a disk sync — tens of microseconds, where `FULL` adds one sync per commit (0.17 ms on
//! a quiet disk, several milliseconds on a busy one; see `BENCHMARKS.md`). A renewal must not
//! wait on the disk. A crashed *process* loses nothing; a power loss or kernel crash may lose the
//! last commits, but it also reboots the host, and records of an earlier boot are expired
//! anyway. What must survive — a revision is never handed out twice — is guarded by the synced
//! counter jump of a new boot.
//!
//! **Lock waits** are bounded ([`BUSY_WAIT_DEFAULT`]) and polled at most [`POLL_MAX`] apart instead
//! of SQLite's growing sleeps, which starve a waiter; a wait that runs out is
//! [`StoreError::Failed`]. An error at `COMMIT` of a transaction that wrote is
//! [`StoreError::Unknown`]; every error before it is `Failed`.
//!
//! **Blocking.** A transaction is tens of microseconds of blocking I/O, longer while waiting
//! for the lock. Each call takes the store's connection (a `tokio` mutex: waiting callers queue in
//! order without occupying threads) and runs on tokio's blocking pool with
//! `spawn_blocking`, so the async worker threads never block. A caller that gives up (its
//! timeout) does not interrupt a transaction: it finishes or rolls back on its own. Clones of a
//! store share one connection; separate [`SqliteStore::open`]s have their own.
//!
//! **A dead holder** is known at once on one host (`lock.rs`). The holder
//! of a slot keeps an exclusive `flock` on the slot's lock file (`<database>.slot-<n>.lock`)
//! from before its insert until its release is done or it (and every process that inherited the
//! descriptor) is gone, and its record names that file (device, inode). A candidate whose insert
//! obtains that very lock while the record is another holder's, the file still linked at its
//! path, takes the slot at once with a new revision: no process that could act under the record
//! is left. A stopped or hung holder keeps its lock, and a removed or replaced lock file names
//! nothing, so those cases wait for the expiry as before.
//!
//! **Sessions** (`session.rs`): the store is a [`SessionStore`](vvm_runtime::SessionStore).
//! Session records are rows of their own table, judged by the same clock; a holding is a slot's
//! row that names its session and is judged by the session's row in the same statement that
//! reads it, so it is live exactly while the session is, for every operation and reader. A
//! keepalive writes the session's row only; ending a session deletes its holdings in the same
//! transaction. A session has one lock file of its own, held by its process for the session's
//! life: a session whose lock is free is ended at once, with all its holdings and semaphore
//! units, in one transaction (`session.rs`).
//!
//! **Semaphores** (`semaphore.rs`): the store is a
//! [`SemaphoreStore`](vvm_runtime::SemaphoreStore). One row per name holds the encoded state;
//! every operation is one write transaction that judges the parties' sessions by their rows.
//!
//! **Fencing the user's own writes**: [`SqliteStore::guard`] turns a holding's fencing token
//! into a check the user runs inside their own `BEGIN IMMEDIATE` transaction on the same file:
//! its writes commit only while the holding is live. See [`SqliteGuard`].
//!
//! **Corrupt rows** never panic the decoder: a live record that cannot be read is
//! [`StoreError::Corrupt`] for `get` and never matches an expected lease, so it is not
//! overwritten or deleted before it expires.

mod busy;
mod clock;
mod error;
mod feed;
mod file;
mod guard;
mod lock;
mod notify;
mod parties;
mod probe;
mod reader;
mod record;
mod schema;
mod semaphore;
mod session;

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use rusqlite::{Connection, Transaction, TransactionBehavior};
use vvm_core::{Revision, Slot};
use vvm_runtime::{Inserted, Lease, LeaseStore, LeaseValue, SlotChange, StoreError};

pub use busy::{ATTEMPTS_MAX, POLL_MAX, POLL_MIN};
pub use clock::{
    boottime_offset_ns, host_machine_id, BootClock, ClockError, StoreClock, BOOT_ID_MAX_BYTES,
    BOOT_ID_PATH, MACHINE_ID_MAX_BYTES, MACHINE_ID_PATHS,
};
pub use error::SqliteStoreError;
pub use feed::LOCK_WATCH_SLOTS_MAX;
pub use file::{Sharing, Untrusted};
pub use guard::{SqliteGuard, SqliteGuardError};
pub use lock::{let_children_inherit_slot_locks, SLOT_LOCKS_MAX};
pub use notify::{FEED_BACKSTOP_LOOK, FEED_SAFETY_LOOK, SETTLE_LOOKS_MS};
pub use probe::write_locked;
/// The SQLite binding this store is built on, for the user's own transactions that a
/// [`SqliteGuard`] checks.
pub use rusqlite;
pub use schema::{APPLICATION_ID, REVISION_BOOT_GAP, SCHEMA_VERSION};
pub use session::SWEEP_SESSIONS_MAX;

use busy::{is_busy, Backoff};
use record::{Judged, Now, Stored, TxError};

/// How long an operation waits for the write lock by default: well below the store-call
/// timeout of the shortest lease (`L/40` = 50 ms for 2 s), so that a congested store reports
/// [`StoreError::Failed`] (nothing written) rather than running into the caller's timeout.
pub const BUSY_WAIT_DEFAULT: Duration = Duration::from_millis(20);

/// The longest lock wait that may be configured.
pub const BUSY_WAIT_MAX: Duration = Duration::from_secs(10);
/// The least lock wait while a store is opened (a one-time step whose failure ends the process):
/// another opener or a holder descheduled inside its transaction on a loaded host is waited out.
pub const OPEN_BUSY_WAIT: Duration = Duration::from_secs(2);

/// Options of [`SqliteStore`]; [`SqliteStore::open`] uses the defaults.
#[derive(Clone)]
pub struct SqliteStoreBuilder {
    busy_wait: Duration,
    clock: Option<Arc<dyn StoreClock>>,
    machine_id: Option<String>,
    sharing: Sharing,
    read_only: bool,
}

impl std::fmt::Debug for SqliteStoreBuilder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SqliteStoreBuilder")
            .field("busy_wait", &self.busy_wait)
            .field(
                "clock",
                &self.clock.as_ref().map(|clock| clock.boot_id().to_owned()),
            )
            .field("machine_id", &self.machine_id)
            .field("sharing", &self.sharing)
            .field("read_only", &self.read_only)
            .finish()
    }
}

impl SqliteStoreBuilder {
    /// How long one operation waits for the write lock before failing; default
    /// [`BUSY_WAIT_DEFAULT`], at most [`BUSY_WAIT_MAX`].
    pub fn busy_wait(mut self, busy_wait: Duration) -> Self {
        self.busy_wait = busy_wait;
        self
    }

    /// Judges expiry by `clock` instead of [`BootClock`]. Every process sharing the file must
    /// use the same clock.
    pub fn clock(mut self, clock: impl StoreClock) -> Self {
        self.clock = Some(Arc::new(clock));
        self
    }

    /// Opens the file as machine `machine_id` instead of [`host_machine_id`]: for tests that
    /// play two machines on one file. Non-empty printable ASCII, at most
    /// [`MACHINE_ID_MAX_BYTES`].
    pub fn machine_id(mut self, machine_id: impl Into<String>) -> Self {
        self.machine_id = Some(machine_id.into());
        self
    }

    /// Who besides this user may use the store's files; default [`Sharing::Private`] (files
    /// `0600`, a file another user owns or can read or write is refused). See [`Sharing::Group`].
    pub fn sharing(mut self, sharing: Sharing) -> Self {
        self.sharing = sharing;
        self
    }

    /// Opens the store for reading only: nothing is ever created or written — no schema, no
    /// machine or boot record, no `-wal`, `-shm` or lock file (see `reader.rs`) — and every write
    /// fails with [`SqliteStoreError::OpenedReadOnly`] inside [`StoreError::Failed`]. The file must
    /// hold a store of this version and machine; it may belong to another user.
    pub fn read_only(mut self) -> Self {
        self.read_only = true;
        self
    }

    /// Opens (or creates) the store at `path`. Blocks for the few file operations of opening,
    /// and up to the busy wait per step while other processes hold the lock.
    pub fn open(self, path: impl AsRef<Path>) -> Result<SqliteStore, SqliteStoreError> {
        if self.busy_wait > BUSY_WAIT_MAX {
            return Err(SqliteStoreError::BusyWaitTooLong {
                busy_wait: self.busy_wait,
                max: BUSY_WAIT_MAX,
            });
        }
        let clock = match self.clock {
            Some(clock) => clock,
            None => Arc::new(BootClock::new()?),
        };
        let machine_id = match self.machine_id {
            Some(id) => clock::check_machine_id(id)?,
            None => host_machine_id()?,
        };
        let path = path.as_ref();
        let conn = if self.read_only {
            reader::check(path, &machine_id)?;
            None
        } else {
            let conn = schema::open(
                path,
                clock.as_ref(),
                &machine_id,
                self.busy_wait,
                self.sharing,
            )?;
            Some(Arc::new(tokio::sync::Mutex::new(conn)))
        };
        Ok(SqliteStore {
            conn,
            shared: Arc::new(Shared {
                clock,
                busy_wait: self.busy_wait,
                sharing: self.sharing,
                path: path.to_owned(),
                file: match self.read_only {
                    true => None,
                    false => {
                        Some(
                            lock::file_id(path).ok_or_else(|| SqliteStoreError::Replaced {
                                path: path.to_owned(),
                            })?,
                        )
                    }
                },
                unclaimed: std::sync::Mutex::default(),
                unreleased: crate::unreleased::Unreleased::default(),
                session_ttls: session::SessionTtls::default(),
                feed: Arc::new(feed::Feed::new(path, self.read_only)),
                write_transactions: std::sync::atomic::AtomicU64::new(0),
            }),
        })
    }
}

struct Shared {
    clock: Arc<dyn StoreClock>,
    busy_wait: Duration,
    sharing: Sharing,
    path: PathBuf,
    /// The database file this store opened: a transaction on a file no longer linked at `path`
    /// (removed, replaced) fails, so a holder cannot go on renewing where nobody else looks.
    file: Option<lock::FileId>,
    /// Slots where this process met another holder's live record (`None`), or found no row on
    /// a used slot, and when (boot-clock nanoseconds) it first saw that (`Some`); see `insert`.
    unclaimed: std::sync::Mutex<std::collections::HashMap<Slot, Option<i64>>>,
    /// Semaphore owners whose session row this handle found deleted from outside, and when it
    /// first saw each so (`semaphore.rs`).
    unreleased: crate::unreleased::Unreleased,
    /// The TTL of each session this handle made or kept alive: what an owner deleted from
    /// outside is waited out for (`semaphore.rs`).
    session_ttls: session::SessionTtls,
    /// The one change feed of this handle and its clones, which every waiter subscribes to;
    /// see [`feed`].
    feed: Arc<feed::Feed>,
    /// Write transactions (`BEGIN IMMEDIATE`) begun so far: see
    /// [`SqliteStore::write_transactions`].
    write_transactions: std::sync::atomic::AtomicU64,
}

impl Shared {
    /// This process met another holder's live record under `key`.
    fn met(&self, key: Slot) {
        let mut unclaimed = self
            .unclaimed
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if unclaimed.len() < lock::SLOT_LOCKS_MAX || unclaimed.contains_key(&key) {
            unclaimed.insert(key, None);
        }
    }

    /// Whether this process met a live record under `key` that it has not seen go since: the
    /// evidence of a holder that is left where the slot's lock file was removed with the rows.
    fn met_live(&self, key: Slot) -> bool {
        let unclaimed = self
            .unclaimed
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        unclaimed.contains_key(&key)
    }

    /// This process wrote its own record under `key`: nothing is waited for there.
    fn claimed(&self, key: Slot) {
        let mut unclaimed = self
            .unclaimed
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        unclaimed.remove(&key);
    }

    /// How long a candidate still waits on `key`, found with no row on a used slot (see
    /// `insert`), at `now_ns`: what is left of a lease (`ttl`) from
    /// when this process first saw it so, or `None` once that has passed. A holder that lost its
    /// record stops renewing at once (its compare-and-swap finds nothing) and its kill deadline
    /// passes within a lease of its last confirmed renewal, which came before that first sight.
    fn unclaimed_left(&self, key: Slot, now_ns: i64, ttl: Duration) -> Option<Duration> {
        let mut unclaimed = self
            .unclaimed
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let gone_since_ns = unclaimed.entry(key).or_insert(None);
        let first_sight = gone_since_ns.is_none();
        let first_ns = *gone_since_ns.get_or_insert(now_ns);
        let waited = Duration::from_nanos(u64::try_from(now_ns - first_ns).unwrap_or(0));
        match ttl.checked_sub(waited) {
            Some(left) if !left.is_zero() => {
                // Once per sight, not at every look.
                if first_sight {
                    tracing::warn!(
                    slot = key.0,
                    left_ms = left.as_millis() as u64,
                    "the slot's record vanished without a release (deleted from outside, or the \
                     store's file replaced): its holder may still act; waiting a lease from \
                     first sight"
                    );
                }
                // Looked at again soon: a row may come back (a holder's write, a restored file).
                Some(left.min(UNCLAIMED_RECHECK))
            }
            _ => {
                unclaimed.remove(&key);
                None
            }
        }
    }

    /// Fails when the file at the store's path is no longer the one it opened.
    fn still_linked(&self) -> Result<(), StoreError> {
        match self.file {
            Some(id) if !lock::linked(&self.path, id) => {
                Err(StoreError::failed(SqliteStoreError::Gone {
                    path: self.path.clone(),
                }))
            }
            _ => Ok(()),
        }
    }
}

/// How soon a candidate waiting on a slot whose record vanished under a live lock looks again.
const UNCLAIMED_RECHECK: Duration = Duration::from_millis(50);

/// A [`LeaseStore`] in an SQLite file. Cloning shares the connection.
#[derive(Clone)]
pub struct SqliteStore {
    /// `None` when opened read-only: each call opens its own reading connection.
    conn: Option<Arc<tokio::sync::Mutex<Connection>>>,
    shared: Arc<Shared>,
}

impl std::fmt::Debug for SqliteStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SqliteStore")
            .field("path", &self.shared.path)
            .finish_non_exhaustive()
    }
}

impl SqliteStore {
    /// Options for opening a store.
    pub fn builder() -> SqliteStoreBuilder {
        SqliteStoreBuilder {
            busy_wait: BUSY_WAIT_DEFAULT,
            clock: None,
            machine_id: None,
            sharing: Sharing::Private,
            read_only: false,
        }
    }

    /// Opens (or creates) the store at `path` with the boot clock and the default busy wait.
    pub fn open(path: impl AsRef<Path>) -> Result<Self, SqliteStoreError> {
        SqliteStore::builder().open(path)
    }

    /// The database file.
    pub fn path(&self) -> &Path {
        &self.shared.path
    }

    /// How many times this handle's change feed (shared by its clones) looked at the file so
    /// far: `PRAGMA data_version` checks and reads of the watched rows. Waiting costs looks
    /// only when the file changed, plus one a [`FEED_BACKSTOP_LOOK`] (a [`FEED_SAFETY_LOOK`]
    /// while something is told by nothing else): for tests and benchmarks.
    #[doc(hidden)]
    pub fn feed_looks(&self) -> u64 {
        self.shared.feed.looks()
    }

    /// How many write transactions (`BEGIN IMMEDIATE`, each holding the file's one write lock
    /// until it ends) this handle and its clones began so far: an insert refused by a live
    /// holder takes none. For tests and benchmarks.
    #[doc(hidden)]
    pub fn write_transactions(&self) -> u64 {
        self.shared
            .write_transactions
            .load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Whether the store was opened read-only ([`SqliteStoreBuilder::read_only`]).
    pub fn is_read_only(&self) -> bool {
        self.conn.is_none()
    }

    /// Fails a write to a store opened read-only, before anything is tried.
    fn writable(&self) -> Result<(), StoreError> {
        match self.conn {
            Some(_) => Ok(()),
            None => Err(StoreError::failed(SqliteStoreError::OpenedReadOnly)),
        }
    }

    /// Runs `body` in one transaction on the blocking pool.
    async fn transact<T: Send + 'static>(
        &self,
        behavior: TransactionBehavior,
        body: impl FnMut(&Transaction<'_>, Now<'_>) -> Result<Step<T>, TxError> + Send + 'static,
    ) -> Result<T, StoreError> {
        self.blocking(move |conn, shared| transact(conn, shared, behavior, body))
            .await
    }

    /// Runs `work` with the connection on the blocking pool.
    async fn blocking<T: Send + 'static>(
        &self,
        work: impl FnOnce(&mut Connection, &Shared) -> Result<T, StoreError> + Send + 'static,
    ) -> Result<T, StoreError> {
        let shared = Arc::clone(&self.shared);
        let task = match &self.conn {
            Some(conn) => {
                let mut conn = Arc::clone(conn).lock_owned().await;
                tokio::task::spawn_blocking(move || work(&mut conn, &shared))
            }
            None => tokio::task::spawn_blocking(move || {
                let mut conn = reader::connect(&shared.path).map_err(StoreError::failed)?;
                work(&mut conn, &shared)
            }),
        };
        match task.await {
            Ok(result) => result,
            // Never started (the runtime is shutting down): nothing was written.
            Err(error) if error.is_cancelled() => Err(StoreError::failed(error)),
            Err(error) => Err(StoreError::unknown(error)),
        }
    }

    /// Rewrites the record under `key` with `bytes` and a fresh `ttl` in one write transaction
    /// if the live record equals `expected`; the new revision, or `None`.
    async fn swap(
        &self,
        key: Slot,
        expected: Stored,
        bytes: Vec<u8>,
        ttl: Duration,
    ) -> Result<Option<Revision>, StoreError> {
        self.transact(TransactionBehavior::Immediate, move |tx, now| {
            match record::load(tx, key, now)? {
                Judged::Live(stored, _) if stored == expected => {
                    // A rewrite by the holder: the record goes on naming the holder's lock.
                    let lock = record::lock_of(tx, key)?;
                    let revision = record::write(tx, key, &bytes, ttl, now, lock)?;
                    Ok(Step::wrote(Some(revision)))
                }
                _ => Ok(Step::read(None)),
            }
        })
        .await
    }
}

/// What an insert did.
enum Taken {
    /// Written on a free slot.
    Written(Revision),
    /// Written over the live record of a holder known dead by its lock.
    FromDead(Revision),
    /// A live record holds the slot, with this long left.
    Held(Duration),
}

/// The insert of [`LeaseStore::insert_or_time_left`], with the slot's lock (see `lock.rs`):
/// blocking, on the blocking pool.
///
/// The lock is taken inside the write transaction: only the one writer competes for it there,
/// so two processes inserting at once can never make each other's record name no lock file
/// (which would leave a dead winner to the expiry).
fn insert(
    conn: &mut Connection,
    shared: &Shared,
    key: Slot,
    bytes: Vec<u8>,
    ttl: Duration,
) -> Result<Inserted, StoreError> {
    let lock_path = lock::path(&shared.path, key);
    if let Some(left) = refused_by_a_live_holder(conn, shared, key, &bytes, &lock_path) {
        shared.met(key);
        return Ok(Inserted::Held { left: Some(left) });
    }
    // Kept across the transaction: a release of ours cannot let go of the lock meanwhile.
    let mut registry = lock::registry();
    let held = registry.held(&lock_path);
    let mut fresh: Option<lock::SlotLock> = None;
    let mut refused: Option<lock::NotTaken> = None;
    // Judged once, before this insert may mark the lock file: a retried transaction must not
    // take its own mark for a trace of another holder.
    let mut used_before: Option<bool> = None;
    let result = transact(conn, shared, TransactionBehavior::Immediate, |tx, now| {
        let mut judged = record::load(tx, key, now)?;
        // A live holding of a session whose process is gone by its lock: that session ends
        // here, with all its holdings, and the slot is free (`session.rs`).
        let mut session_ended = false;
        if let Judged::Live(..) = judged {
            if let Some(holder) = record::holding_of(tx, key)? {
                if session::end_if_dead(tx, shared, holder)? {
                    judged = Judged::Absent;
                    session_ended = true;
                }
            }
        }
        let worth_locking = match &judged {
            Judged::Absent => true,
            Judged::Live(stored, _) => may_be_dead(tx, key, stored, &bytes, &lock_path)?,
        };
        let used_before =
            *used_before.get_or_insert_with(|| lock::marked_used(&lock_path, shared.sharing));
        if held.is_none() && fresh.is_none() && worth_locking {
            // A live record's holder keeps its lock for its tenure: met exclusively held, the
            // answer is known at once, without sleeping in the write transaction.
            let tries = match judged {
                Judged::Absent => lock::Tries::Patient,
                Judged::Live(..) => lock::Tries::UnlessHeld,
            };
            match lock::try_lock(&registry, &lock_path, shared.sharing, tries) {
                Ok(lock) => fresh = Some(lock),
                Err(why) => refused = Some(why),
            }
        }
        let fresh_id = fresh.as_ref().map(|lock| lock.id);
        match judged {
            Judged::Absent => {
                // No row at all on a slot that was used (a holder marked its lock file), where a live record was met, or while a live process holds the slot's
                // lock: the record was deleted from outside, or the store's file replaced, under
                // a holder that may still act — one that named no lock included, whose lock file
                // a stopped predecessor held; a free lock proves nothing of it. Neither a release
                // (it leaves a retired row) nor an expiry (it leaves an expired one): wait a
                // lease from first sight.
                let lock_held = refused == Some(lock::NotTaken::HeldElsewhere);
                if !session_ended
                    && held.is_none()
                    && (lock_held || used_before || shared.met_live(key))
                    && !record::row_exists(tx, key)?
                {
                    if let Some(left) = shared.unclaimed_left(key, now.ns, ttl) {
                        return Ok(Step::read(Taken::Held(left)));
                    }
                }
                // A holding deleted from outside under a session that may still act.
                if let Some(left) = session::removed_while_held(tx, shared, key, None, now)? {
                    return Ok(Step::read(Taken::Held(left)));
                }
                let revision = record::write(tx, key, &bytes, ttl, now, held.or(fresh_id))?;
                lock::mark_used(&lock_path, shared.sharing);
                Ok(Step::wrote(match session_ended {
                    true => Taken::FromDead(revision),
                    false => Taken::Written(revision),
                }))
            }
            Judged::Live(_, left) => match fresh_id {
                // The lock the record names was free: nobody is left to act under it.
                Some(id) if worth_locking && record::lock_of(tx, key)? == Some(id) => {
                    let revision = record::write(tx, key, &bytes, ttl, now, Some(id))?;
                    Ok(Step::wrote(Taken::FromDead(revision)))
                }
                _ => {
                    shared.met(key);
                    Ok(Step::read(Taken::Held(left)))
                }
            },
        }
    });
    let ours = held.is_some() || fresh.is_some();
    match &result {
        // Written, or perhaps written: the record names our lock, which stays until its release.
        Ok(Taken::Written(_) | Taken::FromDead(_)) | Err(StoreError::Unknown { .. }) => {
            shared.claimed(key);
            if ours {
                registry.keep(&lock_path, fresh);
            }
        }
        // Nothing written: a lock taken for this insert is let go (dropped).
        Ok(Taken::Held(_)) | Err(_) => {}
    }
    drop(registry);
    Ok(match result? {
        Taken::Written(revision) => Inserted::Written(revision),
        Taken::FromDead(revision) => {
            tracing::info!(
                slot = key.0,
                revision = revision.0,
                "slot taken at once: its holder's lock was free, so the holder is gone"
            );
            Inserted::Written(revision)
        }
        Taken::Held(left) => Inserted::Held { left: Some(left) },
    })
}

/// The time left of a live record under `key` that the insert of `bytes` would be refused by
/// all the same: the slot's lock file (at `lock_path`) is held exclusively — its holder lives —
/// and a read transaction (a WAL read never waits for the write lock, nor holds it) finds a
/// live record of another holder (or ours) naming that very file, or naming none. `None` — the
/// write transaction decides, as before — for anything else: a lock free or held only by
/// watchers (a hand-off, a dead holder: then nothing is read here), no live record, a holding
/// of a session (whose death the write transaction judges and ends), another file, any error.
///
/// A waiting candidate tries its insert at each of its rounds: each used to take the store's
/// one write lock to be refused, and, on a lock its holder keeps, to sleep through the lock's
/// tries inside it (about a millisecond each). A refusal judged on a read is as sound as one
/// under the lock: it writes nothing, and a release or a death after this look wakes the
/// candidate's change feed (the record changes, or the lock it names is let go), which it
/// subscribes before its insert (`LeaseStore::changed`).
fn refused_by_a_live_holder(
    conn: &mut Connection,
    shared: &Shared,
    key: Slot,
    bytes: &[u8],
    lock_path: &Path,
) -> Option<Duration> {
    // The lock first: at a hand-off it is free, and the standbys that all try at once read
    // nothing more than before.
    let held = lock::held_exclusively(lock_path, shared.sharing)?;
    let judged = transact(conn, shared, TransactionBehavior::Deferred, |tx, now| {
        let Judged::Live(stored, left) = record::load(tx, key, now)? else {
            return Ok(Step::read(None));
        };
        if record::holding_of(tx, key)?.is_some() {
            return Ok(Step::read(None));
        }
        let refused = match may_be_dead(tx, key, &stored, bytes, lock_path)? {
            // Its holder keeps the very lock the record names.
            true => record::lock_of(tx, key)? == Some(held),
            // Ours, unreadable, or naming no lock still linked here: refused until its expiry.
            false => true,
        };
        Ok(Step::read(refused.then_some(left)))
    });
    judged.ok().flatten()
}

/// Whether the live record `stored` under `key` may belong to a holder that can no longer act,
/// which its lock then tells: another holder's readable record that names a lock file, the one
/// still linked at `lock_path`.
fn may_be_dead(
    tx: &Transaction<'_>,
    key: Slot,
    stored: &Stored,
    bytes: &[u8],
    lock_path: &Path,
) -> Result<bool, TxError> {
    if stored.is_value(bytes) || stored.lease(key).is_err() {
        // Ours (resolved by the caller's read-back), or unreadable (never overwritten alive).
        return Ok(false);
    }
    Ok(match record::lock_of(tx, key)? {
        Some(id) => lock::linked(lock_path, id),
        None => false,
    })
}

/// What a transaction body did: its result, and whether it wrote, which decides what a
/// failed `COMMIT` means.
struct Step<T> {
    result: T,
    wrote: bool,
}

impl<T> Step<T> {
    fn read(result: T) -> Self {
        Step {
            result,
            wrote: false,
        }
    }

    fn wrote(result: T) -> Self {
        Step {
            result,
            wrote: true,
        }
    }
}

fn failed(what: &'static str, source: rusqlite::Error) -> StoreError {
    StoreError::failed(SqliteStoreError::Sqlite { what, source })
}

fn locked(shared: &Shared, backoff: &Backoff) -> StoreError {
    tracing::warn!(busy_wait = ?shared.busy_wait, attempts = backoff.attempts(), "SQLite lock wait ran out");
    StoreError::failed(SqliteStoreError::Busy {
        what: "running a transaction",
        busy_wait: shared.busy_wait,
    })
}

/// One transaction, retried while another connection holds the lock, within the busy wait.
/// Blocking.
fn transact<T>(
    conn: &mut Connection,
    shared: &Shared,
    behavior: TransactionBehavior,
    mut body: impl FnMut(&Transaction<'_>, Now<'_>) -> Result<Step<T>, TxError>,
) -> Result<T, StoreError> {
    let mut backoff = Backoff::new(shared.busy_wait);
    loop {
        // A rollback that failed earlier leaves a transaction open; end it before starting one.
        if !conn.is_autocommit() {
            conn.execute_batch("ROLLBACK")
                .map_err(|error| failed("ending an earlier transaction", error))?;
        }
        let tx = match conn.transaction_with_behavior(behavior) {
            Ok(tx) => tx,
            Err(error) if is_busy(&error) => match backoff.wait() {
                true => continue,
                false => return Err(locked(shared, &backoff)),
            },
            Err(error) => return Err(failed("beginning a transaction", error)),
        };
        if matches!(behavior, TransactionBehavior::Immediate) {
            shared
                .write_transactions
                .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        }
        // A holder whose file was removed or replaced must not go on in a file nobody else
        // reads: checked under the lock, so no write of this transaction lands after it.
        shared.still_linked()?;
        // Read under the lock: no later transaction can see an earlier time.
        let since_boot = shared
            .clock
            .since_boot()
            .map_err(|error| StoreError::failed(SqliteStoreError::Clock(error)))?;
        let now = Now {
            boot_id: shared.clock.boot_id(),
            ns: i64::try_from(since_boot.as_nanos()).unwrap_or(i64::MAX),
        };
        // Dropping `tx` on any early return rolls back: nothing of this attempt is written.
        let step = match body(&tx, now) {
            Ok(step) => step,
            // A first read in WAL mode may meet a lock too (e.g. during recovery).
            Err(TxError::Busy) => {
                drop(tx);
                match backoff.wait() {
                    true => continue,
                    false => return Err(locked(shared, &backoff)),
                }
            }
            Err(TxError::Store(error)) => return Err(error),
        };
        return match tx.commit() {
            Ok(()) => {
                if step.wrote {
                    // This process's waiters on the file learn of it before the call returns.
                    notify::committed(&shared.path);
                }
                Ok(step.result)
            }
            Err(source) if step.wrote => Err(StoreError::unknown(SqliteStoreError::Sqlite {
                what: "committing a write",
                source,
            })),
            Err(error) => Err(failed("committing a read", error)),
        };
    }
}

impl LeaseStore for SqliteStore {
    async fn insert_if_not_exists(
        &self,
        key: Slot,
        value: &LeaseValue,
        ttl: Duration,
    ) -> Result<Option<Revision>, StoreError> {
        Ok(match self.insert_or_time_left(key, value, ttl).await? {
            Inserted::Written(revision) => Some(revision),
            Inserted::Held { .. } => None,
        })
    }

    /// One transaction: the record is judged once, and a refusal carries its time left on the
    /// store clock. The slot's lock is taken first (see `lock.rs`): the record names it, and a
    /// live record of a holder known dead by it is taken over.
    async fn insert_or_time_left(
        &self,
        key: Slot,
        value: &LeaseValue,
        ttl: Duration,
    ) -> Result<Inserted, StoreError> {
        self.writable()?;
        let bytes = value.encode().into_bytes();
        self.blocking(move |conn, shared| insert(conn, shared, key, bytes, ttl))
            .await
    }

    async fn compare_and_swap(
        &self,
        key: Slot,
        expected: &Lease,
        new_value: &LeaseValue,
        ttl: Duration,
    ) -> Result<Option<Revision>, StoreError> {
        self.writable()?;
        let bytes = new_value.encode().into_bytes();
        self.swap(key, Stored::expected(expected), bytes, ttl).await
    }

    /// Deleting our record lets go of the slot's lock it names (once no other record of this
    /// process names it): the release is done, nothing acts under the record any more.
    async fn compare_and_delete(&self, key: Slot, expected: &Lease) -> Result<bool, StoreError> {
        self.writable()?;
        let expected = Stored::expected(expected);
        self.blocking(move |conn, shared| {
            let lock_path = lock::path(&shared.path, key);
            let mut registry = lock::registry();
            let held = registry.held(&lock_path);
            let body = |tx: &Transaction<'_>, now: Now<'_>| match record::load(tx, key, now)? {
                Judged::Live(stored, _) if stored == expected => {
                    let named = record::lock_of(tx, key)?;
                    record::retire(tx, key)?;
                    Ok(Step::wrote(Some(named)))
                }
                _ => Ok(Step::read(None)),
            };
            let deleted = transact(conn, shared, TransactionBehavior::Immediate, body)?;
            if let Some(named) = deleted {
                if named.is_some() && named == held {
                    registry.released(&lock_path);
                }
            }
            Ok(deleted.is_some())
        })
        .await
    }

    async fn get(&self, key: Slot) -> Result<Option<Lease>, StoreError> {
        self.transact(TransactionBehavior::Deferred, move |tx, now| {
            let lease = match record::load(tx, key, now)? {
                Judged::Absent => None,
                Judged::Live(stored, _) => Some(stored.lease(key)?),
            };
            Ok(Step::read(lease))
        })
        .await
    }

    /// Across processes: the store's one change feed (`feed.rs`), woken by the kernel's file
    /// notifications, reads the slots' holders after each commit to the file: a deleted row or
    /// another holder's value wakes the waiter, a renewal (same value, new revision) does not.
    /// An expiry that nobody wrote is not seen; the waiter's own timer covers it.
    fn changed(&self, keys: &[Slot]) -> SlotChange {
        let path: Arc<Path> = Arc::from(self.shared.path.as_path());
        Box::pin(Arc::clone(&self.shared.feed).changed(path, keys, self.shared.sharing, false))
    }

    /// [`changed`](Self::changed), without a look at commits while every slot of `keys` is held
    /// under a slot lock its thread watches: only that lock's release (or the record's expiry,
    /// the candidate's own timer) can let a candidate in, and the holder's renewals cost a
    /// waiting process nothing.
    fn changed_for_candidate(&self, keys: &[Slot]) -> SlotChange {
        let path: Arc<Path> = Arc::from(self.shared.path.as_path());
        Box::pin(Arc::clone(&self.shared.feed).changed(path, keys, self.shared.sharing, true))
    }

    fn has_change_feed(&self) -> bool {
        true
    }

    async fn time_left(&self, key: Slot) -> Result<Option<Duration>, StoreError> {
        self.transact(TransactionBehavior::Deferred, move |tx, now| {
            let left = match record::load(tx, key, now)? {
                Judged::Absent => None,
                Judged::Live(_, left) => Some(left),
            };
            Ok(Step::read(left))
        })
        .await
    }
}
