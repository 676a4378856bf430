//! The store of a semaphore simulation: session records with a TTL judged by true time, and one
//! semaphore whose every operation is the real [`vvm_core::semaphore`] method run in one
//! transaction, as the contract of the runtime's `SemaphoreStore` says: the caller's session
//! checked live, the parties of sessions that are not live removed first (lazy expiry), the one
//! operation, and a write that wakes the feed. Deleting a session record removes its parties in
//! the same transaction (eager expiry).
//!
//! Beside the store, a ledger judges the order of grants (see [`Ledger`]).

use vvm_core::semaphore::{RequestId, Semaphore, SessionKey, Status};
use vvm_core::{Record, Reply, Revision, SessionEffect, SessionId};

use crate::store::Writer;

use super::params::Rule;

/// The semaphore's name.
const NAME: &str = "sim";

/// A store call of a process.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Call {
    /// `Create`, `KeepAlive`, `Delete` or `Get` of the session machine.
    Session(SessionEffect),
    /// A semaphore transaction of the session `id`; `op` names the answer.
    Sem {
        /// Names the answer.
        op: u64,
        /// The session.
        id: SessionId,
        /// What it asks.
        request: Request,
    },
}

/// A semaphore operation of the runtime; `request` names the call as the runtime's
/// `next_request_id` does (the simulator's op numbers increase in the order calls are made).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Request {
    /// `acquire(count, timeout_ms)`.
    Acquire {
        /// Units.
        count: u64,
        /// How long it may wait (0: try once).
        timeout_ms: u64,
        /// This call.
        request: RequestId,
    },
    /// A look of a waiter: a describe.
    Look,
    /// A waiter's timeout passed: `cancel_waiter_timeout` of the acquire `request`.
    Cancel {
        /// The acquire that timed out.
        request: RequestId,
    },
    /// `release`.
    Release {
        /// This call.
        request: RequestId,
    },
}

/// What a semaphore transaction tells the caller.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SemAnswer {
    /// Applied. `status` is the caller's status for an acquire, `None` otherwise; `owns`
    /// whether it owns (`Some(true)`), waits (`Some(false)`) or is absent; `expire_in_ns` the
    /// soonest expiry of another party's session.
    Applied {
        /// The acquire's status: granted (`Some(true)`), queued (`Some(false)`), not granted
        /// (`None`); for other requests, the same as `owns`.
        owns: Option<bool>,
        /// Time until the soonest expiry among the other parties' sessions.
        expire_in_ns: Option<u64>,
    },
    /// The session is not live.
    SessionGone,
    /// The call failed; nothing written.
    Failed,
    /// The outcome is unknown.
    Unknown,
}

/// The answer of the store to a [`Call`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Answer {
    /// To a session call.
    Session(Reply),
    /// To a semaphore call.
    Sem(SemAnswer),
}

/// A session record.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct SessionRecord {
    key: SessionKey,
    revision: Revision,
    expires_ns: u64,
}

/// What one transaction did to the semaphore, for the simulation to wake and judge.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Effects {
    /// The semaphore was written: its feed fires (unless the rule silences it).
    pub woke: bool,
    /// Sessions granted by this transaction, in grant order.
    pub granted: Vec<SessionKey>,
    /// Grants that went past an earlier request of the ledger.
    pub out_of_order: Vec<String>,
    /// Grants of a request the ledger had seen queued.
    pub from_queue: u64,
}

/// The model's ledger of the queue: the requests seen queued, in the order they were seen
/// queued; a request that left (released, withdrawn, timed out, expired) leaves it. A grant is
/// in order when it goes to its first request, or, for a request granted at once, when it is
/// empty. Kept from the states before and after each transaction, not from the core's order ids.
#[derive(Clone, Debug, Default)]
pub struct Ledger {
    queued: Vec<SessionKey>,
}

