//! The shared side: numbers of committed events not yet persisted, the PLog offset they cover,
//! whether `start` may begin a transaction, what the flusher writes next and how a replayed
//! PLog merges in.
//!
//! One invariant carries the whole design: **every event below `offsets.next` has its numbers
//! either in `pending` or already in storage.** A batch is always *all* of `pending` together
//! with `offsets.next`, taken in one step; so a stored `(values, offset)` pair never has an
//! offset ahead of the values of the events below it, and a recovery that replays the PLog from
//! the stored offset cannot miss a number. Entries leave `pending` only once written, and only
//! when unchanged since the batch was taken.

use std::collections::HashMap;

use super::params::Params;
use super::types::{KeyBuildHasher, Number, NumberKey, PLogOffset, SeqId, SeqValue, WsId, WsKind};

/// Why `start` did not begin a transaction.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum StartRefusal {
    /// The sequencer is catching up with the PLog; try again shortly.
    #[error("sequencer is actualizing")]
    Actualizing,
    /// The last actualization gave up after its retries; `start` begins a new one.
    #[error("the last actualization failed; a new one is started")]
    ActualizationFailed,
    /// The PLog is corrupt: it fed an event below the offsets already covered, so events may
    /// be missing from it. Reading the same log again cannot help: permanent until someone
    /// repairs the log (a new sequencer then actualizes from it).
    #[error("the PLog is corrupt: event at {got:?} fed after every event below {covered:?}")]
    CorruptPLog {
        /// Every event below this offset was covered already.
        covered: PLogOffset,
        /// The offset of the event fed.
        got: PLogOffset,
    },
    /// Too much is committed but not persisted; try again once the flusher caught up.
    #[error("backlog over its limit: {unflushed_keys} keys, {unflushed_events} events unflushed")]
    Backlog {
        /// Keys waiting to be written.
        unflushed_keys: usize,
        /// Events whose numbers are not yet covered by the stored offset.
        unflushed_events: u64,
    },
    /// The PLog offset reached `u64::MAX`.
    #[error("PLog offsets are exhausted")]
    OffsetsExhausted,
    /// The workspace kind declares no sequences.
    #[error("workspace kind {0:?} has no sequences")]
    UnknownWsKind(WsKind),
}

impl StartRefusal {
    /// Whether trying again later can succeed without anyone changing anything. A corrupt
    /// PLog, exhausted offsets and an unknown kind are not: a retry loop must give up on them.
    pub fn is_transient(&self) -> bool {
        matches!(
            self,
            StartRefusal::Actualizing
                | StartRefusal::ActualizationFailed
                | StartRefusal::Backlog { .. }
        )
    }
}

/// A call that does not fit the backlog's phase: a bug in the driver, reported instead of
/// corrupting the state. The state is unchanged.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum BacklogError {
    /// The call needs another phase.
    #[error("backlog is {phase:?}; {call} needs {needs}")]
    WrongPhase {
        /// The current phase.
        phase: Phase,
        /// The call.
        call: &'static str,
        /// What it needs.
        needs: &'static str,
    },
    /// `commit` for another offset than `start` handed out.
    #[error("commit for offset {got:?}, but {expected:?} is the one handed out")]
    OffsetMismatch {
        /// The offset handed out.
        expected: PLogOffset,
        /// The offset committed.
        got: PLogOffset,
    },
    /// A replayed event sits at `u64::MAX`: no offset could follow it.
    #[error("replayed event at the last possible offset {0:?}")]
    OffsetsExhausted(PLogOffset),
    /// The PLog fed an event below the offsets already covered: it broke its order (offsets
    /// must grow), so events may be missing from the replay. Merging anyway could hand out
    /// numbers of events that were skipped; the log is treated as corrupt.
    #[error(
        "PLog out of order: event at {got:?} after every event below {covered:?} was replayed"
    )]
    PLogOutOfOrder {
        /// Every event below this offset was covered already.
        covered: PLogOffset,
        /// The offset of the event fed.
        got: PLogOffset,
    },
}

