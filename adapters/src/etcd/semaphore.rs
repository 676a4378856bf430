//! Semaphores on etcd ([`SemaphoreStore`]): one key per semaphore holding its encoded state,
//! and one key per party bound to its session's lease.
//!
//! # Keys
//!
//! With `n` the semaphore's name and `s` a session key as [`SessionKey`] displays it:
//!
//! ```text
//! <prefix> NUL "semaphore/" n            0x01 'S' <Semaphore::encode>                       no lease
//!                                        0x01 'D' <generation: u64 BE> <next order id: u64 BE>
//! <prefix> NUL "semaphore/" n NUL s      empty                                              the session's lease
//! <prefix> NUL "semaphore/" n NUL s NUL  the session's TTL in ms, in decimal (its mark)      no lease
//! ```
//!
//! The prefix holds no NUL byte ([`EtcdOptions::prefix`](super::EtcdOptions::prefix)) and a
//! name no control character, so these keys are never a slot or session key of any accepted
//! prefix, and the keys of one semaphore are exactly the range `[<state key>, <state key>
//! 0x01)`. They sort before every slot key of the prefix, outside every slot feed's range.
//!
//! # Mapping: the state in one key, the parties bound to their leases
//!
//! | operation | etcd requests |
//! |---|---|
//! | `semaphore` | one read transaction: the state key, the party keys and marks of the semaphore, the caller's session record; then [`transact`]; then, when it writes, `if mod_revision(state) == read && lease(caller's record) == L then put(state), put(caller's party key, L) and its mark when it joined, delete(caller's party key and mark) when it left, delete(the mark of each party removed as expired), delete(every party key and mark) when the semaphore is deleted`; a false comparison runs it all again |
//! | `delete_session` (`session` module) | the record's lease, and the keys bound to it (`LeaseTimeToLive` with keys): its party keys name its semaphores; one read of their states; `if mod_revision(record) == expected && mod_revision(each state) == read then delete(record), put(each state without the session's party), delete(its party keys)`; then the lease is revoked |
//!
//! **Why one key for the state, not etcd's recipe shape** (a key per waiter, queued by its
//! `create_revision`, as `etcdctl lock` and the v3 `concurrency` package do): the rules are the
//! core's pure function of the whole state — replace in place keeps an order id and a token, the
//! grant pass walks the queue from its head, tokens and order ids continue across deletion, a
//! forced delete ends everyone — and [`transact`] runs it on one decoded state, as on every other
//! store. Spread over keys, every operation would still have to read every party key and
//! rewrite several of them in one transaction, and the state would have no single revision to
//! compare. With one key, the transactions on a semaphore are serialized by the comparison of
//! its `mod_revision`, so the core's order ids are the order in which they committed.
//!
//! **Queue order is creation revision order all the same.** A party's key is created in the
//! transaction that makes it a party — the one in which the core gives it its order id — and
//! is not touched again while it stays one (a replacement in place keeps it). Those transactions
//! are serialized on the state key, so the parties' order ids increase exactly as their keys'
//! `create_revision`s do: the queue is the order of creation revisions, as in etcd's recipes.
//!
//! **Liveness is etcd's.** A party key is bound to its session's lease, so etcd deletes it when
//! the session ends (expiry, or the revocation of a deleted session): a party is live exactly
//! while its key exists, read in the same snapshot as the state. A waiter whose key is gone is
//! removed as by its expiry ([`transact`]'s lazy step); an owner a TTL later (below). The
//! deletion of its key is an event in the semaphore's key range, so it wakes every waiter and
//! watch of the semaphore (see the change feed) at once. The time a party has left ([`Applied::parties_expire_in`]) is its
//! session's TTL when this store knows it (an upper bound: etcd reports no more), else none.
//! The caller is live when its session record is, and the write compares the record's lease,
//! so a session that ended between the read and the write makes the write false (and the next
//! attempt answers `SessionGone`); a party key is never bound to an ended lease.
//!
//! **Owners gone without a release** (`Et.SemaphoreUnreleased`): etcd deletes a party key alike
//! for an expiry, a revocation of its lease (`etcdctl lease revoke`) and a `del`; a session kept
//! alive by `LeaseKeepAlive` writes nothing, so nothing tells them apart. An owner of units whose
//! key is gone while the state still lists it did not release them (a release removes it from the
//! state in the same transaction) and may act until its session would have run out: it stays
//! counted, in its place, until its TTL after this store handle first saw the key gone
//! (`crate::unreleased`, the rule `vvm_core::semaphore::unreleased_party_left`); the answer's
//! [`Applied::parties_expire_in`] brings a waiter back then. The TTL is its mark's, written when
//! it joined (a key without a lease, which outlives it); without one (a party of an earlier
//! version), the caller's own. A waiter so gone holds no units and goes at once. A caller listed
//! in the state whose own key is gone while its session lives (`etcdctl del` of that key) is
//! answered `SessionGone`: its grant ends at once. The price: a dead owner's units pass on a
//! TTL after its expiry was seen, not at it.
//!
//! **Change feed**: one etcd watch over the semaphore's key range; any event wakes it: a write
//! of the state, a party joining or leaving, a party's lease ending. Nothing committed after
//! the call is missed: the call takes the highest revision this store has seen (as the slots'
//! feed does), and the gap between it and the watch's start is checked by reading the range at
//! both revisions. The watch itself starts at the current revision: one started in the past is
//! caught up by etcd only every 100 ms, which would delay every hand-off by up to that.
//!
//! **Resending.** The read transaction is sent again after a broken connection (it is a read).
//! The write is sent again only when refused: a second send of one that applied would find
//! its comparison false, and the operation would be run again on its own result (a create would
//! answer "already exists"); so a write whose connection broke is [`StoreError::Unknown`].
//!
//! **Costs.** One read transaction (the state, up to [`PARTIES_MAX`](vvm_core::semaphore::PARTIES_MAX)
//! party keys and as many marks, one record) and at most one write transaction of at most four
//! operations and one per party removed as expired. When this store does not know the caller's
//! TTL (a session it did not make) and the caller joins or the semaphore has owners, one
//! `LeaseTimeToLive` asks etcd for it.

