//! Opening the store named by a URL, and one store type over all of them.

use std::process::ExitCode;
use std::time::Duration;

use vvm::{
    Inserted, Lease, LeaseConfig, LeaseStore, LeaseValue, Revision, Slot, SlotChange, StoreError,
};
use vvm_adapters::etcd::{EtcdOptions, EtcdStore};
use vvm_adapters::url::StoreUrl;
use vvm_adapters::{MemoryStore, SqliteStore};

use super::{fail, usage_error};

/// Any store the binary can open; a [`LeaseStore`] by delegation.
pub enum AnyStore {
    /// `memory:` — this process only.
    Memory(MemoryStore),
    /// `sqlite:PATH`.
    Sqlite(SqliteStore),
    /// `etcd:HOST:PORT[,…]` (boxed: the client is large next to the others).
    Etcd(Box<EtcdStore>),
    /// `fdb:[CLUSTER-FILE]`, in builds with the `foundationdb` feature.
    #[cfg(feature = "foundationdb")]
    Fdb(Box<fdb::FdbHandle>),
}

/// Why a store could not be opened: a bad URL (exit 2) or a store that failed (exit 1).
pub enum OpenError {
    /// The URL or a value in it is wrong.
    Usage(String),
    /// The store exists but could not be used.
    Failed(String),
}

impl OpenError {
    /// Prints the error and returns the matching exit code.
    pub fn exit(self) -> ExitCode {
        match self {
            OpenError::Usage(message) => usage_error(&message),
            OpenError::Failed(message) => fail(&message),
        }
    }
}

/// Opens the store named by `url`, checking that it can honour `lease`.
pub async fn open_store(url: &str, lease: &LeaseConfig) -> Result<AnyStore, OpenError> {
    let parsed = StoreUrl::parse(url).map_err(|e| OpenError::Usage(e.to_string()))?;
    match parsed {
        StoreUrl::Memory => Ok(AnyStore::Memory(MemoryStore::new())),
        StoreUrl::Sqlite(path) => SqliteStore::open(&path)
            .map(AnyStore::Sqlite)
            .map_err(|e| OpenError::Failed(format!("{}: {e}", path.display()))),
        StoreUrl::Etcd(endpoints) => {
            EtcdStore::check_ttl(lease.lease()).map_err(|e| OpenError::Usage(e.to_string()))?;
            let options =
                EtcdOptions::new(endpoints).map_err(|e| OpenError::Usage(e.to_string()))?;
            let store = EtcdStore::connect(options)
                .await
                .map_err(|e| OpenError::Failed(e.to_string()))?;
            // A server that would lengthen the lease (its minimum TTL is above ours) is refused
            // before launch, never silently rounded.
            store
                .validate(lease)
                .await
                .map_err(|e| OpenError::Failed(e.to_string()))?;
            Ok(AnyStore::Etcd(Box::new(store)))
        }
        #[cfg(feature = "foundationdb")]
        StoreUrl::Fdb(cluster_file) => fdb::open(cluster_file.as_deref()).map(|h| AnyStore::Fdb(Box::new(h))),
        #[cfg(not(feature = "foundationdb"))]
        StoreUrl::Fdb(_) => Err(OpenError::Usage(
            "fdb: stores need a build with `--features foundationdb` and the FoundationDB client library (libfdb_c)"
                .to_owned(),
        )),
    }
}

impl LeaseStore for AnyStore {
    async fn insert_if_not_exists(
        &self,
        key: Slot,
        value: &LeaseValue,
        ttl: Duration,
    ) -> Result<Option<Revision>, StoreError> {
        match self {
            AnyStore::Memory(s) => s.insert_if_not_exists(key, value, ttl).await,
            AnyStore::Sqlite(s) => s.insert_if_not_exists(key, value, ttl).await,
            AnyStore::Etcd(s) => s.insert_if_not_exists(key, value, ttl).await,
            #[cfg(feature = "foundationdb")]
            AnyStore::Fdb(h) => h.store.insert_if_not_exists(key, value, ttl).await,
        }
    }

    async fn insert_or_time_left(
        &self,
        key: Slot,
        value: &LeaseValue,
        ttl: Duration,
    ) -> Result<Inserted, StoreError> {
        match self {
            AnyStore::Memory(s) => s.insert_or_time_left(key, value, ttl).await,
            AnyStore::Sqlite(s) => s.insert_or_time_left(key, value, ttl).await,
            AnyStore::Etcd(s) => s.insert_or_time_left(key, value, ttl).await,
            #[cfg(feature = "foundationdb")]
            AnyStore::Fdb(h) => h.store.insert_or_time_left(key, value, ttl).await,
        }
    }

