//! The SQLite store's change feed: one per store handle, woken by the kernel's file
//! notifications — waiting costs no look at the file while nothing changes, many waiters share
//! one watching thread and descriptor, and a commit by another process wakes them.

use std::future::Future;
use std::io::{BufRead, Write as _};
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use vvm_adapters::SqliteStore;
use vvm_core::semaphore::SemaphoreName;
use vvm_core::{Incarnation, LeaseConfig, Slot};
use vvm_runtime::{
    AcquireOptions, Coordination, KillerThread, LeaseStore, LeaseValue, RecordingKiller,
    SemaphoreStore, SessionHandle,
};

/// Names the database of the second process; set only for it.
const CHILD_DB: &str = "VVM_FEED_CHILD_DB";

/// Names the database of the renewing holder's process; set only for it.
const HOLDER_DB: &str = "VVM_FEED_HOLDER_DB";

/// A fresh directory, removed at the end.
struct Scratch(PathBuf);

impl Scratch {
    fn new(what: &str) -> Self {
        let dir = std::env::temp_dir().join(format!("vvm-feed-{what}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("the scratch directory");
        Scratch(dir)
    }

    fn file(&self) -> PathBuf {
        self.0.join("store.sqlite")
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

type Wait = Pin<Box<dyn Future<Output = ()> + Send>>;

/// `grants` waits on one semaphore (as served grants, queued acquires and watches wait) and
/// `candidates` waits on slots, each on its own task.
fn waiters(
    store: &SqliteStore,
    grants: usize,
    candidates: u32,
) -> Vec<tokio::task::JoinHandle<()>> {
    let name = SemaphoreName::new("quiet").expect("a valid name");
    let mut waits: Vec<Wait> = Vec::new();
    for _ in 0..grants {
        waits.push(store.semaphore_changed(&name));
    }
    for slot in 0..candidates {
        waits.push(store.changed(&[Slot(slot)]));
    }
    waits.into_iter().map(tokio::spawn).collect()
}

/// The threads of this process named `name`.
fn threads_named(name: &str) -> usize {
    std::fs::read_dir("/proc/self/task")
        .expect("the tasks of this process")
        .filter_map(Result::ok)
        .filter(|task| {
            std::fs::read_to_string(task.path().join("comm")).is_ok_and(|comm| comm.trim() == name)
        })
        .count()
}

/// The inotify descriptors this process has open.
fn inotify_descriptors() -> usize {
    std::fs::read_dir("/proc/self/fd")
        .expect("the descriptors of this process")
        .filter_map(Result::ok)
        .filter(|fd| {
            std::fs::read_link(fd.path())
                .is_ok_and(|target| target.to_string_lossy() == "anon_inode:inotify")
        })
        .count()
}

/// How many times `store`'s feed looked at its file over `window`, after `settle` (for the
/// waits' own first looks).
async fn looks_over(store: &SqliteStore, settle: Duration, window: Duration) -> u64 {
    tokio::time::sleep(settle).await;
    let before = store.feed_looks();
    tokio::time::sleep(window).await;
    store.feed_looks() - before
}

/// 1 000 waiting grants and 10 waiting candidates look at the file only when it changes: over
/// 2.5 s of a quiet store, not once (the backstop look comes every 30 s). Each used to look
/// every 10 ms on its own (~150 000 looks in 1.5 s), then the shared feed once a second.
// covers: Sq.FeedShared
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waiting_costs_no_look_at_the_file_while_nothing_changes() {
    let dir = Scratch::new("quiet");
    let store = SqliteStore::open(dir.file()).expect("the store opens");
    let tasks = waiters(&store, 1_000, 10);
    // After the waits' first looks (their start, the locks) and the settling looks after the
    // last commit (about 2 s at most).
    let window = Duration::from_millis(2_500);
    let looks = looks_over(&store, window, window).await;
    assert_eq!(
        looks, 0,
        "1 010 waits looked at the file {looks} times in 2.5 s while nothing changed"
    );
    assert!(tasks.iter().all(|task| !task.is_finished()), "a wait ended");
    for task in tasks {
        task.abort();
    }
}

/// Many waiters on several store handles share one watching thread and one inotify descriptor
/// in the process, however many waits there are.
// covers: Sq.FeedShared
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn many_waiters_share_one_watching_thread_and_descriptor() {
    let dir = Scratch::new("shared");
    let first = SqliteStore::open(dir.file()).expect("the store opens");
    let second = SqliteStore::open(dir.file()).expect("the store opens again");
    let mut tasks = waiters(&first, 500, 5);
    tasks.extend(waiters(&first.clone(), 500, 5));
    tasks.extend(waiters(&second, 500, 5));
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert_eq!(threads_named("vvm-sqlite-feed"), 1, "watching threads");
    assert_eq!(inotify_descriptors(), 1, "inotify descriptors");
    for task in tasks {
        task.abort();
    }
}

async fn coordination(path: &Path, n: u64) -> Coordination<SqliteStore> {
    let store = SqliteStore::builder()
        .busy_wait(Duration::from_secs(2))
        .open(path)
        .expect("the store opens");
    let killer = KillerThread::new(RecordingKiller::new());
    let lease = LeaseConfig::new(Duration::from_secs(20)).expect("a valid lease");
    let value = LeaseValue::new(format!("process-{n}"), Incarnation(n));
    let session = SessionHandle::open(store, lease, value, &killer)
        .await
        .expect("the session opens");
    Coordination::new(session)
}

/// The second process: takes slot 7 before it says it is ready; once told (a line on its
/// input), acquires a unit of `shared` (a write of the semaphore's row), releases it and lets
/// slot 7 go. Does nothing when run as an ordinary test.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn child_writes_when_told() {
    let Some(path) = std::env::var_os(CHILD_DB) else {
        return;
    };
    let coordination = coordination(Path::new(&path), 2).await;
    let store = SqliteStore::open(&path).expect("the store opens");
    let value = LeaseValue::new("child", Incarnation(7));
    let revision = store
        .insert_if_not_exists(Slot(7), &value, Duration::from_secs(20))
        .await
        .expect("inserted")
        .expect("the slot is free");
    println!("READY");
    let mut line = String::new();
    std::io::stdin().lock().read_line(&mut line).expect("told");
    let grant = coordination
        .acquire("shared", AcquireOptions::new(1))
        .await
        .expect("the acquire runs")
        .expect("granted");
    assert!(grant.release().await.expect("released"));
    let lease = store.get(Slot(7)).await.expect("read").expect("held");
    assert_eq!(lease.revision, revision);
    assert!(store
        .compare_and_delete(Slot(7), &lease)
        .await
        .expect("released"));
    assert!(coordination.session().close().await.expect("closed"));
}

/// A waiting candidate and 100 watchers of a semaphore, quiet for a second (no look but the
/// safety look), are woken by another process's commits: the semaphore's row written, the slot
/// let go. The slot is held by the other process when the wait begins, as a candidate's wait
/// always begins: a slot taken and let go again between two looks of the feed reads as no
/// change (its holders are the same), and the test once waited for that in vain on a loaded
/// machine.
// covers: Sq.FeedShared, Sem.Store.Processes
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_commit_by_another_process_wakes_every_waiter() {
    let dir = Scratch::new("processes");
    let path = dir.file();
    let store = SqliteStore::open(&path).expect("the store opens");
    let parent = coordination(&path, 1).await;
    parent
        .create("shared", 1, Vec::new())
        .await
        .expect("created");
    let mut child = Command::new(std::env::current_exe().expect("the test binary"))
        .args([
            "child_writes_when_told",
            "--exact",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(CHILD_DB, &path)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("the second process starts");
    let mut lines = std::io::BufReader::new(child.stdout.take().expect("its output")).lines();
    let ready = tokio::task::spawn_blocking(move || {
        let ready = lines.any(|line| line.is_ok_and(|line| line.contains("READY")));
        (ready, lines)
    });
    let (ready, _lines) = ready.await.expect("joined");
    assert!(ready, "the child never got ready");
    let name = SemaphoreName::new("shared").expect("a valid name");
    let mut waits: Vec<Wait> = (0..100).map(|_| store.semaphore_changed(&name)).collect();
    waits.push(store.changed(&[Slot(7)]));
    let tasks: Vec<_> = waits.into_iter().map(tokio::spawn).collect();
    let quiet = looks_over(&store, Duration::from_millis(200), Duration::from_secs(1)).await;
    assert!(
        quiet <= 4,
        "101 waits looked at the file {quiet} times in 1 s while nothing changed"
    );
    let told = Instant::now();
    let mut input = child.stdin.take().expect("its input");
    input.write_all(b"go\n").expect("told");
    for task in tasks {
        tokio::time::timeout(Duration::from_secs(30), task)
            .await
            .expect("woken by the other process's commit")
            .expect("the wait ran");
    }
    eprintln!("woken {:?} after telling the child", told.elapsed());
    drop(input);
    let status = tokio::task::spawn_blocking(move || child.wait())
        .await
        .expect("joined")
        .expect("the child ran");
    assert!(status.success(), "the child failed: {status}");
}

/// The holder's process: takes slot 3 (with its lock) before it says it is ready, then renews
/// it every 20 ms until its input ends, and releases it. Does nothing when run as an ordinary
/// test.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn child_holds_and_renews() {
    let Some(path) = std::env::var_os(HOLDER_DB) else {
        return;
    };
    let store = SqliteStore::open(&path).expect("the store opens");
    let value = LeaseValue::new("holder", Incarnation(3));
    let ttl = Duration::from_secs(20);
    let mut revision = store
        .insert_if_not_exists(Slot(3), &value, ttl)
        .await
        .expect("inserted")
        .expect("the slot is free");
    println!("READY");
    let (ended, mut ended_rx) = tokio::sync::oneshot::channel();
    std::thread::spawn(move || {
        let mut line = String::new();
        let _ = std::io::stdin().lock().read_line(&mut line);
        let _ = ended.send(());
    });
    loop {
        tokio::select! {
            _ = &mut ended_rx => break,
            () = tokio::time::sleep(Duration::from_millis(20)) => {}
        }
        let lease = vvm_runtime::Lease {
            value: value.clone(),
            revision,
        };
        revision = store
            .compare_and_swap(Slot(3), &lease, &value, ttl)
            .await
            .expect("renewed")
            .expect("still ours");
    }
    let lease = vvm_runtime::Lease { value, revision };
    assert!(store
        .compare_and_delete(Slot(3), &lease)
        .await
        .expect("released"));
}

/// A candidate waiting on a slot that another live process holds and keeps renewing is
/// refused at each of its rounds without taking the store's write lock: the holder's record and
/// its lock (held) are judged on a read. Every standby's every round used to be a write
/// transaction, in which a lock held by its holder was also tried eight times (about a
/// millisecond in the one write lock); 50 standbys of a hand-off all queued for it.
// covers: Sq.DeadHolder, Sq.Atomic
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_candidate_takes_no_write_lock_while_the_holder_lives() {
    let dir = Scratch::new("standby");
    let path = dir.file();
    let store = SqliteStore::open(&path).expect("the store opens");
    let mut child = renewing_holder(&path).await;
    let value = LeaseValue::new("standby", Incarnation(4));
    let before = store.write_transactions();
    let started = Instant::now();
    let rounds: u64 = 20;
    for _ in 0..rounds {
        let answer = store
            .insert_or_time_left(Slot(3), &value, Duration::from_secs(20))
            .await
            .expect("the insert runs");
        assert!(
            matches!(answer, vvm_runtime::Inserted::Held { left: Some(_) }),
            "the live holder's record refuses: {answer:?}"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let writes = store.write_transactions() - before;
    eprintln!(
        "{rounds} refused rounds in {:?}, {writes} write transactions",
        started.elapsed()
    );
    assert_eq!(
        writes, 0,
        "{rounds} refused rounds of a standby took the write lock {writes} times"
    );
    drop(child.stdin.take());
    let status = tokio::task::spawn_blocking(move || child.wait())
        .await
        .expect("joined")
        .expect("the holder ran");
    assert!(status.success(), "the holder failed: {status}");
}

/// Starts [`child_holds_and_renews`] on the store at `path` (slot 3, a renewal every 20 ms) and
/// waits until it holds; closing its standard input makes it release and exit.
async fn renewing_holder(path: &Path) -> std::process::Child {
    let mut child = Command::new(std::env::current_exe().expect("the test binary"))
        .args([
            "child_holds_and_renews",
            "--exact",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(HOLDER_DB, path)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("the holder's process starts");
    let mut lines = std::io::BufReader::new(child.stdout.take().expect("its output")).lines();
    let (ready, ready_rx) = tokio::sync::oneshot::channel();
    // Read to its end: the child's harness writes its report there when it exits.
    std::thread::spawn(move || {
        let _ = ready.send(lines.any(|line| line.is_ok_and(|line| line.contains("READY"))));
        lines.for_each(drop);
    });
    assert!(
        ready_rx.await.unwrap_or(false),
        "the holder never got ready"
    );
    child
}

/// A standby waiting on a slot whose holder's lock is held and watched looks at nothing while
/// the holder renews (50 renewals a second here): only the lock's release can let it in, and
/// the lock's thread tells it. The holder's release then wakes it at once. Every renewal used
/// to cost each waiting process two or three looks. An observer's wait (`changed`) still looks
/// at every commit: a swap of the holder's value is news to it.
// covers: Sq.FeedShared, Sq.DeadHolder
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_standby_on_a_held_lock_looks_at_nothing_while_the_holder_renews() {
    let dir = Scratch::new("covered");
    let path = dir.file();
    let store = SqliteStore::open(&path).expect("the store opens");
    let mut child = renewing_holder(&path).await;
    let waiting = tokio::spawn({
        let store = store.clone();
        async move { store.changed_for_candidate(&[Slot(3)]).await }
    });
    // After the wait's start (its read, its lock's thread).
    let looks = looks_over(&store, Duration::from_millis(300), Duration::from_secs(1)).await;
    assert!(
        looks <= 2,
        "the standby looked {looks} times in a second of its holder's renewals"
    );
    assert!(!waiting.is_finished(), "woken by a renewal");
    let released = Instant::now();
    drop(child.stdin.take());
    tokio::time::timeout(Duration::from_secs(5), waiting)
        .await
        .expect("the release wakes the standby")
        .expect("joined");
    eprintln!("woken {:?} after the release was asked", released.elapsed());
    let status = tokio::task::spawn_blocking(move || child.wait())
        .await
        .expect("joined")
        .expect("the holder ran");
    assert!(status.success(), "the holder failed: {status}");
}
