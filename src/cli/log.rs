//! The binary's standard error: log lines that can neither panic nor block the runtime.
//!
//! tracing-subscriber's writer for `std::io::stderr` writes on the logging thread itself, so a
//! stalled reader (a full pipe) blocks whichever task logs, and on a write error the fmt layer
//! reports through `eprintln!`, which panics when standard error is a broken pipe. Here every
//! line is formatted on the logging thread into its own buffer and handed to one writer thread
//! through a bounded queue ([`LINES_QUEUED_MAX`]):
//!
//! - a full queue (the sink stalls) **drops the line** and counts it; the writer reports the
//!   count (`vvm: N log lines dropped`) before the next line it manages to write;
//! - a failed write (a closed pipe: `EPIPE`, since Rust ignores `SIGPIPE`) drops the line; after
//!   a broken pipe nothing more is written;
//! - nothing on this path panics or waits, except [`flush`], which waits a bounded time.

use std::io::Write;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc::{sync_channel, Receiver, SyncSender, TrySendError};
use std::sync::{Arc, Condvar, Mutex, OnceLock, PoisonError};
use std::time::{Duration, Instant};

use tracing_subscriber::fmt::MakeWriter;

/// Most lines waiting for the writer thread; more are dropped.
pub const LINES_QUEUED_MAX: usize = 1024;

/// Longest line kept; the rest of a longer one is cut (a bound on the memory the queue holds).
pub const LINE_BYTES_MAX: usize = 16 * 1024;

/// How long [`flush`] waits for queued lines at most.
pub const FLUSH_WAIT_MAX: Duration = Duration::from_secs(1);

/// Counters shared by the loggers and the writer thread.
#[derive(Debug, Default)]
struct Counters {
    /// Lines dropped and not yet reported.
    dropped: AtomicU64,
    /// Lines accepted into the queue.
    queued: AtomicU64,
    /// Lines the writer has finished with (written or dropped), and its signal.
    done: Mutex<u64>,
    done_changed: Condvar,
}

/// Standard error behind a bounded queue and a writer thread: a [`MakeWriter`] for the fmt layer.
#[derive(Clone, Debug)]
pub struct StderrQueue {
    sender: SyncSender<Vec<u8>>,
    counters: Arc<Counters>,
}

impl StderrQueue {
    /// Starts the writer thread. `None` when it cannot be started.
    fn start() -> Option<StderrQueue> {
        let (sender, receiver) = sync_channel(LINES_QUEUED_MAX);
        let counters = Arc::new(Counters::default());
        let for_thread = counters.clone();
        std::thread::Builder::new()
            .name("vvm-log".into())
            .spawn(move || write_lines(receiver, &for_thread))
            .ok()?;
        Some(StderrQueue { sender, counters })
    }

    /// Queues `line` without waiting; drops and counts it when the queue is full.
    fn push(&self, mut line: Vec<u8>) {
        if line.len() > LINE_BYTES_MAX {
            line.truncate(LINE_BYTES_MAX);
            line.push(b'\n');
        }
        match self.sender.try_send(line) {
            Ok(()) => {
                self.counters.queued.fetch_add(1, Ordering::SeqCst);
            }
            Err(TrySendError::Full(_) | TrySendError::Disconnected(_)) => {
                self.counters.dropped.fetch_add(1, Ordering::Relaxed);
            }
        }
    }

    /// Waits until every line queued so far is written or dropped, at most `limit`.
    fn flush(&self, limit: Duration) {
        let target = self.counters.queued.load(Ordering::SeqCst);
        let until = Instant::now() + limit;
        let mut done = lock(&self.counters.done);
        while *done < target {
            let left = until.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return;
            }
            done = self
                .counters
                .done_changed
                .wait_timeout(done, left)
                .unwrap_or_else(PoisonError::into_inner)
                .0;
        }
    }
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

