//! The store conformance suite: every [`LeaseStore`] must pass it.
//!
//! Two parts, both generic over a [`Harness`] (what differs per store):
//! - [`ttl`]: the four operations on TTL records — conditional writes, expiry, revisions,
//!   independence of keys, and 1000 concurrent inserts on one key;
//! - [`elections`]: the runtime's [`Elections`](vvm::Elections) acquiring, holding, losing and
//!   releasing slots on one session of the store, for every [`vvm::store::SessionStore`];
//! - [`observe`]: [`vvm::observe`] reporting every change of holder (and no renewal);
//! - [`feed`]: the change feed, for stores that have one (`feed_cases!`);
//! - [`sessions`]: session records and their holdings, for every [`vvm::store::SessionStore`]
//!   (`session_cases!`);
//! - [`semaphores`]: semaphores and the runtime's coordination on them, for every
//!   [`vvm::store::SemaphoreStore`] (`semaphore_cases!`).
//!
//! # Plugging a store in
//! 1. Implement [`Harness`]: a fresh store per case, extra clients of it, a short TTL and a way
//!    to let time pass. Stores that judge expiry by tokio's clock (the memory store, or SQLite
//!    with an injected clock) run under `start_paused` and let time pass with
//!    `tokio::time::sleep`, which then costs nothing; stores with a real clock (SQLite's boot
//!    clock, etcd's server-side leases) use a short real TTL and really sleep.
//! 2. In a test file of the store's crate (with `vvm-conformance` and tokio, feature
//!    `test-util` when paused, as dev-dependencies): one macro call per part, naming the test
//!    attribute and the harness:
//!    ```ignore
//!    vvm_conformance::ttl_cases!(#[tokio::test(start_paused = true)] crate::harness());
//!    vvm_conformance::elections_cases!(#[tokio::test(start_paused = true)] crate::harness());
//!    ```
//!    Each case becomes its own test named after the case, e.g.
//!    `cargo test --test conformance_sqlite -- cas_after_expiry`.
//!
//! Cases never assert on speed, and never check that a short-TTL record is still alive (a slow
//! machine may have let it expire): liveness is checked on records with [`LONG_TTL`].

pub mod elections;
pub mod feed;
pub mod observe;
pub mod semaphores;
pub mod sessions;
pub mod ttl;

use std::future::Future;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use vvm::{lifecycle::Incarnation, session::LeaseValue, store::LeaseStore};

/// A TTL that outlives every case.
pub const LONG_TTL: Duration = Duration::from_secs(3600);

/// What the suite needs to know about a store.
pub trait Harness {
    /// The store under test. Clones share the store (and its connection, if any).
    type Store: LeaseStore + Clone;

    /// A store (or a namespace of one) that no other case uses, with no records.
    fn store(&self) -> impl Future<Output = Self::Store>;

    /// Another client of the same store as `store`, with its own connection where the store
    /// has connections; `store.clone()` where it has none.
    fn client(&self, store: &Self::Store) -> impl Future<Output = Self::Store>;

    /// A TTL after which [`expire`](Self::expire) has let a record expire.
    fn short_ttl(&self) -> Duration;

    /// Lets time pass for the store's expiry by `duration`.
    fn pass(&self, duration: Duration) -> impl Future<Output = ()>;

    /// Lets every record written with [`short_ttl`](Self::short_ttl) before this call expire.
    fn expire(&self) -> impl Future<Output = ()> {
        self.pass(self.short_ttl() + Duration::from_millis(1))
    }

    /// Whether the store cannot tell a session's expiry from its removal from outside, so that
    /// an owner of semaphore units whose session ended is waited out for its TTL after a store
    /// handle first saw it gone (etcd: a lease expired and a lease revoked look alike,
    /// `Et.SemaphoreUnreleased`); the others remove it at the first look after its expiry.
    fn waits_out_ended_owners(&self) -> bool {
        false
    }

    /// The lease of the elections cases: at least `vvm::config::LEASE_MIN`; each case lets up to
    /// about two leases pass.
    fn lease(&self) -> Duration;

    /// The store-call timeout of the elections cases, when the lease's default (`L/40`) is too
    /// short for the store on a loaded test machine; it must stay below the retry interval.
    fn store_timeout(&self) -> Option<Duration> {
        None
    }
}

/// A lease value that differs for every `n`.
pub fn value(n: u64) -> LeaseValue {
    LeaseValue {
        address: format!("10.0.{}.{}:7000", n / 256 % 256, n % 256),
        incarnation: Incarnation(n),
        stopping: false,
    }
}

/// A directory for file-backed stores, removed (best effort) when dropped.
#[derive(Debug)]
pub struct ScratchDir {
    path: PathBuf,
}

impl ScratchDir {
    /// A new empty directory under the system's temporary directory.
    pub fn new(prefix: &str) -> Self {
        static NEXT: AtomicU64 = AtomicU64::new(0);
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.subsec_nanos())
            .unwrap_or(0);
        let name = format!(
            "{prefix}-{}-{}-{nanos}",
            std::process::id(),
            NEXT.fetch_add(1, Ordering::Relaxed)
        );
        let path = std::env::temp_dir().join(name);
        std::fs::create_dir_all(&path).expect("temporary directory can be created");
        ScratchDir { path }
    }

    /// The directory.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// A file name in the directory that nothing uses yet.
    pub fn file(&self, name: &str) -> PathBuf {
        self.path.join(name)
    }
}

