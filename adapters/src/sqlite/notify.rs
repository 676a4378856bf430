//! What wakes the change feeds (`feed.rs`): the kernel's file notifications, one inotify
//! descriptor and one thread per process for every store it waits on.
//!
//! **What a commit changes on disk.** In WAL mode a commit appends its pages to `<database>-wal`
//! with `write()` and then publishes them in the WAL index, `<database>-shm`, which every
//! connection maps into memory. Writes through a mapping raise no inotify event, so `-shm` tells
//! nothing; the `-wal` append always raises `IN_MODIFY`, whichever process commits (a checkpoint
//! writes the database file itself, which changes no data). So the directory of each store is
//! watched (not the files: `-wal` is removed when its last connection closes and made again by the
//! next, and a removed or replaced database must not leave a watch on a dead inode), and an event
//! that names the database or its `-wal` makes its feeds look.
//!
//! **A look** (`Feed::look`) is one `PRAGMA data_version` on the feed's own connection, and only
//! when that changed one read transaction of what the feed's waiters watch. The event comes at the
//! `write()` of the last page, a few microseconds *before* the commit is published, so a look
//! right after it may find nothing new: the feed looks again [`SETTLE_LOOKS_MS`] after each event
//! (up to 10 more looks within about 2 s, about 10 µs each, so that a writer descheduled between
//! its `write()` and the publication — a loaded machine — is still seen), until a look reads a new
//! version; then once more 2 ms later (two commits close together may raise one event), and no
//! more. A commit costs each waiting process about three looks.
//!
//! **A commit of this process** needs no event: right after it (before the write call returns)
//! the feeds of this process on the same file look at once ([`committed`]). A waiter in the
//! same process is woken before its writer's call ends, which also keeps waits deterministic
//! under a paused tokio clock (the blocking write holds the clock back).
//!
//! **The safety look**: every [`FEED_SAFETY_LOOK`] a feed looks anyway, and lets its slot waits
//! look at their locks, but only while something its waits depend on is told by nothing else — a
//! directory that could not be watched, a system without inotify, a held lock that got no thread
//! of its own (`Looks::needs_safety`); an eventfd wakes the thread when that begins. An overflowed
//! notification queue makes every feed look at once. Otherwise the only look without an event is
//! the backstop, every [`FEED_BACKSTOP_LOOK`], for what no rule here foresaw: a process whose
//! waiters wait on a quiet store wakes once in 30 s, whatever the number of waits (it woke every
//! second before). Expiries write nothing and never needed a look: each waiter's own deadline
//! covers them.
//!
//! Events of other files in a watched directory (`/tmp`, say) wake the thread, which reads
//! their names and makes no look.
//!
//! **Judging.** Only directories are watched (`IN_ONLYDIR`), and nothing is ever opened to watch
//! them: no path another user made can make the feed block, and an event only ever makes a feed
//! look at its own connection.

use std::ffi::OsString;
use std::os::fd::OwnedFd;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;
use std::sync::{Arc, Mutex, OnceLock, PoisonError, Weak};
use std::time::{Duration, Instant};

use rustix::event::{PollFd, PollFlags, Timespec};
use rustix::fs::inotify::{self, CreateFlags, ReadFlags, WatchFlags};

/// What the watcher wakes: a store's change feed (`feed.rs`). A trait of its own, so that this
/// module needs nothing of the feed but these two calls.
pub(super) trait Looks: Send + Sync {
    /// The store's database file.
    fn path(&self) -> &Path;
    /// Looks at the file (`Feed::look` in `feed.rs`); whether more looks are due soon (it has
    /// waiters and read no new version yet).
    fn look(&self, safety: bool) -> bool;
    /// Whether something its waits depend on is told by no event or thread (a held lock with no
    /// thread of its own), so that only the safety look covers it.
    fn needs_safety(&self) -> bool;
}

