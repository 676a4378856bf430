//! The lease contract over a [`TxKv`], with expiry judged by observation.
//!
//! # Expiry by observation
//!
//! The store keeps no times. A record carries its revision, its holder's TTL and its value;
//! each write increments the revision. A process judges a record expired only after it has seen
//! the **same** (value, revision) for a whole TTL on **its own** monotonic clock:
//! - the first time it reads a record, it notes the record with the time *after* the read
//!   returned (the record was written before that);
//! - a later transaction that reads the same (value, revision) and *started* at least a TTL
//!   after that note knows that nobody renewed the record for a whole TTL: to that process it is
//!   expired, i.e. absent for every operation, and an insert may replace it (the transaction's
//!   conflict check refuses the replacement if the record changes before it commits);
//! - a process that wrote a record notes it with the time *before* its transaction began, so
//!   it judges its own record expired no later than anyone else.
//!
//! Stored times are never compared across processes, so clocks need not agree; only their
//! rates matter, which the kill deadline at 0.8·L covers. The price: a process that first sees
//! a record late waits a full TTL from then. Notes are kept per store value (shared by its
//! clones, so by every VVM of a process that uses one store), at most [`OBSERVATIONS_MAX`];
//! forgetting one only makes expiry later.
//!
//! A record that is no record of this format is corrupt: it is never overwritten and never
//! expires; an operator has to remove it.
//!
//! # A record removed from outside (`Tx.RecordRemoved`)
//!
//! Every write of a slot's key also writes its *tenure* key, `<prefix> 0x00 "tenure/" <slot>`,
//! a copy of the record (a release's tombstone included). An operator who deletes the slot's
//! key by hand (`DELETE`, `fdbcli clear`: "unsticking" a lock) leaves the tenure key, so a slot
//! key that is absent while its tenure key holds a live record was removed from outside while
//! its holder may still act: it is judged as that record — a slot record by observation, from
//! this process's first sight of the removal (after the holder's last renewal); a holding while
//! its session lives — except that its holder may no longer renew it (a compare-and-swap finds
//! nothing to swap; a read finds nothing, so the holder's own watch reports the loss at once),
//! and a release by the holder writes the release's tombstone, which frees the slot at once.
//! Revisions continue from the tenure key's, so fencing tokens keep rising across a removal.
//!
//! # Transactions
//!
//! Every operation is one transaction (read the slot's key, decide, maybe write), run again on
//! a conflict at most [`TxOptions::retries_max`] times, with the whole operation bounded by
//! [`TxOptions::timeout`]. A read that fails or times out is [`StoreError::Failed`]; a commit
//! whose outcome is unknown, or that times out, is [`StoreError::Unknown`].
//!
//! # Change feed
//!
//! [`LeaseStore::changed`] rests on the store's watches ([`KvTx::watch`]). Each round is one
//! read-only transaction that reads the watched keys and sets a watch on each, then waits for
//! one to fire:
//! - a watched key that is absent or holds a deletion tombstone resolves the feed (released);
//! - a live record whose holder (value) differs from the baseline resolves it (another holder).
//!   The baseline is what this process last saw of the slot (the notes of its reads and
//!   writes) at the call; without a note then, its note when the first round runs (normally
//!   from the read of the insert that was refused); without either, what the first round reads;
//! - a watch that fires on a renewal by the same holder (the revision changed, the holder did
//!   not) only starts the next round: one read transaction per renewal, no wake-up;
//! - a round that fails (a read, the commit or a watch failed or timed out) cannot tell, so it
//!   resolves, not before [`FEED_UNKNOWN_PAUSE`] after the wait began.
//!
//! An expiry is never reported (nothing changes in the store when a holder stops renewing): the
//! waiter's own timer covers it. Dropping the future drops its transaction or its watches,
//! which cancels them; no task is spawned.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use vvm_core::semaphore::SemaphoreName;
use vvm_core::{Instant, Revision, SessionKey, Slot};
use vvm_runtime::{
    CallTimedOut, Clock, Lease, LeaseStore, LeaseValue, SlotChange, StoreError, TimeSource,
    ValueError,
};

use super::record::Record;
use super::{KvTx, TxError, TxKv};

/// Most records a store value keeps notes about; beyond it the oldest note is forgotten.
pub const OBSERVATIONS_MAX: usize = 4096;
/// Default number of times a conflicting transaction is run again.
pub const RETRIES_MAX_DEFAULT: u32 = 5;
/// Default bound of one operation, retries included.
pub const TIMEOUT_DEFAULT: Duration = Duration::from_secs(5);
/// Shortest wait of a change feed that ends without having seen a change (a failed round): bounds
/// how often a waiter asks a store that fails.
pub const FEED_UNKNOWN_PAUSE: Duration = Duration::from_millis(100);
/// What follows the prefix in the key of a session record.
const SESSION_PART: &[u8] = b"session/";
/// What follows the prefix in the key of a slot's tenure (`Tx.RecordRemoved`): a NUL byte, which
/// no slot or session key holds.
const TENURE_PART: &[u8] = b"\0tenure/";
/// Longest key prefix, in bytes.
pub const PREFIX_MAX_BYTES: usize = 256;
/// Longest first pause before running a conflicting transaction again; the ceiling doubles up
/// to [`BACKOFF_MAX`].
const BACKOFF_FIRST: Duration = Duration::from_millis(2);
/// Longest pause between two attempts.
pub(super) const BACKOFF_MAX: Duration = Duration::from_millis(100);

