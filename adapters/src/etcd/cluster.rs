//! Throw-away etcd clusters on loopback (feature `etcd-cluster`): for tests, benchmarks and
//! demonstrations, never for production data.
//!
//! [`EtcdCluster::start`] runs `members` etcd processes on free ports of 127.0.0.1, each with
//! its own data directory under one fresh temporary directory, and returns once every member
//! answers a linearizable read. Members can be killed (SIGKILL) and restarted on their old data.
//! Dropping the cluster kills every member and removes the directory, also while a test panics.
//! (A process that is itself killed with SIGKILL cannot clean up: its members keep running.)
//!
//! The example is compiled, not run: it needs the `etcd` executable, which the tests that start
//! clusters (`tests/etcd_*.rs`) require and `scripts/test.sh` installs.
//!
//! ```no_run
//! # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
//! use vvm_adapters::etcd::cluster::{ClusterOptions, EtcdCluster};
//! use vvm_adapters::etcd::EtcdStore;
//!
//! let cluster = EtcdCluster::start(ClusterOptions::new(3)?).await?;
//! let store = EtcdStore::connect(cluster.store_options()?).await?;
//! # Ok(()) }
//! ```

use std::fs::File;
use std::net::{Ipv4Addr, TcpListener};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use etcd_client::{Client, ConnectOptions};

use super::{EtcdError, EtcdOptions};

/// Most members of one cluster.
pub const MEMBERS_MAX: usize = 7;
/// How often a cluster start is retried with fresh ports when a member cannot bind its own.
const START_ATTEMPTS_MAX: u32 = 3;
/// Pause between two health probes.
const PROBE_INTERVAL: Duration = Duration::from_millis(50);
/// Bound of one health probe.
const PROBE_TIMEOUT: Duration = Duration::from_millis(500);
/// How much of a member's log an error quotes.
const LOG_TAIL_BYTES: usize = 2048;