/// How often a feed looks although no file event came, when something its waits depend on is
/// told by nothing else (see the module documentation): a directory that could not be watched,
/// a system without inotify, a held lock with no thread of its own.
pub const FEED_SAFETY_LOOK: Duration = Duration::from_secs(1);

/// How often every feed with waiters looks although nothing told it to: the bound on what no
/// rule here foresaw. Long enough that a waiting process costs nothing measurable while its
/// store is quiet (see the module documentation).
pub const FEED_BACKSTOP_LOOK: Duration = Duration::from_secs(30);

/// When a feed looks again after an event, in milliseconds after the previous look: the commit
/// that raised the event is published a few microseconds after it (see the module
/// documentation), and a writer descheduled in between is covered for about 2 s.
pub const SETTLE_LOOKS_MS: [u64; 11] = [1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024];

/// The events that may tell of a commit, or of a file replaced or made again.
fn watch_flags() -> WatchFlags {
    WatchFlags::MODIFY
        | WatchFlags::CREATE
        | WatchFlags::MOVED_TO
        | WatchFlags::MOVED_FROM
        | WatchFlags::DELETE
        | WatchFlags::ONLYDIR
}

/// A watched store: its directory's watch, the names that concern it, its feed.
struct Entry {
    /// `None`: its directory could not be watched (only the safety looks tell).
    wd: Option<i32>,
    /// The database's file name and its `-wal`'s.
    names: [OsString; 2],
    feed: Weak<dyn Looks>,
    /// The next settling look and its place in [`SETTLE_LOOKS_MS`].
    settle: Option<(Instant, usize)>,
}

/// The process's watcher: one inotify descriptor, one thread.
struct Watcher {
    /// `None`: this system gave no inotify descriptor (only the safety looks tell).
    fd: Option<OwnedFd>,
    /// Wakes the thread from a wait with no safety look due when one becomes due (an entry or a
    /// feed that needs them); `None` if the system gave none (the thread then never waits
    /// longer than [`FEED_SAFETY_LOOK`]).
    poke: Option<OwnedFd>,
    entries: Mutex<Vec<Entry>>,
}

/// The process's watcher, started at the first wait on any SQLite store.
static WATCHER: OnceLock<Option<&'static Watcher>> = OnceLock::new();

fn watcher() -> Option<&'static Watcher> {
    *WATCHER.get_or_init(|| {
        let fd = inotify::init(CreateFlags::NONBLOCK | CreateFlags::CLOEXEC)
            .map_err(|error| {
                tracing::warn!(%error, "no inotify descriptor: SQLite waiters learn of changes at the safety look only (every second)");
            })
            .ok();
        let poke = rustix::event::eventfd(
            0,
            rustix::event::EventfdFlags::NONBLOCK | rustix::event::EventfdFlags::CLOEXEC,
        )
        .ok();
        let watcher: &'static Watcher = Box::leak(Box::new(Watcher {
            fd,
            poke,
            entries: Mutex::new(Vec::new()),
        }));
        match std::thread::Builder::new()
            .name("vvm-sqlite-feed".into())
            .spawn(move || watcher.run())
        {
            Ok(_) => Some(watcher),
            Err(error) => {
                tracing::warn!(%error, "cannot start the SQLite change feed's thread: waiters learn of changes at their own deadlines only");
                None
            }
        }
    })
}

/// Makes the process's watcher wake `feed` on the changes of the store at `path` (once per
/// feed); whether a thread runs to do so.
pub(super) fn register(path: &Path, feed: Weak<dyn Looks>) -> bool {
    let Some(watcher) = watcher() else {
        return false;
    };
    let Some(name) = path.file_name() else {
        return true;
    };
    let mut wal = name.to_owned();
    wal.push("-wal");
    let dir = match path.parent() {
        Some(dir) if !dir.as_os_str().is_empty() => dir,
        _ => Path::new("."),
    };
    let mut entries = watcher
        .entries
        .lock()
        .unwrap_or_else(PoisonError::into_inner);
    // Under the lock: a watch removed meanwhile (its last feed gone) is not reused.
    let wd = watcher.fd.as_ref().and_then(|fd| {
        inotify::add_watch(fd, dir, watch_flags())
            .map_err(|error| {
                tracing::warn!(%error, dir = %dir.display(), "cannot watch the SQLite store's directory: its waiters learn of changes at the safety look only (every second)");
            })
            .ok()
    });
    let unwatched = wd.is_none();
    entries.push(Entry {
        wd,
        names: [name.to_owned(), wal],
        feed,
        settle: None,
    });
    drop(entries);
    if unwatched {
        watcher.wake();
    }
    true
}

