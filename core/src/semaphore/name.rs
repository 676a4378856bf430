//! The name of a semaphore: the key every store files it under, and what people read in logs
//! and descriptions.

use core::fmt;

use super::NAME_BYTES_MAX;

/// Why a string is not a [`SemaphoreName`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, thiserror::Error)]
#[non_exhaustive]
pub enum NameError {
    /// The name is empty: it would be the bare key prefix of the store.
    #[error("a semaphore name is empty")]
    Empty,
    /// The name is longer than [`NAME_BYTES_MAX`] bytes.
    #[error("a semaphore name of {bytes} bytes is longer than {NAME_BYTES_MAX}")]
    TooLong {
        /// Its length in bytes.
        bytes: usize,
    },
    /// The name holds a control character (C0, DEL or C1).
    #[error("a semaphore name holds a control character at byte {at}")]
    Control {
        /// Byte offset of the first one.
        at: usize,
    },
}

/// A valid semaphore name: 1 to [`NAME_BYTES_MAX`] bytes of UTF-8 without control characters.
///
/// The bounds are there for the stores and for people: 255 bytes fit in one length byte of the
/// encoding and, with any prefix a store adds, well inside the key limits of etcd, FoundationDB
/// (10 kB) and SQLite; control characters (a NUL, a newline, an escape sequence) would let one
/// name forge lines in logs and break keys in stores and tools that treat them as text. Any
/// other Unicode scalar is allowed, `/` included: stores put the name after their own prefix.
#[derive(Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct SemaphoreName(String);

impl SemaphoreName {
    /// Checks `name`.
    pub fn new(name: &str) -> Result<Self, NameError> {
        if name.is_empty() {
            return Err(NameError::Empty);
        }
        if name.len() > NAME_BYTES_MAX {
            return Err(NameError::TooLong { bytes: name.len() });
        }
        if let Some((at, _)) = name.char_indices().find(|(_, c)| c.is_control()) {
            return Err(NameError::Control { at });
        }
        Ok(SemaphoreName(name.to_owned()))
    }

    /// The name as text.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for SemaphoreName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&self.0, f)
    }
}

impl fmt::Display for SemaphoreName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl TryFrom<&str> for SemaphoreName {
    type Error = NameError;

    fn try_from(name: &str) -> Result<Self, NameError> {
        SemaphoreName::new(name)
    }
}
