//! The etcd store: every record is bound to an etcd lease, so expiry happens on the server.
//!
//! | operation | one etcd transaction |
//! |---|---|
//! | insert | grant a lease of the TTL; `if create_revision(key) == 0 && value(state) > "released <last revision seen - 1>" then put(key, value, lease), put(state, "held <ttl>")`; else a vanished record is judged (see below) |
//! | compare-and-swap | grant a lease; `if value(key) == expected && mod_revision(key) == rev then put(key, new, lease)` |
//! | compare-and-delete | `if value(key) == expected && mod_revision(key) == rev then delete(key), put(state, "released <rev>")` |
//! | get | range read of the key |
//!
//! Sessions and their holdings: see [Sessions](#sessions) below. Semaphores
//! ([`SemaphoreStore`](vvm_runtime::SemaphoreStore)): one key per semaphore holding its state
//! and one key per party bound to its session's lease; see the `semaphore` module source.
//!
//! The revision of a record is its `mod_revision`, which etcd takes from one counter for the
//! whole cluster: it strictly increases per key, also across delete and re-insert.
//!
//! # Fencing the user's own writes
//!
//! [`EtcdStore::guard`] turns a holding's fencing token into comparisons for the user's own
//! etcd transaction (etcd's `Mutex.IsOwner()`): its writes apply only while the holding is
//! live. See [`EtcdGuard`].
//!
//! # Leases
//!
//! Each write binds the record to a fresh lease, so a swap restarts the TTL and an expired lease
//! deletes the record on the server (within etcd's lease-check period of about 0.5 s, and etcd
//! extends every lease by its election timeout when a new etcd leader takes over: records may
//! live a little longer than their TTL, never shorter). No lease leaks without bound:
//! - a lease whose transaction did not write (compare false, or failed before sending) is
//!   revoked;
//! - the lease a successful swap or delete replaced is revoked, unless it is the lease of a
//!   session this store knows (the record was a holding: see [Sessions](#sessions));
//! - a lease whose transaction ended with an unknown outcome is kept (it may carry our record)
//!   and expires with its TTL.
//!
//! Revocations run in the background, at most [`REVOKES_IN_FLIGHT_MAX`] at once, each bounded by
//! the request timeout. One that fails, is skipped, or is lost because the caller dropped the
//! operation mid-way leaves a lease without keys that etcd removes when its TTL ends. So at any
//! time the leases this store left behind are at most those granted during the last TTL.
//!
//! # Records removed from outside
//!
//! etcd deletes a key alike for a release, an expiry, `etcdctl del` and `etcdctl lease
//! revoke`. Each slot has a state key (`<prefix>\0slot/<slot>`, no lease) that an insert sets
//! to `held` and the holder's own release to `released`: a candidate that finds the slot key
//! gone without a release waits until the lease its holder renewed last would have run out
//! (`Et.RecordRemoved`; details in the `vanished` module source).
//!
//! # Sessions
//!
//! The store is a [`SessionStore`](vvm_runtime::SessionStore): a session is one etcd lease
//! granted with its TTL, carrying the session record (key [`EtcdStore::session_key`]) and every
//! holding, i.e. every slot key an acquire bound to that lease. One `LeaseKeepAlive` renews them
//! all; the lease's expiry or revocation deletes them all in one etcd revision. Releasing or
//! swapping a holding never revokes its session's lease (the store remembers the leases of its
//! sessions, at most [`SESSIONS_MAX`]), so a holding is released through the store, or a clone
//! of it, that acquired it. Details in the `session` module source.
//!
//! # TTL
//!
//! etcd grants leases in whole seconds, and never shorter than 1.5 × its election timeout
//! (2 s with etcd's defaults). A TTL it cannot honour is refused, never rounded:
//! [`EtcdStore::check_ttl`] says so up front, [`EtcdStore::validate`] also asks the server, and
//! a write whose lease the server grants with another TTL fails and revokes that lease.
//!
//! # Change feed
//!
//! [`LeaseStore::changed`] opens one etcd watch over the waited-for keys, starting after the
//! highest revision any answer of this store carried, so that nothing committed after the call
//! is missed. It resolves on a deletion, on a write of another value (a renewal by the same
//! holder does not wake), and whenever it cannot tell (compaction, cancellation, lost stream);
//! dropping the future cancels the watch. Details in the `feed` module source.
//!
//! # Errors
//!
//! A request whose connection a member refused is sent again at once (the server never saw it).
//! So is a read, a lease grant, and an insert or swap whose connection broke or whose member was
//! unavailable: the insert and the swap bind the key to a lease granted for them alone and read
//! the key when their comparison is false, so a second send of one that had applied finds the
//! key bound to its lease and reports that write's revision, and a second send that applies
//! first makes the first one's comparison false. A delete is sent again only when refused.
//!
//! A write that fails before its transaction was sent (the connection was refused every time,
//! the TTL was refused, the lease grant failed, the server refused the request) is
//! [`StoreError::Failed`]. One that ends after the transaction may have reached the server
//! (deadline, unavailable, reset connection, after its resends) is [`StoreError::Unknown`].
//! Reads only ever fail with [`StoreError::Failed`]: they write nothing.

mod feed;
mod guard;
mod options;
mod semaphore;
mod session;
mod shared_feed;
mod vanished;

#[cfg(feature = "etcd-cluster")]
pub mod cluster;

use std::error::Error as _;
use std::sync::Arc;
use std::time::Duration;

use etcd_client::{
    Client, Compare, CompareOp, ConnectOptions, DeleteOptions, GetOptions, KvClient, LeaseClient,
    PutOptions, Txn, TxnOp, TxnOpResponse, WatchClient,
};
use tokio::sync::Semaphore;
use vvm_core::{LeaseConfig, Revision, Slot};
use vvm_runtime::{
    Cause, ErrorChain, Inserted, Lease, LeaseStore, LeaseValue, SlotChange, StoreError, ValueError,
};

/// The etcd client this store is built on, for the user's own transactions that an
/// [`EtcdGuard`] fences: its `Compare`s are this crate's types.
pub use etcd_client;
use feed::SeenRevision;
pub use feed::UNKNOWN_PAUSE as FEED_UNKNOWN_PAUSE;
pub use guard::{EtcdGuard, EtcdGuardError};
pub use semaphore::{EtcdSemaphoreError, SEMAPHORE_ATTEMPTS_MAX};
use session::Sessions;
pub use session::SESSIONS_MAX;

#[cfg(feature = "etcd-tls")]
pub use options::EtcdTls;
pub use options::{
    Credentials, EtcdError, EtcdOptions, CONNECT_TIMEOUT_DEFAULT, ENDPOINTS_MAX,
    ENDPOINT_MAX_BYTES, PREFIX_DEFAULT, PREFIX_MAX_BYTES, REQUEST_TIMEOUT_DEFAULT,
};

