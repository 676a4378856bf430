//! Semaphores of the transactional stores ([`SemaphoreStore`]), FoundationDB's and the
//! in-memory model's: one key per semaphore holding its encoded state, and one key per session
//! listing the semaphores it is a party of.
//!
//! # Keys
//!
//! ```text
//! <prefix> 0x00 "semaphore/" <name>     0x01 'S' <version: u64 BE> <Semaphore::encode>
//!                                       0x01 'D' <version: u64 BE> <generation: u64 BE> <next order id: u64 BE>
//! <prefix> 0x00 "parties/" <session>    (<name length: u8> <name>)*
//! ```
//!
//! A slot key has a digit right after the prefix and a session key `s`; these have a NUL byte,
//! which a name never holds (no control characters) and an accepted prefix never holds
//! ([`TxOptions::prefix`](super::TxOptions::prefix)), so no key of one prefix is a key of
//! another. The `'D'` form is a deleted semaphore's counters, so that one created again under
//! the name continues its tokens and order ids. The version rises with every write of the key
//! (its delete included): the change feed compares it.
//!
//! The *parties* key of a session names every semaphore in which it owns or waits (at most
//! [`SEMAPHORES_PER_SESSION_MAX`]): the key-value store has no range reads, and deleting a
//! session removes its parties from each of them in the same transaction.
//!
//! # One transaction per operation
//!
//! | operation | one transaction |
//! |---|---|
//! | `semaphore` | read the semaphore's key; read the session records of the caller and of every party, each judged as the store judges sessions (by observation, [`lease`](super::lease)); run [`transact`]; when it writes: the semaphore's key with the next version, and the parties key of every session that joined or left (the caller, and the parties removed) |
//! | `delete_session` | read the session record (live at the expected revision); read its parties key; every semaphore named there with the session's party removed as by its expiry; clear the parties key and the session record |
//!
//! The queue's order is the core's order ids, assigned inside the transaction: the store's
//! transactions are serializable, and every operation on a semaphore reads its key, so they
//! commit one after the other in that order.
//!
//! **Liveness.** A party is live while its session record is, as this process judges it: a
//! session renewed by its keepalives (which rewrite the record) stays live; one that stopped is
//! judged expired a whole TTL after this process first saw its last revision. The time a party
//! has left ([`Applied::parties_expire_in`]) is what is left of that TTL. Every session record
//! read is a read of the transaction, so a keepalive committed meanwhile makes it run again.
//!
//! **Owners cleared from outside** (`Tx.SemaphoreUnreleased`): a session record whose key holds
//! nothing at all was cleared, and a session's own delete removes its parties in the same
//! transaction, so an owner of units left behind had its record cleared from outside (`fdbcli`
//! `clear`). It did not release its units and may act until its session would have run out: it
//! stays counted, in its place, until its TTL (as this process noted it, else the caller's)
//! after this process first saw it so (`crate::unreleased`), then goes as expired. A waiter so
//! cleared holds no units and goes at once.
//!
//! **Change feed.** [`SemaphoreStore::semaphore_changed`] rests on the store's watches, as the
//! slots' feed does: a round reads the semaphore's key and watches it in one read-only
//! transaction; it resolves when the version read differs from the baseline (the last version
//! this process read or wrote, at the call; without one, at the first round), or when the
//! watch fires. A round that fails resolves, not before [`FEED_UNKNOWN_PAUSE`] after the wait
//! began. A session's expiry changes no key and so wakes nobody: waiters look again at the
//! soonest party expiry. On a store with liveness marks (`Tx.Marks`) a round also waits on the
//! marks of the semaphore's first [`MARKS_WAITED_MAX`] parties, so a dead owner's units are
//! taken as soon as the store frees its mark.

use std::collections::{BTreeSet, HashMap, HashSet};
use std::convert::Infallible;
use std::future::Future;
use std::time::Duration;

use vvm_core::semaphore::{DecodeError, Generation, OrderId, Semaphore, SemaphoreName, SessionKey};
use vvm_core::{Instant, Revision};
use vvm_runtime::semaphore_store::{transact, Write};
use vvm_runtime::{
    Applied, CallTimedOut, SemaphoreChange, SemaphoreRequest, SemaphoreStore, SemaphoreStoreError,
    StoreError,
};
use vvm_runtime::{NamesPage, SemaphoreNames, UnreadableName};

use super::lease::{
    conflict_backoff, failed, read_in, SemaphoreVersions, State, Target, TxLeaseError,
    TxLeaseStore, BACKOFF_MAX, FEED_UNKNOWN_PAUSE,
};
use super::{KvTx, TxError, TxKv};