/// Why a cluster could not be started or changed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ClusterError {
    /// The `etcd` executable was not found on `PATH`.
    #[error("the etcd executable was not found on PATH (Debian: apt-get install etcd-server)")]
    NotInstalled,
    /// The number of members is zero or above [`MEMBERS_MAX`].
    #[error("a cluster has 1 to {max} members, not {members}")]
    Members {
        /// The number asked for.
        members: usize,
        /// [`MEMBERS_MAX`].
        max: usize,
    },
    /// A timing value is zero, or the election timeout is not above the heartbeat interval.
    #[error("bad cluster timing: {0}")]
    Timing(&'static str),
    /// No member with this index.
    #[error("the cluster has no member {0}")]
    NoMember(usize),
    /// The member is not running (when it should) or running (when it should not).
    #[error("member {member} is {state}")]
    MemberState {
        /// The member's index.
        member: usize,
        /// What it is.
        state: &'static str,
    },
    /// A file or process operation failed.
    #[error("{what} failed")]
    Io {
        /// What was being done.
        what: String,
        /// The error.
        source: std::io::Error,
    },
    /// A member exited on its own.
    #[error("etcd member {member} exited during start-up; end of its log:\n{log}")]
    Exited {
        /// The member's index.
        member: usize,
        /// The end of its log.
        log: String,
    },
    /// The members did not become healthy in time.
    #[error("etcd was not healthy within {limit:?}: {what}")]
    NotHealthy {
        /// The bound waited.
        limit: Duration,
        /// What the last probe found, e.g. "member etcd-1 did not answer".
        what: String,
        /// The client's error, if the probe got one.
        #[source]
        source: Option<super::EtcdClientError>,
    },
    /// The options for a store on this cluster were refused.
    #[error(transparent)]
    Options(#[from] EtcdError),
}

/// How to run a cluster.
#[derive(Clone, Debug)]
pub struct ClusterOptions {
    members: usize,
    binary: Option<PathBuf>,
    heartbeat: Duration,
    election_timeout: Duration,
    start_timeout: Duration,
}

impl ClusterOptions {
    /// A cluster of `members` (1 to [`MEMBERS_MAX`]) with a 50 ms heartbeat and a 500 ms
    /// election timeout (etcd's minimum lease TTL is then 0.75 s, below every TTL the etcd
    /// store accepts), started within 20 s.
    pub fn new(members: usize) -> Result<Self, ClusterError> {
        if members == 0 || members > MEMBERS_MAX {
            return Err(ClusterError::Members {
                members,
                max: MEMBERS_MAX,
            });
        }
        Ok(ClusterOptions {
            members,
            binary: None,
            heartbeat: Duration::from_millis(50),
            election_timeout: Duration::from_millis(500),
            start_timeout: Duration::from_secs(20),
        })
    }

    /// Runs this executable instead of `etcd` from `PATH`.
    pub fn binary(mut self, path: impl Into<PathBuf>) -> Self {
        self.binary = Some(path.into());
        self
    }

    /// etcd's heartbeat interval and election timeout (whole milliseconds, election timeout
    /// above the heartbeat).
    pub fn timing(
        mut self,
        heartbeat: Duration,
        election_timeout: Duration,
    ) -> Result<Self, ClusterError> {
        if heartbeat.as_millis() == 0 {
            return Err(ClusterError::Timing("the heartbeat interval is below 1 ms"));
        }
        if election_timeout <= heartbeat {
            return Err(ClusterError::Timing(
                "the election timeout must be above the heartbeat interval",
            ));
        }
        self.heartbeat = heartbeat;
        self.election_timeout = election_timeout;
        Ok(self)
    }

    /// How long a start or restart may take until every running member is healthy.
    pub fn start_timeout(mut self, timeout: Duration) -> Result<Self, ClusterError> {
        if timeout.is_zero() {
            return Err(ClusterError::Timing("the start timeout is zero"));
        }
        self.start_timeout = timeout;
        Ok(self)
    }

    /// The election timeout: how long etcd waits before electing a new leader, and how much
    /// it extends every lease when one takes over.
    pub fn election_timeout(&self) -> Duration {
        self.election_timeout
    }
}

#[derive(Debug)]
struct Member {
    name: String,
    client_port: u16,
    peer_port: u16,
    data_dir: PathBuf,
    log: PathBuf,
    child: Option<Child>,
}

/// A running cluster of etcd processes on loopback; see the [module documentation](self).
#[derive(Debug)]
pub struct EtcdCluster {
    options: ClusterOptions,
    binary: PathBuf,
    root: PathBuf,
    token: String,
    members: Vec<Member>,
}

/// The `etcd` executable on `PATH`, if any.
pub fn find_etcd() -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|dir| dir.join("etcd"))
        .find(|candidate| candidate.is_file())
}

fn free_ports(count: usize) -> Result<Vec<u16>, ClusterError> {
    // All listeners stay open until every port is known, so the ports are distinct; another
    // process may still take one before etcd binds it, which a start retry absorbs.
    let listeners = (0..count)
        .map(|_| TcpListener::bind((Ipv4Addr::LOCALHOST, 0)))
        .collect::<Result<Vec<_>, _>>()
        .map_err(|source| ClusterError::Io {
            what: "finding a free loopback port".into(),
            source,
        })?;
    listeners
        .iter()
        .map(|listener| listener.local_addr().map(|address| address.port()))
        .collect::<Result<Vec<_>, _>>()
        .map_err(|source| ClusterError::Io {
            what: "reading a loopback port".into(),
            source,
        })
}

fn fresh_root() -> Result<PathBuf, ClusterError> {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let base = std::env::temp_dir();
    let mut last = None;
    for _ in 0..16 {
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |elapsed| elapsed.subsec_nanos());
        let name = format!(
            "vvm-etcd-{}-{}-{nanos}",
            std::process::id(),
            COUNTER.fetch_add(1, Ordering::Relaxed)
        );
        let root = base.join(name);
        match std::fs::create_dir(&root) {
            Ok(()) => return Ok(root),
            Err(error) => last = Some(error),
        }
    }
    Err(ClusterError::Io {
        what: format!("creating a directory under {}", base.display()),
        source: last.unwrap_or_else(|| std::io::Error::other("no attempt made")),
    })
}

