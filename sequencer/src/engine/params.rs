//! What a sequencer is configured with, validated once so that nothing later has to doubt it.

use super::types::{Number, SeqId, WsKind};

/// Most sequences one workspace kind may declare. A transaction touches at most this many keys,
/// which bounds the per-transaction buffers.
pub const SEQS_PER_KIND_MAX: usize = 1024;
/// Most workspace kinds one sequencer may know.
pub const KINDS_MAX: usize = 4096;
/// Largest cache the sequencer agrees to preallocate.
pub const CACHE_CAPACITY_MAX: usize = 10_000_000;
/// Largest bound on unflushed keys.
pub const UNFLUSHED_KEYS_LIMIT: usize = 1_000_000;
/// Largest bound on unflushed events (the replay window after a crash).
pub const UNFLUSHED_EVENTS_LIMIT: u64 = 1_000_000;

/// Default cache capacity (keys).
pub const CACHE_CAPACITY_DEFAULT: usize = 100_000;
/// Default bound on unflushed keys.
pub const UNFLUSHED_KEYS_DEFAULT: usize = 500;
/// Default bound on unflushed events.
pub const UNFLUSHED_EVENTS_DEFAULT: u64 = 1_000;

/// A [`Params`] that cannot work.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ParamsError {
    /// No sequence was declared at all.
    #[error("no sequences declared")]
    NoSequences,
    /// Initial values start at 1: `0` means "nothing issued" in storage.
    #[error(
        "sequence {seq_id:?} of kind {ws_kind:?} has initial value 0; initial values start at 1"
    )]
    InitialZero {
        /// The kind.
        ws_kind: WsKind,
        /// The sequence.
        seq_id: SeqId,
    },
    /// The same sequence was declared twice for one kind.
    #[error("sequence {seq_id:?} of kind {ws_kind:?} declared twice")]
    Duplicate {
        /// The kind.
        ws_kind: WsKind,
        /// The sequence.
        seq_id: SeqId,
    },
    /// A capacity or limit is zero.
    #[error("{what} must be at least 1")]
    Zero {
        /// Which setting.
        what: &'static str,
    },
    /// A capacity, limit or count is above what the sequencer supports.
    #[error("{what} is {value}, more than the supported {max}")]
    TooLarge {
        /// Which setting.
        what: &'static str,
        /// The value given.
        value: u64,
        /// The largest supported.
        max: u64,
    },
}

/// The sequences of one workspace kind, sorted by id.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct KindSeqs {
    pub(crate) ws_kind: WsKind,
    pub(crate) seqs: Vec<(SeqId, Number)>,
}

/// Validated sequencer parameters. Build with [`Params::builder`].
///
/// ```
/// use vvm_sequencer::engine::{Number, Params, SeqId, WsKind};
///
/// let params = Params::builder()
///     .sequence(WsKind(1), SeqId(1), Number(1))
///     .sequence(WsKind(1), SeqId(2), Number(200_001))
///     .cache_capacity(10_000)
///     .build()
///     .unwrap();
/// assert_eq!(params.initial(WsKind(1), SeqId(2)), Some(Number(200_001)));
/// assert!(Params::builder().sequence(WsKind(1), SeqId(1), Number(0)).build().is_err());
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Params {
    pub(crate) kinds: Vec<KindSeqs>,
    pub(crate) cache_capacity: usize,
    pub(crate) unflushed_keys_max: usize,
    pub(crate) unflushed_events_max: u64,
    pub(crate) seqs_per_kind_max: usize,
}

/// Collects [`Params`]; [`build`](ParamsBuilder::build) validates.
#[derive(Clone, Debug)]
pub struct ParamsBuilder {
    declared: Vec<(WsKind, SeqId, Number)>,
    cache_capacity: usize,
    unflushed_keys_max: usize,
    unflushed_events_max: u64,
}

