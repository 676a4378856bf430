//! The store contract every adapter implements: four conditional operations on TTL records.
//!
//! A key is a [`Slot`]; the value is this process's [`LeaseValue`] (address and incarnation);
//! every successful write returns the store's new [`Revision`], which strictly increases per key,
//! also across delete and re-insert. **An expired record is absent for every operation.**

use std::future::Future;
use std::pin::Pin;
use std::time::Duration;

use vvm_core::{Incarnation, Revision, Slot};

use crate::cause::Cause;

/// The longest encoded value accepted by [`LeaseValue::decode`].
pub const VALUE_MAX_BYTES: usize = 512;

/// What a lease record holds: who owns it.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct LeaseValue {
    /// The holder's address (`VvmConfig::address`).
    pub address: String,
    /// The holder's process incarnation.
    pub incarnation: Incarnation,
    /// The holder has asked its services to stop: it still holds the slot (nobody else may act
    /// on it before the release), but it is no longer the one to send work to. Written by the
    /// first renewal after the request to stop, which is sent at once.
    pub stopping: bool,
}

/// A live record: its value and the revision of the write that produced it.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Lease {
    /// Who holds the slot.
    pub value: LeaseValue,
    /// The revision of the last write.
    pub revision: Revision,
}

/// The answer of [`LeaseStore::insert_or_time_left`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Inserted {
    /// Our record was written with this revision.
    Written(Revision),
    /// A live record holds the slot; nothing was written.
    Held {
        /// Its time left on the store's clock; `None` when the store cannot tell.
        left: Option<Duration>,
    },
}

/// A stored value that is not a lease value of ours.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ValueError {
    /// Longer than [`VALUE_MAX_BYTES`].
    #[error("value of {len} bytes is longer than {max}")]
    TooLong {
        /// Its length.
        len: usize,
        /// The maximum.
        max: usize,
    },
    /// Not of the form `vvm1 <16 hex digits> <address>` (or `vvm1s …`).
    #[error("value is not a vvm lease record: {0}")]
    Malformed(&'static str),
    /// A record that is not bound to a lease, which vvm never writes: another program wrote
    /// it, and it would never expire.
    #[error("the key {key} has no lease, which vvm never writes: another program wrote it; remove it if it is not in use")]
    Unleased {
        /// The key, as the store names it.
        key: String,
    },
}

const VALUE_PREFIX: &str = "vvm1 ";
const STOPPING_PREFIX: &str = "vvm1s ";

impl LeaseValue {
    /// A holder's value, not stopping.
    ///
    /// ```
    /// use vvm_core::Incarnation;
    /// use vvm_runtime::LeaseValue;
    ///
    /// let value = LeaseValue::new("10.0.0.1:7000", Incarnation(255));
    /// assert!(!value.stopping);
    /// ```
    pub fn new(address: impl Into<String>, incarnation: Incarnation) -> Self {
        LeaseValue {
            address: address.into(),
            incarnation,
            stopping: false,
        }
    }

    /// Encodes as `vvm1 <incarnation, 16 hex digits> <address>`, or `vvm1s …` when
    /// [`stopping`](Self::stopping): readable in store tools, and versioned so that a later
    /// format is recognised instead of misread.
    ///
    /// ```
    /// use vvm_core::Incarnation;
    /// use vvm_runtime::LeaseValue;
    ///
    /// let mut value = LeaseValue::new("10.0.0.1:7000", Incarnation(255));
    /// assert_eq!(value.encode(), "vvm1 00000000000000ff 10.0.0.1:7000");
    /// assert_eq!(LeaseValue::decode(value.encode().as_bytes()), Ok(value.clone()));
    /// value.stopping = true;
    /// assert_eq!(value.encode(), "vvm1s 00000000000000ff 10.0.0.1:7000");
    /// assert_eq!(LeaseValue::decode(value.encode().as_bytes()), Ok(value));
    /// ```
    pub fn encode(&self) -> String {
        let prefix = if self.stopping {
            STOPPING_PREFIX
        } else {
            VALUE_PREFIX
        };
        format!("{prefix}{:016x} {}", self.incarnation.0, self.address)
    }

    /// The same holder, marked as stopping or not.
    pub fn marked(&self, stopping: bool) -> Self {
        LeaseValue {
            stopping,
            ..self.clone()
        }
    }