fn log_tail(path: &Path) -> String {
    let text = std::fs::read(path).unwrap_or_default();
    let start = text.len().saturating_sub(LOG_TAIL_BYTES);
    String::from_utf8_lossy(&text[start..]).into_owned()
}

impl EtcdCluster {
    /// Starts the cluster and waits until every member is healthy. Retries with fresh ports
    /// (at most 3 starts) when a member exits during start-up.
    pub async fn start(options: ClusterOptions) -> Result<EtcdCluster, ClusterError> {
        let binary = match &options.binary {
            Some(binary) => binary.clone(),
            None => find_etcd().ok_or(ClusterError::NotInstalled)?,
        };
        let mut attempt = 1;
        loop {
            let mut cluster = EtcdCluster::create(options.clone(), binary.clone())?;
            let started = cluster.spawn_all();
            let healthy = match started {
                Ok(()) => cluster.wait_healthy(options.start_timeout).await,
                Err(error) => Err(error),
            };
            match healthy {
                Ok(()) => return Ok(cluster),
                Err(ClusterError::Exited { member, log }) if attempt < START_ATTEMPTS_MAX => {
                    tracing::warn!(
                        member,
                        attempt,
                        "an etcd member exited during start-up; retrying on fresh ports\n{log}"
                    );
                    attempt += 1;
                }
                Err(error) => return Err(error),
            }
        }
    }

    fn create(options: ClusterOptions, binary: PathBuf) -> Result<EtcdCluster, ClusterError> {
        let root = fresh_root()?;
        let ports = free_ports(options.members * 2)?;
        let members = (0..options.members)
            .map(|index| Member {
                name: format!("m{index}"),
                client_port: ports[index * 2],
                peer_port: ports[index * 2 + 1],
                data_dir: root.join(format!("m{index}.etcd")),
                log: root.join(format!("m{index}.log")),
                child: None,
            })
            .collect();
        let token = root.file_name().map_or_else(
            || "vvm-etcd".into(),
            |name| name.to_string_lossy().into_owned(),
        );
        Ok(EtcdCluster {
            options,
            binary,
            root,
            token,
            members,
        })
    }

    fn spawn_all(&mut self) -> Result<(), ClusterError> {
        for index in 0..self.members.len() {
            self.spawn(index)?;
        }
        Ok(())
    }

