//! Listing the semaphores a store holds, one bounded page at a time
//! ([`SemaphoreStore::semaphore_names`](crate::SemaphoreStore::semaphore_names)).
//!
//! A page is the names that sort after a given one (by their bytes), at most
//! [`NAMES_PAGE_MAX`] of them: a store with many semaphores is listed in several calls, each
//! of bounded cost, and a listing never holds the whole store in memory. Pages are read one
//! at a time, so a listing of several pages is not one snapshot: a name created or deleted
//! between two calls may or may not appear.

use vvm_core::semaphore::SemaphoreName;

/// The most names one page holds.
pub const NAMES_PAGE_MAX: usize = 1000;

/// Which names to list: those after [`after`](NamesPage::after) (all when `None`), at most
/// [`limit`](NamesPage::limit) of them.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NamesPage {
    after: Option<SemaphoreName>,
    limit: usize,
}

/// Why a [`NamesPage`] was refused.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum NamesPageError {
    /// The limit is 0 or above [`NAMES_PAGE_MAX`].
    #[error("a page of semaphore names holds 1 to {max} names, not {limit}")]
    Limit {
        /// The limit asked for.
        limit: usize,
        /// [`NAMES_PAGE_MAX`].
        max: usize,
    },
}

impl NamesPage {
    /// The names after `after` (from the first when `None`), at most `limit` (1 to
    /// [`NAMES_PAGE_MAX`]).
    pub fn new(after: Option<SemaphoreName>, limit: usize) -> Result<Self, NamesPageError> {
        if limit == 0 || limit > NAMES_PAGE_MAX {
            return Err(NamesPageError::Limit {
                limit,
                max: NAMES_PAGE_MAX,
            });
        }
        Ok(NamesPage { after, limit })
    }

    /// The first page of [`NAMES_PAGE_MAX`] names.
    pub fn first() -> Self {
        NamesPage {
            after: None,
            limit: NAMES_PAGE_MAX,
        }
    }

    /// The page that follows `names`, of the same limit; `None` when `names` was the last.
    pub fn next(&self, names: &SemaphoreNames) -> Option<Self> {
        if !names.more {
            return None;
        }
        Some(NamesPage {
            after: names.names.last().cloned().or_else(|| self.after.clone()),
            limit: self.limit,
        })
    }

    /// Names strictly after this one are listed; `None`: from the first.
    pub fn after(&self) -> Option<&SemaphoreName> {
        self.after.as_ref()
    }

    /// The most names listed.
    pub fn limit(&self) -> usize {
        self.limit
    }

    /// The page of `sorted` (every name the store holds, sorted and without duplicates):
    /// for stores that read their names in order and stop after `limit + 1`.
    pub fn take(&self, sorted: impl IntoIterator<Item = SemaphoreName>) -> SemaphoreNames {
        let mut names: Vec<SemaphoreName> = sorted
            .into_iter()
            .filter(|name| self.after.as_ref().is_none_or(|after| name > after))
            .take(self.limit.saturating_add(1))
            .collect();
        let more = names.len() > self.limit;
        names.truncate(self.limit);
        SemaphoreNames { names, more }
    }
}

/// One page of semaphore names.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SemaphoreNames {
    /// The names of the semaphores that exist (created and not deleted), sorted by their
    /// bytes.
    pub names: Vec<SemaphoreName>,
    /// Whether names follow the last one ([`NamesPage::next`]).
    pub more: bool,
}

/// A name the store holds among its semaphores that is not a valid [`SemaphoreName`]: not
/// written by vvm (every write takes a valid name). The listing fails rather than skip it, so
/// that no page silently ends early.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("the store holds a semaphore under a name that is not valid: {name:?}")]
pub struct UnreadableName {
    /// The stored name, its invalid UTF-8 replaced.
    pub name: String,
}

impl UnreadableName {
    /// The stored name `bytes`, as a name or this error.
    pub fn check(bytes: &[u8]) -> Result<SemaphoreName, UnreadableName> {
        std::str::from_utf8(bytes)
            .ok()
            .and_then(|text| SemaphoreName::new(text).ok())
            .ok_or_else(|| UnreadableName {
                name: String::from_utf8_lossy(bytes).into_owned(),
            })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn name(text: &str) -> SemaphoreName {
        SemaphoreName::new(text).expect("a valid name")
    }

    #[test]
    fn a_page_is_bounded_and_continues_after_its_last_name() {
        assert_eq!(
            NamesPage::new(None, 0),
            Err(NamesPageError::Limit {
                limit: 0,
                max: NAMES_PAGE_MAX
            })
        );
        assert!(NamesPage::new(None, NAMES_PAGE_MAX + 1).is_err());
        let page = NamesPage::new(None, 2).expect("a valid page");
        let all = || ["a", "b", "c"].map(name);
        let first = page.take(all());
        assert_eq!(first.names, vec![name("a"), name("b")]);
        assert!(first.more);
        let next = page.next(&first).expect("a next page");
        assert_eq!(next.after(), Some(&name("b")));
        let second = next.take(all());
        assert_eq!(second.names, vec![name("c")]);
        assert!(!second.more);
        assert_eq!(next.next(&second), None);
    }

    #[test]
    fn a_stored_name_that_is_not_valid_is_an_error() {
        assert_eq!(UnreadableName::check(b"ok"), Ok(name("ok")));
        assert!(UnreadableName::check(b"").is_err());
        assert!(UnreadableName::check(b"a\0b").is_err());
        assert!(UnreadableName::check(&[0xff]).is_err());
    }
}
