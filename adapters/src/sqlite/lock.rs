//! One host: the kernel knows when a holder died. Each slot has a lock file next to the database
//! (`<database>.slot-<n>.lock`, created on first use and never removed). A process takes an
//! exclusive advisory lock on it (`flock`, non-blocking) before its insert, writes the file's
//! identity (device, inode) into the record it inserts, and keeps the lock until its own release
//! of that record was confirmed, or until it and everything that inherited the descriptor (the
//! command of `vvm run -- CMD`, see [`let_children_inherit_slot_locks`]) are gone: the kernel
//! drops a `flock` only when the last descriptor of its open file is closed.
//!
//! A candidate that obtains the lock of the very file a live record of another holder names
//! (same device and inode, and that file still linked at the slot's lock path) knows that no
//! process that could act under the record is left: it may take the slot at once (a new revision,
//! so the fencing token increases). Everything else falls back to the record's expiry:
//! - a SIGSTOPped or hung holder keeps its lock: the candidate cannot take it and waits;
//! - a lock file removed or replaced while the holder lives is another file (another inode; the
//!   holder's open descriptor keeps its inode from being reused): its lock proves nothing, and
//!   the record does not name it;
//! - a holder that could not take the lock (held by a predecessor that is stopped, or any error)
//!   names no file, so its death is only ever learnt from the expiry.
//!
//! Locks are kept in one registry per process, not in the store value: dropping a store never
//! releases one (services of a lost tenure may still be stopping; only the killer or the
//! process's end may let a successor in early).
//!
//! **Sessions** have one lock file each (`<database>.session-<incarnation>-<id>.lock`, see
//! [`session_path`]), judged by exactly the same rules: made by the session's process when it
//! creates the session ([`lock_session`], refused with a typed error when the file at the path is
//! not one the store trusts), locked exclusively for the session's whole life, named by the
//! session's row, inherited by the supervisor of `vvm run` like the slot locks, and removed by its
//! process when the session ends (session keys are never reused: nobody else ever uses the
//! path). Another process that can take a shared lock on the very file the row names
//! ([`take_named`]) knows the session's process and everything that inherited the lock are gone.

use std::os::fd::{AsFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::sync::{Mutex, PoisonError};

use rustix::fs::{FlockOperation, Mode, OFlags};
use rustix::io::{Errno, FdFlags};
use vvm_core::{SessionKey, Slot};

use super::file::{self, Sharing, Untrusted};
use super::SqliteStoreError;

/// Most locks one process holds, slot and session locks together (every slot of a few stores).
pub const SLOT_LOCKS_MAX: usize = 4_096;

/// The identity of a lock file: what a record names.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct FileId {
    pub(crate) dev: u64,
    pub(crate) ino: u64,
}

impl FileId {
    /// As stored in the record's `lock_dev` and `lock_ino` columns: SQLite integers are signed,
    /// so the bits are kept and reinterpreted.
    pub(crate) fn to_columns(self) -> (i64, i64) {
        (
            i64::from_ne_bytes(self.dev.to_ne_bytes()),
            i64::from_ne_bytes(self.ino.to_ne_bytes()),
        )
    }

    /// From the columns; `None` unless both are integers.
    pub(crate) fn from_columns(dev: Option<i64>, ino: Option<i64>) -> Option<Self> {
        Some(FileId {
            dev: u64::from_ne_bytes(dev?.to_ne_bytes()),
            ino: u64::from_ne_bytes(ino?.to_ne_bytes()),
        })
    }
}

/// A lock taken on a lock file (a slot's, or a session's).
#[derive(Debug)]
pub(crate) struct SlotLock {
    fd: OwnedFd,
    pub(crate) id: FileId,
}

struct Held {
    path: PathBuf,
    lock: SlotLock,
    /// Records of this process that name the lock and were not deleted by their release.
    records: u32,
}

static HELD: Mutex<Vec<Held>> = Mutex::new(Vec::new());