    fn spawn(&mut self, index: usize) -> Result<(), ClusterError> {
        let initial_cluster = self
            .members
            .iter()
            .map(|member| format!("{}=http://127.0.0.1:{}", member.name, member.peer_port))
            .collect::<Vec<_>>()
            .join(",");
        let member = self
            .members
            .get_mut(index)
            .ok_or(ClusterError::NoMember(index))?;
        let log = File::options()
            .create(true)
            .append(true)
            .open(&member.log)
            .map_err(|source| ClusterError::Io {
                what: format!("opening {}", member.log.display()),
                source,
            })?;
        let client_url = format!("http://127.0.0.1:{}", member.client_port);
        let peer_url = format!("http://127.0.0.1:{}", member.peer_port);
        let mut command = Command::new(&self.binary);
        // etcd reads its configuration from ETCD_* variables too; none of the caller's apply.
        for (name, _) in std::env::vars_os() {
            if name.to_string_lossy().starts_with("ETCD_") {
                command.env_remove(name);
            }
        }
        command
            .arg("--name")
            .arg(&member.name)
            .arg("--data-dir")
            .arg(&member.data_dir)
            .args(["--listen-client-urls", &client_url])
            .args(["--advertise-client-urls", &client_url])
            .args(["--listen-peer-urls", &peer_url])
            .args(["--initial-advertise-peer-urls", &peer_url])
            .args(["--initial-cluster", &initial_cluster])
            .args(["--initial-cluster-token", &self.token])
            .args(["--initial-cluster-state", "new"])
            .arg("--heartbeat-interval")
            .arg(self.options.heartbeat.as_millis().to_string())
            .arg("--election-timeout")
            .arg(self.options.election_timeout.as_millis().to_string())
            .args(["--logger", "zap", "--log-outputs", "stderr"])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::from(log));
        let child = command.spawn().map_err(|source| ClusterError::Io {
            what: format!("starting {}", self.binary.display()),
            source,
        })?;
        tracing::debug!(member = index, pid = child.id(), client = %client_url, "etcd member started");
        member.child = Some(child);
        Ok(())
    }

    /// `127.0.0.1:<port>` of every member, running or not.
    pub fn endpoints(&self) -> Vec<String> {
        self.members
            .iter()
            .map(|member| format!("127.0.0.1:{}", member.client_port))
            .collect()
    }

    /// The store URL naming every member, `etcd:127.0.0.1:<port>,...`, for processes that take
    /// one (see `crate::url`).
    pub fn store_url(&self) -> String {
        format!("etcd:{}", self.endpoints().join(","))
    }

    /// Options for an [`EtcdStore`](super::EtcdStore) on every member of this cluster.
    pub fn store_options(&self) -> Result<EtcdOptions, ClusterError> {
        Ok(EtcdOptions::new(self.endpoints())?)
    }

    /// How many members the cluster has.
    pub fn len(&self) -> usize {
        self.members.len()
    }

    /// Whether the cluster has no members (never: a cluster has at least one).
    pub fn is_empty(&self) -> bool {
        self.members.is_empty()
    }

    /// The options the cluster runs with.
    pub fn options(&self) -> &ClusterOptions {
        &self.options
    }

    /// The process id of `member`, while it runs.
    pub fn pid(&self, member: usize) -> Option<u32> {
        self.members.get(member)?.child.as_ref().map(Child::id)
    }

    /// Kills `member` with SIGKILL and waits for it to be gone.
    pub fn kill(&mut self, member: usize) -> Result<(), ClusterError> {
        let entry = self
            .members
            .get_mut(member)
            .ok_or(ClusterError::NoMember(member))?;
        let mut child = entry.child.take().ok_or(ClusterError::MemberState {
            member,
            state: "not running",
        })?;
        kill_child(&mut child).map_err(|source| ClusterError::Io {
            what: format!("killing etcd member {member}"),
            source,
        })?;
        tracing::debug!(member, "etcd member killed");
        Ok(())
    }

    /// Starts a killed `member` again on its data directory. Does not wait for health: with
    /// a quorum still missing it cannot become healthy; call [`wait_healthy`](Self::wait_healthy).
    pub fn restart(&mut self, member: usize) -> Result<(), ClusterError> {
        let entry = self
            .members
            .get(member)
            .ok_or(ClusterError::NoMember(member))?;
        if entry.child.is_some() {
            return Err(ClusterError::MemberState {
                member,
                state: "running",
            });
        }
        self.spawn(member)
    }

    /// Waits until every running member answers a linearizable read (so it has a leader and a
    /// quorum), at most `limit`.
    pub async fn wait_healthy(&mut self, limit: Duration) -> Result<(), ClusterError> {
        let deadline = Instant::now() + limit;
        loop {
            self.check_exits()?;
            let (what, source) = match self.probe().await {
                Ok(()) => return Ok(()),
                Err(failed) => failed,
            };
            if Instant::now() + PROBE_INTERVAL >= deadline {
                return Err(ClusterError::NotHealthy {
                    limit,
                    what,
                    source: Some(super::EtcdClientError(source)),
                });
            }
            tokio::time::sleep(PROBE_INTERVAL).await;
        }
    }

    /// The index of the member that is etcd's leader now, as seen by the first running member.
    pub async fn leader(&self) -> Result<usize, ClusterError> {
        let (index, member) = self
            .members
            .iter()
            .enumerate()
            .find(|(_, member)| member.child.is_some())
            .ok_or(ClusterError::MemberState {
                member: 0,
                state: "not running, as every other member",
            })?;
        let not_healthy =
            |what: String, error: Option<etcd_client::Error>| ClusterError::NotHealthy {
                limit: PROBE_TIMEOUT,
                what,
                source: error.map(super::EtcdClientError),
            };
        let failed = |what: &str| {
            let what = format!("{what} of member {index}");
            move |error| not_healthy(what, Some(error))
        };
        let mut client = connect_one(member.client_port)
            .await
            .map_err(failed("connecting"))?;
        let status = client.status().await.map_err(failed("the status"))?;
        let leader_id = status.leader();
        let members = client
            .member_list()
            .await
            .map_err(failed("the member list"))?;
        let leader_name = members
            .members()
            .iter()
            .find(|m| m.id() == leader_id)
            .map(|m| m.name().to_owned())
            .ok_or_else(|| not_healthy(format!("member {index} knows no leader"), None))?;
        self.members
            .iter()
            .position(|member| member.name == leader_name)
            .ok_or_else(|| not_healthy(format!("leader {leader_name} is not a member"), None))
    }

    fn check_exits(&mut self) -> Result<(), ClusterError> {
        for (index, member) in self.members.iter_mut().enumerate() {
            let Some(child) = member.child.as_mut() else {
                continue;
            };
            if let Ok(Some(_)) = child.try_wait() {
                member.child = None;
                return Err(ClusterError::Exited {
                    member: index,
                    log: log_tail(&member.log),
                });
            }
        }
        Ok(())
    }

    /// `Err((what failed, the client's error))` at the first member that does not answer.
    async fn probe(&self) -> Result<(), (String, etcd_client::Error)> {
        for member in self.members.iter().filter(|member| member.child.is_some()) {
            let mut client = connect_one(member.client_port)
                .await
                .map_err(|error| (format!("connecting to {}", member.name), error))?;
            client
                .get("vvm-health-probe", None)
                .await
                .map_err(|error| (format!("a read from {}", member.name), error))?;
        }
        Ok(())
    }
}