/// A session judged by its record.
enum Judged {
    /// Live, with this much time left (`Duration::MAX`: not known, or a record that cannot be
    /// read, which is never judged on a guess).
    Live(Duration),
    /// Expired by observation, or deleted.
    Over,
    /// Its key cleared: by a delete of its own, which removes its parties in the same
    /// transaction, or from outside (`Tx.SemaphoreUnreleased`).
    Cleared,
}

/// Most parties of one semaphore whose liveness marks a waiting feed waits on (`Tx.Marks`):
/// each is a connection blocked on the server (PostgreSQL), shared by every feed of the store
/// handle; a party beyond them is followed by its TTL. Leader election and a `vvm run
/// --semaphore` gate have one owner.
pub const MARKS_WAITED_MAX: usize = 16;

/// Most semaphores one session may be a party of at once on a transactional store: its parties
/// key then stays below 64 KiB (FoundationDB's values are at most 100 000 bytes).
pub const SEMAPHORES_PER_SESSION_MAX: usize = 250;

/// Why a semaphore operation of a transactional store failed although its transaction ran: the
/// cause inside its [`StoreError`].
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum TxSemaphoreError {
    /// The session is a party of [`SEMAPHORES_PER_SESSION_MAX`] semaphores already.
    #[error("session {session} is a party of {max} semaphores already")]
    TooManySemaphores {
        /// The session.
        session: SessionKey,
        /// The bound.
        max: usize,
    },
    /// A session's parties key is not a list of names; it is left as it is.
    #[error("the parties key of session {session} cannot be read")]
    PartiesCorrupt {
        /// The session.
        session: SessionKey,
    },
    /// Every attempt conflicted with another transaction.
    #[error("semaphore {name} conflicted on {attempts} attempts")]
    Conflicted {
        /// The semaphore (or the session, for a delete).
        name: String,
        /// How many transactions were run.
        attempts: u32,
        /// The last attempt's error.
        #[source]
        last: Option<TxError>,
    },
}

const VERSION: u8 = 1;
const STATE: u8 = b'S';
const DELETED: u8 = b'D';
const SEMAPHORE_PART: &[u8] = b"\0semaphore/";
const PARTIES_PART: &[u8] = b"\0parties/";

/// Most names whose version a store value remembers ([`SemaphoreVersions`]); beyond it they
/// are all forgotten, which only makes a feed take its first round's read as the baseline.
const SEEN_MAX: usize = 4096;

/// What a semaphore key holds.
#[derive(Debug)]
struct Stored {
    /// The version of the key: 0 when absent, `None` when it cannot be read.
    version: Option<u64>,
    state: Option<Semaphore>,
    counters: Option<(Generation, OrderId)>,
}

fn encode(version: u64, write: &Write) -> Option<Vec<u8>> {
    let mut bytes = vec![VERSION];
    match write {
        Write::Keep => return None,
        Write::Put(semaphore) => {
            bytes.push(STATE);
            bytes.extend_from_slice(&version.to_be_bytes());
            bytes.extend_from_slice(&semaphore.encode());
        }
        Write::Delete {
            generation,
            next_order_id,
        } => {
            bytes.push(DELETED);
            bytes.extend_from_slice(&version.to_be_bytes());
            bytes.extend_from_slice(&generation.0.to_be_bytes());
            bytes.extend_from_slice(&next_order_id.0.to_be_bytes());
        }
    }
    Some(bytes)
}

fn be(bytes: &[u8]) -> Result<u64, DecodeError> {
    let array: [u8; 8] = bytes.try_into().map_err(|_| DecodeError::Truncated)?;
    Ok(u64::from_be_bytes(array))
}

/// The version of an envelope, when its header is readable.
fn version_of(bytes: &[u8]) -> Option<u64> {
    match bytes {
        [VERSION, STATE | DELETED, rest @ ..] => be(rest.get(..8)?).ok(),
        _ => None,
    }
}

fn decode(bytes: Option<&[u8]>) -> Result<Stored, DecodeError> {
    let Some(bytes) = bytes else {
        return Ok(Stored {
            version: Some(0),
            state: None,
            counters: None,
        });
    };
    let version = version_of(bytes).ok_or(DecodeError::Magic)?;
    let body = bytes.get(10..).ok_or(DecodeError::Truncated)?;
    match bytes[1] {
        STATE => Ok(Stored {
            version: Some(version),
            state: Some(Semaphore::decode(body)?),
            counters: None,
        }),
        _ => {
            if body.len() != 16 {
                return Err(DecodeError::Truncated);
            }
            Ok(Stored {
                version: Some(version),
                state: None,
                counters: Some((Generation(be(&body[..8])?), OrderId(be(&body[8..])?.max(1)))),
            })
        }
    }
}

