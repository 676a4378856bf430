//! The PostgreSQL store (feature `postgres`): the lease logic of
//! [`TxLeaseStore`] (expiry by observation) over a thin [`TxKv`]
//! mapping of PostgreSQL transactions on one table.
//!
//! | [`TxKv`] | PostgreSQL |
//! |---|---|
//! | `begin` | nothing yet; the first read (or the commit) takes a pooled connection and runs `BEGIN ISOLATION LEVEL SERIALIZABLE` |
//! | `get` / `range` | `SELECT` on `<schema>.vvm_kv (key bytea primary key, value bytea)`, merged with the transaction's own writes |
//! | `set` / `clear` | kept in the transaction, sent as `INSERT … ON CONFLICT DO UPDATE` / `DELETE` right before `COMMIT` |
//! | `commit` | `COMMIT` |
//! | `watch` | `LISTEN`/`NOTIFY` (see below) |
//! | liveness marks (with [`PgConfig::advisory_lock_marks`]) | session-level advisory locks, one connection per session (see the `mark` module) |
//! | [`TxError::Retryable`] | SQLSTATE `40001` (serialization failure), `40P01` (deadlock), `55P03` (lock timeout); nothing committed |
//! | [`TxError::UnknownResult`] | the connection lost while `COMMIT` was under way |
//! | [`TxError::Failed`] | everything else |
//!
//! Range reads are serializable reads here (PostgreSQL has no snapshot reads inside a
//! serializable transaction): stricter than the trait asks, so at worst an extra retry.
//!
//! # Watches
//!
//! A trigger on the table sends `NOTIFY` with the changed key (hex) on the schema's channel,
//! delivered when the writing transaction commits, whoever wrote. One listening connection per
//! store handle serves every watch (a map of key → waiters). A watch, once its transaction
//! committed, re-reads the key after registering: a change is seen whether it came before or
//! after the `LISTEN`. Notifications are lost while the listening connection is down, so when
//! it is (re)established every watch re-reads; and every watch re-reads at least every
//! [`WATCH_REREAD`] whatever it heard, which bounds a loss nothing reported.
//!
//! # Time
//!
//! No server time is used: expiry is judged by observation on each process's monotonic clock
//! (see [`crate::txkv::lease`]), so a step of the server's clock changes nothing.
//!
//! # TLS
//!
//! As libpq's `sslmode` ([`PgSslMode`]), with the certificates of `PgTls` (feature
//! `postgres-tls`; without it, only `disable` and `prefer`, which then connects without TLS):
//!
//! | mode | encrypted | server certificate verified |
//! |---|---|---|
//! | `disable` | no | — |
//! | `prefer` (the default, as libpq's) | when the server offers TLS, else plain | no |
//! | `require` | always; a server without TLS is refused | no; with a CA, its chain (as `verify-ca`, as libpq does when it has a root certificate) |
//! | `verify-ca` | always | its chain up to the CA |
//! | `verify-full` | always | its chain up to the CA, and the host name (or address) it was reached by |
//!
//! `prefer` and `require` without a CA protect against a listener on the network, not against
//! someone who can answer in the server's place: use `verify-full` where that matters. The CA
//! is the one given (`PgTls::ca_pem`), never the platform's roots. Every connection of a
//! store (its transactions, its listener, the one that sets the schema up) uses the same
//! setting. Over a Unix socket the server never speaks TLS: `prefer` connects plainly there,
//! and `require` and stronger are refused by the server's answer. A certificate refused is a
//! setup error ([`PgOpenError::is_unavailable`] is false for it), not an outage to wait out.
//! libpq's `allow` is not offered.

mod listen;
mod mark;
mod schema;
#[cfg(feature = "postgres-tls")]
mod tls;

use std::collections::{BTreeMap, HashMap};
use std::future::Future;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use tokio::sync::{oneshot, OwnedSemaphorePermit, Semaphore};
use tokio_postgres::error::SqlState;
use tokio_postgres::types::Type;
use tokio_postgres::{Client, Statement};

use crate::txkv::{KeyValue, KvTx, MarkFuture, TxError, TxKv, TxLeaseStore, TxOptions};
pub use mark::let_children_inherit_session_marks;
pub use schema::SCHEMA_VERSION;
#[cfg(feature = "postgres-tls")]
pub use tls::{PgTls, PgTlsError};

/// What makes each connection's TLS: rustls with `postgres-tls`, none without.
#[cfg(feature = "postgres-tls")]
type Connector = tls::MakeRustls;
/// What makes each connection's TLS: rustls with `postgres-tls`, none without.
#[cfg(not(feature = "postgres-tls"))]
type Connector = Plain;

/// No TLS: tokio-postgres's `NoTls`, cloned as the rustls connector is (it is not `Copy`).
#[cfg(not(feature = "postgres-tls"))]
#[derive(Clone, Debug)]
struct Plain;