/// The shortest TTL etcd grants with its default timing (1.5 × the 1 s election timeout,
/// rounded up to whole seconds).
pub const TTL_MIN: Duration = Duration::from_secs(2);
/// The longest TTL etcd grants (`MaxLeaseTTL`, 9 000 000 000 s).
pub const TTL_MAX: Duration = Duration::from_secs(9_000_000_000);
/// Most lease revocations running in the background at once; beyond it leases expire by TTL.
pub const REVOKES_IN_FLIGHT_MAX: usize = 64;
/// What [`LeaseStore::time_left`] adds to the whole seconds etcd reports, which it rounds
/// down: the record's lease ends at most this much later than reported (and is removed at the
/// lessor's next check, every 0.5 s, after that).
pub const TIME_LEFT_ROUNDING: Duration = Duration::from_secs(1);
/// Most sends of one request whose connection a member refused or broke (see [`EtcdStore`]).
pub const SENDS_MAX: usize = 16;

/// A [`LeaseStore`] on an etcd cluster. Cloning shares the connection.
#[derive(Clone)]
pub struct EtcdStore {
    kv: KvClient,
    lease: LeaseClient,
    watch: WatchClient,
    prefix: Arc<str>,
    revokes: Arc<Semaphore>,
    /// The highest cluster revision of any answer: where change feeds start.
    seen: Arc<SeenRevision>,
    /// The semaphores' watches, one per name, shared by the feeds of this store and its clones.
    feeds: Arc<shared_feed::FeedHub>,
    /// The lease, value and revision of the sessions this store created or read (see the
    /// `session` module).
    sessions: Arc<std::sync::Mutex<Sessions>>,
    /// What this store's candidates saw of their slots' records (see the `vanished` module).
    vanished: Arc<vanished::Vanished>,
    /// Owners of semaphore units found gone without a release, and when first seen so (see the
    /// `semaphore` module).
    unreleased: Arc<crate::unreleased::Unreleased>,
    /// Sends of one request at most while members refuse or break the connection: twice the endpoints
    /// plus one, at most [`SENDS_MAX`].
    sends_max: usize,
}

impl std::fmt::Debug for EtcdStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EtcdStore")
            .field("prefix", &self.prefix)
            .finish_non_exhaustive()
    }
}

impl EtcdStore {
    /// Sets up the connection to `options`' endpoints. With credentials it authenticates at
    /// once (so the server must answer); otherwise members are connected to when first used.
    pub async fn connect(options: EtcdOptions) -> Result<Self, EtcdError> {
        let EtcdOptions {
            endpoints,
            prefix,
            credentials,
            #[cfg(feature = "etcd-tls")]
            tls,
            connect_timeout,
            request_timeout,
        } = options;
        // With a leader required, a member cut off from its cluster refuses at once instead
        // of holding the request until its timeout.
        let mut connect = ConnectOptions::new()
            .with_connect_timeout(connect_timeout)
            .with_timeout(request_timeout)
            .with_require_leader(true)
            .with_keep_alive(Duration::from_secs(10), connect_timeout);
        if let Some(credentials) = &credentials {
            connect = connect
                .with_user(credentials.user(), credentials.password())
                .with_auto_token_refresh(true);
        }
        #[cfg(feature = "etcd-tls")]
        if let Some(tls) = tls {
            connect = connect.with_tls(tls_options(tls));
        }
        let user = credentials.as_ref().map(|c| c.user().to_owned());
        let client =
            Client::connect(&endpoints, Some(connect))
                .await
                .map_err(|error| match user {
                    // The server answered, and refused the credentials: not a failure to reach it.
                    Some(user) if authentication_failed(&error) => EtcdError::Authentication {
                        user,
                        source: cause(error),
                    },
                    _ => connect_error(error),
                })?;
        tracing::debug!(endpoints = ?endpoints, prefix = %prefix, authenticated = credentials.is_some(), "etcd store set up");
        let sends_max = (2 * endpoints.len() + 1).min(SENDS_MAX);
        Ok(EtcdStore {
            kv: client.kv_client(),
            lease: client.lease_client(),
            watch: client.watch_client(),
            prefix: prefix.into(),
            revokes: Arc::new(Semaphore::new(REVOKES_IN_FLIGHT_MAX)),
            seen: Arc::default(),
            feeds: Arc::default(),
            sessions: Arc::default(),
            vanished: Arc::default(),
            unreleased: Arc::default(),
            sends_max,
        })
    }

    /// Runs `call` again, at once, while it fails in a way `resend` allows, at most
    /// `sends_max` times in all. The client spreads requests over every endpoint and keeps a
    /// dead member's endpoint in its rotation: the first request routed there after the death
    /// meets the broken connection, each later one a refused reconnection. Without resending,
    /// an operation of several requests (a lease grant, then a transaction) would likely meet
    /// the dead member once and fail, and a VVM would lose its lease to the death of one member
    /// of three. The store-call timeout bounds the whole.
    async fn resend<T, F, Fut>(&self, resend: Resend, mut call: F) -> Result<T, etcd_client::Error>
    where
        F: FnMut() -> Fut,
        Fut: std::future::Future<Output = Result<T, etcd_client::Error>>,
    {
        let mut sends = 1;
        loop {
            match call().await {
                Err(error) if resend.allows(&error) && sends < self.sends_max => {
                    tracing::debug!(sends, ?resend, error = %ErrorChain(&EtcdClientError(error)), "request failed on its connection; sending again");
                    sends += 1;
                }
                outcome => return outcome,
            }
        }
    }

    /// The TTL in whole seconds when etcd can honour `ttl`: at least [`TTL_MIN`], at most
    /// [`TTL_MAX`], a whole number of seconds.
    ///
    /// ```
    /// use std::time::Duration;
    /// use vvm_adapters::etcd::{EtcdError, EtcdStore};
    ///
    /// assert_eq!(EtcdStore::check_ttl(Duration::from_secs(10)), Ok(10));
    /// assert!(matches!(EtcdStore::check_ttl(Duration::from_secs(1)), Err(EtcdError::TtlTooShort { .. })));
    /// assert!(matches!(EtcdStore::check_ttl(Duration::from_millis(2500)), Err(EtcdError::TtlNotWholeSeconds { .. })));
    /// ```
    pub fn check_ttl(ttl: Duration) -> Result<i64, EtcdError> {
        if ttl < TTL_MIN {
            return Err(EtcdError::TtlTooShort { ttl, min: TTL_MIN });
        }
        if ttl.subsec_nanos() != 0 {
            return Err(EtcdError::TtlNotWholeSeconds { ttl });
        }
        if ttl > TTL_MAX {
            return Err(EtcdError::TtlTooLong { ttl, max: TTL_MAX });
        }
        i64::try_from(ttl.as_secs()).map_err(|_| EtcdError::TtlTooLong { ttl, max: TTL_MAX })
    }