fn encode_names(names: &BTreeSet<SemaphoreName>) -> Vec<u8> {
    let mut bytes = Vec::new();
    for name in names {
        let text = name.as_str().as_bytes();
        // A name is at most 255 bytes.
        bytes.push(u8::try_from(text.len()).unwrap_or(u8::MAX));
        bytes.extend_from_slice(text);
    }
    bytes
}

fn decode_names(bytes: &[u8]) -> Option<BTreeSet<SemaphoreName>> {
    let mut names = BTreeSet::new();
    let mut rest = bytes;
    while let Some((&len, tail)) = rest.split_first() {
        let len = usize::from(len);
        let text = tail.get(..len)?;
        let name = SemaphoreName::new(std::str::from_utf8(text).ok()?).ok()?;
        names.insert(name);
        rest = &tail[len..];
    }
    Some(names)
}

/// The sessions that own or wait in `state`.
fn parties(state: Option<&Semaphore>) -> HashSet<SessionKey> {
    state.map_or_else(HashSet::new, |state| {
        state
            .owners()
            .iter()
            .map(|o| o.session)
            .chain(state.waiters().iter().map(|w| w.session))
            .collect()
    })
}

/// What one attempt of a transaction decided.
pub(super) enum Step<T, Tx> {
    /// Answer without writing (the transaction is dropped).
    Read(T),
    /// Commit `Tx`, then answer.
    Commit(T, Tx),
    /// Run the transaction again.
    Retry(TxError),
}

/// `Ok(Err(retryable))` from a read: the attempt is run again.
macro_rules! read_or_retry {
    ($read:expr) => {
        match $read.await? {
            Ok(value) => value,
            Err(retry) => return Ok(Step::Retry(retry)),
        }
    };
}

impl<K: TxKv> TxLeaseStore<K> {
    /// The key of the semaphore `name`.
    pub fn semaphore_key(&self, name: &SemaphoreName) -> Vec<u8> {
        let mut key = self.options.prefix.clone();
        key.extend_from_slice(SEMAPHORE_PART);
        key.extend_from_slice(name.as_str().as_bytes());
        key
    }

    /// The key listing the semaphores `session` is a party of.
    fn parties_key(&self, session: SessionKey) -> Vec<u8> {
        let mut key = self.options.prefix.clone();
        key.extend_from_slice(PARTIES_PART);
        key.extend_from_slice(session.to_string().as_bytes());
        key
    }

    fn seen(&self) -> std::sync::MutexGuard<'_, SemaphoreVersions> {
        // Every critical section leaves the map consistent; a poisoned lock is usable.
        self.semaphores
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    fn note_version(&self, name: &SemaphoreName, version: Option<u64>) {
        let mut seen = self.seen();
        if seen.len() >= SEEN_MAX && !seen.contains_key(name) {
            seen.clear();
        }
        seen.insert(name.clone(), version);
    }

    /// Runs `attempt` on fresh transactions until it answers, commits, or the retry limit or
    /// the operation timeout is reached (as the slots' operations are).
    pub(super) async fn retrying<T, F, Fut>(
        &self,
        what: &str,
        mut attempt: F,
    ) -> Result<T, StoreError>
    where
        F: FnMut(K::Tx, Instant) -> Fut,
        Fut: Future<Output = Result<Step<T, K::Tx>, StoreError>>,
    {
        let timeout = self.options.timeout;
        let deadline = tokio::time::Instant::now() + timeout;
        let mut backoff = conflict_backoff();
        let mut last = None;
        for tried in 0..=self.options.retries_max {
            if tried > 0 {
                let pause = backoff.next().unwrap_or(BACKOFF_MAX);
                tokio::time::sleep(
                    pause.min(deadline.saturating_duration_since(tokio::time::Instant::now())),
                )
                .await;
            }
            let started = self.time.now();
            let tx = self.kv.begin().map_err(|error| failed(&error))?;
            let step = tokio::time::timeout_at(deadline, attempt(tx, started))
                .await
                .map_err(|_| {
                    StoreError::failed(CallTimedOut {
                        call: "reading",
                        slot: 0,
                        timeout,
                    })
                })??;
            let (answer, tx) = match step {
                Step::Read(answer) => return Ok(answer),
                Step::Retry(error) => {
                    last = Some(error);
                    continue;
                }
                Step::Commit(answer, tx) => (answer, tx),
            };
            match tokio::time::timeout_at(deadline, tx.commit()).await {
                Err(_) => {
                    return Err(StoreError::unknown(CallTimedOut {
                        call: "committing",
                        slot: 0,
                        timeout,
                    }))
                }
                Ok(Ok(())) => return Ok(answer),
                Ok(Err(error @ TxError::Retryable { .. })) => last = Some(error),
                Ok(Err(error @ TxError::UnknownResult { .. })) => {
                    return Err(StoreError::unknown(error))
                }
                Ok(Err(error)) => return Err(failed(&error)),
            }
        }
        Err(StoreError::failed(TxSemaphoreError::Conflicted {
            name: what.to_owned(),
            attempts: self.options.retries_max + 1,
            last,
        }))
    }

