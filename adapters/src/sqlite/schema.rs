//! Opening a database file: recognising it as ours, creating the schema on first use, and
//! keeping revisions increasing across reboots.
//!
//! A file is recognised by its header alone (`PRAGMA application_id` and `user_version`), which
//! can be read without writing anything: a file that is not ours, or carries a newer schema, is
//! refused before the first byte could change. So is a file of ours that records another
//! machine: its machine id is read, and compared, before anything is written.
//!
//! Version 6 recorded no lock file for sessions. Such a file is migrated in place: two added
//! columns of `vvm_sessions` (`lock_dev`, `lock_ino`), empty in its existing rows: those sessions
//! name no lock file, so they end at their expiry only, as before. Version-6 programs then refuse
//! it as newer: they would create sessions that name no lock, which is safe, but a file read by
//! two versions at once is not what the schema version promises.
//!
//! Version 5 kept no index of the semaphores' parties. Such a file is migrated in place: one
//! added table (`vvm_semaphore_parties`), filled from the semaphores' states in the migrating
//! transaction. Version-5 programs then refuse it as newer: their writes would not keep the index.
//!
//! Version 4 had no semaphores. Such a file is migrated in place: one added table
//! (`vvm_semaphores`), empty; nothing else changes. Version-4 programs then refuse it as newer:
//! they would end sessions without ending their semaphores' parties.
//!
//! Version 3 had no sessions. Such a file is migrated in place: the table of session records
//! (`vvm_sessions`), the two columns that make a slot record a holding of a session
//! (`session_incarnation`, `session_id`: `NULL` in every existing row, which stay slot records
//! judged by their own expiry exactly as before) and the index on them. Version-3 programs then
//! refuse it as newer: they would judge a holding by its own expiry columns, which a holding
//! does not use.
//!
//! Version 2 recorded no lock file. Such a file is migrated in place (two added columns, empty
//! in its existing rows: those records name no lock file, so their holders are never judged dead
//! by one); version-2 programs then refuse it as newer.
//!
//! Version 1 recorded no machine. Such a file is migrated in place (one added column) and
//! claimed by the first machine that opens it with this version; version-1 programs then refuse
//! it as newer. A version-1 file that two machines already shared cannot be told apart from one
//! machine's, so the first opener wins it; the other is refused from then on.

use std::path::Path;
use std::time::Duration;

use rusqlite::{Connection, ErrorCode, OpenFlags, TransactionBehavior};

use super::busy::{is_busy, Backoff};
use super::clock::StoreClock;
use super::file::{self, Sharing};
use super::{SqliteStoreError, OPEN_BUSY_WAIT};

/// `PRAGMA application_id` of our files: "vvm1" in ASCII.
pub const APPLICATION_ID: i32 = 0x7676_6d31;

/// `PRAGMA user_version` this build writes and reads.
pub const SCHEMA_VERSION: i32 = 8;

/// The earlier version this build migrates: the same, without the machine id.
const SCHEMA_VERSION_1: i32 = 1;

/// The version before the lock file's identity (`lock_dev`, `lock_ino`) was recorded.
const SCHEMA_VERSION_2: i32 = 2;

/// The version before sessions (`vvm_sessions`, and holdings in `vvm_leases`).
const SCHEMA_VERSION_3: i32 = 3;

/// The version before semaphores (`vvm_semaphores`).
const SCHEMA_VERSION_4: i32 = 4;

/// The version before the index of the semaphores' parties (`vvm_semaphore_parties`).
const SCHEMA_VERSION_5: i32 = 5;

/// The version before the session's lock file (`lock_dev`, `lock_ino` of `vvm_sessions`).
const SCHEMA_VERSION_6: i32 = 6;

/// The version before the slots' tenures (`vvm_tenures`).
const SCHEMA_VERSION_7: i32 = 7;

/// How far the revision counter jumps on the first open under a new boot id.
///
/// Commits are synced lazily (`synchronous=NORMAL`), so a power loss may take back the last
/// commits, and with them revisions already handed out as fencing tokens. Such a loss always
/// comes with a reboot: the first opener of a new boot moves the counter past anything the
/// previous boot could have issued without a sync (the WAL between two syncs holds far fewer
/// than 2^32 commits) and syncs that jump before any revision of the new boot exists.
pub const REVISION_BOOT_GAP: i64 = 1 << 32;

