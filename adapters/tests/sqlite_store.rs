//! What the SQLite store promises beyond the conformance suite: several connections on one
//! file stay atomic, files that are not ours are refused untouched, reboots expire records and
//! keep revisions increasing, corrupt records are reported and kept, a held lock fails a
//! call cleanly after a bounded wait, and a file belongs to one machine.

use std::collections::HashSet;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::task::JoinSet;
use vvm_adapters::sqlite::{
    ClockError, StoreClock, APPLICATION_ID, BUSY_WAIT_MAX, REVISION_BOOT_GAP, SCHEMA_VERSION,
};
use vvm_adapters::{SqliteStore, SqliteStoreError};
use vvm_conformance::{value, ScratchDir, LONG_TTL};
use vvm_core::{Incarnation, Revision, SessionId, SessionKey, Slot};
use vvm_runtime::{Acquired, Inserted, Lease, LeaseStore, SessionStore, StoreError};

const SLOT: Slot = Slot(5);

/// A clock the test moves by hand, in one boot.
#[derive(Clone, Debug)]
struct ManualClock {
    boot_id: &'static str,
    ns: Arc<AtomicU64>,
}

impl ManualClock {
    fn new(boot_id: &'static str) -> Self {
        ManualClock {
            boot_id,
            ns: Arc::new(AtomicU64::new(1_000_000_000)),
        }
    }

    fn advance(&self, by: Duration) {
        self.ns.fetch_add(by.as_nanos() as u64, Ordering::SeqCst);
    }

    fn ns(&self) -> i64 {
        self.ns.load(Ordering::SeqCst) as i64
    }
}

impl StoreClock for ManualClock {
    fn boot_id(&self) -> &str {
        self.boot_id
    }

    fn since_boot(&self) -> Result<Duration, ClockError> {
        Ok(Duration::from_nanos(self.ns.load(Ordering::SeqCst)))
    }
}

fn open_with(path: &Path, clock: &ManualClock) -> SqliteStore {
    SqliteStore::builder()
        .clock(clock.clone())
        .open(path)
        .expect("the store opens")
}

/// Opens `path` as machine `machine_id` in its own boot.
fn open_as(
    path: &Path,
    machine_id: &str,
    clock: &ManualClock,
) -> Result<SqliteStore, SqliteStoreError> {
    SqliteStore::builder()
        .clock(clock.clone())
        .machine_id(machine_id)
        .open(path)
}

/// A connection of another program to `path` (creating it), whose file only its user may read,
/// as the store asks of every file it opens.
fn raw(path: &Path) -> rusqlite::Connection {
    let conn = rusqlite::Connection::open(path).expect("raw connection opens");
    private(path);
    conn
}

/// Makes the file at `path` readable and writable by its user only (mode 600).
fn private(path: &Path) {
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600)).unwrap();
}

// covers: Sq.Atomic
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_connections_on_one_file_let_exactly_one_insert_per_slot_win() {
    const SLOTS: u32 = 40;
    const ATTEMPTS: u64 = 20;
    let dir = ScratchDir::new("vvm-sqlite-two");
    let path = dir.file("leases.sqlite");
    let busy = Duration::from_secs(2);
    let stores = [
        SqliteStore::builder().busy_wait(busy).open(&path).unwrap(),
        SqliteStore::builder().busy_wait(busy).open(&path).unwrap(),
    ];

    let mut race = JoinSet::new();
    for slot in 0..SLOTS {
        for attempt in 0..ATTEMPTS {
            let store = stores[attempt as usize % 2].clone();
            let value = value(u64::from(slot) * ATTEMPTS + attempt);
            race.spawn(async move {
                let outcome = store
                    .insert_if_not_exists(Slot(slot), &value, LONG_TTL)
                    .await;
                (Slot(slot), value, outcome.expect("insert succeeds"))
            });
        }
    }
    let mut winners = Vec::new();
    while let Some(joined) = race.join_next().await {
        if let (slot, value, Some(revision)) = joined.unwrap() {
            winners.push((slot, Lease { value, revision }));
        }
    }

    let slots: HashSet<Slot> = winners.iter().map(|(slot, _)| *slot).collect();
    assert_eq!(
        winners.len(),
        SLOTS as usize,
        "one winner per slot: {winners:?}"
    );
    assert_eq!(slots.len(), SLOTS as usize);
    let revisions: HashSet<Revision> = winners.iter().map(|(_, lease)| lease.revision).collect();
    assert_eq!(
        revisions.len(),
        winners.len(),
        "one counter for the whole file"
    );
    for (slot, lease) in &winners {
        for store in &stores {
            assert_eq!(store.get(*slot).await.unwrap().as_ref(), Some(lease));
        }
    }
}

// covers: Sq.Atomic
#[tokio::test]
async fn connections_taking_turns_see_each_others_writes_and_revisions_increase() {
    let dir = ScratchDir::new("vvm-sqlite-turns");
    let path = dir.file("leases.sqlite");
    let (a, b) = (
        SqliteStore::open(&path).unwrap(),
        SqliteStore::open(&path).unwrap(),
    );

    let mut lease = Lease {
        value: value(0),
        revision: a
            .insert_if_not_exists(SLOT, &value(0), LONG_TTL)
            .await
            .unwrap()
            .unwrap(),
    };
    for n in 1..=20 {
        let (reader, writer) = if n % 2 == 0 { (&a, &b) } else { (&b, &a) };
        assert_eq!(reader.get(SLOT).await.unwrap().as_ref(), Some(&lease));
        let revision = writer
            .compare_and_swap(SLOT, &lease, &value(n), LONG_TTL)
            .await
            .unwrap()
            .expect("the swap of the current lease wins");
        assert!(revision > lease.revision);
        lease = Lease {
            value: value(n),
            revision,
        };
    }
    assert!(b.compare_and_delete(SLOT, &lease).await.unwrap());
    let again = a
        .insert_if_not_exists(SLOT, &value(0), LONG_TTL)
        .await
        .unwrap()
        .unwrap();
    assert!(again > lease.revision);
}

fn assert_unchanged(path: &Path, before: &[u8]) {
    let after = std::fs::read(path).unwrap();
    assert!(after == before, "{} was modified", path.display());
    for side in ["-wal", "-journal"] {
        let mut name = path.as_os_str().to_owned();
        name.push(side);
        assert!(!Path::new(&name).exists(), "{side} file left behind");
    }
}

// covers: Sq.Identity
#[test]
fn a_foreign_sqlite_file_is_refused_and_left_unchanged() {
    let dir = ScratchDir::new("vvm-sqlite-foreign");
    let path = dir.file("other.sqlite");
    {
        let conn = raw(&path);
        conn.execute_batch("CREATE TABLE notes (body TEXT); INSERT INTO notes VALUES ('keep me');")
            .unwrap();
    }
    let before = std::fs::read(&path).unwrap();

    let refused = SqliteStore::open(&path).unwrap_err();
    assert!(
        matches!(
            refused,
            SqliteStoreError::NotOurs {
                application_id: 0,
                user_version: 0
            }
        ),
        "{refused}"
    );
    assert!(
        refused.to_string().contains("not a vvm lease store"),
        "{refused}"
    );
    assert_unchanged(&path, &before);
}