    /// Reads `key` in `tx` within the operation's timeout (the caller bounds the attempt).
    async fn get_in(
        &self,
        tx: &mut K::Tx,
        key: &[u8],
    ) -> Result<Result<Option<Vec<u8>>, TxError>, StoreError> {
        let far = tokio::time::Instant::now() + self.options.timeout;
        read_in(tx, key, far, vvm_core::Slot(0), self.options.timeout).await
    }

    /// The session `key` judged by its record, read in `tx`.
    async fn session_left_in(
        &self,
        tx: &mut K::Tx,
        key: SessionKey,
        started: Instant,
    ) -> Result<Result<Judged, TxError>, StoreError> {
        let bytes = match self.get_in(tx, &self.session_key(key)).await? {
            Ok(bytes) => bytes,
            Err(retry) => return Ok(Err(retry)),
        };
        let far = tokio::time::Instant::now() + self.options.timeout;
        let ended = match self
            .ended_by_mark(tx, key, bytes.as_deref(), far, vvm_core::Slot(0))
            .await?
        {
            Ok(ended) => ended,
            Err(retry) => return Ok(Err(retry)),
        };
        let read_at = self.time.now();
        let state = self.observe(
            Target::Session(key),
            bytes.as_deref(),
            None,
            ended,
            started,
            read_at,
        );
        Ok(Ok(match state {
            // No bytes at all: cleared. A session's delete removes its parties in the same
            // transaction, so a party left behind was cleared from outside.
            State::Absent { .. } if bytes.is_none() => Judged::Cleared,
            State::Absent { .. } => Judged::Over,
            // Not a session record of this format: live for ever, never judged on a guess.
            State::Unreadable => Judged::Live(Duration::MAX),
            State::Live { .. } => Judged::Live(
                self.time_left_of(Target::Session(key), started)
                    .unwrap_or(Duration::MAX),
            ),
        }))
    }

    /// Reads the parties key of `session` in `tx`, adds or removes `name`, and writes it back.
    async fn update_parties(
        &self,
        tx: &mut K::Tx,
        session: SessionKey,
        name: &SemaphoreName,
        joined: bool,
    ) -> Result<Result<Result<(), SemaphoreStoreError>, TxError>, StoreError> {
        let key = self.parties_key(session);
        let bytes = match self.get_in(tx, &key).await? {
            Ok(bytes) => bytes,
            Err(retry) => return Ok(Err(retry)),
        };
        let Some(mut names) = decode_names(bytes.as_deref().unwrap_or_default()) else {
            return Ok(Ok(Err(SemaphoreStoreError::Store(StoreError::failed(
                TxSemaphoreError::PartiesCorrupt { session },
            )))));
        };
        if joined {
            if names.len() >= SEMAPHORES_PER_SESSION_MAX && !names.contains(name) {
                return Ok(Ok(Err(SemaphoreStoreError::Store(StoreError::failed(
                    TxSemaphoreError::TooManySemaphores {
                        session,
                        max: SEMAPHORES_PER_SESSION_MAX,
                    },
                )))));
            }
            names.insert(name.clone());
        } else {
            names.remove(name);
        }
        if names.is_empty() {
            tx.clear(&key);
        } else {
            tx.set(&key, &encode_names(&names));
        }
        Ok(Ok(Ok(())))
    }