/// The sessions table and the index on holdings: one text for a new file ([`SCHEMA_V6`]) and
/// the migration from version 3, so the two cannot drift apart.
macro_rules! sessions_ddl {
    () => {
        "CREATE TABLE vvm_sessions (
    incarnation INTEGER NOT NULL,
    id INTEGER NOT NULL,
    value BLOB NOT NULL,
    revision INTEGER NOT NULL,
    boot_id TEXT NOT NULL,
    expires_ns INTEGER NOT NULL,
    PRIMARY KEY (incarnation, id)
) STRICT, WITHOUT ROWID;
CREATE INDEX vvm_leases_session ON vvm_leases (session_incarnation, session_id)
    WHERE session_incarnation IS NOT NULL;
"
    };
}

/// The semaphores table: one text for a new file ([`SCHEMA_V6`]) and the migration from
/// version 4. One row per name ever used: `state` is the encoded semaphore
/// (`vvm_core::Semaphore::encode`), `NULL` once deleted, when the row keeps only the counters
/// a semaphore created again under the name continues (`generation`, `next_order_id`);
/// `version` is a revision of the store's counter, new with every write of the row, which the
/// change feed compares.
macro_rules! semaphores_ddl {
    () => {
        "CREATE TABLE vvm_semaphores (
    name TEXT PRIMARY KEY,
    state BLOB,
    version INTEGER NOT NULL,
    generation INTEGER NOT NULL,
    next_order_id INTEGER NOT NULL
) STRICT;
"
    };
}

/// The index of the semaphores' parties: one row per session and semaphore it is a party of
/// (owner or waiter), kept by every write of a semaphore's state in the same transaction, so
/// that ending a session finds its semaphores by its key, whatever the number of semaphores.
/// One text for a new file ([`SCHEMA_V6`]) and the migration from version 5.
macro_rules! parties_ddl {
    () => {
        "CREATE TABLE vvm_semaphore_parties (
    incarnation INTEGER NOT NULL,
    id INTEGER NOT NULL,
    name TEXT NOT NULL,
    PRIMARY KEY (incarnation, id, name)
) STRICT, WITHOUT ROWID;
"
    };
}

/// The identity of a session's lock file (see `lock.rs`), `NULL` naming none. One text for a new
/// file ([`SCHEMA_V8`]) and the migration from version 6.
macro_rules! session_lock_ddl {
    () => {
        "ALTER TABLE vvm_sessions ADD COLUMN lock_dev INTEGER;
ALTER TABLE vvm_sessions ADD COLUMN lock_ino INTEGER;
"
    };
}

/// The session that last took each slot as a holding (`Sq.HoldingRemoved`): a slot whose row is
/// gone while that session lives had its holding deleted from outside. One text for a new file
/// ([`SCHEMA_V8`]) and the migration from version 7.
macro_rules! tenures_ddl {
    () => {
        "CREATE TABLE vvm_tenures (
    slot INTEGER PRIMARY KEY,
    session_incarnation INTEGER NOT NULL,
    session_id INTEGER NOT NULL
) STRICT;
"
    };
}

/// Version 8: version 4, the semaphores, the index of their parties and the session's lock file
/// (`lock_dev`, `lock_ino` of `vvm_sessions`, `NULL` = none; see `lock.rs`) and the slots'
/// tenures (`vvm_tenures`). `vvm_store` has exactly one row: the revision counter, which survives deletes,
/// the boot id of the last opener and the machine the file belongs to (empty until the first
/// open claims it). `vvm_leases` holds one row per slot ever written and not deleted. A slot
/// record (`session_incarnation` and `session_id` `NULL`) is live while its boot id is the
/// host's current one and its expiry (ns of `CLOCK_BOOTTIME`) is in the future. A holding
/// (both set) is live exactly while the `vvm_sessions` row of that key is, judged the same way
/// by that row's boot id and expiry; its own `expires_ns` is unused (written as `i64::MAX`)
/// and it names no lock file. The partial index finds a session's holdings, so ending a session
/// costs O(its holdings), whatever the number of rows.
pub(crate) const SCHEMA_V8: &str = concat!(
    "
CREATE TABLE vvm_store (
    id INTEGER PRIMARY KEY CHECK (id = 0),
    revision INTEGER NOT NULL,
    boot_id TEXT NOT NULL,
    machine_id TEXT NOT NULL
) STRICT;
CREATE TABLE vvm_leases (
    slot INTEGER PRIMARY KEY,
    value BLOB NOT NULL,
    revision INTEGER NOT NULL,
    boot_id TEXT NOT NULL,
    expires_ns INTEGER NOT NULL,
    lock_dev INTEGER,
    lock_ino INTEGER,
    session_incarnation INTEGER,
    session_id INTEGER
) STRICT;
",
    sessions_ddl!(),
    semaphores_ddl!(),
    parties_ddl!(),
    session_lock_ddl!(),
    tenures_ddl!(),
    "INSERT INTO vvm_store (id, revision, boot_id, machine_id) VALUES (0, 0, '', '');
"
);

