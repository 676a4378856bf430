//! The lab of `tests/partitions.rs`: a 3-member etcd cluster and `vvm run` hosts in network
//! namespaces (`netns.rs`), the faults applied to them, and the figures of a run. What the
//! hosts' commands do and how it is judged is in `partition_oracle.rs`.
#![allow(dead_code)]

use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::{Child, Stdio};
use std::time::{Duration, Instant};

use rustix::process::{kill_process, Pid, Signal};
use vvm_sim::rng::Rng;

use super::etcd_support;
use super::netns::{self, Net};
use super::partition_oracle::{boottime_ns, ms, register_violations, Oracle, REGISTER};

/// The lease of every host: short, so that rounds are short; etcd's minimum is 1.5 × the
/// election timeout (1 s here), rounded up to whole seconds.
pub const LEASE: Duration = Duration::from_secs(2);
/// The hosts' acquisition round.
pub const ROUND: Duration = Duration::from_millis(200);
/// The members' Raft timing: etcd's defaults, as a deployment would run.
const HEARTBEAT_MS: u64 = 100;
const ELECTION_MS: u64 = 1_000;
/// etcd removes expired leases at checks this far apart.
const LEASE_CHECK: Duration = Duration::from_millis(500);
/// The limit the tests assert for a holder to act after a heal: far above the spec's bound
/// (see `specs/partitions.md`, `Net.Liveness`), which the figures are compared with, so that a
/// loaded machine does not fail the test; a host stuck as a standby fails it.
const LIVENESS_LIMIT: Duration = Duration::from_secs(40);
const MEMBERS: usize = 3;

// ---------------------------------------------------------------------------------------------
// Faults.

/// What a round does to the cluster or the holder.
#[derive(Clone, Debug)]
pub enum Fault {
    /// The holder cut off from every member (both ways).
    IsolateHolder,
    /// One member and the holder on one side, the other two members and every other host on
    /// the other; `leader` when that member was etcd's leader.
    MinorityWithHolder { member: usize, leader: bool },
    /// One member alone; the holder stays with the majority.
    MajorityWithHolder { member: usize, leader: bool },
    /// Every member's packets to the holder dropped; the holder's requests still land.
    CutReplies,
    /// One member SIGKILLed, restarted at the heal.
    KillMember { member: usize, leader: bool },
    /// Two members SIGKILLed (no quorum), restarted at the heal.
    KillQuorum { members: [usize; 2] },
    /// The holder's `vvm` SIGSTOPped past its lease (its command and supervisor run on),
    /// SIGCONT at the heal.
    PauseHolder,
}

/// A fault's kind, for the figures.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum FaultKind {
    IsolateHolder,
    MinorityWithHolder,
    MajorityWithHolder,
    CutReplies,
    KillMember,
    KillQuorum,
    PauseHolder,
}

impl Fault {
    /// A fault chosen by `rng`: a member is etcd's leader half of the time.
    pub fn pick(rng: &mut Rng, lab: &Lab, _holder: usize) -> Fault {
        let leader = lab.leader_member();
        let member = |rng: &mut Rng| match leader {
            Some(leader) if rng.below(2) == 0 => (leader, true),
            _ => {
                let member = rng.below(MEMBERS as u64) as usize;
                (member, Some(member) == leader)
            }
        };
        match rng.below(7) {
            0 => Fault::IsolateHolder,
            1 => {
                let (member, leader) = member(rng);
                Fault::MinorityWithHolder { member, leader }
            }
            2 => {
                let (member, leader) = member(rng);
                Fault::MajorityWithHolder { member, leader }
            }
            3 => Fault::CutReplies,
            4 => {
                let (member, leader) = member(rng);
                Fault::KillMember { member, leader }
            }
            5 => {
                let first = rng.below(MEMBERS as u64) as usize;
                let second = (first + 1 + rng.below(MEMBERS as u64 - 1) as usize) % MEMBERS;
                Fault::KillQuorum {
                    members: [first, second],
                }
            }
            _ => Fault::PauseHolder,
        }
    }