impl Params {
    /// Starts a builder with the default limits and no sequences.
    pub fn builder() -> ParamsBuilder {
        ParamsBuilder {
            declared: Vec::new(),
            cache_capacity: CACHE_CAPACITY_DEFAULT,
            unflushed_keys_max: UNFLUSHED_KEYS_DEFAULT,
            unflushed_events_max: UNFLUSHED_EVENTS_DEFAULT,
        }
    }

    /// The initial value of `seq_id` in workspaces of `ws_kind`, if declared.
    pub fn initial(&self, ws_kind: WsKind, seq_id: SeqId) -> Option<Number> {
        let kind = self.kind_index(ws_kind)?;
        self.seq_initial(kind, seq_id)
    }

    /// How many keys the cache holds at most.
    pub fn cache_capacity(&self) -> usize {
        self.cache_capacity
    }

    /// Above this many unflushed keys, `start` is refused.
    pub fn unflushed_keys_max(&self) -> usize {
        self.unflushed_keys_max
    }

    /// Above this many unflushed events, `start` is refused.
    pub fn unflushed_events_max(&self) -> u64 {
        self.unflushed_events_max
    }

    /// The most sequences any declared kind has: the most keys one transaction can touch.
    pub fn seqs_per_kind_max(&self) -> usize {
        self.seqs_per_kind_max
    }

    #[inline]
    pub(crate) fn kind_index(&self, ws_kind: WsKind) -> Option<usize> {
        self.kinds
            .binary_search_by_key(&ws_kind, |k| k.ws_kind)
            .ok()
    }

    #[inline]
    pub(crate) fn kind_seqs(&self, kind: usize) -> &[(SeqId, Number)] {
        self.kinds.get(kind).map_or(&[], |k| k.seqs.as_slice())
    }

    #[inline]
    pub(crate) fn seq_initial(&self, kind: usize, seq_id: SeqId) -> Option<Number> {
        let seqs = self.kind_seqs(kind);
        // Kinds have few sequences: a scan beats a binary search at these sizes.
        seqs.iter().find(|(id, _)| *id == seq_id).map(|&(_, n)| n)
    }
}

fn check_range(what: &'static str, value: u64, max: u64) -> Result<(), ParamsError> {
    if value == 0 {
        return Err(ParamsError::Zero { what });
    }
    if value > max {
        return Err(ParamsError::TooLarge { what, value, max });
    }
    Ok(())
}

impl ParamsBuilder {
    /// Declares sequence `seq_id` for workspaces of `ws_kind`, starting at `initial` (≥ 1).
    pub fn sequence(mut self, ws_kind: WsKind, seq_id: SeqId, initial: Number) -> Self {
        self.declared.push((ws_kind, seq_id, initial));
        self
    }

    /// How many keys the cache holds at most (default [`CACHE_CAPACITY_DEFAULT`]).
    pub fn cache_capacity(mut self, keys: usize) -> Self {
        self.cache_capacity = keys;
        self
    }

    /// Above this many unflushed keys `start` is refused (default [`UNFLUSHED_KEYS_DEFAULT`]).
    pub fn unflushed_keys_max(mut self, keys: usize) -> Self {
        self.unflushed_keys_max = keys;
        self
    }

    /// Above this many unflushed events `start` is refused (default
    /// [`UNFLUSHED_EVENTS_DEFAULT`]). This bounds how much PLog a recovery has to replay.
    pub fn unflushed_events_max(mut self, events: u64) -> Self {
        self.unflushed_events_max = events;
        self
    }