/// The pauses between attempts: a random point between half of a ceiling and the ceiling, which
/// doubles from [`BACKOFF_FIRST`] to [`BACKOFF_MAX`] ([`vvm_runtime::jittered_backoff`]).
/// Candidates that conflicted on one key would, with equal pauses, meet again at the same instant
/// on every attempt; the jitter spreads them, as FoundationDB's own retry loop does.
pub(super) fn conflict_backoff() -> impl Iterator<Item = Duration> {
    vvm_runtime::jittered_backoff(BACKOFF_FIRST, BACKOFF_MAX)
}

/// Retry limit, timeout and key prefix of a [`TxLeaseStore`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TxOptions {
    pub(super) retries_max: u32,
    pub(super) timeout: Duration,
    pub(super) prefix: Vec<u8>,
}

impl Default for TxOptions {
    fn default() -> Self {
        TxOptions {
            retries_max: RETRIES_MAX_DEFAULT,
            timeout: TIMEOUT_DEFAULT,
            prefix: b"vvm/slot/".to_vec(),
        }
    }
}

/// Why an operation of a [`TxLeaseStore`] failed although each transaction ran: the cause
/// inside its [`StoreError`].
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum TxLeaseError {
    /// Every attempt conflicted with another transaction (or met another retryable error).
    #[error("slot {slot} conflicted on {attempts} attempts")]
    Conflicted {
        /// The key.
        slot: u32,
        /// How many transactions were run.
        attempts: u32,
        /// The last attempt's error.
        #[source]
        last: Option<TxError>,
    },
    /// The record's revision is `u64::MAX`: no later revision can be written.
    #[error("slot {slot} has run out of revisions")]
    RevisionsExhausted {
        /// The key.
        slot: u32,
    },
}

/// A bad [`TxOptions`] value.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum TxOptionsError {
    /// The timeout is zero.
    #[error("the transaction timeout must be above zero")]
    TimeoutZero,
    /// The retry limit is above 100.
    #[error("at most 100 retries, not {0}")]
    TooManyRetries(u32),
    /// The key prefix is longer than [`PREFIX_MAX_BYTES`].
    #[error("key prefix of {0} bytes is longer than {PREFIX_MAX_BYTES}")]
    PrefixTooLong(usize),
    /// The key prefix ends with an ASCII digit: its keys could equal another prefix's (`app1`
    /// slot 1 and `app` slot 11 are both `app11`).
    #[error("the key prefix ends with a digit, so its keys could be another prefix's (\"app1\" slot 1 and \"app\" slot 11 are both \"app11\"); end it with a separator such as \"/\"")]
    PrefixEndsWithDigit,
    /// The key prefix holds `session/`: its slot keys could be a shorter prefix's session
    /// records (`a` + `session/<key>` is prefix `asession/<incarnation>-` + a slot number).
    #[error("the key prefix holds \"session/\", which names session records under a shorter prefix; pick another")]
    PrefixHasSessionPart,
    /// The key prefix holds a NUL byte: the store's semaphore keys are the prefix followed by
    /// a NUL byte, so such a prefix could name another prefix's semaphores.
    #[error("the key prefix holds a NUL byte, which starts the semaphore keys of a shorter prefix; pick another")]
    PrefixHasNul,
}

impl TxOptions {
    /// How often a conflicting transaction is run again (default [`RETRIES_MAX_DEFAULT`],
    /// at most 100).
    pub fn retries_max(mut self, retries: u32) -> Result<Self, TxOptionsError> {
        if retries > 100 {
            return Err(TxOptionsError::TooManyRetries(retries));
        }
        self.retries_max = retries;
        Ok(self)
    }

    /// Bound of one operation, retries included (default [`TIMEOUT_DEFAULT`]).
    pub fn timeout(mut self, timeout: Duration) -> Result<Self, TxOptionsError> {
        if timeout.is_zero() {
            return Err(TxOptionsError::TimeoutZero);
        }
        self.timeout = timeout;
        Ok(self)
    }

    /// Keys are `<prefix><slot number>`, `<prefix>session/<session>` and, for semaphores,
    /// `<prefix>\0…` (default `vvm/slot/`). Two stores on one key-value store with different
    /// accepted prefixes never share a key: a prefix that ends with a digit, holds `session/` or
    /// holds a NUL byte is refused.
    pub fn prefix(mut self, prefix: impl Into<Vec<u8>>) -> Result<Self, TxOptionsError> {
        let prefix = prefix.into();
        if prefix.len() > PREFIX_MAX_BYTES {
            return Err(TxOptionsError::PrefixTooLong(prefix.len()));
        }
        if prefix.last().is_some_and(u8::is_ascii_digit) {
            return Err(TxOptionsError::PrefixEndsWithDigit);
        }
        if prefix
            .windows(SESSION_PART.len())
            .any(|part| part == SESSION_PART)
        {
            return Err(TxOptionsError::PrefixHasSessionPart);
        }
        if prefix.contains(&0) {
            return Err(TxOptionsError::PrefixHasNul);
        }
        self.prefix = prefix;
        Ok(self)
    }