    /// Its kind.
    pub fn kind(&self) -> FaultKind {
        match self {
            Fault::IsolateHolder => FaultKind::IsolateHolder,
            Fault::MinorityWithHolder { .. } => FaultKind::MinorityWithHolder,
            Fault::MajorityWithHolder { .. } => FaultKind::MajorityWithHolder,
            Fault::CutReplies => FaultKind::CutReplies,
            Fault::KillMember { .. } => FaultKind::KillMember,
            Fault::KillQuorum { .. } => FaultKind::KillQuorum,
            Fault::PauseHolder => FaultKind::PauseHolder,
        }
    }
}

/// What one round measured, in nanoseconds from the fault.
#[derive(Clone, Debug)]
pub struct RoundRecord {
    pub fault: Fault,
    /// When the old holder's command showed its last act, if a successor followed.
    pub stop_ns: Option<u64>,
    /// When the successor's command showed its first act.
    pub successor_ns: Option<u64>,
    /// From the heal until a holder acted.
    pub acting_after_heal_ns: u64,
    /// From the heal until every member answered (faults that stopped members).
    pub quorum_after_heal_ns: Option<u64>,
}

/// What [`Lab::pause_whole_host`] saw.
#[derive(Clone, Debug, Default)]
pub struct PauseSeen {
    /// Oracle violations (overlaps, token order).
    pub overlaps: usize,
    /// The paused holder's writes after the pause that the fence refused.
    pub refused: usize,
    /// Writes that landed after a successor's, in the register.
    pub stale_landed: usize,
    /// The sentences.
    pub details: Vec<String>,
}

// ---------------------------------------------------------------------------------------------
// The lab.

/// What a lab runs.
pub struct LabOptions {
    /// How many `vvm run` hosts.
    pub hosts: usize,
    /// How many library hosts besides (a program with a VVM: [`library_main`]).
    ///
    /// [`library_main`]: super::partition_oracle::library_main
    pub library_hosts: usize,
    /// Whether the commands' writes are fenced.
    pub fenced: bool,
    /// Whether `vvm run`'s kernel watchdogs are on (the supervisor's SIGKILL timer at the
    /// deadline and its parent-death signal). Off only for the broken variant: with them, the
    /// kernel ends the tree of a paused host at its deadline (debug builds' fault hook,
    /// `VVM_FAULTS=no-kernel-watchdogs`).
    pub kernel_watchdogs: bool,
}

struct Host {
    name: String,
    /// A library host rather than `vvm run`.
    library: bool,
    node: usize,
    child: Option<Child>,
    log: PathBuf,
    /// Where its log stood when this incarnation started.
    log_offset: u64,
    paused: bool,
    /// Not restarted when it exits (the rotation at the end).
    held_back: bool,
}

/// The namespaces, the members, the hosts and the oracle.
pub struct Lab {
    dir: PathBuf,
    etcd: PathBuf,
    etcdctl: PathBuf,
    vvm: PathBuf,
    members: Vec<Option<Child>>,
    hosts: Vec<Host>,
    oracle: Oracle,
    fenced: bool,
    kernel_watchdogs: bool,
    observer: usize,
    standby_exits: Vec<String>,
    register_from: u64,
    /// Last: dropped after the processes are killed.
    net: Net,
}