/// Version 1 → 2: the machine id, empty until the next step of opening claims the file.
const MIGRATE_V1_TO_V2: &str =
    "ALTER TABLE vvm_store ADD COLUMN machine_id TEXT NOT NULL DEFAULT '';";

/// Adds the identity of the holder's lock file (see `lock.rs`); `NULL` names none.
const MIGRATE_V2_TO_V3: &str = "ALTER TABLE vvm_leases ADD COLUMN lock_dev INTEGER;
ALTER TABLE vvm_leases ADD COLUMN lock_ino INTEGER;";

/// Adds sessions: their table, the session of a holding (`NULL` in every existing row: slot
/// records) and the index on it. The same definitions as [`SCHEMA_V6`].
const MIGRATE_V3_TO_V4: &str = concat!(
    "ALTER TABLE vvm_leases ADD COLUMN session_incarnation INTEGER;
ALTER TABLE vvm_leases ADD COLUMN session_id INTEGER;
",
    sessions_ddl!()
);

/// Adds semaphores: their table, empty. The same definition as [`SCHEMA_V6`].
const MIGRATE_V4_TO_V5: &str = semaphores_ddl!();

/// Adds the index of the semaphores' parties, empty; [`migrate`] then fills it from the
/// states. The same definition as [`SCHEMA_V6`].
const MIGRATE_V5_TO_V6: &str = parties_ddl!();

/// Adds the session's lock file. The same definition as [`SCHEMA_V8`].
const MIGRATE_V6_TO_V7: &str = session_lock_ddl!();

/// Adds the slots' tenures, empty: a holding taken before knows no tenure, as before. The same
/// definition as [`SCHEMA_V8`].
const MIGRATE_V7_TO_V8: &str = tenures_ddl!();

/// What a file's header says it is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Identity {
    /// A new or empty database: nothing in it, no ids set.
    Empty,
    /// Ours, at the version this build knows.
    Ours,
    /// Ours, at version 1: migrated on open.
    Version1,
    /// Ours, at version 2: migrated on open.
    Version2,
    /// Ours, at version 3: migrated on open.
    Version3,
    /// Ours, at version 4: migrated on open.
    Version4,
    /// Ours, at version 5: migrated on open.
    Version5,
    /// Ours, at version 6: migrated on open.
    Version6,
    /// Ours, at version 7: migrated on open.
    Version7,
    /// Ours, from a later version of this program.
    Newer(i32),
    /// Something else's.
    Foreign {
        /// Its application id.
        application_id: i32,
        /// Its schema version.
        user_version: i32,
    },
}

/// Classifies a file by its header and the number of objects in its schema.
pub(crate) fn classify(application_id: i32, user_version: i32, objects: i64) -> Identity {
    match (application_id, user_version) {
        (0, 0) if objects == 0 => Identity::Empty,
        (APPLICATION_ID, SCHEMA_VERSION) => Identity::Ours,
        (APPLICATION_ID, SCHEMA_VERSION_1) => Identity::Version1,
        (APPLICATION_ID, SCHEMA_VERSION_2) => Identity::Version2,
        (APPLICATION_ID, SCHEMA_VERSION_3) => Identity::Version3,
        (APPLICATION_ID, SCHEMA_VERSION_4) => Identity::Version4,
        (APPLICATION_ID, SCHEMA_VERSION_5) => Identity::Version5,
        (APPLICATION_ID, SCHEMA_VERSION_6) => Identity::Version6,
        (APPLICATION_ID, SCHEMA_VERSION_7) => Identity::Version7,
        (APPLICATION_ID, newer) if newer > SCHEMA_VERSION => Identity::Newer(newer),
        _ => Identity::Foreign {
            application_id,
            user_version,
        },
    }
}

