//! Fencing a write of the user's own etcd transaction by a holding: what etcd's
//! `Mutex.IsOwner()` compare does for its lock recipe.
//!
//! A slot's key (`<prefix><slot>`, [`EtcdStore::key`]) exists exactly while a holder holds the
//! slot: etcd deletes it with its lease (the holding's session, or the per-slot record's own),
//! and a holder's release deletes it. A new holder creates it anew, at a later revision of the
//! cluster's one counter. So, with `r` the revision of the fencing token (the write that gave
//! the holder the slot, or any later write of the same holder to the key),
//!
//! ```text
//! 0 < create_revision(<prefix><slot>) <= r
//! ```
//!
//! holds exactly while the key that `r` wrote still exists: the one created at or before `r`
//! that nothing deleted since. Any end of the holding — its lease revoked or expired, a
//! release, `etcdctl del` — deletes that key, and a key created afterwards, by another holder
//! or by the same one again, has a `create_revision` above `r`; an absent key compares as 0.
//! etcd evaluates the comparison and applies the transaction's writes at one revision, so the
//! writes land only while the holding is live. A holder's later writes to its key (renewals of
//! a per-slot record, which bind the key to a new lease) keep its `create_revision`, so the
//! guard of any token of one tenure stays good for the whole tenure.
//!
//! etcd's recipe compares `create_revision == r` with the revision of the key's creation;
//! the inequality is the same test for every token vvm hands out, including those of renewals,
//! which are `mod_revision`s of the same key.

use etcd_client::{Compare, CompareOp};
use vvm_core::{FencingToken, Revision};

use super::EtcdStore;

/// Why [`EtcdStore::guard`] refused a token.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum EtcdGuardError {
    /// The revision is 0 or does not fit etcd's signed 64-bit revisions: not a revision etcd
    /// assigned, so the token is not one an etcd store handed out.
    #[error("revision {revision} is not one etcd assigns (1..{max})", max = i64::MAX)]
    NotAnEtcdRevision {
        /// The token's revision.
        revision: u64,
    },
}

/// The comparisons that make the user's own etcd transaction apply only while one holding of a
/// slot is live: obtained from [`EtcdStore::guard`] with the holding's fencing token.
///
/// Put [`compares`](Self::compares) into the transaction's `when` (with any comparisons of
/// your own): its `and_then` writes apply only while the holding is live; once the holder is
/// deposed — its session's lease revoked or expired, the slot released, another holder in its
/// place — the transaction answers `succeeded() == false` and writes nothing (its `or_else`
/// runs instead).
///
/// ```no_run
/// # async fn example(store: vvm_adapters::EtcdStore, token: vvm_core::FencingToken)
/// #     -> Result<(), Box<dyn std::error::Error>> {
/// use vvm_adapters::etcd::etcd_client::{Txn, TxnOp};
///
/// // `token`: from `Elections::acquire`, `Holding`, or a service's `ServiceContext::token()`.
/// let guard = store.guard(token)?;
/// let txn = Txn::new()
///     .when(guard.compares())
///     .and_then([TxnOp::put("app/config", "written by the leader", None)]);
/// if !store.kv_client().txn(txn).await?.succeeded() {
///     // Deposed: nothing was written. Stop acting as leader.
/// }
/// # Ok(()) }
/// ```
///
/// **Publishing as the leader without re-election** (etcd's `Proclaim`): a leader that holds a
/// semaphore grant (`Coordination::acquire`, the recipe `recipe_leader`) publishes new data
/// with `SemaphoreGrant::replace(count, data)`: in place, keeping its order id and token, and
/// every watcher of the owners sees it. A leader of a slot publishes its own data with a
/// guarded transaction like the one above.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EtcdGuard {
    key: Vec<u8>,
    token: FencingToken,
    /// The token's revision as etcd's signed revisions: `1..i64::MAX`.
    revision: i64,
}

impl EtcdGuard {
    /// The key the comparisons read: the slot's key ([`EtcdStore::key`]).
    pub fn key(&self) -> &[u8] {
        &self.key
    }

    /// The fencing token the guard was made from.
    pub fn token(&self) -> FencingToken {
        self.token
    }

    /// The comparisons to put into the transaction's `when`: the slot's key exists
    /// (`create_revision > 0`) and was created at or before the token's revision
    /// (`create_revision < revision + 1`). Both are true exactly while the holding the token
    /// belongs to is live (see the module documentation).
    pub fn compares(&self) -> Vec<Compare> {
        vec![
            Compare::create_revision(self.key.clone(), CompareOp::Greater, 0),
            // `revision` is below i64::MAX (checked by `guard`): no overflow.
            Compare::create_revision(self.key.clone(), CompareOp::Less, self.revision + 1),
        ]
    }
}

impl EtcdStore {
    /// The guard of the holding whose fencing token is `token` (a slot of this store's
    /// prefix): comparisons for the user's own etcd transaction that make its writes apply
    /// only while that holding is live. See [`EtcdGuard`]. Sends nothing.
    pub fn guard(&self, token: FencingToken) -> Result<EtcdGuard, EtcdGuardError> {
        let Revision(revision) = token.revision;
        let signed = i64::try_from(revision)
            .ok()
            .filter(|r| (1..i64::MAX).contains(r))
            .ok_or(EtcdGuardError::NotAnEtcdRevision { revision })?;
        Ok(EtcdGuard {
            key: self.key(token.slot),
            token,
            revision: signed,
        })
    }
}