impl Lab {
    /// Starts the cluster and the hosts, or says why it cannot (and returns `None`): no etcd,
    /// not root, no `ip netns`. Under CI those are failures.
    pub fn start(test: &str, options: LabOptions) -> Option<Lab> {
        if !etcd_support::available(test) {
            return None;
        }
        if let Some(why) = netns::unavailable() {
            let ci = std::env::var("CI").is_ok_and(|value| value == "true" || value == "1");
            assert!(
                !ci,
                "{test}: {why}; under CI the partition tests must run (as root)"
            );
            etcd_support::skipped(&format!("skipped {test}: {why}"));
            return None;
        }
        let etcd = vvm_adapters::etcd::cluster::find_etcd().expect("etcd is available");
        let etcdctl = etcd
            .parent()
            .map(|dir| dir.join("etcdctl"))
            .filter(|path| path.exists())
            .unwrap_or_else(|| PathBuf::from("etcdctl"));
        let vvm = std::env::var_os("VVM_PARTITION_VVM")
            .map(PathBuf::from)
            .unwrap_or_else(|| PathBuf::from(env!("CARGO_BIN_EXE_vvm")));
        // etcd's data in memory where there is a tmpfs: a disk's syncs would be what is measured.
        let base = Path::new("/dev/shm");
        let base = if base.is_dir() {
            base.to_path_buf()
        } else {
            std::env::temp_dir()
        };
        let stamp = boottime_ns();
        let dir = base.join(format!("vvm-partitions-{}-{stamp}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let host_count = options.hosts + options.library_hosts;
        let net = Net::new(MEMBERS + host_count + 1)
            .unwrap_or_else(|e| panic!("{test}: cannot make the namespaces: {e}"));
        let hosts = (0..host_count)
            .map(|index| Host {
                name: format!("h{index}"),
                library: index >= options.hosts,
                node: MEMBERS + index,
                child: None,
                log: dir.join(format!("h{index}.log")),
                log_offset: 0,
                paused: false,
                held_back: false,
            })
            .collect();
        let mut lab = Lab {
            oracle: Oracle::new(dir.join("oracle.log")),
            dir,
            etcd,
            etcdctl,
            vvm,
            members: (0..MEMBERS).map(|_| None).collect(),
            hosts,
            fenced: options.fenced,
            kernel_watchdogs: options.kernel_watchdogs,
            observer: MEMBERS + host_count,
            standby_exits: Vec::new(),
            register_from: 0,
            net,
        };
        for member in 0..MEMBERS {
            lab.spawn_member(member);
        }
        if let Err(e) = lab.wait_healthy(Duration::from_secs(30)) {
            panic!("{test}: the cluster did not start: {e}");
        }
        for host in 0..host_count {
            lab.spawn_host(host);
        }
        Some(lab)
    }

    fn endpoints(&self) -> String {
        (0..MEMBERS)
            .map(|member| format!("{}:2379", self.net.node(member).ip))
            .collect::<Vec<_>>()
            .join(",")
    }

    fn spawn_member(&mut self, member: usize) {
        let ip = self.net.node(member).ip.clone();
        let cluster = (0..MEMBERS)
            .map(|m| format!("m{m}=http://{}:2380", self.net.node(m).ip))
            .collect::<Vec<_>>()
            .join(",");
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.dir.join(format!("m{member}.log")))
            .unwrap();
        let child = self
            .net
            .command(member, &self.etcd)
            .args(["--name", &format!("m{member}")])
            .arg("--data-dir")
            .arg(self.dir.join(format!("m{member}.etcd")))
            .args(["--listen-client-urls", &format!("http://{ip}:2379")])
            .args(["--advertise-client-urls", &format!("http://{ip}:2379")])
            .args(["--listen-peer-urls", &format!("http://{ip}:2380")])
            .args([
                "--initial-advertise-peer-urls",
                &format!("http://{ip}:2380"),
            ])
            .args(["--initial-cluster", &cluster])
            .args(["--initial-cluster-state", "new"])
            .args(["--initial-cluster-token", "vvm-partitions"])
            .args(["--heartbeat-interval", &HEARTBEAT_MS.to_string()])
            .args(["--election-timeout", &ELECTION_MS.to_string()])
            .stdin(Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .expect("etcd starts");
        self.members[member] = Some(child);
    }

    fn kill_member(&mut self, member: usize) {
        if let Some(mut child) = self.members[member].take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    fn spawn_host(&mut self, index: usize) {
        let url = format!("etcd://{}", self.endpoints());
        let endpoints = self.endpoints();
        let exe = std::env::current_exe().expect("the test binary's path");
        let host = &mut self.hosts[index];
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&host.log)
            .unwrap();
        host.log_offset = log.metadata().unwrap().len();
        if host.library {
            let child = self
                .net
                .command(host.node, exe)
                .args(["library_host", "--exact", "--ignored", "--nocapture"])
                .args(["--test-threads=1", "-q"])
                .env("PARTITION_LOG", &self.oracle.path)
                .env("PARTITION_ENDPOINTS", endpoints)
                .env("PARTITION_FENCE", if self.fenced { "1" } else { "0" })
                .env("PARTITION_ADDRESS", &host.name)
                .stdin(Stdio::null())
                .stdout(log.try_clone().unwrap())
                .stderr(log)
                .spawn()
                .expect("the library host starts");
            host.child = Some(child);
            host.paused = false;
            return;
        }
        let lease = format!("{}s", LEASE.as_secs());
        let round = format!("{}ms", ROUND.as_millis());
        let child = self
            .net
            .command(host.node, &self.vvm)
            .args([
                "--log-level",
                "info",
                "run",
                "--store",
                &url,
                "--lease",
                &lease,
            ])
            .args([
                "--round",
                &round,
                "--grace",
                "300ms",
                "--address",
                &host.name,
            ])
            // The tree is contained by the supervisor alone: `ip netns exec` mounts a sysfs of
            // its own, without the cgroup hierarchy.
            .args(["--containment", "subreaper", "--"])
            .arg(exe)
            .args(["holder_command", "--exact", "--ignored", "--nocapture"])
            .args(["--test-threads=1", "-q"])
            .env("PARTITION_LOG", &self.oracle.path)
            .env("PARTITION_ENDPOINTS", endpoints)
            .env("PARTITION_FENCE", if self.fenced { "1" } else { "0" })
            .env(
                "VVM_FAULTS",
                if self.kernel_watchdogs {
                    ""
                } else {
                    "no-kernel-watchdogs"
                },
            )
            .stdin(Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .expect("vvm starts");
        host.child = Some(child);
        host.paused = false;
    }

    /// `etcdctl` against every member, from the observer's namespace.
    fn etcdctl(&self, args: &[&str]) -> Result<String, String> {
        let output = self
            .net
            .command(self.observer, &self.etcdctl)
            .args(["--endpoints", &self.endpoints()])
            .args(["--dial-timeout=1s", "--command-timeout=3s"])
            .args(args)
            .env("ETCDCTL_API", "3")
            .stdin(Stdio::null())
            .output()
            .map_err(|e| format!("etcdctl: {e}"))?;
        if output.status.success() {
            Ok(String::from_utf8_lossy(&output.stdout).into_owned())
        } else {
            Err(format!(
                "etcdctl {}: {}",
                args.join(" "),
                String::from_utf8_lossy(&output.stderr).trim()
            ))
        }
    }

    /// Waits until every member answers; how long that took.
    fn wait_healthy(&mut self, limit: Duration) -> Result<Duration, String> {
        let started = Instant::now();
        loop {
            self.poll();
            match self.etcdctl(&["endpoint", "health"]) {
                Ok(_) => return Ok(started.elapsed()),
                Err(e) if started.elapsed() > limit => return Err(e),
                Err(_) => std::thread::sleep(Duration::from_millis(100)),
            }
        }
    }

    /// The member that is etcd's leader, when the members say.
    pub fn leader_member(&self) -> Option<usize> {
        let status = self.etcdctl(&["endpoint", "status", "-w", "json"]).ok()?;
        let status: serde_json::Value = serde_json::from_str(&status).ok()?;
        let leader = status.as_array()?.iter().find(|entry| {
            let inner = &entry["Status"];
            inner["leader"].as_u64().is_some() && inner["leader"] == inner["header"]["member_id"]
        })?;
        let endpoint = leader["Endpoint"].as_str()?;
        (0..MEMBERS).find(|m| endpoint.starts_with(&format!("{}:", self.net.node(*m).ip)))
    }

    /// Reads the oracle's log and restarts hosts that exited, noting a standby that gave up.
    fn poll(&mut self) {
        self.oracle.poll();
        for index in 0..self.hosts.len() {
            let host = &mut self.hosts[index];
            let Some(child) = host.child.as_mut() else {
                continue;
            };
            let Ok(Some(status)) = child.try_wait() else {
                continue;
            };
            host.child = None;
            let log = std::fs::read(&host.log).unwrap_or_default();
            let said = String::from_utf8_lossy(&log[host.log_offset as usize..]).into_owned();
            if !said.contains("leadership acquired") {
                let tail: Vec<&str> = said.lines().rev().take(4).collect();
                self.standby_exits.push(format!(
                    "{} exited ({status}) without leading: {}",
                    host.name,
                    tail.into_iter().rev().collect::<Vec<_>>().join(" | ")
                ));
            }
            if !host.held_back {
                self.spawn_host(index);
            }
        }
    }

    fn sleep_polling(&mut self, duration: Duration) {
        let end = Instant::now() + duration;
        while Instant::now() < end {
            self.poll();
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    fn host_index(&self, name: &str) -> usize {
        self.hosts
            .iter()
            .position(|host| host.name == name)
            .unwrap_or_else(|| panic!("no host {name}"))
    }

    fn tails(&self) -> String {
        let mut text = String::new();
        for host in &self.hosts {
            let log = std::fs::read_to_string(&host.log).unwrap_or_default();
            let tail: Vec<&str> = log.lines().rev().take(6).collect();
            let _ = writeln!(text, "--- {}:", host.name);
            for line in tail.into_iter().rev() {
                let _ = writeln!(text, "{line}");
            }
        }
        text
    }

    /// Waits until one host's command has acted for a while; its index and token.
    pub fn wait_for_holder(&mut self, context: &str) -> (usize, u64) {
        let started = Instant::now();
        loop {
            self.poll();
            let now = boottime_ns();
            if let Some(((token, host), tenure)) = self.oracle.acting(now) {
                if tenure.end_ns - tenure.start_ns >= 300_000_000 {
                    return (self.host_index(host), *token);
                }
            }
            if started.elapsed() > LIVENESS_LIMIT {
                panic!(
                    "{context}: no holder acted within {LIVENESS_LIMIT:?}\n{}",
                    self.tails()
                );
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    fn signal_host(&self, index: usize, signal: Signal) {
        if let Some(child) = &self.hosts[index].child {
            let _ = kill_process(Pid::from_raw(child.id() as i32).unwrap(), signal);
        }
    }

    fn apply(&mut self, fault: &Fault, holder: usize) -> Result<(), String> {
        let holder_node = self.hosts[holder].node;
        let all: Vec<usize> = (0..=self.observer).collect();
        let split = |net: &mut Net, side: &[usize]| -> Result<(), String> {
            for a in side {
                for b in all.iter().filter(|b| !side.contains(b)) {
                    net.cut(*a, *b)?;
                }
            }
            Ok(())
        };
        match fault {
            Fault::IsolateHolder => {
                for member in 0..MEMBERS {
                    self.net.cut(holder_node, member)?;
                }
            }
            Fault::MinorityWithHolder { member, .. } => {
                split(&mut self.net, &[*member, holder_node])?
            }
            Fault::MajorityWithHolder { member, .. } => split(&mut self.net, &[*member])?,
            Fault::CutReplies => {
                for member in 0..MEMBERS {
                    self.net.drop_sent(member, holder_node)?;
                }
            }
            Fault::KillMember { member, .. } => self.kill_member(*member),
            Fault::KillQuorum { members } => {
                for member in members {
                    self.kill_member(*member);
                }
            }
            Fault::PauseHolder => {
                self.signal_host(holder, Signal::STOP);
                self.hosts[holder].paused = true;
            }
        }
        Ok(())
    }

    /// Removes every fault: links healed, members restarted, paused hosts continued. Whether
    /// members had to be restarted.
    fn heal(&mut self) -> bool {
        self.net.heal().expect("the routes are removed");
        let mut restarted = false;
        for member in 0..MEMBERS {
            if self.members[member].is_none() {
                self.spawn_member(member);
                restarted = true;
            }
        }
        for index in 0..self.hosts.len() {
            if self.hosts[index].paused {
                self.signal_host(index, Signal::CONT);
                self.hosts[index].paused = false;
            }
        }
        restarted
    }

    /// One round: `fault` for `hold`, then the heal, then until a holder acts.
    pub fn round(
        &mut self,
        context: &str,
        holder: usize,
        token: u64,
        fault: Fault,
        hold: Duration,
    ) -> RoundRecord {
        let holder_name = self.hosts[holder].name.clone();
        let fault_ns = boottime_ns();
        if let Err(e) = self.apply(&fault, holder) {
            self.heal();
            panic!("{context}: cannot apply {fault:?}: {e}");
        }
        self.sleep_polling(hold);
        let restarted = self.heal();
        let heal_ns = boottime_ns();
        let quorum_after_heal_ns = restarted.then(|| {
            if let Err(e) = self.wait_healthy(LIVENESS_LIMIT) {
                panic!("{context}: the cluster did not return: {e}");
            }
            boottime_ns() - heal_ns
        });
        let started = Instant::now();
        let acting_after_heal_ns = loop {
            self.poll();
            let after = self
                .oracle
                .tenures
                .values()
                .filter(|tenure| tenure.end_ns > heal_ns)
                .map(|tenure| tenure.start_ns.max(heal_ns) - heal_ns)
                .min();
            if let Some(after) = after {
                break after;
            }
            if started.elapsed() > LIVENESS_LIMIT {
                panic!(
                    "{context}: after {fault:?} and the heal, no holder acted within {LIVENESS_LIMIT:?}\n{}",
                    self.tails()
                );
            }
            std::thread::sleep(Duration::from_millis(10));
        };
        let old = self.oracle.tenures.get(&(token, holder_name)).copied();
        let successor = self.oracle.successor(token).map(|(_, tenure)| *tenure);
        let (stop_ns, successor_ns) = match (old, successor) {
            (Some(old), Some(next)) => (
                Some(old.end_ns.saturating_sub(fault_ns)),
                Some(next.start_ns.saturating_sub(fault_ns)),
            ),
            _ => (None, None),
        };
        RoundRecord {
            fault,
            stop_ns,
            successor_ns,
            acting_after_heal_ns,
            quorum_after_heal_ns,
        }
    }

    /// Fails on any overlap, token out of order, or stale write in the register since the
    /// last check.
    pub fn check(&mut self, context: &str) {
        self.poll();
        assert!(
            self.standby_exits.is_empty(),
            "{context}: a standby gave up instead of waiting: {:#?}",
            self.standby_exits
        );
        let found = self.oracle.violations();
        assert!(found.is_empty(), "{context}: {found:#?}");
        let landed = self.register(self.register_from);
        let found = register_violations(&landed);
        assert!(found.is_empty(), "{context}: {found:#?}");
        if let Some(((token, _), _)) = self.oracle.acting(boottime_ns()) {
            // The next check reads from the tenure acting now: a write that could land out of
            // order later is its own or a later one's (the full check at the end reads all).
            self.register_from = *token;
        }
    }

    /// The whole register, checked.
    pub fn check_register_all(&mut self, test: &str) {
        let landed = self.register(0);
        let found = register_violations(&landed);
        assert!(found.is_empty(), "{test}: {found:#?}");
        assert!(
            !landed.is_empty(),
            "{test}: no write landed in the register"
        );
    }

    /// The register's writes with tokens from `from_token` on: (revision, token, host), in
    /// etcd's order.
    fn register(&mut self, from_token: u64) -> Vec<(u64, u64, String)> {
        let from = format!("{REGISTER}{from_token:020}");
        let started = Instant::now();
        let text = loop {
            match self.etcdctl(&["get", &from, "--from-key", "-w", "fields"]) {
                Ok(text) => break text,
                Err(e) if started.elapsed() > LIVENESS_LIMIT => {
                    panic!("cannot read the register: {e}")
                }
                Err(_) => std::thread::sleep(Duration::from_millis(200)),
            }
        };
        let mut landed = Vec::new();
        let mut key: Option<String> = None;
        for line in text.lines() {
            if let Some(value) = line.strip_prefix("\"Key\" : ") {
                key = Some(value.trim_matches('"').to_owned());
            } else if let Some(value) = line.strip_prefix("\"ModRevision\" : ") {
                let Some(name) = key.take() else { continue };
                let Some(rest) = name.strip_prefix(REGISTER) else {
                    continue;
                };
                let mut parts = rest.split('/');
                let token: u64 = parts.next().unwrap().parse().unwrap();
                let host = parts.next().unwrap().to_owned();
                landed.push((value.trim().parse().unwrap(), token, host));
            }
        }
        landed.sort();
        landed
    }

    /// Until every host has led once more: the holder gets SIGTERM (it releases the slot) and is
    /// held back until every host led, so that the slot passes to one that has not.
    pub fn rotate(&mut self, test: &str) {
        let mut led = std::collections::BTreeSet::new();
        let started = Instant::now();
        while led.len() < self.hosts.len() {
            let (holder, _) = self.wait_for_holder(&format!("{test}: rotation"));
            assert!(
                started.elapsed() < LIVENESS_LIMIT * 2,
                "{test}: the rotation did not reach every host: {led:?}\n{}",
                self.tails()
            );
            // The host just stopped may still look fresh for a moment.
            if !led.insert(holder) {
                std::thread::sleep(Duration::from_millis(20));
                continue;
            }
            if led.len() == self.hosts.len() {
                break;
            }
            self.hosts[holder].held_back = true;
            self.signal_host(holder, Signal::TERM);
            let started = Instant::now();
            while self.hosts[holder].child.is_some() {
                self.poll();
                assert!(
                    started.elapsed() < LIVENESS_LIMIT,
                    "{test}: {} did not stop after SIGTERM",
                    self.hosts[holder].name
                );
                std::thread::sleep(Duration::from_millis(20));
            }
        }
        for index in 0..self.hosts.len() {
            self.hosts[index].held_back = false;
            if self.hosts[index].child.is_none() {
                self.spawn_host(index);
            }
        }
        self.check(test);
    }

    /// Pauses the holder's whole host — `vvm`, its supervisor and the command, as a paused VM —
    /// for at least `pause` and until a successor acts, then continues the command first and,
    /// 400 ms later, the rest (the order a VM's scheduler may pick). What the oracles saw.
    pub fn pause_whole_host(
        &mut self,
        context: &str,
        holder: usize,
        token: u64,
        pause: Duration,
    ) -> PauseSeen {
        let vvm = self.hosts[holder]
            .child
            .as_ref()
            .expect("the holder runs")
            .id();
        let tree = descendants(vvm);
        // The command is this test binary; the supervisor between (`vvm __exec-guard`) names it
        // among its arguments, so its first one tells them apart.
        let exe = std::env::current_exe().expect("the test binary's path");
        let command = tree
            .iter()
            .copied()
            .find(|pid| {
                std::fs::read(format!("/proc/{pid}/cmdline")).is_ok_and(|line| {
                    line.split(|byte| *byte == 0).next() == Some(exe.as_os_str().as_encoded_bytes())
                })
            })
            .unwrap_or_else(|| panic!("{context}: the holder's command is not among {tree:?}"));
        let signal_all = |pids: &[u32], signal: Signal| {
            for pid in pids {
                let _ = kill_process(Pid::from_raw(*pid as i32).unwrap(), signal);
            }
        };
        let mut everyone = vec![vvm];
        everyone.extend(&tree);
        signal_all(&everyone, Signal::STOP);
        self.hosts[holder].paused = true;
        let stopped_ns = boottime_ns();
        let started = Instant::now();
        loop {
            self.poll();
            let successor_acted = self
                .oracle
                .successor(token)
                .is_some_and(|(_, tenure)| tenure.end_ns - tenure.start_ns >= 300_000_000);
            if successor_acted && started.elapsed() >= pause {
                break;
            }
            if started.elapsed() > LIVENESS_LIMIT {
                signal_all(&everyone, Signal::CONT);
                panic!(
                    "{context}: no successor while the holder was paused\n{}",
                    self.tails()
                );
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        signal_all(&[command], Signal::CONT);
        self.sleep_polling(Duration::from_millis(400));
        signal_all(&everyone, Signal::CONT);
        self.hosts[holder].paused = false;
        self.sleep_polling(Duration::from_secs(1));
        let details = self.oracle.violations();
        let name = self.hosts[holder].name.clone();
        let refused = self
            .oracle
            .refused
            .iter()
            .filter(|(host, t, sent)| *host == name && *t == token && *sent > stopped_ns)
            .count();
        let landed = self.register(0);
        let stale = register_violations(&landed);
        let mut seen = PauseSeen {
            overlaps: details.len(),
            refused,
            stale_landed: stale.len(),
            details,
        };
        seen.details.extend(stale);
        seen
    }
}

impl Drop for Lab {
    fn drop(&mut self) {
        for host in &mut self.hosts {
            if let Some(child) = &mut host.child {
                let _ = child.kill();
            }
        }
        for member in self.members.iter_mut().flatten() {
            let _ = member.kill();
        }
        // The namespaces' own teardown (in `Net`'s drop) kills what is left in them: the
        // supervisors and commands.
        for host in &mut self.hosts {
            if let Some(mut child) = host.child.take() {
                let _ = kill_process(Pid::from_raw(child.id() as i32).unwrap(), Signal::CONT);
                let _ = child.wait();
            }
        }
        for member in self.members.iter_mut() {
            if let Some(mut child) = member.take() {
                let _ = child.wait();
            }
        }
        if std::env::var_os("VVM_PARTITION_KEEP").is_none() {
            let _ = std::fs::remove_dir_all(&self.dir);
        }
    }
}

/// Every descendant of `pid` (from `/proc/<pid>/task/<tid>/children`).
fn descendants(pid: u32) -> Vec<u32> {
    let mut found = Vec::new();
    let mut queue = vec![pid];
    while let Some(parent) = queue.pop() {
        let Ok(tasks) = std::fs::read_dir(format!("/proc/{parent}/task")) else {
            continue;
        };
        for task in tasks.flatten() {
            let children =
                std::fs::read_to_string(task.path().join("children")).unwrap_or_default();
            for child in children.split_whitespace().filter_map(|c| c.parse().ok()) {
                found.push(child);
                queue.push(child);
            }
        }
    }
    found
}

// ---------------------------------------------------------------------------------------------
// The figures.

fn percentile(sorted: &[u64], q: f64) -> u64 {
    if sorted.is_empty() {
        return 0;
    }
    let rank = ((q * sorted.len() as f64).ceil() as usize).clamp(1, sorted.len());
    sorted[rank - 1]
}

fn spread(values: &mut [u64]) -> String {
    if values.is_empty() {
        return "—".to_owned();
    }
    values.sort_unstable();
    format!(
        "{:.0} / {:.0} / {:.0}",
        ms(percentile(values, 0.5)),
        ms(percentile(values, 0.99)),
        ms(*values.last().unwrap())
    )
}

/// The figures of a run, as BENCHMARKS.md shows them.
pub fn report(records: &[RoundRecord], seed: u64, took: Duration, lab: &Lab) -> String {
    let mut text = String::new();
    let _ = writeln!(
        text,
        "partition rounds: {} (seed {seed}), {:.0} s, lease {} s, overlaps 0, stale register writes 0, writes {:?}, refused by the fence {}",
        records.len(),
        took.as_secs_f64(),
        LEASE.as_secs(),
        lab.oracle.writes,
        lab.oracle.refused.len(),
    );
    let _ = writeln!(
        text,
        "| fault | rounds | handed over | old holder's last act, ms after the fault (p50 / p99 / max) | successor's first act (p50 / p99 / max) | a holder acts after the heal (p50 / p99 / max) |"
    );
    let _ = writeln!(text, "|---|---|---|---|---|---|");
    let mut kinds: Vec<FaultKind> = records.iter().map(|r| r.fault.kind()).collect();
    kinds.sort();
    kinds.dedup();
    for kind in kinds {
        let of: Vec<&RoundRecord> = records.iter().filter(|r| r.fault.kind() == kind).collect();
        let mut stops: Vec<u64> = of.iter().filter_map(|r| r.stop_ns).collect();
        let mut next: Vec<u64> = of.iter().filter_map(|r| r.successor_ns).collect();
        let mut live: Vec<u64> = of.iter().map(|r| r.acting_after_heal_ns).collect();
        let leader = of
            .iter()
            .filter(|r| {
                matches!(
                    r.fault,
                    Fault::MinorityWithHolder { leader: true, .. }
                        | Fault::MajorityWithHolder { leader: true, .. }
                        | Fault::KillMember { leader: true, .. }
                )
            })
            .count();
        let name = if leader > 0 {
            format!("{kind:?} ({leader} with etcd's leader)")
        } else {
            format!("{kind:?}")
        };
        let _ = writeln!(
            text,
            "| {name} | {} | {} | {} | {} | {} |",
            of.len(),
            next.len(),
            spread(&mut stops),
            spread(&mut next),
            spread(&mut live)
        );
    }
    let mut quorum: Vec<u64> = records
        .iter()
        .filter_map(|r| r.quorum_after_heal_ns)
        .collect();
    let _ = writeln!(
        text,
        "members answering again after a restart, ms (p50 / p99 / max): {}; bounds: holder stops by 0.8·L = {} ms after its last confirmed renewal, a successor ≈ L = {} ms (+ {} ms election timeout when etcd's leader changed, + {} ms lease check)",
        spread(&mut quorum),
        LEASE.as_millis() * 4 / 5,
        LEASE.as_millis(),
        ELECTION_MS,
        LEASE_CHECK.as_millis()
    );
    text
}
