//! The transaction side: which number `next` hands out, from the cache or the transaction
//! itself; what the caller must look up elsewhere (the backlog, then storage) when neither knows.
//!
//! Owned by the one caller that runs transactions; shares nothing, so the cached path of `next`
//! takes no lock and allocates nothing.

use super::cache::Cache;
use super::params::Params;
use super::types::{Number, NumberKey, SeqId, WsId, WsKind};

/// Why a sequencing call failed. The sequencer's state is unchanged by a failed call.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum SeqError {
    /// The workspace kind declares no sequences.
    #[error("workspace kind {0:?} has no sequences")]
    UnknownWsKind(WsKind),
    /// The sequence is not declared for the workspace's kind.
    #[error("sequence {seq_id:?} is not declared for workspace kind {ws_kind:?}")]
    UnknownSeqId {
        /// The transaction's workspace kind.
        ws_kind: WsKind,
        /// The sequence asked for.
        seq_id: SeqId,
    },
    /// The sequence already handed out `u64::MAX`; there is no next number.
    #[error("sequence {key:?} is exhausted: u64::MAX was handed out")]
    Exhausted {
        /// The sequence.
        key: NumberKey,
    },
    /// A transaction call outside a transaction (the runtime's types rule this out).
    #[error("no sequencing transaction is in progress")]
    NotInTransaction,
    /// `begin` inside a transaction (the runtime's types rule this out).
    #[error("a sequencing transaction is already in progress")]
    InTransaction,
    /// [`Issuer::next_from`] was handed another count of numbers than the kind has sequences.
    #[error("{pending} pending and {stored} stored numbers for a kind of {seqs} sequences")]
    Sources {
        /// Sequences of the transaction's kind.
        seqs: usize,
        /// Numbers from the backlog.
        pending: usize,
        /// Numbers from storage.
        stored: usize,
    },
}

/// The number after `last` (0 = nothing issued yet), never below `initial`, never a wrap.
#[inline]
pub fn number_after(last: Number, initial: Number, key: NumberKey) -> Result<Number, SeqError> {
    let after = last.0.checked_add(1).ok_or(SeqError::Exhausted { key })?;
    Ok(Number(after.max(initial.0)))
}

/// The open transaction's workspace and the numbers it issued, one per sequence touched.
pub type Issued<'a> = (WsId, &'a [(SeqId, Number)]);

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Tx {
    Idle,
    Open {
        ws_kind: WsKind,
        kind: usize,
        ws_id: WsId,
    },
}

/// The transaction side of a sequencer.
#[derive(Clone, Debug)]
pub struct Issuer {
    params: Params,
    cache: Cache,
    tx: Tx,
    /// Numbers the open transaction issued, one entry per sequence touched; empty when idle.
    /// Kept across transactions (capacity: the largest kind) so that none allocates.
    issued: Vec<(SeqId, Number)>,
    /// For each entry of `issued`, the cache slot its key was given when last issued: a hint
    /// that spares the hash lookup when a transaction uses a sequence again (checked before
    /// use; the key may have been evicted since).
    slots: Vec<u32>,
}

/// Equal when their parameters, caches, transactions and issued numbers are; the slot hints
/// are how, not what.
impl PartialEq for Issuer {
    fn eq(&self, other: &Self) -> bool {
        self.params == other.params
            && self.cache == other.cache
            && self.tx == other.tx
            && self.issued == other.issued
    }
}

impl Eq for Issuer {}

impl Issuer {
    /// An idle issuer with an empty cache.
    pub fn new(params: Params) -> Self {
        let cache = Cache::new(params.cache_capacity());
        let issued = Vec::with_capacity(params.seqs_per_kind_max());
        let slots = Vec::with_capacity(params.seqs_per_kind_max());
        Issuer {
            params,
            cache,
            tx: Tx::Idle,
            issued,
            slots,
        }
    }

    /// The parameters.
    pub fn params(&self) -> &Params {
        &self.params
    }

    /// The cache of last issued numbers.
    pub fn cache(&self) -> &Cache {
        &self.cache
    }

    /// The open transaction's workspace, if any.
    pub fn transaction(&self) -> Option<(WsKind, WsId)> {
        match self.tx {
            Tx::Idle => None,
            Tx::Open { ws_kind, ws_id, .. } => Some((ws_kind, ws_id)),
        }
    }