    /// Checks before launch that the cluster honours `lease`: the TTL passes
    /// [`check_ttl`](Self::check_ttl), and a probe lease of it is granted with exactly that TTL
    /// (a cluster with a long election timeout grants longer ones). The probe is revoked.
    pub async fn validate(&self, lease: &LeaseConfig) -> Result<(), EtcdError> {
        let ttl_secs = Self::check_ttl(lease.lease())?;
        let mut client = self.lease.clone();
        let granted = client.grant(ttl_secs, None).await.map_err(connect_error)?;
        let outcome = if granted.ttl() == ttl_secs {
            Ok(())
        } else {
            Err(EtcdError::TtlNotHonoured {
                asked_secs: ttl_secs,
                granted_secs: granted.ttl(),
            })
        };
        if let Err(error) = client.revoke(granted.id()).await {
            tracing::debug!(lease = granted.id(), error = %ErrorChain(&EtcdClientError(error)), "probe lease not revoked; it expires with its TTL");
        }
        outcome
    }

    /// Checks that this client may write the store's keys, writing nothing: a transaction whose
    /// comparison is never true (a version below zero) with a put in its unused branch. etcd
    /// checks the permissions of both branches before it evaluates the comparison, so a user
    /// with read-only rights on the prefix, or rights on another prefix only, is refused here,
    /// at once, instead of campaigning forever on writes that can never succeed.
    pub async fn check_writable(&self) -> Result<(), EtcdError> {
        let key = self.key(Slot(1));
        let txn = Txn::new()
            .when([Compare::version(key.clone(), CompareOp::Less, 0)])
            .and_then([TxnOp::put(key, "", None)]);
        let sent = self
            .resend(Resend::Broken, || {
                let (mut kv, txn) = (self.kv.clone(), txn.clone());
                async move { kv.txn(txn).await }
            })
            .await;
        match sent {
            Ok(_) => Ok(()),
            Err(etcd_client::Error::GRpcStatus(status))
                if status.code() == tonic::Code::PermissionDenied =>
            {
                Err(EtcdError::NoWritePermission {
                    prefix: self.prefix.to_string(),
                })
            }
            // Out of reach or without a quorum: waited for like any other unavailability.
            Err(error) => Err(connect_error(error)),
        }
    }

    /// A client of the store's connection (its endpoints, credentials and TLS), for the user's
    /// own transactions, e.g. those an [`EtcdGuard`] fences. Cloning it shares the connection.
    pub fn kv_client(&self) -> KvClient {
        self.kv.clone()
    }

    /// The key prefix of this store's records.
    pub fn prefix(&self) -> &str {
        &self.prefix
    }

    /// The key of `slot`: the prefix followed by the slot number in decimal. Since the prefix
    /// never ends with a digit ([`EtcdOptions::prefix`]), the number is the key's trailing run of
    /// digits and no other (prefix, slot) pair has this key.
    pub fn key(&self, slot: Slot) -> Vec<u8> {
        format!("{}{}", self.prefix, slot.0).into_bytes()
    }

    /// Grants a lease of exactly `ttl`; `Failed` otherwise (nothing is written yet).
    async fn grant(&self, ttl: Duration) -> Result<i64, StoreError> {
        let ttl_secs = Self::check_ttl(ttl).map_err(StoreError::failed)?;
        let granted = self
            .resend(Resend::Broken, || {
                let mut client = self.lease.clone();
                async move { client.grant(ttl_secs, None).await }
            })
            .await
            .map_err(|error| {
                StoreError::failed(EtcdError::Grant {
                    source: cause(error),
                })
            })?;
        self.seen.note(granted.header());
        if granted.ttl() != ttl_secs {
            self.revoke_later(granted.id());
            let error = EtcdError::TtlNotHonoured {
                asked_secs: ttl_secs,
                granted_secs: granted.ttl(),
            };
            return Err(StoreError::failed(error));
        }
        Ok(granted.id())
    }

    /// Reads the key `name` (sent again while its connection is refused or breaks), noting the
    /// answer's revision for the change feeds.
    async fn read_key(&self, name: Vec<u8>) -> Result<etcd_client::GetResponse, StoreError> {
        let response = self
            .resend(Resend::Broken, || {
                let (mut kv, name) = (self.kv.clone(), name.clone());
                async move { kv.get(name, None::<GetOptions>).await }
            })
            .await
            .map_err(read_failed)?;
        self.seen.note(response.header());
        Ok(response)
    }

    /// A candidate's insert (see the `vanished` module). One transaction inserts when the slot
    /// is free and its state key says released (by the holder of the last record this store
    /// saw there, or later); otherwise it reads both keys. A live record is noted and refuses;
    /// an absent one is judged: free (never taken, or its wait is over) inserts in a second
    /// transaction with the same lease, else the candidate waits.
    async fn insert_judged(
        &self,
        key: Slot,
        value: &LeaseValue,
        ttl: Duration,
    ) -> Result<Judged, StoreError> {
        let (name, state) = (self.key(key), vanished::state_key(&self.prefix, key));
        let since = vanished::released_since(self.vanished.revision(&name));
        let released = Compare::value(state.clone(), CompareOp::Greater, since);
        let lease = self.grant(ttl).await?;
        let txn = slot_insert_txn(
            name.clone(),
            state.clone(),
            Some(released),
            value,
            lease,
            ttl,
        );
        let response = self.write(txn, lease, Resend::Broken).await?;
        let found = reads(&response);
        if response.succeeded() || found.first().is_some_and(Option::is_some) {
            return self.judge_written(&name, &response, &found, lease, ttl);
        }
        let state_record = found.get(1).and_then(Option::as_ref);
        // A session's holding was last there (`Et.HoldingRemoved`): held while that session's
        // record lives (its holder may still act), free once it ended with its holdings.
        let holder =
            state_record.and_then(|kv| kv.value().strip_prefix(vanished::HOLDING.as_bytes()));
        if let Some(holder) = holder {
            if !self.read_key(holder.to_vec()).await?.kvs().is_empty() {
                self.revoke_later(lease);
                return Ok(Judged::Wait(ttl));
            }
            let txn = slot_insert_txn(name.clone(), state, None, value, lease, ttl);
            let response = self.write(txn, lease, Resend::Broken).await?;
            let found = reads(&response);
            return self.judge_written(&name, &response, &found, lease, ttl);
        }
        let found_state = vanished::State::read(state_record.map(|kv| kv.value()));
        let begun = state_record.map(etcd_client::KeyValue::mod_revision);
        match self.vanished.verdict(&name, found_state, begun, ttl) {
            vanished::Verdict::Free => {
                let txn = slot_insert_txn(name.clone(), state, None, value, lease, ttl);
                let response = self.write(txn, lease, Resend::Broken).await?;
                let found = reads(&response);
                self.judge_written(&name, &response, &found, lease, ttl)
            }
            vanished::Verdict::Wait { left, first } => {
                self.revoke_later(lease);
                if first {
                    tracing::warn!(
                        slot = key.0,
                        wait_ms = u64::try_from(left.as_millis()).unwrap_or(u64::MAX),
                        "the slot's record is gone without its holder's release (removed from \
                         outside, or expired): that holder may act until its lease would have \
                         run out; waiting until then"
                    );
                }
                Ok(Judged::Wait(left))
            }
        }
    }

