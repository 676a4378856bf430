//! Semaphores of the SQLite store ([`SemaphoreStore`]): one row of `vvm_semaphores` per name,
//! holding the encoded state ([`Semaphore::encode`]).
//!
//! | operation | one `BEGIN IMMEDIATE` transaction |
//! |---|---|
//! | `semaphore` | judge the caller's session row; read and decode the semaphore's row; judge the session row of every party, removing those of dead sessions; run the core operation ([`transact`]); write the row back with a new `version` from the store's counter when anything changed (a delete keeps the row with `state` `NULL` and the counters) |
//! | `delete_session` (`session.rs`) | besides the session's row and holdings: every semaphore the index names for the session, that party removed as by its expiry |
//!
//! **Dead owners**: a semaphore transaction first judges the sessions whose lock the store's feed
//! saw free (`session.rs`, `feed.rs`): each whose process is gone is ended with all its
//! holdings and parties in that transaction. A queued acquire's change future
//! ([`SemaphoreStore::semaphore_changed`]) watches the locks of the sessions owning units besides
//! the file's version, so a SIGKILLed owner's units pass on at once, not at its session's expiry.
//!
//! **Owners removed from outside** (`Sq.SemaphoreUnreleased`): every store path that ends a
//! session (its delete, a dead process, a sweep of expired rows, `session.rs`) removes its
//! parties in the same transaction, so an owner of units whose session row is *absent* had it
//! deleted by hand (`DELETE FROM vvm_sessions`, "unsticking" a lock). It did not release its
//! units and may act until its session would have run out, so they count as used (its place in
//! the queue kept) until the caller's session TTL after this handle first saw the row gone
//! (`crate::unreleased`, the rule `vvm_core::semaphore::unreleased_party_left`): the answer's
//! [`Applied::parties_expire_in`] brings a waiter back then. An expired row is judged dead at
//! once, as before, and a waiter so removed, holding no units, goes at once.
//!
//! **The parties' index** (`vvm_semaphore_parties`, schema version 6): one row per session and
//! semaphore it is a party of, written with the semaphore's row in the same transaction (the
//! parties that left deleted, those that joined inserted), so it always names exactly the
//! parties of the stored states.
//!
//! Sessions are judged exactly as holdings are: by their row's boot id and expiry on the
//! store's clock, read under the write lock. The queue's order is the core's order ids,
//! assigned inside the transaction, so it is the order in which the transactions committed.
//!
//! **Costs.** An operation reads one semaphore row and one session row per party (by primary
//! key), and writes one row and the index rows of the parties that joined or left: O(parties)
//! statements, each O(log n). Ending a session eagerly reads the index by the session's key and
//! the rows of its own semaphores only: O(its semaphores · parties), whatever the number of
//! semaphores in the file; the expiry of a session writes nothing, and its parties are removed by the next
//! transaction on each semaphore, which a waiter makes at that expiry
//! ([`Applied::parties_expire_in`]).
//!
//! **Change feed**, across processes: the store's one feed (`feed.rs`), shared with the slots'
//! waiters, is woken by the kernel's file notifications; after a commit to the file it reads the
//! `version` of every watched name (one integer by primary key each) in one read transaction,
//! and wakes a wait when it differs from the one read when the wait began.

use std::collections::HashSet;
use std::time::Duration;

use rusqlite::types::ValueRef;
use rusqlite::{OptionalExtension, Transaction, TransactionBehavior};
use vvm_core::semaphore::{Semaphore, SemaphoreName, SessionKey};
use vvm_runtime::semaphore_store::{transact, undecodable};
use vvm_runtime::{
    Applied, SemaphoreChange, SemaphoreRequest, SemaphoreStore, SemaphoreStoreError,
};
use vvm_runtime::{NamesPage, SemaphoreNames, StoreError, UnreadableName};

use super::parties::{load, parties, store};
use super::record::{self, Now, TxError};
use super::session::{end_if_dead, SessionTtls};
use super::{transact as in_transaction, SqliteStore, Step};
use crate::unreleased::Unreleased;

