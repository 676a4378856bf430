//! The holdings of a session: a bit set over dense ids with its count beside it, so that
//! attach, detach, membership and the count cost one word operation each. The set grows to
//! cover the highest id attached (ids are dense, as a slab hands them out: its size follows the
//! number of holdings, one bit each); [`Holdings::reserve`] grows it ahead, so that attaching
//! within the reserve never allocates.

use super::effect::{AttachRefusal, HoldingId, HOLDINGS_MAX};

const WORD_BITS: u32 = u64::BITS;

/// A set of [`HoldingId`]s below [`HOLDINGS_MAX`].
#[derive(Clone, Default)]
pub(crate) struct Holdings {
    /// Bit `i % 64` of word `i / 64` is holding `i`; no word past the highest id ever reserved
    /// or attached.
    words: Vec<u64>,
    count: u32,
}

impl Holdings {
    pub(crate) const fn new() -> Self {
        Holdings {
            words: Vec::new(),
            count: 0,
        }
    }

    /// Word index and bit mask of `holding`, or `None` when out of range.
    fn place(holding: HoldingId) -> Option<(usize, u64)> {
        (holding.0 < HOLDINGS_MAX).then(|| {
            (
                (holding.0 / WORD_BITS) as usize,
                1 << (holding.0 % WORD_BITS),
            )
        })
    }

    /// Makes room for ids `0..holdings` (at most [`HOLDINGS_MAX`]): attaching them allocates
    /// nothing more.
    pub(crate) fn reserve(&mut self, holdings: u32) {
        let words = holdings.min(HOLDINGS_MAX).div_ceil(WORD_BITS) as usize;
        if words > self.words.len() {
            self.words.resize(words, 0);
        }
    }

    pub(crate) fn insert(&mut self, holding: HoldingId) -> Result<(), AttachRefusal> {
        let (word, bit) = Self::place(holding).ok_or(AttachRefusal::OutOfRange)?;
        if word >= self.words.len() {
            // Doubling: a run of attaches with rising ids allocates O(log n) times.
            let words = (word + 1).max(self.words.len() * 2);
            self.words.resize(words, 0);
        }
        if self.words[word] & bit != 0 {
            return Err(AttachRefusal::Attached);
        }
        self.words[word] |= bit;
        self.count += 1;
        Ok(())
    }

    /// Removes `holding`; whether it was there.
    pub(crate) fn remove(&mut self, holding: HoldingId) -> bool {
        let Some((word, bit)) = Self::place(holding) else {
            return false;
        };
        match self.words.get_mut(word) {
            Some(bits) if *bits & bit != 0 => {
                *bits &= !bit;
                self.count -= 1;
                true
            }
            _ => false,
        }
    }

    pub(crate) fn contains(&self, holding: HoldingId) -> bool {
        Self::place(holding)
            .is_some_and(|(word, bit)| self.words.get(word).is_some_and(|w| w & bit != 0))
    }

    pub(crate) const fn len(&self) -> u32 {
        self.count
    }

    /// The words up to the last one with a holding: what equality and hashing look at, so
    /// that room reserved and not used does not tell two sets apart.
    fn used(&self) -> &[u64] {
        let end = self
            .words
            .iter()
            .rposition(|&word| word != 0)
            .map_or(0, |last| last + 1);
        &self.words[..end]
    }

    /// The ids in the set, in increasing order. For inspection and tests, never on an event's
    /// path.
    pub(crate) fn iter(&self) -> impl Iterator<Item = HoldingId> + '_ {
        let bits = u32::try_from(self.words.len()).unwrap_or(u32::MAX / WORD_BITS) * WORD_BITS;
        (0..bits.min(HOLDINGS_MAX))
            .map(HoldingId)
            .filter(|&holding| self.contains(holding))
    }
}

impl PartialEq for Holdings {
    fn eq(&self, other: &Self) -> bool {
        self.count == other.count && self.used() == other.used()
    }
}

impl Eq for Holdings {}

impl core::hash::Hash for Holdings {
    fn hash<H: core::hash::Hasher>(&self, state: &mut H) {
        self.count.hash(state);
        self.used().hash(state);
    }
}

impl core::fmt::Debug for Holdings {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_set().entries(self.iter().map(|h| h.0)).finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn insert_remove_and_count_agree() {
        let mut set = Holdings::new();
        assert_eq!(set.insert(HoldingId(0)), Ok(()));
        assert_eq!(set.insert(HoldingId(HOLDINGS_MAX - 1)), Ok(()));
        assert_eq!(set.insert(HoldingId(0)), Err(AttachRefusal::Attached));
        assert_eq!(
            set.insert(HoldingId(HOLDINGS_MAX)),
            Err(AttachRefusal::OutOfRange)
        );
        assert_eq!(set.len(), 2);
        assert!(set.remove(HoldingId(0)));
        assert!(!set.remove(HoldingId(0)));
        assert!(!set.remove(HoldingId(HOLDINGS_MAX)));
        assert_eq!(set.len(), 1);
        assert_eq!(
            set.iter().collect::<Vec<_>>(),
            [HoldingId(HOLDINGS_MAX - 1)]
        );
    }

    #[test]
    fn reserved_room_does_not_tell_equal_sets_apart() {
        let mut roomy = Holdings::new();
        roomy.reserve(100_000);
        let mut tight = Holdings::new();
        assert_eq!(roomy, tight);
        roomy.insert(HoldingId(3)).unwrap();
        tight.insert(HoldingId(3)).unwrap();
        assert_eq!(roomy, tight);
        assert!(roomy.remove(HoldingId(3)));
        assert_ne!(roomy, tight);
    }
}
