//! The store of sessions: session records with a TTL judged by true time, and per slot at most
//! one holding, live exactly while its session's record is — the contract of the runtime's
//! `SessionStore`. One revision counter for the whole store, so a new holding of a slot always
//! gets a revision above every earlier one; every operation atomic at the instant it arrives.

use vvm_core::{Record, Reply, Revision, SessionEffect, SessionId, Slot};

use crate::store::Writer;

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

/// A store call of a session process.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Call {
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

/// The answer of the store to a [`Call`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Answer {
    /// To a session call.
    Session(Reply),
    /// To an acquire.
    Acquire(Acquired),
}

/// Sessions and the holdings of `slots` slots.
#[derive(Clone, Debug)]
pub struct SessionStoreModel {
    sessions: Vec<SessionRecord>,
    holdings: Vec<Option<HoldingRecord>>,
    revision: u64,
    keepalives: KeepAlives,
    /// Unsound on purpose when set: holdings also expire this long after their acquire,
    /// whatever their session's keepalives.
    holding_ttl_ns: Option<u64>,
}

impl SessionStoreModel {
    /// An empty store with slots `1..=slots`.
    pub fn new(slots: u32, keepalives: KeepAlives) -> Self {
        SessionStoreModel {
            sessions: Vec::new(),
            holdings: vec![None; slots as usize],
            revision: 0,
            keepalives,
            holding_ttl_ns: None,
        }
    }

    /// Unsound on purpose: from now on a holding also expires `ttl_ns` after its acquire, as if
    /// it were a record of its own rather than part of its session — while the session's
    /// keepalives keep its services acting.
    pub fn expire_holdings_alone(&mut self, ttl_ns: u64) {
        self.holding_ttl_ns = Some(ttl_ns);
    }

    fn next_revision(&mut self) -> Revision {
        self.revision += 1;
        Revision(self.revision)
    }

    fn index(slot: Slot) -> usize {
        assert!(slot.0 >= 1, "slots start at 1");
        slot.0 as usize - 1
    }

    /// The live record of the session `owner` at true time `now_ns`, by position.
    fn live_session(&self, owner: SessionOwner, now_ns: u64) -> Option<usize> {
        self.sessions
            .iter()
            .position(|r| r.owner == owner && now_ns < r.expires_ns)
    }

    /// The live holding of `slot` at true time `now_ns`: its session's record is live.
    pub fn live_holding(&self, slot: Slot, now_ns: u64) -> Option<HoldingRecord> {
        self.holdings[Self::index(slot)].filter(|holding| {
            self.live_session(holding.owner, now_ns).is_some()
                && self
                    .holding_ttl_ns
                    .is_none_or(|ttl_ns| now_ns < holding.written_ns + ttl_ns)
        })
    }