/// A session judged by its row.
enum Judged {
    /// Live, with this much time left (`Duration::MAX`: a row whose liveness cannot be told,
    /// which counts as live for ever: its parties are never removed on a guess).
    Live(Duration),
    /// Expired, or of another boot.
    Over,
    /// No row: the session was ended by a store (which removes its parties in the same
    /// transaction) or its row was deleted from outside.
    Absent,
}

/// The session `key` judged by its row.
fn judge(tx: &Transaction<'_>, key: SessionKey, now: Now<'_>) -> Result<Judged, TxError> {
    let judged = tx
        .prepare_cached(
            "SELECT boot_id, expires_ns FROM vvm_sessions WHERE incarnation = ?1 AND id = ?2",
        )?
        .query_row(record::session_columns(key), |row| {
            Ok(match (row.get_ref(0)?, row.get_ref(1)?) {
                (ValueRef::Text(boot), ValueRef::Integer(expires_ns)) => {
                    if boot != now.boot_id.as_bytes() || expires_ns <= now.ns {
                        Judged::Over
                    } else {
                        Judged::Live(Duration::from_nanos(expires_ns.abs_diff(now.ns)))
                    }
                }
                _ => Judged::Live(Duration::MAX),
            })
        })
        .optional()?;
    Ok(judged.unwrap_or(Judged::Absent))
}

/// The time the session `key` (an owner of units when `owner`) has left as a party of a
/// semaphore operated on by `caller`, `None` when it is over. An owner other than the caller
/// whose row is absent was removed from outside without a release (every store path that ends
/// a session removes its parties with its row, `session.rs`): it counts as a party for a
/// session TTL after this handle first saw it so (`unreleased`), the TTL being the caller's
/// own (the owner's is gone with its row). A waiter so removed holds no units: it goes at once.
fn session_left(
    tx: &Transaction<'_>,
    (unreleased, ttls): (&Unreleased, &SessionTtls),
    caller: SessionKey,
    key: SessionKey,
    owner: bool,
    now: Now<'_>,
) -> Result<Option<Duration>, TxError> {
    Ok(match judge(tx, key, now)? {
        Judged::Live(left) => {
            if key != caller {
                unreleased.live(key);
            }
            Some(left)
        }
        Judged::Over => None,
        Judged::Absent if key == caller || !owner => None,
        Judged::Absent => {
            // A caller whose TTL this handle does not know (it did not make the session):
            // its own time left, the one lease length known here.
            let ttl = match ttls.of(caller) {
                Some(ttl) => ttl,
                None => match judge(tx, caller, now)? {
                    Judged::Live(left) => left,
                    Judged::Over | Judged::Absent => Duration::ZERO,
                },
            };
            // On the store's clock, as its expiries.
            let at = vvm_core::Instant::from_nanos(u64::try_from(now.ns).unwrap_or(0));
            unreleased.left(key, ttl, at)
        }
    })
}

/// The body of a semaphore's transaction: the row read and decoded, the parties' sessions
/// judged, the core operation run, and what it decided written.
fn decide(
    tx: &Transaction<'_>,
    unreleased: (&Unreleased, &SessionTtls),
    now: Now<'_>,
    session: SessionKey,
    name: &SemaphoreName,
    request: &SemaphoreRequest,
) -> Result<Step<Result<Applied, SemaphoreStoreError>>, TxError> {
    let row = load(tx, name)?;
    let counters = row.as_ref().map(|row| row.counters);
    let floor = row
        .as_ref()
        .map_or(0, |row| row.version.max(row.counters.0 .0));
    let stored = match row.and_then(|row| row.state) {
        None => None,
        Some(bytes) => match Semaphore::decode(&bytes) {
            Ok(state) => Some(state),
            Err(source) => {
                return match undecodable(name, source, bytes.len(), floor, request) {
                    Ok((write, applied)) => {
                        // Its parties are unknown: the index forgets them all.
                        tx.prepare_cached("DELETE FROM vvm_semaphore_parties WHERE name = ?1")?
                            .execute([name.as_str()])?;
                        let wrote = store(tx, name, &HashSet::new(), &write)?;
                        Ok(Step {
                            result: Ok(applied),
                            wrote,
                        })
                    }
                    Err(refused) => Ok(Step::read(Err(refused))),
                };
            }
        },
    };
    let before = parties(stored.as_ref());
    let owners: HashSet<SessionKey> = stored.as_ref().map_or_else(HashSet::new, |state| {
        state.owners().iter().map(|owner| owner.session).collect()
    });
    let decided = transact(stored, counters, session, name, request.clone(), |key| {
        session_left(tx, unreleased, session, key, owners.contains(&key), now)
    })?;
    match decided {
        Ok((write, applied)) => {
            let wrote = store(tx, name, &before, &write)?;
            Ok(Step {
                result: Ok(applied),
                wrote,
            })
        }
        Err(refused) => Ok(Step::read(Err(refused))),
    }
}