/// How far events are covered.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Offsets {
    /// Every event below this offset is covered by `pending` ∪ storage; when ready, also the
    /// offset the next transaction gets.
    pub next: PLogOffset,
    /// The offset of the last successful write: every event below it is covered by storage.
    pub persisted: PLogOffset,
}

impl Offsets {
    fn unflushed_events(&self) -> u64 {
        self.next.0.saturating_sub(self.persisted.0)
    }
}

/// Where the sequencer stands with respect to the PLog.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Phase {
    /// Actualization begun: the stored offset is being read.
    Loading,
    /// The PLog is being replayed from the stored offset.
    Replaying(Offsets),
    /// Caught up: transactions may start.
    Ready(Offsets),
    /// The actualization gave up after its retries.
    Failed,
    /// The PLog broke its offset order during the replay (see
    /// [`BacklogError::PLogOutOfOrder`]): permanent, `start` refuses with
    /// [`StartRefusal::CorruptPLog`] and no actualization is started by itself.
    Corrupt {
        /// Every event below this offset was covered already.
        covered: PLogOffset,
        /// The offset of the event fed.
        got: PLogOffset,
    },
}

/// What the flusher was handed: identifies one batch so that a late completion of a batch from
/// before an actualization is ignored.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BatchTicket {
    epoch: u64,
    next_offset: PLogOffset,
}

impl BatchTicket {
    /// The offset to store with the batch's values.
    pub fn next_offset(&self) -> PLogOffset {
        self.next_offset
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Write {
    Idle,
    InFlight(BatchTicket),
}

/// After replaying one event: go on, or write a batch first.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ReplayStep {
    /// Within limits.
    Continue,
    /// Over a limit: write a batch before replaying more.
    Full,
}

/// The shared side of a sequencer.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Backlog {
    keys_max: usize,
    events_max: u64,
    phase: Phase,
    pending: HashMap<NumberKey, Number, KeyBuildHasher>,
    write: Write,
    epoch: u64,
}

impl Backlog {
    /// An empty backlog in [`Phase::Loading`]: a sequencer begins by actualizing.
    pub fn new(params: &Params) -> Self {
        let keys_max = params.unflushed_keys_max();
        // Admitted transactions leave at most keys_max + one transaction's keys; twice that so
        // the map never reallocates (see the cache for why).
        let capacity = keys_max
            .saturating_add(params.seqs_per_kind_max())
            .saturating_mul(2);
        Backlog {
            keys_max,
            events_max: params.unflushed_events_max(),
            phase: Phase::Loading,
            pending: HashMap::with_capacity_and_hasher(capacity, KeyBuildHasher::default()),
            write: Write::Idle,
            epoch: 0,
        }
    }

    /// The current phase.
    pub fn phase(&self) -> Phase {
        self.phase
    }

    /// Keys waiting to be written.
    pub fn unflushed_keys(&self) -> usize {
        self.pending.len()
    }

    /// Events not yet covered by the stored offset.
    #[inline]
    pub fn unflushed_events(&self) -> u64 {
        match self.phase {
            Phase::Replaying(o) | Phase::Ready(o) => o.unflushed_events(),
            Phase::Loading | Phase::Failed | Phase::Corrupt { .. } => 0,
        }
    }

    /// Whether a batch is being written.
    pub fn is_writing(&self) -> bool {
        matches!(self.write, Write::InFlight(_))
    }

    /// The pending (committed or replayed, unpersisted) number of `key`.
    ///
    /// Not an answer for `next` on its own: a replayed event may carry a number below what
    /// storage holds for its key (see [`snapshot`](Self::snapshot)).
    pub fn lookup(&self, key: &NumberKey) -> Option<Number> {
        self.pending.get(key).copied()
    }

    /// The pending number (`Number(0)` when none) of each of `seqs` in workspace `ws_id`, in
    /// order, into `out` (cleared first): the backlog's side of
    /// [`Issuer::next_from`](super::Issuer::next_from). Taken *before* storage is read: an
    /// entry leaves the backlog only once it was written, so whatever the read misses is here.
    pub fn snapshot(&self, ws_id: WsId, seqs: &[(SeqId, Number)], out: &mut Vec<Number>) {
        out.clear();
        out.extend(seqs.iter().map(|&(seq_id, _)| {
            self.lookup(&NumberKey { ws_id, seq_id })
                .unwrap_or_default()
        }));
    }

