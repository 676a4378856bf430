//! `vvm run --metrics-addr`: `/metrics` (Prometheus text), `/healthz` and `/leader` over a
//! minimal HTTP/1.1 responder.
//!
//! The responder answers one request per connection and closes it. Every connection is bounded:
//! its request head ([`REQUEST_BYTES_MAX`]) must arrive within [`HEAD_TIME_MAX`] of accept (else
//! 408), its answer is written within [`ANSWER_TIME_MAX`], and at most
//! [`CONNECTIONS_MAX`](admit::CONNECTIONS_MAX) are open at once; at the cap the oldest one still
//! waiting for its head is closed to make room (see [`admit`]). Each runs in its own task, so a
//! slow or idle client holds only its own connection, and only briefly. Nothing here touches the
//! kill path: the state it answers from is a copy ([`OpsState`]) that the host refreshes, and the
//! metrics are rendered from the recorder's handle.

mod admit;

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use metrics_exporter_prometheus::{Matcher, PrometheusBuilder, PrometheusHandle};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use vvm::{
    time::{Clock, TimeSource},
    Launched, Phase, Vvm,
};

use admit::Admission;

/// Port of `--metrics-addr` when only a port is given.
pub const METRICS_PORT_DEFAULT: u16 = 9464;

/// Longest request head (request line and headers) read; a longer one gets 400.
pub const REQUEST_BYTES_MAX: usize = 8 * 1024;

/// Longest time from accept to the end of the request head; a slower client gets 408. A probe
/// sends its head in one packet, so this only ever cuts clients that dribble or idle.
pub const HEAD_TIME_MAX: Duration = Duration::from_secs(1);

/// Longest time spent writing one answer; a client that does not read is dropped.
pub const ANSWER_TIME_MAX: Duration = Duration::from_secs(2);

/// Bucket bounds of the store-call latency histogram, in seconds.
const STORE_CALL_BUCKETS_SECONDS: [f64; 14] = [
    0.000_5, 0.001, 0.002_5, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
];

/// `--metrics-addr`: `PORT` or `:PORT` mean loopback (`127.0.0.1:PORT`); `IP:PORT` is taken as
/// given, any interface included (an operator's choice: the endpoints have no authentication).
pub fn parse_metrics_addr(text: &str) -> Result<SocketAddr, String> {
    let port_only = text.strip_prefix(':').unwrap_or(text);
    if let Ok(port) = port_only.parse::<u16>() {
        return Ok(SocketAddr::from(([127, 0, 0, 1], port)));
    }
    text.parse::<SocketAddr>().map_err(|_| {
        format!("`{text}` is not PORT, :PORT or IP:PORT (e.g. {METRICS_PORT_DEFAULT}, 127.0.0.1:{METRICS_PORT_DEFAULT}, [::1]:{METRICS_PORT_DEFAULT})")
    })
}

/// [`OpsState`]'s command state: it runs.
const COMMAND_RUNS: u8 = 1;
/// [`OpsState`]'s command state: it is stopped.
const COMMAND_STOPPED: u8 = 2;

/// What the endpoints answer from: a copy of the VVM's state that the host refreshes (see
/// [`OpsState::update`]), judged against the current time when a request comes.
#[derive(Debug)]
pub struct OpsState {
    /// Leadership held and not lost, services starting or running.
    holding: AtomicBool,
    /// `holding`, and the services started: the VVM acts while its kill deadline is ahead.
    running: AtomicBool,
    /// The kill deadline in nanoseconds of [`Clock`]; `u64::MAX` when none is armed.
    deadline_ns: AtomicU64,
    /// How long past the kill deadline a process that still holds leadership is reported
    /// healthy (the renewal interval, L/4).
    grace: Duration,
    /// In `vvm run -- CMD`: [`COMMAND_RUNS`] or [`COMMAND_STOPPED`] (job control); 0 without a
    /// command.
    command: std::sync::atomic::AtomicU8,
}

impl OpsState {
    /// A state that holds nothing yet, for a VVM whose lease is `lease`.
    pub fn new(lease: Duration) -> Self {
        OpsState {
            holding: AtomicBool::new(false),
            running: AtomicBool::new(false),
            deadline_ns: AtomicU64::new(u64::MAX),
            grace: lease / 4,
            command: std::sync::atomic::AtomicU8::new(0),
        }
    }

