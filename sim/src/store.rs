//! The store model: TTL records judged by true time, one revision counter for the whole store,
//! every operation atomic at the instant it arrives.

use vvm_core::{Effect, Incarnation, Record, Reply, Revision, Slot};

/// Who wrote a record: the store compares the whole value (address and incarnation), as the real
/// adapters do; the core only ever learns the incarnation.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Writer {
    /// Stands for the address: a restarted process keeps it.
    pub address: u32,
    /// Changes with every start.
    pub incarnation: Incarnation,
}

/// One record of the store.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Stored {
    /// Its value.
    pub writer: Writer,
    /// The revision of the write that produced it.
    pub revision: Revision,
    /// True time from which it is absent.
    pub expires_ns: u64,
}

/// What one operation did to the store, for the trace.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Applied {
    /// The reply the store gave.
    pub reply: Reply,
    /// Whether the record changed.
    pub wrote: bool,
}

/// A store of `slots` keys.
#[derive(Clone, Debug)]
pub struct StoreModel {
    records: Vec<Option<Stored>>,
    revision: u64,
    /// Inserts that took a live record from a holder known dead.
    pub dead_takeovers: u64,
}

impl StoreModel {
    /// An empty store with keys `1..=slots`.
    pub fn new(slots: u32) -> Self {
        StoreModel {
            records: vec![None; slots as usize],
            revision: 0,
            dead_takeovers: 0,
        }
    }

    fn index(slot: Slot) -> usize {
        assert!(slot.0 >= 1, "slots start at 1");
        slot.0 as usize - 1
    }

    /// The live record of `slot` at true time `now_ns`.
    pub fn live(&self, slot: Slot, now_ns: u64) -> Option<Stored> {
        self.records[Self::index(slot)].filter(|stored| now_ns < stored.expires_ns)
    }

    fn write(&mut self, slot: Slot, writer: Writer, ttl_ns: u64, now_ns: u64) -> Revision {
        self.revision += 1;
        let revision = Revision(self.revision);
        self.records[Self::index(slot)] = Some(Stored {
            writer,
            revision,
            expires_ns: now_ns + ttl_ns,
        });
        revision
    }

    /// Applies a store effect of `writer` at true time `now_ns`, atomically. `dead` tells
    /// whether the store knows the holder of a record is dead (its lock is free): an insert then
    /// takes another holder's live record at once, with a new revision.
    pub fn apply(
        &mut self,
        effect: &Effect,
        writer: Writer,
        now_ns: u64,
        dead: &dyn Fn(Writer) -> bool,
    ) -> Applied {
        let ours = |stored: &Stored, expected: Revision| {
            stored.writer == writer && stored.revision == expected
        };
        match *effect {
            Effect::Insert { slot, ttl, .. } => match self.live(slot, now_ns) {
                Some(stored) if stored.writer != writer && dead(stored.writer) => {
                    self.dead_takeovers += 1;
                    let revision = self.write(slot, writer, ttl.as_nanos() as u64, now_ns);
                    Applied {
                        reply: Reply::Written(revision),
                        wrote: true,
                    }
                }
                Some(_) => Applied {
                    reply: Reply::Rejected,
                    wrote: false,
                },
                None => {
                    let revision = self.write(slot, writer, ttl.as_nanos() as u64, now_ns);
                    Applied {
                        reply: Reply::Written(revision),
                        wrote: true,
                    }
                }
            },
            Effect::CompareAndSwap {
                slot,
                expected,
                ttl,
                ..
            } => match self.live(slot, now_ns) {
                Some(stored) if ours(&stored, expected) => {
                    let revision = self.write(slot, writer, ttl.as_nanos() as u64, now_ns);
                    Applied {
                        reply: Reply::Written(revision),
                        wrote: true,
                    }
                }
                _ => Applied {
                    reply: Reply::Rejected,
                    wrote: false,
                },
            },
            Effect::CompareAndDelete { slot, expected, .. } => match self.live(slot, now_ns) {
                Some(stored) if ours(&stored, expected) => {
                    self.records[Self::index(slot)] = None;
                    Applied {
                        reply: Reply::Deleted,
                        wrote: true,
                    }
                }
                _ => Applied {
                    reply: Reply::Rejected,
                    wrote: false,
                },
            },
            Effect::Get { slot, .. } => Applied {
                reply: Reply::Found(self.live(slot, now_ns).map(|stored| Record {
                    incarnation: stored.writer.incarnation,
                    revision: stored.revision,
                })),
                wrote: false,
            },
            other => panic!("not a store operation: {other:?}"),
        }
    }

    /// Someone outside the protocol writes `writer` under `slot` (an operator, a bug elsewhere):
    /// the lease is taken away underneath its holder.
    pub fn overwrite(&mut self, slot: Slot, writer: Writer, ttl_ns: u64, now_ns: u64) -> Revision {
        self.write(slot, writer, ttl_ns, now_ns)
    }

    /// Someone outside the protocol deletes the record of `slot`.
    pub fn delete(&mut self, slot: Slot) {
        self.records[Self::index(slot)] = None;
    }
}
