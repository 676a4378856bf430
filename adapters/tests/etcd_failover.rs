//! VVMs in separate processes on a real 3-member etcd cluster on loopback: failover after
//! SIGKILL, the loss of one etcd member, and the loss and return of a quorum.
//!
//! Each VVM process is this test binary again, running the ignored test [`etcd_node`] with
//! its configuration in `VVM_ETCD_NODE`. A node reports on stdout, one line each, prefixed with
//! `vvm-node`: `leading <slot> <revision>`, `renewed <slot> <revision>`, `lost <slot> <problem>`,
//! `killed <deadline ns> <observed ns>` (its recording killer fired; production would have
//! exited there, so the node then shuts down and exits), `problem <text>` and `exit`.
//! The tests time-stamp the lines as they arrive.
//!
//! The lease is 10 s (renewals every 2.5 s, retries after 0.5 s, 1 s, then every 2 s, store calls
//! time out after 0.45 s, kill deadline 8 s after a confirmed write's send time); one acquisition
//! poll is 1 s. The cluster runs with etcd's default timing (100 ms heartbeat, 1 s election
//! timeout), as a deployment would.
//! The bounds asserted are correctness bounds with room for scheduling noise: what a stale
//! clock or a lost renewal would break is seconds, not milliseconds.

use vvm_test_support::etcd as etcd_support;

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use vvm_core::VvmConfig;

use vvm_adapters::etcd::cluster::EtcdCluster;
use vvm_adapters::etcd::{EtcdOptions, EtcdStore};
use vvm_runtime::{KillerThread, RecordingKiller, Services, Vvm};

const NODE_ENV: &str = "VVM_ETCD_NODE";
const MARK: &str = "vvm-node ";
const LEASE: Duration = Duration::from_secs(10);
const POLL: Duration = Duration::from_secs(1);
/// A store call waits for a quorum of members that each sync to disk: on two loaded cores that
/// can take longer than the default `L/40` = 250 ms. Just below the retry interval (`L/20`).
const STORE_TIMEOUT: Duration = Duration::from_millis(450);
/// etcd looks for expired leases every 0.5 s.
const LEASE_CHECK_PERIOD: Duration = Duration::from_millis(500);
/// Most lines one test reads from its nodes; a bound against a node that talks forever.
const EVENTS_MAX: usize = 10_000;

// ---------------------------------------------------------------------------------------------
// The node: one VVM in its own process.

/// What a node runs with, passed in `VVM_ETCD_NODE` as `key=value` pairs separated by `;`.
#[derive(Clone, Debug)]
struct NodeSpec {
    endpoints: Vec<String>,
    prefix: String,
    address: String,
    slots: u32,
}

impl NodeSpec {
    fn encode(&self) -> String {
        format!(
            "endpoints={};prefix={};address={};slots={}",
            self.endpoints.join(","),
            self.prefix,
            self.address,
            self.slots
        )
    }

    fn decode(text: &str) -> NodeSpec {
        let fields: BTreeMap<&str, &str> = text
            .split(';')
            .filter_map(|pair| pair.split_once('='))
            .collect();
        let field = |name: &str| {
            *fields
                .get(name)
                .unwrap_or_else(|| panic!("{NODE_ENV} lacks {name}: {text}"))
        };
        NodeSpec {
            endpoints: field("endpoints").split(',').map(str::to_owned).collect(),
            prefix: field("prefix").to_owned(),
            address: field("address").to_owned(),
            slots: field("slots").parse().expect("slots is a number"),
        }
    }
}

fn say(line: &str) {
    println!("{MARK}{line}");
}

/// One VVM process of the tests below, which start it themselves; run directly it fails.
#[test]
#[ignore = "a VVM process of the etcd failover tests; they start it themselves"]
fn etcd_node() {
    let spec = std::env::var(NODE_ENV).unwrap_or_else(|_| {
        panic!("etcd_node only runs as a child of the etcd failover tests ({NODE_ENV} is unset)")
    });
    let spec = NodeSpec::decode(&spec);
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("a runtime");
    runtime.block_on(run_node(spec));
}