// covers: Sq.Identity
#[test]
fn a_newer_schema_is_refused_and_left_unchanged() {
    let dir = ScratchDir::new("vvm-sqlite-newer");
    let path = dir.file("leases.sqlite");
    drop(SqliteStore::open(&path).unwrap());
    raw(&path)
        .pragma_update(None, "user_version", SCHEMA_VERSION + 1)
        .unwrap();
    let before = std::fs::read(&path).unwrap();

    let refused = SqliteStore::open(&path).unwrap_err();
    assert!(
        matches!(refused, SqliteStoreError::NewerSchema { found, supported }
            if found == SCHEMA_VERSION + 1 && supported == SCHEMA_VERSION),
        "{refused}"
    );
    assert_unchanged(&path, &before);
}

// covers: Sq.Identity
#[test]
fn a_file_that_is_not_a_database_is_refused_and_left_unchanged() {
    let dir = ScratchDir::new("vvm-sqlite-text");
    let path = dir.file("notes.txt");
    let before = b"these are notes, not a database\n".repeat(64);
    std::fs::write(&path, &before).unwrap();
    private(&path);

    let refused = SqliteStore::open(&path).unwrap_err();
    assert!(
        matches!(refused, SqliteStoreError::NotADatabase),
        "{refused}"
    );
    assert_unchanged(&path, &before);
}

// covers: Sq.Identity
#[test]
fn bad_paths_and_options_are_clear_errors() {
    let dir = ScratchDir::new("vvm-sqlite-bad");
    let missing_dir = dir.file("no-such-dir").join("leases.sqlite");
    let error = SqliteStore::open(&missing_dir).unwrap_err();
    assert!(
        matches!(error, SqliteStoreError::NoDirectory { .. }),
        "{error}"
    );
    assert!(error.to_string().contains("no-such-dir"), "{error}");
    assert!(error.to_string().contains("does not exist"), "{error}");

    let too_long = SqliteStore::builder()
        .busy_wait(BUSY_WAIT_MAX + Duration::from_millis(1))
        .open(dir.file("leases.sqlite"))
        .unwrap_err();
    assert!(
        matches!(too_long, SqliteStoreError::BusyWaitTooLong { .. }),
        "{too_long}"
    );
    assert!(
        !dir.file("leases.sqlite").exists(),
        "refused options create no file"
    );
}

// covers: Sq.Identity
#[tokio::test]
async fn a_new_file_gets_our_schema_and_records_survive_reopening() {
    let dir = ScratchDir::new("vvm-sqlite-reopen");
    let path = dir.file("leases.sqlite");
    let clock = ManualClock::new("boot-a");
    let first = open_with(&path, &clock);
    let lease = Lease {
        value: value(1),
        revision: first
            .insert_if_not_exists(SLOT, &value(1), LONG_TTL)
            .await
            .unwrap()
            .unwrap(),
    };
    drop(first);

    let conn = raw(&path);
    let application_id: i32 = conn
        .query_row("PRAGMA application_id", [], |r| r.get(0))
        .unwrap();
    let user_version: i32 = conn
        .query_row("PRAGMA user_version", [], |r| r.get(0))
        .unwrap();
    let journal: String = conn
        .query_row("PRAGMA journal_mode", [], |r| r.get(0))
        .unwrap();
    assert_eq!(
        (application_id, user_version),
        (APPLICATION_ID, SCHEMA_VERSION)
    );
    assert_eq!(journal, "wal");
    drop(conn);

    let second = open_with(&path, &clock);
    assert_eq!(second.get(SLOT).await.unwrap(), Some(lease.clone()));
    let next = second
        .insert_if_not_exists(Slot(6), &value(2), LONG_TTL)
        .await
        .unwrap()
        .unwrap();
    assert!(
        next > lease.revision,
        "the counter continues after reopening"
    );
}

// covers: Sq.BootClock
#[tokio::test]
async fn a_new_boot_expires_every_record_and_moves_revisions_past_the_old_ones() {
    let dir = ScratchDir::new("vvm-sqlite-boot");
    let path = dir.file("leases.sqlite");
    let before = open_with(&path, &ManualClock::new("boot-a"));
    let old = Lease {
        value: value(1),
        revision: before
            .insert_if_not_exists(SLOT, &value(1), LONG_TTL)
            .await
            .unwrap()
            .unwrap(),
    };
    drop(before);

    // The new boot's clock starts near zero again: only the boot id tells the records apart.
    let after = open_with(&path, &ManualClock::new("boot-b"));
    assert_eq!(after.get(SLOT).await.unwrap(), None);
    assert!(!after.compare_and_delete(SLOT, &old).await.unwrap());
    let revision = after
        .insert_if_not_exists(SLOT, &value(2), LONG_TTL)
        .await
        .unwrap()
        .unwrap();
    assert!(
        revision.0 > old.revision.0 + REVISION_BOOT_GAP as u64 - 1,
        "{revision:?}"
    );

    // Reopening within the same boot does not jump again.
    let same_boot = open_with(&path, &ManualClock::new("boot-b"));
    let next = same_boot
        .insert_if_not_exists(Slot(6), &value(3), LONG_TTL)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(next.0, revision.0 + 1);
}

// covers: Sq.Corrupt
#[tokio::test]
async fn a_corrupt_live_record_is_reported_and_kept_until_it_expires() {
    let dir = ScratchDir::new("vvm-sqlite-corrupt");
    let path = dir.file("leases.sqlite");
    let clock = ManualClock::new("boot-a");
    let store = open_with(&path, &clock);
    let expires_ns = clock.ns() + 10_000_000_000;
    raw(&path)
        .execute(
            "INSERT INTO vvm_leases (slot, value, revision, boot_id, expires_ns) VALUES (?1, ?2, 7, 'boot-a', ?3)",
            (SLOT.0, b"\xff\x00 not a lease".as_slice(), expires_ns),
        )
        .unwrap();

    let error = store.get(SLOT).await.unwrap_err();
    assert!(
        matches!(error, StoreError::Corrupt { slot: 5, .. }),
        "{error}"
    );
    assert_eq!(
        store.insert_if_not_exists(SLOT, &value(1), LONG_TTL).await,
        Ok(None)
    );
    let guess = Lease {
        value: value(1),
        revision: Revision(7),
    };
    assert_eq!(
        store
            .compare_and_swap(SLOT, &guess, &value(1), LONG_TTL)
            .await,
        Ok(None)
    );
    assert_eq!(store.compare_and_delete(SLOT, &guess).await, Ok(false));
    assert!(
        matches!(store.get(SLOT).await, Err(StoreError::Corrupt { .. })),
        "still there"
    );

    clock.advance(Duration::from_secs(10));
    assert_eq!(
        store.get(SLOT).await,
        Ok(None),
        "expired, the corrupt record is absent"
    );
    let revision = store
        .insert_if_not_exists(SLOT, &value(1), LONG_TTL)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(
        store.get(SLOT).await.unwrap(),
        Some(Lease {
            value: value(1),
            revision
        })
    );
}

// covers: Sq.Busy
#[tokio::test]
async fn a_lock_held_elsewhere_fails_writes_after_the_wait_and_writes_nothing() {
    let dir = ScratchDir::new("vvm-sqlite-locked");
    let path = dir.file("leases.sqlite");
    let store = SqliteStore::builder()
        .busy_wait(Duration::from_millis(30))
        .open(&path)
        .unwrap();
    let holder = raw(&path);
    holder.execute_batch("BEGIN IMMEDIATE").unwrap();

    let refused = store.insert_if_not_exists(SLOT, &value(1), LONG_TTL).await;
    assert!(
        matches!(&refused, Err(error @ StoreError::Failed { .. })
            if matches!(error.find::<SqliteStoreError>(), Some(SqliteStoreError::Busy { .. }))),
        "{refused:?}"
    );
    // WAL readers do not wait for the writer.
    assert_eq!(store.get(SLOT).await, Ok(None));

    holder.execute_batch("COMMIT").unwrap();
    assert_eq!(
        store.get(SLOT).await,
        Ok(None),
        "the failed insert wrote nothing"
    );
    assert!(store
        .insert_if_not_exists(SLOT, &value(1), LONG_TTL)
        .await
        .unwrap()
        .is_some());
}