async fn connect_one(port: u16) -> Result<Client, etcd_client::Error> {
    let options = ConnectOptions::new()
        .with_connect_timeout(PROBE_TIMEOUT)
        .with_timeout(PROBE_TIMEOUT)
        .with_require_leader(true);
    Client::connect([format!("127.0.0.1:{port}")], Some(options)).await
}

fn kill_child(child: &mut Child) -> std::io::Result<()> {
    match child.kill() {
        Ok(()) => {}
        // Already exited: reap it below.
        Err(error) if error.kind() == std::io::ErrorKind::InvalidInput => {}
        Err(error) => return Err(error),
    }
    child.wait().map(|_| ())
}

impl Drop for EtcdCluster {
    fn drop(&mut self) {
        for member in &mut self.members {
            if let Some(mut child) = member.child.take() {
                if let Err(error) = kill_child(&mut child) {
                    tracing::warn!(member = %member.name, error = %vvm_runtime::ErrorChain(&error), "could not kill an etcd member");
                }
            }
        }
        if let Err(error) = std::fs::remove_dir_all(&self.root) {
            tracing::warn!(root = %self.root.display(), error = %vvm_runtime::ErrorChain(&error), "could not remove the etcd data directory");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bad_cluster_options_are_refused() {
        assert!(matches!(
            ClusterOptions::new(0),
            Err(ClusterError::Members { .. })
        ));
        assert!(matches!(
            ClusterOptions::new(MEMBERS_MAX + 1),
            Err(ClusterError::Members { .. })
        ));
        let options = ClusterOptions::new(3).unwrap();
        assert!(matches!(
            options
                .clone()
                .timing(Duration::from_millis(100), Duration::from_millis(100)),
            Err(ClusterError::Timing(_))
        ));
        assert!(matches!(
            options
                .clone()
                .timing(Duration::ZERO, Duration::from_millis(100)),
            Err(ClusterError::Timing(_))
        ));
        assert!(matches!(
            options.start_timeout(Duration::ZERO),
            Err(ClusterError::Timing(_))
        ));
    }

    #[test]
    fn free_ports_are_distinct() {
        let mut ports = free_ports(6).unwrap();
        ports.sort_unstable();
        ports.dedup();
        assert_eq!(ports.len(), 6);
    }
}