    /// Opens a transaction for workspace `ws_id` of kind `ws_kind`.
    #[inline]
    pub fn begin(&mut self, ws_kind: WsKind, ws_id: WsId) -> Result<(), SeqError> {
        if self.tx != Tx::Idle {
            return Err(SeqError::InTransaction);
        }
        let kind = self
            .params
            .kind_index(ws_kind)
            .ok_or(SeqError::UnknownWsKind(ws_kind))?;
        debug_assert!(self.issued.is_empty(), "an idle issuer holds no numbers");
        self.tx = Tx::Open {
            ws_kind,
            kind,
            ws_id,
        };
        Ok(())
    }

    #[inline]
    fn open(&self, seq_id: SeqId) -> Result<(NumberKey, Number), SeqError> {
        let Tx::Open {
            ws_kind,
            kind,
            ws_id,
        } = self.tx
        else {
            return Err(SeqError::NotInTransaction);
        };
        let initial = self
            .params
            .seq_initial(kind, seq_id)
            .ok_or(SeqError::UnknownSeqId { ws_kind, seq_id })?;
        Ok((NumberKey { ws_id, seq_id }, initial))
    }

    /// The key `seq_id` has in the open transaction (checks that the sequence is declared).
    pub fn key(&self, seq_id: SeqId) -> Result<NumberKey, SeqError> {
        self.open(seq_id).map(|(key, _)| key)
    }

    /// Where `seq_id` is in `issued`, if the open transaction issued it.
    #[inline]
    fn issued_at(&self, seq_id: SeqId) -> Option<usize> {
        self.issued.iter().position(|(s, _)| *s == seq_id)
    }

    /// Records `n` (cached in `slot`) as the open transaction's number of `seq_id`.
    #[inline]
    fn record(&mut self, seq_id: SeqId, n: Number, slot: u32) {
        match self.issued_at(seq_id) {
            Some(at) => self.set_issued(at, n, slot),
            None => self.push_issued(seq_id, n, slot),
        }
    }

    #[inline]
    fn set_issued(&mut self, at: usize, n: Number, slot: u32) {
        if let (Some(entry), Some(hint)) = (self.issued.get_mut(at), self.slots.get_mut(at)) {
            entry.1 = n;
            *hint = slot;
        }
    }

    #[inline]
    fn push_issued(&mut self, seq_id: SeqId, n: Number, slot: u32) {
        debug_assert!(
            self.issued.len() < self.params.seqs_per_kind_max(),
            "a transaction touches at most the sequences of its kind"
        );
        self.issued.push((seq_id, n));
        self.slots.push(slot);
    }

    /// Hands out the next number of `seq_id` if the cache or the transaction knows the last
    /// one; `Ok(None)` when the caller must read storage and call
    /// [`next_from`](Self::next_from).
    #[inline]
    pub fn next_cached(&mut self, seq_id: SeqId) -> Result<Option<Number>, SeqError> {
        // Used before in this transaction: its number is the newest (the cache, when it still
        // has the key, holds the same), and the slot hint spares the hash lookup. The sequence
        // was checked then, and its number is at or above the initial value already.
        if let Tx::Open { ws_id, kind, .. } = self.tx {
            let used = self.issued.iter_mut().zip(self.slots.iter_mut());
            if let Some(((_, last), hint)) = used.into_iter().find(|((s, _), _)| *s == seq_id) {
                let key = NumberKey { ws_id, seq_id };
                debug_assert!(
                    self.params
                        .seq_initial(kind, seq_id)
                        .is_some_and(|initial| *last >= initial),
                    "issued numbers are declared and at or above their initial value"
                );
                let n = number_after(*last, Number(0), key)?;
                match self.cache.get_mut_at(*hint, &key) {
                    Some(cached) => {
                        debug_assert_eq!(*cached, *last, "cache and transaction agree");
                        *cached = n;
                    }
                    // Evicted during this transaction: the transaction itself still knew.
                    None => *hint = self.cache.put_slot(key, n),
                }
                *last = n;
                return Ok(Some(n));
            }
        }
        let (key, initial) = self.open(seq_id)?;
        if let Some((slot, last)) = self.cache.get_mut_slot(&key) {
            let n = number_after(*last, initial, key)?;
            *last = n;
            self.push_issued(seq_id, n, slot);
            return Ok(Some(n));
        }
        Ok(None)
    }

