//! Why a coordination operation did not succeed.

use vvm_core::semaphore::{DecodeError, NameError, SemaphoreError, SemaphoreName, SessionKey};

use crate::semaphore_store::SemaphoreStoreError;
use crate::session::SessionError;
use crate::store::StoreError;

/// Why a coordination operation did not succeed. Nothing was written in the store, except
/// where a variant says otherwise.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum CoordinationError {
    /// The name is not a valid [`SemaphoreName`].
    #[error("invalid semaphore name")]
    InvalidName(#[from] NameError),
    /// The semaphore's rules refused the operation: a count of 0 or above the limit, data too
    /// large, a delete of a busy semaphore, a name taken, a hold raised in place, ...
    #[error("the semaphore operation was refused")]
    Refused(#[source] SemaphoreError),
    /// No semaphore of this name exists (never created, or deleted; also a queued acquire or a
    /// watch whose semaphore was deleted).
    #[error("semaphore {0} does not exist")]
    NotFound(SemaphoreName),
    /// This session holds or is acquiring the semaphore already, through this handle or
    /// another `Coordination` on the same session: change a grant in place with
    /// [`SemaphoreGrant::replace`](super::SemaphoreGrant::replace).
    #[error("semaphore {0} is held or being acquired by this session already")]
    AlreadyHeld(SemaphoreName),
    /// A grant ended in the store without a release by its holder: a forced delete, or the
    /// session's expiry.
    #[error("the grant of semaphore {0} ended")]
    GrantEnded(SemaphoreName),
    /// The session is lost, closed or refuses holdings: no operation runs under it.
    #[error("the session cannot act")]
    Session(#[source] SessionError),
    /// The store judged the session not live (expired or deleted) although this process has
    /// not seen it lost yet: nothing was written.
    #[error("session {0} is not live in the store")]
    SessionGone(SessionKey),
    /// The stored state of the semaphore cannot be read; it is left as it is.
    #[error("the stored state of semaphore {name} cannot be read")]
    Corrupt {
        /// The semaphore.
        name: SemaphoreName,
        /// What is wrong with it.
        source: DecodeError,
    },
    /// A store call failed, or its outcome is unknown.
    #[error("store call failed")]
    Store(#[source] StoreError),
    /// A store call did not answer within the store-call timeout: its outcome is unknown.
    #[error("store call did not answer within the store-call timeout")]
    TimedOut,
}

impl CoordinationError {
    /// From a store's answer.
    pub(super) fn from_store(error: SemaphoreStoreError) -> Self {
        match error {
            SemaphoreStoreError::Refused(SemaphoreError::InvalidName(error)) => {
                CoordinationError::InvalidName(error)
            }
            SemaphoreStoreError::Refused(error) => CoordinationError::Refused(error),
            SemaphoreStoreError::NotFound(name) => CoordinationError::NotFound(name),
            SemaphoreStoreError::SessionGone(key) => CoordinationError::SessionGone(key),
            SemaphoreStoreError::Corrupt { name, source } => {
                CoordinationError::Corrupt { name, source }
            }
            SemaphoreStoreError::Store(error) => CoordinationError::Store(error),
        }
    }
}