    /// Whether `other` names the same holder (address and incarnation), stopping or not.
    pub fn same_holder(&self, other: &LeaseValue) -> bool {
        self.incarnation == other.incarnation && self.address == other.address
    }

    /// Decodes what [`encode`](Self::encode) wrote; anything else is a [`ValueError`]. Decoding
    /// is canonical: whenever it succeeds, encoding the value gives back exactly `bytes`.
    pub fn decode(bytes: &[u8]) -> Result<Self, ValueError> {
        if bytes.len() > VALUE_MAX_BYTES {
            return Err(ValueError::TooLong {
                len: bytes.len(),
                max: VALUE_MAX_BYTES,
            });
        }
        let text = std::str::from_utf8(bytes).map_err(|_| ValueError::Malformed("not UTF-8"))?;
        let (rest, stopping) = match text.strip_prefix(VALUE_PREFIX) {
            Some(rest) => (rest, false),
            None => (
                text.strip_prefix(STOPPING_PREFIX)
                    .ok_or(ValueError::Malformed("missing the vvm1 prefix"))?,
                true,
            ),
        };
        let (hex, address) = rest
            .split_once(' ')
            .ok_or(ValueError::Malformed("missing the address"))?;
        // Lower case only, as `encode` writes: two spellings of one value would compare unequal
        // as bytes in the stores that match records by their bytes.
        let lower_hex = |b: u8| b.is_ascii_digit() || (b'a'..=b'f').contains(&b);
        if hex.len() != 16 || !hex.bytes().all(lower_hex) {
            return Err(ValueError::Malformed(
                "incarnation is not 16 lower-case hex digits",
            ));
        }
        let incarnation = u64::from_str_radix(hex, 16)
            .map_err(|_| ValueError::Malformed("incarnation is not 16 lower-case hex digits"))?;
        if address.is_empty() || address.chars().any(char::is_control) {
            return Err(ValueError::Malformed(
                "address is empty or has control characters",
            ));
        }
        Ok(LeaseValue {
            address: address.to_owned(),
            incarnation: Incarnation(incarnation),
            stopping,
        })
    }
}

/// Why a store operation did not succeed. The split matters to the core: after
/// [`Failed`](StoreError::Failed) nothing was written; after [`Unknown`](StoreError::Unknown) the
/// write may have committed and must be read back before anything is concluded.
///
/// The message says which of the three it is; [`Error::source`](std::error::Error::source) says
/// why (the store client's own error, kept whole): print it with
/// [`ErrorChain`](crate::ErrorChain).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum StoreError {
    /// The operation failed and wrote nothing.
    #[error("store operation failed, nothing written")]
    Failed {
        /// Why: the store's or its client's error.
        source: Cause,
    },
    /// The operation may or may not have been applied (timeout, lost connection after sending).
    #[error("store operation outcome unknown")]
    Unknown {
        /// Why: the store's or its client's error, or [`CallTimedOut`].
        source: Cause,
    },
    /// The record under `slot` is live but not a lease record we can read. It is never
    /// overwritten while it lives.
    #[error("record of slot {slot} is corrupt")]
    Corrupt {
        /// The key.
        slot: u32,
        /// What is wrong with it.
        source: ValueError,
    },
}

impl StoreError {
    /// [`Failed`](StoreError::Failed) because of `source`.
    pub fn failed(source: impl std::error::Error + Send + Sync + 'static) -> StoreError {
        StoreError::Failed {
            source: Cause::new(source),
        }
    }

    /// [`Unknown`](StoreError::Unknown) because of `source`.
    pub fn unknown(source: impl std::error::Error + Send + Sync + 'static) -> StoreError {
        StoreError::Unknown {
            source: Cause::new(source),
        }
    }

    /// Whether the operation may have been applied.
    pub fn is_unknown(&self) -> bool {
        matches!(self, StoreError::Unknown { .. })
    }

