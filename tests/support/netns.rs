//! A private network for the partition tests: one Linux network namespace per node, each joined
//! by a veth pair to a bridge of its own, all made by the test and removed when the value is
//! dropped (also when the test panics): every process left in the namespaces is killed, the
//! namespaces and the bridge are deleted. Names carry the test process's id, so that runs side
//! by side never meet, and a run that was killed before it could clean up is swept by the next
//! one (its namespaces and bridge, once its process is gone).
//!
//! The addresses (`10.77.0.0/24`) exist only inside these namespaces: the host's own network is
//! never touched.
//!
//! Faults are routes: a `blackhole` route in node A's namespace to node B's address drops what
//! A sends to B — one direction of the link, B's packets still reach A. That is how replies are
//! cut while requests land, and two such routes make a partition. Only `ip` is needed:
//! `tc netem` and `tc` actions are not in every kernel (this machine's has neither
//! `CONFIG_NET_SCH_NETEM` nor `CONFIG_NET_CLS_ACT`), nor are `iptables` or `nft` installed
//! everywhere; routes are in every kernel with network namespaces.
#![allow(dead_code)]

use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};

/// Where every namespace name of these tests begins: `vvmj-<pid>-<n>-<node>`.
const NS_PREFIX: &str = "vvmj-";
/// Where every interface name of these tests begins: `vj<pid in hex>-<n><kind><index>` (at most
/// 15 bytes, the kernel's limit).
const IF_PREFIX: &str = "vj";
/// The network inside the namespaces.
const SUBNET: &str = "10.77.0";

static LABS: AtomicUsize = AtomicUsize::new(0);

/// Runs `program` with `args`; its standard error when it fails.
pub fn run(program: &str, args: &[&str]) -> Result<String, String> {
    let output = Command::new(program)
        .args(args)
        .stdin(Stdio::null())
        .output()
        .map_err(|e| format!("{program} {}: {e}", args.join(" ")))?;
    if output.status.success() {
        Ok(String::from_utf8_lossy(&output.stdout).into_owned())
    } else {
        Err(format!(
            "{program} {}: {}: {}",
            args.join(" "),
            output.status,
            String::from_utf8_lossy(&output.stderr).trim()
        ))
    }
}

fn ip(args: &[&str]) -> Result<String, String> {
    run("ip", args)
}

/// Why namespaces cannot be made here (not root, no `ip`, no `ip netns`), or `None`.
pub fn unavailable() -> Option<String> {
    if !rustix::process::getuid().is_root() {
        return Some("not root (network namespaces need CAP_SYS_ADMIN)".to_owned());
    }
    let probe = format!("{NS_PREFIX}{}-probe", std::process::id());
    if let Err(error) = ip(&["netns", "add", &probe]) {
        return Some(format!("`ip netns` does not work here: {error}"));
    }
    let _ = ip(&["netns", "del", &probe]);
    None
}

/// One node: a namespace with one address.
#[derive(Clone, Debug)]
pub struct Node {
    /// Its namespace.
    pub ns: String,
    /// Its address inside the namespaces.
    pub ip: String,
}

/// The namespaces, the bridge and the routes that cut links.
pub struct Net {
    bridge: String,
    nodes: Vec<Node>,
    /// Blackhole routes in place: (in the namespace of node, to the address of node).
    cuts: Vec<(usize, usize)>,
}

impl Net {
    /// Makes `count` nodes on a fresh bridge, after sweeping what killed runs left.
    pub fn new(count: usize) -> Result<Net, String> {
        assert!(count <= 200, "at most 200 nodes");
        sweep_dead_runs();
        let pid = std::process::id();
        let lab = LABS.fetch_add(1, Ordering::Relaxed);
        let tag = format!("{IF_PREFIX}{pid:x}-{lab}");
        let mut net = Net {
            bridge: format!("{tag}b"),
            nodes: Vec::new(),
            cuts: Vec::new(),
        };
        ip(&["link", "add", &net.bridge, "type", "bridge"])?;
        ip(&["link", "set", &net.bridge, "up"])?;
        for index in 0..count {
            let ns = format!("{NS_PREFIX}{pid}-{lab}-{index}");
            let inside = format!("{tag}v{index}");
            let outside = format!("{tag}p{index}");
            let address = format!("{SUBNET}.{}", index + 1);
            ip(&["netns", "add", &ns])?;
            // Pushed before the rest, so that a failure below still removes it.
            net.nodes.push(Node {
                ns: ns.clone(),
                ip: address.clone(),
            });
            ip(&[
                "link", "add", &inside, "type", "veth", "peer", "name", &outside,
            ])?;
            ip(&["link", "set", &outside, "master", &net.bridge])?;
            ip(&["link", "set", &outside, "up"])?;
            ip(&["link", "set", &inside, "netns", &ns])?;
            ip(&[
                "-n",
                &ns,
                "addr",
                "add",
                &format!("{address}/24"),
                "dev",
                &inside,
            ])?;
            ip(&["-n", &ns, "link", "set", &inside, "up"])?;
            ip(&["-n", &ns, "link", "set", "lo", "up"])?;
        }
        Ok(net)
    }

