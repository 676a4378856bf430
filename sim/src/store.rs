//! The one store model of the world: slot records with a TTL (the per-slot lease), session
//! records with a TTL, per slot at most one holding that lives exactly while its session's
//! record is, and one counted semaphore whose every operation is the real
//! [`vvm_core::semaphore`] method. Expiry is judged by true time; one revision counter for the
//! whole store, so a new record or holding of a slot always gets a revision above every earlier
//! one; every call atomic at the instant it arrives (one transaction).
//!
//! A semaphore transaction checks the caller's session live, removes the parties of sessions
//! that are not live first (lazy expiry), runs the one operation, and wakes the feed when it
//! wrote. Deleting a session record removes its holdings and its parties in the same
//! transaction (eager expiry). Beside the store, a [`Ledger`] judges the order of grants.
//!
//! Some rules can be broken on purpose, for the simulations to show they catch it:
//! [`StoreModel::expire_holdings_alone`], [`StoreModel::grant_when_fits`],
//! [`StoreModel::silence_releases`].

use vvm_core::semaphore::{RequestId, Semaphore, SessionKey, Status};
use vvm_core::{Effect, Incarnation, Record, Reply, Revision, SessionEffect, SessionId, Slot};

/// The semaphore's name.
const NAME: &str = "sim";

/// Who wrote a record: the store compares the whole value (address and incarnation), as the real
/// adapters do; the core only ever learns the incarnation.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Writer {
    /// Stands for the address: a restarted process keeps it.
    pub address: u32,
    /// Changes with every start.
    pub incarnation: Incarnation,
}

/// A slot record of the per-slot lease.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Stored {
    /// Its value.
    pub writer: Writer,
    /// The revision of the write that produced it.
    pub revision: Revision,
    /// True time from which it is absent.
    pub expires_ns: u64,
}

/// How the store answers a keepalive.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum KeepAlives {
    /// The record's revision stays (memory store, etcd's lease keepalive).
    Keep,
    /// The record gets a new, higher revision (the transactional store): a keepalive that
    /// lands after a later one was sent makes that one refused.
    Bump,
}

/// A session as the store names it: the process start that opened it and the id its machine
/// minted.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct SessionOwner {
    /// Who opened it.
    pub writer: Writer,
    /// Which of its sessions.
    pub id: SessionId,
}

impl SessionOwner {
    /// The semaphore's name of the session.
    pub fn key(self) -> SessionKey {
        SessionKey {
            incarnation: self.writer.incarnation,
            id: self.id,
        }
    }
}

/// A session record.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SessionRecord {
    /// Whose.
    pub owner: SessionOwner,
    /// The revision of its last write.
    pub revision: Revision,
    /// True time from which it is absent.
    pub expires_ns: u64,
}

/// A holding: the record of a slot written by an acquire. No TTL of its own.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct HoldingRecord {
    /// The session it lives and dies with.
    pub owner: SessionOwner,
    /// The revision of the acquire that wrote it: the fencing token of the tenure.
    pub revision: Revision,
    /// True time it was written.
    pub written_ns: u64,
}

/// A store call of a process.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Call {
    /// `Insert`, `CompareAndSwap`, `CompareAndDelete` or `Get` of a slot record (per-slot lease).
    Slot(Effect),
    /// `Create`, `KeepAlive`, `Delete` or `Get` of the session machine.
    Session(SessionEffect),
    /// The runtime's acquire of `slot` for the session `id`.
    Acquire {
        /// Names the answer.
        op: u64,
        /// The slot.
        slot: Slot,
        /// The session.
        id: SessionId,
    },
    /// A semaphore transaction of the session `id`.
    Sem {
        /// Names the answer.
        op: u64,
        /// The session.
        id: SessionId,
        /// What it asks.
        request: Request,
    },
}