impl Ledger {
    /// Judges the transaction that turned `before` into `after`.
    pub fn observe(&mut self, before: &Semaphore, after: &Semaphore, effects: &mut Effects) {
        let was_owner = |k: &SessionKey| before.owners().iter().any(|o| o.session == *k);
        let newly: Vec<SessionKey> = after
            .owners()
            .iter()
            .map(|o| o.session)
            .filter(|k| !was_owner(k))
            .collect();
        let waits = |k: &SessionKey| after.waiters().iter().any(|w| w.session == *k);
        self.queued.retain(|k| waits(k) || newly.contains(k));
        for &k in &newly {
            match self.queued.iter().position(|&l| l == k) {
                Some(0) => {
                    self.queued.remove(0);
                    effects.from_queue += 1;
                }
                Some(at) => {
                    effects.out_of_order.push(format!(
                        "{k} granted while {} queued before it still waits",
                        self.queued[0]
                    ));
                    self.queued.remove(at);
                }
                None if !self.queued.is_empty() => effects.out_of_order.push(format!(
                    "{k} granted at once while {} waits",
                    self.queued[0]
                )),
                None => {}
            }
        }
        for w in after.waiters() {
            if !self.queued.contains(&w.session) {
                self.queued.push(w.session);
            }
        }
        effects.granted = newly;
    }
}

/// Session records and one semaphore.
#[derive(Clone, Debug)]
pub struct SemaphoreStoreModel {
    sessions: Vec<SessionRecord>,
    semaphore: Semaphore,
    ledger: Ledger,
    revision: u64,
    rule: Rule,
}

impl SemaphoreStoreModel {
    /// An empty store with a semaphore of `limit` units, run by `rule`.
    pub fn new(limit: u64, rule: Rule) -> Self {
        SemaphoreStoreModel {
            sessions: Vec::new(),
            semaphore: Semaphore::create(None, NAME, limit, Vec::new()).expect("a valid semaphore"),
            ledger: Ledger::default(),
            revision: 0,
            rule,
        }
    }

    /// The semaphore as stored.
    pub fn semaphore(&self) -> &Semaphore {
        &self.semaphore
    }

    fn live(&self, key: SessionKey, now_ns: u64) -> Option<usize> {
        self.sessions
            .iter()
            .position(|r| r.key == key && now_ns < r.expires_ns)
    }

    /// Whether the record of `key` is live at `now_ns`.
    pub fn is_live(&self, key: SessionKey, now_ns: u64) -> bool {
        self.live(key, now_ns).is_some()
    }

    /// Applies `call` of `writer` at true time `now_ns`, atomically.
    pub fn apply(&mut self, call: &Call, writer: Writer, now_ns: u64) -> (Answer, Effects) {
        let key = |id| SessionKey {
            incarnation: writer.incarnation,
            id,
        };
        let mut effects = Effects::default();
        let answer = match *call {
            Call::Session(SessionEffect::Create { id, ttl, .. }) => {
                if self.live(key(id), now_ns).is_some() {
                    return (Answer::Session(Reply::Rejected), effects);
                }
                self.sessions.retain(|r| now_ns < r.expires_ns);
                self.revision += 1;
                let revision = Revision(self.revision);
                self.sessions.push(SessionRecord {
                    key: key(id),
                    revision,
                    expires_ns: now_ns + ttl.as_nanos() as u64,
                });
                Answer::Session(Reply::Written(revision))
            }
            Call::Session(SessionEffect::KeepAlive {
                id, expected, ttl, ..
            }) => {
                let found = self
                    .live(key(id), now_ns)
                    .filter(|&i| self.sessions[i].revision == expected);
                let Some(i) = found else {
                    return (Answer::Session(Reply::Rejected), effects);
                };
                self.revision += 1;
                let record = &mut self.sessions[i];
                record.revision = Revision(self.revision);
                record.expires_ns = now_ns + ttl.as_nanos() as u64;
                Answer::Session(Reply::Written(record.revision))
            }
            Call::Session(SessionEffect::Delete { id, expected, .. }) => {
                let found = self
                    .live(key(id), now_ns)
                    .filter(|&i| self.sessions[i].revision == expected);
                let Some(i) = found else {
                    return (Answer::Session(Reply::Rejected), effects);
                };
                // The session ends, and its parties with it in the same transaction.
                self.sessions.swap_remove(i);
                let before = self.semaphore.clone();
                self.semaphore.expire_session(key(id));
                self.written(&before, false, &mut effects);
                Answer::Session(Reply::Deleted)
            }
            Call::Session(SessionEffect::Get { id, .. }) => {
                let found = self.live(key(id), now_ns).map(|i| Record {
                    incarnation: writer.incarnation,
                    revision: self.sessions[i].revision,
                });
                Answer::Session(Reply::Found(found))
            }
            Call::Session(other) => panic!("not a store call: {other:?}"),
            Call::Sem { id, request, .. } => {
                if self.live(key(id), now_ns).is_none() {
                    return (Answer::Sem(SemAnswer::SessionGone), effects);
                }
                Answer::Sem(self.transact(key(id), request, now_ns, &mut effects))
            }
        };
        (answer, effects)
    }