use std::collections::HashSet;
use std::time::Duration;

use etcd_client::{
    Compare, CompareOp, DeleteOptions, GetOptions, LeaseTimeToLiveOptions, PutOptions, Txn, TxnOp,
    TxnOpResponse,
};
use vvm_core::semaphore::{DecodeError, Generation, OrderId, Semaphore, SemaphoreName, SessionKey};
use vvm_runtime::semaphore_store::{transact, undecodable, Write};
use vvm_runtime::{
    Applied, ErrorChain, SemaphoreChange, SemaphoreRequest, SemaphoreStore, SemaphoreStoreError,
    StoreError,
};
use vvm_runtime::{NamesPage, SemaphoreNames, UnreadableName};

use super::{read_failed, EtcdClientError, EtcdStore, Resend};

/// Most transactions one semaphore operation runs while others' writes make its comparison
/// false; then it fails with [`EtcdSemaphoreError::Conflicted`].
pub const SEMAPHORE_ATTEMPTS_MAX: u32 = 32;

/// Why a semaphore operation on etcd failed although its requests ran: the cause inside its
/// [`StoreError`].
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum EtcdSemaphoreError {
    /// Every attempt's write found the semaphore changed since its read.
    #[error("semaphore {name} changed under {attempts} attempts")]
    Conflicted {
        /// The semaphore.
        name: String,
        /// How many attempts were made.
        attempts: u32,
    },
    /// A transaction's answer lacks one of the operations it sent.
    #[error("an etcd transaction answered without the result of {what}")]
    Incomplete {
        /// What is missing.
        what: &'static str,
    },
}

const VERSION: u8 = 1;
const STATE: u8 = b'S';
const DELETED: u8 = b'D';
/// What follows the prefix in a semaphore key.
const SEMAPHORE_PART: &str = "\0semaphore/";

