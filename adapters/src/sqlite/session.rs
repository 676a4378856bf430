//! Sessions of the SQLite store ([`SessionStore`]): a table of session records beside the slot
//! records, and holdings that are slot records naming their session.
//!
//! A session record is a row of `vvm_sessions` keyed by the session's incarnation and id, with
//! a value, a revision and an expiry judged exactly like a slot record's: by the store's clock
//! (by default `CLOCK_BOOTTIME` and the boot id), read under the write lock. A holding is the
//! slot's row in `vvm_leases` with `session_incarnation` and `session_id` set: it carries the
//! session's value and its own revision, names no lock file of its own (its session's guards it),
//! and its own expiry columns are unused. Every read of a slot (`record::load`, used by every
//! [`LeaseStore`](vvm_runtime::LeaseStore) operation) joins
//! the session row in the same statement and judges a holding by it, so a holding is live
//! exactly while its session is — its time left is the session's — and an expired or deleted
//! session's holdings are dead for every reader at once, with no sweep.
//!
//! | operation | one `BEGIN IMMEDIATE` transaction (`get_session`: one read transaction) |
//! |---|---|
//! | `create_session` | (the session's lock taken first, outside the transaction) read the row; if live: nothing. Else delete the dead row of the key and its holdings, remove up to [`SWEEP_SESSIONS_MAX`] other dead sessions with theirs, take a revision from the counter, insert the row naming the lock |
//! | `keep_alive` | read the row; if live at `expected`: update its expiry (the revision stays) |
//! | `delete_session` | read the row; if live at `expected`: delete its holdings and the row, and remove its parties from every semaphore (`semaphore.rs`) |
//! | `get_session` | read the row |
//! | `acquire` | read the session row; if not live: `SessionGone`. Read the slot (as `get`): live and a holding of this session → its revision; a holding of another session whose lock is free → that session ended ([`end_if_dead`]) and the holding written; live otherwise → `Held`; else write the holding with a revision from the counter |
//!
//! **Costs.** A keepalive updates the session's row only, O(1) whatever the number of holdings:
//! the holdings' rows are not written, so a waiter's change feed, which compares the holders
//! of its slots, is not woken by it. Ending a session (delete, or the create that replaces a
//! dead one) deletes its holdings through the index on the session columns: O(its holdings).
//! An acquire is a few indexed reads and one row written.
//!
//! **Dead rows** are removed lazily. An expired session's rows stay until a create under its key
//! or a later create's sweep removes them, or a write to the slot replaces the holding; nothing
//! depends on that for correctness (readers judge by the session row). A create under a key
//! whose row is dead deletes that key's holdings first, so a holding never comes back to life
//! with a new session of the same key.
//!
//! **A holding is a slot record** for everything else: `compare_and_delete` at its value and
//! revision releases it (the session and its other holdings stay), `compare_and_swap` replaces
//! it with a slot record of its own TTL, and an insert on a slot whose holding is dead replaces
//! it.
//!
//! **A dead process's session ends at once** (`Sq.SessionLock`, `lock.rs`): the kernel knows
//! when the session's process died, as it knows for a slot's holder. A session has one lock file
//! (`<database>.session-<incarnation>-<id>.lock`: one per session, not per holding), locked
//! exclusively by its process from `create_session` for the session's whole life and named by
//! the session's row (`lock_dev`, `lock_ino`). `vvm run` hands it, with the slot locks, to the
//! supervisor of its command
//! ([`let_children_inherit_slot_locks`](super::let_children_inherit_slot_locks)), which keeps it
//! until the command's whole tree is gone: a free lock proves that nothing that could act under
//! the session's holdings is left. The process lets go of it, and removes the file, when the
//! session is over (deleted, or its row found absent): session keys are never reused, so no file
//! per session ever opened is left behind, and nobody else ever uses the path.
//!
//! Another process that obtains a shared lock on the very file a live session's row names, still
//! linked at its path ([`end_if_dead`]), ends that session in its own transaction — the row,
//! every holding and every semaphore party, as `delete_session` does: one transaction per
//! session, whatever the number of holdings. An `acquire` or an insert meeting a holding of
//! another session judges that session so; a semaphore transaction judges the sessions its
//! store's feed saw free (`semaphore.rs`). Waiters are woken by the kernel: the change feed
//! blocks on the lock of the session holding a watched slot, and a queued semaphore acquire on
//! the locks of the sessions owning units (`feed.rs`). A stopped or hung process keeps its lock,
//! and a session naming no lock (created by a version-6 program, or its lock file removed or
//! replaced) is judged by its expiry only: the TTL stays the bound that never depends on the
//! lock.