    #[inline]
    fn over_limit(&self) -> bool {
        self.pending.len() > self.keys_max || self.unflushed_events() > self.events_max
    }

    #[inline]
    fn merge(&mut self, key: NumberKey, value: Number) {
        let slot = self.pending.entry(key).or_insert(value);
        // Max, not overwrite: numbers of one key only grow, whatever order they arrive in.
        if value > *slot {
            *slot = value;
        }
    }

    /// May a transaction start? `Ok(offset)`: the PLog offset its event is to be written at.
    #[inline]
    pub fn admit(&self) -> Result<PLogOffset, StartRefusal> {
        match self.phase {
            Phase::Loading | Phase::Replaying(_) => Err(StartRefusal::Actualizing),
            Phase::Failed => Err(StartRefusal::ActualizationFailed),
            Phase::Corrupt { covered, got } => Err(StartRefusal::CorruptPLog { covered, got }),
            Phase::Ready(o) => {
                if self.over_limit() {
                    return Err(StartRefusal::Backlog {
                        unflushed_keys: self.pending.len(),
                        unflushed_events: o.unflushed_events(),
                    });
                }
                if o.next.next().is_none() {
                    return Err(StartRefusal::OffsetsExhausted);
                }
                Ok(o.next)
            }
        }
    }

    /// The event at `offset` (handed out by [`admit`](Self::admit)) was written to the PLog
    /// with the numbers `issued` for workspace `ws_id`.
    #[inline]
    pub fn commit(
        &mut self,
        offset: PLogOffset,
        ws_id: WsId,
        issued: &[(SeqId, Number)],
    ) -> Result<(), BacklogError> {
        let Phase::Ready(o) = self.phase else {
            return Err(self.wrong("commit", "Ready"));
        };
        if offset != o.next {
            return Err(BacklogError::OffsetMismatch {
                expected: o.next,
                got: offset,
            });
        }
        let next = offset
            .next()
            .ok_or(BacklogError::OffsetsExhausted(offset))?;
        for &(seq_id, value) in issued {
            self.merge(NumberKey { ws_id, seq_id }, value);
        }
        self.phase = Phase::Ready(Offsets { next, ..o });
        Ok(())
    }

    /// Hands the flusher everything pending (into `out`) with the offset it covers, unless a
    /// batch is already being written or there is nothing to write.
    pub fn take_batch(&mut self, out: &mut Vec<SeqValue>) -> Option<BatchTicket> {
        let (Phase::Replaying(o) | Phase::Ready(o)) = self.phase else {
            return None;
        };
        if self.is_writing() || (self.pending.is_empty() && o.next == o.persisted) {
            return None;
        }
        out.clear();
        out.extend(
            self.pending
                .iter()
                .map(|(&key, &value)| SeqValue { key, value }),
        );
        let ticket = BatchTicket {
            epoch: self.epoch,
            next_offset: o.next,
        };
        self.write = Write::InFlight(ticket);
        Some(ticket)
    }

    /// The batch `values` of `ticket` is stored. Returns `false` (and changes nothing) for a
    /// batch from before the last actualization.
    pub fn batch_written(&mut self, ticket: BatchTicket, values: &[SeqValue]) -> bool {
        if self.write != Write::InFlight(ticket) {
            return false;
        }
        self.write = Write::Idle;
        for v in values {
            // A number committed after the batch was taken stays until it is written too.
            if self.pending.get(&v.key) == Some(&v.value) {
                self.pending.remove(&v.key);
            }
        }
        if let Phase::Replaying(o) | Phase::Ready(o) = &mut self.phase {
            o.persisted = o.persisted.max(ticket.next_offset);
            debug_assert!(
                o.persisted <= o.next,
                "never persisted beyond what is covered"
            );
        }
        true
    }