/// This process's slot locks. An insert and a release each keep it for their whole transaction,
/// so that a release letting go of a lock and an insert naming it can never interleave.
pub(crate) struct Registry(std::sync::MutexGuard<'static, Vec<Held>>);

/// Takes the registry. Always before a transaction begins: never while holding SQLite's lock.
pub(crate) fn registry() -> Registry {
    // Pushes and removals cannot leave the list half-updated; a poisoned lock is usable.
    Registry(HELD.lock().unwrap_or_else(PoisonError::into_inner))
}

impl Registry {
    /// The identity of the lock file this process holds at `path`, if it holds it.
    pub(crate) fn held(&self, path: &Path) -> Option<FileId> {
        self.0
            .iter()
            .find(|held| held.path == path)
            .map(|held| held.lock.id)
    }

    /// Whether no more lock can be kept.
    pub(crate) fn full(&self) -> bool {
        self.0.len() >= SLOT_LOCKS_MAX
    }

    /// A record naming the lock at `path` was written (or may have been): the lock is kept
    /// until that record's release. `fresh` is the lock taken for it, if it was not held yet.
    pub(crate) fn keep(&mut self, path: &Path, fresh: Option<SlotLock>) {
        if let Some(held) = self.0.iter_mut().find(|held| held.path == path) {
            held.records = held.records.saturating_add(1);
            return;
        }
        if let Some(lock) = fresh {
            self.0.push(Held {
                path: path.to_owned(),
                lock,
                records: 1,
            });
        }
    }

    /// Our record under the lock at `path` was deleted by our own release: once no other
    /// record of ours names it, the lock goes (its descriptor is closed).
    pub(crate) fn released(&mut self, path: &Path) {
        if let Some(held) = self.0.iter_mut().find(|held| held.path == path) {
            held.records = held.records.saturating_sub(1);
        }
        self.0.retain(|held| held.path != path || held.records > 0);
    }

    /// A session was written (or may have been) naming the lock at `path`: the lock is kept for
    /// the session's life, once, however often the session's creation is tried.
    pub(crate) fn keep_session(&mut self, path: &Path, fresh: Option<SlotLock>) {
        if self.held(path).is_some() {
            return;
        }
        if let Some(lock) = fresh {
            self.0.push(Held {
                path: path.to_owned(),
                lock,
                records: 1,
            });
        }
    }

    /// The session whose lock is at `path` ended (deleted, or found gone): its file is removed,
    /// then the lock let go. Nothing of the session is left to guard: its row is gone or dead,
    /// and a dead row is never judged by its lock.
    pub(crate) fn let_go_session(&mut self, path: &Path) {
        if self.held(path).is_some() {
            remove(path);
        }
        self.0.retain(|held| held.path != path);
    }
}

/// Removes the lock file of an ended session (best effort: a file left behind only takes room).
pub(crate) fn remove(path: &Path) {
    if let Err(error) = rustix::fs::unlink(path) {
        tracing::debug!(path = %path.display(), error = %vvm_runtime::ErrorChain(&error), "session lock file cannot be removed");
    }
}

/// The lock file of `slot` of the database at `database`.
pub(crate) fn path(database: &Path, slot: Slot) -> PathBuf {
    let mut name = database.as_os_str().to_owned();
    name.push(format!(".slot-{}.lock", slot.0));
    PathBuf::from(name)
}

/// The lock file of the session `key` of the database at `database`.
pub(crate) fn session_path(database: &Path, key: SessionKey) -> PathBuf {
    let mut name = database.as_os_str().to_owned();
    name.push(format!(".session-{}-{}.lock", key.incarnation.0, key.id.0));
    PathBuf::from(name)
}

fn identity(stat: &rustix::fs::Stat) -> FileId {
    FileId {
        // Widened where the platform's types are narrower.
        #[allow(clippy::useless_conversion)]
        dev: u64::from(stat.st_dev),
        #[allow(clippy::useless_conversion)]
        ino: u64::from(stat.st_ino),
    }
}

/// How often [`try_lock`] tries a lock that another open file holds: a watching candidate
/// holds it for a few microseconds at a time (see [`LockWatch`]), which must not make a
/// holder's insert name no file.
const LOCK_TRIES: u32 = 8;

/// How long [`try_lock`] tries a lock that another open file holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Tries {
    /// For about a millisecond ([`LOCK_TRIES`]), whoever holds it: on a free slot, the lock of
    /// a holder that just committed its release is let go right after that commit.
    Patient,
    /// The same while only watchers hold it (shared, for microseconds), but not at all while an
    /// open file holds it exclusively: the lock a live record names, kept by its holder for its
    /// whole tenure. Before, every refused insert slept through the eight tries inside its
    /// write transaction (about a millisecond of the store's one write lock, per refusal).
    UnlessHeld,
}