use std::time::Duration;

use rusqlite::{Connection, OptionalExtension, Transaction, TransactionBehavior};
use vvm_core::{Revision, SessionKey, Slot};
use vvm_runtime::{Acquired, LeaseValue, SessionRecord, SessionStore, StoreError, ValueError};

use super::lock::{self, FileId};
use super::record::{self, Judged, Now, Row, Stored, TxError};
use super::{transact, Shared, SqliteStore, SqliteStoreError, Step};

/// Most dead sessions (another boot's, or expired) a create removes with their holdings, besides
/// a dead row under its own key: dead rows never pile up while sessions are created, and no
/// create pays for many.
pub const SWEEP_SESSIONS_MAX: u32 = 4;

/// A session row that cannot be read, or whose liveness cannot be told.
fn corrupt(session: SessionKey, source: ValueError) -> StoreError {
    StoreError::failed(SqliteStoreError::CorruptSession { session, source })
}

/// Reads and judges the session row of `key`.
pub(super) fn load(tx: &Transaction<'_>, key: SessionKey, now: Now<'_>) -> Result<Judged, TxError> {
    let row: Option<Row> = tx
        .prepare_cached(
            "SELECT value, revision, boot_id, expires_ns FROM vvm_sessions \
             WHERE incarnation = ?1 AND id = ?2",
        )?
        .query_row(record::session_columns(key), |row| {
            Ok([
                row.get_ref(0)?.into(),
                row.get_ref(1)?.into(),
                row.get_ref(2)?.into(),
                row.get_ref(3)?.into(),
            ])
        })
        .optional()?;
    record::judge_columns(row.as_ref(), now)
        .map_err(|what| TxError::Store(corrupt(key, ValueError::Malformed(what))))
}

/// The session record a live row holds, or [`SqliteStoreError::CorruptSession`].
fn read(key: SessionKey, stored: &Stored) -> Result<SessionRecord, StoreError> {
    let bytes = stored
        .bytes()
        .ok_or(ValueError::Malformed("value is neither text nor a blob"))
        .map_err(|source| corrupt(key, source))?;
    let revision = stored
        .revision()
        .ok_or(ValueError::Malformed("revision is not a positive integer"))
        .map_err(|source| corrupt(key, source))?;
    let value = LeaseValue::decode(bytes).map_err(|source| corrupt(key, source))?;
    Ok(SessionRecord { value, revision })
}

/// Whether the live session row `stored` is readable and at `expected`: an unreadable one is
/// never kept alive or deleted (it ends at its expiry), as a corrupt slot record is never
/// swapped or deleted.
fn ours(key: SessionKey, stored: &Stored, expected: Revision) -> bool {
    stored.revision() == Some(expected) && read(key, stored).is_ok()
}

/// Deletes the session row with these key columns and every holding of it (through the index
/// on the session columns: O(its holdings)).
fn end(tx: &Transaction<'_>, key: (i64, i64)) -> Result<(), TxError> {
    tx.prepare_cached("DELETE FROM vvm_leases WHERE session_incarnation = ?1 AND session_id = ?2")?
        .execute(key)?;
    tx.prepare_cached("DELETE FROM vvm_sessions WHERE incarnation = ?1 AND id = ?2")?
        .execute(key)?;
    // Its parties go with its row, in every path that ends a session (a delete, a dead
    // process, a sweep of expired rows): a party whose session row is absent is then one
    // removed from outside, whose units still count as used (`semaphore.rs`).
    super::parties::end_parties(tx, record::session_key(key.0, key.1))
}

/// Removes up to [`SWEEP_SESSIONS_MAX`] dead sessions — of another boot, or expired — with
/// their holdings, and the lock file of each whose lock is free (its process died without
/// ending it). A row whose liveness cannot be told is left alone.
fn sweep(tx: &Transaction<'_>, shared: &Shared, now: Now<'_>) -> Result<(), TxError> {
    let dead: Vec<(i64, i64)> = tx
        .prepare_cached(
            "SELECT incarnation, id FROM vvm_sessions \
             WHERE typeof(boot_id) = 'text' AND typeof(expires_ns) = 'integer' \
               AND (boot_id != ?1 OR expires_ns <= ?2) \
             LIMIT ?3",
        )?
        .query_map((now.boot_id, now.ns, SWEEP_SESSIONS_MAX), |row| {
            Ok((row.get(0)?, row.get(1)?))
        })?
        .collect::<Result<_, _>>()?;
    for columns in dead {
        let key = record::session_key(columns.0, columns.1);
        if let Some(named) = lock_of(tx, key)? {
            let path = lock::session_path(&shared.path, key);
            if let Some(lock) = lock::take_named(&path, named, shared.sharing) {
                lock::remove(&path);
                drop(lock);
            }
        }
        end(tx, columns)?;
    }
    Ok(())
}