#[cfg(not(feature = "postgres-tls"))]
impl tokio_postgres::tls::MakeTlsConnect<tokio_postgres::Socket> for Plain {
    type Stream = tokio_postgres::tls::NoTlsStream;
    type TlsConnect = tokio_postgres::NoTls;
    type Error = tokio_postgres::tls::NoTlsError;

    fn make_tls_connect(
        &mut self,
        domain: &str,
    ) -> Result<tokio_postgres::NoTls, tokio_postgres::tls::NoTlsError> {
        tokio_postgres::tls::MakeTlsConnect::<tokio_postgres::Socket>::make_tls_connect(
            &mut tokio_postgres::NoTls,
            domain,
        )
    }
}

/// Whether and how the store's connections use TLS: libpq's `sslmode` (see the module
/// documentation's table).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub enum PgSslMode {
    /// Never.
    Disable,
    /// When the server offers it, without verifying its certificate.
    #[default]
    Prefer,
    /// Always; the certificate's chain verified only when a CA is given.
    Require,
    /// Always, with the certificate's chain verified up to the CA.
    VerifyCa,
    /// Always, with the chain verified and the host name checked against the certificate.
    VerifyFull,
}

impl std::fmt::Display for PgSslMode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            PgSslMode::Disable => "disable",
            PgSslMode::Prefer => "prefer",
            PgSslMode::Require => "require",
            PgSslMode::VerifyCa => "verify-ca",
            PgSslMode::VerifyFull => "verify-full",
        })
    }
}

/// The PostgreSQL lease store.
pub type PgStore = TxLeaseStore<PgKv>;

/// Default most connections a store handle uses for its transactions at once (the listening
/// connection of its watches comes on top).
pub const CONNECTIONS_MAX_DEFAULT: usize = 8;
/// Most connections a store handle may be allowed.
pub const CONNECTIONS_LIMIT: usize = 256;
/// Longest wait of a watch between two reads of its key, whatever it heard.
pub const WATCH_REREAD: Duration = Duration::from_secs(10);
/// Most watches waiting at once on one store handle.
pub const WATCHES_MAX: usize = 10_000;
/// Longest schema name, in bytes (PostgreSQL's identifiers have 63; the channel adds 4).
pub const SCHEMA_MAX_BYTES: usize = 48;
/// Default connection timeout.
pub const CONNECT_TIMEOUT_DEFAULT: Duration = Duration::from_secs(5);

/// Where and as whom to connect. `Debug` never shows the password.
#[derive(Clone, PartialEq, Eq)]
pub struct PgConfig {
    host: String,
    port: u16,
    user: String,
    password: Option<String>,
    dbname: String,
    schema: String,
    connect_timeout: Duration,
    connections_max: usize,
    ssl_mode: PgSslMode,
    #[cfg(feature = "postgres-tls")]
    tls: PgTls,
    marks: bool,
}

impl std::fmt::Debug for PgConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PgConfig")
            .field("host", &self.host)
            .field("port", &self.port)
            .field("user", &self.user)
            .field("password", &self.password.as_ref().map(|_| "<redacted>"))
            .field("dbname", &self.dbname)
            .field("schema", &self.schema)
            .field("connect_timeout", &self.connect_timeout)
            .field("connections_max", &self.connections_max)
            .field("ssl_mode", &self.ssl_mode)
            .field("marks", &self.marks)
            .finish_non_exhaustive()
    }
}

/// A bad [`PgConfig`] value.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum PgConfigError {
    /// The schema name is not a plain lower-case identifier of at most [`SCHEMA_MAX_BYTES`].
    #[error("schema name {0:?} must be 1 to {SCHEMA_MAX_BYTES} of a-z, 0-9 and _, not starting with a digit")]
    Schema(String),
    /// Zero connections, or more than [`CONNECTIONS_LIMIT`].
    #[error("connections must be 1 to {CONNECTIONS_LIMIT}, not {0}")]
    Connections(usize),
    /// A host, user or database name that is empty or holds a control character.
    #[error("the {0} is empty or holds a control character")]
    Name(&'static str),
    /// A mode that needs TLS, in a build without the feature `postgres-tls`.
    #[error("sslmode={0} needs TLS, which this build lacks (feature postgres-tls)")]
    TlsNotBuilt(PgSslMode),
    /// Advisory-lock marks with a mode that needs TLS: a mark's connection is a socket this
    /// process opens itself (so that the command's supervisor can keep it), made without TLS.
    #[error("death=advisory-lock cannot be combined with sslmode={0}: a mark's own connection is made without TLS (use sslmode=disable or prefer on a network you trust, or death=ttl)")]
    MarksWithoutTls(PgSslMode),
}

