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
//!
//! **A semaphore grant** ([`EtcdStore::grant_guard`]) is guarded by its party key
//! (`<prefix> NUL semaphore/<name> NUL <session>`, bound to the session's lease): the key is
//! created in the transaction that makes the session a party and is deleted when it stops
//! being one (its release, its session's end, a forced delete); an owner stays an owner while
//! it is a party (a replace keeps its order id; nothing demotes an owner to a waiter). The
//! guard reads, in one snapshot, the semaphore's state — which must show the grant's session
//! owning with the grant's order id — and the party key's `create_revision` `c`, and compares
//! `0 < create_revision <= c`: true exactly while that party key, and so that ownership, lasts.

use etcd_client::{Compare, CompareOp, GetOptions, Txn, TxnOp, TxnOpResponse};
use vvm_core::{FencingToken, Revision};
use vvm_runtime::{SemaphoreGrant, SemaphoreStore, StoreError};

use super::semaphore::decode;
use super::{read_failed, EtcdStore, Resend};

/// Why [`EtcdStore::guard`] refused a token, or [`EtcdStore::grant_guard`] a grant.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum EtcdGuardError {
    /// The revision is 0 or does not fit etcd's signed 64-bit revisions: not a revision etcd
    /// assigned, so the token is not one an etcd store handed out.
    #[error("revision {revision} is not one etcd assigns (1..{max})", max = i64::MAX)]
    NotAnEtcdRevision {
        /// The token's revision.
        revision: u64,
    },
    /// The grant is over already: the semaphore does not show its session owning with its
    /// order id, or its party key is gone.
    #[error("the grant of semaphore {name} (order id {order_id}) is over")]
    GrantOver {
        /// The semaphore.
        name: String,
        /// The grant's order id.
        order_id: u64,
    },
    /// The semaphore could not be read (the cluster out of reach, an undecodable state).
    #[error("the semaphore could not be read")]
    Store(#[source] StoreError),
}

/// The comparisons that make the user's own etcd transaction apply only while one holding is
/// live: obtained from [`EtcdStore::guard`] with a slot's fencing token, or from
/// [`EtcdStore::grant_guard`] with a semaphore grant.
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
    /// The highest `create_revision` the key may have: `1..i64::MAX`.
    created_max: i64,
}

impl EtcdGuard {
    /// The key the comparisons read: the slot's key ([`EtcdStore::key`]) for a slot's
    /// holding, the session's party key of the semaphore for a grant.
    pub fn key(&self) -> &[u8] {
        &self.key
    }

    /// The highest `create_revision` the key may have: the token's revision for a slot's
    /// holding, the party key's own `create_revision` for a grant.
    pub fn created_max(&self) -> i64 {
        self.created_max
    }

    /// The comparisons to put into the transaction's `when`: the key exists
    /// (`create_revision > 0`) and was created at or before [`created_max`](Self::created_max)
    /// (`create_revision < created_max + 1`). Both are true exactly while the holding is live
    /// (see the module documentation).
    pub fn compares(&self) -> Vec<Compare> {
        vec![
            Compare::create_revision(self.key.clone(), CompareOp::Greater, 0),
            // `created_max` is below i64::MAX (checked when made): no overflow.
            Compare::create_revision(self.key.clone(), CompareOp::Less, self.created_max + 1),
        ]
    }
}

impl EtcdStore {
    /// The guard of the holding whose fencing token is `token` (a slot of this store's
    /// prefix): comparisons for the user's own etcd transaction that make its writes apply
    /// only while that holding is live. See [`EtcdGuard`]. Sends nothing.
    pub fn guard(&self, token: FencingToken) -> Result<EtcdGuard, EtcdGuardError> {
        let Revision(revision) = token.revision;
        let created_max = i64::try_from(revision)
            .ok()
            .filter(|r| (1..i64::MAX).contains(r))
            .ok_or(EtcdGuardError::NotAnEtcdRevision { revision })?;
        Ok(EtcdGuard {
            key: self.key(token.slot),
            created_max,
        })
    }

    /// The guard of a semaphore grant held through this store (or an `AnyStore` around it):
    /// comparisons for the user's own etcd transaction that make its writes apply only while
    /// the grant lasts. Reads the semaphore's state and the grant's party key in one
    /// snapshot; [`EtcdGuardError::GrantOver`] when the grant has ended already.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: it only reads.
    pub async fn grant_guard<S: SemaphoreStore + Clone>(
        &self,
        grant: &SemaphoreGrant<S>,
    ) -> Result<EtcdGuard, EtcdGuardError> {
        let state_key = self.semaphore_key(grant.name());
        let party_key = EtcdStore::party_key(&state_key, grant.session());
        let txn = Txn::new().and_then([
            TxnOp::get(state_key, None::<GetOptions>),
            TxnOp::get(party_key.clone(), None::<GetOptions>),
        ]);
        let response = self
            .resend(Resend::Broken, || {
                let (mut kv, txn) = (self.kv.clone(), txn.clone());
                async move { kv.txn(txn).await }
            })
            .await
            .map_err(|error| EtcdGuardError::Store(read_failed(error)))?;
        let mut reads = response.op_responses().into_iter().map(|op| match op {
            TxnOpResponse::Get(get) => get.kvs().first().cloned(),
            _ => None,
        });
        let (state, party) = (reads.next().flatten(), reads.next().flatten());
        let (semaphore, _) = decode(state.as_ref().map(etcd_client::KeyValue::value))
            .map_err(|source| EtcdGuardError::Store(StoreError::failed(source)))?;
        let owned = semaphore.is_some_and(|semaphore| {
            semaphore
                .owners()
                .iter()
                .any(|o| o.session == grant.session() && o.order_id == grant.order_id())
        });
        let created = party.map_or(0, |kv| kv.create_revision());
        if !owned || !(1..i64::MAX).contains(&created) {
            return Err(EtcdGuardError::GrantOver {
                name: grant.name().as_str().to_owned(),
                order_id: grant.order_id().0,
            });
        }
        Ok(EtcdGuard {
            key: party_key,
            created_max: created,
        })
    }
}