/// The lock file the session row of `key` names (see `lock.rs`), if any.
pub(super) fn lock_of(conn: &Connection, key: SessionKey) -> Result<Option<FileId>, TxError> {
    let named = conn
        .prepare_cached(
            "SELECT lock_dev, lock_ino FROM vvm_sessions WHERE incarnation = ?1 AND id = ?2",
        )?
        .query_row(record::session_columns(key), record::named_file)
        .optional()?;
    Ok(named.flatten())
}

/// Ends the session `key` of another process when the kernel tells that process gone: its row
/// names a lock file, and a shared lock on that very file, still linked at the session's lock
/// path, is obtained ([`lock::take_named`]) — no process holds its exclusive lock, neither the
/// session's nor anything that inherited the descriptor. Then, in the caller's transaction, the
/// row, every holding and every semaphore party of the session go together (as
/// `delete_session` does: one transaction per session, whatever the number of holdings), and the
/// lock file is removed. Whether it ended the session. Blocking: a few file system calls, made
/// only when the row names a lock.
/// Whether `slot` had its holding deleted from outside under a session that may still act
/// (`Sq.HoldingRemoved`): no row at all (a release retires its row, and a session's end deletes
/// its holdings with its own row), while the session its tenure names — not `taker` — lives and
/// its process holds its lock. Answers the time that session has left; a session whose process
/// is gone is ended here, as a live holding's would be.
pub(super) fn removed_while_held(
    tx: &Transaction<'_>,
    shared: &Shared,
    slot: Slot,
    taker: Option<SessionKey>,
    now: Now<'_>,
) -> Result<Option<Duration>, TxError> {
    if record::row_exists(tx, slot)? {
        return Ok(None);
    }
    let Some(holder) = record::tenure_of(tx, slot)?.filter(|holder| Some(*holder) != taker) else {
        return Ok(None);
    };
    match load(tx, holder, now)? {
        Judged::Live(_, left) if !end_if_dead(tx, shared, holder)? => Ok(Some(left)),
        _ => Ok(None),
    }
}

pub(super) fn end_if_dead(
    tx: &Transaction<'_>,
    shared: &Shared,
    key: SessionKey,
) -> Result<bool, TxError> {
    let Some(named) = lock_of(tx, key)? else {
        return Ok(false);
    };
    let path = lock::session_path(&shared.path, key);
    let Some(lock) = lock::take_named(&path, named, shared.sharing) else {
        return Ok(false);
    };
    end(tx, record::session_columns(key))?;
    // Removed while locked: a transaction rolled back after this leaves a row naming a file that
    // is gone, which then ends at its expiry, as a session naming no lock.
    lock::remove(&path);
    drop(lock);
    tracing::info!(session = %key, "session ended at once: its lock was free, so its process is gone");
    Ok(true)
}

/// Most sessions whose TTL a handle remembers.
const SESSION_TTLS_MAX: usize = 4_096;

/// The TTL of each session a store handle made or kept alive (its own sessions: a handle
/// makes a few).
#[derive(Debug, Default)]
pub(super) struct SessionTtls(std::sync::Mutex<std::collections::HashMap<SessionKey, Duration>>);

impl SessionTtls {
    fn map(&self) -> std::sync::MutexGuard<'_, std::collections::HashMap<SessionKey, Duration>> {
        // Every critical section leaves the map consistent; a poisoned lock is usable.
        self.0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// `session` was made or kept alive with `ttl`.
    fn note(&self, session: SessionKey, ttl: Duration) {
        let mut ttls = self.map();
        if ttls.len() < SESSION_TTLS_MAX || ttls.contains_key(&session) {
            ttls.insert(session, ttl);
        }
    }

    /// `session` is over.
    fn forget(&self, session: SessionKey) {
        self.map().remove(&session);
    }

    /// The TTL `session` was made or last kept alive with, if by this handle.
    pub(super) fn of(&self, session: SessionKey) -> Option<Duration> {
        self.map().get(&session).copied()
    }
}

/// Lets go of this process's lock of the session `key` (and removes its file) once the session
/// is known to be over: deleted, or its row found absent.
fn let_go(shared: &Shared, key: SessionKey) {
    lock::registry().let_go_session(&lock::session_path(&shared.path, key));
}