/// What an acquire did, as the runtime hears it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Acquired {
    /// The holding is written at this revision (or was already, for this session).
    Written(Revision),
    /// The slot has a live holding of another session.
    Held,
    /// The session is not live.
    SessionGone,
    /// The call failed; nothing written.
    Failed,
    /// The outcome is unknown (an error that may have committed, or the timeout).
    Unknown,
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
    /// Applied.
    Applied {
        /// The acquire's status: granted (`Some(true)`), queued (`Some(false)`), not granted
        /// (`None`); for other requests, whether the caller owns, waits or is absent.
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
    /// To a slot or session call.
    Reply(Reply),
    /// To an acquire.
    Acquired(Acquired),
    /// To a semaphore call.
    Sem(SemAnswer),
}

impl Call {
    /// What the caller hears when the call failed and wrote nothing.
    pub fn failed(&self) -> Answer {
        match self {
            Call::Slot(_) | Call::Session(_) => Answer::Reply(Reply::Failed),
            Call::Acquire { .. } => Answer::Acquired(Acquired::Failed),
            Call::Sem { .. } => Answer::Sem(SemAnswer::Failed),
        }
    }

    /// What the caller hears when the call's outcome is unknown (or its timeout came first).
    pub fn unknown(&self) -> Answer {
        match self {
            Call::Slot(_) | Call::Session(_) => Answer::Reply(Reply::Unknown),
            Call::Acquire { .. } => Answer::Acquired(Acquired::Unknown),
            Call::Sem { .. } => Answer::Sem(SemAnswer::Unknown),
        }
    }
}

/// What one transaction did to the semaphore, for the simulation to wake and judge.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Effects {
    /// The semaphore was written: its feed fires (unless releases are silenced).
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

/// The store: slot records, session records, holdings and one semaphore.
#[derive(Clone, Debug)]
pub struct StoreModel {
    records: Vec<Option<Stored>>,
    sessions: Vec<SessionRecord>,
    holdings: Vec<Option<HoldingRecord>>,
    semaphore: Semaphore,
    ledger: Ledger,
    revision: u64,
    keepalives: KeepAlives,
    /// Unsound on purpose when set: holdings also expire this long after their acquire,
    /// whatever their session's keepalives.
    holding_ttl_ns: Option<u64>,
    /// Unsound on purpose: a new acquire that fits is granted past the waiters.
    grant_when_fits: bool,
    /// Unsound on purpose: a release's write does not wake the feed.
    releases_silent: bool,
    /// Inserts that took a live slot record from a holder known dead.
    pub dead_takeovers: u64,
}

impl StoreModel {
    /// An empty store with slots `1..=slots`, keepalives answered as `keepalives`, and a
    /// semaphore of `limit` units.
    pub fn new(slots: u32, keepalives: KeepAlives, limit: u64) -> Self {
        StoreModel {
            records: vec![None; slots as usize],
            sessions: Vec::new(),
            holdings: vec![None; slots as usize],
            semaphore: Semaphore::create(None, NAME, limit, Vec::new()).expect("a valid semaphore"),
            ledger: Ledger::default(),
            revision: 0,
            keepalives,
            holding_ttl_ns: None,
            grant_when_fits: false,
            releases_silent: false,
            dead_takeovers: 0,
        }
    }

    /// Unsound on purpose: from now on a holding also expires `ttl_ns` after its acquire, as if
    /// it were a record of its own rather than part of its session — while the session's
    /// keepalives keep its services acting.
    pub fn expire_holdings_alone(&mut self, ttl_ns: u64) {
        self.holding_ttl_ns = Some(ttl_ns);
    }

    /// Unsound on purpose: a new acquire that fits in the free units is granted at once even
    /// when others are queued.
    pub fn grant_when_fits(&mut self) {
        self.grant_when_fits = true;
    }

    /// Unsound on purpose: a release's write does not wake the feed, so the waiters it grants
    /// are not told.
    pub fn silence_releases(&mut self) {
        self.releases_silent = true;
    }

    fn next_revision(&mut self) -> Revision {
        self.revision += 1;
        Revision(self.revision)
    }

    fn index(slot: Slot) -> usize {
        assert!(slot.0 >= 1, "slots start at 1");
        slot.0 as usize - 1
    }

    /// The live slot record of `slot` at true time `now_ns`.
    pub fn live(&self, slot: Slot, now_ns: u64) -> Option<Stored> {
        self.records[Self::index(slot)].filter(|stored| now_ns < stored.expires_ns)
    }