impl PgConfig {
    /// The server at `host` (a name, an address, or the directory of a Unix socket when it
    /// starts with `/`) and `port`, database `dbname`, as `user`, in schema `vvm`.
    pub fn new(host: &str, port: u16, user: &str, dbname: &str) -> Result<Self, PgConfigError> {
        for (name, value) in [("host", host), ("user", user), ("database name", dbname)] {
            if value.is_empty() || value.chars().any(char::is_control) {
                return Err(PgConfigError::Name(name));
            }
        }
        Ok(PgConfig {
            host: host.to_owned(),
            port,
            user: user.to_owned(),
            password: None,
            dbname: dbname.to_owned(),
            schema: "vvm".to_owned(),
            connect_timeout: CONNECT_TIMEOUT_DEFAULT,
            connections_max: CONNECTIONS_MAX_DEFAULT,
            ssl_mode: PgSslMode::default(),
            #[cfg(feature = "postgres-tls")]
            tls: PgTls::default(),
            marks: false,
        })
    }

    /// Whether and how connections use TLS (default [`PgSslMode::Prefer`]). Without the
    /// feature `postgres-tls`, the modes that need TLS are refused.
    pub fn ssl_mode(mut self, mode: PgSslMode) -> Result<Self, PgConfigError> {
        let needs_tls = !matches!(mode, PgSslMode::Disable | PgSslMode::Prefer);
        if !cfg!(feature = "postgres-tls") && needs_tls {
            return Err(PgConfigError::TlsNotBuilt(mode));
        }
        if self.marks && needs_tls {
            return Err(PgConfigError::MarksWithoutTls(mode));
        }
        self.ssl_mode = mode;
        Ok(self)
    }

    /// The certificates TLS uses (none by default): the CA of `verify-ca` and `verify-full`,
    /// a client certificate.
    #[cfg(feature = "postgres-tls")]
    pub fn tls(mut self, tls: PgTls) -> Self {
        self.tls = tls;
        self
    }

    /// The TLS connector of every connection.
    #[cfg(feature = "postgres-tls")]
    fn connector(&self) -> Result<Connector, PgOpenError> {
        tls::MakeRustls::new(self.ssl_mode, &self.tls).map_err(PgOpenError::Tls)
    }

    /// The connector of every connection: none, TLS is not built.
    #[cfg(not(feature = "postgres-tls"))]
    fn connector(&self) -> Result<Connector, PgOpenError> {
        Ok(Plain)
    }

    /// Whether each session of this process holds a session-level advisory lock on a
    /// connection of its own, so that other processes may take over as soon as the server
    /// frees it — when the process died — rather than a TTL later (URL: `death=advisory-lock`;
    /// off by default). The process ends at once when that connection ends while it lives.
    /// Sound only with a direct connection to the primary and no pooler in transaction or
    /// statement mode: see `Pg.Marks` in `specs/stores.md`. Other processes judge a session by
    /// its lock only when its record names one, whatever their own setting.
    ///
    /// A mark's connection is made without TLS: marks are refused
    /// ([`PgConfigError::MarksWithoutTls`]) with an [`ssl_mode`](Self::ssl_mode) that needs it.
    pub fn advisory_lock_marks(mut self, marks: bool) -> Result<Self, PgConfigError> {
        if marks && !matches!(self.ssl_mode, PgSslMode::Disable | PgSslMode::Prefer) {
            return Err(PgConfigError::MarksWithoutTls(self.ssl_mode));
        }
        self.marks = marks;
        Ok(self)
    }

    /// The password (none by default: trust, peer or `.pgpass`-less setups).
    pub fn password(mut self, password: &str) -> Self {
        self.password = Some(password.to_owned());
        self
    }

    /// The schema of the store's tables (default `vvm`).
    pub fn schema(mut self, schema: &str) -> Result<Self, PgConfigError> {
        let mut chars = schema.chars();
        let valid = schema.len() <= SCHEMA_MAX_BYTES
            && chars
                .next()
                .is_some_and(|first| first.is_ascii_lowercase() || first == '_')
            && chars.all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_');
        if !valid {
            return Err(PgConfigError::Schema(schema.chars().take(64).collect()));
        }
        self.schema = schema.to_owned();
        Ok(self)
    }

    /// Bound of one connection attempt (default [`CONNECT_TIMEOUT_DEFAULT`]).
    pub fn connect_timeout(mut self, timeout: Duration) -> Self {
        self.connect_timeout = timeout.max(Duration::from_millis(1));
        self
    }

    /// Most connections used for transactions at once (default [`CONNECTIONS_MAX_DEFAULT`]).
    pub fn connections_max(mut self, connections: usize) -> Result<Self, PgConfigError> {
        if connections == 0 || connections > CONNECTIONS_LIMIT {
            return Err(PgConfigError::Connections(connections));
        }
        self.connections_max = connections;
        Ok(self)
    }

    /// Whether sessions take advisory-lock marks ([`advisory_lock_marks`](Self::advisory_lock_marks)).
    pub fn takes_marks(&self) -> bool {
        self.marks
    }

