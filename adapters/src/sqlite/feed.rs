//! The change feed of the SQLite store, across processes: one per store handle (its clones
//! share it), which every waiter subscribes to — slot candidates and observers ([`Feed::changed`]),
//! semaphore grants, queued acquires and watches ([`Feed::name_changed`]). No waiter looks at the
//! file on its own.
//!
//! **What wakes it** is the kernel (`notify.rs`): an inotify event on the store's `-wal` (every
//! commit, by any process, appends to it) makes the feed look, and so does the safety look
//! (every [`FEED_SAFETY_LOOK`](super::FEED_SAFETY_LOOK) while something is told by nothing else,
//! else every [`FEED_BACKSTOP_LOOK`](super::FEED_BACKSTOP_LOOK)). A look is one `PRAGMA data_version` on a
//! connection of the feed's own (it changes whenever *another* connection, of this or any process,
//! committed, so that connection never writes). Only when it changed are the watched rows of every
//! subscriber read, in one read transaction (a WAL read: it never waits for the write lock), and
//! each subscriber is woken only when what it waits on changed: a slot's row deleted or holding
//! another value (another holder, or another incarnation of one) than when its wait began, a
//! semaphore's row written. A renewal rewrites a slot's row with the same value and a new
//! revision: it does not wake the waiter, who would only be refused again. Nor does a free
//! slot taken and let go again between two looks: what the waiter compares is the same (a
//! candidate waits only on a held slot, whose holder's change stays a change). A session row of
//! an owner of units deleted (by hand, from outside) wakes the semaphore's waits too.
//!
//! This replaced a look at `data_version` every 10 ms by every waiting future on its own: 100
//! served grants cost 4 % of a core and 1 000 cost 26 % while nothing changed, a waiting `vvm run`
//! 0.5 %, and a hand-off waited half a tick on average (10.7 ms p50 from release to the next
//! waiter). Waiting now costs nothing while the store is quiet (one look in 30 s per process;
//! 1 010 waits looked 53 006 times in 1.5 s before, none now; 51 waiting `vvm run`s used 47 % of
//! a core before the shared feed), and a change is seen within
//! about a millisecond of its commit (the event's look, or the first settling look;
//! `BENCHMARKS.md`). The notifications are Linux-only, as the store is (the boot clock, the
//! locks). A commit of this process wakes its waiters on the same file directly, before the
//! write returns (`notify.rs`).
//!
//! Besides, the feed watches each slot's lock file (`lock.rs`): when the record of a slot names
//! the very file the watch has open and its lock is free at a look (at the wait's start, when a
//! lock thread saw a lock freed, and at each safety look; one `flock` call per such slot), no
//! process that could act under the record is left — it died, which writes nothing to the file —
//! and the waiter tries its insert at once. No earlier sighting of the lock held is needed, so a
//! holder that dies right after its insert is not missed. Each record (slot and revision) wakes
//! waiters this way once per store: an insert that was refused all the same (a record that cannot
//! be read, say) falls back to the expiry instead of waking its waiter again and again.
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
//! The looks run on the feed's thread; a subscriber reads what it starts from on its caller's
//! thread (never waiting for a lock). Expiries by time write nothing: each waiter's own deadline
//! (the record's expiry, a semaphore party's) covers them, as before.

use std::collections::HashMap;
use std::future::Future;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use rusqlite::OptionalExtension;
use tokio::sync::Notify;
use vvm_core::semaphore::{Semaphore, SemaphoreName};

use rusqlite::types::ValueRef;
use rusqlite::{Connection, OpenFlags};
use vvm_core::{SessionKey, Slot};

use super::file::Sharing;
use super::lock::{self, FileId, LockWatch};
use super::record;

/// Most slots whose lock one wait watches (one open descriptor and one `flock` per look each);
/// also the most lock files a store's threads block on at once, and the most owner sessions a
/// semaphore wait watches.
pub const LOCK_WATCH_SLOTS_MAX: usize = 64;

/// Most sessions remembered as suspects (their lock was seen free) until a semaphore
/// transaction judged them.
const SUSPECTS_MAX: usize = 1_024;

/// Most records remembered as having woken their waiters through a free lock.
const WOKEN_MAX: usize = 1_024;