    /// The bound of one operation.
    pub fn operation_timeout(&self) -> Duration {
        self.timeout
    }
}

/// The version of each semaphore key this process last read or wrote, by name (`None`: not
/// readable): the baselines of the semaphores' change feeds (`semaphore` module).
pub(super) type SemaphoreVersions = HashMap<SemaphoreName, Option<u64>>;

/// A key a note is about: a slot's, or a session record's.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(super) enum Target {
    /// The record of a slot (a slot record or a holding).
    Slot(Slot),
    /// The record of a session.
    Session(SessionKey),
}

/// One note: this (value, revision) was seen, first at `since`, with the holder's TTL.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Observation {
    revision: u64,
    value: Vec<u8>,
    ttl: Duration,
    since: Instant,
}

/// What a key holds, as far as this process can tell.
#[derive(Debug)]
pub(super) enum State {
    /// No live record; the next write takes `revision + 1`.
    Absent { revision: u64 },
    /// A live record: a slot record, or a holding of a live `session`. `removed`: the slot's
    /// key is gone and this is its tenure key's copy (`Tx.RecordRemoved`).
    Live {
        revision: u64,
        value: Vec<u8>,
        session: Option<SessionKey>,
        removed: bool,
    },
    /// Bytes that are no record: live forever, never overwritten.
    Unreadable,
}

/// What an operation does once it knows the state.
pub(super) enum Decision<T> {
    /// Answer without writing.
    Done(T),
    /// Write `record` (or clear the key for `None`), then answer; `own` is the note the
    /// writer keeps about its own record.
    Write {
        record: Option<Record>,
        answer: T,
        own: Option<(u64, Vec<u8>, Duration)>,
    },
}

/// A [`LeaseStore`] over any [`TxKv`]; see the [module documentation](self). Cloning shares the
/// store and the notes.
pub struct TxLeaseStore<K> {
    pub(super) kv: Arc<K>,
    pub(super) options: Arc<TxOptions>,
    notes: Arc<Mutex<HashMap<Target, Observation>>>,
    pub(super) time: Arc<dyn TimeSource>,
    /// The version of each semaphore record this process last read or wrote: the change feed's
    /// baseline (see the `semaphore` module).
    pub(super) semaphores: Arc<Mutex<SemaphoreVersions>>,
    /// Owners of semaphore units whose session record this process found cleared from outside,
    /// and when it first saw each so (see the `semaphore` module, `Tx.SemaphoreUnreleased`).
    pub(super) unreleased: Arc<crate::unreleased::Unreleased>,
}

impl<K> Clone for TxLeaseStore<K> {
    fn clone(&self) -> Self {
        TxLeaseStore {
            kv: self.kv.clone(),
            options: self.options.clone(),
            notes: self.notes.clone(),
            time: self.time.clone(),
            semaphores: self.semaphores.clone(),
            unreleased: self.unreleased.clone(),
        }
    }
}

impl<K> std::fmt::Debug for TxLeaseStore<K> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TxLeaseStore")
            .field("options", &self.options)
            .finish_non_exhaustive()
    }
}

fn malformed(slot: Slot) -> StoreError {
    StoreError::Corrupt {
        slot: slot.0,
        source: ValueError::Malformed("not a lease record of the transactional store"),
    }
}

impl<K: TxKv> TxLeaseStore<K> {
    /// A store over `kv` whose notes are timed by the runtime's [`Clock`].
    pub fn new(kv: K, options: TxOptions) -> Self {
        TxLeaseStore::with_time(kv, options, Clock)
    }

    /// A store over `kv` whose notes are timed by `time` (a monotonic clock).
    pub fn with_time(kv: K, options: TxOptions, time: impl TimeSource) -> Self {
        TxLeaseStore {
            kv: Arc::new(kv),
            options: Arc::new(options),
            notes: Arc::default(),
            time: Arc::new(time),
            semaphores: Arc::default(),
            unreleased: Arc::default(),
        }
    }

    /// Another process's view of the same store: it shares the key-value store but none of
    /// this one's notes, so it judges expiry from its own sightings only.
    pub fn other_observer(&self) -> Self {
        TxLeaseStore {
            kv: self.kv.clone(),
            options: self.options.clone(),
            notes: Arc::default(),
            time: self.time.clone(),
            semaphores: Arc::default(),
            unreleased: Arc::default(),
        }
    }

    /// The key-value store.
    pub fn kv(&self) -> &K {
        &self.kv
    }

    /// The key of `slot`.
    pub fn key(&self, slot: Slot) -> Vec<u8> {
        let mut key = self.options.prefix.clone();
        key.extend_from_slice(slot.0.to_string().as_bytes());
        key
    }

