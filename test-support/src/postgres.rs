//! Real PostgreSQL for the tests: `initdb` into a fresh temporary directory, `postgres` on a
//! free loopback port, as `nobody` when the tests run as root (PostgreSQL refuses to run as
//! root). Every server has a reaper shell whose standard input is a pipe from this process:
//! when the value is dropped, or the test process ends however it ends, the pipe closes and the
//! reaper stops the server (immediate shutdown) and removes its directory.
//!
//! The binaries are looked for on `PATH`, then in `/usr/lib/postgresql/*/bin` (Debian's
//! `postgresql` package). Without them a test prints one line saying it was skipped and why,
//! and returns — except under CI (`CI=true`), where the test command installs PostgreSQL, so
//! their absence is a failure.
//!
//! The superuser is `vvm`, trusted on loopback; the role `vvm_pw` (password `pw-secret`) must
//! give its password (SCRAM); the role `vvm_ro` may log in and nothing more.
//!
//! [`PgServer::start_tls`] starts one with `ssl=on`, its certificate, key and client CA given,
//! and the `pg_hba.conf` lines the test gives instead of the ones above.
#![allow(dead_code)]

use std::io::Write;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

/// How long a start may take until the server answers.
pub const START_LIMIT: Duration = Duration::from_secs(60);
/// The password of role `vvm_pw`.
pub const PASSWORD: &str = "pw-secret";

/// The programs the tests run.
const PROGRAMS: [&str; 4] = ["initdb", "postgres", "pg_isready", "psql"];

/// The directory of `initdb`, `postgres`, `pg_isready` and `psql`, if installed: Debian's
/// newest `/usr/lib/postgresql/*/bin` (its `/usr/bin` has wrappers that need a cluster
/// configuration), else one on `PATH` that has them all.
pub fn find_bin() -> Option<PathBuf> {
    let complete = |dir: &Path| PROGRAMS.iter().all(|program| dir.join(program).is_file());
    let mut versions: Vec<PathBuf> = std::fs::read_dir("/usr/lib/postgresql")
        .into_iter()
        .flatten()
        .filter_map(|entry| Some(entry.ok()?.path().join("bin")))
        .filter(|bin| complete(bin))
        .collect();
    versions.sort();
    versions.pop().or_else(|| {
        let path = std::env::var_os("PATH")?;
        std::env::split_paths(&path).find(|dir| complete(dir))
    })
}

/// Whether PostgreSQL tests may run; prints the skip line when they may not.
/// Panics under CI, where PostgreSQL must be present.
pub fn available(test: &str) -> Option<PathBuf> {
    if let Some(bin) = find_bin() {
        return Some(bin);
    }
    let ci = std::env::var("CI").is_ok_and(|value| value == "true" || value == "1");
    assert!(
        !ci,
        "{test}: PostgreSQL is not installed, and under CI the PostgreSQL tests must run (scripts/test.sh installs postgresql)"
    );
    let _ = writeln!(
        std::io::stderr(),
        "skipped {test}: PostgreSQL is not installed (apt-get install postgresql, or run scripts/test.sh as root)"
    );
    None
}

/// A running server.
pub struct PgServer {
    bin: PathBuf,
    dir: PathBuf,
    port: u16,
    postmaster: Mutex<Option<Child>>,
    /// Serves TLS with the files `server.pem`, `server.key` and `client-ca.pem` of `dir`.
    tls: bool,
    /// Dropping it closes the reaper's standard input.
    reaper: Mutex<Option<(Child, ChildStdin)>>,
}

fn as_root() -> bool {
    rustix::process::getuid().is_root()
}

/// `command` as the server's user: `nobody` under root.
fn server_command(program: &Path) -> Command {
    if as_root() {
        let mut command = Command::new("setpriv");
        command
            .args(["--reuid=nobody", "--regid=nogroup", "--clear-groups", "--"])
            .arg(program);
        command
    } else {
        Command::new(program)
    }
}

fn free_port() -> u16 {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("a loopback port");
    listener.local_addr().expect("its address").port()
}

/// The TLS files of [`PgServer::start_tls`] and the `pg_hba.conf` it uses.
pub struct ServerTls<'a> {
    /// The server's certificate (PEM).
    pub cert: &'a Path,
    /// Its private key (PEM).
    pub key: &'a Path,
    /// The authority of the client certificates it accepts (PEM).
    pub client_ca: &'a Path,
    /// The whole `pg_hba.conf`.
    pub hba: &'a str,
}

impl PgServer {
    /// A started server, or `None` (after the skip line) without PostgreSQL.
    pub fn start(test: &str) -> Option<PgServer> {
        PgServer::start_with(test, None)
    }