// covers: Sq.BootClock
#[tokio::test]
async fn time_left_follows_the_store_clock() {
    let dir = ScratchDir::new("vvm-sqlite-left");
    let path = dir.file("leases.sqlite");
    let clock = ManualClock::new("boot-a");
    let store = open_with(&path, &clock);
    assert_eq!(store.time_left(SLOT).await, Ok(None));
    store
        .insert_if_not_exists(SLOT, &value(1), Duration::from_secs(10))
        .await
        .unwrap()
        .unwrap();
    clock.advance(Duration::from_secs(4));
    assert_eq!(
        store.time_left(SLOT).await,
        Ok(Some(Duration::from_secs(6)))
    );
    clock.advance(Duration::from_secs(6));
    assert_eq!(store.time_left(SLOT).await, Ok(None));
}

/// The bytes of a database file and of its write-ahead log, if any.
fn file_and_log(path: &Path) -> (Vec<u8>, Option<Vec<u8>>) {
    let mut wal = path.as_os_str().to_owned();
    wal.push("-wal");
    (std::fs::read(path).unwrap(), std::fs::read(wal).ok())
}

fn assert_other_machine(refused: &SqliteStoreError, found: &str, ours: &str) {
    assert!(
        matches!(refused, SqliteStoreError::OtherMachine { found: f, ours: o, .. }
            if f == found && o == ours),
        "{refused}"
    );
    let message = refused.to_string();
    for needle in ["single-host", "etcd", "FoundationDB", "left unchanged"] {
        assert!(
            message.contains(needle),
            "{needle:?} missing from: {message}"
        );
    }
}

// covers: Sq.OneMachine
/// Issue 11, finding 3: on one file, machine B (its own boot id) took the slot machine A held —
/// A's record looked like one of an earlier boot. Now B's open is refused, changing nothing,
/// and A keeps its lease.
#[tokio::test]
async fn a_file_in_use_by_another_machine_is_refused_and_left_unchanged() {
    let dir = ScratchDir::new("vvm-sqlite-machines");
    let path = dir.file("leases.sqlite");
    let a = open_as(&path, "machine-a", &ManualClock::new("boot-of-a")).unwrap();
    let won = a
        .insert_if_not_exists(SLOT, &value(1), LONG_TTL)
        .await
        .unwrap()
        .expect("machine A wins the free slot");
    let before = file_and_log(&path);

    let refused = open_as(&path, "machine-b", &ManualClock::new("boot-of-b")).unwrap_err();
    assert_other_machine(&refused, "machine-a", "machine-b");
    assert!(
        file_and_log(&path) == before,
        "the refused open changed the file"
    );
    let held = a.get(SLOT).await.unwrap().expect("A still holds the slot");
    assert_eq!(held.revision, won);
}

// covers: Sq.OneMachine
#[test]
fn a_closed_file_of_another_machine_is_refused_and_left_unchanged() {
    let dir = ScratchDir::new("vvm-sqlite-machines-closed");
    let path = dir.file("leases.sqlite");
    drop(open_as(&path, "machine-a", &ManualClock::new("boot-of-a")).unwrap());
    let before = std::fs::read(&path).unwrap();

    let refused = open_as(&path, "machine-b", &ManualClock::new("boot-of-b")).unwrap_err();
    assert_other_machine(&refused, "machine-a", "machine-b");
    assert_unchanged(&path, &before);
    // The machine it belongs to still opens it, also after a reboot.
    drop(open_as(&path, "machine-a", &ManualClock::new("boot-of-a-again")).unwrap());
}

// covers: Sq.OneMachine, Sq.BootClock
#[tokio::test]
async fn a_reboot_of_the_same_machine_still_expires_its_records() {
    let dir = ScratchDir::new("vvm-sqlite-machine-reboot");
    let path = dir.file("leases.sqlite");
    let before = open_as(&path, "machine-a", &ManualClock::new("boot-1")).unwrap();
    let old = before
        .insert_if_not_exists(SLOT, &value(1), LONG_TTL)
        .await
        .unwrap()
        .unwrap();
    drop(before);
    let after = open_as(&path, "machine-a", &ManualClock::new("boot-2")).unwrap();
    assert_eq!(after.get(SLOT).await.unwrap(), None);
    let new = after
        .insert_if_not_exists(SLOT, &value(2), LONG_TTL)
        .await
        .unwrap()
        .expect("the slot is free after a reboot");
    assert!(new > old);
}

/// Version 1 of the schema, as earlier builds created it (no machine id).
const SCHEMA_V1: &str = "
CREATE TABLE vvm_store (
    id INTEGER PRIMARY KEY CHECK (id = 0),
    revision INTEGER NOT NULL,
    boot_id TEXT NOT NULL
) STRICT;
CREATE TABLE vvm_leases (
    slot INTEGER PRIMARY KEY,
    value BLOB NOT NULL,
    revision INTEGER NOT NULL,
    boot_id TEXT NOT NULL,
    expires_ns INTEGER NOT NULL
) STRICT;
INSERT INTO vvm_store (id, revision, boot_id) VALUES (0, 7, 'boot-a');
";

// covers: Sq.OneMachine, Sq.Identity
/// A file of schema version 1 is migrated in place: its live records stay live, and the first
/// machine that opens it claims it.
#[tokio::test]
async fn a_version_1_file_is_migrated_and_claimed_by_its_first_opener() {
    let dir = ScratchDir::new("vvm-sqlite-v1");
    let path = dir.file("leases.sqlite");
    {
        let conn = raw(&path);
        conn.execute_batch(SCHEMA_V1).unwrap();
        conn.execute(
            "INSERT INTO vvm_leases VALUES (?1, ?2, 7, 'boot-a', ?3)",
            (i64::from(SLOT.0), value(1).encode().into_bytes(), i64::MAX),
        )
        .unwrap();
        conn.pragma_update(None, "application_id", APPLICATION_ID)
            .unwrap();
        conn.pragma_update(None, "user_version", 1).unwrap();
        conn.execute_batch("PRAGMA journal_mode = WAL").unwrap();
    }

    let store = open_as(&path, "machine-a", &ManualClock::new("boot-a")).unwrap();
    let lease = store
        .get(SLOT)
        .await
        .unwrap()
        .expect("the v1 record is live");
    assert_eq!((lease.value, lease.revision), (value(1), Revision(7)));
    let next = store
        .insert_if_not_exists(Slot(6), &value(2), LONG_TTL)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(next, Revision(8), "same boot: the counter goes on");
    drop(store);

    let conn = raw(&path);
    let user_version: i32 = conn
        .query_row("PRAGMA user_version", [], |r| r.get(0))
        .unwrap();
    let machine: String = conn
        .query_row("SELECT machine_id FROM vvm_store", [], |r| r.get(0))
        .unwrap();
    assert_eq!(
        (user_version, machine.as_str()),
        (SCHEMA_VERSION, "machine-a")
    );
    drop(conn);
    let refused = open_as(&path, "machine-b", &ManualClock::new("boot-b")).unwrap_err();
    assert_other_machine(&refused, "machine-a", "machine-b");
}