/// The writer thread: one `write_all` per line to standard error.
fn write_lines(receiver: Receiver<Vec<u8>>, counters: &Counters) {
    let mut broken = false;
    for line in receiver {
        if !broken {
            let dropped = counters.dropped.swap(0, Ordering::Relaxed);
            let mut stderr = std::io::stderr().lock();
            let mut result = Ok(());
            if dropped > 0 {
                let text = own_line(&format!("{dropped} log lines dropped"), "WARN");
                result = stderr.write_all(text.as_bytes());
            }
            result = result.and_then(|()| stderr.write_all(&line));
            if let Err(error) = result {
                // Nobody will read a closed pipe again; other errors may pass.
                broken = error.kind() == std::io::ErrorKind::BrokenPipe;
            }
        }
        *lock(&counters.done) += 1;
        counters.done_changed.notify_all();
    }
}

/// One event's formatted text, queued when the fmt layer is done with it.
#[derive(Debug)]
pub struct QueuedLine<'a> {
    queue: &'a StderrQueue,
    buf: Vec<u8>,
}

impl Write for QueuedLine<'_> {
    fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
        self.buf.extend_from_slice(bytes);
        Ok(bytes.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl Drop for QueuedLine<'_> {
    fn drop(&mut self) {
        if !self.buf.is_empty() {
            self.queue.push(std::mem::take(&mut self.buf));
        }
    }
}

impl<'a> MakeWriter<'a> for StderrQueue {
    type Writer = QueuedLine<'a>;

    fn make_writer(&'a self) -> Self::Writer {
        QueuedLine {
            queue: self,
            buf: Vec::new(),
        }
    }
}

static QUEUE: OnceLock<Option<StderrQueue>> = OnceLock::new();

/// The log lines are JSON (`--log-format json`): the binary's own lines are too.
static JSON_LINES: AtomicBool = AtomicBool::new(false);

/// One line of the binary's own: `vvm: <message>`, or with JSON log lines an object shaped like
/// theirs (`timestamp`, `level`, `fields.message`, `target` `vvm`).
fn own_line(message: &str, level: &str) -> String {
    if !JSON_LINES.load(Ordering::Relaxed) {
        return format!("vvm: {message}\n");
    }
    use tracing_subscriber::fmt::format::Writer;
    use tracing_subscriber::fmt::time::{FormatTime, SystemTime};
    let mut timestamp = String::new();
    let _ = SystemTime.format_time(&mut Writer::new(&mut timestamp));
    let object = serde_json::json!({
        "timestamp": timestamp,
        "level": level,
        "fields": { "message": message },
        "target": "vvm",
    });
    format!("{object}\n")
}

/// The process's queue, started on first use.
fn queue() -> Option<&'static StderrQueue> {
    QUEUE.get_or_init(StderrQueue::start).as_ref()
}

/// The layout of the log lines.
#[derive(clap::ValueEnum, Debug, Clone, Copy, PartialEq, Eq)]
pub enum LogFormat {
    /// One human-readable line per event; coloured only on a terminal without `NO_COLOR`.
    Text,
    /// One JSON object per line: `timestamp`, `level`, `target`, `fields` (the message among
    /// them) and the spans.
    Json,
}

/// The filter of the log lines: `RUST_LOG` when it is set and not empty (its directives, e.g.
/// `warn,vvm_runtime=debug`), otherwise everything at `level` and above.
pub fn filter(
    level: tracing::Level,
    rust_log: Option<&str>,
) -> Result<tracing_subscriber::EnvFilter, String> {
    match rust_log
        .map(str::trim)
        .filter(|directives| !directives.is_empty())
    {
        Some(directives) => tracing_subscriber::EnvFilter::builder()
            .parse(directives)
            .map_err(|e| format!("RUST_LOG `{directives}` is not a valid filter: {e}")),
        None => Ok(tracing_subscriber::EnvFilter::new(
            level.as_str().to_ascii_lowercase(),
        )),
    }
}

/// Whether text lines get colours: only on a terminal, and never when `NO_COLOR` is set to
/// anything but the empty string (<https://no-color.org>).
pub fn colour(terminal: bool, no_color: Option<&std::ffi::OsStr>) -> bool {
    terminal && !matches!(no_color, Some(value) if !value.is_empty())
}

