//! The holdings of a session: a bit set over dense ids with its count beside it, so that
//! attach, detach, membership and the count cost one word operation each, and nothing allocates.

use super::effect::{AttachRefusal, HoldingId, HOLDINGS_MAX};

const WORD_BITS: u32 = u64::BITS;
const WORDS: usize = (HOLDINGS_MAX / WORD_BITS) as usize;

/// A set of [`HoldingId`]s below [`HOLDINGS_MAX`].
#[derive(Clone, PartialEq, Eq, Hash)]
pub(crate) struct Holdings {
    words: [u64; WORDS],
    count: u32,
}

impl Holdings {
    pub(crate) const fn new() -> Self {
        Holdings {
            words: [0; WORDS],
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

    pub(crate) fn insert(&mut self, holding: HoldingId) -> Result<(), AttachRefusal> {
        let (word, bit) = Self::place(holding).ok_or(AttachRefusal::OutOfRange)?;
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
        if self.words[word] & bit == 0 {
            return false;
        }
        self.words[word] &= !bit;
        self.count -= 1;
        true
    }

    pub(crate) fn contains(&self, holding: HoldingId) -> bool {
        Self::place(holding).is_some_and(|(word, bit)| self.words[word] & bit != 0)
    }

    pub(crate) const fn len(&self) -> u32 {
        self.count
    }

    /// The ids in the set, in increasing order. Walks every word: for inspection and tests,
    /// never on an event's path.
    pub(crate) fn iter(&self) -> impl Iterator<Item = HoldingId> + '_ {
        (0..HOLDINGS_MAX)
            .map(HoldingId)
            .filter(|&holding| self.contains(holding))
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
}