/// The three reads that identify a file, from one snapshot: read one by one, a file another
/// process is creating meanwhile could show its new `user_version` beside its old
/// `application_id` and pass for another program's.
fn read_identity(conn: &Connection) -> rusqlite::Result<Identity> {
    if !conn.is_autocommit() {
        // Already inside the caller's transaction: one snapshot as it is.
        return read_identity_in(conn);
    }
    let tx = conn.unchecked_transaction()?;
    let identity = read_identity_in(&tx)?;
    tx.finish()?;
    Ok(identity)
}

fn read_identity_in(conn: &Connection) -> rusqlite::Result<Identity> {
    let application_id: i32 = conn.query_row("PRAGMA application_id", [], |row| row.get(0))?;
    let user_version: i32 = conn.query_row("PRAGMA user_version", [], |row| row.get(0))?;
    let objects: i64 =
        conn.query_row("SELECT count(*) FROM sqlite_schema", [], |row| row.get(0))?;
    Ok(classify(application_id, user_version, objects))
}

/// Builds a complete, empty store in the new file at `path`, which no other process knows yet:
/// WAL mode, the tables and the ids. Machine and boot are recorded by the first open, as for an
/// empty file.
fn build(path: &Path) -> Result<(), SqliteStoreError> {
    let flags = OpenFlags::SQLITE_OPEN_READ_WRITE
        | OpenFlags::SQLITE_OPEN_NO_MUTEX
        | OpenFlags::SQLITE_OPEN_NOFOLLOW;
    let mut conn =
        Connection::open_with_flags(path, flags).map_err(|source| SqliteStoreError::Open {
            path: path.to_owned(),
            source,
        })?;
    let mode: String = conn
        .query_row("PRAGMA journal_mode = WAL", [], |row| row.get(0))
        .map_err(sqlite("switching to WAL"))?;
    if !mode.eq_ignore_ascii_case("wal") {
        return Err(SqliteStoreError::JournalMode { found: mode });
    }
    let tx = conn.transaction().map_err(sqlite("creating the schema"))?;
    tx.execute_batch(SCHEMA_V8)
        .map_err(sqlite("creating the schema"))?;
    tx.pragma_update(None, "application_id", APPLICATION_ID)
        .map_err(sqlite("creating the schema"))?;
    tx.pragma_update(None, "user_version", SCHEMA_VERSION)
        .map_err(sqlite("creating the schema"))?;
    tx.commit().map_err(sqlite("creating the schema"))?;
    // Closing the only connection checkpoints the log into the file and removes it: the file
    // linked into place is complete on its own.
    conn.close()
        .map_err(|(_, source)| SqliteStoreError::Sqlite {
            what: "closing the new store",
            source,
        })
}

fn refuse(identity: Identity) -> Result<(), SqliteStoreError> {
    match identity {
        Identity::Empty
        | Identity::Ours
        | Identity::Version1
        | Identity::Version2
        | Identity::Version3
        | Identity::Version4
        | Identity::Version5
        | Identity::Version6
        | Identity::Version7 => Ok(()),
        Identity::Newer(found) => Err(SqliteStoreError::NewerSchema {
            found,
            supported: SCHEMA_VERSION,
        }),
        Identity::Foreign {
            application_id,
            user_version,
        } => Err(SqliteStoreError::NotOurs {
            application_id,
            user_version,
        }),
    }
}

/// The machine a file of the current version belongs to (empty: not claimed yet).
fn read_machine_id(conn: &Connection) -> Result<String, SqliteStoreError> {
    conn.query_row("SELECT machine_id FROM vvm_store WHERE id = 0", [], |row| {
        row.get(0)
    })
    .map_err(|source| match is_busy(&source) {
        true => SqliteStoreError::Sqlite {
            what: "reading the machine id",
            source,
        },
        false => SqliteStoreError::Damaged {
            what: "the machine id cannot be read".into(),
            source: Some(source),
        },
    })
}

