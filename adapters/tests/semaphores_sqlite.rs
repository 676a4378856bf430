//! Semaphores on SQLite beyond the conformance suite: two OS processes contending for one
//! semaphore (this test binary started again as the second process), the migrations of
//! version-4 and version-5 files, and the parties' index that ends a closed session's parties.

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use vvm_adapters::SqliteStore;
use vvm_conformance::{value, ScratchDir};
use vvm_core::LeaseConfig;
use vvm_runtime::{AcquireOptions, Coordination, KillerThread, RecordingKiller, SessionHandle};

/// Names the database of the second process; set only for it.
const CHILD_DB: &str = "VVM_SEMAPHORE_CHILD_DB";

async fn coordination(path: &Path, n: u64) -> Coordination<SqliteStore> {
    let store = SqliteStore::builder()
        .busy_wait(Duration::from_secs(2))
        .open(path)
        .expect("the store opens");
    let killer = KillerThread::new(RecordingKiller::new());
    let lease = LeaseConfig::new(Duration::from_secs(20)).expect("a valid lease");
    let session = SessionHandle::open(store, lease, value(n), &killer)
        .await
        .expect("the session opens");
    Coordination::new(session)
}

/// The second process: waits for the lock, reports its grant, releases it. Does nothing when
/// run as an ordinary test.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn child_waits_for_the_lock() {
    let Some(path) = std::env::var_os(CHILD_DB) else {
        return;
    };
    let coordination = coordination(Path::new(&path), 2).await;
    let options = AcquireOptions::new(1)
        .data(b"child".to_vec())
        .timeout(Duration::from_secs(30));
    let grant = coordination
        .acquire("lock", options)
        .await
        .expect("the acquire runs")
        .expect("granted before the timeout");
    println!("GRANTED token={}", grant.token());
    assert!(grant.release().await.expect("released"));
    assert!(coordination.session().close().await.expect("closed"));
}

