//! Fencing a write of the user's own SQLite transaction by a holding: the SQLite counterpart of
//! the etcd store's `EtcdGuard`.
//!
//! The user opens their own connection to the store's file (their tables live beside the
//! store's), begins a transaction with [`TransactionBehavior::Immediate`], calls
//! [`SqliteGuard::check`] on it, writes, and commits. The check reads the slot's row in that
//! transaction and judges it as every operation of the store does (`record::load`: a slot
//! record by its own boot id and expiry, a holding by its session's row, on the store's
//! clock): it passes only when the row is live and carries the token's revision.
//!
//! **Why that is sound.** SQLite has one writer at a time per file. `BEGIN IMMEDIATE` takes
//! the write lock before the check reads, and keeps it until the commit, so no other
//! transaction — in particular no other candidate's acquire, which is a write transaction that
//! judges the row — commits between the check and the user's commit. Everything the user's
//! transaction writes is therefore ordered before any other holder's acquisition of the slot:
//! the write lands while the holding is live, or not at all. A transaction that only reads at
//! the check (`BEGIN` deferred, nothing written yet) would not hold the lock, so the check
//! refuses it ([`SqliteGuardError::NotWriteTransaction`]).
//!
//! **A semaphore grant** ([`SqliteStore::grant_guard`]) is checked the same way on the
//! semaphore's row: its stored state must show the grant's session owning with the grant's
//! order id, and that session's row must be live (`session::load`, the judgement of every
//! session operation). The state is the truth of a semaphore on this store; the only change a
//! transaction applies to it without writing is the removal of parties whose sessions are no
//! longer live — which the session's judgement covers.
//!
//! **Why the exact revision.** Revisions come from one counter of the file that never goes
//! back, and every write of a row takes a new one, so a row carries the token's revision only
//! while it is the very record that write made: a new holder, or the same holder again after a
//! loss, writes a new revision. A holding on a session (`Elections`, `SessionHandle::acquire`,
//! `Vvm::provide_on_session`) keeps its revision for its whole tenure (keepalives write the
//! session's row only). A VVM leading by the per-slot lease protocol (`Vvm::provide`) writes a
//! new revision at each renewal, and its services' `ServiceContext::token()` follows it: take
//! the token afresh for each transaction; a renewal committed between reading the token and the
//! check refuses the write, which is then retried with the new token.

use std::sync::Arc;

use rusqlite::{Transaction, TransactionState};
use vvm_core::semaphore::{DecodeError, OrderId, Semaphore, SemaphoreName};
use vvm_core::{FencingToken, Revision, SessionKey};
use vvm_runtime::{SemaphoreGrant, SemaphoreStore, StoreError};

#[cfg(doc)]
use rusqlite::TransactionBehavior;

use super::clock::{ClockError, StoreClock};
use super::lock::{self, FileId};
use super::record::{self, Judged, Now, TxError};
use super::{parties, session, SqliteStore};

