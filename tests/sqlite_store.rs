//! What the SQLite store promises beyond the conformance suite: several connections on one
//! file stay atomic, files that are not ours are refused untouched, reboots expire records and
//! keep revisions increasing, corrupt records are reported and kept, and a held lock fails a
//! call cleanly after a bounded wait.

mod conformance;

use std::collections::HashSet;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use conformance::{value, ScratchDir, LONG_TTL};
use tokio::task::JoinSet;
use vvm::{Lease, LeaseStore, Revision, Slot, StoreError};
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
    assert!(matches!(error, SqliteStoreError::Open { .. }), "{error}");
    assert!(error.to_string().contains("no-such-dir"), "{error}");

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
        matches!(&refused, Err(StoreError::Failed { reason }) if reason.contains("locked")),
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