    /// `user@host:port/dbname`, for messages (no password).
    pub fn target(&self) -> String {
        format!("{}@{}:{}/{}", self.user, self.host, self.port, self.dbname)
    }

    /// The channel the store's trigger notifies on.
    fn channel(&self) -> String {
        format!("vvm.{}", self.schema)
    }

    /// The driver's configuration. `timeout` bounds lock waits and statements, and how long a
    /// transaction may sit idle (a client that stalled holds its locks no longer than that).
    fn driver(&self, timeout: Duration) -> tokio_postgres::Config {
        let millis = timeout.as_millis().max(1);
        let mut config = tokio_postgres::Config::new();
        config
            .host(&self.host)
            .port(self.port)
            .user(&self.user)
            .dbname(&self.dbname)
            .application_name("vvm")
            .connect_timeout(self.connect_timeout)
            .ssl_mode(match self.ssl_mode {
                PgSslMode::Disable => tokio_postgres::config::SslMode::Disable,
                PgSslMode::Prefer => tokio_postgres::config::SslMode::Prefer,
                _ => tokio_postgres::config::SslMode::Require,
            })
            .options(format!(
                "-c lock_timeout={millis} -c statement_timeout={millis} -c idle_in_transaction_session_timeout={}",
                millis * 2
            ));
        if let Some(password) = &self.password {
            config.password(password);
        }
        config
    }
}

/// Why a PostgreSQL store could not be opened.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum PgOpenError {
    /// The server could not be reached or refused the login.
    #[error("cannot connect to PostgreSQL as {target}")]
    Connect {
        /// `user@host:port/dbname`.
        target: String,
        /// What the driver said.
        #[source]
        source: tokio_postgres::Error,
    },
    /// The user lacks a right the store needs.
    #[error("PostgreSQL user {user} lacks {needed}")]
    Privilege {
        /// The user.
        user: String,
        /// The right, and on what.
        needed: String,
    },
    /// The schema was made by a newer vvm.
    #[error(
        "schema {schema} is at version {found}, newer than the {known} this vvm knows: upgrade vvm"
    )]
    NewerSchema {
        /// The schema.
        schema: String,
        /// Its version.
        found: i64,
        /// [`SCHEMA_VERSION`].
        known: i64,
    },
    /// The schema holds tables that are not this store's.
    #[error("schema {schema} is not a vvm store ({reason}); name another with schema=")]
    ForeignSchema {
        /// The schema.
        schema: String,
        /// What is foreign about it.
        reason: &'static str,
    },
    /// Opened for reading only ([`open_read_only`]), and the schema holds no store: nothing
    /// was created.
    #[error("schema {schema} of database {dbname} holds no vvm store yet")]
    NoStore {
        /// The schema.
        schema: String,
        /// The database.
        dbname: String,
    },
    /// The TLS setup (the CA, the client certificate) is not usable.
    #[cfg(feature = "postgres-tls")]
    #[error("the TLS setup towards PostgreSQL is not usable")]
    Tls(#[source] PgTlsError),
    /// Setting the schema up failed otherwise.
    #[error("cannot set up schema {schema}")]
    Setup {
        /// The schema.
        schema: String,
        /// What the server said.
        #[source]
        source: tokio_postgres::Error,
    },
}

impl PgOpenError {
    /// Whether the server could not serve for now (unreachable, the connection lost, starting
    /// up or shutting down), rather than refused the user, the password or the schema.
    pub fn is_unavailable(&self) -> bool {
        let source = match self {
            PgOpenError::Connect { source, .. } | PgOpenError::Setup { source, .. } => source,
            _ => return false,
        };
        match source.code() {
            None => !tls_refused(source),
            Some(code) => [
                SqlState::CANNOT_CONNECT_NOW,
                SqlState::ADMIN_SHUTDOWN,
                SqlState::CRASH_SHUTDOWN,
                SqlState::TOO_MANY_CONNECTIONS,
            ]
            .contains(code),
        }
    }
}