    /// The first error of type `E` among the causes, e.g. a `rusqlite::Error` or an
    /// `etcd_client::Error`.
    pub fn find<E: std::error::Error + 'static>(&self) -> Option<&E> {
        match self {
            StoreError::Failed { source } | StoreError::Unknown { source } => source.find::<E>(),
            StoreError::Corrupt { source, .. } => {
                (source as &(dyn std::error::Error + 'static)).downcast_ref::<E>()
            }
        }
    }
}

/// A store call that did not answer within its timeout: its outcome is unknown, or, for a read,
/// nothing was learnt.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{call} of slot {slot} did not answer within {timeout:?}")]
pub struct CallTimedOut {
    /// What was called ("reading", "committing", ...).
    pub call: &'static str,
    /// The key.
    pub slot: u32,
    /// The timeout that ran out.
    pub timeout: Duration,
}

/// Resolves at some point after the record of one of the watched slots changed (written,
/// swapped, deleted or found expired) since [`LeaseStore::changed`] was called. See there.
pub type SlotChange = Pin<Box<dyn Future<Output = ()> + Send + 'static>>;

/// A store of TTL records with conditional writes: the only thing elections need.
///
/// Each operation is atomic in the store (one transaction; no check-then-write across calls).
/// Implementations do not time out by themselves necessarily: the runtime puts every call under
/// its own timeout and treats expiry as [`StoreError::Unknown`].
///
/// # Cancel safety
///
/// A call's future dropped before it answered may or may not have applied its write (the same
/// for [`SessionStore`](crate::SessionStore) and [`SemaphoreStore`](crate::SemaphoreStore)
/// calls): a caller treats it exactly as [`StoreError::Unknown`] and learns the outcome by a
/// read or by sending the same (idempotent) call again, as the runtime does. Implementations
/// never leave a store half-written by a drop: each call is one transaction.
pub trait LeaseStore: Send + Sync + 'static {
    /// Writes `value` under `key` with time-to-live `ttl` if no live record exists.
    /// `Ok(Some(revision))` when written, `Ok(None)` when a live record exists.
    fn insert_if_not_exists(
        &self,
        key: Slot,
        value: &LeaseValue,
        ttl: Duration,
    ) -> impl Future<Output = Result<Option<Revision>, StoreError>> + Send;

    /// Replaces the live record by `new_value` with a fresh `ttl` if it equals `expected`
    /// (value and revision). `Ok(Some(revision))` when written, `Ok(None)` otherwise.
    fn compare_and_swap(
        &self,
        key: Slot,
        expected: &Lease,
        new_value: &LeaseValue,
        ttl: Duration,
    ) -> impl Future<Output = Result<Option<Revision>, StoreError>> + Send;

    /// Deletes the live record if it equals `expected` (value and revision).
    /// `Ok(true)` when deleted, `Ok(false)` otherwise (absent, expired or different).
    fn compare_and_delete(
        &self,
        key: Slot,
        expected: &Lease,
    ) -> impl Future<Output = Result<bool, StoreError>> + Send;

    /// Reads the live record, if any.
    fn get(&self, key: Slot) -> impl Future<Output = Result<Option<Lease>, StoreError>> + Send;

    /// [`insert_if_not_exists`](Self::insert_if_not_exists), and when a live record refuses it,
    /// how long that record has left on the store's own clock: a refused candidate tries again
    /// at that expiry (or at the change feed's word, whichever comes first) instead of at fixed
    /// rounds. The time left is only a hint for *when* to try: the insert alone decides.
    ///
    /// The default makes two calls (insert, then [`time_left`](Self::time_left); a failure of
    /// the second is reported as "cannot tell"). Stores that can answer both in one call or
    /// transaction override it, so a waiting candidate costs one call per try.
    fn insert_or_time_left(
        &self,
        key: Slot,
        value: &LeaseValue,
        ttl: Duration,
    ) -> impl Future<Output = Result<Inserted, StoreError>> + Send {
        async move {
            if let Some(revision) = self.insert_if_not_exists(key, value, ttl).await? {
                return Ok(Inserted::Written(revision));
            }
            let left = match self.time_left(key).await {
                Ok(left) => left,
                Err(error) => {
                    tracing::debug!(slot = key.0, error = %crate::ErrorChain(&error), "time left of a refusing record unknown");
                    None
                }
            };
            Ok(Inserted::Held { left })
        }
    }

    /// How long the live record under `key` has left, as far as the store can tell; `Ok(None)`
    /// when there is no live record or the store cannot say. Shown by `vvm status`, and used by
    /// the default [`insert_or_time_left`](Self::insert_or_time_left) to time a candidate's
    /// next try; no decision of who holds a slot depends on it.
    fn time_left(
        &self,
        key: Slot,
    ) -> impl Future<Output = Result<Option<Duration>, StoreError>> + Send {
        let _ = key;
        std::future::ready(Ok(None))
    }