    /// The outcome of a slot insert whose transaction answered `response` (reads `found`).
    fn judge_written(
        &self,
        name: &[u8],
        response: &etcd_client::TxnResponse,
        found: &[Option<etcd_client::KeyValue>],
        lease: i64,
        ttl: Duration,
    ) -> Result<Judged, StoreError> {
        match self.written(response, lease)? {
            Some(revision) => {
                self.vanished.wrote(name, revision_number(revision), ttl);
                Ok(Judged::Written(revision))
            }
            None => {
                if let Some(Some(record)) = found.first() {
                    self.vanished.put(name, record.mod_revision());
                    let state = found.get(1).and_then(|kv| kv.as_ref()).map(|kv| kv.value());
                    if let vanished::State::Held(Some(ttl)) = vanished::State::read(state) {
                        self.vanished.holder_ttl(name, ttl);
                    }
                }
                Ok(Judged::Held)
            }
        }
    }

    /// Revokes `lease` in the background, best effort (see the module documentation).
    fn revoke_later(&self, lease: i64) {
        if lease == 0 {
            return;
        }
        let Ok(permit) = self.revokes.clone().try_acquire_owned() else {
            tracing::debug!(
                lease,
                "too many revocations in flight; the lease expires with its TTL"
            );
            return;
        };
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let mut client = self.lease.clone();
        runtime.spawn(async move {
            if let Err(error) = client.revoke(lease).await {
                tracing::debug!(lease, error = %ErrorChain(&EtcdClientError(error)), "lease not revoked; it expires with its TTL");
            }
            drop(permit);
        });
    }

    /// Revokes in the background the lease of a record a swap replaced or a delete removed,
    /// unless it is the lease of a session this store knows: the record was a holding, and
    /// the lease still carries the session and its other holdings.
    fn revoke_replaced(&self, lease: i64) {
        if self.is_session_lease(lease) {
            tracing::debug!(
                lease,
                "a holding was replaced or released; its session's lease is kept"
            );
            return;
        }
        self.revoke_later(lease);
    }

    /// Runs a write transaction that carries `lease` (0 for none), sent again as `resend`
    /// allows. On an error the lease is revoked only when the transaction certainly did not
    /// apply.
    async fn write(
        &self,
        txn: Txn,
        lease: i64,
        resend: Resend,
    ) -> Result<etcd_client::TxnResponse, StoreError> {
        let sent = self
            .resend(resend, || {
                let (mut kv, txn) = (self.kv.clone(), txn.clone());
                async move { kv.txn(txn).await }
            })
            .await;
        match sent {
            Ok(response) => {
                self.seen.note(response.header());
                Ok(response)
            }
            Err(error) => {
                let error = classify_write(error);
                if !error.is_unknown() {
                    self.revoke_later(lease);
                }
                Err(error)
            }
        }
    }

    /// `Some(revision)` when the transaction succeeded, `None` when its comparison was false
    /// (then its fresh lease is revoked).
    ///
    /// A false comparison whose read of the key (the transaction's `else` branch) finds it
    /// bound to `lease` is a success: the lease was granted for this write alone, so only an
    /// earlier send of this very transaction, whose answer was lost with its connection, can
    /// have written it. The key's `mod_revision` is that write's revision, since every other
    /// write would have bound another lease.
    fn written(
        &self,
        response: &etcd_client::TxnResponse,
        lease: i64,
    ) -> Result<Option<Revision>, StoreError> {
        if !response.succeeded() {
            let ours = response.op_responses().into_iter().find_map(|op| match op {
                TxnOpResponse::Get(get) => get
                    .kvs()
                    .first()
                    .filter(|record| lease != 0 && record.lease() == lease)
                    .map(|record| record.mod_revision()),
                _ => None,
            });
            if let Some(revision) = ours {
                tracing::debug!(lease, revision, "an earlier send of this write applied");
                return revision_from(revision).map(Some);
            }
            self.revoke_later(lease);
            return Ok(None);
        }
        let revision = response
            .header()
            .map(|header| header.revision())
            .ok_or_else(|| StoreError::unknown(EtcdError::NoRevision))?;
        let mut previous = 0;
        for op in response.op_responses() {
            if let TxnOpResponse::Put(put) = op {
                previous = put.prev_key().map_or(0, |kv| kv.lease());
            }
        }
        if previous != lease {
            self.revoke_replaced(previous);
        }
        revision_from(revision).map(Some)
    }
}

#[cfg(feature = "etcd-tls")]
fn tls_options(tls: EtcdTls) -> etcd_client::TlsOptions {
    let mut options = etcd_client::TlsOptions::new();
    if let Some(ca) = tls.ca_pem {
        options = options.ca_certificate(etcd_client::Certificate::from_pem(ca));
    }
    if let Some((certificate, key)) = tls.identity_pem {
        options = options.identity(etcd_client::Identity::from_pem(certificate, key));
    }
    if let Some(domain) = tls.domain {
        options = options.domain_name(domain);
    }
    options
}

fn revision_from(revision: i64) -> Result<Revision, StoreError> {
    u64::try_from(revision)
        .ok()
        .filter(|revision| *revision > 0)
        .map(Revision)
        .ok_or_else(|| StoreError::unknown(EtcdError::BadRevision { revision }))
}

/// `revision` as etcd's number (revisions come from etcd, so they fit).
fn revision_number(revision: Revision) -> i64 {
    i64::try_from(revision.0).unwrap_or(i64::MAX)
}

fn expected_revision(expected: &Lease) -> Option<i64> {
    i64::try_from(expected.revision.0).ok()
}