/// Whether the TLS handshake was refused (a certificate not trusted, a server without TLS under
/// `require`): a setup to correct, not an outage. tokio-postgres has no error kind to ask, so
/// the causes are looked at: rustls's error inside the I/O error of the handshake, or the
/// driver's own words for a server that answered "no TLS".
fn tls_refused(error: &tokio_postgres::Error) -> bool {
    let mut cause: Option<&(dyn std::error::Error + 'static)> = Some(error);
    while let Some(current) = cause {
        #[cfg(feature = "postgres-tls")]
        if current
            .downcast_ref::<std::io::Error>()
            .and_then(std::io::Error::get_ref)
            .is_some_and(|inner| inner.is::<rustls::Error>())
        {
            return true;
        }
        if current.to_string() == "server does not support TLS" {
            return true;
        }
        cause = current.source();
    }
    false
}

/// Connects one client with `connector` and runs its connection until the client is dropped
/// or the connection is lost (the client then reports the loss on its next call).
async fn connect_client(
    driver: &tokio_postgres::Config,
    connector: &Connector,
) -> Result<Client, tokio_postgres::Error> {
    let (client, connection) = driver.connect(connector.clone()).await?;
    tokio::spawn(async move {
        let _ = connection.await;
    });
    Ok(client)
}

/// The advisory lock (`pg_advisory_lock`'s bigint key) the session whose record is under
/// `session_key` holds in `schema` when its process opened the store with
/// [`PgConfig::advisory_lock_marks`]: finds that session's connection in `pg_locks` (`classid`
/// its high 32 bits, `objid` its low 32 bits, `objsubid` 1).
pub fn session_lock_key(schema: &str, session_key: &[u8]) -> i64 {
    mark::lock_key(schema, session_key)
}

/// Connects to the server of `config`, creates or checks the store's schema, and returns the
/// lease store over it; `options` bound every operation (and the server-side lock and idle
/// timeouts of its connections).
pub async fn open(config: PgConfig, options: TxOptions) -> Result<PgStore, PgOpenError> {
    let kv = PgKv::connect(config, &options).await?;
    Ok(TxLeaseStore::new(kv, options))
}

/// [`open`] for reading: nothing is written when opening — a schema that does not exist is
/// [`PgOpenError::NoStore`], never created — and the user needs only `SELECT` on the table
/// (and `USAGE` on the schema). The store's operations are those of [`open`]'s; a reader
/// calls only those that read.
pub async fn open_read_only(config: PgConfig, options: TxOptions) -> Result<PgStore, PgOpenError> {
    let kv = PgKv::connect_as(config, &options, false).await?;
    Ok(TxLeaseStore::new(kv, options))
}

/// Why a [`PgKv`] step failed: the cause inside its [`TxError`].
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum PgError {
    /// What the server or the driver said.
    #[error("the PostgreSQL statement failed")]
    Postgres(#[from] tokio_postgres::Error),
    /// The watch's transaction did not commit.
    #[error("watch cancelled: its transaction did not commit")]
    WatchCancelled,
    /// [`WATCHES_MAX`] watches are waiting already.
    #[error("too many watches (at most {WATCHES_MAX})")]
    TooManyWatches,
    /// The connection of a session's liveness mark could not be opened (or timed out).
    #[error("cannot connect for a session's liveness mark")]
    MarkConnect(#[source] std::io::Error),
}

/// PostgreSQL as a [`TxKv`]. Cloning shares the connections and the listener.
#[derive(Clone, Debug)]
pub struct PgKv {
    shared: Arc<Shared>,
}

/// The statements of one connection, prepared once.
struct Conn {
    client: Client,
    get: Statement,
    range: Statement,
    put: Statement,
    delete: Statement,
}

struct Shared {
    config: PgConfig,
    driver: tokio_postgres::Config,
    connector: Connector,
    idle: Mutex<Vec<Conn>>,
    /// One permit per connection in use (idle ones hold none).
    permits: Arc<Semaphore>,
    listener: listen::Listener,
    sql: schema::Sql,
    /// The liveness marks this process holds.
    marks: mark::Marks,
}

impl std::fmt::Debug for Shared {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Shared")
            .field("config", &self.config)
            .finish_non_exhaustive()
    }
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    // Every critical section leaves its value consistent; a poisoned lock is usable.
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

/// A connection taken from the pool, under its permit; handed back with [`Shared::release`]
/// (dropped instead, it is closed, which ends any transaction on it).
struct Checkout {
    conn: Conn,
    permit: Option<OwnedSemaphorePermit>,
    /// Outside a transaction: ready for the next one.
    clean: bool,
}

impl Shared {
    /// Hands a connection back: kept when `clean`; left inside a transaction (a timeout, a
    /// dropped operation), rolled back aside under its permit and kept then; without a runtime,
    /// or lost, closed (which rolls back).
    fn release(self: &Arc<Self>, checkout: Checkout) {
        let Checkout {
            conn,
            permit,
            clean,
        } = checkout;
        if conn.client.is_closed() {
            return;
        }
        if clean {
            self.put_back(conn);
            return;
        }
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            let shared = self.clone();
            runtime.spawn(async move {
                let rollback = conn.client.batch_execute("ROLLBACK");
                if let Ok(Ok(())) = tokio::time::timeout(CONNECT_TIMEOUT_DEFAULT, rollback).await {
                    shared.put_back(conn);
                }
                drop(permit);
            });
        }
    }

    /// Keeps an idle connection for the next transaction (at most `connections_max`).
    fn put_back(&self, conn: Conn) {
        let mut idle = lock(&self.idle);
        if idle.len() < self.config.connections_max {
            idle.push(conn);
        }
    }

    async fn checkout(self: &Arc<Self>) -> Result<Checkout, tokio_postgres::Error> {
        // The semaphore is never closed.
        let permit = self.permits.clone().acquire_owned().await.ok();
        let idle = lock(&self.idle).pop();
        let conn = match idle {
            Some(conn) if !conn.client.is_closed() => conn,
            _ => self.connect().await?,
        };
        Ok(Checkout {
            conn,
            permit,
            clean: false,
        })
    }

    async fn connect(&self) -> Result<Conn, tokio_postgres::Error> {
        let client = connect_client(&self.driver, &self.connector).await?;
        let sql = &self.sql;
        let bytes = [Type::BYTEA, Type::BYTEA];
        Ok(Conn {
            get: client.prepare_typed(&sql.get, &bytes[..1]).await?,
            range: client
                .prepare_typed(&sql.range, &[Type::BYTEA, Type::BYTEA, Type::INT8])
                .await?,
            put: client.prepare_typed(&sql.put, &bytes).await?,
            delete: client.prepare_typed(&sql.delete, &bytes[..1]).await?,
            client,
        })
    }

    /// The value under `key` now, outside any transaction.
    async fn read(self: &Arc<Self>, key: &[u8]) -> Result<Option<Vec<u8>>, TxError> {
        let mut checkout = self.checkout().await.map_err(failed)?;
        let conn = &checkout.conn;
        // On an error the connection is dropped (closed): it may be broken.
        let row = conn
            .client
            .query_opt(&conn.get, &[&key])
            .await
            .map_err(failed)?;
        checkout.clean = true;
        self.release(checkout);
        row.map(|row| row.try_get(0)).transpose().map_err(failed)
    }
}

impl PgKv {
    /// Connects, creates or checks the schema (see the module documentation), and returns the
    /// store's key-value view; `options`' timeout bounds the server-side waits.
    pub async fn connect(config: PgConfig, options: &TxOptions) -> Result<PgKv, PgOpenError> {
        PgKv::connect_as(config, options, true).await
    }

    /// [`connect`](Self::connect); without `write`, the schema is only checked (see
    /// [`open_read_only`]).
    async fn connect_as(
        config: PgConfig,
        options: &TxOptions,
        write: bool,
    ) -> Result<PgKv, PgOpenError> {
        let driver = config.driver(options.operation_timeout());
        let sql = schema::Sql::new(&config.schema);
        let connector = config.connector()?;
        let shared = Arc::new(Shared {
            permits: Arc::new(Semaphore::new(config.connections_max)),
            listener: listen::Listener::new(driver.clone(), connector.clone(), config.channel()),
            connector,
            idle: Mutex::new(Vec::new()),
            config,
            driver,
            sql,
            marks: mark::Marks::default(),
        });
        schema::ensure(&shared, write).await?;
        // With marks, the first session's connection is made now, not under its create's timeout.
        mark::Marks::prepare(&shared).await;
        Ok(PgKv { shared })
    }

    /// The configuration it was opened with.
    pub fn config(&self) -> &PgConfig {
        &self.shared.config
    }

    /// How many watches are waiting.
    pub fn watches(&self) -> usize {
        self.shared.listener.waiting()
    }
}

/// A transaction of [`PgKv`].
pub struct PgTx {
    shared: Arc<Shared>,
    /// The connection, once the transaction began on it.
    checkout: Option<Checkout>,
    writes: BTreeMap<Vec<u8>, Option<Vec<u8>>>,
    /// The value of every key read, as first read.
    seen: HashMap<Vec<u8>, Option<Vec<u8>>>,
    /// The watches made in it, told when it commits.
    watches: Vec<oneshot::Sender<()>>,
}

impl std::fmt::Debug for PgTx {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PgTx")
            .field("begun", &self.checkout.is_some())
            .field("writes", &self.writes.len())
            .finish_non_exhaustive()
    }
}

/// Where in a transaction an error came.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Stage {
    /// Before `COMMIT` was sent: nothing can have been committed.
    Before,
    /// `COMMIT` was sent.
    Commit,
}