/// A feed now needs the safety looks (`Looks::needs_safety`): the watcher's thread, perhaps
/// waiting with none due, is woken to schedule them.
pub(super) fn needs_safety_now() {
    if let Some(Some(watcher)) = WATCHER.get() {
        watcher.wake();
    }
}

/// A transaction of this process wrote to the store at `path` and committed: the feeds of this
/// process on that file look now, on the caller's thread (see the module documentation).
pub(super) fn committed(path: &Path) {
    let Some(Some(watcher)) = WATCHER.get() else {
        return;
    };
    let feeds: Vec<Arc<dyn Looks>> = {
        let entries = watcher
            .entries
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        entries
            .iter()
            .filter_map(|entry| entry.feed.upgrade())
            .filter(|feed| feed.path() == path)
            .collect()
    };
    for feed in feeds {
        feed.look(false);
    }
}

impl Watcher {
    fn run(&self) {
        let mut buf = [std::mem::MaybeUninit::<u8>::uninit(); 4096];
        let start = Instant::now();
        let mut next_safety = start + FEED_SAFETY_LOOK;
        let mut next_backstop = start + FEED_BACKSTOP_LOOK;
        loop {
            // Every second only while some feed needs it; else at the backstop.
            let needed = self.needs_safety();
            let safety_at = if needed { next_safety } else { next_backstop };
            let due = self.next_settle().map_or(safety_at, |at| at.min(safety_at));
            let timeout = due.saturating_duration_since(Instant::now());
            let (events, overflowed) = self.wait(timeout, &mut buf);
            let now = Instant::now();
            let backstop = now >= next_backstop;
            if backstop {
                next_backstop = now + FEED_BACKSTOP_LOOK;
            }
            let safety = now >= next_safety;
            if safety {
                next_safety = now + FEED_SAFETY_LOOK;
            }
            let mut published = Vec::new();
            for (feed, safety) in self.due(&events, overflowed, safety, backstop, now) {
                if !feed.look(safety) {
                    published.push(feed);
                }
            }
            self.settle(&published);
        }
    }

    /// Whether some feed is covered by the safety looks alone: no inotify descriptor, or no
    /// way to be woken when that changes, a directory not watched, a feed with a lock no
    /// thread watches.
    fn needs_safety(&self) -> bool {
        if self.fd.is_none() || self.poke.is_none() {
            return true;
        }
        let entries = self.entries.lock().unwrap_or_else(PoisonError::into_inner);
        entries.iter().any(|entry| {
            entry.wd.is_none() || entry.feed.upgrade().is_some_and(|feed| feed.needs_safety())
        })
    }

    /// Wakes the thread from its wait (see [`Watcher::poke`]).
    fn wake(&self) {
        if let Some(poke) = &self.poke {
            // Full (never: the thread drains it at each wake) or failed: it wakes anyway at
            // its next event or look.
            let _ = rustix::io::write(poke, &1u64.to_ne_bytes());
        }
    }