/// Two processes contend: the parent holds the lock, the child queues behind it (seen in the
/// parent's describe), and is granted when the parent releases, with a higher token.
// covers: Sem.Store.Processes, Sem.Store.Wait
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiter_in_another_process_is_granted_on_release() {
    let dir = ScratchDir::new("vvm-semaphores-processes");
    let path = dir.file("store.sqlite");
    let parent = coordination(&path, 1).await;
    parent.create("lock", 1, Vec::new()).await.expect("created");
    let grant = parent
        .acquire("lock", AcquireOptions::new(1).data(b"parent".to_vec()))
        .await
        .expect("runs")
        .expect("free");
    let child = Command::new(std::env::current_exe().expect("the test binary"))
        .args([
            "child_waits_for_the_lock",
            "--exact",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(CHILD_DB, &path)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("the second process starts");
    let started = Instant::now();
    loop {
        let description = parent.describe("lock").await.expect("described");
        if description.waiters.len() == 1 {
            assert_eq!(description.waiters[0].data, b"child");
            break;
        }
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "the child never queued"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let first = grant.token();
    assert!(grant.release().await.expect("released"));
    let output = tokio::task::spawn_blocking(move || child.wait_with_output())
        .await
        .expect("joined")
        .expect("the child ran");
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let token: vvm_core::FencingToken = stdout
        .lines()
        .find_map(|line| line.split_once("GRANTED token=").map(|(_, token)| token))
        .unwrap_or_else(|| panic!("the child was not granted: {stdout}"))
        .trim()
        .parse()
        .expect("a token");
    assert_eq!(token.slot, first.slot, "{token} after {first}");
    assert!(token > first, "{token} after {first}");
}

/// A version-4 file (sessions, no semaphores) is migrated in place: its session table stays,
/// the semaphores table is added, and semaphores work at once.
// covers: Sem.Store.Schema
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_version_4_file_is_migrated_and_gains_semaphores() {
    let dir = ScratchDir::new("vvm-semaphores-v4");
    let path = dir.file("store.sqlite");
    drop(SqliteStore::open(&path).expect("created"));
    {
        let conn = rusqlite::Connection::open(&path).expect("opens");
        conn.execute_batch(
            "DROP TABLE vvm_semaphore_parties; DROP TABLE vvm_semaphores; \
             ALTER TABLE vvm_sessions DROP COLUMN lock_dev; \
             ALTER TABLE vvm_sessions DROP COLUMN lock_ino; DROP TABLE vvm_tenures; \
             PRAGMA user_version = 4;",
        )
        .expect("made a version-4 file");
    }
    let parent = coordination(&path, 1).await;
    parent
        .create("config", 1, b"v1".to_vec())
        .await
        .expect("created");
    assert_eq!(parent.describe("config").await.expect("read").data, b"v1");
    let conn = rusqlite::Connection::open(&path).expect("opens");
    let version: i32 = conn
        .query_row("PRAGMA user_version", [], |row| row.get(0))
        .expect("read");
    assert_eq!(version, vvm_adapters::sqlite::SCHEMA_VERSION);
    conn.pragma_update(None, "user_version", version + 1)
        .expect("made a newer file");
    drop(conn);
    let refused = SqliteStore::open(&path).expect_err("a newer file is refused");
    assert!(
        matches!(refused, vvm_adapters::SqliteStoreError::NewerSchema { found, .. } if found == version + 1),
        "{refused}"
    );
}

fn indexed(path: &Path) -> i64 {
    let conn = rusqlite::Connection::open(path).expect("opens");
    conn.query_row("SELECT count(*) FROM vvm_semaphore_parties", [], |row| {
        row.get(0)
    })
    .expect("the index is there")
}

/// A version-5 file (semaphores, no index of their parties) is migrated in place: the index is
/// filled from the stored states, and deleting a session then removes its parties in the same
/// transaction (the waiter behind it is the owner at once), through the index.
// covers: Sem.Store.Schema, Sem.Store.PartyIndex
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_version_5_file_is_migrated_and_its_parties_indexed() {
    use vvm_core::semaphore::SemaphoreName;
    use vvm_core::{Incarnation, SessionId, SessionKey};
    use vvm_runtime::{SemaphoreRequest, SemaphoreStore, SessionStore};
    let key = |n: u64| SessionKey {
        incarnation: Incarnation(n),
        id: SessionId(1),
    };
    let acquire = SemaphoreRequest::Acquire {
        request: vvm_runtime::next_request_id(),
        count: 1,
        data: Vec::new(),
        timeout_ms: 60_000,
        ephemeral: false,
    };
    let ttl = Duration::from_secs(3600);
    let dir = ScratchDir::new("vvm-semaphores-v5");
    let path = dir.file("store.sqlite");
    let store = SqliteStore::open(&path).expect("created");
    let mut revisions = Vec::new();
    for n in 1..=2 {
        let created = store.create_session(key(n), &value(n), ttl).await;
        revisions.push(created.expect("runs").expect("created"));
    }
    let lock = SemaphoreName::new("lock").expect("a name");
    let create = |limit| SemaphoreRequest::Create {
        limit,
        data: Vec::new(),
    };
    store
        .semaphore(key(1), &lock, create(1))
        .await
        .expect("created");
    for n in 0..20 {
        // Semaphores the deleted session has no part in.
        let other = SemaphoreName::new(&format!("other-{n}")).expect("a name");
        store
            .semaphore(key(2), &other, create(1))
            .await
            .expect("created");
    }
    store
        .semaphore(key(1), &lock, acquire.clone())
        .await
        .expect("owner");
    store
        .semaphore(key(2), &lock, acquire.clone())
        .await
        .expect("waiter");
    assert_eq!(indexed(&path), 2, "every write keeps the index");
    drop(store);
    {
        let conn = rusqlite::Connection::open(&path).expect("opens");
        conn.execute_batch(
            "DROP TABLE vvm_semaphore_parties; ALTER TABLE vvm_sessions DROP COLUMN lock_dev; \
             ALTER TABLE vvm_sessions DROP COLUMN lock_ino; DROP TABLE vvm_tenures; \
             PRAGMA user_version = 5;",
        )
        .expect("made a version-5 file");
    }
    let store = SqliteStore::open(&path).expect("migrated");
    assert_eq!(
        indexed(&path),
        2,
        "the migration indexed the owner and the waiter"
    );
    assert!(store
        .delete_session(key(1), revisions[0])
        .await
        .expect("runs"));
    let described = store
        .semaphore(key(2), &lock, SemaphoreRequest::Describe)
        .await
        .expect("read")
        .description
        .expect("exists");
    assert_eq!(described.owners.len(), 1);
    assert_eq!(
        described.owners[0].session,
        key(2),
        "granted by the deletion"
    );
    assert_eq!(indexed(&path), 1, "the deleted session left the index");
}