/// The change feed of one store handle, shared by every waiter of it (see the module
/// documentation).
pub(super) struct Feed {
    /// The store's database file.
    path: Arc<Path>,
    /// The watching connection and the subscribers, under one lock: a subscriber reads what it
    /// starts from and joins in one step, so no look falls between the two.
    state: Mutex<State>,
    /// Whether the process's watcher (`notify.rs`) wakes this feed; registered at the first
    /// subscription.
    registered: std::sync::Once,
    /// Looks at the file so far (`data_version` checks and reads): see
    /// [`SqliteStore::feed_looks`](super::SqliteStore::feed_looks).
    looks: AtomicU64,
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
    /// A held lock that a wait depends on got no thread of its own (the limit of threads, or
    /// one could not start): from then on this feed needs the watcher's safety looks, the only
    /// thing that makes its waits look at such a lock (`notify.rs`).
    unwatched_lock: std::sync::atomic::AtomicBool,
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

/// What the feed's lock guards.
#[derive(Default)]
struct State {
    conn: Option<Connection>,
    /// The version the last look read the subscribers' rows at.
    version: Option<i64>,
    /// The number of the next subscriber.
    next: u64,
    slots: HashMap<u64, SlotWait>,
    names: HashMap<u64, NameWait>,
    /// The names `names` waits on, each with its number of waits: a look reads each once,
    /// without going through every wait (100 000 watches of one name are one read).
    watched_names: std::collections::BTreeMap<String, usize>,
}

/// A wait on slots: its slots (sorted), what it started from (`None`: not read yet; the next
/// look reads it), whether that changed.
struct SlotWait {
    keys: Vec<u32>,
    seen: Option<Seen>,
    changed: bool,
    wake: Arc<Notify>,
    /// The lock files whose threads tell this wait all it waits for (see [`Feed::covered`]):
    /// every watched slot was held, at the wait's start, by a record naming a lock held then
    /// and watched by a thread. Empty: not covered, every commit is looked at.
    covered: Vec<std::path::PathBuf>,
}

/// A wait on a semaphore: its name, what it compares ([`NameSeen`]) when the wait began
/// (`None` outside: not read yet), whether that changed.
struct NameWait {
    name: SemaphoreName,
    row: Option<NameSeen>,
    changed: bool,
    wake: Arc<Notify>,
}

/// A subscription to the feed; dropping it unsubscribes.
struct Subscription {
    feed: Arc<Feed>,
    id: u64,
    wake: Arc<Notify>,
}

impl Drop for Subscription {
    fn drop(&mut self) {
        let mut state = self.feed.lock();
        state.slots.remove(&self.id);
        if let Some(wait) = state.names.remove(&self.id) {
            let name = wait.name.as_str();
            if let Some(count) = state.watched_names.get_mut(name) {
                *count -= 1;
                if *count == 0 {
                    state.watched_names.remove(name);
                }
            }
        }
    }
}

/// What a wait on a semaphore compares: its row's version and how many of its owners' sessions
/// have a row. A session row deleted from outside (`DELETE FROM vvm_sessions`, by hand) writes
/// nothing to the semaphore's row, yet ends that owner's grant and starts its successors' wait
/// (`semaphore.rs`): the count makes it a change.
type NameSeen = Option<(i64, usize)>;

/// What a wait on `name` compares (`None`: no row). O(owners), each session row by its key.
fn row_version(conn: &Connection, name: &SemaphoreName) -> rusqlite::Result<NameSeen> {
    let row: Option<(i64, Option<Vec<u8>>)> = conn
        .prepare_cached("SELECT version, state FROM vvm_semaphores WHERE name = ?1")?
        .query_row([name.as_str()], |row| {
            let state = match row.get_ref(1)? {
                ValueRef::Blob(bytes) | ValueRef::Text(bytes) => Some(bytes.to_vec()),
                _ => None,
            };
            Ok((row.get(0)?, state))
        })
        .optional()?;
    let Some((version, state)) = row else {
        return Ok(None);
    };
    let owners: std::collections::HashSet<SessionKey> = state
        .and_then(|bytes| Semaphore::decode(&bytes).ok())
        .map(|state| state.owners().iter().map(|owner| owner.session).collect())
        .unwrap_or_default();
    let mut present = 0;
    for owner in owners {
        let found = conn
            .prepare_cached("SELECT 1 FROM vvm_sessions WHERE incarnation = ?1 AND id = ?2")?
            .query_row(record::session_columns(owner), |_| Ok(()))
            .optional()?;
        present += usize::from(found.is_some());
    }
    Ok(Some((version, present)))
}

impl Feed {
    /// A feed that has not opened its connection yet.
    pub(super) fn new(path: &Path, read_only: bool) -> Self {
        Feed {
            path: Arc::from(path),
            state: Mutex::new(State::default()),
            registered: std::sync::Once::new(),
            looks: AtomicU64::new(0),
            read_only,
            woken: Mutex::new(Vec::new()),
            waits: std::sync::atomic::AtomicU64::new(0),
            freed: tokio::sync::watch::Sender::new(0),
            lock_threads: Mutex::new(Vec::new()),
            suspects: Mutex::new(Vec::new()),
            unwatched_lock: std::sync::atomic::AtomicBool::new(false),
        }
    }