/// The pause between two of those tries.
const LOCK_RETRY_PAUSE: std::time::Duration = std::time::Duration::from_micros(125);

/// Why [`open_lock_file`] opened nothing.
#[derive(Debug)]
enum Unopened {
    /// The system refused (no such file, a symbolic link, no permission, ...).
    Io(Errno),
    /// A file the store does not trust (`file.rs`).
    Untrusted(Untrusted),
}

/// Opens the lock file at `path` (creating it with `sharing`'s mode if needed), never through a
/// link and never waiting, and checks that it is a file the store may trust (`file.rs`).
fn open_lock_file(
    path: &Path,
    flags: OFlags,
    sharing: Sharing,
) -> Result<(OwnedFd, FileId), Unopened> {
    // No symbolic link: the lock must be the file at the path itself. Never waiting in `open`:
    // another user may have made a FIFO at the path, whose open waits for a writer forever
    // (and cannot be interrupted); it is refused by its status below. `flock` ignores the flag.
    let creating = flags.contains(OFlags::CREATE);
    let flags = flags | OFlags::CLOEXEC | OFlags::NOFOLLOW | OFlags::NONBLOCK;
    let fd = match rustix::fs::open(path, flags, Mode::from_raw_mode(sharing.mode())) {
        Ok(fd) => fd,
        Err(error) => {
            tracing::debug!(path = %path.display(), error = %vvm_runtime::ErrorChain(&error), "lock file cannot be opened");
            return Err(match error {
                // What `O_NOFOLLOW` answers for a link.
                Errno::LOOP => Unopened::Untrusted(Untrusted::Symlink),
                error => Unopened::Io(error),
            });
        }
    };
    let mut stat = match rustix::fs::fstat(&fd) {
        Ok(stat) => stat,
        Err(error) => {
            tracing::debug!(path = %path.display(), error = %vvm_runtime::ErrorChain(&error), "lock file cannot be read");
            return Err(Unopened::Io(error));
        }
    };
    let mode = Mode::from_raw_mode(sharing.mode());
    if creating
        && stat.st_uid == rustix::process::geteuid().as_raw()
        && stat.st_mode & 0o7777 != sharing.mode()
    {
        // Ours, made by an older version or narrowed by the umask: nobody outside the sharing
        // may even open it (a reader could hold a shared lock on it forever).
        if rustix::fs::fchmod(&fd, mode).is_ok() {
            stat.st_mode = (stat.st_mode & !0o7777) | sharing.mode();
        }
    }
    if let Err(why) = file::judge(&stat, sharing) {
        // Another user's file: its lock proves nothing about our holders. Said once per path:
        // every insert and every watch of the slot meets it again.
        match creating && first_refusal(path) {
            true => tracing::warn!(path = %path.display(), "lock file not used: it {why}"),
            false => {
                tracing::debug!(path = %path.display(), "lock file not used: it {why}")
            }
        }
        return Err(Unopened::Untrusted(why));
    }
    Ok((fd, identity(&stat)))
}

/// Why [`try_lock`] took no lock.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum NotTaken {
    /// Another open file of the lock holds it: a process that may act under the slot lives.
    HeldElsewhere,
    /// The lock file cannot be used (another user's, unreadable, this process's registry full,
    /// any error): it tells nothing.
    Unusable,
}

/// Most lock paths whose refusal this process remembers having logged.
const REFUSALS_LOGGED_MAX: usize = 64;