    fn write(&mut self, slot: Slot, writer: Writer, ttl_ns: u64, now_ns: u64) -> Revision {
        let revision = self.next_revision();
        self.records[Self::index(slot)] = Some(Stored {
            writer,
            revision,
            expires_ns: now_ns + ttl_ns,
        });
        revision
    }

    /// Someone outside the protocol writes `writer` under `slot` (an operator, a bug elsewhere):
    /// the lease is taken away underneath its holder.
    pub fn overwrite(&mut self, slot: Slot, writer: Writer, ttl_ns: u64, now_ns: u64) -> Revision {
        self.write(slot, writer, ttl_ns, now_ns)
    }

    /// Someone outside the protocol deletes the slot record of `slot`.
    pub fn delete(&mut self, slot: Slot) {
        self.records[Self::index(slot)] = None;
    }

    /// The live record of the session `key` at true time `now_ns`, by position.
    fn live_session(&self, key: SessionKey, now_ns: u64) -> Option<usize> {
        self.sessions
            .iter()
            .position(|r| r.owner.key() == key && now_ns < r.expires_ns)
    }

    /// Whether the record of the session `key` is live at `now_ns`.
    pub fn is_live(&self, key: SessionKey, now_ns: u64) -> bool {
        self.live_session(key, now_ns).is_some()
    }

    /// The live holding of `slot` at true time `now_ns`: its session's record is live.
    pub fn live_holding(&self, slot: Slot, now_ns: u64) -> Option<HoldingRecord> {
        self.holdings[Self::index(slot)].filter(|holding| {
            self.is_live(holding.owner.key(), now_ns)
                && self
                    .holding_ttl_ns
                    .is_none_or(|ttl_ns| now_ns < holding.written_ns + ttl_ns)
        })
    }

    /// The semaphore as stored.
    pub fn semaphore(&self) -> &Semaphore {
        &self.semaphore
    }

    /// Applies `call` of `writer` at true time `now_ns`, atomically. `dead` tells whether the
    /// store knows the writer of a slot record is dead (its lock is free): an insert then takes
    /// another holder's live record at once, with a new revision.
    pub fn apply(
        &mut self,
        call: &Call,
        writer: Writer,
        now_ns: u64,
        dead: &dyn Fn(Writer) -> bool,
    ) -> (Answer, Effects) {
        let mut effects = Effects::default();
        let answer = match *call {
            Call::Slot(effect) => Answer::Reply(self.slot(&effect, writer, now_ns, dead)),
            Call::Session(effect) => {
                Answer::Reply(self.session(&effect, writer, now_ns, &mut effects))
            }
            Call::Acquire { slot, id, .. } => {
                Answer::Acquired(self.acquire_slot(slot, SessionOwner { writer, id }, now_ns))
            }
            Call::Sem { id, request, .. } => {
                let me = SessionOwner { writer, id }.key();
                if self.is_live(me, now_ns) {
                    Answer::Sem(self.transact(me, request, now_ns, &mut effects))
                } else {
                    Answer::Sem(SemAnswer::SessionGone)
                }
            }
        };
        (answer, effects)
    }

    /// A call on a slot record of the per-slot lease.
    fn slot(
        &mut self,
        effect: &Effect,
        writer: Writer,
        now_ns: u64,
        dead: &dyn Fn(Writer) -> bool,
    ) -> Reply {
        let ours = |stored: &Stored, expected: Revision| {
            stored.writer == writer && stored.revision == expected
        };
        match *effect {
            Effect::Insert { slot, ttl, .. } => match self.live(slot, now_ns) {
                Some(stored) if stored.writer != writer && dead(stored.writer) => {
                    self.dead_takeovers += 1;
                    Reply::Written(self.write(slot, writer, ttl.as_nanos() as u64, now_ns))
                }
                Some(_) => Reply::Rejected,
                None => Reply::Written(self.write(slot, writer, ttl.as_nanos() as u64, now_ns)),
            },
            Effect::CompareAndSwap {
                slot,
                expected,
                ttl,
                ..
            } => match self.live(slot, now_ns) {
                Some(stored) if ours(&stored, expected) => {
                    Reply::Written(self.write(slot, writer, ttl.as_nanos() as u64, now_ns))
                }
                _ => Reply::Rejected,
            },
            Effect::CompareAndDelete { slot, expected, .. } => match self.live(slot, now_ns) {
                Some(stored) if ours(&stored, expected) => {
                    self.records[Self::index(slot)] = None;
                    Reply::Deleted
                }
                _ => Reply::Rejected,
            },
            Effect::Get { slot, .. } => {
                Reply::Found(self.live(slot, now_ns).map(|stored| Record {
                    incarnation: stored.writer.incarnation,
                    revision: stored.revision,
                }))
            }
            other => panic!("not a store operation: {other:?}"),
        }
    }