fn failed(error: impl Into<PgError>) -> TxError {
    TxError::failed(error.into())
}

/// Maps the driver's error: a serialization failure (or deadlock, or lock timeout) reported by
/// the server is retried; a connection that broke while `COMMIT` was under way leaves the
/// outcome unknown.
fn map_error(error: tokio_postgres::Error, stage: Stage) -> TxError {
    let retryable = [
        SqlState::T_R_SERIALIZATION_FAILURE,
        SqlState::T_R_DEADLOCK_DETECTED,
        SqlState::LOCK_NOT_AVAILABLE,
    ];
    match error.code() {
        Some(code) if retryable.contains(code) => TxError::retryable(PgError::Postgres(error)),
        // The server answered: it did not commit.
        Some(_) => failed(error),
        None if stage == Stage::Commit => TxError::unknown_result(PgError::Postgres(error)),
        None => failed(error),
    }
}

impl PgTx {
    /// The transaction's connection, beginning the transaction on first use.
    async fn begun(&mut self) -> Result<&Conn, TxError> {
        let checkout = match self.checkout.take() {
            Some(checkout) => checkout,
            None => {
                let checkout = self.shared.checkout().await.map_err(failed)?;
                checkout
                    .conn
                    .client
                    .batch_execute("BEGIN ISOLATION LEVEL SERIALIZABLE")
                    .await
                    .map_err(|error| map_error(error, Stage::Before))?;
                checkout
            }
        };
        Ok(&self.checkout.insert(checkout).conn)
    }