    /// One attempt of a semaphore operation (see the module documentation).
    async fn semaphore_attempt(
        &self,
        mut tx: K::Tx,
        started: Instant,
        session: SessionKey,
        name: &SemaphoreName,
        request: SemaphoreRequest,
    ) -> Result<Step<Result<(Applied, Option<u64>), SemaphoreStoreError>, K::Tx>, StoreError> {
        let key = self.semaphore_key(name);
        let bytes = read_or_retry!(self.get_in(&mut tx, &key));
        let stored = match decode(bytes.as_deref()) {
            Ok(stored) => stored,
            Err(source) => {
                let name = name.clone();
                return Ok(Step::Read(Err(SemaphoreStoreError::Corrupt {
                    name,
                    source,
                })));
            }
        };
        let before = parties(stored.state.as_ref());
        let owners: HashSet<SessionKey> =
            stored.state.as_ref().map_or_else(HashSet::new, |state| {
                state.owners().iter().map(|owner| owner.session).collect()
            });
        let mut left = HashMap::new();
        for party in std::iter::once(session).chain(before.iter().copied()) {
            if let std::collections::hash_map::Entry::Vacant(entry) = left.entry(party) {
                // The TTL an owner cleared from outside is waited for: its own as noted, else
                // the caller's (read before the judgement, which forgets a cleared one's note).
                let ttl = self
                    .session_ttl(party)
                    .or_else(|| self.session_ttl(session));
                let judged = read_or_retry!(self.session_left_in(&mut tx, party, started));
                let judged = match judged {
                    Judged::Live(left) => {
                        self.unreleased.live(party);
                        Some(left)
                    }
                    Judged::Over => None,
                    Judged::Cleared if party == session || !owners.contains(&party) => None,
                    Judged::Cleared => {
                        let ttl = ttl.unwrap_or(Duration::MAX);
                        self.unreleased.left(party, ttl, self.time.now())
                    }
                };
                entry.insert(judged);
            }
        }
        let Ok(decided) = transact(
            stored.state,
            stored.counters,
            session,
            name,
            request,
            |party| Ok::<_, Infallible>(left.get(&party).copied().flatten()),
        );
        let (write, applied) = match decided {
            Ok(decided) => decided,
            Err(refused) => return Ok(Step::Read(Err(refused))),
        };
        let version = stored.version.unwrap_or(0);
        let Some(version) = version.checked_add(1) else {
            return Err(StoreError::failed(TxLeaseError::RevisionsExhausted {
                slot: 0,
            }));
        };
        let after = match &write {
            Write::Keep => {
                self.note_version(name, stored.version);
                return Ok(Step::Read(Ok((applied, None))));
            }
            Write::Put(state) => parties(Some(state)),
            Write::Delete { .. } => HashSet::new(),
        };
        for (party, joined) in after
            .difference(&before)
            .map(|party| (*party, true))
            .chain(before.difference(&after).map(|party| (*party, false)))
        {
            if let Err(refused) = read_or_retry!(self.update_parties(&mut tx, party, name, joined))
            {
                return Ok(Step::Read(Err(refused)));
            }
        }
        if let Some(bytes) = encode(version, &write) {
            tx.set(&key, &bytes);
        }
        Ok(Step::Commit(Ok((applied, Some(version))), tx))
    }

    /// Deletes the session record `key` at `expected` and, in the same transaction, removes its
    /// parties from every semaphore its parties key names (`SessionStore::delete_session`).
    pub(super) async fn delete_session_and_parties(
        &self,
        key: SessionKey,
        expected: Revision,
    ) -> Result<bool, StoreError> {
        let what = format!("session {key}");
        let written = self
            .retrying(&what, |tx, started| {
                self.delete_session_attempt(tx, started, key, expected)
            })
            .await?;
        let Some(versions) = written else {
            return Ok(false);
        };
        self.note_own(Target::Session(key), None, self.time.now());
        for (name, version) in versions {
            self.note_version(&name, Some(version));
        }
        Ok(true)
    }

    async fn delete_session_attempt(
        &self,
        mut tx: K::Tx,
        started: Instant,
        key: SessionKey,
        expected: Revision,
    ) -> Result<Step<Option<Vec<(SemaphoreName, u64)>>, K::Tx>, StoreError> {
        let session_key = self.session_key(key);
        let bytes = read_or_retry!(self.get_in(&mut tx, &session_key));
        let state = self.observe(
            Target::Session(key),
            bytes.as_deref(),
            None,
            false,
            started,
            self.time.now(),
        );
        if !matches!(state, State::Live { revision, .. } if revision == expected.0) {
            return Ok(Step::Read(None));
        }
        let parties_key = self.parties_key(key);
        let listed = read_or_retry!(self.get_in(&mut tx, &parties_key));
        // A list that cannot be read names nothing: those parties end lazily, with the session.
        let names = decode_names(listed.as_deref().unwrap_or_default()).unwrap_or_default();
        let mut versions = Vec::new();
        for name in names {
            let semaphore_key = self.semaphore_key(&name);
            let bytes = read_or_retry!(self.get_in(&mut tx, &semaphore_key));
            // A state that cannot be read is left as it is.
            let Ok(Stored {
                version: Some(version),
                state: Some(state),
                ..
            }) = decode(bytes.as_deref())
            else {
                continue;
            };
            let write = Write::ending_session(state, key);
            if write == Write::Keep {
                continue;
            }
            let Some(version) = version.checked_add(1) else {
                continue;
            };
            if let Some(bytes) = encode(version, &write) {
                tx.set(&semaphore_key, &bytes);
                versions.push((name, version));
            }
        }
        tx.clear(&parties_key);
        tx.clear(&session_key);
        if self.kv.has_marks() {
            tx.clear(&self.mark_key(key));
        }
        Ok(Step::Commit(Some(versions), tx))
    }