/// The session `key`, live, with a readable value (a holding carries the session's value: an
/// unreadable one is not copied); `None` when it is not live.
fn live_session(
    tx: &Transaction<'_>,
    key: SessionKey,
    now: Now<'_>,
) -> Result<Option<Stored>, TxError> {
    match load(tx, key, now)? {
        Judged::Absent => Ok(None),
        Judged::Live(stored, _) => {
            read(key, &stored)?;
            Ok(Some(stored))
        }
    }
}

/// The acquire of `slot` for the live `session` `key`, in `tx`: the slot judged free, then the
/// holding written. A slot whose live record is a holding of this session answers its
/// revision; a live holding of another session whose process is gone by its lock ends that
/// session (`end_if_dead`) and is taken. The flag says whether it wrote.
fn acquire_in(
    tx: &Transaction<'_>,
    shared: &Shared,
    session: &Stored,
    slot: Slot,
    key: SessionKey,
    now: Now<'_>,
) -> Result<(Acquired, bool), TxError> {
    let free = match record::load(tx, slot, now)? {
        Judged::Live(stored, _) => match record::holding_of(tx, slot)? {
            Some(holder) if holder == key => {
                return Ok((Acquired::Written(stored.lease(slot)?.revision), false));
            }
            Some(holder) => end_if_dead(tx, shared, holder)?,
            None => false,
        },
        Judged::Absent => removed_while_held(tx, shared, slot, Some(key), now)?.is_none(),
    };
    if !free {
        return Ok((Acquired::Held, false));
    }
    let bytes = session.bytes().unwrap_or_default();
    let revision = record::write_holding(tx, slot, bytes, key, now)?;
    Ok((Acquired::Written(revision), true))
}

impl SessionStore for SqliteStore {
    /// One transaction: a dead row under `key` is replaced, its holdings deleted with it (they
    /// must not live again with the new session), and a few other dead sessions are swept. The
    /// session's lock is taken first (see `lock.rs`) and the row names it; an untrusted or
    /// unlockable lock file fails the create with a typed error, before anything is written.
    async fn create_session(
        &self,
        key: SessionKey,
        value: &LeaseValue,
        ttl: Duration,
    ) -> Result<Option<Revision>, StoreError> {
        self.writable()?;
        let bytes = value.encode().into_bytes();
        self.blocking(move |conn, shared| {
            let path = lock::session_path(&shared.path, key);
            // Kept across the transaction, as an insert keeps it (never taken inside one).
            let mut registry = lock::registry();
            let held = registry.held(&path);
            let fresh = match held {
                Some(_) => None,
                None => Some(
                    lock::lock_session(&registry, &path, shared.sharing)
                        .map_err(StoreError::failed)?,
                ),
            };
            let named = held.or(fresh.as_ref().map(|lock| lock.id));
            let result = transact(conn, shared, TransactionBehavior::Immediate, |tx, now| {
                if let Judged::Live(..) = load(tx, key, now)? {
                    return Ok(Step::read(None));
                }
                let columns = record::session_columns(key);
                end(tx, columns)?;
                sweep(tx, shared, now)?;
                let revision = record::next_revision(tx)?;
                tx.prepare_cached(
                    "INSERT INTO vvm_sessions \
                     (incarnation, id, value, revision, boot_id, expires_ns, lock_dev, lock_ino) \
                     VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8)",
                )?
                .execute((
                    columns.0,
                    columns.1,
                    &bytes,
                    record::revision_column(revision),
                    now.boot_id,
                    record::expiry_ns(now.ns, ttl),
                    named.map(|id| id.to_columns().0),
                    named.map(|id| id.to_columns().1),
                ))?;
                Ok(Step::wrote(Some(revision)))
            });
            match &result {
                // Written, or perhaps written: the row names the lock, kept for the session's life.
                Ok(Some(_)) | Err(StoreError::Unknown { .. }) => {
                    shared.session_ttls.note(key, ttl);
                    registry.keep_session(&path, fresh)
                }
                // Nothing written: a lock taken for this create goes with its file.
                Ok(None) | Err(_) => {
                    if fresh.is_some() {
                        lock::remove(&path);
                    }
                }
            }
            result
        })
        .await
    }