impl Drop for ScratchDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.path);
    }
}

/// One test per TTL case: `ttl_cases!(#[test attribute] harness-expression);`.
#[macro_export]
macro_rules! ttl_cases {
    (#[$test:meta] $harness:expr) => {
        $crate::ttl_cases!(@cases #[$test] $harness;
            insert_into_empty,
            no_insert_over_a_live_record,
            insert_after_expiry,
            cas_success_returns_a_higher_revision,
            cas_on_value_mismatch,
            cas_on_revision_mismatch,
            cas_after_expiry,
            cad_success,
            cad_on_mismatch,
            cad_after_expiry,
            get_returns_value_and_revision_of_the_last_write,
            get_is_absent_after_expiry,
            revisions_increase_across_delete_and_reinsert,
            different_keys_are_independent,
            one_of_1000_concurrent_inserts_wins,
        );
    };
    (@cases #[$test:meta] $harness:expr; $($case:ident),+ $(,)?) => {
        $(
            #[$test]
            async fn $case() {
                $crate::ttl::$case(&$harness).await;
            }
        )+
    };
}

/// One test per elections case: `elections_cases!(#[test attribute] harness-expression);`.
#[macro_export]
macro_rules! elections_cases {
    (#[$test:meta] $harness:expr) => {
        $crate::elections_cases!(@cases #[$test] $harness;
            elections_acquire_hold_and_release,
            elections_acquire_fails_while_another_holds,
            elections_a_deleted_session_loses_every_slot,
            elections_a_lost_slot_passes_to_the_next_contender,
            elections_release_without_acquire_does_nothing,
            elections_acquire_after_cleanup_fails,
            elections_cleanup_after_keepalives_releases,
            elections_a_released_slot_passes_to_the_next_contender,
        );
    };
    (@cases #[$test:meta] $harness:expr; $($case:ident),+ $(,)?) => {
        $(
            #[$test]
            async fn $case() {
                $crate::elections::$case(&$harness).await;
            }
        )+
    };
}

/// One test per change-feed case: `feed_cases!(#[test attribute] harness-expression);`.
#[macro_export]
macro_rules! feed_cases {
    (#[$test:meta] $harness:expr) => {
        $crate::feed_cases!(@cases #[$test] $harness;
            feed_wakes_on_a_deletion,
            feed_wakes_on_another_holder,
            feed_wakes_on_a_deletion_and_reinsert_after_the_call,
        );
    };
    (@cases #[$test:meta] $harness:expr; $($case:ident),+ $(,)?) => {
        $(
            // covers: St.ChangeFeed
            #[$test]
            async fn $case() {
                $crate::feed::$case(&$harness).await;
            }
        )+
    };
}

/// One test per session case: `session_cases!(#[test attribute] harness-expression);`.
#[macro_export]
macro_rules! session_cases {
    (#[$test:meta] $harness:expr) => {
        $crate::session_cases!(@cases #[$test] $harness;
            session_create_read_and_keep_alive,
            session_expiry_ends_every_holding,
            session_delete_ends_every_holding,
            holdings_and_slot_records_exclude_each_other,
            a_released_holding_leaves_the_session_alive,
            one_of_20_concurrent_acquires_wins,
        );
    };
    (@cases #[$test:meta] $harness:expr; $($case:ident),+ $(,)?) => {
        $(
            #[$test]
            async fn $case() {
                $crate::sessions::$case(&$harness).await;
            }
        )+
    };
}

/// One test per semaphore case: `semaphore_cases!(#[test attribute] harness-expression);`.
#[macro_export]
macro_rules! semaphore_cases {
    (#[$test:meta] $harness:expr) => {
        $crate::semaphore_cases!(@cases #[$test] $harness;
            semaphore_queue_is_fifo,
            semaphore_acquire_again_replaces_in_place,
            semaphore_try_once_never_queues,
            semaphore_ephemeral_lives_with_its_parties,
            semaphore_late_calls_act_on_nothing_newer,
            semaphore_delete_is_refused_while_busy_unless_forced,
            semaphore_being_deleted_goes_when_its_owners_sessions_end,
            semaphore_expired_session_releases_and_grants_the_next,
            semaphore_deleted_session_releases_at_once,
            semaphore_refusals_are_typed_and_write_nothing,
            semaphore_feed_wakes_on_a_write,
            coordination_queued_acquire_waits_for_its_grant,
            coordination_set_limit_grants_waiters_and_never_goes_below_use,
            coordination_forced_delete_ends_grants_and_keeps_their_units,
            coordination_watch_ends_at_the_latest_state,
            coordination_errors_are_typed,
            semaphore_names_are_listed_in_pages,
        );
    };
    (@cases #[$test:meta] $harness:expr; $($case:ident),+ $(,)?) => {
        $(
            #[$test]
            async fn $case() {
                $crate::semaphores::$case(&$harness).await;
            }
        )+
    };
}