    /// The key of `slot`'s tenure (see the module documentation, `Tx.RecordRemoved`).
    pub(super) fn tenure_key(&self, slot: Slot) -> Vec<u8> {
        let mut key = self.options.prefix.clone();
        key.extend_from_slice(TENURE_PART);
        key.extend_from_slice(slot.0.to_string().as_bytes());
        key
    }

    /// The key of the session record `session`: `<prefix>session/<incarnation>-<id>`, never a
    /// slot's key (those end in the slot number's digits right after the prefix).
    pub fn session_key(&self, session: SessionKey) -> Vec<u8> {
        let mut key = self.options.prefix.clone();
        key.extend_from_slice(SESSION_PART);
        key.extend_from_slice(session.to_string().as_bytes());
        key
    }

    fn target_key(&self, target: Target) -> Vec<u8> {
        match target {
            Target::Slot(slot) => self.key(slot),
            Target::Session(session) => self.session_key(session),
        }
    }

    fn notes(&self) -> MutexGuard<'_, HashMap<Target, Observation>> {
        // Every critical section leaves the map consistent; a poisoned lock is usable.
        self.notes.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Classifies what a transaction that started at `started` read at `read_at` under
    /// `target`, and updates the notes. A holding is live while its session record is:
    /// `session` is what the same transaction read under that record's key. `ended`: the
    /// session record read (the target's, or the holding's session's) is known ended by its
    /// liveness mark (`session` module), which ends it as an expiry would.
    pub(super) fn observe(
        &self,
        target: Target,
        bytes: Option<&[u8]>,
        session: Option<&[u8]>,
        ended: bool,
        started: Instant,
        read_at: Instant,
    ) -> State {
        let record = match bytes {
            None => {
                self.notes().remove(&target);
                return State::Absent { revision: 0 };
            }
            Some(bytes) => Record::decode(bytes),
        };
        let (revision, ttl, value) = match record {
            None => return State::Unreadable,
            Some(Record::Deleted { revision }) => {
                self.notes().remove(&target);
                return State::Absent { revision };
            }
            Some(Record::Held {
                revision,
                session: holder,
                value,
            }) => {
                self.notes().remove(&target);
                let live = matches!(
                    self.observe(
                        Target::Session(holder),
                        session,
                        None,
                        ended,
                        started,
                        read_at
                    ),
                    State::Live { .. }
                );
                return match live {
                    true => State::Live {
                        revision,
                        value,
                        session: Some(holder),
                        removed: false,
                    },
                    false => State::Absent { revision },
                };
            }
            Some(Record::Live {
                revision,
                ttl,
                value,
            }) => (revision, ttl, value),
        };
        if ended && matches!(target, Target::Session(_)) {
            self.notes().remove(&target);
            return State::Absent { revision };
        }
        let mut notes = self.notes();
        match notes.get(&target) {
            Some(note) if note.revision == revision && note.value == value => {
                // Unchanged since the note: expired once a whole TTL lies between the note and
                // the start of this transaction (which sees every write committed before it).
                if started.saturating_since(note.since) >= note.ttl {
                    return State::Absent { revision };
                }
            }
            _ => note(
                &mut notes,
                target,
                Observation {
                    revision,
                    value: value.clone(),
                    ttl,
                    since: read_at,
                },
            ),
        }
        State::Live {
            revision,
            value,
            session: None,
            removed: false,
        }
    }

    /// [`observe`](Self::observe) of a slot whose key is gone, from its tenure key's copy
    /// `bytes` (`Tx.RecordRemoved`): a slot record is judged by observation as itself, a holding
    /// by its session, and a live one is [`State::Live`] with `removed`. The note kept of it
    /// holds the value [`marked`] as removed: a waiter whose baseline is that note waits on, a
    /// holder whose baseline is its record (or nothing) is woken (see the change feed).
    fn observe_removed(
        &self,
        target: Target,
        bytes: Option<&[u8]>,
        session: Option<&[u8]>,
        ended: bool,
        started: Instant,
        read_at: Instant,
    ) -> State {
        let record = bytes.and_then(Record::decode);
        let noted = match &record {
            Some(Record::Live {
                revision,
                ttl,
                value,
            }) => Record::Live {
                revision: *revision,
                ttl: *ttl,
                value: marked(value),
            }
            .encode(),
            _ => bytes.map(<[u8]>::to_vec).unwrap_or_default(),
        };
        let state = self.observe(target, Some(&noted), session, ended, started, read_at);
        let State::Live {
            revision, session, ..
        } = state
        else {
            return state;
        };
        let value = match record {
            Some(Record::Live { value, .. }) => value,
            Some(Record::Held { value, .. }) => {
                // A holding keeps no note of its own (its session's is judged): one for the
                // feed's baseline only.
                note(
                    &mut self.notes(),
                    target,
                    Observation {
                        revision,
                        value: marked(&value),
                        ttl: Duration::MAX,
                        since: read_at,
                    },
                );
                value
            }
            _ => return State::Unreadable,
        };
        State::Live {
            revision,
            value,
            session,
            removed: true,
        }
    }

    /// The TTL of the session `key`'s record as this process last noted it, if it did.
    pub(super) fn session_ttl(&self, key: SessionKey) -> Option<Duration> {
        self.notes().get(&Target::Session(key)).map(|note| note.ttl)
    }