    /// A call of the session machine on its record.
    fn session(
        &mut self,
        effect: &SessionEffect,
        writer: Writer,
        now_ns: u64,
        effects: &mut Effects,
    ) -> Reply {
        let owner = |id| SessionOwner { writer, id };
        let ours = |store: &Self, id, expected: Revision| {
            store
                .live_session(owner(id).key(), now_ns)
                .filter(|&i| store.sessions[i].revision == expected)
        };
        match *effect {
            SessionEffect::Create { id, ttl, .. } => {
                if self.is_live(owner(id).key(), now_ns) {
                    return Reply::Rejected;
                }
                // Expired records go now: the list stays as short as the live sessions.
                self.sessions.retain(|r| now_ns < r.expires_ns);
                let revision = self.next_revision();
                self.sessions.push(SessionRecord {
                    owner: owner(id),
                    revision,
                    expires_ns: now_ns + ttl.as_nanos() as u64,
                });
                Reply::Written(revision)
            }
            SessionEffect::KeepAlive {
                id, expected, ttl, ..
            } => {
                let Some(i) = ours(self, id, expected) else {
                    return Reply::Rejected;
                };
                let revision = match self.keepalives {
                    KeepAlives::Keep => expected,
                    KeepAlives::Bump => self.next_revision(),
                };
                let record = &mut self.sessions[i];
                record.revision = revision;
                record.expires_ns = now_ns + ttl.as_nanos() as u64;
                Reply::Written(revision)
            }
            SessionEffect::Delete { id, expected, .. } => {
                let Some(i) = ours(self, id, expected) else {
                    return Reply::Rejected;
                };
                // The session ends, and every holding and party of it in the same instant.
                self.sessions.swap_remove(i);
                for holding in &mut self.holdings {
                    if holding.is_some_and(|h| h.owner == owner(id)) {
                        *holding = None;
                    }
                }
                let before = self.semaphore.clone();
                self.semaphore.expire_session(owner(id).key());
                self.written(&before, false, effects);
                Reply::Deleted
            }
            SessionEffect::Get { id, .. } => {
                let found = self.live_session(owner(id).key(), now_ns).map(|i| Record {
                    incarnation: writer.incarnation,
                    revision: self.sessions[i].revision,
                });
                Reply::Found(found)
            }
            other => panic!("not a store call: {other:?}"),
        }
    }

