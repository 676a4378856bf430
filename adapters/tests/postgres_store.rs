//! The PostgreSQL store against real servers started by the tests (`vvm_test_support::postgres`):
//! schemas that are refused (foreign, newer, a user without rights), and the store riding out
//! killed connections and a restarted server (the hand-off between two `vvm run` hosts is in the
//! root's tests/url_postgres.rs). Without PostgreSQL installed every test prints
//! one line saying it was skipped (under CI it fails instead).

use vvm_test_support::postgres as postgres_support;

use std::time::{Duration, Instant};

use postgres_support::PgServer;
use rustix::process::Signal;
use vvm_adapters::postgres::{open, open_read_only, PgConfig, PgOpenError, PgStore};
use vvm_adapters::txkv::TxOptions;
use vvm_core::{Incarnation, Slot};
use vvm_runtime::{LeaseStore, LeaseValue};

fn config(server: &PgServer, user: &str, schema: &str) -> PgConfig {
    PgConfig::new("127.0.0.1", server.port(), user, "postgres")
        .and_then(|config| config.schema(schema))
        .expect("the configuration is valid")
}

async fn store(server: &PgServer, schema: &str) -> PgStore {
    open(config(server, "vvm", schema), TxOptions::default())
        .await
        .expect("the store opens")
}

// covers: Pg.Schema
// covers: Pg.Clock
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn foreign_newer_and_forbidden_schemas_are_refused_in_one_line() {
    let Some(server) =
        PgServer::start("foreign_newer_and_forbidden_schemas_are_refused_in_one_line")
    else {
        return;
    };
    server.admin("CREATE SCHEMA theirs; CREATE TABLE theirs.vvm_kv (k int);");
    let refused = open(config(&server, "vvm", "theirs"), TxOptions::default())
        .await
        .unwrap_err();
    assert!(
        matches!(refused, PgOpenError::ForeignSchema { .. }),
        "{refused:?}"
    );
    assert!(refused.to_string().contains("not a vvm store"), "{refused}");

    // Made by this build: two tables of bytes and text, no time anywhere (expiry is judged by
    // observation, so the server's clock is never read and its steps change nothing).
    drop(store(&server, "later").await);
    let columns = server.admin(
        "SELECT string_agg(table_name || '.' || column_name || ':' || data_type, ',' \
         ORDER BY table_name, column_name) FROM information_schema.columns \
         WHERE table_schema = 'later'",
    );
    assert_eq!(
        columns.trim(),
        "vvm_kv.key:bytea,vvm_kv.value:bytea,vvm_meta.name:text,vvm_meta.value:text"
    );
    // Then marked as made by a newer one.
    server.admin("UPDATE later.vvm_meta SET value = '2' WHERE name = 'version'");
    let refused = open(config(&server, "vvm", "later"), TxOptions::default())
        .await
        .unwrap_err();
    assert!(
        matches!(refused, PgOpenError::NewerSchema { found: 2, .. }),
        "{refused:?}"
    );
    assert!(refused.to_string().contains("upgrade vvm"), "{refused}");
    assert!(!refused.to_string().contains('\n'));

    // A user that may log in and nothing more: told which right it lacks, to create the
    // schema, and to use one that exists.
    let refused = open(config(&server, "vvm_ro", "mine"), TxOptions::default())
        .await
        .unwrap_err();
    assert!(
        matches!(&refused, PgOpenError::Privilege { user, needed } if user == "vvm_ro" && needed.contains("CREATE on database postgres")),
        "{refused:?}: {refused}"
    );
    drop(store(&server, "shared").await);
    server.admin("GRANT USAGE ON SCHEMA shared TO vvm_ro; GRANT SELECT ON shared.vvm_kv, shared.vvm_meta TO vvm_ro;");
    let refused = open(config(&server, "vvm_ro", "shared"), TxOptions::default())
        .await
        .unwrap_err();
    assert!(
        matches!(&refused, PgOpenError::Privilege { needed, .. } if needed.starts_with("INSERT, UPDATE, DELETE on shared.vvm_kv")),
        "{refused:?}: {refused}"
    );
    // To read (`vvm status`), SELECT is enough.
    let reader = open_read_only(config(&server, "vvm_ro", "shared"), TxOptions::default())
        .await
        .expect("a reader needs SELECT only");
    assert_eq!(reader.get(Slot(1)).await.unwrap(), None);
}

