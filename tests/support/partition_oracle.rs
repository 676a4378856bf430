//! What the partition tests' holders do and how it is judged: the command each holder runs
//! (ticks to the oracle's log, fenced writes to the register) and the oracle that reads them.
#![allow(dead_code)]

use std::collections::BTreeMap;
use std::io::{Read, Seek, SeekFrom, Write};
use std::path::PathBuf;
use std::time::Duration;

/// How often a holder's command says it acts.
const TICK: Duration = Duration::from_millis(20);
/// How often it writes to the register, and how long one write may take.
const WRITE_EVERY: Duration = Duration::from_millis(50);
const WRITE_TIMEOUT: Duration = Duration::from_millis(300);
/// A holder counts as acting when it ticked within this.
pub const FRESH: Duration = Duration::from_millis(150);
/// The slot's key in etcd (the store's default prefix, slot 1).
pub const SLOT_KEY: &str = "vvm/slot/1";
/// The register's keys: `jepsen/w/<token, 20 digits>/<host>/<n>`.
pub const REGISTER: &str = "jepsen/w/";

/// `CLOCK_BOOTTIME` in nanoseconds: one clock for every namespace, and the one `vvm` reads.
pub fn boottime_ns() -> u64 {
    let now = rustix::time::clock_gettime(rustix::time::ClockId::Boottime);
    u64::try_from(now.tv_sec).unwrap() * 1_000_000_000 + u64::try_from(now.tv_nsec).unwrap()
}

/// Nanoseconds as milliseconds, for messages and figures.
pub fn ms(ns: u64) -> f64 {
    ns as f64 / 1e6
}

// ---------------------------------------------------------------------------------------------
// The command each holder runs.

/// What every holder runs, `vvm run`'s command or the library host's service: ticks to the
/// oracle's log and writes to the fenced register while `valid()` says its tenure is current.
/// Never returns.
pub struct Acting {
    /// The host's name in the log.
    pub host: String,
    /// Its tenure's token's revision (of `VVM_FENCING_TOKEN`, or of the service's token at its
    /// start).
    pub token: i64,
    /// Whether the register's writes are fenced.
    pub fenced: bool,
    /// etcd's client endpoints.
    pub endpoints: Vec<String>,
    /// The oracle's log.
    pub log: PathBuf,
}

impl Acting {
    /// The settings `PARTITION_*` variables give, with `host` and `token`.
    pub fn from_env(host: String, token: i64) -> Acting {
        Acting {
            host,
            token,
            fenced: var("PARTITION_FENCE") == "1",
            endpoints: var("PARTITION_ENDPOINTS")
                .split(',')
                .map(str::to_owned)
                .collect(),
            log: PathBuf::from(var("PARTITION_LOG")),
        }
    }

    /// Acts until dropped; `valid` is asked before each act.
    pub async fn run(&self, valid: impl Fn() -> bool) {
        let Acting {
            host,
            token,
            fenced,
            endpoints,
            log,
        } = self;
        let (token, fenced) = (*token, *fenced);
        let log = std::fs::OpenOptions::new()
            .append(true)
            .open(log)
            .expect("the oracle's log opens");
        // One write per line: appends of one line are not interleaved between processes.
        let append = |line: String| {
            let _ = (&log).write_all(line.as_bytes());
        };
        let ticks = async {
            loop {
                // The time is read before the question: a tick says "current at or after this
                // instant", even when the process is paused between the two.
                let now = boottime_ns();
                if valid() {
                    append(format!("tick {host} {token} {now}\n"));
                }
                tokio::time::sleep(TICK).await;
            }
        };
        let writes = async {
            use etcd_client::{Compare, CompareOp, ConnectOptions, Txn, TxnOp};
            let options = ConnectOptions::new()
                .with_connect_timeout(WRITE_TIMEOUT)
                .with_timeout(WRITE_TIMEOUT);
            // Connects lazily: no member is asked anything here.
            let client = etcd_client::Client::connect(endpoints, Some(options))
                .await
                .expect("the client is set up");
            let mut kv = client.kv_client();
            for n in 0u64.. {
                if !valid() {
                    tokio::time::sleep(WRITE_EVERY).await;
                    continue;
                }
                let key = format!("{REGISTER}{token:020}/{host}/{n}");
                let put = TxnOp::put(key, "", None);
                // The fence: the slot's key exists and was created at or before this token, so
                // it is this tenure's key (a successor's is created after it was deleted).
                let txn = if fenced {
                    Txn::new()
                        .when([
                            Compare::create_revision(SLOT_KEY, CompareOp::Greater, 0),
                            Compare::create_revision(SLOT_KEY, CompareOp::Less, token + 1),
                        ])
                        .and_then([put])
                } else {
                    Txn::new().and_then([put])
                };
                let sent = boottime_ns();
                let outcome = match tokio::time::timeout(WRITE_TIMEOUT, kv.txn(txn)).await {
                    Ok(Ok(response)) if response.succeeded() => "ok",
                    Ok(Ok(_)) => "refused",
                    _ => "error",
                };
                append(format!("write {host} {token} {outcome} {sent}\n"));
                tokio::time::sleep(WRITE_EVERY).await;
            }
        };
        tokio::join!(ticks, writes);
    }
}