// covers: Sq.Identity, Sq.DeadHolder
/// A file of schema version 2 gains the lock columns in place; its live records name no lock
/// file, so they are never taken early, even by a candidate that can take the slot's lock.
#[tokio::test]
async fn a_version_2_file_is_migrated_and_its_records_name_no_lock() {
    let dir = ScratchDir::new("vvm-sqlite-v2");
    let path = dir.file("leases.sqlite");
    {
        let conn = raw(&path);
        conn.execute_batch(SCHEMA_V1).unwrap();
        conn.execute_batch(
            "ALTER TABLE vvm_store ADD COLUMN machine_id TEXT NOT NULL DEFAULT 'machine-a';",
        )
        .unwrap();
        conn.execute(
            "INSERT INTO vvm_leases VALUES (?1, ?2, 7, 'boot-a', ?3)",
            (i64::from(SLOT.0), value(1).encode().into_bytes(), i64::MAX),
        )
        .unwrap();
        conn.pragma_update(None, "application_id", APPLICATION_ID)
            .unwrap();
        conn.pragma_update(None, "user_version", 2).unwrap();
        conn.execute_batch("PRAGMA journal_mode = WAL").unwrap();
    }

    let store = open_as(&path, "machine-a", &ManualClock::new("boot-a")).unwrap();
    // Nobody holds the slot's lock: the candidate takes it, but the record names no file.
    let refused = store
        .insert_or_time_left(SLOT, &value(2), LONG_TTL)
        .await
        .unwrap();
    assert!(
        matches!(refused, Inserted::Held { left: Some(_) }),
        "{refused:?}"
    );
    let lease = store
        .get(SLOT)
        .await
        .unwrap()
        .expect("the v2 record is live");
    assert_eq!((lease.value, lease.revision), (value(1), Revision(7)));
    drop(store);

    let conn = raw(&path);
    let user_version: i32 = conn
        .query_row("PRAGMA user_version", [], |r| r.get(0))
        .unwrap();
    assert_eq!(user_version, SCHEMA_VERSION);
    let named: (Option<i64>, Option<i64>) = conn
        .query_row(
            "SELECT lock_dev, lock_ino FROM vvm_leases WHERE slot = ?1",
            [i64::from(SLOT.0)],
            |r| Ok((r.get(0)?, r.get(1)?)),
        )
        .unwrap();
    assert_eq!(named, (None, None));
}

// covers: Sq.OneMachine
#[test]
fn a_bad_machine_id_is_a_clear_error() {
    let dir = ScratchDir::new("vvm-sqlite-bad-machine");
    let path = dir.file("leases.sqlite");
    let error = open_as(&path, "two words", &ManualClock::new("boot-a")).unwrap_err();
    assert!(
        matches!(
            error,
            SqliteStoreError::Clock(ClockError::MachineIdMalformed { .. })
        ),
        "{error}"
    );
    assert!(!path.exists(), "a refused option creates no file");
}

/// Whether `change` resolves within `within`. Real time: the feed polls the file.
async fn resolves(change: vvm_runtime::SlotChange, within: Duration) -> bool {
    tokio::time::timeout(within, change).await.is_ok()
}

// covers: St.ChangeFeed
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_change_feed_sees_writes_of_another_connection_and_its_own() {
    // Generous: the feed looks every 5 ms, a loaded machine may delay that a lot.
    let wake = Duration::from_secs(5);
    let quiet = Duration::from_millis(200);
    let dir = ScratchDir::new("vvm-sqlite-feed");
    let path = dir.file("leases.sqlite");
    let clock = ManualClock::new("feed-boot");
    let waiter = open_with(&path, &clock);
    let writer = open_with(&path, &clock);
    let (a, b) = (value(1), value(2));
    let ttl = Duration::from_secs(10);

    // Nothing happens: no wake-up.
    assert!(!resolves(waiter.changed(&[SLOT]), quiet).await);

    // Insert by the other connection.
    let change = waiter.changed(&[SLOT]);
    let mut revision = writer
        .insert_if_not_exists(SLOT, &a, ttl)
        .await
        .unwrap()
        .unwrap();
    assert!(resolves(change, wake).await);

    // Another slot changes: a waiter of SLOT sleeps on, one of both wakes.
    let one = waiter.changed(&[SLOT]);
    let both = waiter.changed(&[SLOT, Slot(6)]);
    writer
        .insert_if_not_exists(Slot(6), &b, ttl)
        .await
        .unwrap()
        .unwrap();
    assert!(resolves(both, wake).await);
    assert!(!resolves(one, quiet).await);

    // A renewal (compare-and-swap by the same holder) through the waiter's own store wakes
    // nobody: a waiter would only be refused again.
    // covers: St.FeedIgnoresRenewals
    let change = waiter.changed(&[SLOT]);
    let held = Lease {
        value: a.clone(),
        revision,
    };
    revision = waiter
        .compare_and_swap(SLOT, &held, &a, ttl)
        .await
        .unwrap()
        .unwrap();
    assert!(!resolves(change, quiet).await);

    // A swap to another holder through the waiter's own store (its feed has a connection of
    // its own) wakes it; so does the swap back.
    for (from, to) in [(&a, &b), (&b, &a)] {
        let change = waiter.changed(&[SLOT]);
        let held = Lease {
            value: from.clone(),
            revision,
        };
        revision = waiter
            .compare_and_swap(SLOT, &held, to, ttl)
            .await
            .unwrap()
            .unwrap();
        assert!(resolves(change, wake).await);
    }

    // A refused insert writes nothing and wakes nobody.
    let change = waiter.changed(&[SLOT]);
    assert_eq!(writer.insert_if_not_exists(SLOT, &b, ttl).await, Ok(None));
    assert!(!resolves(change, quiet).await);

    // Compare-and-delete by the other connection.
    let change = waiter.changed(&[SLOT]);
    let held = Lease {
        value: a.clone(),
        revision,
    };
    assert_eq!(writer.compare_and_delete(SLOT, &held).await, Ok(true));
    assert!(resolves(change, wake).await);

    // Expiry: nothing is written when a record expires, so the feed cannot see the instant
    // (the waiter's own timer covers it); the insert that takes the expired slot wakes it.
    writer.insert_if_not_exists(SLOT, &a, ttl).await.unwrap();
    let change = waiter.changed(&[SLOT]);
    clock.advance(ttl);
    assert_eq!(writer.get(SLOT).await, Ok(None));
    let change = tokio::spawn(change);
    tokio::time::sleep(quiet).await;
    assert!(!change.is_finished());
    assert!(writer
        .insert_if_not_exists(SLOT, &b, ttl)
        .await
        .unwrap()
        .is_some());
    assert!(tokio::time::timeout(wake, change).await.is_ok());
}

// ---------------------------------------------------------------------------------------------
// Sessions (`SessionStore`): schema version 4, holdings judged by their session, the feed.

fn session(n: u64) -> SessionKey {
    SessionKey {
        incarnation: Incarnation(n),
        id: SessionId(1),
    }
}

/// Every row of `vvm_leases` as SQLite stores it, in slot order.
fn lease_rows(path: &Path) -> Vec<Vec<rusqlite::types::Value>> {
    let conn = raw(path);
    let mut statement = conn
        .prepare("SELECT * FROM vvm_leases ORDER BY slot")
        .unwrap();
    let columns = statement.column_count();
    statement
        .query_map([], |row| {
            (0..columns)
                .map(|index| row.get::<_, rusqlite::types::Value>(index))
                .collect()
        })
        .unwrap()
        .collect::<Result<_, _>>()
        .unwrap()
}

