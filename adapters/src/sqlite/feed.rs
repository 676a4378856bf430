//! The change feed of the SQLite store, across processes: `PRAGMA data_version` of a connection
//! of its own, checked every [`FEED_POLL_INTERVAL`].
//!
//! `data_version` changes whenever *another* connection (of this or any other process)
//! committed to the file, so the feed needs a connection that never writes. Only when it changed
//! are the slots' holders read (one WAL read transaction: it never waits for the write lock);
//! the feed resolves when a row was deleted or holds another value (another holder, or another
//! incarnation of one) than when the wait began. A renewal rewrites the row with the same value
//! and a new revision: it does not wake the waiter, who would only be refused again — so a
//! waiting candidate costs about one store call per lease, at the record's expiry. File
//! notifications (inotify) were the alternative: they need a watching thread or descriptor per
//! store, say nothing about which slot changed (so a read per event is needed anyway) and are
//! Linux-only, while this check costs about 0.1 ms of CPU per interval (see
//! [`FEED_POLL_INTERVAL`]).
//!
//! Besides, the feed watches each slot's lock file (`lock.rs`): when the record of a slot names
//! the very file the watch has open and its lock is free at a look (every interval, one `flock`
//! call per such slot), no process that could act under the record is left — it died, which
//! writes nothing to the file — and the waiter tries its insert at once. No earlier sighting of
//! the lock held is needed, so a holder that dies right after its insert is not missed. Each
//! record (slot and revision) wakes waiters this way once per store: an insert that was refused
//! all the same (a record that cannot be read, say) falls back to the expiry instead of waking
//! its waiter again and again.
//!
//! A holding of a session names its session's lock file instead (`lock.rs`, `session.rs`): the
//! feed watches that lock for the slot the same way, and a waiter woken by it tries its acquire
//! or insert, which ends the dead session (all its holdings at once) and takes the slot.
//!
//! Where a watched record names a lock that is held, a thread of its own blocks on that lock
//! (one per lock file of a store, whatever the number of waits, at most
//! [`LOCK_WATCH_SLOTS_MAX`] at once) and wakes every wait the moment it is free: the holder
//! deleted its record and let go of the lock (a hand-off), or died. So both are seen within
//! microseconds, not at the next look; the looks stay for everything else (a holder that renews
//! no more but lives, a record without a lock). The same threads watch the locks of the sessions
//! that own a semaphore's units for its queued acquires ([`Feed::watch_sessions`]): a session
//! lock found free is remembered as a suspect, which the next semaphore transaction of the store
//! judges and ends (`semaphore.rs`).
//!
//! The checks run on the async worker thread: no check ever waits for a lock, and each is
//! shorter than handing it to the blocking pool would be.

use std::path::Path;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use rusqlite::types::ValueRef;
use rusqlite::{Connection, OpenFlags};
use vvm_core::{SessionKey, Slot};

use super::file::Sharing;
use super::lock::{self, FileId, LockWatch};
use super::record;

/// How often a waiting candidate looks at `PRAGMA data_version`: the latency it adds to a
/// change that no lock tells of (a hand-off or a death is told by the lock thread at once) is
/// at most this. Each look costs about 0.1 ms of CPU (timer wake-up, the WAL index
/// check), so a waiting `vvm run` uses ≈ 1.5 % of a core at 10 ms, ≈ 0.8 % at 20 ms and ≈ 2.3 %
/// at 5 ms (`BENCHMARKS.md`): 10 ms keeps a hand-off well under 20 ms at a modest cost.
pub const FEED_POLL_INTERVAL: Duration = Duration::from_millis(10);

/// Most slots whose lock one wait watches (one open descriptor and one `flock` per look each);
/// also the most lock files a store's threads block on at once, and the most owner sessions a
/// semaphore wait watches.
pub const LOCK_WATCH_SLOTS_MAX: usize = 64;

/// Most sessions remembered as suspects (their lock was seen free) until a semaphore
/// transaction judged them.
const SUSPECTS_MAX: usize = 1_024;

/// Most records remembered as having woken their waiters through a free lock.
const WOKEN_MAX: usize = 1_024;