    /// The time the record `target`, which a transaction that started at `started` just judged
    /// live, has left by this process's note: a transaction that starts later than that judges
    /// it expired unless it changed. `None` without a note.
    pub(super) fn time_left_of(&self, target: Target, started: Instant) -> Option<Duration> {
        self.notes().get(&target).map(|note| {
            note.ttl
                .saturating_sub(started.saturating_since(note.since))
        })
    }

    /// Notes a record this process wrote in a transaction that started at `started`.
    pub(super) fn note_own(
        &self,
        target: Target,
        own: Option<(u64, Vec<u8>, Duration)>,
        started: Instant,
    ) {
        let mut notes = self.notes();
        match own {
            None => {
                notes.remove(&target);
            }
            Some((revision, value, ttl)) => {
                if notes.len() >= OBSERVATIONS_MAX && !notes.contains_key(&target) {
                    forget_oldest(&mut notes);
                }
                let since = started;
                notes.insert(
                    target,
                    Observation {
                        revision,
                        value,
                        ttl,
                        since,
                    },
                );
            }
        }
    }

    /// Runs one operation on `target`: read, `decide`, maybe write and commit; again on
    /// conflicts. A holding's session record is read in the same transaction; so is the session
    /// record `also`, whose state `decide` gets beside the target's.
    pub(super) async fn transact<T>(
        &self,
        target: Target,
        also: Option<SessionKey>,
        decide: impl Fn(&State, Option<&State>) -> Result<Decision<T>, StoreError>,
    ) -> Result<T, StoreError> {
        self.transact_with(target, also, None, decide).await
    }

    /// [`transact`](Self::transact), writing `with` (a key and its value) too when the decision
    /// writes: a session's mark key goes with its record's creation.
    pub(super) async fn transact_with<T>(
        &self,
        target: Target,
        also: Option<SessionKey>,
        with: Option<(&[u8], &[u8])>,
        decide: impl Fn(&State, Option<&State>) -> Result<Decision<T>, StoreError>,
    ) -> Result<T, StoreError> {
        let key = self.target_key(target);
        let slot = match target {
            Target::Slot(slot) => slot,
            // Errors name a slot; a session record's name none (its key is in the cause).
            Target::Session(_) => Slot(0),
        };
        let timeout = self.options.timeout;
        let deadline = tokio::time::Instant::now() + timeout;
        let mut backoff = conflict_backoff();
        let mut last: Option<TxError> = None;
        for attempt in 0..=self.options.retries_max {
            if attempt > 0 {
                let pause = backoff.next().unwrap_or(BACKOFF_MAX);
                tokio::time::sleep(
                    pause.min(deadline.saturating_duration_since(tokio::time::Instant::now())),
                )
                .await;
            }
            let started = self.time.now();
            let mut tx = self.kv.begin().map_err(|error| failed(&error))?;
            let read = match read_in(&mut tx, &key, deadline, slot, timeout).await? {
                Ok(read) => read,
                Err(retry) => {
                    last = Some(retry);
                    continue;
                }
            };
            // A slot key that is gone: its tenure key tells a removal from outside.
            let (read, removed) = match (target, read) {
                (Target::Slot(slot), None) => {
                    match read_in(&mut tx, &self.tenure_key(slot), deadline, slot, timeout).await? {
                        Ok(tenure) => {
                            let removed = tenure.is_some();
                            (tenure, removed)
                        }
                        Err(retry) => {
                            last = Some(retry);
                            continue;
                        }
                    }
                }
                (_, read) => (read, false),
            };
            let holder = match read.as_deref().and_then(Record::decode) {
                Some(Record::Held { session, .. }) => Some(session),
                _ => None,
            };
            // The holding's session record, then `also` (read once when it is the same).
            let held_read = match self
                .read_session_in(&mut tx, holder, deadline, slot)
                .await?
            {
                Ok(read) => read,
                Err(retry) => {
                    last = Some(retry);
                    continue;
                }
            };
            let also_read = if also == holder {
                held_read.clone()
            } else {
                match self.read_session_in(&mut tx, also, deadline, slot).await? {
                    Ok(read) => read,
                    Err(retry) => {
                        last = Some(retry);
                        continue;
                    }
                }
            };
            let held_session = held_read.as_ref().and_then(Option::as_deref);
            let also_bytes = also_read.as_ref().and_then(Option::as_deref);
            // Each session read judged by its liveness mark too, in the same transaction.
            let mut ended = [false, false];
            let mut retry = None;
            for (i, session, bytes) in [(0, holder, held_session), (1, also, also_bytes)] {
                let Some(session) = session else { continue };
                if i == 1 && also == holder {
                    ended[1] = ended[0];
                    continue;
                }
                match self
                    .ended_by_mark(&mut tx, session, bytes, deadline, slot)
                    .await?
                {
                    Ok(judged) => ended[i] = judged,
                    Err(error) => {
                        retry = Some(error);
                        break;
                    }
                }
            }
            if let Some(error) = retry {
                last = Some(error);
                continue;
            }
            let read_at = self.time.now();
            let judge = if removed {
                Self::observe_removed
            } else {
                Self::observe
            };
            let state = judge(
                self,
                target,
                read.as_deref(),
                held_session,
                ended[0],
                started,
                read_at,
            );
            let also_state = also.map(|session| {
                self.observe(
                    Target::Session(session),
                    also_bytes,
                    None,
                    ended[1],
                    started,
                    read_at,
                )
            });
            let (record, answer, own) = match decide(&state, also_state.as_ref())? {
                Decision::Done(answer) => return Ok(answer),
                Decision::Write {
                    record,
                    answer,
                    own,
                } => (record, answer, own),
            };
            match &record {
                Some(record) => tx.set(&key, &record.encode()),
                None => tx.clear(&key),
            }
            if let (Target::Slot(slot), Some(record)) = (target, &record) {
                tx.set(&self.tenure_key(slot), &record.tenure().encode());
            }
            if let Some((with_key, with_value)) = with {
                tx.set(with_key, with_value);
            }
            match tokio::time::timeout_at(deadline, tx.commit()).await {
                Err(_) => {
                    return Err(StoreError::unknown(CallTimedOut {
                        call: "committing",
                        slot: slot.0,
                        timeout,
                    }))
                }
                Ok(Ok(())) => {
                    self.note_own(target, own, started);
                    return Ok(answer);
                }
                Ok(Err(error @ TxError::Retryable { .. })) => last = Some(error),
                Ok(Err(error @ TxError::UnknownResult { .. })) => {
                    // The note may be stale now either way; the next read renews it.
                    self.notes().remove(&target);
                    return Err(StoreError::unknown(error));
                }
                Ok(Err(error)) => return Err(failed(&error)),
            }
        }
        Err(StoreError::failed(TxLeaseError::Conflicted {
            slot: slot.0,
            attempts: self.options.retries_max + 1,
            last,
        }))
    }
}