/// Whether the refusal of the lock file at `path` is logged for the first time by this process
/// (`true` also once the memory is full: a repeated line is better than a lost one).
fn first_refusal(path: &Path) -> bool {
    static LOGGED: Mutex<Vec<PathBuf>> = Mutex::new(Vec::new());
    let mut logged = LOGGED.lock().unwrap_or_else(PoisonError::into_inner);
    if logged.iter().any(|seen| seen == path) {
        return false;
    }
    if logged.len() < REFUSALS_LOGGED_MAX {
        logged.push(path.to_owned());
    }
    true
}

/// Takes the lock of the file at `path` (creating the file if needed), retrying for about a
/// millisecond while another open file holds it (as `tries` says); why not when it stays held,
/// when this process's registry is full, or on any error (the caller then names no file).
/// Blocking: a few file system calls.
pub(crate) fn try_lock(
    registry: &Registry,
    path: &Path,
    sharing: Sharing,
    tries: Tries,
) -> Result<SlotLock, NotTaken> {
    if registry.full() {
        tracing::warn!(
            max = SLOT_LOCKS_MAX,
            "too many slot locks held; inserting without one"
        );
        return Err(NotTaken::Unusable);
    }
    let (fd, id) = open_lock_file(path, OFlags::RDWR | OFlags::CREATE, sharing)
        .map_err(|_| NotTaken::Unusable)?;
    lock_exclusive(&fd, path, tries)?;
    Ok(SlotLock { fd, id })
}

/// Locks `fd` exclusively, retrying for about a millisecond while another open file holds it
/// (see [`Tries`]).
fn lock_exclusive(fd: &OwnedFd, path: &Path, tries: Tries) -> Result<(), NotTaken> {
    for attempt in 1..=LOCK_TRIES {
        match rustix::fs::flock(fd, FlockOperation::NonBlockingLockExclusive) {
            Ok(()) => return Ok(()),
            Err(Errno::WOULDBLOCK) if tries == Tries::UnlessHeld && held_exclusively_fd(fd) => {
                return Err(NotTaken::HeldElsewhere);
            }
            Err(Errno::WOULDBLOCK) if attempt < LOCK_TRIES => {
                std::thread::sleep(LOCK_RETRY_PAUSE);
            }
            Err(Errno::WOULDBLOCK) => return Err(NotTaken::HeldElsewhere),
            Err(error) => {
                tracing::debug!(path = %path.display(), error = %vvm_runtime::ErrorChain(&error), "lock cannot be taken");
                return Err(NotTaken::Unusable);
            }
        }
    }
    Err(NotTaken::HeldElsewhere)
}

/// Takes the lock of a new session's file at `path` (creating the file if needed) for the
/// session's process, to be kept for the session's life ([`Registry::keep_session`]). Blocking:
/// a few file system calls, never a wait in `open`.
///
/// # Errors
/// [`SqliteStoreError::Untrusted`] when the file at the path is a symbolic link, not a regular
/// file (a FIFO, say), or another user's; [`SqliteStoreError::SessionLock`] when it cannot be
/// opened or locked, or this process holds [`SLOT_LOCKS_MAX`] locks already.
pub(crate) fn lock_session(
    registry: &Registry,
    path: &Path,
    sharing: Sharing,
) -> Result<SlotLock, SqliteStoreError> {
    let refused =
        |why: &'static str, source: Option<std::io::Error>| SqliteStoreError::SessionLock {
            path: path.to_owned(),
            why,
            source,
        };
    if registry.full() {
        return Err(refused("this process holds the most locks it may", None));
    }
    let (fd, id) = match open_lock_file(path, OFlags::RDWR | OFlags::CREATE, sharing) {
        Ok(opened) => opened,
        Err(Unopened::Untrusted(why)) => {
            return Err(SqliteStoreError::Untrusted {
                path: path.to_owned(),
                why,
            })
        }
        Err(Unopened::Io(error)) => return Err(refused("it cannot be opened", Some(error.into()))),
    };
    match rustix::fs::flock(&fd, FlockOperation::NonBlockingLockExclusive) {
        Ok(()) => Ok(SlotLock { fd, id }),
        Err(Errno::WOULDBLOCK) => Err(refused("another open file holds its lock", None)),
        Err(error) => Err(refused("it cannot be locked", Some(error.into()))),
    }
}