/// Refuses a file recorded as another machine's.
fn refuse_other_machine(
    path: &Path,
    recorded: String,
    machine_id: &str,
) -> Result<(), SqliteStoreError> {
    if recorded.is_empty() || recorded == machine_id {
        return Ok(());
    }
    Err(SqliteStoreError::OtherMachine {
        path: path.to_owned(),
        found: recorded,
        ours: machine_id.to_owned(),
    })
}

/// Checks, reading only, that the store `conn` reads is ours, of this version, and this
/// machine's (see `reader.rs`).
pub(crate) fn check_readable(
    path: &Path,
    conn: &Connection,
    machine_id: &str,
) -> Result<(), SqliteStoreError> {
    let identity = read_identity(conn).map_err(sqlite("reading the file header"))?;
    refuse(identity)?;
    match identity {
        Identity::Ours => {}
        Identity::Empty => {
            return Err(SqliteStoreError::NotCreated {
                path: path.to_owned(),
            })
        }
        Identity::Version1
        | Identity::Version2
        | Identity::Version3
        | Identity::Version4
        | Identity::Version5
        | Identity::Version6
        | Identity::Version7 => {
            return Err(SqliteStoreError::OlderSchema {
                found: match identity {
                    Identity::Version1 => SCHEMA_VERSION_1,
                    Identity::Version2 => SCHEMA_VERSION_2,
                    Identity::Version3 => SCHEMA_VERSION_3,
                    Identity::Version4 => SCHEMA_VERSION_4,
                    Identity::Version5 => SCHEMA_VERSION_5,
                    Identity::Version6 => SCHEMA_VERSION_6,
                    _ => SCHEMA_VERSION_7,
                },
                supported: SCHEMA_VERSION,
            })
        }
        Identity::Newer(_) | Identity::Foreign { .. } => {}
    }
    refuse_other_machine(path, read_machine_id(conn)?, machine_id)
}

/// Runs `step` until it stops failing with `SQLITE_BUSY` or the wait is spent.
fn retry_busy<T>(
    busy_wait: Duration,
    what: &'static str,
    mut step: impl FnMut() -> Result<T, SqliteStoreError>,
) -> Result<T, SqliteStoreError> {
    let mut backoff = Backoff::new(busy_wait);
    loop {
        match step() {
            Err(SqliteStoreError::Sqlite { source, .. }) if is_busy(&source) && backoff.wait() => {}
            Err(SqliteStoreError::Sqlite { source, .. }) if is_busy(&source) => {
                return Err(SqliteStoreError::Busy { what, busy_wait });
            }
            other => return other,
        }
    }
}

fn sqlite(what: &'static str) -> impl FnOnce(rusqlite::Error) -> SqliteStoreError {
    move |source| match source.sqlite_error_code() {
        Some(ErrorCode::NotADatabase) => SqliteStoreError::NotADatabase,
        _ => SqliteStoreError::Sqlite { what, source },
    }
}

/// Whether a file of this identity records its machine (version 2 on).
fn has_machine_id(identity: Identity) -> bool {
    matches!(
        identity,
        Identity::Ours
            | Identity::Version2
            | Identity::Version3
            | Identity::Version4
            | Identity::Version5
            | Identity::Version6
            | Identity::Version7
    )
}