    /// A started server that speaks TLS as `tls` says, or `None` (after the skip line)
    /// without PostgreSQL.
    pub fn start_tls(test: &str, tls: &ServerTls<'_>) -> Option<PgServer> {
        PgServer::start_with(test, Some(tls))
    }

    fn start_with(test: &str, tls: Option<&ServerTls<'_>>) -> Option<PgServer> {
        let bin = available(test)?;
        // Short: the Unix socket's path (directory + `/.s.PGSQL.PORT`) must fit in 107 bytes.
        static SERVERS: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
        let dir = std::env::temp_dir().join(format!(
            "vvmpg-{}-{}",
            std::process::id(),
            SERVERS.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
        ));
        std::fs::create_dir_all(&dir).expect("the server's directory");
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o700)).unwrap();
        if as_root() {
            std::os::unix::fs::chown(&dir, Some(65534), Some(65534)).expect("chown to nobody");
        }
        let data = dir.join("data");
        let init = server_command(&bin.join("initdb"))
            .args(["-U", "vvm", "-A", "trust", "-E", "UTF8", "--no-sync", "-D"])
            .arg(&data)
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .output()
            .expect("initdb runs");
        assert!(
            init.status.success(),
            "{test}: initdb failed: {}",
            String::from_utf8_lossy(&init.stderr)
        );
        // Role vvm_pw gives its password; everyone else is trusted on loopback.
        let hba = tls.map_or(
            "local all all trust\n\
             host all vvm_pw 127.0.0.1/32 scram-sha-256\n\
             host all all 127.0.0.1/32 trust\n",
            |tls| tls.hba,
        );
        std::fs::write(data.join("pg_hba.conf"), hba).expect("pg_hba.conf");
        let mut owned = vec![data.join("pg_hba.conf")];
        if let Some(tls) = tls {
            for (from, to) in [
                (tls.cert, "server.pem"),
                (tls.key, "server.key"),
                (tls.client_ca, "client-ca.pem"),
            ] {
                std::fs::copy(from, dir.join(to)).expect("a TLS file of the server");
                // The server refuses a key others may read.
                std::fs::set_permissions(dir.join(to), std::fs::Permissions::from_mode(0o600))
                    .unwrap();
                owned.push(dir.join(to));
            }
        }
        if as_root() {
            for file in owned {
                std::os::unix::fs::chown(file, Some(65534), Some(65534)).unwrap();
            }
        }
        let reaper_script = format!(
            "cat >/dev/null; \
             pid=$(head -n 1 '{data}/postmaster.pid' 2>/dev/null); \
             [ -n \"$pid\" ] && kill -QUIT \"$pid\" 2>/dev/null; \
             for _ in $(seq 50); do [ -e '{data}/postmaster.pid' ] || break; sleep 0.1; done; \
             rm -rf '{dir}'",
            data = data.display(),
            dir = dir.display()
        );
        let mut reaper = Command::new("sh")
            .args(["-c", &reaper_script])
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("the reaper starts");
        let pipe = reaper.stdin.take().expect("the reaper's stdin");
        let server = PgServer {
            bin,
            dir,
            port: free_port(),
            postmaster: Mutex::new(None),
            tls: tls.is_some(),
            reaper: Mutex::new(Some((reaper, pipe))),
        };
        server.run(test);
        server.admin(&format!(
            "CREATE ROLE vvm_pw LOGIN PASSWORD '{PASSWORD}' CREATEDB; \
             GRANT CREATE ON DATABASE postgres TO vvm_pw; \
             CREATE ROLE vvm_ro LOGIN;"
        ));
        Some(server)
    }

    /// One server for the whole test process (each case works in its own schema).
    pub fn shared(test: &str) -> Option<&'static PgServer> {
        static SERVER: OnceLock<Option<PgServer>> = OnceLock::new();
        SERVER.get_or_init(|| PgServer::start(test)).as_ref()
    }

    /// Starts the postmaster and waits until it answers.
    fn run(&self, test: &str) {
        let data = self.dir.join("data");
        let log = std::fs::File::create(self.dir.join("log")).expect("the log file");
        let mut command = server_command(&self.bin.join("postgres"));
        if self.tls {
            for (setting, file) in [
                ("ssl_cert_file", "server.pem"),
                ("ssl_key_file", "server.key"),
                ("ssl_ca_file", "client-ca.pem"),
            ] {
                command
                    .arg("-c")
                    .arg(format!("{setting}={}", self.dir.join(file).display()));
            }
            command.args(["-c", "ssl=on"]);
        }
        let child = command
            .arg("-D")
            .arg(&data)
            .args([
                "-p",
                &self.port.to_string(),
                "-c",
                "listen_addresses=127.0.0.1",
            ])
            .arg("-c")
            .arg(format!("unix_socket_directories={}", self.dir.display()))
            .args([
                "-c",
                "fsync=off",
                "-c",
                "synchronous_commit=off",
                "-c",
                "full_page_writes=off",
                "-c",
                "max_connections=300",
                "-c",
                "shared_buffers=16MB",
            ])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("postgres starts");
        *self.postmaster.lock().unwrap() = Some(child);
        let started = Instant::now();
        loop {
            let ready = Command::new(self.bin.join("pg_isready"))
                .args([
                    "-q",
                    "-h",
                    "127.0.0.1",
                    "-p",
                    &self.port.to_string(),
                    "-U",
                    "vvm",
                ])
                .status()
                .is_ok_and(|status| status.success());
            if ready {
                return;
            }
            let exited = self
                .postmaster
                .lock()
                .unwrap()
                .as_mut()
                .and_then(|child| child.try_wait().ok().flatten());
            assert!(
                exited.is_none(),
                "{test}: PostgreSQL exited ({exited:?}): {}",
                std::fs::read_to_string(self.dir.join("log")).unwrap_or_default()
            );
            assert!(
                started.elapsed() < START_LIMIT,
                "{test}: PostgreSQL did not start: {}",
                std::fs::read_to_string(self.dir.join("log")).unwrap_or_default()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Stops the server (fast shutdown: connections are closed) and waits for it.
    pub fn stop(&self) {
        if let Some(mut child) = self.postmaster.lock().unwrap().take() {
            let _ = Command::new("kill")
                .args(["-INT", &child.id().to_string()])
                .status();
            let _ = child.wait();
        }
    }

    /// Starts the server again after [`stop`](Self::stop), on the same port.
    pub fn restart(&self, test: &str) {
        self.run(test);
    }

    /// The server's processes: the postmaster (from `postmaster.pid`) and its children.
    pub fn pids(&self) -> Vec<i32> {
        let text =
            std::fs::read_to_string(self.dir.join("data/postmaster.pid")).unwrap_or_default();
        let Some(postmaster) = text
            .lines()
            .next()
            .and_then(|line| line.trim().parse::<i32>().ok())
        else {
            return Vec::new();
        };
        let mut pids = vec![postmaster];
        for entry in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
            let Ok(pid) = entry.file_name().to_string_lossy().parse::<i32>() else {
                continue;
            };
            let stat = std::fs::read_to_string(entry.path().join("stat")).unwrap_or_default();
            // `pid (comm) state ppid …`: the fields after the last `)`.
            let ppid = stat
                .rsplit_once(')')
                .and_then(|(_, rest)| rest.split_whitespace().nth(1))
                .and_then(|field| field.parse::<i32>().ok());
            if ppid == Some(postmaster) {
                pids.push(pid);
            }
        }
        pids
    }

    /// Sends `signal` to every process of the server (SIGSTOP pauses it, SIGCONT resumes it).
    pub fn signal_all(&self, signal: rustix::process::Signal) {
        for pid in self.pids() {
            if let Some(pid) = rustix::process::Pid::from_raw(pid) {
                let _ = rustix::process::kill_process(pid, signal);
            }
        }
    }

    /// The loopback port.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// `postgres://USER@127.0.0.1:PORT/postgres?schema=SCHEMA`.
    pub fn url(&self, user: &str, schema: &str) -> String {
        format!(
            "postgres://{user}@127.0.0.1:{}/postgres?schema={schema}",
            self.port
        )
    }

    /// Runs `sql` as the superuser with `psql`, panicking when it fails.
    pub fn admin(&self, sql: &str) -> String {
        let out = Command::new(self.bin.join("psql"))
            .args(["-X", "-q", "-t", "-A", "-v", "ON_ERROR_STOP=1"])
            .args([
                "-h",
                "127.0.0.1",
                "-p",
                &self.port.to_string(),
                "-U",
                "vvm",
                "-d",
                "postgres",
                "-c",
                sql,
            ])
            .output()
            .expect("psql runs");
        assert!(
            out.status.success(),
            "psql {sql:?} failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }
}

impl Drop for PgServer {
    fn drop(&mut self) {
        if let Some((mut reaper, pipe)) = self.reaper.lock().unwrap().take() {
            drop(pipe);
            let _ = reaper.wait();
        }
        if let Some(mut child) = self.postmaster.lock().unwrap().take() {
            let _ = child.wait();
        }
    }
}