/// Counts from now on every row of `vvm_leases` that any connection inserts, updates or
/// deletes (triggers in the file); the closure reads the count.
fn count_lease_writes(path: &Path) -> impl Fn() -> i64 {
    raw(path)
        .execute_batch(
            "CREATE TABLE test_writes (n INTEGER NOT NULL);
             INSERT INTO test_writes VALUES (0);
             CREATE TRIGGER test_insert AFTER INSERT ON vvm_leases
                 BEGIN UPDATE test_writes SET n = n + 1; END;
             CREATE TRIGGER test_update AFTER UPDATE ON vvm_leases
                 BEGIN UPDATE test_writes SET n = n + 1; END;
             CREATE TRIGGER test_delete AFTER DELETE ON vvm_leases
                 BEGIN UPDATE test_writes SET n = n + 1; END;",
        )
        .unwrap();
    let path = path.to_owned();
    move || {
        raw(&path)
            .query_row("SELECT n FROM test_writes", [], |r| r.get(0))
            .unwrap()
    }
}

/// Version 3 of the schema, as the previous build created it (no sessions).
const SCHEMA_V3: &str = "
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
    lock_ino INTEGER
) STRICT;
INSERT INTO vvm_store (id, revision, boot_id, machine_id) VALUES (0, 8, 'boot-a', 'machine-a');
";

/// A file of schema version 3 with a live record of slot 5 naming a lock file and an expired
/// one of slot 6 (revisions 7 and 8).
fn version_3_file(path: &Path) {
    let conn = raw(path);
    conn.execute_batch(SCHEMA_V3).unwrap();
    conn.execute(
        "INSERT INTO vvm_leases VALUES (5, ?1, 7, 'boot-a', ?2, 11, 12)",
        (value(1).encode().into_bytes(), i64::MAX),
    )
    .unwrap();
    conn.execute(
        "INSERT INTO vvm_leases VALUES (6, ?1, 8, 'boot-a', 0, NULL, NULL)",
        [value(2).encode().into_bytes()],
    )
    .unwrap();
    conn.pragma_update(None, "application_id", APPLICATION_ID)
        .unwrap();
    conn.pragma_update(None, "user_version", 3).unwrap();
    conn.execute_batch("PRAGMA journal_mode = WAL").unwrap();
}

// covers: Sq.SessionsSchema, Sq.Identity
/// A file of schema version 3 is migrated in place to version 4: its records keep their value,
/// revision, expiry and lock file, stay slot records, and sessions work on it at once (the
/// counter goes on). Before that, a read-only store refuses it as older, and another machine's
/// open refuses it and leaves it unchanged.
#[tokio::test]
async fn a_version_3_file_is_migrated_keeping_its_records_and_gains_sessions() {
    let dir = ScratchDir::new("vvm-sqlite-v3");
    let path = dir.file("leases.sqlite");
    version_3_file(&path);
    let clock = ManualClock::new("boot-a");

    let refused = SqliteStore::builder()
        .clock(clock.clone())
        .machine_id("machine-a")
        .read_only()
        .open(&path)
        .unwrap_err();
    assert!(
        matches!(refused, SqliteStoreError::OlderSchema { found: 3, supported } if supported == SCHEMA_VERSION),
        "{refused}"
    );
    let before = file_and_log(&path);
    let refused = open_as(&path, "machine-b", &ManualClock::new("boot-b")).unwrap_err();
    assert_other_machine(&refused, "machine-a", "machine-b");
    assert!(
        file_and_log(&path) == before,
        "another machine migrated the file"
    );

    let store = open_as(&path, "machine-a", &clock).unwrap();
    assert_eq!(
        store.get(SLOT).await.unwrap(),
        Some(Lease {
            value: value(1),
            revision: Revision(7)
        })
    );
    assert_eq!(store.get(Slot(6)).await.unwrap(), None, "still expired");
    assert!(store.time_left(SLOT).await.unwrap().is_some());
    let opened = store
        .create_session(session(1), &value(3), LONG_TTL)
        .await
        .unwrap()
        .expect("created");
    assert_eq!(opened, Revision(9), "the counter goes on");
    assert_eq!(
        store.acquire(Slot(6), session(1)).await.unwrap(),
        Acquired::Written(Revision(10))
    );
    assert_eq!(
        store.acquire(SLOT, session(1)).await.unwrap(),
        Acquired::Held,
        "the old live record holds its slot"
    );
    drop(store);

    let conn = raw(&path);
    let user_version: i32 = conn
        .query_row("PRAGMA user_version", [], |r| r.get(0))
        .unwrap();
    assert_eq!(user_version, SCHEMA_VERSION);
    assert_eq!(SCHEMA_VERSION, 8);
    let objects: Vec<String> = conn
        .prepare("SELECT name FROM sqlite_schema WHERE name LIKE 'vvm_%' ORDER BY name")
        .unwrap()
        .query_map([], |r| r.get(0))
        .unwrap()
        .collect::<Result<_, _>>()
        .unwrap();
    assert_eq!(
        objects,
        [
            "vvm_leases",
            "vvm_leases_session",
            "vvm_semaphore_parties",
            "vvm_semaphores",
            "vvm_sessions",
            "vvm_store",
            "vvm_tenures"
        ]
    );
    let old: (i64, i64, Option<i64>, Option<i64>, Option<i64>, Option<i64>) = conn
        .query_row(
            "SELECT revision, expires_ns, lock_dev, lock_ino, session_incarnation, session_id \
             FROM vvm_leases WHERE slot = 5",
            [],
            |r| {
                Ok((
                    r.get(0)?,
                    r.get(1)?,
                    r.get(2)?,
                    r.get(3)?,
                    r.get(4)?,
                    r.get(5)?,
                ))
            },
        )
        .unwrap();
    assert_eq!(old, (7, i64::MAX, Some(11), Some(12), None, None));
}

// covers: Sq.Sessions
/// Every operation on a slot sees a holding exactly while its session is live, with the
/// session's time left: reads, inserts (refused with that time left), swaps and deletes with
/// the holding's lease. A keepalive extends every holding without writing any of their rows.
/// Once the session expired, its holdings are absent for every reader with their rows still in
/// the table (no sweep is needed), and an insert takes the slot.
#[tokio::test]
async fn a_holding_lives_exactly_as_long_as_its_session_for_every_operation() {
    let dir = ScratchDir::new("vvm-sqlite-holding");
    let path = dir.file("leases.sqlite");
    let clock = ManualClock::new("boot-a");
    let holder = open_with(&path, &clock);
    let other = open_with(&path, &clock);
    let ttl = Duration::from_secs(10);
    let opened = holder
        .create_session(session(1), &value(1), ttl)
        .await
        .unwrap()
        .unwrap();
    let mut held = Vec::new();
    for slot in [Slot(1), Slot(2), Slot(3)] {
        let Acquired::Written(revision) = holder.acquire(slot, session(1)).await.unwrap() else {
            panic!("{slot:?} is free");
        };
        held.push(Lease {
            value: value(1),
            revision,
        });
    }
    let live = |left: Duration| Inserted::Held { left: Some(left) };

    assert_eq!(other.get(Slot(1)).await.unwrap(), Some(held[0].clone()));
    assert_eq!(other.time_left(Slot(1)).await.unwrap(), Some(ttl));
    assert_eq!(
        other
            .insert_or_time_left(Slot(1), &value(2), LONG_TTL)
            .await
            .unwrap(),
        live(ttl)
    );

    clock.advance(Duration::from_secs(8));
    let rows = lease_rows(&path);
    let writes = count_lease_writes(&path);
    assert_eq!(
        holder.keep_alive(session(1), opened, ttl).await.unwrap(),
        Some(opened)
    );
    assert_eq!(writes(), 0, "a keepalive wrote a holding");
    assert!(lease_rows(&path) == rows, "a keepalive changed a holding");
    clock.advance(Duration::from_secs(8));
    assert_eq!(other.get(Slot(3)).await.unwrap(), Some(held[2].clone()));
    assert_eq!(
        other.time_left(Slot(2)).await.unwrap(),
        Some(Duration::from_secs(2))
    );
    assert_eq!(
        other
            .insert_or_time_left(Slot(2), &value(2), LONG_TTL)
            .await
            .unwrap(),
        live(Duration::from_secs(2))
    );

    clock.advance(Duration::from_secs(2));
    for (slot, lease) in [Slot(1), Slot(2), Slot(3)].into_iter().zip(&held) {
        assert_eq!(other.get(slot).await.unwrap(), None, "{slot:?}");
        assert_eq!(other.time_left(slot).await.unwrap(), None, "{slot:?}");
        assert_eq!(
            other
                .compare_and_swap(slot, lease, &value(1), LONG_TTL)
                .await
                .unwrap(),
            None
        );
        assert!(!other.compare_and_delete(slot, lease).await.unwrap());
    }
    assert_eq!(
        lease_rows(&path).len(),
        3,
        "dead holdings need no sweep to be absent"
    );
    assert_eq!(
        holder.keep_alive(session(1), opened, ttl).await.unwrap(),
        None
    );
    assert_eq!(
        holder.acquire(Slot(4), session(1)).await.unwrap(),
        Acquired::SessionGone
    );
    let taken = other
        .insert_if_not_exists(Slot(1), &value(2), LONG_TTL)
        .await
        .unwrap()
        .expect("the dead holding's slot is free");
    assert!(writes() >= 1, "the write counter counts");
    assert!(taken > held[2].revision);
    assert_eq!(
        other.get(Slot(1)).await.unwrap(),
        Some(Lease {
            value: value(2),
            revision: taken
        })
    );
}

