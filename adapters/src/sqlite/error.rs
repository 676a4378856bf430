//! Why a database file could not be opened as a lease store.

use std::path::PathBuf;
use std::time::Duration;

use vvm_core::SessionKey;
use vvm_runtime::ValueError;

use super::ClockError;

/// Why a database file could not be opened as a lease store, or — as the cause inside a
/// [`StoreError`](vvm_runtime::StoreError) — why a call to an open one failed. Whenever the file
/// turns out not to be ours (or of a newer version), nothing in it was changed. The message
/// leaves the underlying error out; it is the [`source`](std::error::Error::source).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum SqliteStoreError {
    /// SQLite could not open or create the file.
    #[error("cannot open {}", .path.display())]
    Open {
        /// The file.
        path: PathBuf,
        /// What SQLite said.
        #[source]
        source: rusqlite::Error,
    },
    /// The file exists, but this user may not open it as the store needs (e.g. its mode
    /// denies it): said in the system's words, which SQLite's "unable to open database file"
    /// hides.
    #[error("cannot open {} for {access}", .path.display())]
    Access {
        /// The file.
        path: PathBuf,
        /// "reading" or "reading and writing".
        access: &'static str,
        /// What the system said.
        #[source]
        source: std::io::Error,
    },
    /// The directory the store would live in does not exist (or is not a directory).
    #[error("the directory {} does not exist: create it (e.g. `mkdir -m 700`) or choose another path", .dir.display())]
    NoDirectory {
        /// The directory.
        dir: PathBuf,
    },
    /// A file of the store (the database, a companion, a lock file or the directory) that
    /// another user could have written or pointed elsewhere: refused before it was opened.
    #[error("refusing {}: it {why}", .path.display())]
    Untrusted {
        /// The file.
        path: PathBuf,
        /// What is wrong with it.
        why: super::Untrusted,
    },
    /// The lock file of a new session (`<database>.session-<incarnation>-<id>.lock`) could not
    /// be taken, so the session cannot be guarded by it: the session is not created.
    #[error("cannot lock the session's lock file {}: {why}", .path.display())]
    SessionLock {
        /// The lock file.
        path: PathBuf,
        /// What went wrong.
        why: &'static str,
        /// What the system said, if it said anything.
        #[source]
        source: Option<std::io::Error>,
    },
    /// The file's status could not be read.
    #[error("cannot inspect {}", .path.display())]
    Inspect {
        /// The file.
        path: PathBuf,
        /// What the system said.
        #[source]
        source: std::io::Error,
    },
    /// A new store could not be created.
    #[error("cannot create {}", .path.display())]
    Create {
        /// The file.
        path: PathBuf,
        /// What the system said.
        #[source]
        source: std::io::Error,
    },
    /// The file was removed or replaced while it was being opened.
    #[error("{} was removed or replaced while it was being opened; try again", .path.display())]
    Replaced {
        /// The file.
        path: PathBuf,
    },
    /// The file at the store's path is no longer the one this store opened: it was removed or
    /// replaced while in use. Nothing is written there any more, and a holder's records in it
    /// are lost (a lease ends at its kill deadline).
    #[error("{} is no longer the store this process opened: it was removed or replaced while in use", .path.display())]
    Gone {
        /// The file.
        path: PathBuf,
    },
    /// A store opened read-only does not exist.
    #[error("no store at {}: nothing to read (a store is created by its first read-write open, e.g. `vvm run`)", .path.display())]
    NoStore {
        /// The file.
        path: PathBuf,
    },
    /// A store opened read-only is an empty file: nobody created the store in it yet.
    #[error("{} is empty: no store was created in it yet", .path.display())]
    NotCreated {
        /// The file.
        path: PathBuf,
    },
    /// A store opened read-only has an older schema, which only a read-write open migrates.
    #[error("the lease store has schema version {found}; open it once read-write (e.g. `vvm run`) to migrate it to {supported}")]
    OlderSchema {
        /// The file's version.
        found: i32,
        /// The version of this build.
        supported: i32,
    },
    /// A write to a store opened read-only.
    #[error("the store was opened read-only")]
    OpenedReadOnly,
    /// The file is write-protected.
    #[error("{} is read-only", .path.display())]
    ReadOnly {
        /// The file.
        path: PathBuf,
    },
    /// The file is not an SQLite database at all.
    #[error("the file is not an SQLite database")]
    NotADatabase,
    /// An SQLite database of another program.
    #[error(
        "the database is not a vvm lease store (application_id {application_id:#x}, \
         user_version {user_version}); it was left unchanged"
    )]
    NotOurs {
        /// Its `PRAGMA application_id`.
        application_id: i32,
        /// Its `PRAGMA user_version`.
        user_version: i32,
    },
    /// A lease store written by a later version of this program.
    #[error(
        "the lease store has schema version {found}, this build knows up to {supported}; \
         it was left unchanged"
    )]
    NewerSchema {
        /// The file's version.
        found: i32,
        /// The version of this build.
        supported: i32,
    },
    /// A lease store that belongs to another machine (another machine id): expiry is judged by
    /// one machine's boot clock, which no other machine can read.
    #[error(
        "{} belongs to machine {found}, not to this one ({ours}): SQLite leases are single-host \
         (expiry is judged by one machine's boot clock), so a file on a shared volume or a network \
         file system cannot elect across machines; for several hosts use the etcd or FoundationDB \
         store. The file was left unchanged",
        .path.display()
    )]
    OtherMachine {
        /// The file.
        path: PathBuf,
        /// The machine id recorded in the file.
        found: String,
        /// This machine's id.
        ours: String,
    },
    /// Our file, but its contents are not what our schema wrote.
    #[error("the lease store is damaged: {what}")]
    Damaged {
        /// What is wrong, e.g. "the revision counter is negative (-3)".
        what: String,
        /// The SQLite error that showed it, if one did.
        #[source]
        source: Option<rusqlite::Error>,
    },
    /// An [`acquire_batch`](vvm_runtime::SessionStore::acquire_batch) of more slots than one
    /// transaction takes; nothing was written. The session handle splits its batches.
    #[error("{slots} slots in one acquire, at most {max}")]
    BatchTooLarge {
        /// The slots asked for.
        slots: usize,
        /// The most one call takes.
        max: usize,
    },
    /// A live session record that cannot be read (its value, or its revision): it is never
    /// kept alive, deleted or acquired for, and ends at its expiry. A session row whose
    /// liveness cannot be told (boot id or expiry unreadable) is this error for every session
    /// operation on its key.
    #[error("the session record {session} is corrupt")]
    CorruptSession {
        /// The session's key.
        session: SessionKey,
        /// What is wrong with it.
        #[source]
        source: ValueError,
    },
    /// The file system did not accept write-ahead logging (e.g. some network file systems).
    #[error("the database could not switch to WAL (journal mode stays {found:?})")]
    JournalMode {
        /// The journal mode SQLite reported.
        found: String,
    },
    /// Other connections held the lock for the whole wait.
    #[error("the database stayed locked for {busy_wait:?} while {what}")]
    Busy {
        /// The step that waited.
        what: &'static str,
        /// How long it waited.
        busy_wait: Duration,
    },
    /// The configured lock wait is longer than [`BUSY_WAIT_MAX`](super::BUSY_WAIT_MAX).
    #[error("busy wait of {busy_wait:?} is longer than {max:?}")]
    BusyWaitTooLong {
        /// What was asked for.
        busy_wait: Duration,
        /// [`BUSY_WAIT_MAX`](super::BUSY_WAIT_MAX).
        max: Duration,
    },
    /// The boot clock or the machine id cannot be read.
    #[error(transparent)]
    Clock(#[from] ClockError),
    /// Any other SQLite failure.
    #[error("SQLite failed while {what}")]
    Sqlite {
        /// The step that failed.
        what: &'static str,
        /// What SQLite said.
        #[source]
        source: rusqlite::Error,
    },
}