async fn run_node(spec: NodeSpec) {
    let recorder = RecordingKiller::new();
    let killer = KillerThread::new(recorder.clone());
    let options = EtcdOptions::new(spec.endpoints.clone())
        .and_then(|options| options.prefix(spec.prefix.clone()))
        .expect("node options are valid");
    let store = EtcdStore::connect(options)
        .await
        .expect("the store connects");
    let config = VvmConfig::builder(spec.address.clone())
        .slots(spec.slots)
        .lease(LEASE)
        .acquisition(Duration::from_secs(120))
        .round_interval(POLL)
        .store_timeout(STORE_TIMEOUT);
    let vvm = Vvm::provide(config, store, Services::new())
        .expect("node configuration is valid")
        .with_killer(killer)
        .launch()
        .await;
    if let Some(problem) = vvm.current_problem() {
        say(&format!("problem {problem}"));
        say("exit");
        return;
    }
    let Some(token) = vvm.token() else {
        say("problem launched without a token");
        return;
    };
    let slot = token.slot.0;
    say(&format!("leading {slot} {}", token.revision.0));
    let mut problem = std::pin::pin!(vvm.problem());
    let mut last = token.revision;
    let lost = loop {
        tokio::select! {
            lost = &mut problem => break lost,
            () = tokio::time::sleep(Duration::from_millis(10)) => {
                if let Some(token) = vvm.token().filter(|token| token.revision != last) {
                    last = token.revision;
                    say(&format!("renewed {slot} {}", token.revision.0));
                }
            }
        }
    };
    say(&format!("lost {slot} {lost}"));
    // The killer fires at the deadline, which is never disarmed; the real one exits there.
    let waited = tokio::task::spawn_blocking(move || recorder.wait_for(1, LEASE * 2)).await;
    match waited.ok().and_then(|reports| reports.first().cloned()) {
        Some(report) => say(&format!(
            "killed {} {}",
            report.deadline.as_nanos(),
            report.observed.as_nanos()
        )),
        None => say("not killed"),
    }
    let _ = tokio::time::timeout(LEASE, vvm.shutdown()).await;
    say("exit");
}

// ---------------------------------------------------------------------------------------------
// The tests' side: starting nodes and reading what they say.

#[derive(Clone, Debug)]
struct Event {
    node: usize,
    at: Instant,
    words: Vec<String>,
}

impl Event {
    fn is(&self, kind: &str) -> bool {
        self.words.first().is_some_and(|word| word == kind)
    }

    fn number(&self, index: usize) -> u64 {
        self.words
            .get(index)
            .and_then(|word| word.parse().ok())
            .unwrap_or_else(|| panic!("event {:?} lacks number {index}", self.words))
    }
}

/// The node processes of one test; all are killed when it ends.
struct Nodes {
    spec: NodeSpec,
    children: Vec<Option<Child>>,
    names: Vec<String>,
    sender: mpsc::Sender<Event>,
    receiver: mpsc::Receiver<Event>,
    history: Vec<Event>,
}

impl Nodes {
    fn new(cluster: &EtcdCluster, prefix: &str, slots: u32) -> Nodes {
        let (sender, receiver) = mpsc::channel();
        let spec = NodeSpec {
            endpoints: cluster.endpoints(),
            prefix: prefix.to_owned(),
            address: String::new(),
            slots,
        };
        Nodes {
            spec,
            children: Vec::new(),
            names: Vec::new(),
            sender,
            receiver,
            history: Vec::new(),
        }
    }