    /// A change feed of some slots: the returned future resolves after the record under one of
    /// `keys` changed (inserted, swapped, deleted, or removed as expired) at some point after
    /// this call returned. A candidate waiting between rounds uses it to try again at once instead of at the
    /// next round.
    ///
    /// It is only a hint to *try again sooner*: it may resolve spuriously (e.g. after a change of
    /// another slot), and the store's own conditional insert still decides who wins. It need not
    /// see an expiry that nothing observed; the caller keeps its own timer for that.
    ///
    /// The default never resolves: a store without a feed falls back to polling, i.e. to the
    /// candidate's fixed rounds (`VvmConfig::round_interval`). The future is created at the call
    /// (not at its first poll), so a change right after the call is not missed.
    fn changed(&self, keys: &[Slot]) -> SlotChange {
        let _ = keys;
        Box::pin(std::future::pending())
    }

    /// [`changed`](Self::changed) for a candidate between rounds, which only wants to know when
    /// it might take a slot: the store may leave out changes that cannot make one takeable (a
    /// live holder's renewals, or a swap of its value, while something else — a lock of its
    /// process — tells when it stops holding). The default is [`changed`](Self::changed).
    fn changed_for_candidate(&self, keys: &[Slot]) -> SlotChange {
        self.changed(keys)
    }

    /// Whether [`changed`](Self::changed) reports deletions (and holder changes). A store
    /// without a feed (the default) still has its candidates try every round interval, the
    /// record's expiry only bringing a try forward: nothing else would tell them of a release.
    /// A store with one lets its candidates wait for the feed or the expiry.
    fn has_change_feed(&self) -> bool {
        false
    }
}

/// A shared store is a store: one process may hand one connection to a VVM and to an
/// [`observe`](crate::observe::observe)r (e.g. to say who holds the slot it waits for).
impl<S: LeaseStore> LeaseStore for std::sync::Arc<S> {
    fn insert_if_not_exists(
        &self,
        key: Slot,
        value: &LeaseValue,
        ttl: Duration,
    ) -> impl Future<Output = Result<Option<Revision>, StoreError>> + Send {
        S::insert_if_not_exists(self, key, value, ttl)
    }

    fn compare_and_swap(
        &self,
        key: Slot,
        expected: &Lease,
        new_value: &LeaseValue,
        ttl: Duration,
    ) -> impl Future<Output = Result<Option<Revision>, StoreError>> + Send {
        S::compare_and_swap(self, key, expected, new_value, ttl)
    }

    fn compare_and_delete(
        &self,
        key: Slot,
        expected: &Lease,
    ) -> impl Future<Output = Result<bool, StoreError>> + Send {
        S::compare_and_delete(self, key, expected)
    }

    fn get(&self, key: Slot) -> impl Future<Output = Result<Option<Lease>, StoreError>> + Send {
        S::get(self, key)
    }

    fn insert_or_time_left(
        &self,
        key: Slot,
        value: &LeaseValue,
        ttl: Duration,
    ) -> impl Future<Output = Result<Inserted, StoreError>> + Send {
        S::insert_or_time_left(self, key, value, ttl)
    }

    fn time_left(
        &self,
        key: Slot,
    ) -> impl Future<Output = Result<Option<Duration>, StoreError>> + Send {
        S::time_left(self, key)
    }

    fn changed(&self, keys: &[Slot]) -> SlotChange {
        S::changed(self, keys)
    }

    fn changed_for_candidate(&self, keys: &[Slot]) -> SlotChange {
        S::changed_for_candidate(self, keys)
    }

    fn has_change_feed(&self) -> bool {
        S::has_change_feed(self)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn decode_rejects_everything_that_encode_does_not_write() {
        for bad in [
            &b""[..],
            b"vvm1",
            b"vvm1 ",
            b"vvm2 00000000000000ff a",
            b"vvm1 00000000000000ff",
            b"vvm1 00000000000000fg a",
            b"vvm1 0ff a",
            b"vvm1 00000000000000ff ",
            b"vvm1 00000000000000ff a\nb",
            b"vvm1 00000000000000FF a",
            b"vvm1 +0000000000000ff a",
            b"\xff\xfe",
        ] {
            assert!(LeaseValue::decode(bad).is_err(), "{bad:?} decoded");
        }
        let long = vec![b'a'; VALUE_MAX_BYTES + 1];
        assert!(matches!(
            LeaseValue::decode(&long),
            Err(ValueError::TooLong { .. })
        ));
    }
}