/// Why [`SqliteGuard::check`] refused: the holding is not live, or the check could not be made.
/// In every case the user's transaction must not commit its writes (roll it back).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum SqliteGuardError {
    /// The holding is over: the slot's row is absent, expired (by the store's clock, itself or
    /// with its session), or carries another revision — another holder's, or a later tenure's.
    #[error("the holding of slot {slot} at revision {} is over (the slot's record now: {})",
        .revision.0, .found.map_or("none live".to_owned(), |r| format!("revision {}", r.0)))]
    Deposed {
        /// The slot.
        slot: u32,
        /// The token's revision.
        revision: Revision,
        /// The revision of the live record found instead, if any.
        found: Option<Revision>,
    },
    /// The grant is over: the semaphore's state does not show its session owning with its order
    /// id, or that session is not live by the store's clock.
    #[error("the grant of semaphore {name} (order id {order_id}) is over")]
    GrantOver {
        /// The semaphore.
        name: String,
        /// The grant's order id.
        order_id: u64,
    },
    /// The transaction does not hold the write lock: begin it with
    /// `TransactionBehavior::Immediate`.
    #[error("the guarded transaction does not hold the write lock: begin it IMMEDIATE")]
    NotWriteTransaction,
    /// The transaction's connection is not on the store's file.
    #[error("the guarded transaction is on {path:?}, not on the store's file")]
    OtherFile {
        /// The path of the transaction's main database, as SQLite reports it.
        path: String,
    },
    /// Another connection holds a lock the read needed (possible at a first read in WAL mode):
    /// nothing was judged; roll back and try again.
    #[error("the store's file was busy")]
    Busy,
    /// The semaphore's stored state cannot be decoded: whether the grant lasts cannot be told.
    #[error("the state of semaphore {name} cannot be decoded")]
    Undecodable {
        /// The semaphore.
        name: String,
        /// What is wrong with it.
        #[source]
        source: DecodeError,
    },
    /// The store's clock could not be read.
    #[error("the store's clock cannot be read")]
    Clock(#[source] ClockError),
    /// The row could not be read or judged (a statement failed, or the row is corrupt).
    #[error("the slot's record could not be read")]
    Store(#[source] StoreError),
    /// SQLite could not say whether the transaction holds the write lock.
    #[error("the transaction's state could not be read")]
    Sqlite(#[source] rusqlite::Error),
}

impl SqliteGuardError {
    /// Whether the holding is over ([`Deposed`](Self::Deposed),
    /// [`GrantOver`](Self::GrantOver)), as opposed to a check that could not be made.
    pub fn is_deposed(&self) -> bool {
        matches!(
            self,
            SqliteGuardError::Deposed { .. } | SqliteGuardError::GrantOver { .. }
        )
    }
}

/// A check for the user's own SQLite transaction, on the store's file, that lets its writes
/// commit only while one holding is live: obtained from [`SqliteStore::guard`] with a slot's
/// fencing token, or from [`SqliteStore::grant_guard`] with a semaphore grant.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// use std::time::Duration;
/// use vvm_adapters::sqlite::rusqlite::{Connection, TransactionBehavior};
/// use vvm_adapters::SqliteStore;
/// use vvm_core::{FencingToken, Incarnation, Slot};
/// use vvm_runtime::{LeaseStore, LeaseValue};
///
/// let dir = std::env::temp_dir().join(format!("vvm-guard-doc-{}", std::process::id()));
/// std::fs::create_dir_all(&dir)?;
/// let path = dir.join("vvm.sqlite");
/// let store = SqliteStore::open(&path)?;
/// let value = LeaseValue::new("10.0.0.1:7000", Incarnation(1));
/// let revision = store.insert_if_not_exists(Slot(1), &value, Duration::from_secs(20)).await?;
/// let token = FencingToken { slot: Slot(1), revision: revision.expect("the slot was free") };
///
/// let guard = store.guard(token);
/// let mut conn = Connection::open(&path)?;
/// conn.execute("CREATE TABLE IF NOT EXISTS app (k TEXT PRIMARY KEY, v TEXT)", [])?;
/// let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
/// guard.check(&tx)?; // the holding is live: write
/// tx.execute("INSERT OR REPLACE INTO app VALUES ('config', 'written by the leader')", [])?;
/// tx.commit()?;
/// # drop(store);
/// # std::fs::remove_dir_all(&dir)?;
/// # Ok(()) }
/// ```
///
/// The user's commits to the file wake the change feeds of the store's handles (in every
/// process on the file) for one look each — a read of the rows they watch — as any commit does.
///
/// **Publishing as the leader without re-election** (etcd's `Proclaim`): a leader that holds a
/// semaphore grant (`Coordination::acquire`) publishes new data with
/// `SemaphoreGrant::replace(count, data)`, in place, keeping its order id and token; a leader of
/// a slot writes its own data with a guarded transaction like the one above.
#[derive(Clone)]
pub struct SqliteGuard {
    held: Held,
    clock: Arc<dyn StoreClock>,
    /// The store's file, when known: the transaction's must be the same.
    file: Option<FileId>,
}

/// What a guard checks.
#[derive(Clone, Debug)]
enum Held {
    /// A slot's holding: its row in `vvm_leases`.
    Slot(FencingToken),
    /// A semaphore grant: its owner in the semaphore's row of `vvm_semaphores`.
    Grant {
        name: SemaphoreName,
        session: SessionKey,
        order_id: OrderId,
    },
}

impl std::fmt::Debug for SqliteGuard {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SqliteGuard")
            .field("held", &self.held)
            .finish_non_exhaustive()
    }
}

impl SqliteGuard {
    /// Passes when the holding is live, read and judged inside `tx`, which must hold the write
    /// lock (begun [`TransactionBehavior::Immediate`]): then the transaction's writes commit
    /// while the holding is live (see the module documentation). On an error, roll the
    /// transaction back. Blocking: a few microseconds, one read of one row.
    pub fn check(&self, tx: &Transaction<'_>) -> Result<(), SqliteGuardError> {
        if tx
            .transaction_state(Some("main"))
            .map_err(SqliteGuardError::Sqlite)?
            != TransactionState::Write
        {
            return Err(SqliteGuardError::NotWriteTransaction);
        }
        if let Some(id) = self.file {
            let path = tx.path().unwrap_or("");
            if !lock::linked(std::path::Path::new(path), id) {
                return Err(SqliteGuardError::OtherFile {
                    path: path.to_owned(),
                });
            }
        }
        // Read under the write lock, as the store's own transactions read it.
        let since_boot = self.clock.since_boot().map_err(SqliteGuardError::Clock)?;
        let now = Now {
            boot_id: self.clock.boot_id(),
            ns: i64::try_from(since_boot.as_nanos()).unwrap_or(i64::MAX),
        };
        match &self.held {
            Held::Slot(token) => check_slot(tx, *token, now),
            Held::Grant {
                name,
                session,
                order_id,
            } => check_grant(tx, name, *session, *order_id, now),
        }
    }
}

fn tx_error(error: TxError) -> SqliteGuardError {
    match error {
        TxError::Busy => SqliteGuardError::Busy,
        TxError::Store(error) => SqliteGuardError::Store(error),
    }
}

/// The slot's row is live and carries the token's revision.
fn check_slot(
    tx: &Transaction<'_>,
    token: FencingToken,
    now: Now<'_>,
) -> Result<(), SqliteGuardError> {
    let found = match record::load(tx, token.slot, now).map_err(tx_error)? {
        Judged::Live(stored, _) => stored.revision(),
        Judged::Absent => None,
    };
    match found {
        Some(revision) if revision == token.revision => Ok(()),
        found => Err(SqliteGuardError::Deposed {
            slot: token.slot.0,
            revision: token.revision,
            found,
        }),
    }
}

/// The semaphore's state shows `session` owning with `order_id`, and the session is live.
fn check_grant(
    tx: &Transaction<'_>,
    name: &SemaphoreName,
    session: SessionKey,
    order_id: OrderId,
    now: Now<'_>,
) -> Result<(), SqliteGuardError> {
    let state = parties::load(tx, name)
        .map_err(tx_error)?
        .and_then(|row| row.state);
    let owned = match state {
        Some(bytes) => Semaphore::decode(&bytes)
            .map_err(|source| SqliteGuardError::Undecodable {
                name: name.as_str().to_owned(),
                source,
            })?
            .owners()
            .iter()
            .any(|o| o.session == session && o.order_id == order_id),
        None => false,
    };
    let live = owned
        && matches!(
            session::load(tx, session, now).map_err(tx_error)?,
            Judged::Live(..)
        );
    match live {
        true => Ok(()),
        false => Err(SqliteGuardError::GrantOver {
            name: name.as_str().to_owned(),
            order_id: order_id.0,
        }),
    }
}

impl SqliteStore {
    /// The guard of the holding whose fencing token is `token`: a check for the user's own
    /// transaction on this store's file that lets its writes commit only while that holding is
    /// live. See [`SqliteGuard`]. Reads nothing until checked.
    pub fn guard(&self, token: FencingToken) -> SqliteGuard {
        self.guard_of(Held::Slot(token))
    }

    /// The guard of a semaphore grant held through this store (or an `AnyStore` around it): a
    /// check for the user's own transaction on this store's file that lets its writes commit
    /// only while the grant lasts. See [`SqliteGuard`]. Reads nothing until checked.
    pub fn grant_guard<S: SemaphoreStore + Clone>(&self, grant: &SemaphoreGrant<S>) -> SqliteGuard {
        self.guard_of(Held::Grant {
            name: grant.name().clone(),
            session: grant.session(),
            order_id: grant.order_id(),
        })
    }

    fn guard_of(&self, held: Held) -> SqliteGuard {
        SqliteGuard {
            held,
            clock: Arc::clone(&self.shared.clock),
            file: self.shared.file,
        }
    }
}