/// The causes below `error`: etcd-client's error does not expose them, the gRPC status inside
/// it does.
fn causes<'a>(
    error: &'a etcd_client::Error,
) -> impl Iterator<Item = &'a (dyn std::error::Error + 'static)> {
    let first = match error {
        etcd_client::Error::GRpcStatus(status) => status.source(),
        etcd_client::Error::TransportError(transport) => transport.source(),
        etcd_client::Error::IoError(io) => Some(io as &(dyn std::error::Error + 'static)),
        _ => None,
    };
    std::iter::successors(first, |cause| {
        let cause: &'a (dyn std::error::Error + 'static) = *cause;
        cause.source()
    })
    .take(16)
}

/// An error of the etcd client, as the cause of a failure. etcd-client's error does not expose
/// what caused it; this one does (the gRPC status's and the transport's causes, e.g. the
/// `io::Error` of a refused connection), so that [`ErrorChain`] prints them and
/// [`StoreError::find`] finds them. etcd's errors never carry the credentials.
#[derive(Debug)]
pub struct EtcdClientError(pub etcd_client::Error);

impl std::fmt::Display for EtcdClientError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.0 {
            // tonic's own text of a status carries its source's `Debug` form; the source is
            // shown by the chain instead, in its own words.
            etcd_client::Error::GRpcStatus(status) => {
                let code = status.code().description();
                match (status.message(), status.source()) {
                    ("", _) | (_, Some(_)) => write!(f, "{}", code.to_lowercase()),
                    (message, None) => write!(f, "{message} ({})", code.to_lowercase()),
                }
            }
            other => std::fmt::Display::fmt(other, f),
        }
    }
}

/// Whether etcd refused the user name or password (it answers `InvalidArgument` with
/// "authentication failed", some versions `Unauthenticated`).
fn authentication_failed(error: &etcd_client::Error) -> bool {
    matches!(error, etcd_client::Error::GRpcStatus(status)
        if status.code() == tonic::Code::Unauthenticated
            || status.message().contains("authentication failed"))
}

impl std::error::Error for EtcdClientError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        causes(&self.0).next()
    }
}

/// `error` as a cause.
fn cause(error: etcd_client::Error) -> Cause {
    Cause::new(EtcdClientError(error))
}

/// When a failed request may be sent again.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Resend {
    /// Only when it never left this process: a write whose second application would differ
    /// from the first (a delete, which cannot tell its own effect from another's).
    Unsent,
    /// Also when its connection broke or the member was unavailable: the request is a read, a
    /// lease grant (a second lease granted is left to its TTL), or a write whose effect is
    /// recognised by its fresh lease, so that a second send of an applied one finds its
    /// comparison false and the key bound to that lease (see [`EtcdStore::written`]).
    Broken,
}

impl Resend {
    fn allows(self, error: &etcd_client::Error) -> bool {
        never_sent(error) || (self == Resend::Broken && connection_lost(error))
    }
}

/// Whether the connection broke under the request or the member could not serve it: the
/// request may have been applied, and sending it again is safe only when that is harmless.
fn connection_lost(error: &etcd_client::Error) -> bool {
    let unavailable = matches!(error, etcd_client::Error::GRpcStatus(status) if status.code() == tonic::Code::Unavailable);
    unavailable
        || causes(error).any(|cause| {
            cause.downcast_ref::<std::io::Error>().is_some_and(|io| {
                matches!(
                    io.kind(),
                    std::io::ErrorKind::BrokenPipe
                        | std::io::ErrorKind::ConnectionReset
                        | std::io::ErrorKind::ConnectionAborted
                        | std::io::ErrorKind::NotConnected
                        | std::io::ErrorKind::UnexpectedEof
                )
            })
        })
}

/// Whether the request never left this process: the TCP connection to the member was refused,
/// so the server cannot have seen it.
fn never_sent(error: &etcd_client::Error) -> bool {
    causes(error).any(|cause| {
        cause.downcast_ref::<std::io::Error>().is_some_and(|io| {
            matches!(
                io.kind(),
                std::io::ErrorKind::ConnectionRefused | std::io::ErrorKind::AddrNotAvailable
            )
        })
    })
}

/// The error of setting up or checking the store: [`EtcdError::Unavailable`] when the cluster
/// could not serve for now — a member unreachable in time, a connection refused, broken or
/// turned down by the local network (no route, a firewall), no leader — and
/// [`EtcdError::Connect`] for what waiting does not mend: credentials refused, a TLS handshake
/// that failed (its `io::Error` says invalid data), a request the server refused as such.
fn connect_error(error: etcd_client::Error) -> EtcdError {
    if unavailable(&error) {
        EtcdError::Unavailable {
            source: cause(error),
        }
    } else {
        EtcdError::Connect {
            source: cause(error),
        }
    }
}

/// Whether `error` says that the cluster could not serve for now (see [`connect_error`]).
fn unavailable(error: &etcd_client::Error) -> bool {
    use std::io::ErrorKind;
    let io_kinds = || {
        causes(error).filter_map(|cause| cause.downcast_ref::<std::io::Error>().map(|io| io.kind()))
    };
    // A certificate or a handshake refused: the connection was made, its setup is wrong.
    if io_kinds().any(|kind| kind == ErrorKind::InvalidData) {
        return false;
    }
    let status_transient = matches!(error, etcd_client::Error::GRpcStatus(status)
        if matches!(status.code(), tonic::Code::Unavailable | tonic::Code::DeadlineExceeded));
    let timed_out = causes(error).any(|cause| cause.is::<tonic::TimeoutExpired>());
    // What a connection meets on the way: refused, reset, timed out, no route. A blackhole
    // route makes `connect` fail with EINVAL, a local firewall's drop with EPERM: both pass
    // when the network does.
    let network = io_kinds().any(|kind| {
        matches!(
            kind,
            ErrorKind::ConnectionRefused
                | ErrorKind::ConnectionReset
                | ErrorKind::ConnectionAborted
                | ErrorKind::NotConnected
                | ErrorKind::BrokenPipe
                | ErrorKind::UnexpectedEof
                | ErrorKind::TimedOut
                | ErrorKind::HostUnreachable
                | ErrorKind::NetworkUnreachable
                | ErrorKind::NetworkDown
                | ErrorKind::AddrNotAvailable
                | ErrorKind::InvalidInput
                | ErrorKind::PermissionDenied
        )
    });
    status_transient || timed_out || network
}