impl SemaphoreStore for SqliteStore {
    async fn semaphore(
        &self,
        session: SessionKey,
        name: &SemaphoreName,
        request: SemaphoreRequest,
    ) -> Result<Applied, SemaphoreStoreError> {
        self.writable()?;
        let name = name.clone();
        // Sessions whose lock the feed saw free (their process is gone): judged first, each
        // ended with all its holdings and parties (`session.rs`), before the semaphore is read.
        let suspects = self.shared.feed.suspects();
        let judging = suspects.clone();
        let result = self
            .blocking(move |conn, shared| {
                in_transaction(conn, shared, TransactionBehavior::Immediate, |tx, now| {
                    for suspect in &judging {
                        if *suspect != session {
                            end_if_dead(tx, shared, *suspect)?;
                        }
                    }
                    let unreleased = (&shared.unreleased, &shared.session_ttls);
                    decide(tx, unreleased, now, session, &name, &request)
                })
            })
            .await;
        if result.is_ok() {
            self.shared.feed.judged(&suspects);
        }
        result?
    }

    /// One read transaction: the names of the rows with a state, by the table's primary key,
    /// after the page's name, `limit + 1` of them (to tell whether more follow).
    async fn semaphore_names(&self, page: &NamesPage) -> Result<SemaphoreNames, StoreError> {
        let page = page.clone();
        self.transact(TransactionBehavior::Deferred, move |tx, _| {
            let after = page.after().map(SemaphoreName::as_str);
            let limit = i64::try_from(page.limit().saturating_add(1)).unwrap_or(i64::MAX);
            let mut statement = tx.prepare_cached(
                "SELECT CAST(name AS BLOB) FROM vvm_semaphores \
                 WHERE state IS NOT NULL AND (?1 IS NULL OR name > ?1) \
                 ORDER BY name LIMIT ?2",
            )?;
            let rows = statement.query_map((after, limit), |row| row.get::<_, Vec<u8>>(0))?;
            let mut names = Vec::new();
            for row in rows {
                match UnreadableName::check(&row?) {
                    Ok(name) => names.push(name),
                    Err(error) => return Err(TxError::Store(StoreError::failed(error))),
                }
            }
            Ok(Step::read(page.take(names)))
        })
        .await
    }

    /// Subscribes to the store's one change feed (`feed.rs`), which reads the row's `version`
    /// after each commit to the file and wakes this wait when it changed.
    fn semaphore_changed(&self, name: &SemaphoreName) -> SemaphoreChange {
        // Subscribed at the call, not at the first poll: a change right after it is not missed.
        let changed = self.shared.feed.name_changed(name);
        // The sessions owning units, each watched by its lock (`feed.rs`): the kernel tells a
        // death, which writes nothing to the file.
        let owners = self.shared.feed.owner_locks(name);
        let deaths = std::sync::Arc::clone(&self.shared.feed).watch_sessions(
            &self.shared.path,
            &owners,
            self.shared.sharing,
        );
        Box::pin(async move {
            use std::future::Future;
            let mut changed = std::pin::pin!(changed);
            let mut deaths = std::pin::pin!(deaths);
            std::future::poll_fn(|cx| {
                match changed.as_mut().poll(cx).is_ready() || deaths.as_mut().poll(cx).is_ready() {
                    true => std::task::Poll::Ready(()),
                    false => std::task::Poll::Pending,
                }
            })
            .await;
        })
    }
}