    /// The batch of `ticket` failed; it may be taken again. `false` for a stale ticket.
    pub fn batch_failed(&mut self, ticket: BatchTicket) -> bool {
        if self.write != Write::InFlight(ticket) {
            return false;
        }
        self.write = Write::Idle;
        true
    }

    /// The writer of the batch in flight is gone (stopped mid-write): the batch may be taken
    /// again. A completion of it, should one still arrive, is ignored. Nothing pending is lost;
    /// writing a value twice is harmless because storage merges by maximum.
    pub fn abandon_batch(&mut self) {
        if self.is_writing() {
            self.epoch = self.epoch.wrapping_add(1);
            self.write = Write::Idle;
        }
    }

    /// Starts an actualization: forgets everything pending (the PLog still has it) and any
    /// batch in flight (its completion will be ignored).
    pub fn begin_actualization(&mut self) {
        self.forget();
        self.phase = Phase::Loading;
    }

    /// The stored offset was read: replay the PLog from it.
    pub fn loaded(&mut self, stored_next_offset: PLogOffset) -> Result<(), BacklogError> {
        if self.phase != Phase::Loading {
            return Err(self.wrong("loaded", "Loading"));
        }
        self.phase = Phase::Replaying(Offsets {
            next: stored_next_offset,
            persisted: stored_next_offset,
        });
        Ok(())
    }

    /// The offset to replay the PLog from.
    pub fn replay_from(&self) -> Option<PLogOffset> {
        match self.phase {
            Phase::Replaying(o) => Some(o.next),
            _ => None,
        }
    }

    /// Merges the numbers of the replayed event at `offset` (keys may repeat, in any order).
    ///
    /// Offsets must grow: an event below the covered offset (one replayed already, or one
    /// below the stored offset the replay started from) means the PLog broke its order: it is
    /// refused with [`BacklogError::PLogOutOfOrder`], nothing of it is merged, and the backlog
    /// turns [`Phase::Corrupt`] (everything pending forgotten, as on a failure), so that no
    /// number is handed out from that log and no driver can retry it as a passing failure.
    pub fn replay(
        &mut self,
        offset: PLogOffset,
        values: &[SeqValue],
    ) -> Result<ReplayStep, BacklogError> {
        let Phase::Replaying(o) = self.phase else {
            return Err(self.wrong("replay", "Replaying"));
        };
        if offset < o.next {
            self.forget();
            self.phase = Phase::Corrupt {
                covered: o.next,
                got: offset,
            };
            return Err(BacklogError::PLogOutOfOrder {
                covered: o.next,
                got: offset,
            });
        }
        let next = offset
            .next()
            .ok_or(BacklogError::OffsetsExhausted(offset))?;
        for v in values {
            self.merge(v.key, v.value);
        }
        self.phase = Phase::Replaying(Offsets { next, ..o });
        Ok(if self.over_limit() {
            ReplayStep::Full
        } else {
            ReplayStep::Continue
        })
    }

    /// The PLog is replayed to its end: transactions may start.
    pub fn actualized(&mut self) -> Result<(), BacklogError> {
        let Phase::Replaying(o) = self.phase else {
            return Err(self.wrong("actualized", "Replaying"));
        };
        self.phase = Phase::Ready(o);
        Ok(())
    }

    /// The actualization gave up. `start` is refused until a new one succeeds. A backlog that
    /// found the PLog corrupt stays [`Phase::Corrupt`]: that is why it gave up.
    pub fn actualization_failed(&mut self) {
        self.forget();
        if !matches!(self.phase, Phase::Corrupt { .. }) {
            self.phase = Phase::Failed;
        }
    }

    /// Forgets everything pending and any batch in flight (its completion will be ignored).
    fn forget(&mut self) {
        self.epoch = self.epoch.wrapping_add(1);
        self.pending.clear();
        self.write = Write::Idle;
    }

    fn wrong(&self, call: &'static str, needs: &'static str) -> BacklogError {
        BacklogError::WrongPhase {
            phase: self.phase,
            call,
            needs,
        }
    }
}