impl<K: TxKv> TxLeaseStore<K> {
    /// Reads the record of `session` in `tx`, if there is a session: `Ok(Err(retryable))` when
    /// the transaction must be run again.
    async fn read_session_in(
        &self,
        tx: &mut K::Tx,
        session: Option<SessionKey>,
        deadline: tokio::time::Instant,
        slot: Slot,
    ) -> Result<Result<Option<Option<Vec<u8>>>, TxError>, StoreError> {
        let Some(session) = session else {
            return Ok(Ok(None));
        };
        let key = self.session_key(session);
        let read = read_in(tx, &key, deadline, slot, self.options.timeout).await?;
        Ok(read.map(Some))
    }
}

/// Reads `key` in `tx` by `deadline`: `Ok(Err(retryable))` when the transaction must be run
/// again.
pub(super) async fn read_in<T: KvTx>(
    tx: &mut T,
    key: &[u8],
    deadline: tokio::time::Instant,
    slot: Slot,
    timeout: Duration,
) -> Result<Result<Option<Vec<u8>>, TxError>, StoreError> {
    match tokio::time::timeout_at(deadline, tx.get(key)).await {
        Err(_) => Err(StoreError::failed(CallTimedOut {
            call: "reading",
            slot: slot.0,
            timeout,
        })),
        Ok(Err(error @ TxError::Retryable { .. })) => Ok(Err(error)),
        Ok(Err(error)) => Err(failed(&error)),
        Ok(Ok(read)) => Ok(Ok(read)),
    }
}

/// Why a change-feed round ended.
enum Round {
    /// A watched slot was released or passed to another holder.
    Changed,
    /// A watch fired, but the holders are the same: look again.
    Again,
}

impl<K: TxKv> TxLeaseStore<K> {
    /// The holder this process last saw in each of `slots`, if it has a note.
    fn last_seen(&self, slots: &[Slot]) -> Vec<Option<Vec<u8>>> {
        let notes = self.notes();
        slots
            .iter()
            .map(|slot| {
                notes
                    .get(&Target::Slot(*slot))
                    .map(|note| note.value.clone())
            })
            .collect()
    }

    /// The change feed of `slots` (sorted, distinct) from `baseline` (taken at the call); see
    /// the module documentation.
    async fn feed(self, slots: Vec<Slot>, baseline: Vec<Option<Vec<u8>>>) {
        let began = tokio::time::Instant::now();
        let mut baseline = baseline;
        for (seen, now) in baseline.iter_mut().zip(self.last_seen(&slots)) {
            if seen.is_none() {
                *seen = now;
            }
        }
        loop {
            match self.feed_round(&slots, &mut baseline).await {
                Ok(Round::Changed) => {
                    tracing::debug!(?slots, "transactional change feed: a holder changed");
                    return;
                }
                Ok(Round::Again) => {}
                Err(error) => {
                    tracing::debug!(?slots, error = %vvm_runtime::ErrorChain(&error), "transactional change feed: cannot tell");
                    tokio::time::sleep_until(began + FEED_UNKNOWN_PAUSE).await;
                    return;
                }
            }
        }
    }