/// The watching connection, opened at the first wait and shared by every waiter of one store.
pub(super) struct Feed {
    conn: Mutex<Option<Connection>>,
    /// A store opened read-only keeps no connection: each read opens one that writes nothing,
    /// and the version is a fingerprint of the files (see `reader.rs`).
    read_only: bool,
    /// Records (slot, revision) whose free lock already woke the waiters, oldest first, each
    /// with the number of waits begun before it did ([`Feed::waits`] then): every wait begun
    /// before is woken by it too — two waiters on one store (a VVM and an observer, or two
    /// VVMs of one process) each learn of the death — and no wait begun after (a candidate's
    /// next round, whose insert the record refused all the same).
    woken: Mutex<Vec<(u32, i64, u64)>>,
    /// Waits begun on this store so far: each wait's number is its place in this count.
    waits: std::sync::atomic::AtomicU64,
    /// Bumped by a lock thread when the lock it waited on became free: every wait looks at
    /// once instead of at its next tick.
    freed: tokio::sync::watch::Sender<u64>,
    /// The lock files a thread is blocked on now (at most one thread per file).
    lock_threads: Mutex<Vec<std::path::PathBuf>>,
    /// Sessions whose lock was seen free, for the next semaphore transaction to judge.
    suspects: Mutex<Vec<SessionKey>>,
}

/// The feed's read of the watched rows (`?1`: [`watched`]): only those, each found by its key,
/// since the table holds a row per slot ever written (sessions may hold thousands) and this runs
/// after every commit to the file. A holding names its session's lock file (its life is its
/// session's, `session.rs`) and its session. A row retired by its holder's release (no boot id, `record::retire`) has no
/// holder: leaving it out makes the release a change, as a deletion was.
const HOLDERS: &str = "SELECT vvm_leases.slot, vvm_leases.value, vvm_leases.revision, \
        iif(session_incarnation IS NULL, vvm_leases.lock_dev, s.lock_dev), \
        iif(session_incarnation IS NULL, vvm_leases.lock_ino, s.lock_ino), \
        session_incarnation, session_id \
    FROM vvm_leases LEFT JOIN vvm_sessions AS s \
        ON s.incarnation = session_incarnation AND s.id = session_id \
    WHERE vvm_leases.slot IN (SELECT value FROM json_each(?1)) AND vvm_leases.boot_id <> '' \
    ORDER BY vvm_leases.slot";

/// The watched slots as a JSON array, the argument of the feed's read.
fn watched(keys: &[u32]) -> String {
    let mut json = String::with_capacity(2 + keys.len() * 6);
    json.push('[');
    for (index, key) in keys.iter().enumerate() {
        if index > 0 {
            json.push(',');
        }
        json.push_str(&key.to_string());
    }
    json.push(']');
    json
}

/// What the feed compares: the version of the file and the values (holders) of the watched
/// slots that have a row, in slot order.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Seen {
    version: i64,
    holders: Vec<(u32, Vec<u8>)>,
    /// The revision of each watched record and the lock file it names, if any.
    named: Vec<Named>,
}

/// A record's revision and the lock file it names: its slot's, or its session's for a holding.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Named {
    slot: u32,
    revision: i64,
    lock: Option<FileId>,
    /// The session whose holding the record is.
    session: Option<SessionKey>,
}

/// A lock file a wait has open: of the slot, or of the session holding it.
struct Watched {
    slot: u32,
    path: std::path::PathBuf,
    session: Option<SessionKey>,
    watch: LockWatch,
}

impl Feed {
    /// A feed that has not opened its connection yet.
    pub(super) fn new(read_only: bool) -> Self {
        Feed {
            conn: Mutex::new(None),
            read_only,
            woken: Mutex::new(Vec::new()),
            waits: std::sync::atomic::AtomicU64::new(0),
            freed: tokio::sync::watch::Sender::new(0),
            lock_threads: Mutex::new(Vec::new()),
            suspects: Mutex::new(Vec::new()),
        }
    }

    /// Runs `read` on the watching connection, opening it first if needed. An error is logged
    /// and reported as `None`: the waiter then simply keeps waiting (its own timer still runs).
    fn with<T>(
        &self,
        path: &Path,
        read: impl FnOnce(&Connection) -> rusqlite::Result<T>,
    ) -> Option<T> {
        if self.read_only {
            let conn = super::reader::connect(path)
                .map_err(|error| tracing::debug!(error = %vvm_runtime::ErrorChain(&error), "SQLite change feed: cannot open a reading connection"))
                .ok()?;
            return read(&conn)
                .map_err(|error| tracing::debug!(error = %vvm_runtime::ErrorChain(&error), "SQLite change feed: check failed"))
                .ok();
        }
        let mut conn = self.conn.lock().unwrap_or_else(PoisonError::into_inner);
        if conn.is_none() {
            // The file exists (the store opened it); never create one here.
            let flags = OpenFlags::SQLITE_OPEN_READ_ONLY
                | OpenFlags::SQLITE_OPEN_NO_MUTEX
                | OpenFlags::SQLITE_OPEN_NOFOLLOW;
            // No busy wait (rusqlite's default is 5 s): the checks run on an async worker
            // thread, and a check that finds the file busy is simply repeated at the next look.
            let opened = Connection::open_with_flags(path, flags)
                .and_then(|opened| opened.busy_timeout(Duration::ZERO).map(|()| opened));
            match opened {
                Ok(opened) => *conn = Some(opened),
                Err(error) => {
                    tracing::debug!(error = %vvm_runtime::ErrorChain(&error), "SQLite change feed: cannot open its connection");
                    return None;
                }
            }
        }
        let result = read(conn.as_ref()?);
        result
            .map_err(|error| tracing::debug!(error = %vvm_runtime::ErrorChain(&error), "SQLite change feed: check failed"))
            .ok()
    }