    /// Hands out the next number of `seq_id` when [`next_cached`](Self::next_cached) could
    /// not: from what the backlog (`pending`, see [`Backlog::snapshot`](super::Backlog::snapshot),
    /// taken before storage was read) and storage (`stored`) know of every sequence of the open
    /// transaction's kind, both in the order of [`kind_seqs`](Self::kind_seqs).
    ///
    /// The last number of a key is the **maximum** of the two, never one of them alone: the
    /// backlog misses what was written already, and it may hold a replayed number below what
    /// storage holds (a PLog event may carry a number below its key's highest, e.g. one
    /// committed before the sequence's initial value was raised). The kind's other sequences
    /// are cached too (zeros included: a workspace costs one read); the one asked for goes
    /// last, so that a small cache keeps it.
    ///
    /// Cached numbers need no such merge: a key enters the cache only through this maximum (or
    /// as a number handed out above it), so for the keys it holds the cache is at or above the
    /// backlog and storage.
    pub fn next_from(
        &mut self,
        seq_id: SeqId,
        pending: &[Number],
        stored: &[Number],
    ) -> Result<Number, SeqError> {
        let seqs = self.kind_seqs()?.len();
        if pending.len() != seqs || stored.len() != seqs {
            return Err(SeqError::Sources {
                seqs,
                pending: pending.len(),
                stored: stored.len(),
            });
        }
        // Checks that `seq_id` is declared before anything is cached.
        self.key(seq_id)?;
        let mut asked = Number(0);
        for (i, (&pending, &stored)) in pending.iter().zip(stored).enumerate() {
            let last = pending.max(stored);
            let s = match self.kind_seqs()?.get(i) {
                Some(&(s, _)) => s,
                None => break,
            };
            if s == seq_id {
                asked = last;
            } else {
                self.warm(s, last)?;
            }
        }
        self.next_after(seq_id, asked)
    }

    /// Hands out the number after `last` (`Number(0)` when none is known), never below the
    /// initial value. `last` must be the highest number known anywhere for `seq_id`, which
    /// [`next_from`](Self::next_from) computes; so this stays private.
    fn next_after(&mut self, seq_id: SeqId, last: Number) -> Result<Number, SeqError> {
        let (key, initial) = self.open(seq_id)?;
        let n = number_after(last, initial, key)?;
        let slot = self.cache.put_slot(key, n);
        self.record(seq_id, n, slot);
        Ok(n)
    }

    /// Caches `last` for `seq_id` unless the cache or the transaction knows it already (their
    /// values are newer). Used for the sequences read alongside the one asked for; private for
    /// the same reason as `next_after`.
    ///
    /// `Number(0)` ("nothing issued yet") is cached too: it is an answer like any other, and
    /// without it every further sequence of a new workspace would cost another storage read.
    fn warm(&mut self, seq_id: SeqId, last: Number) -> Result<(), SeqError> {
        let (key, _) = self.open(seq_id)?;
        if self.cache.peek(&key).is_some() || self.issued.iter().any(|(s, _)| *s == seq_id) {
            return Ok(());
        }
        self.cache.put(key, last);
        Ok(())
    }

    /// The sequences of the open transaction's kind with their initial values.
    pub fn kind_seqs(&self) -> Result<&[(SeqId, Number)], SeqError> {
        match self.tx {
            Tx::Idle => Err(SeqError::NotInTransaction),
            Tx::Open { kind, .. } => Ok(self.params.kind_seqs(kind)),
        }
    }