    /// The feeds in `published` read a new version (or have no waiter): one last settling look
    /// (a commit whose event merged with the previous one's may still be publishing), then none.
    fn settle(&self, published: &[Arc<dyn Looks>]) {
        if published.is_empty() {
            return;
        }
        let last = SETTLE_LOOKS_MS.len() - 1;
        let at = Instant::now() + Duration::from_millis(SETTLE_LOOKS_MS[1]);
        let mut entries = self.entries.lock().unwrap_or_else(PoisonError::into_inner);
        for entry in entries.iter_mut() {
            if published
                .iter()
                .any(|feed| std::ptr::eq(entry.feed.as_ptr(), Arc::as_ptr(feed)))
            {
                entry.settle = match entry.settle {
                    Some((_, step)) if step < last => Some((at, last)),
                    _ => None,
                };
            }
        }
    }

    /// The earliest settling look.
    fn next_settle(&self) -> Option<Instant> {
        let entries = self.entries.lock().unwrap_or_else(PoisonError::into_inner);
        entries
            .iter()
            .filter_map(|entry| entry.settle.map(|(at, _)| at))
            .min()
    }

    /// Waits up to `timeout` for events; the (watch, name) of each, and whether the queue
    /// overflowed (events were lost).
    fn wait(
        &self,
        timeout: Duration,
        buf: &mut [std::mem::MaybeUninit<u8>],
    ) -> (Vec<(i32, OsString)>, bool) {
        let Some(fd) = &self.fd else {
            std::thread::sleep(timeout);
            return (Vec::new(), false);
        };
        let timeout = Timespec {
            tv_sec: i64::try_from(timeout.as_secs()).unwrap_or(i64::MAX),
            tv_nsec: i64::from(timeout.subsec_nanos()),
        };
        match &self.poke {
            Some(poke) => {
                let mut fds = [
                    PollFd::new(fd, PollFlags::IN),
                    PollFd::new(poke, PollFlags::IN),
                ];
                // An interrupted or failed wait is followed by the reads and the next wait.
                let _ = rustix::event::poll(&mut fds, Some(&timeout));
                let mut count = [0u8; 8];
                let _ = rustix::io::read(poke, &mut count);
            }
            None => {
                let mut fds = [PollFd::new(fd, PollFlags::IN)];
                let _ = rustix::event::poll(&mut fds, Some(&timeout));
            }
        }
        let mut events = Vec::new();
        let mut overflowed = false;
        let mut reader = inotify::Reader::new(fd, buf);
        // Until `WOULDBLOCK` (all read); any other error: the next wait tells again.
        while let Ok(event) = reader.next() {
            if event.events().contains(ReadFlags::QUEUE_OVERFLOW) {
                overflowed = true;
            } else if let Some(name) = event.file_name() {
                let name = OsString::from(std::ffi::OsStr::from_bytes(name.to_bytes()));
                if !events.contains(&(event.wd(), name.clone())) {
                    events.push((event.wd(), name));
                }
            }
        }
        (events, overflowed)
    }

    /// The feeds to look now (and whether for the safety look), forgetting those whose store
    /// is gone and moving each one's settling looks on.
    fn due(
        &self,
        events: &[(i32, OsString)],
        overflowed: bool,
        safety: bool,
        backstop: bool,
        now: Instant,
    ) -> Vec<(Arc<dyn Looks>, bool)> {
        let mut entries = self.entries.lock().unwrap_or_else(PoisonError::into_inner);
        let mut looks = Vec::new();
        let mut index = 0;
        while index < entries.len() {
            let Some(feed) = entries[index].feed.upgrade() else {
                let gone = entries.swap_remove(index);
                if let (Some(wd), Some(fd)) = (gone.wd, &self.fd) {
                    if !entries.iter().any(|entry| entry.wd == Some(wd)) {
                        let _ = inotify::remove_watch(fd, wd);
                    }
                }
                continue;
            };
            let entry = &mut entries[index];
            index += 1;
            // The safety look only for a feed that nothing else covers (or at the backstop).
            let safety = backstop || (safety && (entry.wd.is_none() || feed.needs_safety()));
            let told = overflowed
                || events
                    .iter()
                    .any(|(wd, name)| Some(*wd) == entry.wd && entry.names.contains(name));
            if told {
                entry.settle = Some((now + Duration::from_millis(SETTLE_LOOKS_MS[0]), 0));
                looks.push((feed, safety));
                continue;
            }
            match entry.settle {
                Some((at, step)) if at <= now => {
                    entry.settle = SETTLE_LOOKS_MS
                        .get(step + 1)
                        .map(|ms| (now + Duration::from_millis(*ms), step + 1));
                    looks.push((feed, safety));
                }
                _ if safety => looks.push((feed, true)),
                _ => {}
            }
        }
        looks
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};