    /// The acquire of a slot: one transaction, the session live, the slot free (or ours).
    fn acquire_slot(&mut self, slot: Slot, owner: SessionOwner, now_ns: u64) -> Acquired {
        if !self.is_live(owner.key(), now_ns) {
            return Acquired::SessionGone;
        }
        match self.live_holding(slot, now_ns) {
            Some(h) if h.owner == owner => Acquired::Written(h.revision),
            Some(_) => Acquired::Held,
            None => {
                let revision = self.next_revision();
                self.holdings[Self::index(slot)] = Some(HoldingRecord {
                    owner,
                    revision,
                    written_ns: now_ns,
                });
                Acquired::Written(revision)
            }
        }
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
            if !self.is_live(party, now_ns) {
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
                status = Some(self.acquire_units(me, request, count, timeout_ms));
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
                self.live_session(k, now_ns)
                    .map(|i| self.sessions[i].expires_ns - now_ns)
            })
            .min();
        SemAnswer::Applied { owns, expire_in_ns }
    }

    /// The core's acquire; when granting whatever fits, with the queue set aside while it runs,
    /// so that a new request that fits is granted past the waiters.
    fn acquire_units(
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
        if self.grant_when_fits && !party && count <= free {
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

    /// After a semaphore transaction: the ledger judges it, and a write wakes the feed.
    fn written(&mut self, before: &Semaphore, release: bool, effects: &mut Effects) {
        self.ledger.observe(before, &self.semaphore, effects);
        let silent = release && self.releases_silent;
        effects.woke = self.semaphore != *before && !silent;
    }
}

#[cfg(test)]
mod tests {
    use core::time::Duration;

    use vvm_core::OpId;

    use super::*;

    const L: Duration = Duration::from_secs(20);
    const L_NS: u64 = 20_000_000_000;

    fn writer(n: u64) -> Writer {
        Writer {
            address: n as u32,
            incarnation: Incarnation(n),
        }
    }

    fn apply(store: &mut StoreModel, call: Call, writer: Writer, now_ns: u64) -> Answer {
        store.apply(&call, writer, now_ns, &|_| false).0
    }

    fn create(id: u64) -> Call {
        Call::Session(SessionEffect::Create {
            op: OpId(1),
            id: SessionId(id),
            ttl: L,
        })
    }

    fn acquire(slot: u32, id: u64) -> Call {
        Call::Acquire {
            op: 1,
            slot: Slot(slot),
            id: SessionId(id),
        }
    }

    #[test]
    fn a_holding_lives_exactly_as_long_as_its_session() {
        let mut store = StoreModel::new(2, KeepAlives::Keep, 1);
        let (a, b) = (writer(1), writer(2));
        let written = |n| Answer::Reply(Reply::Written(Revision(n)));
        let session_gone = Answer::Acquired(Acquired::SessionGone);
        assert_eq!(apply(&mut store, acquire(1, 1), a, 0), session_gone);
        assert_eq!(apply(&mut store, create(1), a, 0), written(1));
        assert_eq!(apply(&mut store, create(1), b, L_NS / 2), written(2));
        let rejected = Answer::Reply(Reply::Rejected);
        assert_eq!(apply(&mut store, create(1), b, L_NS / 2), rejected);
        let first = apply(&mut store, acquire(1, 1), a, L_NS / 2);
        assert_eq!(first, Answer::Acquired(Acquired::Written(Revision(3))));
        let again = apply(&mut store, acquire(1, 1), a, L_NS / 2);
        assert_eq!(again, first, "idempotent");
        let held = apply(&mut store, acquire(1, 1), b, L_NS / 2);
        assert_eq!(held, Answer::Acquired(Acquired::Held));
        // The session record expires: its holding with it, and the slot is free for another
        // session at a higher revision.
        let holder = store
            .live_holding(Slot(1), L_NS - 1)
            .map(|h| h.owner.writer);
        assert_eq!(holder, Some(a));
        assert_eq!(store.live_holding(Slot(1), L_NS), None);
        let taken = apply(&mut store, acquire(1, 1), b, L_NS);
        assert_eq!(taken, Answer::Acquired(Acquired::Written(Revision(4))));
    }

    #[test]
    fn keepalives_keep_or_bump_the_revision() {
        for (keepalives, after) in [(KeepAlives::Keep, 1), (KeepAlives::Bump, 2)] {
            let mut store = StoreModel::new(1, keepalives, 1);
            let a = writer(1);
            apply(&mut store, create(1), a, 0);
            let keepalive = |expected| {
                Call::Session(SessionEffect::KeepAlive {
                    op: OpId(2),
                    id: SessionId(1),
                    expected: Revision(expected),
                    ttl: L,
                })
            };
            let kept = apply(&mut store, keepalive(1), a, L_NS / 4);
            assert_eq!(kept, Answer::Reply(Reply::Written(Revision(after))));
            // Extended: live past the first expiry.
            let get = Call::Session(SessionEffect::Get {
                op: OpId(3),
                id: SessionId(1),
            });
            let found = apply(&mut store, get, a, L_NS);
            assert!(matches!(found, Answer::Reply(Reply::Found(Some(_)))));
            let late = apply(&mut store, keepalive(after + 1), a, L_NS);
            assert_eq!(late, Answer::Reply(Reply::Rejected));
        }
    }
}