    /// Copies what the endpoints need from `vvm`.
    pub fn update(&self, vvm: &Vvm<Launched>) {
        let phase = vvm.phase();
        let deadline = vvm.kill_deadline();
        let holding = !vvm.is_lost()
            && deadline.is_some()
            && matches!(phase, Phase::StartingServices | Phase::Running);
        self.deadline_ns.store(
            deadline.map_or(u64::MAX, |at| at.as_nanos()),
            Ordering::SeqCst,
        );
        self.running
            .store(holding && phase == Phase::Running, Ordering::SeqCst);
        self.holding.store(holding, Ordering::SeqCst);
    }

    /// Whether the command of `vvm run -- CMD` is stopped (SIGSTOP, SIGTTIN, SIGTTOU): such a
    /// process leads but does no work, so `/healthz` fails and `vvm_command_stopped` is 1.
    pub fn set_command_stopped(&self, stopped: bool) {
        let state = if stopped {
            COMMAND_STOPPED
        } else {
            COMMAND_RUNS
        };
        self.command.store(state, Ordering::SeqCst);
    }

    /// `Some(stopped)` in `vvm run -- CMD`, `None` without a command.
    fn command_stopped(&self) -> Option<bool> {
        match self.command.load(Ordering::SeqCst) {
            0 => None,
            state => Some(state == COMMAND_STOPPED),
        }
    }

    /// The VVM is shutting down: it acts no more and holds nothing worth a health check.
    pub fn stopping(&self) {
        self.running.store(false, Ordering::SeqCst);
        self.holding.store(false, Ordering::SeqCst);
    }

    /// Services running under a kill deadline still ahead.
    fn acting(&self, now_ns: u64) -> bool {
        self.running.load(Ordering::SeqCst) && now_ns < self.deadline_ns.load(Ordering::SeqCst)
    }

    /// Like client-go's leader-election health check: healthy unless leadership is held and the
    /// kill deadline passed more than the grace ago (the process should have ended then).
    fn healthy(&self, now_ns: u64) -> bool {
        if !self.holding.load(Ordering::SeqCst) {
            return true;
        }
        let grace_ns = u64::try_from(self.grace.as_nanos()).unwrap_or(u64::MAX);
        let deadline = self.deadline_ns.load(Ordering::SeqCst);
        now_ns < deadline.saturating_add(grace_ns)
    }
}

/// The endpoint of a running `vvm run`.
pub struct Ops {
    /// The state `/healthz` and `/leader` answer from.
    pub state: Arc<OpsState>,
}

/// Installs the Prometheus recorder, binds `addr` and serves the endpoints on the current
/// runtime for as long as it runs. `slots` are shown as not led until they are.
pub async fn start(addr: SocketAddr, lease: Duration, slots: u32) -> Result<Ops, String> {
    let handle = PrometheusBuilder::new()
        .set_buckets_for_metric(
            Matcher::Full(vvm::metrics::STORE_CALL_DURATION_SECONDS.to_owned()),
            &STORE_CALL_BUCKETS_SECONDS,
        )
        .map_err(|e| format!("metrics: {e}"))?
        .install_recorder()
        .map_err(|e| format!("metrics: {e}"))?;
    vvm::metrics::describe();
    vvm::metrics::campaigning(slots);
    let listener = TcpListener::bind(addr)
        .await
        .map_err(|e| format!("cannot listen on {addr} for --metrics-addr: {e}"))?;
    let bound = listener.local_addr().unwrap_or(addr);
    tracing::info!(addr = %bound, "metrics endpoint listening");
    let state = Arc::new(OpsState::new(lease));
    tokio::spawn(serve(listener, handle, state.clone()));
    Ok(Ops { state })
}