    /// Applies `call` of `writer` at true time `now_ns`, atomically.
    pub fn apply(&mut self, call: &Call, writer: Writer, now_ns: u64) -> Answer {
        let owner = |id| SessionOwner { writer, id };
        let ours = |store: &Self, id, expected: Revision| {
            store
                .live_session(owner(id), now_ns)
                .filter(|&i| store.sessions[i].revision == expected)
        };
        match *call {
            Call::Session(SessionEffect::Create { id, ttl, .. }) => {
                if self.live_session(owner(id), now_ns).is_some() {
                    return Answer::Session(Reply::Rejected);
                }
                // Expired records go now: the list stays as short as the live sessions.
                self.sessions.retain(|r| now_ns < r.expires_ns);
                let revision = self.next_revision();
                self.sessions.push(SessionRecord {
                    owner: owner(id),
                    revision,
                    expires_ns: now_ns + ttl.as_nanos() as u64,
                });
                Answer::Session(Reply::Written(revision))
            }
            Call::Session(SessionEffect::KeepAlive {
                id, expected, ttl, ..
            }) => {
                let Some(i) = ours(self, id, expected) else {
                    return Answer::Session(Reply::Rejected);
                };
                let revision = match self.keepalives {
                    KeepAlives::Keep => expected,
                    KeepAlives::Bump => self.next_revision(),
                };
                let record = &mut self.sessions[i];
                record.revision = revision;
                record.expires_ns = now_ns + ttl.as_nanos() as u64;
                Answer::Session(Reply::Written(revision))
            }
            Call::Session(SessionEffect::Delete { id, expected, .. }) => {
                let Some(i) = ours(self, id, expected) else {
                    return Answer::Session(Reply::Rejected);
                };
                // The session ends, and every holding of it in the same instant.
                self.sessions.swap_remove(i);
                for holding in &mut self.holdings {
                    if holding.is_some_and(|h| h.owner == owner(id)) {
                        *holding = None;
                    }
                }
                Answer::Session(Reply::Deleted)
            }
            Call::Session(SessionEffect::Get { id, .. }) => {
                let found = self.live_session(owner(id), now_ns).map(|i| Record {
                    incarnation: writer.incarnation,
                    revision: self.sessions[i].revision,
                });
                Answer::Session(Reply::Found(found))
            }
            Call::Session(other) => panic!("not a store call: {other:?}"),
            Call::Acquire { slot, id, .. } => {
                // One transaction: the session live, the slot free (or ours already).
                if self.live_session(owner(id), now_ns).is_none() {
                    return Answer::Acquire(Acquired::SessionGone);
                }
                match self.live_holding(slot, now_ns) {
                    Some(h) if h.owner == owner(id) => {
                        Answer::Acquire(Acquired::Written(h.revision))
                    }
                    Some(_) => Answer::Acquire(Acquired::Held),
                    None => {
                        let revision = self.next_revision();
                        self.holdings[Self::index(slot)] = Some(HoldingRecord {
                            owner: owner(id),
                            revision,
                            written_ns: now_ns,
                        });
                        Answer::Acquire(Acquired::Written(revision))
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use core::time::Duration;

    use vvm_core::{Incarnation, OpId};

    use super::*;

    const L: Duration = Duration::from_secs(20);
    const L_NS: u64 = 20_000_000_000;

    fn writer(n: u64) -> Writer {
        Writer {
            address: n as u32,
            incarnation: Incarnation(n),
        }
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
        let mut store = SessionStoreModel::new(2, KeepAlives::Keep);
        let (a, b) = (writer(1), writer(2));
        assert_eq!(
            store.apply(&acquire(1, 1), a, 0),
            Answer::Acquire(Acquired::SessionGone)
        );
        assert_eq!(
            store.apply(&create(1), a, 0),
            Answer::Session(Reply::Written(Revision(1)))
        );
        assert_eq!(
            store.apply(&create(1), b, L_NS / 2),
            Answer::Session(Reply::Written(Revision(2)))
        );
        assert_eq!(
            store.apply(&create(1), b, L_NS / 2),
            Answer::Session(Reply::Rejected)
        );
        let first = store.apply(&acquire(1, 1), a, L_NS / 2);
        assert_eq!(first, Answer::Acquire(Acquired::Written(Revision(3))));
        assert_eq!(
            store.apply(&acquire(1, 1), a, L_NS / 2),
            first,
            "idempotent"
        );
        assert_eq!(
            store.apply(&acquire(1, 1), b, L_NS / 2),
            Answer::Acquire(Acquired::Held)
        );
        // The session record expires: its holding with it, and the slot is free for another
        // session at a higher revision.
        assert_eq!(
            store
                .live_holding(Slot(1), L_NS - 1)
                .map(|h| h.owner.writer),
            Some(a)
        );
        assert_eq!(store.live_holding(Slot(1), L_NS), None);
        assert_eq!(
            store.apply(&acquire(1, 1), b, L_NS),
            Answer::Acquire(Acquired::Written(Revision(4)))
        );
    }

    #[test]
    fn keepalives_keep_or_bump_the_revision() {
        for (keepalives, after) in [(KeepAlives::Keep, 1), (KeepAlives::Bump, 2)] {
            let mut store = SessionStoreModel::new(1, keepalives);
            let a = writer(1);
            store.apply(&create(1), a, 0);
            let keepalive = |expected| {
                Call::Session(SessionEffect::KeepAlive {
                    op: OpId(2),
                    id: SessionId(1),
                    expected: Revision(expected),
                    ttl: L,
                })
            };
            assert_eq!(
                store.apply(&keepalive(1), a, L_NS / 4),
                Answer::Session(Reply::Written(Revision(after)))
            );
            // Extended: live past the first expiry.
            let get = Call::Session(SessionEffect::Get {
                op: OpId(3),
                id: SessionId(1),
            });
            assert!(matches!(
                store.apply(&get, a, L_NS),
                Answer::Session(Reply::Found(Some(_)))
            ));
            assert_eq!(
                store.apply(&keepalive(after + 1), a, L_NS),
                Answer::Session(Reply::Rejected)
            );
        }
    }
}