    /// One round of a semaphore's feed: `Ok(true)` when the version differs from `baseline`
    /// (set from this round's read when unknown), else after its watch fired.
    async fn semaphore_round(
        &self,
        key: &[u8],
        baseline: &mut Option<Option<u64>>,
    ) -> Result<(), StoreError> {
        let mut tx = self.kv.begin().map_err(|error| failed(&error))?;
        let timeout = self.options.timeout;
        let deadline = tokio::time::Instant::now() + timeout;
        let read = tokio::time::timeout_at(deadline, tx.get(key))
            .await
            .map_err(|_| {
                StoreError::failed(CallTimedOut {
                    call: "reading",
                    slot: 0,
                    timeout,
                })
            })?
            .map_err(|error| failed(&error))?;
        let version = match read.as_deref() {
            None => Some(0),
            Some(bytes) => version_of(bytes),
        };
        match baseline {
            Some(seen) if *seen != version => return Ok(()),
            Some(_) => {}
            None => *baseline = Some(version),
        }
        let marks = self.party_marks(&mut tx, read.as_deref(), deadline).await?;
        let watch = tx.watch(key);
        tokio::time::timeout_at(deadline, tx.commit())
            .await
            .map_err(|_| {
                StoreError::unknown(CallTimedOut {
                    call: "committing the watch",
                    slot: 0,
                    timeout,
                })
            })?
            .map_err(|error| failed(&error))?;
        let mut watch = std::pin::pin!(watch);
        let mut marks = marks;
        std::future::poll_fn(|cx| {
            // A party's mark freed: the waiter looks again, and that look (any transaction of
            // the semaphore) ends the party's session.
            for mark in &mut marks {
                if mark.as_mut().poll(cx).is_ready() {
                    return std::task::Poll::Ready(Ok(()));
                }
            }
            watch.as_mut().poll(cx).map_err(|error| failed(&error))
        })
        .await
    }

    /// The liveness marks of the first [`MARKS_WAITED_MAX`] parties of the semaphore `bytes`
    /// (owners first, then waiters in their order), read in `tx`: what a waiter waits on beside
    /// the key's watch (`Tx.Marks`). None when the store keeps no marks or the state cannot be
    /// read; the parties beyond the bound are left to their TTL.
    async fn party_marks(
        &self,
        tx: &mut K::Tx,
        bytes: Option<&[u8]>,
        deadline: tokio::time::Instant,
    ) -> Result<Vec<super::MarkFuture>, StoreError> {
        let mut marks = Vec::new();
        if !self.kv.has_marks() {
            return Ok(marks);
        }
        let Ok(Stored {
            state: Some(semaphore),
            ..
        }) = decode(bytes)
        else {
            return Ok(marks);
        };
        let parties = semaphore
            .owners()
            .iter()
            .map(|owner| owner.session)
            .chain(semaphore.waiters().iter().map(|waiter| waiter.session))
            .take(MARKS_WAITED_MAX);
        for party in parties {
            let epoch = read_in(
                tx,
                &self.mark_key(party),
                deadline,
                vvm_core::Slot(0),
                self.options.timeout,
            )
            .await?
            .map_err(|error| failed(&error))?;
            if let Some(epoch) = epoch {
                marks.push(self.kv.mark_freed(&self.session_key(party), &epoch));
            }
        }
        Ok(marks)
    }
}

impl<K: TxKv> SemaphoreStore for TxLeaseStore<K> {
    async fn semaphore(
        &self,
        session: SessionKey,
        name: &SemaphoreName,
        request: SemaphoreRequest,
    ) -> Result<Applied, SemaphoreStoreError> {
        let answer = self
            .retrying(name.as_str(), |tx, started| {
                self.semaphore_attempt(tx, started, session, name, request.clone())
            })
            .await?;
        let (applied, version) = answer?;
        if let Some(version) = version {
            self.note_version(name, Some(version));
        }
        Ok(applied)
    }

