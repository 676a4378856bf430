//! What the SQLite store promises beyond the conformance suite: several connections on one
//! file stay atomic, files that are not ours are refused untouched, reboots expire records and
//! keep revisions increasing, corrupt records are reported and kept, a held lock fails a
//! call cleanly after a bounded wait, and a file belongs to one machine.

mod conformance;

use std::collections::HashSet;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use conformance::{value, ScratchDir, LONG_TTL};
use tokio::task::JoinSet;
use vvm::{Inserted, Lease, LeaseStore, Revision, Slot, StoreError};
use vvm_adapters::sqlite::{
    ClockError, StoreClock, APPLICATION_ID, BUSY_WAIT_MAX, REVISION_BOOT_GAP, SCHEMA_VERSION,
};
use vvm_adapters::{SqliteStore, SqliteStoreError};

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

fn raw(path: &Path) -> rusqlite::Connection {
    rusqlite::Connection::open(path).expect("raw connection opens")
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
async fn resolves(change: vvm::SlotChange, within: Duration) -> bool {
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

// covers: Sq.DeadHolder
#[tokio::test]
async fn a_dead_holder_wakes_every_waiter_of_one_store_not_only_the_first() {
    use std::io::BufRead;
    let dir = ScratchDir::new("vvm-sqlite-two-waiters");
    let path = dir.path().join("vvm.sqlite");
    // The holder is another process: a lock is the process's, and only its death frees it.
    let mut holder = std::process::Command::new(env!("CARGO_BIN_EXE_vvm"))
        .args(["--log-level", "warn", "run", "--lease", "20s", "--store"])
        .arg(format!("sqlite:{}", path.display()))
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("the vvm binary runs");
    let mut lines = std::io::BufReader::new(holder.stdout.take().unwrap()).lines();
    let first = lines.next().expect("a line").expect("readable");
    assert!(first.starts_with("leading slot=1 "), "{first}");
    let waiter = SqliteStore::open(&path).expect("the store opens");
    // Two waits on one store (a VVM and the observer that logs who holds the slot, or two VVMs
    // of one process): both begin while the holder lives.
    let first = waiter.changed(&[Slot(1)]);
    let second = waiter.changed(&[Slot(1)]);
    tokio::time::sleep(Duration::from_millis(100)).await;
    // The holder dies: its lock goes, its record stays until the expiry (15 s or more away).
    holder.kill().unwrap();
    holder.wait().unwrap();
    let both = tokio::time::timeout(Duration::from_secs(5), async {
        first.await;
        second.await;
    })
    .await;
    assert!(both.is_ok(), "one of the waits never learnt of the death");
    // A wait begun after is not woken again by the same record (a refused insert would spin).
    let later = tokio::time::timeout(Duration::from_millis(300), waiter.changed(&[Slot(1)])).await;
    assert!(
        later.is_err(),
        "a later wait was woken by the same dead record"
    );
}