    /// Rolls back after a failed statement, so that the connection serves again.
    async fn abandon(&mut self) {
        if let Some(checkout) = &mut self.checkout {
            if checkout.conn.client.batch_execute("ROLLBACK").await.is_ok() {
                checkout.clean = true;
            }
        }
    }

    async fn apply(&mut self) -> Result<(), TxError> {
        let writes = std::mem::take(&mut self.writes);
        let conn = self.begun().await?;
        for (key, value) in &writes {
            let done = match value {
                Some(value) => conn.client.execute(&conn.put, &[key, value]).await,
                None => conn.client.execute(&conn.delete, &[key]).await,
            };
            done.map_err(|error| map_error(error, Stage::Before))?;
        }
        conn.client
            .batch_execute("COMMIT")
            .await
            .map_err(|error| map_error(error, Stage::Commit))
    }
}

impl Drop for PgTx {
    fn drop(&mut self) {
        if let Some(checkout) = self.checkout.take() {
            self.shared.release(checkout);
        }
    }
}

impl TxKv for PgKv {
    type Tx = PgTx;

    fn begin(&self) -> Result<PgTx, TxError> {
        Ok(PgTx {
            shared: self.shared.clone(),
            checkout: None,
            writes: BTreeMap::new(),
            seen: HashMap::new(),
            watches: Vec::new(),
        })
    }

    /// Always: a session record of another process may name an advisory lock.
    fn has_marks(&self) -> bool {
        true
    }

    async fn take_mark(&self, mark: &[u8]) -> Result<Option<Vec<u8>>, TxError> {
        if !self.shared.config.marks {
            return Ok(None);
        }
        mark::Marks::take(&self.shared, mark).await.map(Some)
    }

    fn release_mark(&self, mark: &[u8]) {
        self.shared.marks.release(mark);
    }

    fn mark_lost(&self, mark: &[u8]) -> MarkFuture {
        self.shared.marks.lost(mark)
    }

    fn mark_freed(&self, mark: &[u8], epoch: &[u8]) -> MarkFuture {
        mark::freed(&self.shared, mark, epoch)
    }
}

impl KvTx for PgTx {
    async fn get(&mut self, key: &[u8]) -> Result<Option<Vec<u8>>, TxError> {
        if let Some(written) = self.writes.get(key) {
            return Ok(written.clone());
        }
        let conn = self.begun().await?;
        let row = conn.client.query_opt(&conn.get, &[&key]).await;
        let value: Option<Vec<u8>> = match row {
            Ok(row) => row.map(|row| row.try_get(0)).transpose().map_err(failed)?,
            Err(error) => {
                self.abandon().await;
                return Err(map_error(error, Stage::Before));
            }
        };
        self.seen
            .entry(key.to_vec())
            .or_insert_with(|| value.clone());
        Ok(value)
    }

    async fn range(
        &mut self,
        begin: &[u8],
        end: &[u8],
        limit: usize,
    ) -> Result<Vec<KeyValue>, TxError> {
        if begin >= end || limit == 0 {
            return Ok(Vec::new());
        }
        let bounds = (
            std::ops::Bound::Included(begin.to_vec()),
            std::ops::Bound::Excluded(end.to_vec()),
        );
        // Cleared keys may hide stored ones: ask for as many more as there are own writes.
        let own = self.writes.range(bounds.clone()).count();
        let wanted = i64::try_from(limit.saturating_add(own)).unwrap_or(i64::MAX);
        let conn = self.begun().await?;
        let rows = match conn
            .client
            .query(&conn.range, &[&begin, &end, &wanted])
            .await
        {
            Ok(rows) => rows,
            Err(error) => {
                self.abandon().await;
                return Err(map_error(error, Stage::Before));
            }
        };
        let mut merged = BTreeMap::new();
        for row in rows {
            let value: Vec<u8> = row.try_get(1).map_err(failed)?;
            merged.insert(row.try_get::<_, Vec<u8>>(0).map_err(failed)?, Some(value));
        }
        for (key, value) in self.writes.range(bounds) {
            merged.insert(key.clone(), value.clone());
        }
        Ok(merged
            .into_iter()
            .filter_map(|(key, value)| Some((key, value?)))
            .take(limit)
            .collect())
    }