// covers: Sq.Sessions
/// A session created again under the key of a dead one starts without holdings: the dead
/// session's holdings never live again with it.
#[tokio::test]
async fn a_dead_sessions_holdings_never_come_back_with_a_new_session_of_its_key() {
    let dir = ScratchDir::new("vvm-sqlite-recreate");
    let path = dir.file("leases.sqlite");
    let clock = ManualClock::new("boot-a");
    let store = open_with(&path, &clock);
    let ttl = Duration::from_secs(10);
    store
        .create_session(session(1), &value(1), ttl)
        .await
        .unwrap()
        .unwrap();
    let Acquired::Written(first) = store.acquire(Slot(1), session(1)).await.unwrap() else {
        panic!("the slot is free");
    };
    clock.advance(ttl);
    assert!(store
        .create_session(session(1), &value(1), ttl)
        .await
        .unwrap()
        .is_some());
    assert_eq!(store.get(Slot(1)).await.unwrap(), None);
    let Acquired::Written(second) = store.acquire(Slot(1), session(1)).await.unwrap() else {
        panic!("the slot is free");
    };
    assert!(second > first);
}

// covers: Sq.Sessions
/// Ending a session costs O(its holdings): the statements that end it and the one that reads a
/// slot with its session use indexes, never a scan of every record.
#[tokio::test]
async fn ending_a_session_and_judging_a_holding_use_indexes() {
    let dir = ScratchDir::new("vvm-sqlite-plans");
    let path = dir.file("leases.sqlite");
    drop(open_with(&path, &ManualClock::new("boot-a")));
    let conn = raw(&path);
    let plan = |sql: &str| -> String {
        let mut statement = conn.prepare(&format!("EXPLAIN QUERY PLAN {sql}")).unwrap();
        let details: Vec<String> = statement
            .query_map([], |r| r.get::<_, String>(3))
            .unwrap()
            .collect::<Result<_, _>>()
            .unwrap();
        details.join("; ")
    };
    let holdings = plan("DELETE FROM vvm_leases WHERE session_incarnation = 1 AND session_id = 2");
    assert!(
        holdings.contains("USING COVERING INDEX vvm_leases_session")
            || holdings.contains("USING INDEX vvm_leases_session"),
        "{holdings}"
    );
    let session = plan("DELETE FROM vvm_sessions WHERE incarnation = 1 AND id = 2");
    assert!(session.contains("USING PRIMARY KEY"), "{session}");
    let load = plan(
        "SELECT l.value, s.expires_ns FROM vvm_leases AS l LEFT JOIN vvm_sessions AS s \
         ON s.incarnation = l.session_incarnation AND s.id = l.session_id WHERE l.slot = 1",
    );
    assert!(!load.contains("SCAN"), "{load}");
    assert!(load.contains("USING PRIMARY KEY"), "{load}");
}

// covers: Sq.Sessions, Sq.Corrupt
/// A live session row that cannot be read is reported, never acquired for, kept alive or
/// deleted, and ends at its expiry.
#[tokio::test]
async fn a_corrupt_session_record_is_reported_and_kept_until_it_expires() {
    let dir = ScratchDir::new("vvm-sqlite-corrupt-session");
    let path = dir.file("leases.sqlite");
    let clock = ManualClock::new("boot-a");
    let store = open_with(&path, &clock);
    raw(&path)
        .execute(
            "INSERT INTO vvm_sessions (incarnation, id, value, revision, boot_id, expires_ns) VALUES (1, 1, ?1, 7, 'boot-a', ?2)",
            (b"\xff not a lease".as_slice(), clock.ns() + 10_000_000_000),
        )
        .unwrap();
    let corrupt = |error: StoreError| {
        matches!(
            error.find::<SqliteStoreError>(),
            Some(SqliteStoreError::CorruptSession { session: key, .. }) if *key == session(1)
        )
    };
    assert!(corrupt(store.get_session(session(1)).await.unwrap_err()));
    assert!(corrupt(
        store.acquire(Slot(1), session(1)).await.unwrap_err()
    ));
    assert_eq!(store.get(Slot(1)).await.unwrap(), None, "nothing acquired");
    assert_eq!(
        store.keep_alive(session(1), Revision(7), LONG_TTL).await,
        Ok(None)
    );
    assert_eq!(
        store.delete_session(session(1), Revision(7)).await,
        Ok(false)
    );
    assert_eq!(
        store.create_session(session(1), &value(1), LONG_TTL).await,
        Ok(None)
    );
    clock.advance(Duration::from_secs(10));
    assert_eq!(store.get_session(session(1)).await, Ok(None));
    assert!(store
        .create_session(session(1), &value(1), LONG_TTL)
        .await
        .unwrap()
        .is_some());
}