/// Waits until `store` answers `get` again (after connections were killed or the server
/// restarted), for at most 30 s.
async fn until_served(store: &PgStore, slot: Slot) -> Option<vvm_runtime::Lease> {
    let started = Instant::now();
    loop {
        match store.get(slot).await {
            Ok(lease) => return lease,
            Err(error) => {
                assert!(
                    started.elapsed() < Duration::from_secs(30),
                    "still failing: {error}"
                );
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    }
}

// covers: Pg.Failures
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killed_connections_and_a_restarted_server_are_ridden_out() {
    let test = "killed_connections_and_a_restarted_server_are_ridden_out";
    let Some(server) = PgServer::start(test) else {
        return;
    };
    let holder = store(&server, "failures").await;
    let other = store(&server, "failures").await;
    let ttl = Duration::from_secs(3600);
    let mine = LeaseValue::new("10.0.0.1:7000", Incarnation(1));
    let revision = holder
        .insert_if_not_exists(Slot(1), &mine, ttl)
        .await
        .unwrap()
        .expect("the slot was free");
    let lease = vvm_runtime::Lease {
        value: mine.clone(),
        revision,
    };
    assert_eq!(other.get(Slot(1)).await.unwrap(), Some(lease.clone()));

    // Every connection of the store killed, the listening one included: the next operations
    // are served on new connections, and the change feed still reports a release.
    // Spawned: its round runs (reads the slot, registers its watch) before the kill.
    let changed = tokio::spawn(other.changed(&[Slot(1)]));
    tokio::time::sleep(Duration::from_millis(300)).await;
    let killed = server.admin(
        "SELECT count(*) FROM (SELECT pg_terminate_backend(pid) FROM pg_stat_activity \
         WHERE application_name = 'vvm' AND pid <> pg_backend_pid()) AS killed",
    );
    assert!(killed.trim().parse::<u32>().unwrap() >= 2, "{killed}");
    assert_eq!(until_served(&holder, Slot(1)).await, Some(lease.clone()));
    assert!(holder.compare_and_delete(Slot(1), &lease).await.unwrap());
    tokio::time::timeout(Duration::from_secs(8), changed)
        .await
        .expect("the feed reports the release after its connection was killed")
        .unwrap();

    // The server stopped and started again under a holder: once it is back, the holder renews
    // its record and the store serves as before.
    let revision = holder
        .insert_if_not_exists(Slot(2), &mine, ttl)
        .await
        .unwrap()
        .expect("the slot was free");
    server.stop();
    assert!(holder.get(Slot(2)).await.is_err(), "no server, no answer");
    server.restart(test);
    let lease = until_served(&holder, Slot(2)).await.expect("kept");
    assert_eq!(lease.revision, revision);
    let renewed = holder
        .compare_and_swap(Slot(2), &lease, &mine, ttl)
        .await
        .unwrap();
    assert!(renewed.is_some(), "the holder renews after the restart");
    let changed = tokio::spawn(other.changed(&[Slot(2)]));
    tokio::time::sleep(Duration::from_millis(300)).await;
    let lease = vvm_runtime::Lease {
        value: mine.clone(),
        revision: renewed.unwrap(),
    };
    assert!(holder.compare_and_delete(Slot(2), &lease).await.unwrap());
    tokio::time::timeout(Duration::from_secs(8), changed)
        .await
        .expect("the feed reports the release after the restart")
        .unwrap();

    // A release while no connection listens (the listening one killed, the row turned into a
    // release's tombstone at once, as the holder's release writes it: a row deleted by hand is
    // a removal, waited for a TTL, `Tx.RecordRemoved`): its notification is lost, and the watch
    // learns of it by reading again when the new `LISTEN` holds, well before its 10 s bound.
    holder
        .insert_if_not_exists(Slot(3), &mine, ttl)
        .await
        .unwrap()
        .expect("the slot was free");
    let changed = tokio::spawn(other.changed(&[Slot(3)]));
    tokio::time::sleep(Duration::from_millis(500)).await;
    let listeners = server.admin(
        "SELECT count(*) FROM (SELECT pg_terminate_backend(pid) FROM pg_stat_activity \
         WHERE application_name = 'vvm' AND query LIKE 'LISTEN%') AS killed; \
         UPDATE failures.vvm_kv SET value = '\\x0144'::bytea || substring(value from 3 for 8) \
         WHERE key = convert_to('vvm/slot/3', 'UTF8');",
    );
    assert!(
        listeners
            .lines()
            .next()
            .unwrap()
            .trim()
            .parse::<u32>()
            .unwrap()
            >= 1,
        "{listeners}"
    );
    tokio::time::timeout(Duration::from_secs(8), changed)
        .await
        .expect("the feed reports a release whose notification was lost")
        .unwrap();

    // The connection lost while COMMIT was under way: the server received it (and commits),
    // the client never hears back. The store says the outcome is unknown, not that the write
    // failed — and reading again shows that it was applied.
    let cutter = CommitCutter::start(server.port());
    let proxied = open(
        PgConfig::new("127.0.0.1", cutter.port, "vvm", "postgres")
            .and_then(|config| config.schema("failures"))
            .unwrap(),
        TxOptions::default(),
    )
    .await
    .expect("the store opens through the proxy");
    cutter.arm();
    let outcome = proxied.insert_if_not_exists(Slot(4), &mine, ttl).await;
    assert!(cutter.cut(), "the proxy saw no COMMIT to cut");
    assert!(
        matches!(outcome, Err(vvm_runtime::StoreError::Unknown { .. })),
        "{outcome:?}"
    );
    // Once the server answered (to the proxy, which kept the answer), the write is there.
    let started = Instant::now();
    while !cutter.answered() {
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "the server never answered the COMMIT"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let applied = other
        .get(Slot(4))
        .await
        .unwrap()
        .expect("the COMMIT applied");
    assert_eq!(applied.value, mine);
    // The store serves again on a new connection, and reads the same.
    assert_eq!(until_served(&proxied, Slot(4)).await, Some(applied));
}

// covers: Pg.Failures
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_paused_server_bounds_every_call_by_the_timeout_and_serves_again_when_resumed() {
    let test = "a_paused_server_bounds_every_call_by_the_timeout_and_serves_again_when_resumed";
    let Some(server) = PgServer::start(test) else {
        return;
    };
    let timeout = Duration::from_millis(800);
    let options = TxOptions::default().timeout(timeout).unwrap();
    let holder = open(config(&server, "vvm", "paused"), options)
        .await
        .expect("the store opens");
    let mine = LeaseValue::new("10.0.0.1:7000", Incarnation(1));
    let ttl = Duration::from_secs(3600);
    let revision = holder
        .insert_if_not_exists(Slot(1), &mine, ttl)
        .await
        .unwrap()
        .expect("the slot was free");
    let lease = vvm_runtime::Lease {
        value: mine.clone(),
        revision,
    };
    // Paused past the deadline: a renewal neither hangs nor succeeds; it fails within its
    // timeout (plus scheduling), so the runtime's own deadline decides, as on every store.
    server.signal_all(Signal::STOP);
    let started = Instant::now();
    let renewal = holder.compare_and_swap(Slot(1), &lease, &mine, ttl).await;
    let took = started.elapsed();
    server.signal_all(Signal::CONT);
    assert!(renewal.is_err(), "{renewal:?}");
    assert!(took < timeout * 5, "the call took {took:?}");
    // Resumed: served again (the paused call's transaction was rolled back or may have
    // committed: either the old revision is live, or a newer one written by this holder).
    let live = until_served(&holder, Slot(1)).await.expect("still held");
    assert_eq!(live.value, mine);
    assert!(holder
        .compare_and_swap(Slot(1), &live, &mine, ttl)
        .await
        .unwrap()
        .is_some());
}

/// A loopback TCP proxy to a server that, once armed, forwards the client's next `COMMIT` and
/// then cuts that client's connection before the server's reply can pass.
struct CommitCutter {
    port: u16,
    armed: std::sync::Arc<std::sync::atomic::AtomicBool>,
    cuts: std::sync::Arc<std::sync::atomic::AtomicUsize>,
    /// Answers of the server kept from a client that was cut.
    kept: std::sync::Arc<std::sync::atomic::AtomicUsize>,
}

impl CommitCutter {
    fn start(server_port: u16) -> CommitCutter {
        use std::io::{Read, Write};
        use std::net::{Shutdown, TcpListener, TcpStream};
        use std::sync::atomic::Ordering;
        use std::sync::{Arc, Mutex};

        let listener = TcpListener::bind("127.0.0.1:0").expect("a loopback port");
        let cutter = CommitCutter {
            port: listener.local_addr().unwrap().port(),
            armed: Arc::default(),
            cuts: Arc::default(),
            kept: Arc::default(),
        };
        let (armed, cuts) = (cutter.armed.clone(), cutter.cuts.clone());
        let kept = cutter.kept.clone();
        std::thread::spawn(move || {
            for client in listener.incoming() {
                let Ok(mut client) = client else { return };
                let Ok(mut upstream) = TcpStream::connect(("127.0.0.1", server_port)) else {
                    continue;
                };
                // Set before the COMMIT is forwarded, checked before every reply is: no reply
                // to it reaches the client.
                let cut = Arc::new(Mutex::new(false));
                let (mut from, mut to) =
                    (upstream.try_clone().unwrap(), client.try_clone().unwrap());
                let replies = cut.clone();
                let kept = kept.clone();
                std::thread::spawn(move || {
                    let mut buffer = [0u8; 16384];
                    while let Ok(read @ 1..) = from.read(&mut buffer) {
                        let cut = replies.lock().unwrap();
                        if *cut {
                            kept.fetch_add(1, Ordering::SeqCst);
                            break;
                        }
                        if to.write_all(&buffer[..read]).is_err() {
                            break;
                        }
                    }
                    let _ = to.shutdown(Shutdown::Both);
                });
                let (armed, cuts) = (armed.clone(), cuts.clone());
                std::thread::spawn(move || {
                    let mut buffer = [0u8; 16384];
                    while let Ok(read @ 1..) = client.read(&mut buffer) {
                        let chunk = &buffer[..read];
                        let commit = chunk.windows(7).any(|window| window == b"COMMIT\0");
                        if commit && armed.swap(false, Ordering::SeqCst) {
                            *cut.lock().unwrap() = true;
                            let _ = upstream.write_all(chunk);
                            let _ = client.shutdown(Shutdown::Both);
                            cuts.fetch_add(1, Ordering::SeqCst);
                            return;
                        }
                        if upstream.write_all(chunk).is_err() {
                            break;
                        }
                    }
                    let _ = upstream.shutdown(Shutdown::Both);
                });
            }
        });
        cutter
    }

    /// Cuts after the next COMMIT.
    fn arm(&self) {
        self.armed.store(true, std::sync::atomic::Ordering::SeqCst);
    }

    /// Whether a COMMIT was cut.
    fn cut(&self) -> bool {
        self.cuts.load(std::sync::atomic::Ordering::SeqCst) > 0
    }

    /// Whether the server answered a COMMIT that was cut (the answer kept from the client).
    fn answered(&self) -> bool {
        self.kept.load(std::sync::atomic::Ordering::SeqCst) > 0
    }
}

/// Requests for the advisory lock `key` over the whole server: granted ones (a mark held) or
/// blocked ones (waiters of a mark).
fn advisory_locks(server: &PgServer, key: i64, granted: bool) -> usize {
    let not = if granted { "" } else { "NOT" };
    server
        .admin(&format!(
            "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND {not} granted \
             AND objsubid = 1 AND classid::bigint = ({key}::bigint >> 32) & 4294967295 \
             AND objid::bigint = {key}::bigint & 4294967295"
        ))
        .trim()
        .parse()
        .unwrap_or(usize::MAX)
}

/// The configuration of a store on `schema` whose sessions take marks.
fn marked(server: &PgServer, schema: &str) -> PgConfig {
    config(server, "vvm", schema)
        .advisory_lock_marks(true)
        .expect("marks without TLS")
}

/// The value of a session's record in these tests.
fn session_value() -> LeaseValue {
    LeaseValue {
        address: "10.0.0.1:7000".to_owned(),
        incarnation: Incarnation(1),
        stopping: false,
    }
}

/// Five feeds of one store handle waiting on a semaphore whose owner holds a mark share one
/// connection blocked on the owner's advisory lock (each had one of its own), and the server
/// freeing the lock wakes them all.
// covers: Pg.Marks
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn feeds_of_one_handle_wait_on_a_mark_through_one_connection() {
    use vvm_core::semaphore::SemaphoreName;
    use vvm_core::session::{SessionId, SessionKey};
    use vvm_runtime::{SemaphoreRequest, SemaphoreStore, SessionStore};

    let Some(server) =
        PgServer::shared("feeds_of_one_handle_wait_on_a_mark_through_one_connection")
    else {
        return;
    };
    let schema = "marks_shared_wait";
    let owner = open(marked(server, schema), TxOptions::default())
        .await
        .expect("opens");
    let waiter = open(marked(server, schema), TxOptions::default())
        .await
        .expect("opens");
    let session = SessionKey {
        incarnation: Incarnation(1),
        id: SessionId(1),
    };
    let value = session_value();
    let created = owner.create_session(session, &value, Duration::from_secs(60));
    assert!(
        matches!(created.await, Ok(Some(_))),
        "the session is created"
    );
    let gate = SemaphoreName::new("gate").expect("a valid name");
    let create = SemaphoreRequest::Create {
        limit: 1,
        data: Vec::new(),
    };
    owner
        .semaphore(session, &gate, create)
        .await
        .expect("created");
    let acquire = SemaphoreRequest::Acquire {
        request: vvm_runtime::next_request_id(),
        count: 1,
        data: Vec::new(),
        timeout_ms: 0,
        ephemeral: false,
    };
    owner
        .semaphore(session, &gate, acquire)
        .await
        .expect("granted");

    let key = vvm_adapters::postgres::session_lock_key(schema, &owner.session_key(session));
    let feeds: Vec<_> = (0..5)
        .map(|_| tokio::spawn(waiter.semaphore_changed(&gate)))
        .collect();
    let began = Instant::now();
    while advisory_locks(server, key, false) == 0 && began.elapsed() < Duration::from_secs(20) {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // Time for every feed to have made its round and its wait.
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(
        advisory_locks(server, key, false),
        1,
        "one connection of the waiting handle blocked on the owner's mark"
    );
    assert!(
        feeds.iter().all(|feed| !feed.is_finished()),
        "nothing changed yet"
    );

    // The owner's mark connection ended by the server: the lock is free, every feed wakes.
    server.admin(&format!(
        "SELECT pg_terminate_backend(pid) FROM pg_locks WHERE locktype = 'advisory' AND granted \
         AND objsubid = 1 AND classid::bigint = ({key}::bigint >> 32) & 4294967295 \
         AND objid::bigint = {key}::bigint & 4294967295"
    ));
    for feed in feeds {
        tokio::time::timeout(Duration::from_secs(10), feed)
            .await
            .expect("woken by the freed mark")
            .expect("the feed ran");
    }
}

/// A marked create whose transaction fails (here: the server refuses the row) wrote nothing
/// that names its mark, so the mark is given back at once (its connection held the lock for
/// the process's life), and a create that works keeps its mark until the session's delete.
// covers: Tx.Marks
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_marked_create_that_fails_gives_its_mark_back() {
    use vvm_core::session::{SessionId, SessionKey};
    use vvm_runtime::SessionStore;

    let Some(server) = PgServer::shared("a_marked_create_that_fails_gives_its_mark_back") else {
        return;
    };
    let schema = "marks_failed_create";
    let store = open(marked(server, schema), TxOptions::default())
        .await
        .expect("opens");
    let value = session_value();
    let key = |id| SessionKey {
        incarnation: Incarnation(1),
        id: SessionId(id),
    };
    let lock = |id| vvm_adapters::postgres::session_lock_key(schema, &store.session_key(key(id)));

    // Session records refused by the server while the trigger is there.
    server.admin(&format!(
        "CREATE FUNCTION {schema}.refuse() RETURNS trigger LANGUAGE plpgsql AS \
         $$ BEGIN RAISE EXCEPTION 'refused'; END $$; \
         CREATE TRIGGER refuse BEFORE INSERT ON {schema}.vvm_kv FOR EACH ROW \
         EXECUTE FUNCTION {schema}.refuse()"
    ));
    let refused = store
        .create_session(key(1), &value, Duration::from_secs(60))
        .await;
    assert!(refused.is_err(), "{refused:?}");
    assert_eq!(
        held_after_close(server, lock(1)).await,
        0,
        "the mark of a create that failed"
    );

    server.admin(&format!("DROP TRIGGER refuse ON {schema}.vvm_kv"));
    let created = store
        .create_session(key(2), &value, Duration::from_secs(60))
        .await;
    let revision = created.expect("created").expect("a fresh key");
    assert_eq!(
        advisory_locks(server, lock(2), true),
        1,
        "the mark of a live session"
    );
    assert!(store
        .delete_session(key(2), revision)
        .await
        .expect("deleted"));
    assert_eq!(
        held_after_close(server, lock(2)).await,
        0,
        "a deleted session's mark"
    );
}

/// [`held`] once the server had up to 10 s to see a closed connection go.
async fn held_after_close(server: &PgServer, key: i64) -> usize {
    let began = Instant::now();
    while advisory_locks(server, key, true) > 0 && began.elapsed() < Duration::from_secs(10) {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    advisory_locks(server, key, true)
}