    /// Node `index`.
    pub fn node(&self, index: usize) -> &Node {
        &self.nodes[index]
    }

    /// `program` to run inside node `index`'s namespace (`ip netns exec`, which execs it: the
    /// child's pid is the program's).
    pub fn command(&self, index: usize, program: impl AsRef<std::ffi::OsStr>) -> Command {
        let mut command = Command::new("ip");
        command
            .args(["netns", "exec", &self.nodes[index].ns])
            .arg(program);
        command
    }

    /// Drops what node `from` sends to node `to` (one direction).
    pub fn drop_sent(&mut self, from: usize, to: usize) -> Result<(), String> {
        if self.cuts.contains(&(from, to)) {
            return Ok(());
        }
        let route = format!("{}/32", self.nodes[to].ip);
        ip(&[
            "-n",
            &self.nodes[from].ns,
            "route",
            "add",
            "blackhole",
            &route,
        ])?;
        self.cuts.push((from, to));
        Ok(())
    }

    /// Cuts the link between `a` and `b` both ways.
    pub fn cut(&mut self, a: usize, b: usize) -> Result<(), String> {
        self.drop_sent(a, b)?;
        self.drop_sent(b, a)
    }

    /// Removes every cut.
    pub fn heal(&mut self) -> Result<(), String> {
        for (from, to) in std::mem::take(&mut self.cuts) {
            let route = format!("{}/32", self.nodes[to].ip);
            ip(&[
                "-n",
                &self.nodes[from].ns,
                "route",
                "del",
                "blackhole",
                &route,
            ])?;
        }
        Ok(())
    }

    /// Whether any link is cut.
    pub fn is_cut(&self) -> bool {
        !self.cuts.is_empty()
    }
}

impl Drop for Net {
    fn drop(&mut self) {
        for node in &self.nodes {
            kill_inside(&node.ns);
            let _ = ip(&["netns", "del", &node.ns]);
        }
        let _ = ip(&["link", "del", &self.bridge]);
    }
}

/// SIGKILLs every process in namespace `ns` (`ip netns pids`): only the test's own processes
/// live there.
fn kill_inside(ns: &str) {
    use rustix::process::{kill_process, Pid, Signal};
    for _ in 0..3 {
        let Ok(pids) = ip(&["netns", "pids", ns]) else {
            return;
        };
        let pids: Vec<i32> = pids
            .split_whitespace()
            .filter_map(|p| p.parse().ok())
            .collect();
        if pids.is_empty() {
            return;
        }
        for pid in pids {
            if let Some(pid) = Pid::from_raw(pid) {
                let _ = kill_process(pid, Signal::KILL);
            }
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
}

/// Removes the namespaces and bridges of runs whose process is gone.
fn sweep_dead_runs() {
    let alive = |pid: u32| std::path::Path::new(&format!("/proc/{pid}")).exists();
    if let Ok(list) = ip(&["netns", "list"]) {
        for name in list
            .lines()
            .filter_map(|line| line.split_whitespace().next())
        {
            let Some(rest) = name.strip_prefix(NS_PREFIX) else {
                continue;
            };
            let pid = rest
                .split('-')
                .next()
                .and_then(|pid| pid.parse::<u32>().ok());
            if pid.is_some_and(|pid| !alive(pid)) {
                kill_inside(name);
                let _ = ip(&["netns", "del", name]);
            }
        }
    }
    if let Ok(links) = ip(&["-o", "link", "show", "type", "bridge"]) {
        for line in links.lines() {
            let Some(name) = line.split(": ").nth(1) else {
                continue;
            };
            let Some(rest) = name.strip_prefix(IF_PREFIX) else {
                continue;
            };
            let pid = rest
                .split('-')
                .next()
                .and_then(|pid| u32::from_str_radix(pid, 16).ok());
            if pid.is_some_and(|pid| !alive(pid)) {
                let _ = ip(&["link", "del", name]);
            }
        }
    }
}