/// A shared lock on the file at `path` when it is the file `named` (still linked there) and no
/// open file holds its exclusive lock: the session's process that locked it, and everything that
/// inherited the descriptor, are gone. Never creates the file; `None` otherwise (held, another
/// file, any error). Shared, so that two processes judging at once both see it free; a live
/// owner's exclusive lock refuses it at once, so no retry is needed (and this process's own
/// sessions are never judged dead: their lock is held by another open file). Blocking: a few
/// file system calls.
pub(crate) fn take_named(path: &Path, named: FileId, sharing: Sharing) -> Option<SlotLock> {
    let (fd, id) = open_lock_file(path, OFlags::RDONLY, sharing).ok()?;
    if id != named {
        return None;
    }
    rustix::fs::flock(&fd, FlockOperation::NonBlockingLockShared).ok()?;
    // Locked while linked: nobody can make another file the named one now.
    linked(path, id).then_some(SlotLock { fd, id })
}

/// Whether another open file holds the exclusive lock of `fd`'s file: a shared lock taken
/// without waiting is refused only then (watchers and judges take it shared), and let go at
/// once when obtained. Any other error tells nothing (`false`).
fn held_exclusively_fd(fd: &OwnedFd) -> bool {
    match rustix::fs::flock(fd, FlockOperation::NonBlockingLockShared) {
        Ok(()) => {
            let _ = rustix::fs::flock(fd, FlockOperation::Unlock);
            false
        }
        Err(error) => error == Errno::WOULDBLOCK,
    }
}

/// The identity of the lock file at `path` when an open file holds its lock exclusively (a
/// holder, or what inherited its descriptor, lives); `None` when it is free, held only shared
/// (watchers), or cannot be told (no such file, one the store does not trust, any error).
/// Never creates the file and never waits. Blocking: a few file system calls.
pub(crate) fn held_exclusively(path: &Path, sharing: Sharing) -> Option<FileId> {
    let (fd, id) = open_lock_file(path, OFlags::RDONLY, sharing).ok()?;
    held_exclusively_fd(&fd).then_some(id)
}

/// Marks the lock file at `path` (creating it if needed) as the lock of a slot a record was
/// written for: one byte at its start. A watcher creates the file empty, so only the mark tells
/// a newcomer that finds no row that a holder was there (see `insert`). Best effort: a file that
/// cannot be marked only takes that evidence away. Blocking: a few file system calls.
pub(crate) fn mark_used(path: &Path, sharing: Sharing) {
    let Ok((fd, _)) = open_lock_file(path, OFlags::WRONLY | OFlags::CREATE, sharing) else {
        return;
    };
    if let Err(error) = rustix::io::pwrite(&fd, USED_MARK, 0) {
        tracing::debug!(path = %path.display(), error = %vvm_runtime::ErrorChain(&error), "slot lock file cannot be marked");
    }
}

/// What a holder writes at the start of its slot's lock file.
const USED_MARK: &[u8] = b"1";

/// Whether the file at `path` is a lock file this store trusts that a holder marked (see
/// [`mark_used`]): judged by its status alone, never opened.
pub(crate) fn marked_used(path: &Path, sharing: Sharing) -> bool {
    match rustix::fs::lstat(path) {
        Ok(stat) => stat.st_size > 0 && file::judge(&stat, sharing).is_ok(),
        Err(_) => false,
    }
}

/// The identity of the file linked at `path` (not through a link), if there is one.
pub(crate) fn file_id(path: &Path) -> Option<FileId> {
    rustix::fs::lstat(path).ok().map(|stat| identity(&stat))
}

/// Whether the file linked at `path` now is the file `id` (not removed, not replaced).
pub(crate) fn linked(path: &Path, id: FileId) -> bool {
    match rustix::fs::lstat(path) {
        Ok(stat) => identity(&stat) == id,
        Err(_) => false,
    }
}