/// Maps the error of a write transaction: `Failed` only when it certainly did not apply.
fn classify_write(error: etcd_client::Error) -> StoreError {
    use etcd_client::Error;
    use tonic::Code;

    if never_sent(&error) {
        return read_failed(error);
    }
    let applied_maybe = match &error {
        Error::GRpcStatus(status) => match status.code() {
            // The server refused the request as such: nothing was proposed.
            Code::InvalidArgument
            | Code::FailedPrecondition
            | Code::OutOfRange
            | Code::PermissionDenied
            | Code::Unauthenticated
            | Code::ResourceExhausted
            | Code::NotFound
            | Code::AlreadyExists
            | Code::Unimplemented => false,
            // Timeouts, lost connections and internal errors: it may have been applied.
            _ => true,
        },
        Error::InvalidArgs(_)
        | Error::InvalidUri(_)
        | Error::InvalidMetadataValue(_)
        | Error::EndpointError(_)
        | Error::EndpointsNotManaged
        | Error::Utf8Error(_) => false,
        _ => true,
    };
    match applied_maybe {
        true => StoreError::Unknown {
            source: cause(error),
        },
        false => read_failed(error),
    }
}

fn read_failed(error: etcd_client::Error) -> StoreError {
    StoreError::Failed {
        source: cause(error),
    }
}

/// The insert of `value` bound to `lease`, reading the key when it exists (see
/// [`EtcdStore::written`]).
fn insert_txn(name: Vec<u8>, value: &LeaseValue, lease: i64) -> Txn {
    Txn::new()
        .when([Compare::create_revision(name.clone(), CompareOp::Equal, 0)])
        .and_then([TxnOp::put(
            name.clone(),
            value.encode(),
            Some(PutOptions::new().with_lease(lease)),
        )])
        .or_else([TxnOp::get(name, None)])
}

/// The insert of `value` bound to `lease` under the slot key `name` if it is free and `also`
/// holds, writing the slot's state key `state` (`held` for `ttl`) with it; reads both keys
/// otherwise, the slot key first (see [`EtcdStore::written`] and the `vanished` module).
fn slot_insert_txn(
    name: Vec<u8>,
    state: Vec<u8>,
    also: Option<Compare>,
    value: &LeaseValue,
    lease: i64,
    ttl: Duration,
) -> Txn {
    let mut when = vec![Compare::create_revision(name.clone(), CompareOp::Equal, 0)];
    when.extend(also);
    Txn::new()
        .when(when)
        .and_then([
            TxnOp::put(
                name.clone(),
                value.encode(),
                Some(PutOptions::new().with_lease(lease)),
            ),
            TxnOp::put(state.clone(), vanished::held(ttl), None),
        ])
        .or_else([TxnOp::get(name, None), TxnOp::get(state, None)])
}

/// The records of a transaction's reads, in order (`None` for a key not found).
fn reads(response: &etcd_client::TxnResponse) -> Vec<Option<etcd_client::KeyValue>> {
    response
        .op_responses()
        .into_iter()
        .filter_map(|op| match op {
            TxnOpResponse::Get(get) => Some(get.kvs().first().cloned()),
            _ => None,
        })
        .collect()
}

/// What a candidate's insert found (see [`EtcdStore::insert_judged`]).
enum Judged {
    /// Our record was written with this revision.
    Written(Revision),
    /// A live record refused it.
    Held,
    /// The slot's record vanished without its holder's release: the candidate waits this much
    /// longer before it inserts.
    Wait(Duration),
}

/// The swap of `expected` (at `revision`) for `new_value` bound to `lease`, reading the key when
/// the comparison is false (see [`EtcdStore::written`]).
fn swap_txn(
    name: Vec<u8>,
    expected: &Lease,
    revision: i64,
    new_value: &LeaseValue,
    lease: i64,
) -> Txn {
    Txn::new()
        .when(same_record(&name, expected, revision))
        .and_then([TxnOp::put(
            name.clone(),
            new_value.encode(),
            Some(PutOptions::new().with_lease(lease).with_prev_key()),
        )])
        .or_else([TxnOp::get(name, None)])
}

fn same_record(key: &[u8], expected: &Lease, revision: i64) -> [Compare; 2] {
    [
        Compare::value(key.to_vec(), CompareOp::Equal, expected.value.encode()),
        Compare::mod_revision(key.to_vec(), CompareOp::Equal, revision),
    ]
}

impl LeaseStore for EtcdStore {
    /// The insert of [`insert_or_time_left`](Self::insert_or_time_left), without the time left.
    async fn insert_if_not_exists(
        &self,
        key: Slot,
        value: &LeaseValue,
        ttl: Duration,
    ) -> Result<Option<Revision>, StoreError> {
        Ok(match self.insert_judged(key, value, ttl).await? {
            Judged::Written(revision) => Some(revision),
            Judged::Held | Judged::Wait(_) => None,
        })
    }

    /// An insert that waits out a record removed from outside (see the `vanished` module),
    /// then, when a live record refuses it, asks its time left.
    async fn insert_or_time_left(
        &self,
        key: Slot,
        value: &LeaseValue,
        ttl: Duration,
    ) -> Result<Inserted, StoreError> {
        match self.insert_judged(key, value, ttl).await? {
            Judged::Written(revision) => Ok(Inserted::Written(revision)),
            Judged::Wait(left) => Ok(Inserted::Held { left: Some(left) }),
            Judged::Held => {
                let left = match self.time_left(key).await {
                    Ok(left) => left,
                    Err(error) => {
                        tracing::debug!(slot = key.0, error = %ErrorChain(&error), "time left of a refusing record unknown");
                        None
                    }
                };
                Ok(Inserted::Held { left })
            }
        }
    }

    async fn compare_and_swap(
        &self,
        key: Slot,
        expected: &Lease,
        new_value: &LeaseValue,
        ttl: Duration,
    ) -> Result<Option<Revision>, StoreError> {
        let Some(revision) = expected_revision(expected) else {
            return Ok(None);
        };
        let lease = self.grant(ttl).await?;
        let name = self.key(key);
        let txn = swap_txn(name.clone(), expected, revision, new_value, lease);
        let response = self.write(txn, lease, Resend::Broken).await?;
        let written = self.written(&response, lease)?;
        if let Some(revision) = written {
            // Its lease runs out by now plus its TTL (see `vanished`).
            self.vanished.wrote(&name, revision_number(revision), ttl);
        }
        Ok(written)
    }

    async fn compare_and_delete(&self, key: Slot, expected: &Lease) -> Result<bool, StoreError> {
        let Some(revision) = expected_revision(expected) else {
            return Ok(false);
        };
        let name = self.key(key);
        // The state key says the holder released this record itself (see `vanished`).
        let txn = Txn::new()
            .when(same_record(&name, expected, revision))
            .and_then([
                TxnOp::delete(name, Some(DeleteOptions::new().with_prev_key())),
                TxnOp::put(
                    vanished::state_key(&self.prefix, key),
                    vanished::released(revision),
                    None,
                ),
            ]);
        let response = self.write(txn, 0, Resend::Unsent).await?;
        if !response.succeeded() {
            return Ok(false);
        }
        for op in response.op_responses() {
            if let TxnOpResponse::Delete(delete) = op {
                for previous in delete.prev_kvs() {
                    self.revoke_replaced(previous.lease());
                }
            }
        }
        Ok(true)
    }

