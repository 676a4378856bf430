//! Opening the store a [store URL](crate::url) names, and [`AnyStore`], one [`LeaseStore`] over
//! every store of this build (feature `open`; each store also needs its own feature).
//!
//! ```
//! # #[tokio::main(flavor = "current_thread")] async fn main() {
//! use vvm_adapters::open::{open, AnyStore};
//! use vvm_core::LeaseConfig;
//!
//! let store = open("memory:", &LeaseConfig::default()).await.unwrap();
//! assert!(matches!(store, AnyStore::Memory(_)));
//! let refused = open("etcd://h:1?password=x", &LeaseConfig::default()).await.unwrap_err();
//! assert!(refused.is_usage());
//! # }
//! ```

use std::time::Duration;

use vvm_core::{LeaseConfig, Revision, Slot};
use vvm_runtime::{Inserted, Lease, LeaseStore, LeaseValue, SlotChange, StoreError};

use crate::url::{StoreUrl, UrlError};

mod files;

#[cfg(any(feature = "etcd", feature = "postgres"))]
use files::read_file;
pub use files::{ParameterFile, PemKind};

/// Largest secret or certificate file read for a store URL, in bytes.
pub const FILE_MAX_BYTES: u64 = 1024 * 1024;

/// Any store this build can open; a [`LeaseStore`] by delegation to the one inside. Cloning
/// shares the store (its connection, file or client), as cloning the store inside does, so one
/// `AnyStore` serves a `Vvm`, `Elections`, `Coordination` and a `SessionHandle` alike.
#[derive(Clone)]
#[non_exhaustive]
pub enum AnyStore {
    /// `memory:` — this process only.
    #[cfg(feature = "memory")]
    Memory(crate::MemoryStore),
    /// `sqlite:PATH`.
    #[cfg(feature = "sqlite")]
    Sqlite(crate::SqliteStore),
    /// `etcd://…` (boxed: the client is large next to the others).
    #[cfg(feature = "etcd")]
    Etcd(Box<crate::EtcdStore>),
    /// `fdb:[CLUSTER-FILE]`, opened by [`open_fdb`].
    #[cfg(feature = "foundationdb")]
    Fdb(Box<FdbHandle>),
    /// `postgres://…`.
    #[cfg(feature = "postgres")]
    Postgres(crate::postgres::PgStore),
}

impl std::fmt::Debug for AnyStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let name = match self {
            #[cfg(feature = "memory")]
            AnyStore::Memory(_) => "memory",
            #[cfg(feature = "sqlite")]
            AnyStore::Sqlite(_) => "sqlite",
            #[cfg(feature = "etcd")]
            AnyStore::Etcd(_) => "etcd",
            #[cfg(feature = "foundationdb")]
            AnyStore::Fdb(_) => "fdb",
            #[cfg(feature = "postgres")]
            AnyStore::Postgres(_) => "postgres",
            #[allow(unreachable_patterns)]
            _ => "none",
        };
        f.debug_tuple("AnyStore").field(&name).finish()
    }
}