    /// One semaphore transaction of the live session `me`.
    fn transact(
        &mut self,
        me: SessionKey,
        request: Request,
        now_ns: u64,
        effects: &mut Effects,
    ) -> SemAnswer {
        let before = self.semaphore.clone();
        // Lazy expiry: no operation sees, counts or queues behind a dead party.
        let parties: Vec<SessionKey> = before
            .owners()
            .iter()
            .map(|o| o.session)
            .chain(before.waiters().iter().map(|w| w.session))
            .collect();
        for party in parties {
            if self.live(party, now_ns).is_none() {
                self.semaphore.expire_session(party);
            }
        }
        let mut status = None;
        match request {
            Request::Acquire {
                count,
                timeout_ms,
                request,
            } => {
                status = Some(self.acquire(me, request, count, timeout_ms));
            }
            Request::Look => {}
            Request::Cancel { request } => {
                self.semaphore.cancel_waiter_timeout(me, request);
            }
            Request::Release { request } => {
                self.semaphore.release(me, request);
            }
        }
        let release = matches!(request, Request::Release { .. });
        self.written(&before, release, effects);
        let semaphore = &self.semaphore;
        let owns = match status {
            Some(Status::Granted { .. }) => Some(true),
            Some(Status::Queued { .. }) => Some(false),
            Some(_) => None,
            None if semaphore.owners().iter().any(|o| o.session == me) => Some(true),
            None if semaphore.waiters().iter().any(|w| w.session == me) => Some(false),
            None => None,
        };
        let expire_in_ns = semaphore
            .owners()
            .iter()
            .map(|o| o.session)
            .chain(semaphore.waiters().iter().map(|w| w.session))
            .filter(|&k| k != me)
            .filter_map(|k| {
                self.live(k, now_ns)
                    .map(|i| self.sessions[i].expires_ns - now_ns)
            })
            .min();
        SemAnswer::Applied { owns, expire_in_ns }
    }

    /// The core's acquire; under [`Rule::GrantWhenFits`] with the queue set aside while it
    /// runs, so that a new request that fits is granted past the waiters.
    fn acquire(
        &mut self,
        me: SessionKey,
        request: RequestId,
        count: u64,
        timeout_ms: u64,
    ) -> Status {
        let semaphore = &mut self.semaphore;
        let party = semaphore.owners().iter().any(|o| o.session == me)
            || semaphore.waiters().iter().any(|w| w.session == me);
        let free = semaphore.limit() - semaphore.count();
        if self.rule == Rule::GrantWhenFits && !party && count <= free {
            let waiters = semaphore.waiters().to_vec();
            // From the back, so that no waiter is granted by another one's leaving.
            for w in waiters.iter().rev() {
                semaphore.release(w.session, w.request);
            }
            let outcome = semaphore
                .acquire(me, request, count, Vec::new(), timeout_ms)
                .expect("a valid acquire");
            for w in waiters {
                semaphore
                    .acquire(w.session, w.request, w.count, w.data, w.timeout_ms)
                    .expect("a valid acquire");
            }
            return outcome.status;
        }
        match semaphore.acquire(me, request, count, Vec::new(), timeout_ms) {
            Ok(outcome) => outcome.status,
            // An owner asking for more than it holds (a grant it did not see, acquired again
            // with another count), or a late acquire: refused, nothing changed.
            Err(_) => Status::NotGranted,
        }
    }

    /// After a transaction: the ledger judges it, and a write wakes the feed.
    fn written(&mut self, before: &Semaphore, release: bool, effects: &mut Effects) {
        self.ledger.observe(before, &self.semaphore, effects);
        let silent = release && self.rule == Rule::ReleaseNotWoken;
        effects.woke = self.semaphore != *before && !silent;
    }
}