    fn version(&self, path: &Path) -> Option<i64> {
        if self.read_only {
            return Some(super::reader::fingerprint(path));
        }
        // Cached: preparing the statement costs more than running it.
        self.with(path, |conn| {
            conn.prepare_cached("PRAGMA data_version")?
                .query_row([], |row| row.get(0))
        })
    }

    /// The version and the holders of `keys` (sorted), read in one read transaction so that
    /// the version is not newer than the rows: O(keys), whatever the number of rows.
    fn seen(&self, path: &Path, keys: &[u32]) -> Option<Seen> {
        self.with(path, |conn| {
            let tx = conn.unchecked_transaction()?;
            let version = match self.read_only {
                // Read before the rows: a commit in between shows as a change next time.
                true => super::reader::fingerprint(path),
                false => tx
                    .prepare_cached("PRAGMA data_version")?
                    .query_row([], |row| row.get(0))?,
            };
            let mut holders = Vec::with_capacity(keys.len());
            let mut named = Vec::with_capacity(keys.len());
            {
                let mut rows = tx.prepare_cached(HOLDERS)?;
                let read = |row: &rusqlite::Row<'_>| {
                    // Text or blob alike; anything else reads as empty (a corrupt row).
                    let value = match row.get_ref(1)? {
                        ValueRef::Text(bytes) | ValueRef::Blob(bytes) => bytes.to_vec(),
                        _ => Vec::new(),
                    };
                    // A damaged column names nothing: such a record waits for its expiry.
                    let integer = |index| match row.get_ref(index) {
                        Ok(ValueRef::Integer(value)) => Some(value),
                        _ => None,
                    };
                    let lock = FileId::from_columns(integer(3), integer(4));
                    let revision = integer(2).unwrap_or(-1);
                    let session = match (integer(5), integer(6)) {
                        (Some(incarnation), Some(id)) => Some(record::session_key(incarnation, id)),
                        _ => None,
                    };
                    Ok((row.get::<_, i64>(0)?, value, revision, lock, session))
                };
                for row in rows.query_map([watched(keys)], read)? {
                    let (slot, value, revision, lock, session) = row?;
                    if let Ok(slot) = u32::try_from(slot) {
                        if keys.binary_search(&slot).is_ok() {
                            holders.push((slot, value));
                            named.push(Named {
                                slot,
                                revision,
                                lock,
                                session,
                            });
                        }
                    }
                }
            }
            tx.finish()?;
            Ok(Seen {
                version,
                holders,
                named,
            })
        })
    }

    /// Whether a watched record names the lock file its watch has open and that lock is free,
    /// for the first time for this record or for a wait (number `wait`) begun before that
    /// first time: its holder is gone.
    fn holder_gone(&self, named: &[Named], locks: &[Watched], wait: u64) -> bool {
        for record in named {
            let Some(id) = record.lock else { continue };
            let Some(watched) = locks
                .iter()
                .find(|watched| watched.slot == record.slot && watched.watch.id == id)
            else {
                continue;
            };
            if !watched.watch.free() {
                continue;
            }
            let mut woken = self.woken.lock().unwrap_or_else(PoisonError::into_inner);
            let key = (record.slot, record.revision);
            if let Some(&(_, _, waits_then)) = woken
                .iter()
                .find(|&&(slot, revision, _)| (slot, revision) == key)
            {
                if wait < waits_then {
                    return true;
                }
                continue;
            }
            if woken.len() >= WOKEN_MAX {
                woken.remove(0);
            }
            let waits_then = self.waits.load(std::sync::atomic::Ordering::Acquire);
            woken.push((key.0, key.1, waits_then));
            return true;
        }
        false
    }

    /// Starts a thread blocked on the lock file at `lock_path` (a slot's, or the lock of
    /// `session`) until it is free — the holder deleted its record or died — which then wakes
    /// every wait of this store at once: a hand-off or a death is seen within microseconds
    /// rather than at the next tick. A session's lock freed makes the session a suspect for the
    /// next semaphore transaction. At most one such thread per lock file of a store: a thread
    /// whose lock a live holder keeps for hours is one blocked thread, whatever the number of
    /// waits (and it ends when that holder does, or this process's own holding does).
    fn watch_lock(
        self: Arc<Self>,
        lock_path: &Path,
        session: Option<SessionKey>,
        sharing: Sharing,
    ) {
        {
            let mut running = self
                .lock_threads
                .lock()
                .unwrap_or_else(PoisonError::into_inner);
            if running.iter().any(|running| running == lock_path)
                || running.len() >= LOCK_WATCH_SLOTS_MAX
            {
                return;
            }
            running.push(lock_path.to_owned());
        }
        let watch = LockWatch::new(lock_path, sharing, false);
        let feed = Arc::clone(&self);
        let owned = lock_path.to_owned();
        let spawned = watch.and_then(|watch| {
            std::thread::Builder::new()
                .name("vvm-sqlite-lock".into())
                .spawn(move || {
                    watch.wait_free();
                    if let Some(session) = session {
                        feed.suspect(session);
                    }
                    feed.lock_threads
                        .lock()
                        .unwrap_or_else(PoisonError::into_inner)
                        .retain(|running| *running != owned);
                    feed.freed
                        .send_modify(|count| *count = count.wrapping_add(1));
                })
                .ok()
        });
        if spawned.is_none() {
            self.lock_threads
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .retain(|running| running != lock_path);
        }
    }

    /// Remembers that the lock of `session` was seen free.
    fn suspect(&self, session: SessionKey) {
        let mut suspects = self.suspects.lock().unwrap_or_else(PoisonError::into_inner);
        if suspects.contains(&session) {
            return;
        }
        if suspects.len() >= SUSPECTS_MAX {
            suspects.remove(0);
        }
        suspects.push(session);
    }

    /// The sessions whose lock was seen free and that no transaction judged yet.
    pub(super) fn suspects(&self) -> Vec<SessionKey> {
        self.suspects
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// These suspects were judged (ended, or found alive or gone) by a committed transaction.
    pub(super) fn judged(&self, sessions: &[SessionKey]) {
        self.suspects
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .retain(|suspect| !sessions.contains(suspect));
    }

    /// Resolves once the lock of one of `sessions` (each with the lock file its row names) is
    /// free, having made that session a suspect: its process is gone, and the next semaphore
    /// transaction ends it. Each lock held when the call is made gets a blocking thread (shared
    /// with every other wait of the store, see [`Feed::watch_lock`]); at most
    /// [`LOCK_WATCH_SLOTS_MAX`] sessions are watched. Never resolves when there is none.
    pub(super) fn watch_sessions(
        self: Arc<Self>,
        path: &Path,
        sessions: &[(SessionKey, FileId)],
        sharing: Sharing,
    ) -> impl std::future::Future<Output = ()> + Send + 'static {
        // Subscribed before the looks: a lock freed right after is not missed.
        let mut freed = self.freed.subscribe();
        let watched: Vec<(SessionKey, LockWatch)> = sessions
            .iter()
            .take(LOCK_WATCH_SLOTS_MAX)
            .filter_map(|&(session, named)| {
                let lock_path = lock::session_path(path, session);
                let watch = LockWatch::new(&lock_path, sharing, false)?;
                if watch.id != named {
                    return None;
                }
                if !watch.free() {
                    Arc::clone(&self).watch_lock(&lock_path, Some(session), sharing);
                }
                Some((session, watch))
            })
            .collect();
        async move {
            loop {
                let gone: Vec<SessionKey> = watched
                    .iter()
                    .filter(|(_, watch)| watch.free())
                    .map(|(session, _)| *session)
                    .collect();
                if !gone.is_empty() {
                    for session in gone {
                        self.suspect(session);
                    }
                    return;
                }
                if watched.is_empty() || freed.changed().await.is_err() {
                    std::future::pending::<()>().await;
                }
            }
        }
    }

    /// Resolves once a row of `keys` is deleted or holds another value than now, or a record's
    /// holder is known gone by its free lock (see `lock.rs`).
    pub(super) fn changed(
        self: Arc<Self>,
        path: Arc<Path>,
        keys: &[Slot],
        sharing: Sharing,
    ) -> impl std::future::Future<Output = ()> + Send + 'static {
        let mut keys: Vec<u32> = keys.iter().map(|key| key.0).collect();
        keys.sort_unstable();
        keys.dedup();
        // Read at the call, not at the first poll: a change right after it is not missed.
        let start = self.seen(&path, &keys);
        let wait = self.waits.fetch_add(1, std::sync::atomic::Ordering::AcqRel);
        // One descriptor per watched slot, at most [`LOCK_WATCH_SLOTS_MAX`]: the others' deaths
        // are learnt at their records' expiry.
        let mut locks: Vec<Watched> = keys
            .iter()
            .take(LOCK_WATCH_SLOTS_MAX)
            .filter_map(|key| {
                let path = lock::path(&path, Slot(*key));
                LockWatch::new(&path, sharing, !self.read_only).map(|watch| Watched {
                    slot: *key,
                    path,
                    session: None,
                    watch,
                })
            })
            .collect();
        // The lock of each session holding a watched slot, as the slot's (never created here:
        // only its session's process makes it).
        if let Some(seen) = start.as_ref() {
            for record in seen.named.iter().take(LOCK_WATCH_SLOTS_MAX) {
                let Some(session) = record.session else {
                    continue;
                };
                let path = lock::session_path(&path, session);
                if let Some(watch) = LockWatch::new(&path, sharing, false) {
                    locks.push(Watched {
                        slot: record.slot,
                        path,
                        session: Some(session),
                        watch,
                    });
                }
            }
        }
        // Subscribed before the threads start: a lock freed right after is not missed.
        let mut freed = self.freed.subscribe();
        if let Some(seen) = start.as_ref() {
            for watched in &locks {
                let named = seen.named.iter().any(|record| {
                    record.slot == watched.slot && record.lock == Some(watched.watch.id)
                });
                if named && !watched.watch.free() {
                    Arc::clone(&self).watch_lock(&watched.path, watched.session, sharing);
                }
            }
        }
        async move {
            let mut start = start;
            let mut next = tokio::time::Instant::now();
            loop {
                // The next look: at the tick, or at once when a lock thread saw a lock freed.
                if let Ok(Err(_)) = tokio::time::timeout_at(next, freed.changed()).await {
                    // The feed is gone (never while `self` lives): looks at the ticks only.
                    tokio::time::sleep_until(next).await;
                }
                next = tokio::time::Instant::now() + FEED_POLL_INTERVAL;
                let Some(seen) = start.as_ref() else {
                    start = self.seen(&path, &keys);
                    continue;
                };
                // A holder's death changes nothing in the file: only its lock tells.
                if self.holder_gone(&seen.named, &locks, wait) {
                    return;
                }
                if self.version(&path) == Some(seen.version) {
                    continue;
                }
                match self.seen(&path, &keys) {
                    Some(now) if now.holders != seen.holders => return,
                    // Another slot changed, or a holder renewed: wait for the next commit.
                    Some(now) => start = Some(now),
                    None => {}
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The read after each commit finds the watched rows by key, never scanning the table,
    /// and names no lock file for a holding.
    // covers: Sq.SessionsFeed
    #[test]
    fn the_feed_reads_only_the_watched_rows_by_key() {
        assert_eq!(watched(&[]), "[]");
        assert_eq!(watched(&[1, 20, u32::MAX]), "[1,20,4294967295]");
        let conn = Connection::open_in_memory().unwrap();
        conn.execute_batch(super::super::schema::SCHEMA_V7).unwrap();
        let plan: Vec<String> = conn
            .prepare(&format!("EXPLAIN QUERY PLAN {HOLDERS}"))
            .unwrap()
            .query_map(["[1,2]"], |row| row.get(3))
            .unwrap()
            .collect::<Result<_, _>>()
            .unwrap();
        let plan = plan.join("; ");
        assert!(
            plan.contains("SEARCH vvm_leases USING INTEGER PRIMARY KEY"),
            "{plan}"
        );
        assert!(!plan.contains("SCAN vvm_leases"), "{plan}");
        for slot in 0..100 {
            conn.execute(
                "INSERT INTO vvm_leases VALUES (?1, x'01', ?1, 'b', 0, 7, 8, ?2, ?2)",
                (slot, if slot == 3 { Some(9) } else { None }),
            )
            .unwrap();
        }
        let rows: Vec<(i64, Option<i64>)> = conn
            .prepare(HOLDERS)
            .unwrap()
            .query_map([watched(&[3, 5, 500])], |row| {
                Ok((row.get(0)?, row.get(3)?))
            })
            .unwrap()
            .collect::<Result<_, _>>()
            .unwrap();
        assert_eq!(rows, [(3, None), (5, Some(7))]);
    }
}