// covers: Sq.SessionsFeed
/// A waiter on the slots of a session's holdings is woken when the session is deleted (its
/// holdings with it, in one transaction), and when an expired session's holdings are removed
/// by a later create; a keepalive, which writes no holding, wakes nobody.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ending_a_session_wakes_the_waiters_of_its_holdings_and_a_keepalive_does_not() {
    let wake = Duration::from_secs(5);
    let quiet = Duration::from_millis(200);
    let dir = ScratchDir::new("vvm-sqlite-session-feed");
    let path = dir.file("leases.sqlite");
    let clock = ManualClock::new("feed-boot");
    let holder = open_with(&path, &clock);
    let waiter = open_with(&path, &clock);
    let ttl = Duration::from_secs(10);
    let opened = holder
        .create_session(session(1), &value(1), ttl)
        .await
        .unwrap()
        .unwrap();
    for slot in [Slot(1), Slot(2)] {
        assert!(matches!(
            holder.acquire(slot, session(1)).await.unwrap(),
            Acquired::Written(_)
        ));
    }

    let change = waiter.changed(&[Slot(2)]);
    assert!(holder
        .keep_alive(session(1), opened, ttl)
        .await
        .unwrap()
        .is_some());
    assert!(!resolves(change, quiet).await, "a keepalive woke a waiter");

    let change = waiter.changed(&[Slot(2)]);
    assert!(holder.delete_session(session(1), opened).await.unwrap());
    assert!(resolves(change, wake).await, "the delete woke nobody");

    // Expired: nothing is written at that instant (the waiter's own timer covers it, as for an
    // expired slot record); the create that sweeps the dead session wakes the waiter.
    holder
        .create_session(session(2), &value(2), ttl)
        .await
        .unwrap()
        .unwrap();
    assert!(matches!(
        holder.acquire(Slot(1), session(2)).await.unwrap(),
        Acquired::Written(_)
    ));
    let change = waiter.changed(&[Slot(1)]);
    clock.advance(ttl);
    let change = tokio::spawn(change);
    tokio::time::sleep(quiet).await;
    assert!(!change.is_finished());
    holder
        .create_session(session(3), &value(3), ttl)
        .await
        .unwrap()
        .unwrap();
    assert!(tokio::time::timeout(wake, change).await.is_ok());
    assert!(
        lease_rows(&path).is_empty(),
        "the sweep removed the holding"
    );
}

/// Set in the child process of [`a_killed_session_holders_holdings_and_units_are_taken_at_once`]:
/// the path of the store.
const SESSION_CHILD_ENV: &str = "VVM_TEST_SQLITE_SESSION_CHILD";
/// The TTL of the child's session: far longer than the test waits, so that only its lock can
/// end it early.
const CHILD_SESSION_TTL: Duration = Duration::from_secs(60);
/// The holdings of the child's session (100 000 are measured in release, BENCHMARKS.md).
const CHILD_HOLDINGS: u32 = 2_000;

/// The child: opens a session, acquires slots 1 to [`CHILD_HOLDINGS`] and 2 units of the
/// semaphore `units`, says so, and keeps the session alive every 200 ms until it is killed.
fn session_child(path: &str) -> ! {
    use vvm_core::semaphore::SemaphoreName;
    use vvm_runtime::{SemaphoreRequest, SemaphoreStore};
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        let store = SqliteStore::open(path).unwrap();
        let opened = store
            .create_session(session(1), &value(1), CHILD_SESSION_TTL)
            .await
            .unwrap()
            .unwrap();
        for slot in 1..=CHILD_HOLDINGS {
            assert!(matches!(
                store.acquire(Slot(slot), session(1)).await.unwrap(),
                Acquired::Written(_)
            ));
        }
        let units = SemaphoreName::new("units").unwrap();
        let create = SemaphoreRequest::Create {
            limit: 2,
            data: Vec::new(),
        };
        store.semaphore(session(1), &units, create).await.unwrap();
        let acquire = SemaphoreRequest::Acquire {
            request: vvm_runtime::next_request_id(),
            count: 2,
            data: Vec::new(),
            timeout_ms: 60_000,
            ephemeral: false,
        };
        store.semaphore(session(1), &units, acquire).await.unwrap();
        println!("session-child acquired");
        loop {
            tokio::time::sleep(Duration::from_millis(200)).await;
            let kept = store
                .keep_alive(session(1), opened, CHILD_SESSION_TTL)
                .await;
            assert_eq!(kept, Ok(Some(opened)));
        }
    })
}

// covers: Sq.SessionLock, Sq.Sessions
/// Real processes on the boot clock: another process holds [`CHILD_HOLDINGS`] slots and two
/// semaphore units on one session (a TTL of a minute). While it lives, its session's lock keeps
/// everything held (an insert is refused with the session's time left). Once it is SIGKILLed,
/// the kernel frees its lock: the next insert ends the session at once — its row, every holding
/// and its semaphore parties in that one transaction — takes the slot, and removes the lock file.
#[test]
fn a_killed_session_holders_holdings_and_units_are_taken_at_once() {
    use std::io::BufRead;
    if let Some(path) = std::env::var_os(SESSION_CHILD_ENV) {
        session_child(&path.to_string_lossy());
    }
    let dir = ScratchDir::new("vvm-sqlite-session-kill");
    let path = dir.file("leases.sqlite");
    drop(SqliteStore::open(&path).unwrap());
    let mut child = std::process::Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "a_killed_session_holders_holdings_and_units_are_taken_at_once",
        ])
        .args(["--nocapture", "--test-threads", "1"])
        .env(SESSION_CHILD_ENV, &path)
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let mut lines = std::io::BufReader::new(child.stdout.take().unwrap()).lines();
    let acquired = lines.any(|line| line.is_ok_and(|line| line.contains("session-child acquired")));
    assert!(acquired, "the child acquired its slots");
    let count = |sql: &str| -> i64 { raw(&path).query_row(sql, [], |row| row.get(0)).unwrap() };
    let lock_files = || {
        std::fs::read_dir(path.parent().unwrap())
            .unwrap()
            .filter(|entry| {
                let name = entry.as_ref().unwrap().file_name();
                name.to_string_lossy().contains(".session-")
            })
            .count()
    };
    assert_eq!(
        lock_files(),
        1,
        "one lock file for the session, none per holding"
    );

    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        let store = SqliteStore::open(&path).unwrap();
        let holding = store
            .get(Slot(1))
            .await
            .unwrap()
            .expect("held by the child");
        assert_eq!(holding.value, value(1));
        // Alive: its lock is held, and the holding is refused with the session's time left.
        let refused = store
            .insert_or_time_left(Slot(1), &value(2), LONG_TTL)
            .await
            .unwrap();
        assert!(
            matches!(refused, Inserted::Held { left: Some(left) } if left <= CHILD_SESSION_TTL),
            "a live session's holding was taken: {refused:?}"
        );

        child.kill().unwrap();
        child.wait().unwrap();
        let killed = std::time::Instant::now();
        let taken = store
            .insert_or_time_left(Slot(1), &value(2), LONG_TTL)
            .await
            .unwrap();
        let Inserted::Written(revision) = taken else {
            panic!("a dead session's holding was not taken at once: {taken:?}");
        };
        let waited = killed.elapsed();
        assert!(revision > holding.revision);
        // Everything of the session went in that one transaction.
        assert_eq!(
            count("SELECT count(*) FROM vvm_leases WHERE session_incarnation IS NOT NULL"),
            0,
            "every holding ended with the session"
        );
        assert_eq!(count("SELECT count(*) FROM vvm_sessions"), 0);
        assert_eq!(count("SELECT count(*) FROM vvm_semaphore_parties"), 0);
        assert_eq!(store.get(Slot(CHILD_HOLDINGS)).await.unwrap(), None);
        assert_eq!(lock_files(), 0, "the dead session's lock file is removed");
        eprintln!(
            "a killed session's {CHILD_HOLDINGS} holdings were taken {waited:?} after the kill"
        );
    });
}