    async fn mark_free(&mut self, mark: &[u8], epoch: &[u8]) -> Result<Option<bool>, TxError> {
        if self.shared.marks.holds(mark) {
            return Ok(Some(false));
        }
        let Ok(epoch) = <[u8; 8]>::try_from(epoch) else {
            return Ok(None);
        };
        let epoch = i64::from_be_bytes(epoch);
        let key = mark::lock_key(&self.shared.config.schema, mark);
        let sql = format!(
            "SELECT CASE WHEN ({}) = $2 THEN pg_try_advisory_xact_lock($1) END",
            mark::EPOCH_SQL
        );
        let conn = self.begun().await?;
        // A lock taken here is this transaction's, given back when it ends.
        match conn.client.query_one(&sql, &[&key, &epoch]).await {
            Ok(row) => row.try_get::<_, Option<bool>>(0).map_err(failed),
            Err(error) => {
                self.abandon().await;
                Err(map_error(error, Stage::Before))
            }
        }
    }

    fn set(&mut self, key: &[u8], value: &[u8]) {
        self.writes.insert(key.to_vec(), Some(value.to_vec()));
    }

    fn clear(&mut self, key: &[u8]) {
        self.writes.insert(key.to_vec(), None);
    }

    async fn commit(mut self) -> Result<(), TxError> {
        if self.checkout.is_none() && self.writes.is_empty() {
            // Read nothing, wrote nothing: nothing to commit.
            for watch in self.watches.drain(..) {
                let _ = watch.send(());
            }
            return Ok(());
        }
        match self.apply().await {
            Ok(()) => {
                if let Some(checkout) = &mut self.checkout {
                    checkout.clean = true;
                }
                for watch in self.watches.drain(..) {
                    // The watch may have been dropped meanwhile: nothing to tell then.
                    let _ = watch.send(());
                }
                Ok(())
            }
            Err(error) => {
                if !matches!(error, TxError::UnknownResult { .. }) {
                    self.abandon().await;
                }
                Err(error)
            }
        }
    }

    fn watch(&mut self, key: &[u8]) -> impl Future<Output = Result<(), TxError>> + Send + 'static {
        // What this transaction saw: its own write, else its read; else what the watch first
        // reads once active.
        let seen = match self.writes.get(key) {
            Some(written) => Some(written.clone()),
            None => self.seen.get(key).cloned(),
        };
        let (activate, active) = oneshot::channel();
        self.watches.push(activate);
        let shared = self.shared.clone();
        let key = key.to_vec();
        async move {
            active.await.map_err(|_| failed(PgError::WatchCancelled))?;
            listen::wait(&shared, key, seen).await
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A mark's connection is made without TLS, so marks and a mode that needs TLS are refused
    /// together, in either order; `prefer` and `disable` take them.
    // covers: Pg.Marks
    #[test]
    fn marks_are_refused_with_a_mode_that_needs_tls() {
        let config = PgConfig::new("db.example", 5432, "vvm", "app").unwrap();
        for mode in [PgSslMode::Disable, PgSslMode::Prefer] {
            let config = config.clone().ssl_mode(mode).unwrap();
            assert!(config.advisory_lock_marks(true).is_ok(), "{mode}");
        }
        if cfg!(feature = "postgres-tls") {
            for mode in [
                PgSslMode::Require,
                PgSslMode::VerifyCa,
                PgSslMode::VerifyFull,
            ] {
                let tls_first = config.clone().ssl_mode(mode).unwrap();
                assert_eq!(
                    tls_first.advisory_lock_marks(true).err(),
                    Some(PgConfigError::MarksWithoutTls(mode))
                );
                let marks_first = config.clone().advisory_lock_marks(true).unwrap();
                assert_eq!(
                    marks_first.ssl_mode(mode).err(),
                    Some(PgConfigError::MarksWithoutTls(mode))
                );
            }
        }
    }

    #[test]
    fn the_password_never_shows_and_schema_names_are_plain() {
        let config = PgConfig::new("db.example", 5432, "vvm", "app")
            .unwrap()
            .password("hunter2");
        assert!(!format!("{config:?}").contains("hunter2"));
        assert!(!config.target().contains("hunter2"));
        for bad in ["", "Vvm", "1vvm", "vvm-x", "vvm\"; drop", &"s".repeat(49)] {
            assert!(
                matches!(config.clone().schema(bad), Err(PgConfigError::Schema(_))),
                "{bad:?}"
            );
        }
        assert!(config.clone().schema("vvm_prod2").is_ok());
        assert!(matches!(
            config.clone().connections_max(0),
            Err(PgConfigError::Connections(0))
        ));
        assert!(matches!(
            PgConfig::new("h", 1, "", "d"),
            Err(PgConfigError::Name("user"))
        ));
    }
}