    /// Starts a node; returns its index.
    fn spawn(&mut self, name: &str) -> usize {
        let node = self.children.len();
        let spec = NodeSpec {
            address: format!("{name}.test:7000"),
            ..self.spec.clone()
        };
        let exe = std::env::current_exe().expect("the test binary's path");
        let mut child = Command::new(exe)
            .args([
                "etcd_node",
                "--exact",
                "--ignored",
                "--nocapture",
                "--test-threads=1",
            ])
            .env(NODE_ENV, spec.encode())
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("a node process starts");
        let stdout = child.stdout.take().expect("the node's stdout is piped");
        let sender = self.sender.clone();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().take(EVENTS_MAX) {
                let Ok(line) = line else { break };
                let at = Instant::now();
                // libtest may print its own words before ours on the same line.
                let Some(start) = line.find(MARK) else {
                    continue;
                };
                let words = line[start + MARK.len()..]
                    .split_whitespace()
                    .map(str::to_owned)
                    .collect();
                if sender.send(Event { node, at, words }).is_err() {
                    break;
                }
            }
        });
        self.children.push(Some(child));
        self.names.push(name.to_owned());
        node
    }

    /// Waits for the first event (from now on) that satisfies `wanted`, at most `limit`.
    fn wait(&mut self, limit: Duration, wanted: impl Fn(&Event) -> bool) -> Option<Event> {
        let deadline = Instant::now() + limit;
        while self.history.len() < EVENTS_MAX {
            let left = deadline.checked_duration_since(Instant::now())?;
            let event = self.receiver.recv_timeout(left).ok()?;
            self.history.push(event.clone());
            if wanted(&event) {
                return Some(event);
            }
        }
        None
    }

    /// The first `kind` from `node`, heard already or within `limit`; panics naming what was
    /// awaited after `limit`.
    fn expect(&mut self, node: usize, kind: &str, limit: Duration) -> Event {
        if let Some(heard) = self.events(node, kind).into_iter().next() {
            return heard;
        }
        let name = self.names[node].clone();
        self.wait(limit, |event| event.node == node && event.is(kind))
            .unwrap_or_else(|| {
                panic!(
                    "node {name} did not say {kind:?} within {limit:?}; heard: {:#?}",
                    self.history
                )
            })
    }

    /// Reads every event that arrives within `period`.
    fn drain(&mut self, period: Duration) {
        let _ = self.wait(period, |_| false);
    }

    fn events(&self, node: usize, kind: &str) -> Vec<Event> {
        self.history
            .iter()
            .filter(|event| event.node == node && event.is(kind))
            .cloned()
            .collect()
    }

    fn sigkill(&mut self, node: usize) {
        if let Some(mut child) = self.children[node].take() {
            child.kill().expect("SIGKILL reaches the node");
            child.wait().expect("the killed node is reaped");
        }
    }

    /// Waits (bounded) for a node that said `exit` to end.
    fn reap(&mut self, node: usize) {
        if let Some(mut child) = self.children[node].take() {
            let deadline = Instant::now() + Duration::from_secs(5);
            while matches!(child.try_wait(), Ok(None)) && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(20));
            }
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