    async fn compare_and_swap(
        &self,
        key: Slot,
        expected: &Lease,
        new_value: &LeaseValue,
        ttl: Duration,
    ) -> Result<Option<Revision>, StoreError> {
        match self {
            AnyStore::Memory(s) => s.compare_and_swap(key, expected, new_value, ttl).await,
            AnyStore::Sqlite(s) => s.compare_and_swap(key, expected, new_value, ttl).await,
            AnyStore::Etcd(s) => s.compare_and_swap(key, expected, new_value, ttl).await,
            #[cfg(feature = "foundationdb")]
            AnyStore::Fdb(h) => {
                h.store
                    .compare_and_swap(key, expected, new_value, ttl)
                    .await
            }
        }
    }

    async fn compare_and_delete(&self, key: Slot, expected: &Lease) -> Result<bool, StoreError> {
        match self {
            AnyStore::Memory(s) => s.compare_and_delete(key, expected).await,
            AnyStore::Sqlite(s) => s.compare_and_delete(key, expected).await,
            AnyStore::Etcd(s) => s.compare_and_delete(key, expected).await,
            #[cfg(feature = "foundationdb")]
            AnyStore::Fdb(h) => h.store.compare_and_delete(key, expected).await,
        }
    }

    async fn get(&self, key: Slot) -> Result<Option<Lease>, StoreError> {
        match self {
            AnyStore::Memory(s) => s.get(key).await,
            AnyStore::Sqlite(s) => s.get(key).await,
            AnyStore::Etcd(s) => s.get(key).await,
            #[cfg(feature = "foundationdb")]
            AnyStore::Fdb(h) => h.store.get(key).await,
        }
    }

    fn has_change_feed(&self) -> bool {
        match self {
            AnyStore::Memory(s) => s.has_change_feed(),
            AnyStore::Sqlite(s) => s.has_change_feed(),
            AnyStore::Etcd(s) => s.has_change_feed(),
            #[cfg(feature = "foundationdb")]
            AnyStore::Fdb(h) => h.store.has_change_feed(),
        }
    }

    async fn time_left(&self, key: Slot) -> Result<Option<Duration>, StoreError> {
        match self {
            AnyStore::Memory(s) => s.time_left(key).await,
            AnyStore::Sqlite(s) => s.time_left(key).await,
            AnyStore::Etcd(s) => s.time_left(key).await,
            #[cfg(feature = "foundationdb")]
            AnyStore::Fdb(h) => h.store.time_left(key).await,
        }
    }

    // Forwarded explicitly: the default would hide the feeds of the stores that have one.
    fn changed(&self, keys: &[Slot]) -> SlotChange {
        match self {
            AnyStore::Memory(s) => s.changed(keys),
            AnyStore::Sqlite(s) => s.changed(keys),
            AnyStore::Etcd(s) => s.changed(keys),
            #[cfg(feature = "foundationdb")]
            AnyStore::Fdb(h) => h.store.changed(keys),
        }
    }
}

/// FoundationDB: its client needs a network thread, started once per process.
#[cfg(feature = "foundationdb")]
mod fdb {
    use std::path::Path;

    use vvm_adapters::foundationdb::{FdbStore, NetworkAutoStop};
    use vvm_adapters::txkv::TxOptions;

    use super::OpenError;

    /// The store and the network thread it runs on. Fields drop in order: the store first.
    pub struct FdbHandle {
        pub store: FdbStore,
        _network: NetworkAutoStop,
    }

    /// Starts the network thread and opens the database named by `cluster_file` (or the
    /// default cluster file).
    #[allow(unsafe_code)]
    pub fn open(cluster_file: Option<&Path>) -> Result<FdbHandle, OpenError> {
        // SAFETY: the network may be booted once per process, and its guard must be dropped
        // before the process exits. This binary opens exactly one store per process (one `run`
        // or `status`), and the guard lives inside that store, which is dropped when the command
        // returns and its runtime shuts down, before `main` returns.
        let network = unsafe { vvm_adapters::foundationdb::boot() };
        let store = vvm_adapters::foundationdb::open(&network, cluster_file, TxOptions::default())
            .map_err(|e| OpenError::Failed(e.to_string()))?;
        Ok(FdbHandle {
            store,
            _network: network,
        })
    }
}