    async fn get(&self, key: Slot) -> Result<Option<Lease>, StoreError> {
        let response = self.read_key(self.key(key)).await?;
        let Some(record) = response.kvs().first() else {
            return Ok(None);
        };
        // vvm binds every record to a lease: a key without one was written by another program
        // and would never expire. It is foreign, like a value vvm did not write.
        if record.lease() == 0 {
            return Err(StoreError::Corrupt {
                slot: key.0,
                source: ValueError::Unleased {
                    key: String::from_utf8_lossy(record.key()).into_owned(),
                },
            });
        }
        let value = LeaseValue::decode(record.value()).map_err(|source| StoreError::Corrupt {
            slot: key.0,
            source,
        })?;
        let revision = revision_from(record.mod_revision()).map_err(|_| {
            StoreError::failed(EtcdError::BadRevision {
                revision: record.mod_revision(),
            })
        })?;
        Ok(Some(Lease { value, revision }))
    }

    /// The remaining TTL of the record's etcd lease, rounded up: etcd reports whole seconds
    /// rounded down ([`TIME_LEFT_ROUNDING`] is added back), so the answer is never before the
    /// lease's expiry. A lease etcd reports at 0 s is expired or about to be, but stays until
    /// its lessor's next check removes it; a waiting candidate told "0 s" would ask again at once
    /// and again, while told the rounding it waits for the deletion on its change feed, or
    /// the rounding at most.
    async fn time_left(&self, key: Slot) -> Result<Option<Duration>, StoreError> {
        let name = self.key(key);
        let response = self.read_key(name.clone()).await?;
        let revision = response
            .kvs()
            .first()
            .map(etcd_client::KeyValue::mod_revision);
        if let Some(revision) = revision {
            self.vanished.put(&name, revision);
        }
        let Some(lease) = response
            .kvs()
            .first()
            .map(|record| record.lease())
            .filter(|id| *id != 0)
        else {
            return Ok(None);
        };
        let left = self
            .resend(Resend::Broken, || {
                let mut client = self.lease.clone();
                async move { client.time_to_live(lease, None).await }
            })
            .await
            .map_err(read_failed)?;
        // Negative: expired more than a second ago and not yet removed, nothing to tell.
        let left = u64::try_from(left.ttl())
            .ok()
            .map(|secs| Duration::from_secs(secs).saturating_add(TIME_LEFT_ROUNDING));
        if let (Some(left), Some(revision)) = (left, revision) {
            // Rounded up and counted from after the answer: that record's lease ends by then.
            if let Some(ends) = std::time::Instant::now().checked_add(left) {
                self.vanished.lease_ends(&name, revision, ends);
            }
        }
        Ok(left)
    }

    /// One etcd watch over the keys of `keys`, from the highest revision this store has seen;
    /// see the module documentation (change feed).
    fn changed(&self, keys: &[Slot]) -> SlotChange {
        let names = keys.iter().map(|slot| self.key(*slot)).collect();
        feed::changed(self.watch.clone(), &self.seen, &self.vanished, names, keys)
    }