fn var(name: &str) -> String {
    std::env::var(name).unwrap_or_else(|_| {
        panic!("the partition tests' holders run inside their lab ({name} is unset)")
    })
}

/// `vvm run`'s command: acts with the token `vvm` gave it until `vvm` ends it.
pub fn command_main() {
    let token: vvm::FencingToken = var("VVM_FENCING_TOKEN")
        .parse()
        .expect("VVM_FENCING_TOKEN is <slot>:<revision>");
    let token = i64::try_from(token.revision.0).expect("an etcd revision fits an i64");
    let acting = Acting::from_env(var("VVM_ADDRESS"), token);
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a runtime");
    // The command knows nothing of leadership: `vvm` and its supervisor end it.
    runtime.block_on(acting.run(|| true));
}

/// The library host: a program with a VVM on the etcd store whose one service acts while its
/// token is valid (`ServiceContext::token`: not lost, before the kill deadline), with the
/// process-wide killer. It waits for a store that is unavailable, as `vvm run` does, and exits 1
/// when its VVM has a problem (the lab starts it again).
pub fn library_main(lease: Duration, round: Duration) {
    let address = var("PARTITION_ADDRESS");
    let endpoints = var("PARTITION_ENDPOINTS");
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("a runtime");
    runtime.block_on(async move {
        let config = vvm::LeaseConfig::new(lease).expect("the lease is valid");
        let url = format!("etcd://{endpoints}");
        let store = loop {
            match vvm_adapters::open::open(&url, &config).await {
                Ok(store) => break store,
                Err(error) if error.is_unavailable() => {
                    tokio::time::sleep(round).await;
                }
                Err(error) => panic!("library host: {}", vvm::store::ErrorChain(&error)),
            }
        };
        let config = vvm::VvmConfig::builder(address.clone())
            .lease(lease)
            .acquisition(vvm::config::ACQUISITION_FOREVER)
            .round_interval(round);
        let services = vvm::Services::new()
            .with(LibraryService { address })
            .expect("one service");
        let vvm = vvm::Vvm::provide(config, store, services)
            .expect("the configuration is valid")
            .launch()
            .await;
        if let Some(token) = vvm.token() {
            // What the lab looks for to tell a holder from a standby that gave up.
            println!("leadership acquired fencing_token={token}");
        }
        vvm.problem().await;
        let _ = vvm.shutdown().await;
        std::process::exit(1);
    });
}

/// The library host's service.
struct LibraryService {
    address: String,
}

impl vvm::Service for LibraryService {
    fn name(&self) -> std::borrow::Cow<'static, str> {
        "acting".into()
    }

    async fn run(self, mut context: vvm::ServiceContext) -> Result<(), vvm::ServiceError> {
        let Some(token) = context.token() else {
            return Err(vvm::ServiceError::new("no valid token at start"));
        };
        let token = i64::try_from(token.revision.0).expect("a revision fits in i64");
        let acting = Acting::from_env(self.address, token);
        context.ready();
        let mut shutdown = context.shutdown();
        tokio::select! {
            _ = shutdown.requested() => Ok(()),
            () = acting.run(|| context.token().is_some()) => Ok(()),
        }
    }
}

// ---------------------------------------------------------------------------------------------
// The oracle.

/// One tenure as its command showed it.
#[derive(Clone, Copy, Debug)]
pub struct Tenure {
    pub start_ns: u64,
    pub end_ns: u64,
}

/// What the commands appended, read as it grows.
pub struct Oracle {
    /// The log the commands append to.
    pub path: PathBuf,
    offset: u64,
    partial: String,
    /// By (token, host).
    pub tenures: BTreeMap<(u64, String), Tenure>,
    /// Writes by outcome.
    pub writes: BTreeMap<String, u64>,
    /// Writes the fence refused: (host, token, sent ns).
    pub refused: Vec<(String, u64, u64)>,
}

