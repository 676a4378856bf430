//! The identifiers and values the sequencer deals in, and the hasher of its maps.

use core::hash::{BuildHasherDefault, Hash, Hasher};

/// Names a sequence within a workspace kind (for example "record IDs" or "WLog offsets").
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct SeqId(pub u16);

/// A workspace kind: decides which sequences a workspace has and their initial values.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct WsKind(pub u16);

/// A workspace.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct WsId(pub u64);

/// A number handed out by a sequence. `Number(0)` is never handed out: storage uses it for
/// "nothing issued yet".
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Number(pub u64);

/// The position of an event in the partition's event log (the PLog).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct PLogOffset(pub u64);

impl PLogOffset {
    /// The offset after this one, or `None` at `u64::MAX`.
    #[inline]
    pub fn next(self) -> Option<PLogOffset> {
        self.0.checked_add(1).map(PLogOffset)
    }
}

/// One sequence of one workspace: the unit the cache, the backlog and storage are keyed by.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct NumberKey {
    /// The workspace.
    pub ws_id: WsId,
    /// The sequence.
    pub seq_id: SeqId,
}

impl Hash for NumberKey {
    /// One 128-bit write (workspace above sequence), so that [`KeyHasher`] mixes a key with a
    /// single multiplication.
    #[inline]
    fn hash<H: Hasher>(&self, state: &mut H) {
        state.write_u128((u128::from(self.ws_id.0) << 16) | u128::from(self.seq_id.0));
    }
}

/// A number used by an event (when replayed or written), or the highest number known to be
/// used (when stored).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct SeqValue {
    /// Which sequence.
    pub key: NumberKey,
    /// The number.
    pub value: Number,
}

/// A fast hasher for [`NumberKey`]: a multiply-fold mix of the workspace and sequence ids.
///
/// Keys are ids chosen by the platform, not by remote users, so a keyed (DoS-resistant) hash
/// buys nothing here while costing a large share of the `next` budget.
#[derive(Clone, Copy, Debug, Default)]
pub struct KeyHasher {
    state: u64,
}

const MIX_A: u64 = 0x9E37_79B9_7F4A_7C15;
const MIX_B: u64 = 0xD6E8_FEB8_6659_FD93;

#[inline]
fn fold_mul(a: u64, b: u64) -> u64 {
    let full = u128::from(a).wrapping_mul(u128::from(b));
    // Truncation is the point: fold the high half onto the low half.
    (full as u64) ^ ((full >> 64) as u64)
}

impl Hasher for KeyHasher {
    #[inline]
    fn finish(&self) -> u64 {
        self.state
    }

    #[inline]
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.write_u64(u64::from(b));
        }
    }

    #[inline]
    fn write_u16(&mut self, i: u16) {
        self.write_u64(u64::from(i));
    }

    #[inline]
    fn write_u64(&mut self, i: u64) {
        self.state = fold_mul(self.state ^ i ^ MIX_A, MIX_B);
    }

    #[inline]
    fn write_u128(&mut self, i: u128) {
        // Truncations split the key into its halves on purpose.
        let (lo, hi) = (i as u64, (i >> 64) as u64);
        self.state = fold_mul(self.state ^ lo ^ MIX_A, hi ^ MIX_B);
    }
}

/// Builds [`KeyHasher`]s.
pub type KeyBuildHasher = BuildHasherDefault<KeyHasher>;

#[cfg(test)]
mod tests {
    use super::*;
    use core::hash::BuildHasher;
    use std::collections::HashSet;

    fn hash(key: NumberKey) -> u64 {
        KeyBuildHasher::default().hash_one(key)
    }

    #[test]
    fn the_hash_spreads_neighbouring_keys_over_the_top_and_bottom_bits() {
        let mut low = HashSet::new();
        let mut top = HashSet::new();
        for ws in 0..256u64 {
            for seq in 0..4u16 {
                let h = hash(NumberKey {
                    ws_id: WsId(ws),
                    seq_id: SeqId(seq),
                });
                low.insert(h & 0x3ff);
                top.insert(h >> 57);
            }
        }
        // 1024 keys into 1024 low buckets and 128 top-7-bit tags: a poor mix would collapse.
        assert!(low.len() > 550, "low bits: {}", low.len());
        assert_eq!(top.len(), 128);
    }

    #[test]
    fn the_offset_after_the_last_one_does_not_exist() {
        assert_eq!(PLogOffset(7).next(), Some(PLogOffset(8)));
        assert_eq!(PLogOffset(u64::MAX).next(), None);
    }
}