    /// The watch reports deletions (a release, or etcd revoking an expired lease) and holder
    /// changes: candidates wait for it or the expiry instead of polling in rounds.
    fn has_change_feed(&self) -> bool {
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // covers: Et.Ttl
    #[test]
    fn ttls_etcd_cannot_honour_are_refused_not_rounded() {
        assert_eq!(EtcdStore::check_ttl(Duration::from_secs(2)), Ok(2));
        assert_eq!(EtcdStore::check_ttl(Duration::from_secs(3600)), Ok(3600));
        assert!(matches!(
            EtcdStore::check_ttl(Duration::from_millis(1999)),
            Err(EtcdError::TtlTooShort { .. })
        ));
        assert!(matches!(
            EtcdStore::check_ttl(Duration::ZERO),
            Err(EtcdError::TtlTooShort { .. })
        ));
        assert!(matches!(
            EtcdStore::check_ttl(Duration::from_millis(3001)),
            Err(EtcdError::TtlNotWholeSeconds { .. })
        ));
        assert!(matches!(
            EtcdStore::check_ttl(TTL_MAX + Duration::from_secs(1)),
            Err(EtcdError::TtlTooLong { .. })
        ));
        assert_eq!(EtcdStore::check_ttl(TTL_MAX), Ok(9_000_000_000));
    }

    // covers: Et.Unavailable
    #[test]
    fn an_unreachable_cluster_is_unavailable_and_a_refused_setup_is_not() {
        use std::io::ErrorKind;
        use tonic::{Code, Status};
        let status =
            |code, message: &str| etcd_client::Error::GRpcStatus(Status::new(code, message));
        let with_cause = |code, kind: ErrorKind| {
            let mut status = Status::new(code, "transport error");
            status.set_source(std::sync::Arc::new(std::io::Error::from(kind)));
            etcd_client::Error::GRpcStatus(status)
        };
        let transient = [
            status(Code::Unavailable, "etcdserver: no leader"),
            status(Code::Unavailable, "etcdserver: request timed out"),
            status(Code::DeadlineExceeded, "context deadline exceeded"),
            with_cause(Code::Unavailable, ErrorKind::ConnectionRefused),
            with_cause(Code::Unknown, ErrorKind::ConnectionReset),
            // A blackhole route: connect(2) says EINVAL; a local firewall's drop: EPERM.
            with_cause(Code::Unavailable, ErrorKind::InvalidInput),
            with_cause(Code::Unavailable, ErrorKind::PermissionDenied),
            etcd_client::Error::IoError(std::io::Error::from(ErrorKind::TimedOut)),
        ];
        for error in transient {
            let shown = format!("{error:?}");
            assert!(connect_error(error).is_unavailable(), "{shown}");
        }
        let refused = [
            status(
                Code::InvalidArgument,
                "etcdserver: authentication failed, invalid user ID or password",
            ),
            status(Code::PermissionDenied, "etcdserver: permission denied"),
            // A TLS handshake refused (rustls's errors are `InvalidData`).
            with_cause(Code::Unavailable, ErrorKind::InvalidData),
            etcd_client::Error::InvalidArgs("empty endpoints".to_owned()),
        ];
        for error in refused {
            let shown = format!("{error:?}");
            let error = connect_error(error);
            assert!(!error.is_unavailable(), "{shown}");
            assert!(matches!(error, EtcdError::Connect { .. }), "{error:?}");
        }
    }

    // covers: Et.Errors
    #[test]
    fn refused_requests_fail_and_lost_ones_are_unknown() {
        use tonic::{Code, Status};
        let status =
            |code, message: &str| etcd_client::Error::GRpcStatus(Status::new(code, message));
        assert!(!classify_write(status(
            Code::InvalidArgument,
            "etcdserver: key is not provided"
        ))
        .is_unknown());
        assert!(!classify_write(status(
            Code::PermissionDenied,
            "etcdserver: permission denied"
        ))
        .is_unknown());
        assert!(classify_write(status(Code::DeadlineExceeded, "timeout")).is_unknown());
        assert!(
            classify_write(status(Code::Unavailable, "etcdserver: request timed out")).is_unknown()
        );
        assert!(classify_write(status(Code::Unknown, "raft proposal dropped")).is_unknown());
        let refused = std::io::Error::from(std::io::ErrorKind::ConnectionRefused);
        assert!(!classify_write(etcd_client::Error::IoError(refused)).is_unknown());
        let with_cause = |kind: std::io::ErrorKind| {
            let mut status = Status::new(Code::Unavailable, "transport error");
            status.set_source(std::sync::Arc::new(std::io::Error::from(kind)));
            etcd_client::Error::GRpcStatus(status)
        };
        let refused = classify_write(with_cause(std::io::ErrorKind::ConnectionRefused));
        assert!(!refused.is_unknown(), "{refused:?}");
        // The refused connection is kept whole, below the client's error.
        let io = refused
            .find::<std::io::Error>()
            .expect("the io error is kept");
        assert_eq!(io.kind(), std::io::ErrorKind::ConnectionRefused);
        assert!(refused.find::<EtcdClientError>().is_some());
        let reset = classify_write(with_cause(std::io::ErrorKind::ConnectionReset));
        assert!(
            reset.is_unknown(),
            "a reset connection may have carried the request: {reset:?}"
        );
    }

    // covers: Et.Resend
    #[test]
    fn only_writes_recognised_by_their_lease_are_sent_again_after_a_broken_connection() {
        use tonic::{Code, Status};
        let with_cause = |kind: std::io::ErrorKind| {
            let mut status = Status::new(Code::Unknown, "transport error");
            status.set_source(std::sync::Arc::new(std::io::Error::from(kind)));
            etcd_client::Error::GRpcStatus(status)
        };
        let refused = with_cause(std::io::ErrorKind::ConnectionRefused);
        let broken = with_cause(std::io::ErrorKind::BrokenPipe);
        let unavailable =
            etcd_client::Error::GRpcStatus(Status::new(Code::Unavailable, "etcdserver: no leader"));
        let denied = etcd_client::Error::GRpcStatus(Status::new(
            Code::PermissionDenied,
            "etcdserver: permission denied",
        ));
        for resend in [Resend::Unsent, Resend::Broken] {
            assert!(resend.allows(&refused));
            assert!(!resend.allows(&denied));
        }
        assert!(Resend::Broken.allows(&broken));
        assert!(Resend::Broken.allows(&unavailable));
        assert!(!Resend::Unsent.allows(&broken));
        assert!(!Resend::Unsent.allows(&unavailable));
    }

    /// The answer of an applied insert and swap is lost: the second send of the same
    /// transaction reports the first one's revision, and leaves the key as it wrote it.
    // covers: Et.Resend
    #[cfg(feature = "etcd-cluster")]
    #[tokio::test]
    async fn a_second_send_of_an_applied_write_reports_the_first_ones_revision() {
        use cluster::{find_etcd, ClusterOptions, EtcdCluster};
        if find_etcd().is_none() {
            let ci = std::env::var("CI").is_ok_and(|value| value == "true" || value == "1");
            assert!(!ci, "under CI etcd must be installed");
            return;
        }
        let cluster = EtcdCluster::start(ClusterOptions::new(1).expect("valid options"))
            .await
            .expect("etcd starts");
        let options = cluster
            .store_options()
            .expect("valid options")
            .prefix("resend/")
            .expect("valid prefix");
        let store = EtcdStore::connect(options).await.expect("connects");
        let value = |address: &str| LeaseValue {
            address: address.into(),
            incarnation: vvm_core::Incarnation(7),
            stopping: false,
        };
        let ttl = Duration::from_secs(60);
        let name = store.key(Slot(1));

        // The insert, sent twice: the first answer is dropped as if its connection broke.
        let lease = store.grant(ttl).await.expect("granted");
        let insert = insert_txn(name.clone(), &value("a"), lease);
        let first = store.kv.clone().txn(insert.clone()).await.expect("applied");
        let first_revision = first.header().expect("a header").revision();
        let again = store
            .write(insert, lease, Resend::Broken)
            .await
            .expect("sent");
        assert!(!again.succeeded(), "the second send's comparison is false");
        let inserted = store.written(&again, lease).expect("recognised");
        assert_eq!(
            inserted,
            Some(revision_from(first_revision).expect("positive"))
        );
        let held = store.get(Slot(1)).await.expect("read").expect("a record");
        assert_eq!(
            held.revision,
            revision_from(first_revision).expect("positive")
        );

        // A write by another lease is not taken for ours.
        let other = store.grant(ttl).await.expect("granted");
        let refused = store
            .write(
                insert_txn(name.clone(), &value("b"), other),
                other,
                Resend::Broken,
            )
            .await
            .expect("sent");
        assert_eq!(store.written(&refused, other).expect("answered"), None);

        // The swap, sent twice the same way.
        let lease = store.grant(ttl).await.expect("granted");
        let revision = i64::try_from(held.revision.0).expect("fits");
        let swap = swap_txn(name.clone(), &held, revision, &value("c"), lease);
        let first = store.kv.clone().txn(swap.clone()).await.expect("applied");
        let first_revision = first.header().expect("a header").revision();
        let again = store
            .write(swap, lease, Resend::Broken)
            .await
            .expect("sent");
        assert_eq!(
            store.written(&again, lease).expect("recognised"),
            Some(revision_from(first_revision).expect("positive"))
        );
        let held = store.get(Slot(1)).await.expect("read").expect("a record");
        assert_eq!(held.value, value("c"));
        assert_eq!(
            held.revision,
            revision_from(first_revision).expect("positive")
        );
    }

    #[test]
    fn revisions_must_be_positive() {
        assert_eq!(revision_from(7), Ok(Revision(7)));
        assert!(revision_from(0).unwrap_err().is_unknown());
        assert!(revision_from(-1).unwrap_err().is_unknown());
    }
}