    /// A feed that counts its looks and says whether it needs the safety looks.
    struct Fake {
        path: std::path::PathBuf,
        needs: AtomicBool,
        looks: AtomicU32,
        safety_looks: AtomicU32,
    }

    impl Looks for Fake {
        fn path(&self) -> &Path {
            &self.path
        }

        fn look(&self, safety: bool) -> bool {
            self.looks.fetch_add(1, Ordering::Relaxed);
            if safety {
                self.safety_looks.fetch_add(1, Ordering::Relaxed);
            }
            false
        }

        fn needs_safety(&self) -> bool {
            self.needs.load(Ordering::Relaxed)
        }
    }

    fn watcher() -> Watcher {
        Watcher {
            fd: inotify::init(CreateFlags::NONBLOCK | CreateFlags::CLOEXEC).ok(),
            poke: rustix::event::eventfd(0, rustix::event::EventfdFlags::NONBLOCK).ok(),
            entries: Mutex::new(Vec::new()),
        }
    }

    fn entry(feed: &Arc<Fake>, wd: Option<i32>) -> Entry {
        let weak: Weak<dyn Looks> = Arc::downgrade(&(feed.clone() as Arc<dyn Looks>));
        Entry {
            wd,
            names: ["s.sqlite".into(), "s.sqlite-wal".into()],
            feed: weak,
            settle: None,
        }
    }

    fn fake() -> Arc<Fake> {
        Arc::new(Fake {
            path: "/nowhere/s.sqlite".into(),
            needs: AtomicBool::new(false),
            looks: AtomicU32::new(0),
            safety_looks: AtomicU32::new(0),
        })
    }

    /// The safety look reaches only a feed that nothing else covers: a watched feed with its
    /// locks watched waits for events (or the backstop); an unwatched directory or a feed with
    /// an unwatched lock gets it, and so does every feed at the backstop.
    #[test]
    fn the_safety_look_reaches_only_what_nothing_else_tells() {
        let w = watcher();
        if w.fd.is_none() || w.poke.is_none() {
            // No inotify or eventfd here: every feed needs the safety looks, by design.
            assert!(w.needs_safety());
            return;
        }
        let (watched, unwatched_dir, unwatched_lock) = (fake(), fake(), fake());
        unwatched_lock.needs.store(true, Ordering::Relaxed);
        w.entries.lock().unwrap().push(entry(&watched, Some(1)));
        assert!(!w.needs_safety(), "a watched feed needs no safety look");
        let now = Instant::now();
        assert!(w.due(&[], false, true, false, now).is_empty());
        w.entries.lock().unwrap().push(entry(&unwatched_dir, None));
        w.entries
            .lock()
            .unwrap()
            .push(entry(&unwatched_lock, Some(1)));
        assert!(w.needs_safety());
        let due = w.due(&[], false, true, false, now);
        let looked: Vec<bool> = due.iter().map(|(_, safety)| *safety).collect();
        assert_eq!(
            looked,
            [true, true],
            "the two that need it, not the watched one"
        );
        for (feed, safety) in w.due(&[], false, false, true, now) {
            assert!(safety, "the backstop looks at every feed");
            feed.look(safety);
        }
        assert_eq!(watched.safety_looks.load(Ordering::Relaxed), 1);
        assert_eq!(unwatched_dir.safety_looks.load(Ordering::Relaxed), 1);
    }
}