    /// Snapshot range reads over the semaphore keys in one read-only transaction (retried as
    /// every operation is): each asks for as many keys as names are still wanted and goes on
    /// after the last key read; a deleted semaphore's counters are not a name.
    async fn semaphore_names(&self, page: &NamesPage) -> Result<SemaphoreNames, StoreError> {
        let mut part = self.options.prefix.clone();
        part.extend_from_slice(SEMAPHORE_PART);
        // The end of the semaphore keys: the part with its last byte ('/') raised.
        let mut end = part.clone();
        if let Some(last) = end.last_mut() {
            *last += 1;
        }
        let first = match page.after() {
            // The key right after the name's.
            Some(after) => {
                let mut key = self.semaphore_key(after);
                key.push(0);
                key
            }
            None => part.clone(),
        };
        let wanted = page.limit().saturating_add(1);
        let timeout = self.options.timeout;
        let (part, end) = (&part, &end);
        self.retrying("semaphore names", |mut tx, _| {
            let mut start = first.clone();
            async move {
                let mut names = Vec::new();
                while names.len() < wanted {
                    let asked = wanted - names.len();
                    let far = tokio::time::Instant::now() + timeout;
                    let read = tokio::time::timeout_at(far, tx.range(&start, end, asked)).await;
                    let pairs = match read {
                        Err(_) => {
                            return Err(StoreError::failed(CallTimedOut {
                                call: "reading",
                                slot: 0,
                                timeout,
                            }))
                        }
                        Ok(Err(error @ TxError::Retryable { .. })) => {
                            return Ok(Step::Retry(error))
                        }
                        Ok(Err(error)) => return Err(failed(&error)),
                        Ok(Ok(pairs)) => pairs,
                    };
                    for (key, value) in &pairs {
                        let Some(name) = key.strip_prefix(part.as_slice()) else {
                            continue;
                        };
                        if !value.starts_with(&[VERSION, DELETED]) {
                            names.push(UnreadableName::check(name).map_err(StoreError::failed)?);
                        }
                    }
                    match pairs.last() {
                        Some((key, _)) if pairs.len() == asked => {
                            start = key.clone();
                            start.push(0);
                        }
                        _ => break,
                    }
                }
                Ok(Step::Read(page.take(names)))
            }
        })
        .await
    }