/// Accepts connections and answers each in its own task, at most
/// [`CONNECTIONS_MAX`](admit::CONNECTIONS_MAX) at once.
async fn serve(listener: TcpListener, handle: PrometheusHandle, state: Arc<OpsState>) {
    let admission = Arc::new(Admission::default());
    loop {
        let stream = match listener.accept().await {
            Ok((stream, _)) => stream,
            Err(error) => {
                // Out of descriptors, most likely: wait a little instead of spinning.
                tracing::debug!(error = %vvm::store::ErrorChain(&error), "metrics endpoint: accept failed");
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        let Some(admitted) = admission.admit() else {
            tracing::debug!("metrics endpoint: every place is answering; closing a new one");
            continue;
        };
        let handle = handle.clone();
        let state = state.clone();
        tokio::spawn(async move {
            let admit::Admitted { place, shed } = admitted;
            tokio::select! {
                () = answer(stream, &place, &handle, &state) => {}
                // Shed for a newer connection while still waiting for a head: close it.
                _ = shed => {}
            }
        });
    }
}

/// A response: status line, content type, body.
struct Response {
    status: &'static str,
    content_type: &'static str,
    body: String,
}

impl Response {
    fn text(status: &'static str, body: &str) -> Self {
        Response {
            status,
            content_type: "text/plain; charset=utf-8",
            body: format!("{body}\n"),
        }
    }
}

/// Reads one request head (within [`HEAD_TIME_MAX`]) and writes the answer (within
/// [`ANSWER_TIME_MAX`]).
async fn answer(
    mut stream: TcpStream,
    place: &admit::Place,
    handle: &PrometheusHandle,
    state: &OpsState,
) {
    let read = tokio::time::timeout(HEAD_TIME_MAX, read_head(&mut stream)).await;
    let (response, head_only) = match read {
        Ok(Head::Complete(head)) => respond(&head, handle, state),
        Ok(Head::TooLong) => (
            Response::text("400 Bad Request", "request head too long"),
            false,
        ),
        Ok(Head::Incomplete) => (
            Response::text("400 Bad Request", "incomplete request"),
            false,
        ),
        Ok(Head::Nothing) => return,
        Err(_) => {
            tracing::debug!("metrics endpoint: request head too slow");
            (
                Response::text("408 Request Timeout", "request head too slow"),
                false,
            )
        }
    };
    if !place.answering() {
        return;
    }
    let mut bytes = format!(
        "HTTP/1.1 {}\r\nContent-Type: {}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        response.status,
        response.content_type,
        response.body.len()
    )
    .into_bytes();
    if !head_only {
        bytes.extend_from_slice(response.body.as_bytes());
    }
    let written = tokio::time::timeout(ANSWER_TIME_MAX, async {
        let _ = stream.write_all(&bytes).await;
        let _ = stream.shutdown().await;
    })
    .await;
    if written.is_err() {
        tracing::debug!("metrics endpoint: answer not taken in time");
    }
}

/// What reading a request head gave.
enum Head {
    /// The head, up to and including its empty line.
    Complete(Vec<u8>),
    /// More than [`REQUEST_BYTES_MAX`] without an empty line.
    TooLong,
    /// The client closed (or failed) part way.
    Incomplete,
    /// The client closed without sending anything.
    Nothing,
}

/// Reads until the end of the request head, at most [`REQUEST_BYTES_MAX`].
async fn read_head(stream: &mut TcpStream) -> Head {
    let mut head = Vec::with_capacity(1024);
    let mut chunk = [0u8; 1024];
    loop {
        if let Some(end) = head_end(&head) {
            head.truncate(end);
            return Head::Complete(head);
        }
        if head.len() >= REQUEST_BYTES_MAX {
            return Head::TooLong;
        }
        match stream.read(&mut chunk).await {
            Ok(0) | Err(_) if head.is_empty() => return Head::Nothing,
            Ok(0) | Err(_) => return Head::Incomplete,
            Ok(read) => head.extend_from_slice(&chunk[..read]),
        }
    }
}

/// Where the request head ends (after its empty line), if it has.
fn head_end(bytes: &[u8]) -> Option<usize> {
    let crlf = bytes
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .map(|i| i + 4);
    let lf = bytes.windows(2).position(|w| w == b"\n\n").map(|i| i + 2);
    match (crlf, lf) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    }
}

/// The answer to the request head `head`, and whether only the head is to be sent (`HEAD`).
fn respond(head: &[u8], handle: &PrometheusHandle, state: &OpsState) -> (Response, bool) {
    let bad = |why: &str| (Response::text("400 Bad Request", why), false);
    let Ok(head) = std::str::from_utf8(head) else {
        return bad("request is not UTF-8");
    };
    let line = head.lines().next().unwrap_or_default();
    let mut parts = line.split(' ');
    let (Some(method), Some(target), Some(version), None) =
        (parts.next(), parts.next(), parts.next(), parts.next())
    else {
        return bad("malformed request line");
    };
    if !version.starts_with("HTTP/1.") || !target.starts_with('/') {
        return bad("malformed request line");
    }
    let head_only = match method {
        "GET" => false,
        "HEAD" => true,
        _ => {
            return (
                Response::text("405 Method Not Allowed", "GET or HEAD"),
                false,
            )
        }
    };
    let path = target.split('?').next().unwrap_or(target);
    let now_ns = Clock.now().as_nanos();
    let response = match path {
        "/metrics" => {
            vvm::metrics::refresh_lease_margin();
            handle.run_upkeep();
            let mut body = handle.render();
            if let Some(stopped) = state.command_stopped() {
                body.push_str(
                    "# HELP vvm_command_stopped 1 while the command of `vvm run -- CMD` is stopped (job control).\n\
                     # TYPE vvm_command_stopped gauge\n",
                );
                body.push_str(&format!("vvm_command_stopped {}\n", u8::from(stopped)));
            }
            Response {
                status: "200 OK",
                content_type: "text/plain; version=0.0.4; charset=utf-8",
                body,
            }
        }
        "/healthz" if state.command_stopped() == Some(true) => Response::text(
            "503 Service Unavailable",
            "the command is stopped (SIGSTOP, SIGTTIN or SIGTTOU): it does no work until SIGCONT",
        ),
        "/healthz" if state.healthy(now_ns) => Response::text("200 OK", "ok"),
        "/healthz" => Response::text(
            "500 Internal Server Error",
            "leadership held past the kill deadline",
        ),
        "/leader" if state.acting(now_ns) => Response::text("200 OK", "leader"),
        "/leader" => Response::text("503 Service Unavailable", "not leader"),
        _ => Response::text("404 Not Found", "not found"),
    };
    (response, head_only)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn metrics_addr_takes_a_port_for_loopback_or_a_full_address() {
        assert_eq!(
            parse_metrics_addr("9464").unwrap(),
            "127.0.0.1:9464".parse().unwrap()
        );
        assert_eq!(
            parse_metrics_addr(":0").unwrap(),
            "127.0.0.1:0".parse().unwrap()
        );
        assert_eq!(
            parse_metrics_addr("0.0.0.0:80").unwrap(),
            "0.0.0.0:80".parse().unwrap()
        );
        assert!(parse_metrics_addr("[::1]:9").is_ok());
        assert!(parse_metrics_addr("localhost").is_err());
        assert!(parse_metrics_addr("70000").is_err());
    }

    #[test]
    fn health_follows_the_kill_deadline_only_while_holding() {
        let state = OpsState::new(Duration::from_secs(4));
        // Nothing held: healthy, not acting.
        assert!(state.healthy(u64::MAX));
        assert!(!state.acting(0));
        state.holding.store(true, Ordering::SeqCst);
        state.running.store(true, Ordering::SeqCst);
        state.deadline_ns.store(10_000_000_000, Ordering::SeqCst);
        assert!(state.acting(9_999_999_999));
        assert!(!state.acting(10_000_000_000));
        // Grace L/4 = 1 s past the deadline.
        assert!(state.healthy(10_999_999_999));
        assert!(!state.healthy(11_000_000_000));
        state.stopping();
        assert!(state.healthy(u64::MAX));
        assert!(!state.acting(0));
    }

    #[test]
    fn head_ends_at_the_first_empty_line() {
        assert_eq!(head_end(b"GET / HTTP/1.1\r\n\r\nrest"), Some(18));
        assert_eq!(head_end(b"GET / HTTP/1.1\n\n"), Some(16));
        assert_eq!(head_end(b"GET / HTTP/1.1\r\nHost: x\r\n"), None);
    }
}