    /// The store's database file.
    pub(super) fn path(&self) -> &Path {
        &self.path
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Looks at the file so far (see [`SqliteStore::feed_looks`](super::SqliteStore::feed_looks)).
    pub(super) fn looks(&self) -> u64 {
        self.looks.load(Ordering::Relaxed)
    }

    /// Runs `read` on the watching connection, opening it first if needed. An error is logged
    /// and reported as `None`: the waiter then simply keeps waiting (its own timer still runs,
    /// and the next look tries again).
    fn with<T>(
        &self,
        state: &mut State,
        read: impl FnOnce(&Connection) -> rusqlite::Result<T>,
    ) -> Option<T> {
        let path = &*self.path;
        if self.read_only {
            let conn = super::reader::connect(path)
                .map_err(|error| tracing::debug!(error = %vvm_runtime::ErrorChain(&error), "SQLite change feed: cannot open a reading connection"))
                .ok()?;
            return read(&conn)
                .map_err(|error| tracing::debug!(error = %vvm_runtime::ErrorChain(&error), "SQLite change feed: check failed"))
                .ok();
        }
        if state.conn.is_none() {
            // The file exists (the store opened it); never create one here.
            let flags = OpenFlags::SQLITE_OPEN_READ_ONLY
                | OpenFlags::SQLITE_OPEN_NO_MUTEX
                | OpenFlags::SQLITE_OPEN_NOFOLLOW;
            // No busy wait (rusqlite's default is 5 s): a look that finds the file busy is
            // simply repeated at the next event or the settling looks.
            let opened = Connection::open_with_flags(path, flags)
                .and_then(|opened| opened.busy_timeout(Duration::ZERO).map(|()| opened))
                .and_then(|opened| super::schema::stable_plans(&opened).map(|()| opened));
            match opened {
                Ok(opened) => state.conn = Some(opened),
                Err(error) => {
                    tracing::debug!(error = %vvm_runtime::ErrorChain(&error), "SQLite change feed: cannot open its connection");
                    return None;
                }
            }
        }
        let result = read(state.conn.as_ref()?);
        result
            .map_err(|error| tracing::debug!(error = %vvm_runtime::ErrorChain(&error), "SQLite change feed: check failed"))
            .ok()
    }

    fn version(&self, state: &mut State) -> Option<i64> {
        self.looks.fetch_add(1, Ordering::Relaxed);
        if self.read_only {
            return Some(super::reader::fingerprint(&self.path));
        }
        // Cached: preparing the statement costs more than running it.
        self.with(state, |conn| {
            conn.prepare_cached("PRAGMA data_version")?
                .query_row([], |row| row.get(0))
        })
    }

    /// The version, the holders of `keys` (sorted) and the row versions of `names`, read in
    /// one read transaction so that the version is not newer than the rows: O(keys + names),
    /// whatever the number of rows.
    fn read(
        &self,
        state: &mut State,
        keys: &[u32],
        names: &[&SemaphoreName],
    ) -> Option<(Seen, Vec<NameSeen>)> {
        self.looks.fetch_add(1, Ordering::Relaxed);
        let read_only = self.read_only;
        let path = Arc::clone(&self.path);
        self.with(state, |conn| {
            let tx = conn.unchecked_transaction()?;
            let version = match read_only {
                // Read before the rows: a commit in between shows as a change next time.
                true => super::reader::fingerprint(&path),
                false => tx
                    .prepare_cached("PRAGMA data_version")?
                    .query_row([], |row| row.get(0))?,
            };
            let mut holders = Vec::with_capacity(keys.len());
            let mut named = Vec::with_capacity(keys.len());
            if !keys.is_empty() {
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
            let rows = names
                .iter()
                .map(|name| row_version(&tx, name))
                .collect::<rusqlite::Result<Vec<_>>>()?;
            tx.finish()?;
            Ok((
                Seen {
                    version,
                    holders,
                    named,
                },
                rows,
            ))
        })
    }

    /// Joins the process's watcher at the first subscription.
    fn register(self: &Arc<Self>) {
        self.registered.call_once(|| {
            let feed: std::sync::Weak<Feed> = Arc::downgrade(self);
            super::notify::register(&self.path, feed);
        });
    }

    /// One look (see the module documentation), from the watcher's thread: the version, and
    /// when it changed the rows of every subscriber, each woken when its own changed. At the
    /// safety look the slot waits are woken too, to look at their locks.
    /// Whether more looks are due soon: `false` when nobody waits or this look read a new
    /// version (the commit that raised the event is published).
    pub(super) fn look(&self, safety: bool) -> bool {
        let mut state = self.lock();
        if state.slots.is_empty() && state.names.is_empty() {
            // Nobody waits: nothing to read.
            return false;
        }
        if safety {
            for wait in state.slots.values() {
                wait.wake.notify_one();
            }
        } else if self.covered(&state) {
            // The holders' renewals of the slots waited on: nothing to read (`Feed::cover`).
            return false;
        }
        let version = self.version(&mut state);
        let unread = state.slots.values().any(|wait| wait.seen.is_none())
            || state.names.values().any(|wait| wait.row.is_none());
        if version.is_some() && version == state.version && !unread {
            return true;
        }
        let mut keys: Vec<u32> = state
            .slots
            .values()
            .flat_map(|wait| wait.keys.iter().copied())
            .collect();
        keys.sort_unstable();
        keys.dedup();
        let names: Vec<SemaphoreName> = state
            .watched_names
            .keys()
            .filter_map(|name| SemaphoreName::new(name).ok())
            .collect();
        let name_refs: Vec<&SemaphoreName> = names.iter().collect();
        let Some((seen, rows)) = self.read(&mut state, &keys, &name_refs) else {
            return true;
        };
        state.version = Some(seen.version);
        for wait in state.slots.values_mut() {
            let now = seen.of(&wait.keys);
            match &wait.seen {
                Some(before) if before.holders != now.holders => {
                    wait.changed = true;
                    wait.wake.notify_one();
                }
                // Another slot changed, or a holder renewed: the next look compares with this.
                _ => wait.seen = Some(now),
            }
        }
        for wait in state.names.values_mut() {
            let Ok(index) = names.binary_search_by(|name| name.as_str().cmp(wait.name.as_str()))
            else {
                continue;
            };
            let now = rows[index];
            match wait.row {
                Some(before) if before != now => {
                    wait.changed = true;
                    wait.wake.notify_one();
                }
                Some(_) => {}
                None => wait.row = Some(now),
            }
        }
        false
    }

    /// Subscribes a wait on `keys` (sorted), starting from what the file holds now.
    fn subscribe_slots(self: &Arc<Self>, keys: Vec<u32>) -> (Subscription, Option<Seen>) {
        self.register();
        let mut state = self.lock();
        let seen = self.read(&mut state, &keys, &[]).map(|(seen, _)| seen);
        let id = state.next;
        state.next += 1;
        let wake = Arc::new(Notify::new());
        state.slots.insert(
            id,
            SlotWait {
                keys,
                seen: seen.clone(),
                changed: false,
                wake: Arc::clone(&wake),
                covered: Vec::new(),
            },
        );
        drop(state);
        let subscription = Subscription {
            feed: Arc::clone(self),
            id,
            wake,
        };
        (subscription, seen)
    }

    /// The sessions owning units of `name` that name a lock file (`lock.rs`), with that file,
    /// from one read on the feed's connection (at most [`LOCK_WATCH_SLOTS_MAX`]); none on any
    /// error (their deaths are then learnt at their expiry).
    pub(super) fn owner_locks(&self, name: &SemaphoreName) -> Vec<(SessionKey, FileId)> {
        let mut state = self.lock();
        self.with(&mut state, |conn| {
            let tx = conn.unchecked_transaction()?;
            let state: Option<Vec<u8>> = tx
                .prepare_cached("SELECT state FROM vvm_semaphores WHERE name = ?1")?
                .query_row([name.as_str()], |row| {
                    Ok(match row.get_ref(0)? {
                        ValueRef::Blob(bytes) | ValueRef::Text(bytes) => Some(bytes.to_vec()),
                        _ => None,
                    })
                })
                .optional()?
                .flatten();
            let Some(state) = state.and_then(|bytes| Semaphore::decode(&bytes).ok()) else {
                return Ok(Vec::new());
            };
            let owners: std::collections::HashSet<SessionKey> =
                state.owners().iter().map(|owner| owner.session).collect();
            let mut named = Vec::with_capacity(owners.len().min(LOCK_WATCH_SLOTS_MAX));
            for owner in owners.into_iter().take(LOCK_WATCH_SLOTS_MAX) {
                match super::session::lock_of(&tx, owner) {
                    Ok(Some(id)) => named.push((owner, id)),
                    Ok(None) => {}
                    Err(_) => return Ok(Vec::new()),
                }
            }
            tx.finish()?;
            Ok(named)
        })
        .unwrap_or_default()
    }

    /// Resolves once the row of the semaphore `name` was written or deleted after this call.
    pub(super) fn name_changed(
        self: &Arc<Self>,
        name: &SemaphoreName,
    ) -> impl Future<Output = ()> + Send + 'static {
        self.register();
        let mut state = self.lock();
        let row = self.read(&mut state, &[], &[name]).map(|(_, rows)| rows[0]);
        let id = state.next;
        state.next += 1;
        let wake = Arc::new(Notify::new());
        *state
            .watched_names
            .entry(name.as_str().to_owned())
            .or_insert(0) += 1;
        state.names.insert(
            id,
            NameWait {
                name: name.clone(),
                row,
                changed: false,
                wake: Arc::clone(&wake),
            },
        );
        drop(state);
        let subscription = Subscription {
            feed: Arc::clone(self),
            id,
            wake,
        };
        async move {
            loop {
                let changed = subscription
                    .feed
                    .lock()
                    .names
                    .get(&subscription.id)
                    .is_some_and(|wait| wait.changed);
                if changed {
                    return;
                }
                subscription.wake.notified().await;
            }
        }
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
            if running.iter().any(|running| running == lock_path) {
                return;
            }
            if running.len() >= LOCK_WATCH_SLOTS_MAX {
                drop(running);
                self.lose_a_lock_watch();
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
            self.lose_a_lock_watch();
        }
    }

    /// Marks candidate wait `id` covered by the lock threads of `covering` (slot, slot lock
    /// path) when every slot of `keys` has one, running now: while each of those locks is held,
    /// nothing a commit can write lets the candidate take a slot — a slot whose holder's lock is
    /// held is taken by nobody (`Sq.DeadHolder`, `Sq.RecordDeleted`: even a record removed by
    /// hand keeps it), and its holder's renewals or a swap of its value change nothing for it —
    /// so commits need no look for it; the lock's thread wakes it when the lock is freed (a
    /// release, a death), and its record's expiry is its own deadline's business. An observer
    /// or a holder watching its own record is never covered: a swap or a removal is news to it.
    fn cover(&self, id: u64, keys: &[u32], covering: Vec<(u32, std::path::PathBuf)>) {
        if keys.is_empty() || keys.len() > LOCK_WATCH_SLOTS_MAX {
            return;
        }
        let running = self
            .lock_threads
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone();
        let every = keys.iter().all(|key| {
            covering
                .iter()
                .any(|(slot, path)| slot == key && running.contains(path))
        });
        if !every {
            return;
        }
        let paths = covering.into_iter().map(|(_, path)| path).collect();
        if let Some(wait) = self.lock().slots.get_mut(&id) {
            wait.covered = paths;
        }
    }

    /// Whether a commit's look can tell none of this feed's waits anything: no semaphore wait,
    /// and every slot wait covered by lock threads still running (see [`Feed::cover`]).
    fn covered(&self, state: &State) -> bool {
        if !state.names.is_empty() || state.slots.is_empty() {
            return false;
        }
        let running = self
            .lock_threads
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        state.slots.values().all(|wait| {
            !wait.covered.is_empty() && wait.covered.iter().all(|path| running.contains(path))
        })
    }

    /// A lock a wait depends on has no thread: the safety looks must cover it.
    fn lose_a_lock_watch(&self) {
        if !self.unwatched_lock.swap(true, Ordering::AcqRel) {
            tracing::warn!(path = %self.path.display(), "a lock of a SQLite store is not watched by a thread: its waiters look at it once a second");
            super::notify::needs_safety_now();
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
    /// holder is known gone by its free lock (see `lock.rs`). For a `candidate` — a waiter that
    /// only wants a slot it could take — a wait whose every slot is held under a slot lock
    /// watched by a thread needs no look at commits while those locks are held (`Feed::cover`).
    pub(super) fn changed(
        self: Arc<Self>,
        path: Arc<Path>,
        keys: &[Slot],
        sharing: Sharing,
        candidate: bool,
    ) -> impl Future<Output = ()> + Send + 'static {
        let mut keys: Vec<u32> = keys.iter().map(|key| key.0).collect();
        keys.sort_unstable();
        keys.dedup();
        // Read at the call, not at the first poll: a change right after it is not missed.
        let (subscription, start) = self.subscribe_slots(keys.clone());
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
            let mut covering = Vec::new();
            for watched in &locks {
                let named = seen.named.iter().any(|record| {
                    record.slot == watched.slot && record.lock == Some(watched.watch.id)
                });
                if named && !watched.watch.free() {
                    Arc::clone(&self).watch_lock(&watched.path, watched.session, sharing);
                    // A slot's own lock only: a session's outlives the holding's release.
                    if watched.session.is_none() {
                        covering.push((watched.slot, watched.path.clone()));
                    }
                }
            }
            if candidate {
                self.cover(subscription.id, &keys, covering);
            }
        }
        async move {
            let mut freed_open = true;
            loop {
                // What the feed read last for this wait: changed, or the records to judge.
                let named = {
                    let state = self.lock();
                    match state.slots.get(&subscription.id) {
                        Some(wait) if wait.changed => return,
                        Some(wait) => wait.seen.as_ref().map(|seen| seen.named.clone()),
                        None => None,
                    }
                };
                // A holder's death changes nothing in the file: only its lock tells.
                if let Some(named) = named {
                    if self.holder_gone(&named, &locks, wait) {
                        return;
                    }
                }
                // The next look: a change the feed read, a lock thread's freed lock, or the
                // feed's safety look.
                let woken = std::pin::pin!(subscription.wake.notified());
                let mut woken = woken;
                if freed_open {
                    let mut lock_freed = std::pin::pin!(freed.changed());
                    std::future::poll_fn(|cx| {
                        if woken.as_mut().poll(cx).is_ready() {
                            return std::task::Poll::Ready(());
                        }
                        match lock_freed.as_mut().poll(cx) {
                            std::task::Poll::Ready(result) => {
                                // Closed: the feed is gone (never while `self` lives).
                                freed_open = result.is_ok();
                                std::task::Poll::Ready(())
                            }
                            std::task::Poll::Pending => std::task::Poll::Pending,
                        }
                    })
                    .await;
                } else {
                    woken.await;
                }
            }
        }
    }
}

impl Seen {
    /// What this read saw of `keys` (sorted), a subset of its own.
    fn of(&self, keys: &[u32]) -> Seen {
        let mine = |slot: &u32| keys.binary_search(slot).is_ok();
        Seen {
            version: self.version,
            holders: self
                .holders
                .iter()
                .filter(|(slot, _)| mine(slot))
                .cloned()
                .collect(),
            named: self
                .named
                .iter()
                .filter(|named| mine(&named.slot))
                .copied()
                .collect(),
        }
    }
}

impl super::notify::Looks for Feed {
    fn path(&self) -> &Path {
        Feed::path(self)
    }

    fn look(&self, safety: bool) -> bool {
        Feed::look(self, safety)
    }
    fn needs_safety(&self) -> bool {
        self.unwatched_lock.load(Ordering::Acquire)
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
        conn.execute_batch(super::super::schema::SCHEMA_V8).unwrap();
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