// covers: Sq.SessionLock
/// A session's lock file is judged as a slot's: a FIFO, a symbolic link or another user's file
/// at its path refuses the session's creation with a typed error (never a wait in `open`, which
/// a FIFO would block forever), writing nothing; a file of this user's, made before, is used.
#[tokio::test]
async fn an_untrusted_session_lock_file_refuses_the_session_and_never_hangs() {
    use std::os::unix::fs::{symlink, FileTypeExt, MetadataExt, PermissionsExt};
    use vvm_adapters::sqlite::Untrusted;
    let dir = ScratchDir::new("vvm-sqlite-session-lock-file");
    let path = dir.file("leases.sqlite");
    let store = SqliteStore::open(&path).unwrap();
    let lock_path = |n: u64| {
        let mut name = path.as_os_str().to_owned();
        name.push(format!(".session-{n}-1.lock"));
        std::path::PathBuf::from(name)
    };
    let fifo = lock_path(1);
    let made = std::process::Command::new("mkfifo")
        .args(["-m", "600"])
        .arg(&fifo)
        .status()
        .unwrap();
    assert!(made.success());
    let elsewhere = dir.file("elsewhere");
    std::fs::write(&elsewhere, b"").unwrap();
    std::fs::set_permissions(&elsewhere, std::fs::Permissions::from_mode(0o600)).unwrap();
    symlink(&elsewhere, lock_path(2)).unwrap();
    let foreign = lock_path(3);
    std::fs::write(&foreign, b"").unwrap();
    std::fs::set_permissions(&foreign, std::fs::Permissions::from_mode(0o600)).unwrap();
    // Another user's: as root, given away; as anyone else, refused as not ours already.
    let is_root = std::fs::metadata(&foreign).unwrap().uid() == 0;
    if is_root {
        std::os::unix::fs::chown(&foreign, Some(65_534), None).unwrap();
    }
    for (n, expected) in [
        (1, Untrusted::NotAFile),
        (2, Untrusted::Symlink),
        (
            3,
            Untrusted::OtherOwner {
                owner: 65_534,
                user: 0,
            },
        ),
    ] {
        if n == 3 && !is_root {
            continue;
        }
        let created = tokio::time::timeout(
            Duration::from_secs(10),
            store.create_session(session(n), &value(n), LONG_TTL),
        )
        .await
        .expect("never hangs on the lock file");
        let Err(StoreError::Failed { source }) = created else {
            panic!("session {n} created over an untrusted lock file: {created:?}");
        };
        match source.downcast_ref::<SqliteStoreError>() {
            Some(SqliteStoreError::Untrusted { path, why }) => {
                assert_eq!(path, &lock_path(n));
                assert_eq!(why, &expected, "session {n}");
            }
            other => panic!("session {n}: {other:?}"),
        }
        assert_eq!(store.get_session(session(n)).await.unwrap(), None);
    }
    assert!(std::fs::symlink_metadata(&fifo)
        .unwrap()
        .file_type()
        .is_fifo());
    // This user's own file, made before: used, and removed when the session ends.
    let own = lock_path(4);
    std::fs::write(&own, b"").unwrap();
    let opened = store
        .create_session(session(4), &value(4), LONG_TTL)
        .await
        .unwrap()
        .expect("created");
    assert!(store.delete_session(session(4), opened).await.unwrap());
    assert!(!own.exists(), "the ended session's lock file is removed");
}

// covers: Sq.SessionLock, Sq.SessionsSchema
/// A file of schema version 6 (sessions without a lock file) is migrated in place: its live
/// session stays live and names no lock (it ends at its expiry only, as before), and a session
/// created afterwards names its lock.
#[tokio::test]
async fn a_version_6_file_is_migrated_and_its_sessions_name_no_lock() {
    let dir = ScratchDir::new("vvm-sqlite-v6");
    let path = dir.file("leases.sqlite");
    let store = SqliteStore::open(&path).unwrap();
    let old = store
        .create_session(session(1), &value(1), LONG_TTL)
        .await
        .unwrap()
        .expect("created");
    assert!(matches!(
        store.acquire(Slot(1), session(1)).await.unwrap(),
        Acquired::Written(_)
    ));
    drop(store);
    raw(&path)
        .execute_batch(
            "ALTER TABLE vvm_sessions DROP COLUMN lock_dev; \
             ALTER TABLE vvm_sessions DROP COLUMN lock_ino; DROP TABLE vvm_tenures; \
             PRAGMA user_version = 6;",
        )
        .unwrap();

    let store = SqliteStore::open(&path).unwrap();
    let named = |n: u64| -> (Option<i64>, Option<i64>) {
        raw(&path)
            .query_row(
                "SELECT lock_dev, lock_ino FROM vvm_sessions WHERE incarnation = ?1",
                [n as i64],
                |row| Ok((row.get(0)?, row.get(1)?)),
            )
            .unwrap()
    };
    assert_eq!(named(1), (None, None), "a version-6 session names no lock");
    assert_eq!(
        store
            .get_session(session(1))
            .await
            .unwrap()
            .map(|r| r.revision),
        Some(old)
    );
    assert_eq!(
        store.keep_alive(session(1), old, LONG_TTL).await,
        Ok(Some(old))
    );
    store
        .create_session(session(2), &value(2), LONG_TTL)
        .await
        .unwrap()
        .expect("created");
    assert!(
        matches!(named(2), (Some(_), Some(_))),
        "a new session names its lock"
    );
    let user_version: i32 = raw(&path)
        .query_row("PRAGMA user_version", [], |r| r.get(0))
        .unwrap();
    assert_eq!(user_version, SCHEMA_VERSION);
}

/// A holding's row deleted from outside (`DELETE` in the file) while its session lives keeps the
/// slot held — for another session's acquire and for a slot insert — until that session ends:
/// its holder may still act (it learns of the loss by its watch and stops, then ends its
/// session). A holding's own release (a retired row) and its session's end free it at once.
// covers: Sq.HoldingRemoved
#[tokio::test]
async fn a_holding_deleted_from_outside_keeps_its_slot_while_its_session_lives() {
    let dir = ScratchDir::new("vvm-sqlite-holding-removed");
    let path = dir.file("leases.sqlite");
    // Made at version 7 and migrated: its tenures start empty.
    drop(SqliteStore::open(&path).unwrap());
    raw(&path)
        .execute_batch("DROP TABLE vvm_tenures; PRAGMA user_version = 7;")
        .unwrap();
    let (holder, other) = (
        SqliteStore::open(&path).unwrap(),
        SqliteStore::open(&path).unwrap(),
    );
    let mut revision = holder
        .create_session(session(1), &value(1), LONG_TTL)
        .await
        .unwrap()
        .expect("created");
    other
        .create_session(session(2), &value(2), LONG_TTL)
        .await
        .unwrap()
        .expect("created");
    for slot in [SLOT, Slot(6)] {
        assert!(matches!(
            holder.acquire(slot, session(1)).await.unwrap(),
            Acquired::Written(_)
        ));
    }
    let deleted = raw(&path)
        .execute("DELETE FROM vvm_leases WHERE slot = 5", [])
        .unwrap();
    assert_eq!(deleted, 1);
    assert_eq!(
        other.acquire(SLOT, session(2)).await.unwrap(),
        Acquired::Held,
        "its holder's session lives"
    );
    assert!(matches!(
        other
            .insert_or_time_left(SLOT, &value(3), LONG_TTL)
            .await
            .unwrap(),
        Inserted::Held { .. }
    ));
    // Slot 6, released by its holder, is free at once.
    let six = holder.get(Slot(6)).await.unwrap().expect("held");
    assert!(holder.compare_and_delete(Slot(6), &six).await.unwrap());
    assert!(matches!(
        other.acquire(Slot(6), session(2)).await.unwrap(),
        Acquired::Written(_)
    ));
    // The holder's session ends: the removed holding's slot is free.
    revision = holder
        .keep_alive(session(1), revision, LONG_TTL)
        .await
        .unwrap()
        .expect("alive");
    assert!(holder.delete_session(session(1), revision).await.unwrap());
    assert!(matches!(
        other.acquire(SLOT, session(2)).await.unwrap(),
        Acquired::Written(_)
    ));
}