    /// Moves the session row's expiry only: the revision stays, and no holding is written. A
    /// session found absent is over: this process lets go of its lock.
    async fn keep_alive(
        &self,
        key: SessionKey,
        expected: Revision,
        ttl: Duration,
    ) -> Result<Option<Revision>, StoreError> {
        self.writable()?;
        let (kept, absent) = self
            .transact(TransactionBehavior::Immediate, move |tx, now| {
                match load(tx, key, now)? {
                    Judged::Live(stored, _) if ours(key, &stored, expected) => {
                        let (incarnation, id) = record::session_columns(key);
                        tx.prepare_cached(
                            "UPDATE vvm_sessions SET expires_ns = ?3 WHERE incarnation = ?1 AND id = ?2",
                        )?
                        .execute((incarnation, id, record::expiry_ns(now.ns, ttl)))?;
                        Ok(Step::wrote((Some(expected), false)))
                    }
                    Judged::Live(..) => Ok(Step::read((None, false))),
                    Judged::Absent => Ok(Step::read((None, true))),
                }
            })
            .await?;
        if absent {
            let_go(&self.shared, key);
        } else if kept.is_some() {
            self.shared.session_ttls.note(key, ttl);
        }
        Ok(kept)
    }

    /// Deletes the row and every holding of the session in the same transaction: every
    /// waiter of those slots sees them deleted, as after a release. Then this process lets go
    /// of the session's lock (also when the row was found absent already).
    async fn delete_session(
        &self,
        key: SessionKey,
        expected: Revision,
    ) -> Result<bool, StoreError> {
        self.writable()?;
        let (deleted, over) = self
            .transact(TransactionBehavior::Immediate, move |tx, now| {
                match load(tx, key, now)? {
                    Judged::Live(stored, _) if ours(key, &stored, expected) => {
                        end(tx, record::session_columns(key))?;
                        Ok(Step::wrote((true, true)))
                    }
                    Judged::Live(..) => Ok(Step::read((false, false))),
                    Judged::Absent => Ok(Step::read((false, true))),
                }
            })
            .await?;
        if over {
            self.shared.session_ttls.forget(key);
            let_go(&self.shared, key);
        }
        Ok(deleted)
    }

    async fn get_session(&self, key: SessionKey) -> Result<Option<SessionRecord>, StoreError> {
        self.transact(TransactionBehavior::Deferred, move |tx, now| {
            let record = match load(tx, key, now)? {
                Judged::Absent => None,
                Judged::Live(stored, _) => Some(read(key, &stored)?),
            };
            Ok(Step::read(record))
        })
        .await
    }

    /// One transaction: the session judged live, then the slot judged free, then the holding
    /// written. A slot whose live record is a holding of this session answers its revision; a
    /// live holding of another session whose process is gone by its lock ends that session
    /// (`end_if_dead`) and is taken.
    async fn acquire(&self, slot: Slot, key: SessionKey) -> Result<Acquired, StoreError> {
        self.writable()?;
        self.blocking(move |conn, shared| {
            transact(conn, shared, TransactionBehavior::Immediate, |tx, now| {
                let Some(session) = live_session(tx, key, now)? else {
                    return Ok(Step::read(Acquired::SessionGone));
                };
                let (acquired, wrote) = acquire_in(tx, shared, &session, slot, key, now)?;
                Ok(if wrote {
                    Step::wrote(acquired)
                } else {
                    Step::read(acquired)
                })
            })
        })
        .await
    }

    /// Every slot in one transaction, judged as [`acquire`](Self::acquire) judges one: the
    /// session is read once, and the write lock is held for at most
    /// [`ACQUIRE_BATCH_MAX`](vvm_runtime::ACQUIRE_BATCH_MAX) holdings.
    async fn acquire_batch(
        &self,
        slots: Vec<Slot>,
        key: SessionKey,
    ) -> Result<Vec<Acquired>, StoreError> {
        if slots.len() > vvm_runtime::ACQUIRE_BATCH_MAX {
            return Err(StoreError::failed(SqliteStoreError::BatchTooLarge {
                slots: slots.len(),
                max: vvm_runtime::ACQUIRE_BATCH_MAX,
            }));
        }
        self.writable()?;
        self.blocking(move |conn, shared| {
            transact(conn, shared, TransactionBehavior::Immediate, |tx, now| {
                let Some(session) = live_session(tx, key, now)? else {
                    return Ok(Step::read(vec![Acquired::SessionGone; slots.len()]));
                };
                let mut answers = Vec::with_capacity(slots.len());
                let mut wrote_any = false;
                for &slot in &slots {
                    let (acquired, wrote) = acquire_in(tx, shared, &session, slot, key, now)?;
                    wrote_any |= wrote;
                    answers.push(acquired);
                }
                Ok(if wrote_any {
                    Step::wrote(answers)
                } else {
                    Step::read(answers)
                })
            })
        })
        .await
    }
}