    /// One round: read and watch every slot in one transaction, then wait for a watch.
    async fn feed_round(
        &self,
        slots: &[Slot],
        baseline: &mut [Option<Vec<u8>>],
    ) -> Result<Round, StoreError> {
        let timeout = self.options.timeout;
        let deadline = tokio::time::Instant::now() + timeout;
        let mut tx = self.kv.begin().map_err(|error| failed(&error))?;
        let mut watches = Vec::with_capacity(slots.len());
        // The liveness marks of the slots' holding sessions, waited on beside the watches
        // (`session` module): a freed mark makes the waiter look again at once.
        let mut marks = Vec::new();
        for (slot, seen) in slots.iter().zip(baseline.iter_mut()) {
            let key = self.key(*slot);
            let read = tokio::time::timeout_at(deadline, tx.get(&key))
                .await
                .map_err(|_| {
                    StoreError::failed(CallTimedOut {
                        call: "reading",
                        slot: slot.0,
                        timeout,
                    })
                })?
                .map_err(|error| failed(&error))?;
            // A key removed from outside (`Tx.RecordRemoved`) is its record's copy in the tenure
            // key, marked: a waiter that saw it so waits on; its holder, whose baseline is its
            // record (a holding's: none), is woken and learns its loss.
            let removed = match read {
                Some(_) => None,
                None => read_in(&mut tx, &self.tenure_key(*slot), deadline, *slot, timeout)
                    .await?
                    .map_err(|error| failed(&error))?
                    .and_then(|tenure| match Record::decode(&tenure) {
                        Some(Record::Live { value, .. } | Record::Held { value, .. }) => {
                            Some(marked(&value))
                        }
                        _ => None,
                    }),
            };
            if let Some(removed) = removed {
                match seen {
                    Some(seen) if *seen == removed => {}
                    _ => return Ok(Round::Changed),
                }
                watches.push(Box::pin(tx.watch(&key)));
                continue;
            }
            let holder = match read {
                None => return Ok(Round::Changed),
                Some(bytes) => match Record::decode(&bytes) {
                    None => bytes,
                    Some(Record::Deleted { .. }) => return Ok(Round::Changed),
                    // A holding's end with its session changes no key: the waiter's own timer
                    // covers it, as an expiry, and so does its mark where there is one.
                    Some(Record::Held { value, session, .. }) => {
                        if self.kv.has_marks() {
                            let mark_key = self.mark_key(session);
                            let epoch = read_in(&mut tx, &mark_key, deadline, *slot, timeout)
                                .await?
                                .map_err(|error| failed(&error))?;
                            if let Some(epoch) = epoch {
                                marks.push(self.kv.mark_freed(&self.session_key(session), &epoch));
                            }
                        }
                        value
                    }
                    Some(Record::Live { value, .. }) => value,
                },
            };
            match seen {
                Some(seen) if *seen != holder => return Ok(Round::Changed),
                Some(_) => {}
                None => *seen = Some(holder),
            }
            watches.push(Box::pin(tx.watch(&key)));
        }
        tokio::time::timeout_at(deadline, tx.commit())
            .await
            .map_err(|_| {
                let slot = slots.first().map_or(0, |slot| slot.0);
                StoreError::unknown(CallTimedOut {
                    call: "committing the watches",
                    slot,
                    timeout,
                })
            })?
            .map_err(|error| failed(&error))?;
        let fired = std::future::poll_fn(|cx| {
            for mark in &mut marks {
                if mark.as_mut().poll(cx).is_ready() {
                    return std::task::Poll::Ready(None);
                }
            }
            for watch in &mut watches {
                if let std::task::Poll::Ready(result) =
                    std::future::Future::poll(watch.as_mut(), cx)
                {
                    return std::task::Poll::Ready(Some(result));
                }
            }
            std::task::Poll::Pending
        })
        .await;
        match fired {
            // A holder's mark may be free: the waiter tries again, which judges it.
            None => Ok(Round::Changed),
            Some(result) => {
                result.map_err(|error| failed(&error))?;
                Ok(Round::Again)
            }
        }
    }
}

/// Notes `observation` of `target`, within [`OBSERVATIONS_MAX`] notes.
fn note(notes: &mut HashMap<Target, Observation>, target: Target, observation: Observation) {
    if notes.len() >= OBSERVATIONS_MAX && !notes.contains_key(&target) {
        forget_oldest(notes);
    }
    notes.insert(target, observation);
}

fn forget_oldest(notes: &mut HashMap<Target, Observation>) {
    if let Some(oldest) = notes
        .iter()
        .min_by_key(|(_, note)| note.since)
        .map(|(slot, _)| *slot)
    {
        notes.remove(&oldest);
    }
}

pub(super) fn failed(error: &TxError) -> StoreError {
    StoreError::failed(error.clone())
}

pub(super) fn next_revision(slot: Slot, revision: u64) -> Result<u64, StoreError> {
    revision
        .checked_add(1)
        .ok_or_else(|| StoreError::failed(TxLeaseError::RevisionsExhausted { slot: slot.0 }))
}