impl Oracle {
    pub fn new(path: PathBuf) -> Oracle {
        std::fs::File::create(&path).expect("the oracle's log is created");
        Oracle {
            path,
            offset: 0,
            partial: String::new(),
            tenures: BTreeMap::new(),
            writes: BTreeMap::new(),
            refused: Vec::new(),
        }
    }

    pub fn poll(&mut self) {
        let mut file = std::fs::File::open(&self.path).expect("the oracle's log opens");
        file.seek(SeekFrom::Start(self.offset)).unwrap();
        let mut text = String::new();
        let read = file.read_to_string(&mut text).unwrap();
        self.offset += read as u64;
        self.partial.push_str(&text);
        let Some(last) = self.partial.rfind('\n') else {
            return;
        };
        let complete: String = self.partial.drain(..=last).collect();
        for line in complete.lines() {
            let fields: Vec<&str> = line.split(' ').collect();
            match fields.as_slice() {
                ["tick", host, token, at] => {
                    let (token, at) = (token.parse().unwrap(), at.parse().unwrap());
                    let tenure =
                        self.tenures
                            .entry((token, (*host).to_owned()))
                            .or_insert(Tenure {
                                start_ns: at,
                                end_ns: at,
                            });
                    tenure.start_ns = tenure.start_ns.min(at);
                    tenure.end_ns = tenure.end_ns.max(at);
                }
                ["write", host, token, outcome, sent] => {
                    *self.writes.entry((*outcome).to_owned()).or_default() += 1;
                    if *outcome == "refused" {
                        let entry = (
                            (*host).to_owned(),
                            token.parse().unwrap(),
                            sent.parse().unwrap(),
                        );
                        self.refused.push(entry);
                    }
                }
                _ => panic!("the oracle's log has a line it cannot read: {line:?}"),
            }
        }
    }

    /// The tenure acting now (ticked within [`FRESH`]).
    pub fn acting(&self, now_ns: u64) -> Option<(&(u64, String), &Tenure)> {
        let fresh = FRESH.as_nanos() as u64;
        self.tenures
            .iter()
            .filter(|(_, tenure)| tenure.end_ns + fresh >= now_ns)
            .max_by_key(|(_, tenure)| tenure.end_ns)
    }

    /// Overlapping tenures and tokens that did not rise with time, as sentences.
    pub fn violations(&self) -> Vec<String> {
        let mut by_start: Vec<(&(u64, String), &Tenure)> = self.tenures.iter().collect();
        by_start.sort_by_key(|(_, tenure)| tenure.start_ns);
        let mut found = Vec::new();
        // The tenure that acted latest so far, and the highest token so far.
        let mut latest: Option<(&(u64, String), &Tenure)> = None;
        let mut highest: Option<&(u64, String)> = None;
        for (key, tenure) in by_start {
            if let Some((before, earlier)) = latest {
                if tenure.start_ns <= earlier.end_ns {
                    found.push(format!(
                        "overlap: {} (token {}) acted from {:.1} ms while {} (token {}) acted until {:.1} ms ({:.1} ms together)",
                        key.1, key.0, ms(tenure.start_ns), before.1, before.0, ms(earlier.end_ns),
                        ms(earlier.end_ns - tenure.start_ns)
                    ));
                }
            }
            if let Some(high) = highest {
                if key.0 <= high.0 {
                    found.push(format!(
                        "token order: {} began with token {} after {} had token {}",
                        key.1, key.0, high.1, high.0
                    ));
                }
            }
            if latest.is_none_or(|(_, earlier)| tenure.end_ns > earlier.end_ns) {
                latest = Some((key, tenure));
            }
            if highest.is_none_or(|high| key.0 > high.0) {
                highest = Some(key);
            }
        }
        found
    }

    /// The first tenure after `token`.
    pub fn successor(&self, token: u64) -> Option<(&(u64, String), &Tenure)> {
        self.tenures
            .range((token + 1, String::new())..)
            .min_by_key(|(_, tenure)| tenure.start_ns)
    }
}

/// Writes that landed in the register, in etcd's order, out of token order: a deposed
/// holder's write after its successor's.
pub fn register_violations(landed: &[(u64, u64, String)]) -> Vec<String> {
    let mut found = Vec::new();
    let mut highest: Option<&(u64, u64, String)> = None;
    for write in landed {
        if let Some(high) = highest {
            if write.1 < high.1 {
                found.push(format!(
                    "stale write: {} (token {}) landed at revision {} after {} (token {}) wrote at revision {}",
                    write.2, write.1, write.0, high.2, high.1, high.0
                ));
                continue;
            }
        }
        highest = Some(write);
    }
    found
}