/// The decoded state key: the state, or the counters a deleted semaphore left.
pub(super) type Stored = (Option<Semaphore>, Option<(Generation, OrderId)>);

fn encode(write: &Write) -> Option<Vec<u8>> {
    let mut bytes = vec![VERSION];
    match write {
        Write::Keep => return None,
        Write::Put(semaphore) => {
            bytes.push(STATE);
            bytes.extend_from_slice(&semaphore.encode());
        }
        Write::Delete {
            generation,
            next_order_id,
        } => {
            bytes.push(DELETED);
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

/// Decodes a state key's value (`EtcdStore::grant_guard` reads it too).
pub(super) fn decode(bytes: Option<&[u8]>) -> Result<Stored, DecodeError> {
    match bytes {
        None => Ok((None, None)),
        Some([VERSION, STATE, state @ ..]) => Ok((Some(Semaphore::decode(state)?), None)),
        Some([VERSION, DELETED, counters @ ..]) => {
            if counters.len() != 16 {
                return Err(DecodeError::Truncated);
            }
            Ok((
                None,
                Some((
                    Generation(be(&counters[..8])?),
                    OrderId(be(&counters[8..])?.max(1)),
                )),
            ))
        }
        Some(_) => Err(DecodeError::Magic),
    }
}

/// The value of a party's mark: its session's TTL in milliseconds, in decimal.
fn mark(ttl: Duration) -> Vec<u8> {
    u64::try_from(ttl.as_millis())
        .unwrap_or(u64::MAX)
        .to_string()
        .into_bytes()
}

/// The TTL a mark's value names (`None`: not a mark this module wrote).
fn read_mark(value: &[u8]) -> Option<Duration> {
    let ms: u64 = std::str::from_utf8(value).ok()?.parse().ok()?;
    Some(Duration::from_millis(ms))
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

/// The `index`th read of a transaction's answer.
fn get_at(
    response: &etcd_client::TxnResponse,
    index: usize,
    what: &'static str,
) -> Result<etcd_client::GetResponse, StoreError> {
    match response.op_responses().into_iter().nth(index) {
        Some(TxnOpResponse::Get(get)) => Ok(get),
        _ => Err(StoreError::failed(EtcdSemaphoreError::Incomplete { what })),
    }
}

/// One read of a semaphore.
struct Snapshot {
    /// The state key's `mod_revision` (0: absent).
    revision: i64,
    bytes: Option<Vec<u8>>,
    /// The party keys that exist.
    party_keys: HashSet<Vec<u8>>,
    /// The parties' marks that exist, by their party key: the TTL each names (`None`:
    /// unreadable).
    marks: std::collections::HashMap<Vec<u8>, Option<Duration>>,
    /// The caller's session lease, when its record exists.
    lease: Option<i64>,
}

impl EtcdStore {
    /// The key of the semaphore `name`: the prefix, a NUL byte, `semaphore/`, the name.
    pub fn semaphore_key(&self, name: &SemaphoreName) -> Vec<u8> {
        format!("{}{SEMAPHORE_PART}{}", self.prefix, name.as_str()).into_bytes()
    }

    /// The key of `session`'s party in the semaphore whose key is `state_key`.
    pub(super) fn party_key(state_key: &[u8], session: SessionKey) -> Vec<u8> {
        let mut key = state_key.to_vec();
        key.push(0);
        key.extend_from_slice(session.to_string().as_bytes());
        key
    }

    /// The mark of the party whose key is `party_key`: that key and a NUL byte (see
    /// `Et.SemaphoreUnreleased` in the module documentation).
    fn mark_key(party_key: &[u8]) -> Vec<u8> {
        let mut key = party_key.to_vec();
        key.push(0);
        key
    }

    /// The start of every semaphore key of this store.
    fn semaphores_part(&self) -> Vec<u8> {
        format!("{}{SEMAPHORE_PART}", self.prefix).into_bytes()
    }

    /// The end of the key range of the semaphore whose key is `state_key`.
    fn range_end(state_key: &[u8]) -> Vec<u8> {
        let mut end = state_key.to_vec();
        end.push(1);
        end
    }

    /// Runs a transaction of reads (sent again after a broken connection).
    async fn read_txn(&self, txn: Txn) -> Result<etcd_client::TxnResponse, StoreError> {
        let response = self
            .resend(Resend::Broken, || {
                let (mut kv, txn) = (self.kv.clone(), txn.clone());
                async move { kv.txn(txn).await }
            })
            .await
            .map_err(read_failed)?;
        self.seen.note(response.header());
        Ok(response)
    }

    async fn snapshot(
        &self,
        state_key: &[u8],
        session: SessionKey,
    ) -> Result<Snapshot, StoreError> {
        let mut parties_start = state_key.to_vec();
        parties_start.push(0);
        let txn = Txn::new().and_then([
            TxnOp::get(state_key.to_vec(), None),
            // Values too: a party key's is empty, a mark's a few digits.
            TxnOp::get(
                parties_start,
                Some(GetOptions::new().with_range(Self::range_end(state_key))),
            ),
            TxnOp::get(
                self.session_key(session),
                Some(GetOptions::new().with_keys_only()),
            ),
        ]);
        let response = self.read_txn(txn).await?;
        let state = get_at(&response, 0, "the read of the state")?;
        let party_keys = get_at(&response, 1, "the read of the parties")?;
        let record = get_at(&response, 2, "the read of the session")?;
        let (revision, bytes) = state.kvs().first().map_or((0, None), |kv| {
            (kv.mod_revision(), Some(kv.value().to_vec()))
        });
        let mut keys = HashSet::new();
        let mut marks = std::collections::HashMap::new();
        for kv in party_keys.kvs() {
            match kv.key().strip_suffix(&[0]) {
                Some(party) => {
                    marks.insert(party.to_vec(), read_mark(kv.value()));
                }
                None => {
                    keys.insert(kv.key().to_vec());
                }
            }
        }
        Ok(Snapshot {
            revision,
            bytes,
            party_keys: keys,
            marks,
            lease: record.kvs().first().map(|kv| kv.lease()),
        })
    }

    /// One attempt: `None` when the write's comparison was false (run it again).
    async fn semaphore_attempt(
        &self,
        session: SessionKey,
        name: &SemaphoreName,
        request: SemaphoreRequest,
    ) -> Result<Option<Result<Applied, SemaphoreStoreError>>, StoreError> {
        self.semaphore_attempt_between(session, name, request, std::future::ready(()))
            .await
    }

    /// [`semaphore_attempt`](Self::semaphore_attempt), running `between` after the read and
    /// before the write: the seam through which a test lets another client act in that gap.
    async fn semaphore_attempt_between(
        &self,
        session: SessionKey,
        name: &SemaphoreName,
        request: SemaphoreRequest,
        between: impl std::future::Future<Output = ()>,
    ) -> Result<Option<Result<Applied, SemaphoreStoreError>>, StoreError> {
        let state_key = self.semaphore_key(name);
        let snapshot = self.snapshot(&state_key, session).await?;
        between.await;
        let decoded = decode(snapshot.bytes.as_deref());
        let owners = match &decoded {
            Ok((Some(state), _)) => state.owners().iter().map(|o| o.session).collect(),
            _ => HashSet::new(),
        };
        let present = |party| {
            snapshot
                .party_keys
                .contains(&Self::party_key(&state_key, party))
        };
        // The caller's own TTL: written in its mark when it joins, and the TTL an owner gone
        // without a release and without a readable mark is waited for.
        let caller_joins = !present(session);
        let own_ttl = match snapshot.lease {
            Some(lease) if caller_joins || !owners.is_empty() => {
                Some(self.own_ttl(session, lease).await)
            }
            _ => None,
        };
        // A caller listed in the state whose party key is gone while its session lives had
        // the key deleted from outside (`etcdctl del`): its party is over for it, as if its
        // session ended (its successors wait as for any owner gone without a release).
        let caller_listed = match &decoded {
            Ok((stored, _)) => parties(stored.as_ref()).contains(&session),
            Err(_) => false,
        };
        let caller_removed = caller_listed && !present(session);
        let now = vvm_runtime::TimeSource::now(&vvm_runtime::Clock);
        let session_left = |party| {
            let left = if party == session {
                snapshot
                    .lease
                    .filter(|_| !caller_removed)
                    .map(|_| Duration::MAX)
            } else if present(party) {
                self.unreleased.live(party);
                Some(self.known_ttl(party).unwrap_or(Duration::MAX))
            } else if owners.contains(&party) {
                // Its key went without a release (`Et.SemaphoreUnreleased`): waited out for
                // the TTL its mark names, else the caller's.
                let mark = snapshot
                    .marks
                    .get(&Self::party_key(&state_key, party))
                    .copied()
                    .flatten();
                let ttl = mark.or(own_ttl).unwrap_or(Duration::MAX);
                self.unreleased.left(party, ttl, now)
            } else {
                None
            };
            Ok::<_, std::convert::Infallible>(left)
        };
        let decided = match decoded {
            Ok((stored, counters)) => {
                let before = parties(stored.as_ref());
                let Ok(decided) = transact(stored, counters, session, name, request, session_left);
                decided.map(|decided| (before, decided))
            }
            // A forced delete removes it with every key under it (its parties' keys too).
            Err(source) => {
                let len_bytes = snapshot.bytes.as_ref().map_or(0, Vec::len);
                let floor = u64::try_from(snapshot.revision).unwrap_or(0);
                undecodable(name, source, len_bytes, floor, &request)
                    .map(|decided| (HashSet::new(), decided))
            }
        };
        let (before, (write, applied)) = match decided {
            Ok(decided) => decided,
            Err(refused) => return Ok(Some(Err(refused))),
        };
        let Some(bytes) = encode(&write) else {
            return Ok(Some(Ok(applied)));
        };
        let Some(lease) = snapshot.lease else {
            // `transact` refuses a caller that is not live before it writes anything.
            return Ok(Some(Err(SemaphoreStoreError::SessionGone(session))));
        };
        let caller_key = Self::party_key(&state_key, session);
        let mut ops = vec![TxnOp::put(state_key.clone(), bytes, None)];
        match &write {
            Write::Put(state) => {
                let now = parties(Some(state)).contains(&session);
                if now && !snapshot.party_keys.contains(&caller_key) {
                    ops.push(TxnOp::put(
                        Self::mark_key(&caller_key),
                        mark(own_ttl.unwrap_or(Duration::MAX)),
                        None,
                    ));
                    ops.push(TxnOp::put(
                        caller_key,
                        Vec::new(),
                        Some(PutOptions::new().with_lease(lease)),
                    ));
                } else if !now && before.contains(&session) {
                    ops.push(TxnOp::delete(Self::mark_key(&caller_key), None));
                    ops.push(TxnOp::delete(caller_key, None));
                }
                // The parties ended as expired: their keys are gone, their marks go now.
                for expired in &applied.expired {
                    let party = Self::party_key(&state_key, *expired);
                    if snapshot.marks.contains_key(&party) {
                        ops.push(TxnOp::delete(Self::mark_key(&party), None));
                    }
                }
            }
            Write::Delete { .. } => {
                let mut start = state_key.clone();
                start.push(0);
                ops.push(TxnOp::delete(
                    start,
                    Some(DeleteOptions::new().with_range(Self::range_end(&state_key))),
                ));
            }
            Write::Keep => {}
        }
        let txn = Txn::new()
            .when([
                Compare::mod_revision(state_key, CompareOp::Equal, snapshot.revision),
                Compare::lease(self.session_key(session), CompareOp::Equal, lease),
            ])
            .and_then(ops);
        let response = self.write(txn, 0, Resend::Unsent).await?;
        Ok(response.succeeded().then_some(Ok(applied)))
    }

    /// The TTL of the caller's own `session`, whose lease is `lease`: as this store made or
    /// kept it alive, else as etcd granted it. `Duration::MAX` when etcd cannot tell (an owner
    /// gone without a release then counts as one until a later judgement can).
    async fn own_ttl(&self, session: SessionKey, lease: i64) -> Duration {
        if let Some(ttl) = self.known_ttl(session) {
            return ttl;
        }
        let answer = self
            .resend(Resend::Broken, || {
                let mut client = self.lease.clone();
                async move { client.time_to_live(lease, None).await }
            })
            .await;
        match answer {
            Ok(answer) if answer.granted_ttl() > 0 => {
                Duration::from_secs(answer.granted_ttl().unsigned_abs())
            }
            _ => Duration::MAX,
        }
    }

    /// The semaphores `session` (whose record is `record`) is a party of, by the keys bound to
    /// its lease; none when they cannot be told (its parties then end with the lease).
    pub(super) async fn parties_of(&self, session: SessionKey, lease: i64) -> Vec<SemaphoreName> {
        let answer = self
            .resend(Resend::Broken, || {
                let mut client = self.lease.clone();
                async move {
                    client
                        .time_to_live(lease, Some(LeaseTimeToLiveOptions::new().with_keys()))
                        .await
                }
            })
            .await;
        let keys = match answer {
            Ok(answer) => answer.keys().to_vec(),
            Err(error) => {
                tracing::debug!(lease, error = %ErrorChain(&EtcdClientError(error)), "the keys of a session's lease are not known; its semaphore parties end with the lease");
                return Vec::new();
            }
        };
        let start = self.semaphores_part();
        let end = format!("\0{session}").into_bytes();
        keys.iter()
            .filter_map(|key| {
                let name = key
                    .strip_prefix(start.as_slice())?
                    .strip_suffix(end.as_slice())?;
                SemaphoreName::new(std::str::from_utf8(name).ok()?).ok()
            })
            .collect()
    }

    /// The transaction that deletes the session record `record_key` at `revision` and removes
    /// the session's parties from `names`, as by its expiry; `None` when a semaphore changed
    /// since its read (build it again). A state that cannot be read is left as it is.
    pub(super) async fn delete_with_parties_txn(
        &self,
        session: SessionKey,
        record_key: Vec<u8>,
        revision: i64,
        names: &[SemaphoreName],
    ) -> Result<Txn, StoreError> {
        let keys: Vec<Vec<u8>> = names.iter().map(|name| self.semaphore_key(name)).collect();
        let reads = Txn::new().and_then(
            keys.iter()
                .map(|key| TxnOp::get(key.clone(), None))
                .collect::<Vec<_>>(),
        );
        let response = self.read_txn(reads).await?;
        let mut compares = vec![Compare::mod_revision(
            record_key.clone(),
            CompareOp::Equal,
            revision,
        )];
        let mut ops = vec![TxnOp::delete(
            record_key.clone(),
            Some(DeleteOptions::new().with_prev_key()),
        )];
        for (index, key) in keys.into_iter().enumerate() {
            let get = get_at(&response, index, "the read of a state")?;
            let Some(kv) = get.kvs().first() else {
                continue;
            };
            let Ok((Some(state), _)) = decode(Some(kv.value())) else {
                continue;
            };
            let write = Write::ending_session(state, session);
            if write == Write::Keep {
                continue;
            }
            let Some(bytes) = encode(&write) else {
                continue;
            };
            compares.push(Compare::mod_revision(
                key.clone(),
                CompareOp::Equal,
                kv.mod_revision(),
            ));
            ops.push(TxnOp::put(key.clone(), bytes, None));
            let party = Self::party_key(&key, session);
            ops.push(TxnOp::delete(Self::mark_key(&party), None));
            ops.push(TxnOp::delete(party, None));
        }
        Ok(Txn::new().when(compares).and_then(ops).or_else([TxnOp::get(
            record_key,
            Some(GetOptions::new().with_keys_only()),
        )]))
    }
}

impl EtcdStore {
    /// One range read of the semaphore keys from `start`, at `revision` (the latest when 0):
    /// up to `limit` keys with their values.
    async fn names_round(
        &self,
        start: Vec<u8>,
        end: &[u8],
        limit: usize,
        revision: i64,
    ) -> Result<etcd_client::GetResponse, StoreError> {
        let options = GetOptions::new()
            .with_range(end.to_vec())
            .with_limit(i64::try_from(limit).unwrap_or(i64::MAX))
            .with_revision(revision);
        let response = self
            .resend(Resend::Broken, || {
                let (mut kv, start, options) = (self.kv.clone(), start.clone(), options.clone());
                async move { kv.get(start, Some(options)).await }
            })
            .await
            .map_err(read_failed)?;
        self.seen.note(response.header());
        Ok(response)
    }
}

impl SemaphoreStore for EtcdStore {
    /// Range reads over the semaphore keys, at the revision of the first: a state key whose
    /// value is not a deleted semaphore's counters is a name. Each read asks for as many keys
    /// as names are still wanted and goes on after the semaphore of the last key it saw, so
    /// the party keys of a semaphore are read at most once per page and a read never repeats
    /// a key: O(names + their parties + deleted names among them) keys, in a few reads.
    async fn semaphore_names(&self, page: &NamesPage) -> Result<SemaphoreNames, StoreError> {
        let part = self.semaphores_part();
        // The end of the semaphore keys: the part with its last byte ('/') raised.
        let mut end = part.clone();
        if let Some(last) = end.last_mut() {
            *last += 1;
        }
        let mut start = match page.after() {
            Some(after) => Self::range_end(&self.semaphore_key(after)),
            None => part.clone(),
        };
        let wanted = page.limit().saturating_add(1);
        let mut names = Vec::new();
        let mut revision = 0;
        while names.len() < wanted {
            let response = self
                .names_round(start.clone(), &end, wanted - names.len(), revision)
                .await?;
            if revision == 0 {
                revision = response.header().map_or(0, |header| header.revision());
            }
            let mut last_state_key = None;
            for kv in response.kvs() {
                let Some(rest) = kv.key().strip_prefix(part.as_slice()) else {
                    continue;
                };
                // A party key is the state key, a NUL byte, a session key.
                let name = rest.split(|byte| *byte == 0).next().unwrap_or(rest);
                last_state_key = Some(&kv.key()[..part.len() + name.len()]);
                if name.len() == rest.len() && !kv.value().starts_with(&[VERSION, DELETED]) {
                    names.push(UnreadableName::check(name).map_err(StoreError::failed)?);
                }
            }
            match last_state_key {
                Some(key) if response.more() => start = Self::range_end(key),
                _ => break,
            }
        }
        Ok(page.take(names))
    }

    async fn semaphore(
        &self,
        session: SessionKey,
        name: &SemaphoreName,
        request: SemaphoreRequest,
    ) -> Result<Applied, SemaphoreStoreError> {
        let mut backoff =
            vvm_runtime::jittered_backoff(Duration::from_millis(2), Duration::from_millis(100));
        for attempt in 0..SEMAPHORE_ATTEMPTS_MAX {
            if attempt > 0 {
                if let Some(pause) = backoff.next() {
                    tokio::time::sleep(pause).await;
                }
            }
            if let Some(answer) = self
                .semaphore_attempt(session, name, request.clone())
                .await?
            {
                return answer;
            }
            tracing::debug!(semaphore = %name, attempt, "semaphore changed between the read and the write; again");
        }
        Err(SemaphoreStoreError::Store(StoreError::failed(
            EtcdSemaphoreError::Conflicted {
                name: name.as_str().to_owned(),
                attempts: SEMAPHORE_ATTEMPTS_MAX,
            },
        )))
    }

    /// The semaphore's keys on the one etcd watch this client shares for the name (see the
    /// `shared_feed` module).
    fn semaphore_changed(&self, name: &SemaphoreName) -> SemaphoreChange {
        let start = self.semaphore_key(name);
        let end = Self::range_end(&start);
        super::shared_feed::range_changed(
            &self.feeds,
            self.watch.clone(),
            self.kv.clone(),
            &self.seen,
            super::shared_feed::Range {
                start,
                end,
                what: name.as_str().to_owned(),
            },
        )
    }
}

/// Whether the answer of a [`EtcdStore::delete_with_parties_txn`] whose comparison was false
/// says the record is still at `revision`: a semaphore changed, build it again.
pub(super) fn record_unchanged(response: &etcd_client::TxnResponse, revision: i64) -> bool {
    response.op_responses().into_iter().any(|op| match op {
        TxnOpResponse::Get(get) => get
            .kvs()
            .first()
            .is_some_and(|kv| kv.mod_revision() == revision),
        _ => false,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The session ends between the read and the write of an operation that writes no key bound
    /// to its lease (a data update): only the write's comparison of the session record's lease
    /// refuses it. The attempt's comparison is false, the next attempt answers `SessionGone`,
    /// and the data is unchanged.
    // covers: Et.Semaphores
    #[cfg(feature = "etcd-cluster")]
    #[tokio::test]
    async fn a_session_ended_between_the_read_and_the_write_writes_nothing() {
        use super::super::cluster::{find_etcd, ClusterOptions, EtcdCluster};
        use vvm_core::{Incarnation, SessionId};
        use vvm_runtime::{LeaseValue, SessionStore};
        if find_etcd().is_none() {
            let ci = std::env::var("CI").is_ok_and(|value| value == "true" || value == "1");
            assert!(!ci, "under CI etcd must be installed");
            return;
        }
        let cluster = EtcdCluster::start(ClusterOptions::new(1).expect("valid options"))
            .await
            .expect("etcd starts");
        let options = cluster.store_options().expect("valid options");
        let store = EtcdStore::connect(options).await.expect("connects");
        let key = |n| SessionKey {
            incarnation: Incarnation(n),
            id: SessionId(1),
        };
        let ttl = Duration::from_secs(60);
        let mut revisions = Vec::new();
        for n in 1..=2 {
            let value = LeaseValue::new(format!("10.0.0.{n}:7000"), Incarnation(n));
            let created = store.create_session(key(n), &value, ttl).await;
            revisions.push(created.expect("runs").expect("created"));
        }
        let name = SemaphoreName::new("config").expect("a name");
        let create = SemaphoreRequest::Create {
            limit: 1,
            data: b"v1".to_vec(),
        };
        store
            .semaphore(key(1), &name, create)
            .await
            .expect("created");
        let update = SemaphoreRequest::UpdateData {
            data: b"v2".to_vec(),
        };
        let end_session = async {
            let deleted = store.delete_session(key(1), revisions[0]).await;
            assert!(deleted.expect("runs"), "the session record was deleted");
        };
        let attempt = store
            .semaphore_attempt_between(key(1), &name, update.clone(), end_session)
            .await
            .expect("runs");
        assert!(
            attempt.is_none(),
            "the write's comparison is false: {attempt:?}"
        );
        let again = store.semaphore(key(1), &name, update).await;
        assert!(
            matches!(again, Err(SemaphoreStoreError::SessionGone(gone)) if gone == key(1)),
            "{again:?}"
        );
        let described = store
            .semaphore(key(2), &name, SemaphoreRequest::Describe)
            .await
            .expect("read")
            .description
            .expect("exists");
        assert_eq!(described.data, b"v1", "nothing was written");
    }

    #[test]
    fn states_and_counters_round_trip() {
        let semaphore = Semaphore::create(None, "lock", 3, b"d".to_vec()).expect("created");
        let bytes = encode(&Write::Put(semaphore.clone())).expect("a write");
        assert_eq!(decode(Some(&bytes)), Ok((Some(semaphore), None)));
        let deleted = Write::Delete {
            generation: Generation(4),
            next_order_id: OrderId(9),
        };
        let bytes = encode(&deleted).expect("a write");
        assert_eq!(
            decode(Some(&bytes)),
            Ok((None, Some((Generation(4), OrderId(9)))))
        );
        assert_eq!(decode(Some(b"nope")), Err(DecodeError::Magic));
        assert_eq!(decode(Some(&bytes[..10])), Err(DecodeError::Truncated));
    }
}