impl Drop for Nodes {
    fn drop(&mut self) {
        for child in self.children.iter_mut().filter_map(Option::take) {
            let mut child = child;
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("a runtime")
}

/// Who the store says holds each of `slots` slots: the holder's address.
fn holders(
    runtime: &tokio::runtime::Runtime,
    cluster: &EtcdCluster,
    prefix: &str,
    slots: u32,
) -> Vec<Option<String>> {
    runtime.block_on(async {
        let store = etcd_support::store(cluster, prefix).await;
        let table = vvm_runtime::discovery::leaders(&store, slots, Duration::from_secs(2))
            .await
            .expect("the store answers");
        table
            .into_iter()
            .map(|row| row.holder.map(|(value, _)| value.address))
            .collect()
    })
}

// ---------------------------------------------------------------------------------------------
// The tests.

// covers: Et.Failover
#[test]
fn a_second_vvm_takes_over_within_1_10_lease_plus_one_poll_after_sigkill() {
    let test = "a_second_vvm_takes_over_within_1_10_lease_plus_one_poll_after_sigkill";
    let runtime = runtime();
    let Some(cluster) = runtime.block_on(etcd_support::three_steady(test)) else {
        return;
    };
    let mut nodes = Nodes::new(&cluster, "failover/", 1);
    let a = nodes.spawn("a");
    let leading = nodes.expect(a, "leading", LEASE);
    assert_eq!(leading.number(1), 1);
    let b = nodes.spawn("b");
    // Kill right after a confirmed renewal: the record then lives longest, the worst case.
    let renewed = nodes.expect(a, "renewed", LEASE);
    nodes.sigkill(a);
    let killed_at = Instant::now();
    assert!(
        nodes.events(b, "leading").is_empty(),
        "b led while a held the slot"
    );

    let taken = nodes.expect(b, "leading", LEASE * 2);
    let failover = taken.at.duration_since(killed_at);
    let bound = LEASE.mul_f64(1.10) + POLL;
    eprintln!("failover after SIGKILL: {failover:?} (bound {bound:?})");
    assert!(
        failover <= bound,
        "failover took {failover:?}, more than 1.10·L + one poll = {bound:?}"
    );
    assert!(
        failover >= LEASE - (killed_at - renewed.at) - LEASE / 20,
        "b took over after {failover:?}, before a's lease could have ended"
    );
    assert!(
        taken.number(2) > renewed.number(2),
        "the fencing token increases across holders"
    );
    assert_eq!(
        holders(&runtime, &cluster, "failover/", 1),
        vec![Some("b.test:7000".to_owned())]
    );
}

// covers: Et.MemberLoss
#[test]
fn killing_one_etcd_member_does_not_lose_leadership() {
    let test = "killing_one_etcd_member_does_not_lose_leadership";
    let runtime = runtime();
    let Some(mut cluster) = runtime.block_on(etcd_support::three_steady(test)) else {
        return;
    };
    let mut nodes = Nodes::new(&cluster, "member/", 1);
    let a = nodes.spawn("a");
    nodes.expect(a, "leading", LEASE);
    nodes.expect(a, "renewed", LEASE);

    // The etcd leader, the member whose loss hurts most: writes wait for a new election.
    let member = runtime
        .block_on(cluster.leader())
        .expect("the cluster has a leader");
    cluster.kill(member).expect("the member is killed");
    let killed_at = Instant::now();
    // A whole lease later the VVM still leads and has renewed on the remaining members. How many
    // renewals fit in that lease depends on how long the election and the client's reconnection
    // take on a loaded machine (each failed attempt backs off L/20, L/10, L/5), so the check is
    // what the user sees: no loss, no kill, and renewals confirmed again in the lease's second
    // half, after any outage the kill deadline tolerates.
    nodes.drain(LEASE);
    let renewed_after: Vec<Duration> = nodes
        .events(a, "renewed")
        .into_iter()
        .filter(|event| event.at > killed_at)
        .map(|event| event.at.duration_since(killed_at))
        .collect();
    eprintln!("renewals after the member died, at: {renewed_after:?}");
    assert!(
        nodes.events(a, "lost").is_empty(),
        "leadership was lost: {:#?}",
        nodes.history
    );
    assert!(
        nodes.events(a, "killed").is_empty(),
        "the killer fired: {:#?}",
        nodes.history
    );
    assert!(
        renewed_after.iter().any(|after| *after >= LEASE / 2),
        "no renewal confirmed in the second half of the lease after the member died: {renewed_after:?}"
    );

    cluster.restart(member).expect("the member restarts");
    runtime
        .block_on(cluster.wait_healthy(etcd_support::START_LIMIT))
        .expect("the member rejoins");
    let rejoined_at = Instant::now();
    nodes.drain(LEASE / 2);
    assert!(
        nodes.events(a, "lost").is_empty(),
        "leadership was lost after the member returned"
    );
    assert!(nodes
        .events(a, "renewed")
        .iter()
        .any(|event| event.at > rejoined_at));
    assert_eq!(
        holders(&runtime, &cluster, "member/", 1),
        vec![Some("a.test:7000".to_owned())]
    );
}

// covers: Et.QuorumLoss
#[test]
fn losing_the_quorum_kills_every_leader_in_time_and_one_per_slot_leads_after_it_returns() {
    let test =
        "losing_the_quorum_kills_every_leader_in_time_and_one_per_slot_leads_after_it_returns";
    let runtime = runtime();
    let Some(mut cluster) = runtime.block_on(etcd_support::three_steady(test)) else {
        return;
    };
    let election_timeout = cluster.options().election_timeout();
    let mut nodes = Nodes::new(&cluster, "quorum/", 2);
    let a = nodes.spawn("a");
    let b = nodes.spawn("b");
    let slot_a = nodes.expect(a, "leading", LEASE).number(1);
    let slot_b = nodes.expect(b, "leading", LEASE).number(1);
    assert_ne!(slot_a, slot_b);
    let c = nodes.spawn("c");
    nodes.expect(a, "renewed", LEASE);
    nodes.expect(b, "renewed", LEASE);

    // Two of three members gone: no write can commit any more.
    let leader = runtime
        .block_on(cluster.leader())
        .expect("the cluster has a leader");
    let other = (0..3).find(|member| *member != leader).unwrap_or(0);
    cluster.kill(leader).expect("the leader is killed");
    cluster.kill(other).expect("a second member is killed");
    let lost_quorum_at = Instant::now();

    for node in [a, b] {
        nodes.expect(node, "lost", LEASE);
        let killed = nodes.expect(node, "killed", LEASE);
        // On the node's own clock: the deadline was at most send + 0.8·L of its last
        // confirmed write, whose record lives at least until send + L.
        let (deadline_ns, observed_ns) = (killed.number(1), killed.number(2));
        let late = Duration::from_nanos(observed_ns.saturating_sub(deadline_ns));
        assert!(
            late < LEASE / 5,
            "node {node}'s killer fired {late:?} after its deadline, when the lease could have ended"
        );
        assert!(
            killed.at.duration_since(lost_quorum_at) < LEASE,
            "the killer fired a lease after the outage began"
        );
        nodes.expect(node, "exit", LEASE);
        nodes.reap(node);
    }
    assert!(
        nodes.events(c, "leading").is_empty(),
        "c led without a quorum"
    );

    cluster.restart(leader).expect("the member restarts");
    cluster.restart(other).expect("the member restarts");
    runtime
        .block_on(cluster.wait_healthy(etcd_support::START_LIMIT))
        .expect("the quorum returns");
    let returned_at = Instant::now();
    // Supervisors restart the killed processes; c waited all along.
    let a2 = nodes.spawn("a2");
    let b2 = nodes.spawn("b2");

    // A new etcd leader extends every lease by its election timeout, and etcd looks for expired
    // leases every 0.5 s: both add to L + one poll.
    let bound = LEASE + POLL + election_timeout + LEASE_CHECK_PERIOD + LEASE / 10;
    let mut led: BTreeMap<u64, Vec<usize>> = BTreeMap::new();
    while led.len() < 2 {
        let event = nodes
            .wait(bound.saturating_sub(returned_at.elapsed()), |event| {
                event.is("leading")
            })
            .unwrap_or_else(|| panic!("not every slot led again within {bound:?}: {led:?}"));
        led.entry(event.number(1)).or_default().push(event.node);
    }
    eprintln!(
        "every slot led again {:?} after the quorum returned (bound {bound:?})",
        returned_at.elapsed()
    );
    // One more renewal interval: nobody else takes a slot, and the store agrees.
    nodes.drain(LEASE / 4);
    let leaders: Vec<usize> = nodes
        .history
        .iter()
        .filter(|e| e.at > returned_at && e.is("leading"))
        .map(|e| e.node)
        .collect();
    assert_eq!(leaders.len(), 2, "two slots, two leaders: {leaders:?}");
    assert_ne!(leaders[0], leaders[1]);
    for node in [a2, b2, c] {
        assert!(
            nodes.events(node, "lost").is_empty(),
            "node {node} lost a slot it won"
        );
    }
    let table = holders(&runtime, &cluster, "quorum/", 2);
    let expected: Vec<Option<String>> = (1..=2u64)
        .map(|slot| {
            led.get(&slot)
                .and_then(|holders| holders.first())
                .map(|node| format!("{}.test:7000", nodes.names[*node]))
        })
        .collect();
    assert_eq!(
        table, expected,
        "the store names the node that says it leads each slot"
    );
}