/// Brings the schema of a file of `identity` to [`SCHEMA_VERSION`] inside the caller's write
/// transaction, one version at a time (the caller then sets `user_version`); creates it in an
/// empty file. Nothing for a file of this version.
fn migrate(tx: &Connection, identity: Identity) -> Result<(), SqliteStoreError> {
    const V1: (&str, &str) = (MIGRATE_V1_TO_V2, "migrating from schema version 1");
    const V2: (&str, &str) = (MIGRATE_V2_TO_V3, "migrating from schema version 2");
    const V3: (&str, &str) = (MIGRATE_V3_TO_V4, "migrating from schema version 3");
    const V4: (&str, &str) = (MIGRATE_V4_TO_V5, "migrating from schema version 4");
    const V5: (&str, &str) = (MIGRATE_V5_TO_V6, "migrating from schema version 5");
    const V6: (&str, &str) = (MIGRATE_V6_TO_V7, "migrating from schema version 6");
    const V7: (&str, &str) = (MIGRATE_V7_TO_V8, "migrating from schema version 7");
    let steps: &[(&str, &'static str)] = match identity {
        Identity::Empty => &[(SCHEMA_V8, "creating the schema")],
        Identity::Version1 => &[V1, V2, V3, V4, V5, V6, V7],
        Identity::Version2 => &[V2, V3, V4, V5, V6, V7],
        Identity::Version3 => &[V3, V4, V5, V6, V7],
        Identity::Version4 => &[V4, V5, V6, V7],
        Identity::Version5 => &[V5, V6, V7],
        Identity::Version6 => &[V6, V7],
        Identity::Version7 => &[V7],
        Identity::Ours | Identity::Newer(_) | Identity::Foreign { .. } => &[],
    };
    for (sql, what) in steps {
        tx.execute_batch(sql).map_err(sqlite(what))?;
    }
    if identity == Identity::Version5 {
        // Earlier versions had no semaphores: their index starts empty, as the table does.
        super::parties::index_all_parties(tx).map_err(sqlite("migrating from schema version 5"))?;
    }
    if identity == Identity::Empty {
        tx.pragma_update(None, "application_id", APPLICATION_ID)
            .map_err(sqlite("creating the schema"))?;
    }
    Ok(())
}

/// Opens `path` read-write (creating it when missing), makes sure it is ours (creating the
/// schema in an empty file) and prepares the connection: WAL, `synchronous=NORMAL`, no SQLite
/// busy handler (the store retries by itself, see [`super::busy`]).
pub(crate) fn open(
    path: &Path,
    clock: &dyn StoreClock,
    machine_id: &str,
    busy_wait: Duration,
    sharing: Sharing,
) -> Result<Connection, SqliteStoreError> {
    // A missing store is created complete in one step; an existing one is checked (see
    // `file.rs`) before SQLite opens it.
    let (new_file, before) = file::ensure(path, sharing, build)?;
    file::check_access(path, true)?;
    // No URI interpretation, no creation (it exists), no symbolic link followed.
    let flags = OpenFlags::SQLITE_OPEN_READ_WRITE
        | OpenFlags::SQLITE_OPEN_NO_MUTEX
        | OpenFlags::SQLITE_OPEN_NOFOLLOW;
    let conn =
        Connection::open_with_flags(path, flags).map_err(|source| SqliteStoreError::Open {
            path: path.to_owned(),
            source,
        })?;
    file::check_unchanged(path, &before, sharing)?;
    // rusqlite installs a 5 s busy handler by default: SQLite's own back-off, which starves a
    // waiter while another process commits in a loop. Ours polls briefly instead.
    conn.busy_timeout(Duration::ZERO)
        .map_err(sqlite("clearing the busy handler"))?;
    stable_plans(&conn).map_err(sqlite("fixing the query plans"))?;
    if conn.is_readonly(rusqlite::MAIN_DB).unwrap_or(true) {
        return Err(SqliteStoreError::ReadOnly {
            path: path.to_owned(),
        });
    }

    // Opening happens once per process and its failure ends the process: its lock waits are
    // bounded longer than a call's, so that a busy moment of another opener or holder on a
    // loaded host is waited out instead of turned into an exit.
    let busy_wait = busy_wait.max(OPEN_BUSY_WAIT);
    // Only reads until the file is known to be ours (and this machine's) or empty.
    let identity = retry_busy(busy_wait, "reading the file header", || {
        read_identity(&conn).map_err(sqlite("reading the file header"))
    })?;
    refuse(identity)?;
    if has_machine_id(identity) {
        let recorded = retry_busy(busy_wait, "reading the machine id", || {
            read_machine_id(&conn)
        })?;
        refuse_other_machine(path, recorded, machine_id)?;
    }

    // WAL: readers never block the writer, and a commit appends to the log instead of
    // rewriting pages. The mode is stored in the file; setting it again is a no-op.
    let mode: String = retry_busy(busy_wait, "switching to WAL", || {
        conn.query_row("PRAGMA journal_mode = WAL", [], |row| row.get(0))
            .map_err(sqlite("switching to WAL"))
    })?;
    if !mode.eq_ignore_ascii_case("wal") {
        return Err(SqliteStoreError::JournalMode { found: mode });
    }

    let mut conn = conn;
    // Several processes may open an empty or old file at once: decide again under the write
    // lock. A file that read as ours needs nothing: no write lock taken.
    let created = if identity == Identity::Ours {
        Identity::Ours
    } else {
        retry_busy(busy_wait, "creating the schema", || {
            let tx = conn
                .transaction_with_behavior(TransactionBehavior::Immediate)
                .map_err(sqlite("creating the schema"))?;
            let identity = read_identity(&tx).map_err(sqlite("reading the file header"))?;
            refuse(identity)?;
            if has_machine_id(identity) {
                // Again under the write lock: a migration never touches another machine's file,
                // even one claimed since the check above. Returning rolls back.
                refuse_other_machine(path, read_machine_id(&tx)?, machine_id)?;
            }
            migrate(&tx, identity)?;
            if identity != Identity::Ours {
                tx.pragma_update(None, "user_version", SCHEMA_VERSION)
                    .map_err(sqlite("creating the schema"))?;
            }
            tx.commit().map_err(sqlite("creating the schema"))?;
            Ok(identity)
        })?
    };
    let created = new_file || created == Identity::Empty;

    // The first open of a boot jumps the counter and syncs that jump (see REVISION_BOOT_GAP).
    // Read first: when this boot and this machine are recorded already (every open but the
    // first of a boot), no write lock is needed — the boot id only ever moves to the current one.
    let recorded_boot = retry_busy(busy_wait, "reading the boot", || {
        conn.query_row(
            "SELECT boot_id, machine_id FROM vvm_store WHERE id = 0",
            [],
            |row| Ok((row.get::<_, String>(0)?, row.get::<_, String>(1)?)),
        )
        .map_err(sqlite("reading the boot"))
    });
    let current = matches!(&recorded_boot, Ok((boot, machine)) if boot == clock.boot_id() && machine == machine_id);
    conn.pragma_update(None, "synchronous", "FULL")
        .map_err(sqlite("setting synchronous"))?;
    let jumped = if current {
        false
    } else {
        retry_busy(busy_wait, "recording the boot", || {
            let tx = conn
                .transaction_with_behavior(TransactionBehavior::Immediate)
                .map_err(sqlite("recording the boot"))?;
            let (revision, boot_id, recorded): (i64, String, String) = tx
                .query_row(
                    "SELECT revision, boot_id, machine_id FROM vvm_store WHERE id = 0",
                    [],
                    |row| Ok((row.get(0)?, row.get(1)?, row.get(2)?)),
                )
                .map_err(|source| SqliteStoreError::Damaged {
                    what: "the store row cannot be read".into(),
                    source: Some(source),
                })?;
            // Again under the write lock: another machine may have claimed a new file meanwhile.
            // Returning drops `tx`, which rolls back: nothing was written.
            let claim = recorded.is_empty();
            refuse_other_machine(path, recorded, machine_id)?;
            if revision < 0 {
                return Err(SqliteStoreError::Damaged {
                    what: format!("the revision counter is negative ({revision})"),
                    source: None,
                });
            }
            let jump = boot_id != clock.boot_id();
            if jump {
                let jumped = revision.checked_add(REVISION_BOOT_GAP).ok_or_else(|| {
                    SqliteStoreError::Damaged {
                        what: format!("the revision counter ({revision}) is exhausted"),
                        source: None,
                    }
                })?;
                tx.execute(
                    "UPDATE vvm_store SET revision = ?1, boot_id = ?2 WHERE id = 0",
                    (jumped, clock.boot_id()),
                )
                .map_err(sqlite("recording the boot"))?;
            }
            if claim {
                tx.execute(
                    "UPDATE vvm_store SET machine_id = ?1 WHERE id = 0",
                    [machine_id],
                )
                .map_err(sqlite("recording the machine"))?;
            }
            tx.commit().map_err(sqlite("recording the boot"))?;
            Ok(jump)
        })?
    };
    // Every later commit is synced lazily: a process crash loses nothing (the WAL is in the
    // page cache), a power loss only commits of a boot whose leases are all expired anyway.
    conn.pragma_update(None, "synchronous", "NORMAL")
        .map_err(sqlite("setting synchronous"))?;

    // The companions SQLite created meanwhile are this user's too (a planted one is refused).
    file::check_unchanged(path, &before, sharing)?;
    tracing::debug!(path = %path.display(), created, new_boot = jumped, "SQLite lease store opened");
    Ok(conn)
}

/// Keeps every prepared statement's query plan (SQLite's query planner stability guarantee).
/// The bundled SQLite is built with `SQLITE_ENABLE_STAT4`, under which a statement whose
/// `WHERE` binds a parameter against an indexed column is compiled again at its first step
/// after every new binding, "in the hope of a better plan": each cached statement of this
/// store (one slot, one session per execution) was parsed and planned anew on every call —
/// about 50 µs per holding written, most of a batch acquire's time. Our statements have one
/// right plan (a key lookup); the guarantee makes the statement cache work as meant.
pub(crate) fn stable_plans(conn: &Connection) -> Result<(), rusqlite::Error> {
    conn.set_db_config(
        rusqlite::config::DbConfig::SQLITE_DBCONFIG_ENABLE_QPSG,
        true,
    )
    .map(|_| ())
}

#[cfg(test)]
mod tests {
    use super::*;
    use rusqlite::OptionalExtension;

    /// The store's lookup of a slot's row with its session's (the shape of `record::load`): a
    /// join on the sessions' composite key, whose bound slot STAT4 would plan again.
    const LOOKUP: &str = "SELECT l.revision, s.incarnation IS NOT NULL FROM vvm_leases AS l \
         LEFT JOIN vvm_sessions AS s \
         ON s.incarnation = l.session_incarnation AND s.id = l.session_id WHERE l.slot = ?1";

    /// How often [`LOOKUP`] was compiled again while it ran with 100 bindings on `conn`.
    fn reprepares(conn: &Connection) -> i32 {
        for slot in 0..100_i64 {
            let mut statement = conn.prepare_cached(LOOKUP).unwrap();
            let _: Option<i64> = statement
                .query_row([slot], |row| row.get(0))
                .optional()
                .unwrap();
        }
        let statement = conn.prepare_cached(LOOKUP).unwrap();
        statement.get_status(rusqlite::StatementStatus::RePrepare)
    }

    // covers: Sq.StablePlans
    #[tokio::test]
    async fn the_stores_statements_are_not_compiled_again_for_each_binding() {
        let dir = std::env::temp_dir().join(format!(
            "vvm-stable-plans-{}-{:?}",
            std::process::id(),
            std::thread::current().id()
        ));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("s.sqlite");
        let store = crate::sqlite::SqliteStore::open(&path).unwrap();
        // The hazard, on a connection without the guarantee: compiled again per binding.
        let bare = Connection::open(&path).unwrap();
        assert!(reprepares(&bare) >= 99, "{}", reprepares(&bare));
        // The store's own connection keeps its plans.
        let compiled = store
            .blocking(|conn, _| Ok(reprepares(conn)))
            .await
            .unwrap();
        assert_eq!(
            compiled, 0,
            "the store's connection compiles its statements again"
        );
        drop(store);
        let _ = std::fs::remove_dir_all(&dir);
    }

    // covers: Sq.Identity
    #[test]
    fn files_are_recognised_by_their_header() {
        assert_eq!(classify(0, 0, 0), Identity::Empty);
        assert_eq!(classify(APPLICATION_ID, SCHEMA_VERSION, 3), Identity::Ours);
        assert_eq!(classify(APPLICATION_ID, 1, 3), Identity::Version1);
        assert_eq!(classify(APPLICATION_ID, 2, 3), Identity::Version2);
        assert_eq!(classify(APPLICATION_ID, 3, 3), Identity::Version3);
        assert_eq!(classify(APPLICATION_ID, 4, 3), Identity::Version4);
        assert_eq!(classify(APPLICATION_ID, 5, 3), Identity::Version5);
        assert_eq!(classify(APPLICATION_ID, 6, 3), Identity::Version6);
        assert_eq!(classify(APPLICATION_ID, 7, 3), Identity::Version7);
        assert_eq!(
            classify(APPLICATION_ID, SCHEMA_VERSION + 1, 3),
            Identity::Newer(SCHEMA_VERSION + 1)
        );
        let foreign = |application_id, user_version| Identity::Foreign {
            application_id,
            user_version,
        };
        assert_eq!(classify(0, 0, 1), foreign(0, 0), "tables without our id");
        assert_eq!(classify(0, SCHEMA_VERSION, 0), foreign(0, SCHEMA_VERSION));
        assert_eq!(classify(7, 0, 0), foreign(7, 0));
        assert_eq!(classify(APPLICATION_ID, 0, 0), foreign(APPLICATION_ID, 0));
    }
}