/// Lets every process started from now on inherit the slot and session locks this process holds (clears
/// close-on-exec on their descriptors), so that the process it starts to supervise its work
/// keeps the slot protected as long as that process lives, also after the holder died: a
/// candidate can take the slot early only when nothing that could act under the record is left.
/// Returns the descriptors' numbers, for that process to keep them from its own children (it
/// holds them until everything it started is gone).
///
/// # Errors
/// When a descriptor's flags cannot be changed; the others are still changed.
pub fn let_children_inherit_slot_locks() -> std::io::Result<Vec<i32>> {
    use std::os::fd::AsRawFd;
    let registry = registry();
    let mut fds = Vec::with_capacity(registry.0.len());
    let mut failed = None;
    for held in registry.0.iter() {
        match rustix::io::fcntl_setfd(held.lock.fd.as_fd(), FdFlags::empty()) {
            Ok(()) => fds.push(held.lock.fd.as_raw_fd()),
            Err(error) => failed = Some(error),
        }
    }
    match failed {
        Some(error) => Err(error.into()),
        None => Ok(fds),
    }
}

/// Watches a slot's lock file for a waiting candidate: tells whether the lock is free, so
/// that a candidate waiting on a live record that names this very file (see `feed.rs`) tries its
/// insert — which alone judges — at once instead of at the record's expiry. No earlier sighting
/// of the lock held is needed: a holder that dies right after its insert, before any look, is
/// still seen as gone.
///
/// Looking means taking the lock without waiting and dropping it at once: for that instant, a
/// holder's [`try_lock`] finds it held and tries again shortly. A held lock is never taken from
/// its holder.
#[derive(Debug)]
pub(crate) struct LockWatch {
    fd: OwnedFd,
    /// The file the descriptor is open on: a record must name it for its lock to tell anything.
    pub(crate) id: FileId,
}

impl LockWatch {
    /// Opens the lock file at `path` (creating it if needed); `None` on errors.
    /// `create`: whether a missing lock file may be created (never by a read-only store).
    pub(crate) fn new(path: &Path, sharing: Sharing, create: bool) -> Option<Self> {
        let flags = match create {
            true => OFlags::RDONLY | OFlags::CREATE,
            false => OFlags::RDONLY,
        };
        let (fd, id) = open_lock_file(path, flags, sharing).ok()?;
        Some(LockWatch { fd, id })
    }

    /// Blocks until no open file holds the lock, then lets go of it at once (a shared lock
    /// taken for an instant: a holder's [`try_lock`] that meets it tries again shortly).
    pub(crate) fn wait_free(&self) {
        loop {
            match rustix::fs::flock(&self.fd, FlockOperation::LockShared) {
                Ok(()) => break,
                Err(Errno::INTR) => {}
                Err(_) => return,
            }
        }
        let _ = rustix::fs::flock(&self.fd, FlockOperation::Unlock);
    }

    /// Whether no open file holds the lock now (exclusively: a holder's lock; other watchers
    /// and judges take it shared, and never hide a free lock from each other).
    pub(crate) fn free(&self) -> bool {
        match rustix::fs::flock(&self.fd, FlockOperation::NonBlockingLockShared) {
            Ok(()) => {
                // Let go at once: a watcher never holds the slot's lock.
                let _ = rustix::fs::flock(&self.fd, FlockOperation::Unlock);
                true
            }
            Err(_) => false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // covers: Sq.DeadHolder
    #[test]
    fn a_file_identity_survives_its_columns_and_a_missing_column_names_nothing() {
        for id in [
            FileId { dev: 0, ino: 1 },
            FileId {
                dev: u64::MAX,
                ino: u64::MAX - 1,
            },
            FileId {
                dev: 1 << 63,
                ino: 42,
            },
        ] {
            let (dev, ino) = id.to_columns();
            assert_eq!(FileId::from_columns(Some(dev), Some(ino)), Some(id));
        }
        assert_eq!(FileId::from_columns(None, Some(1)), None);
        assert_eq!(FileId::from_columns(Some(1), None), None);
    }

    #[test]
    fn the_lock_path_is_next_to_the_database() {
        assert_eq!(
            path(Path::new("/var/lib/vvm/leases.sqlite"), Slot(3)),
            PathBuf::from("/var/lib/vvm/leases.sqlite.slot-3.lock")
        );
    }
}