    /// Validates and builds.
    pub fn build(self) -> Result<Params, ParamsError> {
        if self.declared.is_empty() {
            return Err(ParamsError::NoSequences);
        }
        check_range(
            "cache capacity",
            self.cache_capacity as u64,
            CACHE_CAPACITY_MAX as u64,
        )?;
        check_range(
            "unflushed keys max",
            self.unflushed_keys_max as u64,
            UNFLUSHED_KEYS_LIMIT as u64,
        )?;
        check_range(
            "unflushed events max",
            self.unflushed_events_max,
            UNFLUSHED_EVENTS_LIMIT,
        )?;
        let mut declared = self.declared;
        declared.sort_by_key(|&(kind, seq, _)| (kind, seq));
        let mut kinds: Vec<KindSeqs> = Vec::new();
        for (ws_kind, seq_id, initial) in declared {
            if initial.0 == 0 {
                return Err(ParamsError::InitialZero { ws_kind, seq_id });
            }
            match kinds.last_mut() {
                Some(last) if last.ws_kind == ws_kind => {
                    if last.seqs.last().is_some_and(|&(s, _)| s == seq_id) {
                        return Err(ParamsError::Duplicate { ws_kind, seq_id });
                    }
                    last.seqs.push((seq_id, initial));
                }
                _ => kinds.push(KindSeqs {
                    ws_kind,
                    seqs: vec![(seq_id, initial)],
                }),
            }
        }
        if kinds.len() > KINDS_MAX {
            return Err(ParamsError::TooLarge {
                what: "workspace kinds",
                value: kinds.len() as u64,
                max: KINDS_MAX as u64,
            });
        }
        let seqs_per_kind_max = kinds.iter().map(|k| k.seqs.len()).max().unwrap_or(0);
        if seqs_per_kind_max > SEQS_PER_KIND_MAX {
            return Err(ParamsError::TooLarge {
                what: "sequences of one kind",
                value: seqs_per_kind_max as u64,
                max: SEQS_PER_KIND_MAX as u64,
            });
        }
        Ok(Params {
            kinds,
            cache_capacity: self.cache_capacity,
            unflushed_keys_max: self.unflushed_keys_max,
            unflushed_events_max: self.unflushed_events_max,
            seqs_per_kind_max,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn one() -> ParamsBuilder {
        Params::builder().sequence(WsKind(1), SeqId(1), Number(1))
    }

    // covers: Seq.ParamsValid
    #[test]
    fn invalid_params_are_refused_with_a_reason() {
        assert_eq!(Params::builder().build(), Err(ParamsError::NoSequences));
        assert_eq!(
            Params::builder()
                .sequence(WsKind(3), SeqId(4), Number(0))
                .build(),
            Err(ParamsError::InitialZero {
                ws_kind: WsKind(3),
                seq_id: SeqId(4)
            })
        );
        assert_eq!(
            one().sequence(WsKind(1), SeqId(1), Number(5)).build(),
            Err(ParamsError::Duplicate {
                ws_kind: WsKind(1),
                seq_id: SeqId(1)
            })
        );
        assert_eq!(
            one().cache_capacity(0).build(),
            Err(ParamsError::Zero {
                what: "cache capacity"
            })
        );
        assert_eq!(
            one().unflushed_keys_max(0).build(),
            Err(ParamsError::Zero {
                what: "unflushed keys max"
            })
        );
        assert_eq!(
            one().unflushed_events_max(0).build(),
            Err(ParamsError::Zero {
                what: "unflushed events max"
            })
        );
        assert!(matches!(
            one().cache_capacity(CACHE_CAPACITY_MAX + 1).build(),
            Err(ParamsError::TooLarge { .. })
        ));
        let mut many = Params::builder();
        for s in 0..=SEQS_PER_KIND_MAX as u16 {
            many = many.sequence(WsKind(1), SeqId(s), Number(1));
        }
        assert!(matches!(many.build(), Err(ParamsError::TooLarge { .. })));
    }

    #[test]
    fn unknown_kinds_and_sequences_have_no_initial_value() {
        let p = one()
            .sequence(WsKind(9), SeqId(2), Number(7))
            .build()
            .unwrap();
        assert_eq!(p.initial(WsKind(9), SeqId(2)), Some(Number(7)));
        assert_eq!(p.initial(WsKind(9), SeqId(1)), None);
        assert_eq!(p.initial(WsKind(2), SeqId(1)), None);
        assert_eq!(p.seqs_per_kind_max(), 1);
    }
}