    /// A watch of the semaphore's key; see the module documentation (change feed).
    fn semaphore_changed(&self, name: &SemaphoreName) -> SemaphoreChange {
        // Taken at the call: a write after it differs from this.
        let mut baseline = self.seen().get(name).copied();
        let store = self.clone();
        let name = name.clone();
        Box::pin(async move {
            let began = tokio::time::Instant::now();
            if baseline.is_none() {
                baseline = store.seen().get(&name).copied();
            }
            let key = store.semaphore_key(&name);
            if let Err(error) = store.semaphore_round(&key, &mut baseline).await {
                tracing::debug!(semaphore = %name, error = %vvm_runtime::ErrorChain(&error), "transactional semaphore feed: cannot tell");
                tokio::time::sleep_until(began + FEED_UNKNOWN_PAUSE).await;
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::txkv::lease::TxOptionsError;
    use crate::txkv::{MemoryKv, TxOptions};
    use vvm_core::{Incarnation, SessionId, Slot};
    use vvm_runtime::{LeaseValue, SessionStore};

    /// Semaphore and parties keys start with the prefix and a NUL byte, never a slot's or a
    /// session's; a prefix that holds a NUL byte is refused.
    // covers: Tx.Semaphores
    #[test]
    fn semaphore_keys_are_a_key_space_of_their_own() {
        assert_eq!(
            TxOptions::default().prefix("a\0b/"),
            Err(TxOptionsError::PrefixHasNul)
        );
        let options = TxOptions::default().prefix("p/").expect("a valid prefix");
        let store = TxLeaseStore::new(MemoryKv::new(), options);
        let session = SessionKey {
            incarnation: Incarnation(1),
            id: SessionId(1),
        };
        let semaphore = store.semaphore_key(&name("1"));
        let parties = store.parties_key(session);
        assert_eq!(semaphore, b"p/\0semaphore/1");
        assert_eq!(parties, b"p/\0parties/0000000000000001-1");
        for other in [store.key(Slot(1)), store.session_key(session)] {
            assert_ne!(semaphore, other);
            assert_ne!(parties, other);
            assert_ne!(other.get(2), Some(&0));
        }
    }

    /// A session is a party of at most `SEMAPHORES_PER_SESSION_MAX` semaphores: one more is a
    /// typed failure that writes nothing.
    // covers: Tx.Semaphores
    #[tokio::test(start_paused = true)]
    async fn a_session_joins_a_bounded_number_of_semaphores() {
        let store = TxLeaseStore::new(MemoryKv::new(), TxOptions::default());
        let session = SessionKey {
            incarnation: Incarnation(1),
            id: SessionId(1),
        };
        let value = LeaseValue::new("10.0.0.1:7000", Incarnation(1));
        store
            .create_session(session, &value, Duration::from_secs(3600))
            .await
            .expect("runs")
            .expect("created");
        let acquire = SemaphoreRequest::Acquire {
            request: vvm_core::semaphore::RequestId(1),
            count: 1,
            data: Vec::new(),
            timeout_ms: 0,
            ephemeral: true,
        };
        for n in 0..SEMAPHORES_PER_SESSION_MAX {
            store
                .semaphore(session, &name(&format!("s{n}")), acquire.clone())
                .await
                .expect("granted");
        }
        let over = store
            .semaphore(session, &name("one-more"), acquire)
            .await
            .expect_err("refused");
        let chain = vvm_runtime::ErrorChain(&over).to_string();
        assert!(chain.contains("is a party of 250 semaphores"), "{chain}");
        assert_eq!(
            store.kv().value(&store.semaphore_key(&name("one-more"))),
            None
        );
    }

    fn name(text: &str) -> SemaphoreName {
        SemaphoreName::new(text).expect("valid")
    }

    /// The session record of an owner of units cleared from outside (`fdbcli` `clear`): its
    /// units stay counted for a TTL from the first sight, then it goes as expired and the
    /// waiter behind it is granted; a waiter's record cleared goes at once.
    // covers: Tx.SemaphoreUnreleased, Sem.Store.Unreleased
    #[tokio::test(start_paused = true)]
    async fn an_owner_cleared_from_outside_is_waited_out_for_a_ttl() {
        let store = TxLeaseStore::new(MemoryKv::new(), TxOptions::default());
        let key = |n| SessionKey {
            incarnation: Incarnation(n),
            id: SessionId(1),
        };
        let ttl = Duration::from_secs(4);
        for n in 1..=3 {
            let value = LeaseValue::new(format!("10.0.0.{n}:7000"), Incarnation(n));
            // The waiter's own TTL is long: the owner is waited out for its own, as noted.
            let own = if n == 2 {
                Duration::from_secs(3600)
            } else {
                ttl
            };
            store
                .create_session(key(n), &value, own)
                .await
                .expect("runs")
                .expect("created");
        }
        let lock = name("lock");
        let create = SemaphoreRequest::Create {
            limit: 1,
            data: Vec::new(),
        };
        store
            .semaphore(key(2), &lock, create)
            .await
            .expect("created");
        let acquire = |request| SemaphoreRequest::Acquire {
            request: vvm_core::semaphore::RequestId(request),
            count: 1,
            data: Vec::new(),
            timeout_ms: 60_000,
            ephemeral: false,
        };
        for n in 1..=3 {
            store
                .semaphore(key(n), &lock, acquire(n))
                .await
                .expect("granted or queued");
        }
        let clear = |n| {
            let key = store.session_key(key(n));
            let kv = std::sync::Arc::clone(&store.kv);
            async move {
                let mut tx = kv.begin().expect("a transaction");
                tx.clear(&key);
                tx.commit().await.expect("cleared");
            }
        };
        clear(1).await;
        clear(3).await;
        let described = |n| store.semaphore(key(n), &lock, SemaphoreRequest::Describe);
        let first = described(2).await.expect("runs");
        assert_eq!(first.expired, [key(3)], "the waiter went at once");
        let owners: Vec<SessionKey> = first
            .description
            .as_ref()
            .expect("exists")
            .owners
            .iter()
            .map(|o| o.session)
            .collect();
        assert_eq!(owners, [key(1)], "the owner is still counted");
        assert_eq!(first.parties_expire_in, Some(ttl));
        tokio::time::advance(ttl - Duration::from_millis(1)).await;
        let still = described(2).await.expect("runs");
        assert!(still.expired.is_empty(), "{still:?}");
        tokio::time::advance(Duration::from_millis(1)).await;
        let after = described(2).await.expect("runs");
        assert_eq!(after.expired, [key(1)]);
        let owners: Vec<SessionKey> = after
            .description
            .expect("exists")
            .owners
            .iter()
            .map(|o| o.session)
            .collect();
        assert_eq!(owners, [key(2)], "the waiter was granted");
    }

    #[test]
    fn envelopes_and_name_lists_round_trip() {
        let semaphore = Semaphore::create(None, "lock", 3, b"d".to_vec()).expect("created");
        let bytes = encode(7, &Write::Put(semaphore.clone())).expect("a write");
        let stored = decode(Some(&bytes)).expect("decodes");
        assert_eq!((stored.version, stored.state), (Some(7), Some(semaphore)));
        let deleted = Write::Delete {
            generation: Generation(4),
            next_order_id: OrderId(9),
        };
        let bytes = encode(8, &deleted).expect("a write");
        let stored = decode(Some(&bytes)).expect("decodes");
        assert_eq!(
            (stored.version, stored.counters),
            (Some(8), Some((Generation(4), OrderId(9))))
        );
        assert!(decode(Some(b"nope")).is_err());
        assert!(decode(Some(&bytes[..12])).is_err());
        let names: BTreeSet<_> = [name("a"), name("b/c")].into_iter().collect();
        assert_eq!(decode_names(&encode_names(&names)), Some(names));
        assert_eq!(decode_names(&[5, b'a']), None);
    }
}