/// Writes a live record of `value` at `revision` with `ttl`, noted as this process's own, and
/// answers its revision.
pub(super) fn live_write(revision: u64, ttl: Duration, value: &[u8]) -> Decision<Option<Revision>> {
    Decision::Write {
        record: Some(Record::Live {
            revision,
            ttl,
            value: value.to_vec(),
        }),
        answer: Some(Revision(revision)),
        own: Some((revision, value.to_vec(), ttl)),
    }
}

/// `value` marked as the value of a record removed from outside (`Tx.RecordRemoved`), for the
/// notes and the change feed: a lease value never starts with a NUL byte.
fn marked(value: &[u8]) -> Vec<u8> {
    [b"\0removed\0".as_slice(), value].concat()
}

fn matches(revision: u64, value: &[u8], expected: &Lease) -> bool {
    revision == expected.revision.0 && value == expected.value.encode().as_bytes()
}

impl<K: TxKv> LeaseStore for TxLeaseStore<K> {
    async fn insert_if_not_exists(
        &self,
        key: Slot,
        value: &LeaseValue,
        ttl: Duration,
    ) -> Result<Option<Revision>, StoreError> {
        let bytes = value.encode().into_bytes();
        self.transact(Target::Slot(key), None, |state, _| match state {
            State::Absent { revision } => {
                let revision = next_revision(key, *revision)?;
                Ok(live_write(revision, ttl, &bytes))
            }
            State::Live { .. } | State::Unreadable => Ok(Decision::Done(None)),
        })
        .await
    }

    async fn compare_and_swap(
        &self,
        key: Slot,
        expected: &Lease,
        new_value: &LeaseValue,
        ttl: Duration,
    ) -> Result<Option<Revision>, StoreError> {
        let bytes = new_value.encode().into_bytes();
        self.transact(Target::Slot(key), None, |state, _| match state {
            // A record removed from outside is not renewed: its holder has lost it.
            State::Live {
                revision,
                value,
                removed: false,
                ..
            } if matches(*revision, value, expected) => {
                let revision = next_revision(key, *revision)?;
                Ok(live_write(revision, ttl, &bytes))
            }
            _ => Ok(Decision::Done(None)),
        })
        .await
    }

    async fn compare_and_delete(&self, key: Slot, expected: &Lease) -> Result<bool, StoreError> {
        // Also a record removed from outside (`Tx.RecordRemoved`): its holder has stopped, and
        // its release's tombstone frees the slot at once.
        self.transact(Target::Slot(key), None, |state, _| match state {
            State::Live {
                revision, value, ..
            } if matches(*revision, value, expected) => {
                Ok(Decision::Write {
                    // The tombstone keeps the revision: a later insert goes higher.
                    record: Some(Record::Deleted {
                        revision: *revision,
                    }),
                    answer: true,
                    own: None,
                })
            }
            _ => Ok(Decision::Done(false)),
        })
        .await
    }

    async fn get(&self, key: Slot) -> Result<Option<Lease>, StoreError> {
        self.transact(Target::Slot(key), None, |state, _| match state {
            // A record removed from outside is gone for a reader (its holder learns its loss),
            // though still judged live for a writer until a TTL has passed.
            State::Absent { .. } | State::Live { removed: true, .. } => Ok(Decision::Done(None)),
            State::Unreadable => Err(malformed(key)),
            State::Live {
                revision, value, ..
            } => {
                let value = LeaseValue::decode(value).map_err(|source| StoreError::Corrupt {
                    slot: key.0,
                    source,
                })?;
                Ok(Decision::Done(Some(Lease {
                    value,
                    revision: Revision(*revision),
                })))
            }
        })
        .await
    }

    /// The time this process gives the record before it judges it expired unless it changes:
    /// the TTL from when it first saw the record (for a slot held by a session, the session's
    /// record) unchanged. A process that has just begun to look gives it a whole TTL. It times
    /// a refused candidate's next try and tells an observer whether a record that went away was
    /// deleted before that (released) or expired.
    async fn time_left(&self, key: Slot) -> Result<Option<Duration>, StoreError> {
        let target = self
            .transact(Target::Slot(key), None, |state, _| {
                Ok(Decision::Done(match state {
                    State::Live {
                        session: Some(holder),
                        ..
                    } => Some(Target::Session(*holder)),
                    State::Live { session: None, .. } => Some(Target::Slot(key)),
                    State::Absent { .. } | State::Unreadable => None,
                }))
            })
            .await?;
        // Read after the transaction, which started earlier: at most the time left it judged.
        let now = self.time.now();
        Ok(target.and_then(|target| self.time_left_of(target, now)))
    }

    /// Watches of the store's keys; see the module documentation (change feed).
    fn changed(&self, keys: &[Slot]) -> SlotChange {
        let mut slots = keys.to_vec();
        slots.sort_unstable();
        slots.dedup();
        if slots.is_empty() {
            return Box::pin(std::future::pending());
        }
        // Taken at the call: a change after it differs from this.
        let baseline = self.last_seen(&slots);
        Box::pin(self.clone().feed(slots, baseline))
    }

    /// Watches report deletions and holder changes: candidates wait for them or the expiry
    /// instead of polling in rounds.
    fn has_change_feed(&self) -> bool {
        true
    }
}