    /// The open transaction's workspace and the numbers it issued (to commit).
    #[inline]
    pub fn issued(&self) -> Result<Issued<'_>, SeqError> {
        match self.tx {
            Tx::Idle => Err(SeqError::NotInTransaction),
            Tx::Open { ws_id, .. } => Ok((ws_id, self.issued.as_slice())),
        }
    }

    /// Closes the transaction after its numbers were committed; the cache keeps them.
    #[inline]
    pub fn end(&mut self) -> Result<(), SeqError> {
        if self.tx == Tx::Idle {
            return Err(SeqError::NotInTransaction);
        }
        self.issued.clear();
        self.slots.clear();
        self.tx = Tx::Idle;
        Ok(())
    }

    /// Drops the open transaction (if any) and the whole cache: its event was not written, so
    /// its numbers are handed out again, and the cache may hold them.
    pub fn abort(&mut self) {
        self.issued.clear();
        self.slots.clear();
        self.cache.clear();
        self.tx = Tx::Idle;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn params(cache: usize) -> Params {
        Params::builder()
            .sequence(WsKind(1), SeqId(1), Number(100))
            .sequence(WsKind(1), SeqId(2), Number(1))
            .cache_capacity(cache)
            .build()
            .unwrap()
    }

    fn key(ws: u64, seq: u16) -> NumberKey {
        NumberKey {
            ws_id: WsId(ws),
            seq_id: SeqId(seq),
        }
    }

    // covers: Seq.Next
    #[test]
    fn the_cache_then_the_transaction_answer_and_the_rest_is_left_to_the_caller() {
        let mut i = Issuer::new(params(1));
        i.begin(WsKind(1), WsId(7)).unwrap();
        assert_eq!(i.next_cached(SeqId(1)), Ok(None), "nothing known yet");
        assert_eq!(i.next_after(SeqId(1), Number(0)), Ok(Number(100)));
        assert_eq!(i.next_cached(SeqId(1)), Ok(Some(Number(101))), "cache");
        assert_eq!(i.next_after(SeqId(2), Number(41)), Ok(Number(42)));
        // Cache of one: SeqId(1) was evicted by SeqId(2); the transaction still knows it.
        assert_eq!(i.cache().peek(&key(7, 1)), None);
        assert_eq!(
            i.next_cached(SeqId(1)),
            Ok(Some(Number(102))),
            "transaction"
        );
        assert_eq!(
            i.issued(),
            Ok((
                WsId(7),
                &[(SeqId(1), Number(102)), (SeqId(2), Number(42))][..]
            ))
        );
        i.end().unwrap();
        assert_eq!(i.transaction(), None);
        assert_eq!(i.cache().peek(&key(7, 1)), Some(Number(102)));
    }

    // covers: Seq.Next
    #[test]
    fn numbers_used_again_in_a_transaction_survive_evictions_of_their_cache_slot() {
        let mut i = Issuer::new(params(1));
        i.begin(WsKind(1), WsId(7)).unwrap();
        assert_eq!(i.next_after(SeqId(1), Number(0)), Ok(Number(100)));
        assert_eq!(i.next_after(SeqId(2), Number(0)), Ok(Number(1)));
        // Each call evicts the other sequence from the one slot there is.
        for round in 1..=3 {
            assert_eq!(i.next_cached(SeqId(1)), Ok(Some(Number(100 + round))));
            assert_eq!(i.cache().peek(&key(7, 2)), None);
            assert_eq!(i.next_cached(SeqId(2)), Ok(Some(Number(1 + round))));
            assert_eq!(i.cache().peek(&key(7, 1)), None);
        }
        assert_eq!(
            i.next_cached(SeqId(2)),
            Ok(Some(Number(5))),
            "slot still its own"
        );
        assert_eq!(
            i.issued(),
            Ok((
                WsId(7),
                &[(SeqId(1), Number(103)), (SeqId(2), Number(5))][..]
            ))
        );
        i.end().unwrap();
        i.begin(WsKind(1), WsId(7)).unwrap();
        assert_eq!(
            i.next_cached(SeqId(2)),
            Ok(Some(Number(6))),
            "from the cache"
        );
        assert_eq!(
            i.next_cached(SeqId(1)),
            Ok(None),
            "evicted, and new to this transaction"
        );
    }

    // covers: Seq.UnknownSeq
    #[test]
    fn unknown_kinds_and_sequences_are_errors_that_change_nothing() {
        let mut i = Issuer::new(params(4));
        assert_eq!(
            i.begin(WsKind(2), WsId(1)),
            Err(SeqError::UnknownWsKind(WsKind(2)))
        );
        assert_eq!(i.transaction(), None);
        i.begin(WsKind(1), WsId(1)).unwrap();
        i.next_after(SeqId(2), Number(0)).unwrap();
        let before = i.clone();
        assert_eq!(
            i.next_cached(SeqId(9)),
            Err(SeqError::UnknownSeqId {
                ws_kind: WsKind(1),
                seq_id: SeqId(9)
            })
        );
        assert!(i.next_after(SeqId(9), Number(5)).is_err());
        assert!(i.warm(SeqId(9), Number(5)).is_err());
        assert_eq!(i, before);
    }

    // covers: Seq.NoWrap
    #[test]
    fn a_sequence_at_u64_max_is_exhausted_never_wrapped() {
        let mut i = Issuer::new(params(4));
        i.begin(WsKind(1), WsId(1)).unwrap();
        let k = key(1, 2);
        assert_eq!(
            i.next_after(SeqId(2), Number(u64::MAX - 1)),
            Ok(Number(u64::MAX))
        );
        assert_eq!(i.next_cached(SeqId(2)), Err(SeqError::Exhausted { key: k }));
        assert_eq!(
            i.next_after(SeqId(2), Number(u64::MAX)),
            Err(SeqError::Exhausted { key: k })
        );
        assert_eq!(i.cache().peek(&k), Some(Number(u64::MAX)), "unchanged");
    }

    // covers: Seq.InitialFloor
    #[test]
    fn numbers_never_go_below_the_initial_value() {
        let mut i = Issuer::new(params(4));
        i.begin(WsKind(1), WsId(1)).unwrap();
        assert_eq!(i.next_after(SeqId(1), Number(5)), Ok(Number(100)));
        assert_eq!(i.next_cached(SeqId(1)), Ok(Some(Number(101))));
        assert_eq!(
            number_after(Number(65_537), Number(200_001), key(1, 1)),
            Ok(Number(200_001))
        );
    }

    // covers: Seq.NextMax
    #[test]
    fn a_number_not_cached_is_the_maximum_of_the_backlog_and_storage() {
        let mut i = Issuer::new(params(4));
        i.begin(WsKind(1), WsId(1)).unwrap();
        // A replayed number below what storage holds (SeqId(1)), and one above (SeqId(2)).
        let (pending, stored) = ([Number(65_537), Number(9)], [Number(200_050), Number(3)]);
        assert_eq!(
            i.next_from(SeqId(1), &pending, &stored),
            Ok(Number(200_051))
        );
        assert_eq!(i.cache().peek(&key(1, 2)), Some(Number(9)), "warmed: max");
        assert_eq!(i.next_cached(SeqId(2)), Ok(Some(Number(10))));
        let before = i.clone();
        assert_eq!(
            i.next_from(SeqId(1), &pending[..1], &stored),
            Err(SeqError::Sources {
                seqs: 2,
                pending: 1,
                stored: 2
            })
        );
        assert!(i.next_from(SeqId(9), &pending, &stored).is_err());
        assert_eq!(i, before, "a refused call changes nothing");
    }

    #[test]
    fn calls_outside_a_transaction_are_errors() {
        let mut i = Issuer::new(params(4));
        assert_eq!(i.next_cached(SeqId(1)), Err(SeqError::NotInTransaction));
        assert_eq!(i.end(), Err(SeqError::NotInTransaction));
        assert!(i.issued().is_err());
        assert!(i.kind_seqs().is_err());
        i.begin(WsKind(1), WsId(1)).unwrap();
        assert_eq!(i.begin(WsKind(1), WsId(2)), Err(SeqError::InTransaction));
    }

    // covers: Seq.SourceOrder
    #[test]
    fn a_warmed_zero_answers_from_the_cache_with_the_initial_value() {
        let mut i = Issuer::new(params(4));
        i.begin(WsKind(1), WsId(1)).unwrap();
        i.warm(SeqId(1), Number(0)).unwrap();
        assert_eq!(i.cache().peek(&key(1, 1)), Some(Number(0)));
        assert_eq!(i.next_cached(SeqId(1)), Ok(Some(Number(100))));
        assert_eq!(i.next_cached(SeqId(1)), Ok(Some(Number(101))));
    }

    #[test]
    fn warming_never_overrides_newer_numbers_and_abort_forgets_everything() {
        let mut i = Issuer::new(params(4));
        i.begin(WsKind(1), WsId(1)).unwrap();
        i.next_after(SeqId(1), Number(0)).unwrap();
        i.warm(SeqId(1), Number(7)).unwrap();
        i.warm(SeqId(2), Number(7)).unwrap();
        assert_eq!(i.cache().peek(&key(1, 1)), Some(Number(100)));
        assert_eq!(i.cache().peek(&key(1, 2)), Some(Number(7)));
        i.abort();
        assert!(i.cache().is_empty());
        assert_eq!(i.transaction(), None);
        assert!(i.issued().is_err());
    }
}