/// Installs the fmt subscriber with `filter` in `format`, writing through the queue.
pub fn init(filter: tracing_subscriber::EnvFilter, format: LogFormat) {
    use std::io::IsTerminal;
    use tracing_subscriber::fmt::writer::BoxMakeWriter;
    let writer = match queue() {
        Some(queue) => BoxMakeWriter::new(queue.clone()),
        // Without a writer thread, no logging at all rather than logging that may block.
        None => BoxMakeWriter::new(std::io::sink),
    };
    let ansi = colour(
        std::io::stderr().is_terminal(),
        std::env::var_os("NO_COLOR").as_deref(),
    );
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(writer)
        .log_internal_errors(false);
    // `try_init`: a subscriber installed already (none is, in the binary) is kept.
    JSON_LINES.store(format == LogFormat::Json, Ordering::Relaxed);
    let _ = match format {
        LogFormat::Text => builder.with_ansi(ansi).try_init(),
        LogFormat::Json => builder.with_ansi(false).json().try_init(),
    };
}

/// Prints one line (`vvm: <message>`, a JSON object at level `ERROR` with JSON log lines) to
/// standard error after the log lines queued before it, then waits up to [`FLUSH_WAIT_MAX`] for
/// it to be written. Never panics; the line is lost when standard error is closed or stays
/// stalled.
pub fn line(message: &str) {
    line_at(message, "ERROR");
}

/// [`line`] at `level` (`"WARN"`, `"ERROR"`) in JSON.
pub fn line_at(message: &str, level: &str) {
    let text = own_line(message, level);
    match QUEUE.get().and_then(Option::as_ref) {
        Some(queue) => {
            queue.push(text.into_bytes());
            queue.flush(FLUSH_WAIT_MAX);
        }
        // Before logging starts (usage errors) nothing else writes: write directly.
        None => {
            let _ = std::io::stderr().write_all(text.as_bytes());
        }
    }
}

/// Whether this process writes its log lines as JSON (`--log-format json`).
pub fn json_lines() -> bool {
    JSON_LINES.load(Ordering::Relaxed)
}

/// Makes this process's own lines JSON objects: the supervisor's, which sets up no logging of
/// its own but follows `vvm`'s `--log-format json` (told by `--json-log`).
pub fn use_json_lines() {
    JSON_LINES.store(true, Ordering::Relaxed);
}

/// Waits up to [`FLUSH_WAIT_MAX`] for the queued log lines, before the process exits.
pub fn flush() {
    if let Some(queue) = QUEUE.get().and_then(Option::as_ref) {
        queue.flush(FLUSH_WAIT_MAX);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn colour_only_on_a_terminal_without_no_color() {
        assert!(colour(true, None));
        assert!(colour(true, Some(std::ffi::OsStr::new(""))));
        assert!(!colour(true, Some(std::ffi::OsStr::new("1"))));
        assert!(!colour(false, None));
    }

    #[test]
    fn rust_log_wins_over_the_level_when_set() {
        let shown = |filter: &tracing_subscriber::EnvFilter| filter.to_string();
        assert_eq!(
            shown(&filter(tracing::Level::DEBUG, None).unwrap()),
            "debug"
        );
        assert_eq!(
            shown(&filter(tracing::Level::DEBUG, Some(" ")).unwrap()),
            "debug"
        );
        assert_eq!(
            shown(&filter(tracing::Level::DEBUG, Some("warn")).unwrap()),
            "warn"
        );
        assert!(filter(tracing::Level::INFO, Some("vvm=notalevel")).is_err());
    }

    #[test]
    fn a_full_queue_drops_and_counts_instead_of_waiting() {
        // No writer thread: nothing drains the queue.
        let (sender, _receiver) = sync_channel(2);
        let queue = StderrQueue {
            sender,
            counters: Arc::new(Counters::default()),
        };
        let started = Instant::now();
        for _ in 0..5 {
            queue.push(b"line\n".to_vec());
        }
        assert!(started.elapsed() < Duration::from_secs(1));
        assert_eq!(queue.counters.queued.load(Ordering::SeqCst), 2);
        assert_eq!(queue.counters.dropped.load(Ordering::SeqCst), 3);
        // Flushing lines nobody writes gives up after its limit.
        let started = Instant::now();
        queue.flush(Duration::from_millis(50));
        assert!(started.elapsed() < Duration::from_secs(1));
    }
}