/// Why a store could not be opened. [`is_usage`](Self::is_usage) tells a wrong URL or value
/// from a store that failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum OpenError {
    /// The URL is wrong.
    #[error("bad store URL")]
    Url(#[from] UrlError),
    /// The URL names a store this build does not have.
    #[error("{scheme}: stores need a build with the `{feature}` feature")]
    NotBuilt {
        /// The scheme.
        scheme: &'static str,
        /// The cargo feature that adds it.
        feature: &'static str,
    },
    /// `fdb:` stores need the network thread that only `open_fdb` (feature `foundationdb`) is given.
    #[error("fdb: stores are opened with open_fdb, which takes the FoundationDB network guard")]
    FdbNeedsNetwork,
    /// A file named by a parameter could not be read.
    #[error("parameter {parameter}: cannot read {path}")]
    ReadFile {
        /// The parameter.
        parameter: &'static str,
        /// The file (shown redacted when it holds a secret).
        path: ParameterFile,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// A file named by a parameter is not a regular file (a FIFO, a device, a directory): it
    /// is not opened for reading, which could wait forever.
    #[error("parameter {parameter}: {path} is not a regular file")]
    ParameterNotAFile {
        /// The parameter.
        parameter: &'static str,
        /// The file (shown redacted when it holds a secret).
        path: ParameterFile,
    },
    /// A file named by a parameter is larger than [`FILE_MAX_BYTES`] or empty.
    #[error("parameter {parameter}: {path} is empty or larger than {max} bytes")]
    FileSize {
        /// The parameter.
        parameter: &'static str,
        /// The file (shown redacted when it holds a secret).
        path: ParameterFile,
        /// [`FILE_MAX_BYTES`].
        max: u64,
    },
    /// A certificate or key file named by a parameter does not hold what it must.
    #[error("parameter {parameter}: {path} does not hold {expected}")]
    NotPem {
        /// The parameter.
        parameter: &'static str,
        /// The file (shown redacted when it holds a secret).
        path: ParameterFile,
        /// What it should hold.
        expected: PemKind,
    },
    /// The path of a `sqlite:` URL exists but is not a regular file (a device, a directory, a
    /// pipe, ...). Nothing is created next to it.
    #[error("{} exists and is not a regular file; a SQLite store must be a file of its own", .path.display())]
    NotAFile {
        /// The path.
        path: std::path::PathBuf,
    },
    /// The SQLite store could not be opened.
    #[cfg(feature = "sqlite")]
    #[error("cannot open the SQLite store")]
    Sqlite(#[source] crate::SqliteStoreError),
    /// An option of the etcd store is not usable (`parameter` says which, when one does).
    #[cfg(feature = "etcd")]
    #[error("the etcd store cannot be set up as asked{}", parameter_name(.parameter))]
    EtcdOption {
        /// The URL parameter at fault, if any.
        parameter: Option<&'static str>,
        /// What etcd's options say.
        #[source]
        source: crate::etcd::EtcdError,
    },
    /// etcd could not be reached, refused the credentials, or would not honour the lease.
    #[cfg(feature = "etcd")]
    #[error("the etcd store failed")]
    Etcd(#[source] crate::etcd::EtcdError),
    /// An option of the PostgreSQL store is not usable.
    #[cfg(feature = "postgres")]
    #[error("the PostgreSQL store cannot be set up as asked (parameter {parameter})")]
    PostgresOption {
        /// The URL parameter at fault.
        parameter: &'static str,
        /// What is wrong.
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    /// PostgreSQL could not be reached, refused the user, or holds a schema this store cannot
    /// use.
    #[cfg(feature = "postgres")]
    #[error("the PostgreSQL store failed")]
    Postgres(#[source] crate::postgres::PgOpenError),
    /// FoundationDB could not be opened.
    #[cfg(feature = "foundationdb")]
    #[error("cannot open FoundationDB")]
    Fdb(#[source] crate::foundationdb::FdbOpenError),
}

#[cfg(feature = "etcd")]
fn parameter_name(parameter: &Option<&'static str>) -> String {
    parameter
        .map(|name| format!(" (parameter {name})"))
        .unwrap_or_default()
}

impl OpenError {
    /// Whether the URL or a value in it is wrong (a host's usage error), rather than a store
    /// that could not be used.
    pub fn is_usage(&self) -> bool {
        match self {
            OpenError::Url(_)
            | OpenError::NotBuilt { .. }
            | OpenError::FdbNeedsNetwork
            | OpenError::NotPem { .. }
            | OpenError::ParameterNotAFile { .. }
            | OpenError::NotAFile { .. } => true,
            #[cfg(feature = "etcd")]
            OpenError::EtcdOption { .. } => true,
            #[cfg(feature = "postgres")]
            OpenError::PostgresOption { .. } => true,
            _ => false,
        }
    }

    /// Whether a read-only open ([`open_read_only`]) found no store where the URL points (a
    /// PostgreSQL schema never made): nothing to read yet, and nothing was created. (A missing
    /// `sqlite:` file is a [`OpenError::Sqlite`] error of its own.)
    pub fn is_absent(&self) -> bool {
        match self {
            #[cfg(feature = "postgres")]
            OpenError::Postgres(crate::postgres::PgOpenError::NoStore { .. }) => true,
            _ => false,
        }
    }

    /// Whether the store could not serve for now — unreachable, or an etcd cluster without a
    /// quorum — rather than set up wrongly: a host may wait for it and open it again, where
    /// every other error (a wrong URL, credentials or certificates refused, a lease the store
    /// cannot honour) is reported at once.
    pub fn is_unavailable(&self) -> bool {
        match self {
            #[cfg(feature = "etcd")]
            OpenError::Etcd(error) => error.is_unavailable(),
            #[cfg(feature = "postgres")]
            OpenError::Postgres(error) => error.is_unavailable(),
            _ => false,
        }
    }
}

/// Opens the store named by `url`, checking that it can honour `lease`. Files named by the URL
/// (password, certificates) are read now. `fdb:` URLs need `open_fdb` (feature `foundationdb`).
pub async fn open(url: &str, lease: &LeaseConfig) -> Result<AnyStore, OpenError> {
    open_url(&StoreUrl::parse(url)?, lease).await
}

/// [`open`] for reading only: opening writes nothing, and a store that does not exist is not
/// created. A `sqlite:` store is opened with `SqliteStoreBuilder::read_only` (it must exist;
/// no write succeeds); a `postgres:` store with
/// `postgres::open_read_only` (its schema must exist: else [`OpenError::is_absent`]); an
/// `etcd:` store without the check that its credentials may write; the others as [`open`]
/// does, since opening them writes nothing.
pub async fn open_read_only(url: &str, lease: &LeaseConfig) -> Result<AnyStore, OpenError> {
    let url = StoreUrl::parse(url)?;
    match &url {
        #[cfg(feature = "sqlite")]
        StoreUrl::Sqlite(sqlite) => {
            refuse_special_file(&sqlite.path)?;
            crate::SqliteStore::builder()
                .read_only()
                .open(&sqlite.path)
                .map(AnyStore::Sqlite)
                .map_err(OpenError::Sqlite)
        }
        #[cfg(feature = "etcd")]
        StoreUrl::Etcd(etcd) => open_etcd(etcd, lease, false).await,
        #[cfg(feature = "postgres")]
        StoreUrl::Postgres(postgres) => open_postgres(postgres, false).await,
        _ => open_url(&url, lease).await,
    }
}

/// [`open`] for a parsed URL.
pub async fn open_url(url: &StoreUrl, lease: &LeaseConfig) -> Result<AnyStore, OpenError> {
    let _ = lease;
    match url {
        #[cfg(feature = "memory")]
        StoreUrl::Memory => Ok(AnyStore::Memory(crate::MemoryStore::new())),
        #[cfg(feature = "sqlite")]
        StoreUrl::Sqlite(sqlite) => {
            refuse_special_file(&sqlite.path)?;
            let mut builder = crate::SqliteStore::builder();
            if let Some(wait) = sqlite.busy_wait {
                builder = builder.busy_wait(wait);
            }
            if sqlite.shared_group {
                builder = builder.sharing(crate::sqlite::Sharing::Group);
            }
            builder
                .open(&sqlite.path)
                .map(AnyStore::Sqlite)
                .map_err(OpenError::Sqlite)
        }
        #[cfg(feature = "etcd")]
        StoreUrl::Etcd(etcd) => open_etcd(etcd, lease, true).await,
        #[cfg(feature = "postgres")]
        StoreUrl::Postgres(postgres) => open_postgres(postgres, true).await,
        StoreUrl::Fdb(_) if cfg!(feature = "foundationdb") => Err(OpenError::FdbNeedsNetwork),
        other => Err(OpenError::NotBuilt {
            scheme: other.scheme(),
            feature: match other {
                StoreUrl::Memory => "memory",
                StoreUrl::Sqlite(_) => "sqlite",
                StoreUrl::Etcd(_) => "etcd",
                StoreUrl::Postgres(_) => "postgres",
                _ => "foundationdb",
            },
        }),
    }
}

/// Opens an etcd store; `write`: for a holder, whose credentials must be allowed to write the
/// prefix (checked now: a refusal is permanent, not a failure to retry).
#[cfg(feature = "etcd")]
async fn open_etcd(
    url: &crate::url::EtcdUrl,
    lease: &LeaseConfig,
    write: bool,
) -> Result<AnyStore, OpenError> {
    use crate::etcd::{Credentials, EtcdOptions, EtcdStore};

    let option = |parameter| move |source| OpenError::EtcdOption { parameter, source };
    EtcdStore::check_ttl(lease.lease()).map_err(option(None))?;
    let mut options = EtcdOptions::new(url.endpoints.iter().cloned()).map_err(option(None))?;
    if let Some(prefix) = &url.prefix {
        options = options
            .prefix(prefix.as_str())
            .map_err(option(Some("prefix")))?;
    }
    if let Some(timeout) = url.connect_timeout {
        options = options
            .connect_timeout(timeout)
            .map_err(option(Some("connect-timeout-ms")))?;
    }
    if let Some(timeout) = url.request_timeout {
        options = options
            .request_timeout(timeout)
            .map_err(option(Some("request-timeout-ms")))?;
    }
    if let (Some(user), Some(file)) = (&url.user, &url.password_file) {
        if url.ca.is_none() {
            files::warn_plain_credentials();
        }
        let password = read_file("password-file", file)?;
        let password = String::from_utf8(password).map_err(|error| OpenError::ReadFile {
            parameter: "password-file",
            path: ParameterFile::new("password-file", file),
            source: std::io::Error::new(std::io::ErrorKind::InvalidData, error),
        })?;
        // The first line: files written by `echo` end with a newline that is not part of it.
        let password = password.lines().next().unwrap_or_default();
        options = options.credentials(Credentials::new(user.as_str(), password));
    }
    options = with_tls(options, url)?;
    let store = EtcdStore::connect(options).await.map_err(OpenError::Etcd)?;
    // A server that would lengthen the lease (its minimum TTL is above ours) is refused before
    // launch, never silently rounded.
    store.validate(lease).await.map_err(OpenError::Etcd)?;
    if write {
        store.check_writable().await.map_err(OpenError::Etcd)?;
    }
    Ok(AnyStore::Etcd(Box::new(store)))
}

/// Opens a PostgreSQL store; `write`: for a holder, creating its schema on first use (without,
/// the schema must exist, and nothing is written).
#[cfg(feature = "postgres")]
async fn open_postgres(url: &crate::url::PostgresUrl, write: bool) -> Result<AnyStore, OpenError> {
    use crate::postgres::{PgConfig, PgSslMode};
    use crate::txkv::TxOptions;
    use crate::url::SslMode;

    let option = |parameter: &'static str| {
        move |source: Box<dyn std::error::Error + Send + Sync>| OpenError::PostgresOption {
            parameter,
            source,
        }
    };
    let mut config = PgConfig::new(&url.host, url.port, &url.user, &url.dbname)
        .map_err(|error| option("user")(error.into()))?;
    if let Some(schema) = &url.schema {
        config = config
            .schema(schema)
            .map_err(|error| option("schema")(error.into()))?;
    }
    if let Some(timeout) = url.connect_timeout {
        config = config.connect_timeout(timeout);
    }
    if let Some(connections) = url.connections {
        config = config
            .connections_max(connections)
            .map_err(|error| option("connections")(error.into()))?;
    }
    config = config
        .advisory_lock_marks(url.advisory_lock)
        .map_err(|error| option("death")(error.into()))?;
    if let Some(file) = &url.password_file {
        let password = read_file("password-file", file)?;
        let password = String::from_utf8(password).map_err(|error| OpenError::ReadFile {
            parameter: "password-file",
            path: ParameterFile::new("password-file", file),
            source: std::io::Error::new(std::io::ErrorKind::InvalidData, error),
        })?;
        // The first line: files written by `echo` end with a newline that is not part of it.
        config = config.password(password.lines().next().unwrap_or_default());
    }
    if let Some(mode) = url.sslmode {
        config = config
            .ssl_mode(match mode {
                SslMode::Disable => PgSslMode::Disable,
                SslMode::Prefer => PgSslMode::Prefer,
                SslMode::Require => PgSslMode::Require,
                SslMode::VerifyCa => PgSslMode::VerifyCa,
                SslMode::VerifyFull => PgSslMode::VerifyFull,
            })
            .map_err(|error| option("sslmode")(error.into()))?;
    }
    config = with_pg_tls(config, url)?;
    let mut options = TxOptions::default();
    if let Some(prefix) = &url.prefix {
        options = options
            .prefix(prefix.as_str())
            .map_err(|error| option("prefix")(error.into()))?;
    }
    let store = if write {
        crate::postgres::open(config, options).await
    } else {
        crate::postgres::open_read_only(config, options).await
    };
    let store = store.map_err(|error| match error {
        // Certificates that do not fit are the URL's to correct, as a PEM file is.
        #[cfg(feature = "postgres-tls")]
        crate::postgres::PgOpenError::Tls(source) => {
            let parameter = match source {
                crate::postgres::PgTlsError::Identity(_) => "cert",
                _ => "ca",
            };
            option(parameter)(source.into())
        }
        error => OpenError::Postgres(error),
    })?;
    Ok(AnyStore::Postgres(store))
}

/// The certificates of a `postgres:` URL (`ca=`, `cert=`, `key=`), read and checked now.
#[cfg(feature = "postgres-tls")]
fn with_pg_tls(
    config: crate::postgres::PgConfig,
    url: &crate::url::PostgresUrl,
) -> Result<crate::postgres::PgConfig, OpenError> {
    use files::read_pem;

    let ca_pem = match &url.ca {
        Some(ca) => Some(read_pem("ca", ca, PemKind::Certificate)?),
        None => None,
    };
    let identity_pem = match (&url.cert, &url.key) {
        (Some(cert), Some(key)) => Some((
            read_pem("cert", cert, PemKind::Certificate)?,
            read_pem("key", key, PemKind::PrivateKey)?,
        )),
        _ => None,
    };
    Ok(config.tls(crate::postgres::PgTls {
        ca_pem,
        identity_pem,
    }))
}

/// Without `postgres-tls`, a URL that names certificates is refused: they would be ignored.
#[cfg(all(feature = "postgres", not(feature = "postgres-tls")))]
fn with_pg_tls(
    config: crate::postgres::PgConfig,
    url: &crate::url::PostgresUrl,
) -> Result<crate::postgres::PgConfig, OpenError> {
    match (&url.ca, &url.cert) {
        (None, None) => Ok(config),
        _ => Err(OpenError::NotBuilt {
            scheme: "postgres (ca=, cert=)",
            feature: "postgres-tls",
        }),
    }
}

#[cfg(feature = "etcd-tls")]
fn with_tls(
    options: crate::etcd::EtcdOptions,
    url: &crate::url::EtcdUrl,
) -> Result<crate::etcd::EtcdOptions, OpenError> {
    let Some(ca) = &url.ca else {
        return Ok(options);
    };
    use files::read_pem;

    let ca_pem = read_pem("ca", ca, PemKind::Certificate)?;
    let identity_pem = match (&url.cert, &url.key) {
        (Some(cert), Some(key)) => Some((
            read_pem("cert", cert, PemKind::Certificate)?,
            read_pem("key", key, PemKind::PrivateKey)?,
        )),
        _ => None,
    };
    Ok(options.tls(crate::etcd::EtcdTls {
        ca_pem: Some(ca_pem),
        identity_pem,
        domain: url.server_name.clone(),
    }))
}

#[cfg(all(feature = "etcd", not(feature = "etcd-tls")))]
fn with_tls(
    options: crate::etcd::EtcdOptions,
    url: &crate::url::EtcdUrl,
) -> Result<crate::etcd::EtcdOptions, OpenError> {
    match url.ca {
        Some(_) => Err(OpenError::NotBuilt {
            scheme: "etcd (ca=)",
            feature: "etcd-tls",
        }),
        None => Ok(options),
    }
}

/// Refuses a `sqlite:` path that exists and is neither a regular file nor a link (links are
/// the store's to refuse, with its own explanation): SQLite would otherwise open a device such
/// as `/dev/zero` and leave a journal beside it.
#[cfg(feature = "sqlite")]
fn refuse_special_file(path: &std::path::Path) -> Result<(), OpenError> {
    match std::fs::symlink_metadata(path) {
        Ok(metadata) if !metadata.is_file() && !metadata.file_type().is_symlink() => {
            Err(OpenError::NotAFile {
                path: path.to_path_buf(),
            })
        }
        // Absent, a file, a link, or unreadable: the store's own checks decide.
        _ => Ok(()),
    }
}

/// A FoundationDB store and the network thread it runs on. Fields drop in order: the store
/// first, then the guard that stops the network (shared by clones: the last one stops it).
#[cfg(feature = "foundationdb")]
#[derive(Clone)]
pub struct FdbHandle {
    store: crate::foundationdb::FdbStore,
    _network: std::sync::Arc<crate::foundationdb::NetworkAutoStop>,
}

#[cfg(feature = "foundationdb")]
impl std::fmt::Debug for FdbHandle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FdbHandle").finish_non_exhaustive()
    }
}

/// Opens the `fdb:` store `url` names on the network thread that `network` guards (started
/// with the `unsafe` [`crate::foundationdb::boot`], which this crate cannot call). The guard
/// lives in the returned store.
#[cfg(feature = "foundationdb")]
pub fn open_fdb(
    url: &StoreUrl,
    network: crate::foundationdb::NetworkAutoStop,
) -> Result<AnyStore, OpenError> {
    let StoreUrl::Fdb(cluster_file) = url else {
        return Err(OpenError::NotBuilt {
            scheme: url.scheme(),
            feature: "open",
        });
    };
    let store = crate::foundationdb::open(
        &network,
        cluster_file.as_deref(),
        crate::txkv::TxOptions::default(),
    )
    .map_err(OpenError::Fdb)?;
    Ok(AnyStore::Fdb(Box::new(FdbHandle {
        store,
        _network: std::sync::Arc::new(network),
    })))
}

/// Runs `$call` on the store inside `$any`, bound to `$s`, whichever it is: one line per
/// [`LeaseStore`] method below, and nothing to edit here when a store is added but its arm.
macro_rules! each_store {
    ($any:expr, $s:ident => $call:expr) => {
        match $any {
            #[cfg(feature = "memory")]
            AnyStore::Memory($s) => $call,
            #[cfg(feature = "sqlite")]
            AnyStore::Sqlite($s) => $call,
            #[cfg(feature = "etcd")]
            AnyStore::Etcd($s) => {
                let $s: &crate::EtcdStore = $s;
                $call
            }
            #[cfg(feature = "foundationdb")]
            AnyStore::Fdb(handle) => {
                let $s = &handle.store;
                $call
            }
            #[cfg(feature = "postgres")]
            AnyStore::Postgres($s) => $call,
        }
    };
}

impl AnyStore {
    /// Whether the sessions of this store take liveness marks (PostgreSQL with
    /// `death=advisory-lock`), which only a holder on a session has: a host that wants them
    /// holds its slots on a session.
    pub fn takes_session_marks(&self) -> bool {
        match self {
            #[cfg(feature = "postgres")]
            AnyStore::Postgres(store) => store.kv().config().takes_marks(),
            #[allow(unreachable_patterns)]
            _ => false,
        }
    }
}

impl LeaseStore for AnyStore {
    async fn insert_if_not_exists(
        &self,
        key: Slot,
        value: &LeaseValue,
        ttl: Duration,
    ) -> Result<Option<Revision>, StoreError> {
        each_store!(self, s => s.insert_if_not_exists(key, value, ttl).await)
    }

    async fn compare_and_swap(
        &self,
        key: Slot,
        expected: &Lease,
        new_value: &LeaseValue,
        ttl: Duration,
    ) -> Result<Option<Revision>, StoreError> {
        each_store!(self, s => s.compare_and_swap(key, expected, new_value, ttl).await)
    }

    async fn compare_and_delete(&self, key: Slot, expected: &Lease) -> Result<bool, StoreError> {
        each_store!(self, s => s.compare_and_delete(key, expected).await)
    }

    async fn get(&self, key: Slot) -> Result<Option<Lease>, StoreError> {
        each_store!(self, s => s.get(key).await)
    }

    async fn time_left(&self, key: Slot) -> Result<Option<Duration>, StoreError> {
        each_store!(self, s => s.time_left(key).await)
    }

    async fn insert_or_time_left(
        &self,
        key: Slot,
        value: &LeaseValue,
        ttl: Duration,
    ) -> Result<Inserted, StoreError> {
        each_store!(self, s => s.insert_or_time_left(key, value, ttl).await)
    }

    fn has_change_feed(&self) -> bool {
        each_store!(self, s => s.has_change_feed())
    }

    // Forwarded explicitly: the default would hide the feeds of the stores that have one.
    fn changed(&self, keys: &[Slot]) -> SlotChange {
        each_store!(self, s => s.changed(keys))
    }

    fn changed_for_candidate(&self, keys: &[Slot]) -> SlotChange {
        each_store!(self, s => s.changed_for_candidate(keys))
    }
}

impl vvm_runtime::SessionStore for AnyStore {
    async fn create_session(
        &self,
        key: vvm_core::SessionKey,
        value: &LeaseValue,
        ttl: Duration,
    ) -> Result<Option<Revision>, StoreError> {
        each_store!(self, s => s.create_session(key, value, ttl).await)
    }

    async fn keep_alive(
        &self,
        key: vvm_core::SessionKey,
        expected: Revision,
        ttl: Duration,
    ) -> Result<Option<Revision>, StoreError> {
        each_store!(self, s => s.keep_alive(key, expected, ttl).await)
    }

    async fn delete_session(
        &self,
        key: vvm_core::SessionKey,
        expected: Revision,
    ) -> Result<bool, StoreError> {
        each_store!(self, s => s.delete_session(key, expected).await)
    }

    async fn get_session(
        &self,
        key: vvm_core::SessionKey,
    ) -> Result<Option<vvm_runtime::SessionRecord>, StoreError> {
        each_store!(self, s => s.get_session(key).await)
    }

    async fn acquire(
        &self,
        slot: Slot,
        key: vvm_core::SessionKey,
    ) -> Result<vvm_runtime::Acquired, StoreError> {
        each_store!(self, s => s.acquire(slot, key).await)
    }

    async fn acquire_batch(
        &self,
        slots: Vec<Slot>,
        key: vvm_core::SessionKey,
    ) -> Result<Vec<vvm_runtime::Acquired>, StoreError> {
        each_store!(self, s => s.acquire_batch(slots, key).await)
    }

    // Forwarded explicitly: the default would hide the marks of the stores that keep them.
    fn mark_lost(&self, key: vvm_core::SessionKey) -> vvm_runtime::MarkLost {
        each_store!(self, s => s.mark_lost(key))
    }
}

impl vvm_runtime::SemaphoreStore for AnyStore {
    async fn semaphore(
        &self,
        session: vvm_core::SessionKey,
        name: &vvm_core::semaphore::SemaphoreName,
        request: vvm_runtime::SemaphoreRequest,
    ) -> Result<vvm_runtime::Applied, vvm_runtime::SemaphoreStoreError> {
        each_store!(self, s => s.semaphore(session, name, request).await)
    }

    fn semaphore_changed(
        &self,
        name: &vvm_core::semaphore::SemaphoreName,
    ) -> vvm_runtime::SemaphoreChange {
        each_store!(self, s => s.semaphore_changed(name))
    }

    async fn semaphore_names(
        &self,
        page: &vvm_runtime::NamesPage,
    ) -> Result<vvm_runtime::SemaphoreNames, StoreError> {
        each_store!(self, s => s.semaphore_names(page).await)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // covers: Pg.Tls, Url.Pem
    #[cfg(feature = "postgres-tls")]
    #[tokio::test]
    async fn postgres_certificate_files_are_checked_before_connecting() {
        let lease = LeaseConfig::default();
        let dir = std::env::temp_dir().join(format!("vvm-open-pg-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let junk = dir.join("junk.pem");
        std::fs::write(&junk, b"not a certificate\n").unwrap();
        // PEM blocks whose contents are no certificate: read, then refused by rustls.
        let fake = dir.join("fake.pem");
        std::fs::write(
            &fake,
            b"-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n",
        )
        .unwrap();
        // Port 1: nothing listens; each refusal comes before any connection is tried.
        let base = "postgres://vvm@127.0.0.1:1/d?sslmode=verify-full";
        for (url, parameter) in [
            (format!("{base}&ca={}", junk.display()), "ca"),
            (format!("{base}&ca=/nonexistent/vvm-ca.pem"), "ca"),
            (
                format!(
                    "{base}&ca={}&cert={}&key={}",
                    fake.display(),
                    junk.display(),
                    junk.display()
                ),
                "cert",
            ),
            (
                format!(
                    "{base}&ca={}&cert={}&key={}",
                    fake.display(),
                    fake.display(),
                    junk.display()
                ),
                "key",
            ),
        ] {
            let refused = open(&url, &lease).await.unwrap_err();
            let named = match &refused {
                OpenError::NotPem { parameter, .. } | OpenError::ReadFile { parameter, .. } => {
                    *parameter
                }
                other => panic!("{url}: {other:?}"),
            };
            assert_eq!(named, parameter, "{url}");
        }
        let refused = open(&format!("{base}&ca={}", fake.display()), &lease)
            .await
            .unwrap_err();
        assert!(
            matches!(
                refused,
                OpenError::PostgresOption {
                    parameter: "ca",
                    ..
                }
            ),
            "{refused:?}"
        );
        assert!(refused.is_usage());
        // A FIFO is not opened for reading (which could wait forever): refused at once.
        let fifo = dir.join("fifo");
        rustix::fs::mknodat(
            rustix::fs::CWD,
            &fifo,
            rustix::fs::FileType::Fifo,
            rustix::fs::Mode::from_raw_mode(0o600),
            0,
        )
        .unwrap();
        let refused = open(&format!("{base}&ca={}", fifo.display()), &lease)
            .await
            .unwrap_err();
        assert!(
            matches!(
                refused,
                OpenError::ParameterNotAFile {
                    parameter: "ca",
                    ..
                }
            ),
            "{refused:?}"
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }

    // covers: Url.Open
    #[cfg(feature = "sqlite")]
    #[tokio::test]
    async fn sqlite_urls_open_with_their_options() {
        let dir = std::env::temp_dir().join(format!("vvm-open-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("leases.db");
        let url = format!("sqlite:{}?busy-wait-ms=5", path.display());
        let store = open(&url, &LeaseConfig::default()).await.unwrap();
        assert!(matches!(store, AnyStore::Sqlite(_)), "{store:?}");
        assert!(path.exists());
        // A directory is no store: refused before SQLite sees it.
        let refused = open(
            &format!("sqlite:{}", dir.display()),
            &LeaseConfig::default(),
        )
        .await
        .unwrap_err();
        assert!(matches!(refused, OpenError::NotAFile { .. }), "{refused:?}");
        assert!(refused.is_usage());
        std::fs::remove_dir_all(&dir).unwrap();
    }

    // covers: Url.Open
    #[cfg(feature = "memory")]
    #[tokio::test]
    async fn url_errors_are_usage_errors_with_their_source() {
        let refused = open("redis:x", &LeaseConfig::default()).await.unwrap_err();
        assert!(refused.is_usage());
        assert!(matches!(
            std::error::Error::source(&refused)
                .and_then(|source| source.downcast_ref::<UrlError>()),
            Some(UrlError::UnknownScheme(_))
        ));
        let memory = open("memory:", &LeaseConfig::default()).await.unwrap();
        assert_eq!(memory.get(Slot(1)).await.unwrap(), None);
    }

    // covers: Url.Open
    #[cfg(feature = "etcd")]
    #[tokio::test]
    async fn etcd_files_and_options_are_checked_before_connecting() {
        let lease = LeaseConfig::default();
        let missing = open(
            "etcd://127.0.0.1:1/?user=u&password-file=/nonexistent/vvm-pw",
            &lease,
        )
        .await
        .unwrap_err();
        assert!(
            matches!(
                &missing,
                OpenError::ReadFile {
                    parameter: "password-file",
                    ..
                }
            ),
            "{missing:?}"
        );
        let dir = std::env::temp_dir().join(format!("vvm-open-etcd-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let empty = dir.join("empty");
        std::fs::write(&empty, b"").unwrap();
        let refused = open(
            &format!(
                "etcd://127.0.0.1:1/?user=u&password-file={}",
                empty.display()
            ),
            &lease,
        )
        .await
        .unwrap_err();
        assert!(
            matches!(
                &refused,
                OpenError::FileSize {
                    parameter: "password-file",
                    ..
                }
            ),
            "{refused:?}"
        );
        std::fs::remove_dir_all(&dir).unwrap();
        let long = format!("etcd://127.0.0.1:1/?prefix={}", "p".repeat(300));
        let refused = open(&long, &lease).await.unwrap_err();
        assert!(
            matches!(
                &refused,
                OpenError::EtcdOption {
                    parameter: Some("prefix"),
                    ..
                }
            ),
            "{refused:?}"
        );
        assert!(refused.is_usage());
        assert!(refused.to_string().contains("prefix"));
        // Not a whole number of seconds: refused before any connection.
        let short = LeaseConfig::new(Duration::from_millis(4500)).unwrap();
        let refused = open("etcd://127.0.0.1:1", &short).await.unwrap_err();
        assert!(matches!(
            refused,
            OpenError::EtcdOption {
                parameter: None,
                ..
            }
        ));
        #[cfg(not(feature = "etcd-tls"))]
        {
            let refused = open("etcd://127.0.0.1:1/?ca=/x", &lease).await.unwrap_err();
            assert!(matches!(
                refused,
                OpenError::NotBuilt {
                    feature: "etcd-tls",
                    ..
                }
            ));
        }
    }
}
