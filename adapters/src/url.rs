//! Store URLs: how a host names the store its VVMs lease slots in, with the store's options as
//! query parameters (feature `url`). [`crate::open`] (feature `open`) opens the store a URL names.
//!
//! | URL | store |
//! |---|---|
//! | `memory:` | the in-process memory store |
//! | `sqlite:PATH[?busy-wait-ms=N][&shared-group=true]` | the SQLite file at `PATH` (taken literally up to a `?`); `shared-group=true` lets the files' group use it too |
//! | `etcd://HOST:PORT[,HOST:PORT…][/][?PARAMETERS]` | the etcd cluster with these members (`[v6]:PORT` for IPv6) |
//! | `etcd:HOST:PORT[,HOST:PORT…][?PARAMETERS]` | the same, in the short form (`http://` or `https://` may precede each endpoint) |
//! | `fdb:` or `fdb:CLUSTER-FILE` | FoundationDB, with the default cluster file or the one given |
//! | `postgres://USER@HOST[:PORT][/DATABASE][?PARAMETERS]` (or `postgresql://`) | PostgreSQL (port 5432 and database `USER` by default) |
//!
//! The parameters of PostgreSQL: `schema=S` (the schema of its tables, default `vvm`),
//! `prefix=P` (as etcd's), `password-file=F` (the password, first line of `F`),
//! `connect-timeout-ms=N`, `connections=N` (most connections of one process, default 8),
//! `sslmode=disable|prefer|require|verify-ca|verify-full` (libpq's meanings, `prefer` by
//! default; see [`crate::postgres`]'s TLS table: `require` does not verify the server's
//! certificate unless `ca=` is given), `ca=F` (the certificate authority, PEM; needed by
//! `verify-ca` and `verify-full`, and only taken with `require` or stronger), and `cert=F` with
//! `key=F` (a client certificate; not with `sslmode=disable`). libpq's `allow` is refused (use
//! `prefer` or `disable`). `passfile=` (libpq's `.pgpass` format) is refused: name a file
//! holding the password alone with `password-file=`.
//! `death=advisory-lock` (default `death=ttl`) makes each session hold a session-level advisory
//! lock, so that others take over as soon as a dead holder's connection ends rather than a TTL
//! later; sound only on a direct connection to the primary, without a pooler in transaction or
//! statement mode (`Pg.Marks` in `specs/stores.md`). Other stores refuse the parameter.
//!
//! The parameters of etcd (values percent-encoded, each at most once):
//!
//! | parameter | meaning |
//! |---|---|
//! | `prefix=P` | keys are `<P><slot number>` (default `vvm/slot/`); `P` must not end with a digit, so that no two prefixes share a key |
//! | `user=U` and `password-file=F` | authenticate as `U` with the password in file `F` (its first line); always both |
//! | `ca=F` | speak TLS, trusting the certificate authority in PEM file `F` (feature `etcd-tls`) |
//! | `cert=F` and `key=F` | the client certificate and its private key, PEM files; always both, and only with `ca=` |
//! | `server-name=N` | the name the servers' certificates carry, when not the endpoint's host; only with `ca=` |
//! | `connect-timeout-ms=N`, `request-timeout-ms=N` | bounds of one connection attempt and of one request, 1 to [`TIMEOUT_MAX_MS`] |
//!
//! A password never appears in a URL: `user:password@` and `password=` are refused, so that the
//! URL can be shown in a process list, a unit file or a log line. [`StoreUrl`]'s `Display` and
//! `Debug` still hide the user and the file names of the credentials and of the private key, and
//! so do the errors of [`crate::open`]. An unknown parameter's name is repeated in an error only
//! when it nearly spells a known one (`prefx`, `busy_wait_ms`): anything else may be a secret
//! pasted in the wrong place.
//!
//! ```
//! use std::time::Duration;
//! use vvm_adapters::url::StoreUrl;
//!
//! let url = StoreUrl::parse("etcd://10.0.0.1:2379,10.0.0.2:2379/?prefix=prod/&request-timeout-ms=800").unwrap();
//! let StoreUrl::Etcd(etcd) = &url else { unreachable!() };
//! assert_eq!(etcd.endpoints, ["10.0.0.1:2379", "10.0.0.2:2379"]);
//! assert_eq!(etcd.prefix.as_deref(), Some("prod/"));
//! assert_eq!(etcd.request_timeout, Some(Duration::from_millis(800)));
//! assert_eq!(StoreUrl::parse("fdb:").unwrap(), StoreUrl::Fdb(None));
//! assert!(StoreUrl::parse("etcd:10.0.0.1").is_err());
//! assert!(StoreUrl::parse("etcd://vvm:s3cret@10.0.0.1:2379").is_err());
//!
//! let secret = StoreUrl::parse("etcd://h:2379/?user=vvm&password-file=/run/secrets/etcd").unwrap();
//! assert!(!secret.to_string().contains("/run/secrets"));
//! assert!(!format!("{secret:?}").contains("vvm&"));
//! ```

use std::fmt;
use std::path::PathBuf;
use std::time::Duration;

mod near;

/// Longest URL accepted, in bytes.
pub const URL_MAX_BYTES: usize = 4096;
/// Most etcd endpoints in one URL.
pub const ETCD_ENDPOINTS_MAX: usize = 64;
/// Longest timeout a URL may set, in milliseconds (10 minutes).
pub const TIMEOUT_MAX_MS: u64 = 600_000;
/// Longest SQLite lock wait a URL may set, in milliseconds; the store's own limit applies too.
pub const BUSY_WAIT_MAX_MS: u64 = 10_000;

/// The parameters of `sqlite:` URLs.
const SQLITE_PARAMETERS: &[&str] = &["busy-wait-ms", "shared-group"];
/// The parameters of `etcd:` URLs.
const ETCD_PARAMETERS: &[&str] = &[
    "prefix",
    "user",
    "password-file",
    "ca",
    "cert",
    "key",
    "server-name",
    "connect-timeout-ms",
    "request-timeout-ms",
];

/// The parameters of `postgres:` URLs.
const POSTGRES_PARAMETERS: &[&str] = &[
    "schema",
    "prefix",
    "password-file",
    "connect-timeout-ms",
    "connections",
    "sslmode",
    "ca",
    "cert",
    "key",
    "death",
];
/// Most connections a `postgres:` URL may ask for.
pub const POSTGRES_CONNECTIONS_MAX: usize = 256;

/// The parameters the store of `scheme` takes.
fn parameters_of(scheme: &str) -> &'static [&'static str] {
    match scheme {
        "sqlite" => SQLITE_PARAMETERS,
        "etcd" => ETCD_PARAMETERS,
        "postgres" => POSTGRES_PARAMETERS,
        _ => &[],
    }
}

/// What a URL shows instead of a secret.
const REDACTED: &str = "<redacted>";
/// The short list of forms that error messages end with.
const FORMS: &str =
    "use memory:, sqlite:PATH, etcd://HOST:PORT[,HOST:PORT...][/?PARAMETERS], postgres://USER@HOST[:PORT][/DATABASE][?PARAMETERS] or fdb:[CLUSTER-FILE]";

/// A parsed store URL.
#[derive(Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum StoreUrl {
    /// `memory:`.
    Memory,
    /// `sqlite:PATH[?…]`.
    Sqlite(SqliteUrl),
    /// `etcd://…` or `etcd:…`.
    Etcd(EtcdUrl),
    /// `fdb:[CLUSTER-FILE]`: the cluster file, or `None` for FoundationDB's default.
    Fdb(Option<PathBuf>),
    /// `postgres://…` or `postgresql://…`.
    Postgres(PostgresUrl),
}

/// The PostgreSQL server, database and options. `Display` and `Debug` hide the user and the
/// password file.
#[derive(Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct PostgresUrl {
    /// The host (a name or an address; IPv6 without brackets).
    pub host: String,
    /// The port (5432 unless given).
    pub port: u16,
    /// The user.
    pub user: String,
    /// The database (the user's name unless given).
    pub dbname: String,
    /// `schema=`.
    pub schema: Option<String>,
    /// `prefix=`.
    pub prefix: Option<String>,
    /// `password-file=`.
    pub password_file: Option<PathBuf>,
    /// `connect-timeout-ms=`.
    pub connect_timeout: Option<Duration>,
    /// `connections=`.
    pub connections: Option<usize>,
    /// `sslmode=`.
    pub sslmode: Option<SslMode>,
    /// `ca=`.
    pub ca: Option<PathBuf>,
    /// `cert=`.
    pub cert: Option<PathBuf>,
    /// `key=`.
    pub key: Option<PathBuf>,
    /// `death=advisory-lock` (`false`: `death=ttl`, the default).
    pub advisory_lock: bool,
}

/// libpq's `sslmode` values a `postgres:` URL takes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum SslMode {
    /// `disable`.
    Disable,
    /// `prefer`.
    Prefer,
    /// `require`.
    Require,
    /// `verify-ca`.
    VerifyCa,
    /// `verify-full`.
    VerifyFull,
}

impl SslMode {
    /// The parameter's value.
    pub fn as_str(self) -> &'static str {
        match self {
            SslMode::Disable => "disable",
            SslMode::Prefer => "prefer",
            SslMode::Require => "require",
            SslMode::VerifyCa => "verify-ca",
            SslMode::VerifyFull => "verify-full",
        }
    }
}

/// The SQLite file and its options.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct SqliteUrl {
    /// The file, as written.
    pub path: PathBuf,
    /// `busy-wait-ms=`: how long one operation waits for the write lock.
    pub busy_wait: Option<Duration>,
    /// `shared-group=true`: the members of the files' group may use the store too (files
    /// `0660`); by default only this user may (`0600`).
    pub shared_group: bool,
}

/// The etcd members and how to reach them. `Debug` hides the credentials and the key file.
#[derive(Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct EtcdUrl {
    /// The endpoints, as written.
    pub endpoints: Vec<String>,
    /// `prefix=`.
    pub prefix: Option<String>,
    /// `user=`.
    pub user: Option<String>,
    /// `password-file=`.
    pub password_file: Option<PathBuf>,
    /// `ca=`.
    pub ca: Option<PathBuf>,
    /// `cert=`.
    pub cert: Option<PathBuf>,
    /// `key=`.
    pub key: Option<PathBuf>,
    /// `server-name=`.
    pub server_name: Option<String>,
    /// `connect-timeout-ms=`.
    pub connect_timeout: Option<Duration>,
    /// `request-timeout-ms=`.
    pub request_timeout: Option<Duration>,
}

/// Why a store URL was refused. Never contains a password: the parts of the URL it quotes are
/// a scheme, an endpoint without user information, or a parameter's name.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum UrlError {
    /// Nothing was given.
    #[error("the store URL is empty ({FORMS})")]
    Empty,
    /// Longer than [`URL_MAX_BYTES`].
    #[error("the store URL is {len} bytes long, more than the maximum of {max}")]
    TooLong {
        /// Its length.
        len: usize,
        /// [`URL_MAX_BYTES`].
        max: usize,
    },
    /// Contains a control character (a NUL cannot be part of a path either).
    #[error("the store URL contains a control character")]
    ControlCharacter,
    /// No `scheme:` in front. The text is not quoted: it may be a secret typed by mistake.
    #[error("the store URL has no scheme ({FORMS})")]
    NoScheme,
    /// A scheme no store has.
    #[error("unknown store {0:?} ({FORMS})")]
    UnknownScheme(String),
    /// `memory:` followed by something.
    #[error("memory: takes nothing after the colon")]
    MemoryTakesNothing,
    /// `sqlite:` without a path.
    #[error("sqlite: needs a file path, as in sqlite:/var/lib/vvm/leases.db")]
    NoPath,
    /// `etcd:` without endpoints, or with an empty one.
    #[error("etcd: needs HOST:PORT endpoints separated by commas, as in etcd://127.0.0.1:2379")]
    NoEndpoint,
    /// An etcd endpoint that is not `HOST:PORT`.
    #[error("etcd endpoint {endpoint:?} is not HOST:PORT: {reason}")]
    BadEndpoint {
        /// The endpoint.
        endpoint: String,
        /// What is wrong with it.
        reason: &'static str,
    },
    /// More than [`ETCD_ENDPOINTS_MAX`] endpoints.
    #[error("{count} etcd endpoints is more than the maximum of {max}")]
    TooManyEndpoints {
        /// How many were given.
        count: usize,
        /// [`ETCD_ENDPOINTS_MAX`].
        max: usize,
    },
    /// `user:password@host`: a password does not belong in a URL.
    #[error("the store URL carries user information (user:password@); name the user with user= and the password's file with password-file=")]
    CredentialsInUrl,
    /// `password=`: a password does not belong in a URL.
    #[error("password= is refused: a password does not belong in a URL; put it in a file and name the file with password-file=")]
    PasswordInUrl,
    /// A `postgres://` URL not of the form `postgres://USER@HOST[:PORT][/DATABASE][?…]`.
    #[error("postgres:// needs postgres://USER@HOST[:PORT][/DATABASE][?PARAMETERS]: {0}")]
    PostgresForm(&'static str),
    /// Something other than `/` after the endpoints of `etcd://`, or a `#fragment`.
    #[error("etcd:// takes nothing between the endpoints and the '?' but one '/', and no '#'")]
    BadPath,
    /// A parameter this store does not have. Its name is kept (and shown) only when it nearly
    /// spells a known one: anything else may be a secret typed in the wrong place.
    #[error("{}", near::unknown_message(.store, .near_miss))]
    UnknownParameter {
        /// The store's scheme.
        store: &'static str,
        /// The name given and the known parameter it nearly spells, when it is such a near
        /// miss.
        near_miss: Option<(String, &'static str)>,
    },
    /// A parameter given twice.
    #[error("parameter {name} is given more than once")]
    RepeatedParameter {
        /// The parameter.
        name: &'static str,
    },
    /// A parameter whose value is not usable.
    #[error("parameter {name}: {reason}")]
    BadParameter {
        /// The parameter.
        name: &'static str,
        /// What is wrong with its value.
        reason: &'static str,
    },
    /// A parameter given without the one it goes with.
    #[error("parameter {name} needs parameter {needs} too")]
    MissingParameter {
        /// The parameter given.
        name: &'static str,
        /// The parameter missing.
        needs: &'static str,
    },
}

impl StoreUrl {
    /// Parses `url`; see the [module documentation](self) for the forms and the parameters.
    pub fn parse(url: &str) -> Result<StoreUrl, UrlError> {
        if url.is_empty() {
            return Err(UrlError::Empty);
        }
        if url.len() > URL_MAX_BYTES {
            return Err(UrlError::TooLong {
                len: url.len(),
                max: URL_MAX_BYTES,
            });
        }
        if url.chars().any(char::is_control) {
            return Err(UrlError::ControlCharacter);
        }
        let (scheme, rest) = url.split_once(':').ok_or(UrlError::NoScheme)?;
        match scheme {
            "memory" if rest.is_empty() => Ok(StoreUrl::Memory),
            "memory" => Err(UrlError::MemoryTakesNothing),
            "sqlite" => parse_sqlite(rest).map(StoreUrl::Sqlite),
            "etcd" => parse_etcd(rest).map(StoreUrl::Etcd),
            "fdb" if rest.is_empty() => Ok(StoreUrl::Fdb(None)),
            "fdb" => Ok(StoreUrl::Fdb(Some(PathBuf::from(rest)))),
            "postgres" | "postgresql" => parse_postgres(url).map(StoreUrl::Postgres),
            other if other.contains(['/', '@']) => Err(UrlError::NoScheme),
            other => Err(UrlError::UnknownScheme(other.chars().take(32).collect())),
        }
    }

    /// The scheme: `memory`, `sqlite`, `etcd`, `fdb` or `postgres`.
    pub fn scheme(&self) -> &'static str {
        match self {
            StoreUrl::Memory => "memory",
            StoreUrl::Sqlite(_) => "sqlite",
            StoreUrl::Etcd(_) => "etcd",
            StoreUrl::Fdb(_) => "fdb",
            StoreUrl::Postgres(_) => "postgres",
        }
    }
}

impl std::str::FromStr for StoreUrl {
    type Err = UrlError;

    fn from_str(url: &str) -> Result<Self, Self::Err> {
        StoreUrl::parse(url)
    }
}

/// The canonical form, with the user and the credential and key files replaced by
/// `<redacted>`: safe to log.
impl fmt::Display for StoreUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            StoreUrl::Memory => write!(f, "memory:"),
            StoreUrl::Sqlite(sqlite) => {
                write!(f, "sqlite:{}", sqlite.path.display())?;
                let mut separator = '?';
                if let Some(wait) = sqlite.busy_wait {
                    write!(f, "{separator}busy-wait-ms={}", wait.as_millis())?;
                    separator = '&';
                }
                if sqlite.shared_group {
                    write!(f, "{separator}shared-group=true")?;
                }
                Ok(())
            }
            StoreUrl::Etcd(etcd) => write!(f, "{etcd}"),
            StoreUrl::Fdb(None) => write!(f, "fdb:"),
            StoreUrl::Fdb(Some(path)) => write!(f, "fdb:{}", path.display()),
            StoreUrl::Postgres(postgres) => write!(f, "{postgres}"),
        }
    }
}

/// As `Display`: never shows the secrets.
impl fmt::Debug for StoreUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "StoreUrl({self})")
    }
}

impl fmt::Display for EtcdUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // Endpoints that carry their own `http(s)://` only fit the short form.
        let list = self.endpoints.join(",");
        if list.contains("://") {
            write!(f, "etcd:{list}")?;
        } else {
            write!(f, "etcd://{list}/")?;
        }
        let mut query = url::form_urlencoded::Serializer::new(String::new());
        if let Some(prefix) = &self.prefix {
            query.append_pair("prefix", prefix);
        }
        if self.user.is_some() {
            query.append_pair("user", REDACTED);
        }
        if self.password_file.is_some() {
            query.append_pair("password-file", REDACTED);
        }
        for (name, path) in [("ca", &self.ca), ("cert", &self.cert)] {
            if let Some(path) = path {
                query.append_pair(name, &path.to_string_lossy());
            }
        }
        if self.key.is_some() {
            query.append_pair("key", REDACTED);
        }
        if let Some(name) = &self.server_name {
            query.append_pair("server-name", name);
        }
        for (name, timeout) in [
            ("connect-timeout-ms", self.connect_timeout),
            ("request-timeout-ms", self.request_timeout),
        ] {
            if let Some(timeout) = timeout {
                query.append_pair(name, &timeout.as_millis().to_string());
            }
        }
        let query = query.finish();
        if !query.is_empty() {
            write!(f, "?{query}")?;
        }
        Ok(())
    }
}

impl fmt::Debug for EtcdUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "EtcdUrl({self})")
    }
}

impl fmt::Display for PostgresUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let host = if self.host.contains(':') {
            format!("[{}]", self.host)
        } else {
            self.host.clone()
        };
        write!(
            f,
            "postgres://{REDACTED}@{host}:{}/{}",
            self.port, self.dbname
        )?;
        let mut query = url::form_urlencoded::Serializer::new(String::new());
        for (name, value) in [("schema", &self.schema), ("prefix", &self.prefix)] {
            if let Some(value) = value {
                query.append_pair(name, value);
            }
        }
        if self.password_file.is_some() {
            query.append_pair("password-file", REDACTED);
        }
        if let Some(timeout) = self.connect_timeout {
            query.append_pair("connect-timeout-ms", &timeout.as_millis().to_string());
        }
        if let Some(connections) = self.connections {
            query.append_pair("connections", &connections.to_string());
        }
        if let Some(mode) = self.sslmode {
            query.append_pair("sslmode", mode.as_str());
        }
        for (name, path) in [("ca", &self.ca), ("cert", &self.cert)] {
            if let Some(path) = path {
                query.append_pair(name, &path.to_string_lossy());
            }
        }
        if self.key.is_some() {
            query.append_pair("key", REDACTED);
        }
        if self.advisory_lock {
            query.append_pair("death", "advisory-lock");
        }
        let query = query.finish();
        if !query.is_empty() {
            write!(f, "?{query}")?;
        }
        Ok(())
    }
}

impl fmt::Debug for PostgresUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "PostgresUrl({self})")
    }
}

/// `postgres://USER@HOST[:PORT][/DATABASE][?PARAMETERS]`, as libpq's URIs without a password.
fn parse_postgres(input: &str) -> Result<PostgresUrl, UrlError> {
    let form = UrlError::PostgresForm;
    // Checked before parsing: the parser's errors would not say that a password was there.
    let authority = input
        .split_once("://")
        .map(|(_, rest)| rest.split(['/', '?', '#']).next().unwrap_or_default())
        .ok_or(form("the // after the scheme is missing"))?;
    if authority
        .rsplit_once('@')
        .is_some_and(|(info, _)| info.contains(':'))
    {
        return Err(UrlError::CredentialsInUrl);
    }
    let parsed = url::Url::parse(input).map_err(|error| {
        form(match error {
            url::ParseError::InvalidPort => "the port is not a number from 1 to 65535",
            url::ParseError::EmptyHost => "the host is missing",
            _ => "it is not a URL",
        })
    })?;
    if parsed.fragment().is_some() {
        return Err(form("a #fragment is not part of it"));
    }
    let user = percent_decoded(parsed.username()).ok_or(form("the user is not UTF-8"))?;
    if user.is_empty() {
        return Err(form("the user is missing (USER@ before the host)"));
    }
    text("user", &user)?;
    let host = match parsed.host() {
        Some(url::Host::Domain(name)) if !name.is_empty() => name.to_owned(),
        Some(url::Host::Ipv4(address)) => address.to_string(),
        Some(url::Host::Ipv6(address)) => address.to_string(),
        _ => return Err(form("the host is missing")),
    };
    let port = match parsed.port() {
        Some(0) => return Err(form("the port is not a number from 1 to 65535")),
        Some(port) => port,
        None => 5432,
    };
    let path = parsed.path().strip_prefix('/').unwrap_or(parsed.path());
    if path.contains('/') {
        return Err(form("the database name holds a /"));
    }
    let dbname = match percent_decoded(path) {
        Some(name) if !name.is_empty() => text("database", &name)?,
        Some(_) => user.clone(),
        None => return Err(form("the database name is not UTF-8")),
    };
    let mut postgres = PostgresUrl {
        host,
        port,
        user,
        dbname,
        ..PostgresUrl::default()
    };
    let mut death = None;
    for (name, value) in parsed.query().map(parameters).into_iter().flatten() {
        let value = value.as_ref();
        match name.as_ref() {
            "schema" => set_once(&mut postgres.schema, "schema", text("schema", value)?)?,
            "prefix" => set_once(&mut postgres.prefix, "prefix", text("prefix", value)?)?,
            "password" => return Err(UrlError::PasswordInUrl),
            "password-file" => set_once(
                &mut postgres.password_file,
                "password-file",
                file("password-file", value)?,
            )?,
            "passfile" => {
                return Err(UrlError::BadParameter {
                    name: "passfile",
                    reason: "libpq's .pgpass format is not read; name a file holding the password alone with password-file=",
                })
            }
            "connect-timeout-ms" => set_once(
                &mut postgres.connect_timeout,
                "connect-timeout-ms",
                milliseconds("connect-timeout-ms", value, 1, TIMEOUT_MAX_MS)?,
            )?,
            "connections" => {
                let count = value
                    .parse::<usize>()
                    .ok()
                    .filter(|count| (1..=POSTGRES_CONNECTIONS_MAX).contains(count))
                    .ok_or(UrlError::BadParameter {
                        name: "connections",
                        reason: "it must be a whole number from 1 to 256",
                    })?;
                set_once(&mut postgres.connections, "connections", count)?;
            }
            "sslmode" => {
                let mode = match value {
                    "disable" => SslMode::Disable,
                    "prefer" => SslMode::Prefer,
                    "require" => SslMode::Require,
                    "verify-ca" => SslMode::VerifyCa,
                    "verify-full" => SslMode::VerifyFull,
                    "allow" => {
                        return Err(UrlError::BadParameter {
                            name: "sslmode",
                            reason: "allow (plain first, TLS only when the server insists) is not offered; use prefer (TLS when the server offers it) or disable",
                        })
                    }
                    _ => {
                        return Err(UrlError::BadParameter {
                            name: "sslmode",
                            reason: "it must be disable, prefer, require, verify-ca or verify-full",
                        })
                    }
                };
                set_once(&mut postgres.sslmode, "sslmode", mode)?;
            }
            "ca" => set_once(&mut postgres.ca, "ca", file("ca", value)?)?,
            "cert" => set_once(&mut postgres.cert, "cert", file("cert", value)?)?,
            "key" => set_once(&mut postgres.key, "key", file("key", value)?)?,
            "death" => {
                let advisory_lock = match value {
                    "ttl" => false,
                    "advisory-lock" => true,
                    _ => {
                        return Err(UrlError::BadParameter {
                            name: "death",
                            reason: "it must be ttl (the default) or advisory-lock",
                        })
                    }
                };
                set_once(&mut death, "death", advisory_lock)?;
                postgres.advisory_lock = advisory_lock;
            }
            other => return Err(unknown("postgres", POSTGRES_PARAMETERS, other)),
        }
    }
    check_postgres_tls(&postgres)?;
    Ok(postgres)
}

/// The TLS parameters of a `postgres:` URL agree: no file is given that would be ignored.
fn check_postgres_tls(postgres: &PostgresUrl) -> Result<(), UrlError> {
    let mode = postgres.sslmode.unwrap_or(SslMode::Prefer);
    if matches!(mode, SslMode::VerifyCa | SslMode::VerifyFull) && postgres.ca.is_none() {
        return Err(UrlError::MissingParameter {
            name: "sslmode",
            needs: "ca",
        });
    }
    if postgres.ca.is_some() && matches!(mode, SslMode::Disable | SslMode::Prefer) {
        return Err(UrlError::BadParameter {
            name: "ca",
            reason: "it is used only with sslmode=require, verify-ca or verify-full (prefer never verifies)",
        });
    }
    for (name, given, needs, has) in [
        (
            "cert",
            postgres.cert.is_some(),
            "key",
            postgres.key.is_some(),
        ),
        (
            "key",
            postgres.key.is_some(),
            "cert",
            postgres.cert.is_some(),
        ),
    ] {
        if given && !has {
            return Err(UrlError::MissingParameter { name, needs });
        }
    }
    if postgres.cert.is_some() && mode == SslMode::Disable {
        return Err(UrlError::BadParameter {
            name: "cert",
            reason: "sslmode=disable makes no TLS connection to present it on",
        });
    }
    Ok(())
}

/// `text` with its `%XX` escapes decoded, if the result is UTF-8.
fn percent_decoded(text: &str) -> Option<String> {
    let bytes = text.as_bytes();
    let mut decoded = Vec::with_capacity(bytes.len());
    let mut at = 0;
    while at < bytes.len() {
        let escaped = (bytes[at] == b'%')
            .then(|| text.get(at + 1..at + 3))
            .flatten()
            .and_then(|hex| u8::from_str_radix(hex, 16).ok());
        match escaped {
            Some(byte) => {
                decoded.push(byte);
                at += 3;
            }
            None => {
                decoded.push(bytes[at]);
                at += 1;
            }
        }
    }
    String::from_utf8(decoded).ok()
}

/// `sqlite:PATH[?busy-wait-ms=N]`: the path is literal (not percent-decoded) up to the first `?`.
fn parse_sqlite(rest: &str) -> Result<SqliteUrl, UrlError> {
    let (path, query) = match rest.split_once('?') {
        Some((path, query)) => (path, Some(query)),
        None => (rest, None),
    };
    // `sqlite:///var/x.db` names `/var/x.db`, as the authority form of file URLs does.
    let path = path.strip_prefix("//").unwrap_or(path);
    // `sqlite://` names no file either (the empty authority form of `sqlite:`).
    if path.is_empty() {
        return Err(UrlError::NoPath);
    }
    let mut sqlite = SqliteUrl {
        path: PathBuf::from(path),
        busy_wait: None,
        shared_group: false,
    };
    let mut shared_group = None;
    for (name, value) in query.map(parameters).into_iter().flatten() {
        match name.as_ref() {
            "busy-wait-ms" => {
                let wait = milliseconds("busy-wait-ms", &value, 0, BUSY_WAIT_MAX_MS)?;
                set_once(&mut sqlite.busy_wait, "busy-wait-ms", wait)?;
            }
            "shared-group" => {
                let shared = match value.as_ref() {
                    "true" | "1" | "yes" | "on" => true,
                    "false" | "0" | "no" | "off" => false,
                    _ => {
                        return Err(UrlError::BadParameter {
                            name: "shared-group",
                            reason: "must be true or false",
                        })
                    }
                };
                set_once(&mut shared_group, "shared-group", shared)?;
            }
            other => return Err(unknown("sqlite", SQLITE_PARAMETERS, other)),
        }
    }
    sqlite.shared_group = shared_group.unwrap_or(false);
    Ok(sqlite)
}

fn parse_etcd(rest: &str) -> Result<EtcdUrl, UrlError> {
    if rest.contains('#') {
        return Err(UrlError::BadPath);
    }
    let (list, query) = match rest.split_once('?') {
        Some((list, query)) => (list, Some(query)),
        None => (rest, None),
    };
    let list = match list.strip_prefix("//") {
        Some(authority) => match authority.split_once('/') {
            Some((authority, "")) => authority,
            Some(_) => return Err(UrlError::BadPath),
            None => authority,
        },
        None => list,
    };
    if list.contains('@') {
        return Err(UrlError::CredentialsInUrl);
    }
    let mut etcd = EtcdUrl {
        endpoints: parse_endpoints(list)?,
        ..EtcdUrl::default()
    };
    for (name, value) in query.map(parameters).into_iter().flatten() {
        let value = value.as_ref();
        match name.as_ref() {
            "prefix" => set_once(&mut etcd.prefix, "prefix", text("prefix", value)?)?,
            "user" => set_once(&mut etcd.user, "user", text("user", value)?)?,
            "password" => return Err(UrlError::PasswordInUrl),
            "password-file" => set_once(
                &mut etcd.password_file,
                "password-file",
                file("password-file", value)?,
            )?,
            "ca" => set_once(&mut etcd.ca, "ca", file("ca", value)?)?,
            "cert" => set_once(&mut etcd.cert, "cert", file("cert", value)?)?,
            "key" => set_once(&mut etcd.key, "key", file("key", value)?)?,
            "server-name" => set_once(
                &mut etcd.server_name,
                "server-name",
                text("server-name", value)?,
            )?,
            "connect-timeout-ms" => set_once(
                &mut etcd.connect_timeout,
                "connect-timeout-ms",
                milliseconds("connect-timeout-ms", value, 1, TIMEOUT_MAX_MS)?,
            )?,
            "request-timeout-ms" => set_once(
                &mut etcd.request_timeout,
                "request-timeout-ms",
                milliseconds("request-timeout-ms", value, 1, TIMEOUT_MAX_MS)?,
            )?,
            other => return Err(unknown("etcd", ETCD_PARAMETERS, other)),
        }
    }
    let requirements = [
        (
            "user",
            etcd.user.is_some(),
            "password-file",
            etcd.password_file.is_some(),
        ),
        (
            "password-file",
            etcd.password_file.is_some(),
            "user",
            etcd.user.is_some(),
        ),
        ("cert", etcd.cert.is_some(), "key", etcd.key.is_some()),
        ("key", etcd.key.is_some(), "cert", etcd.cert.is_some()),
        ("cert", etcd.cert.is_some(), "ca", etcd.ca.is_some()),
        (
            "server-name",
            etcd.server_name.is_some(),
            "ca",
            etcd.ca.is_some(),
        ),
    ];
    for (name, given, needs, has) in requirements {
        if given && !has {
            return Err(UrlError::MissingParameter { name, needs });
        }
    }
    Ok(etcd)
}

/// The decoded `name=value` pairs of a query (`+` is a space, as in forms: write `%2B`).
fn parameters(query: &str) -> url::form_urlencoded::Parse<'_> {
    url::form_urlencoded::parse(query.as_bytes())
}

fn unknown(store: &'static str, known: &[&'static str], name: &str) -> UrlError {
    UrlError::UnknownParameter {
        store,
        near_miss: near::near_miss(name, known).map(|meant| (name.to_owned(), meant)),
    }
}

fn set_once<T>(slot: &mut Option<T>, name: &'static str, value: T) -> Result<(), UrlError> {
    if slot.is_some() {
        return Err(UrlError::RepeatedParameter { name });
    }
    *slot = Some(value);
    Ok(())
}

fn text(name: &'static str, value: &str) -> Result<String, UrlError> {
    if value.is_empty() {
        return Err(UrlError::BadParameter {
            name,
            reason: "it is empty",
        });
    }
    if value.chars().any(char::is_control) {
        return Err(UrlError::BadParameter {
            name,
            reason: "it contains a control character",
        });
    }
    Ok(value.to_owned())
}

fn file(name: &'static str, value: &str) -> Result<PathBuf, UrlError> {
    text(name, value).map(PathBuf::from)
}

fn milliseconds(name: &'static str, value: &str, min: u64, max: u64) -> Result<Duration, UrlError> {
    let bad = |reason| UrlError::BadParameter { name, reason };
    let millis: u64 = value
        .parse()
        .map_err(|_| bad("it is not a whole number of milliseconds"))?;
    if millis < min {
        return Err(bad("it must be above zero"));
    }
    if millis > max {
        return Err(bad("it is above the maximum"));
    }
    Ok(Duration::from_millis(millis))
}

fn parse_endpoints(list: &str) -> Result<Vec<String>, UrlError> {
    let mut endpoints = Vec::new();
    for endpoint in list.split(',') {
        if endpoints.len() == ETCD_ENDPOINTS_MAX {
            return Err(UrlError::TooManyEndpoints {
                count: list.split(',').count(),
                max: ETCD_ENDPOINTS_MAX,
            });
        }
        if endpoint.is_empty() {
            return Err(UrlError::NoEndpoint);
        }
        check_endpoint(endpoint)?;
        endpoints.push(endpoint.to_owned());
    }
    Ok(endpoints)
}

/// `HOST:PORT`, optionally behind `http://` or `https://`; checked by the `url` crate as the
/// authority of a URL of a scheme without default port, so that the port must be written.
fn check_endpoint(endpoint: &str) -> Result<(), UrlError> {
    let bad = |reason| UrlError::BadEndpoint {
        endpoint: endpoint.chars().take(128).collect(),
        reason,
    };
    if endpoint.chars().any(char::is_whitespace) {
        return Err(bad("it contains whitespace"));
    }
    let address = endpoint
        .strip_prefix("http://")
        .or_else(|| endpoint.strip_prefix("https://"))
        .unwrap_or(endpoint);
    if address.contains(['/', '?', '#', '@', '\\', '%']) {
        return Err(bad("it contains a character hosts do not have"));
    }
    let parsed = url::Url::parse(&format!("etcd://{address}")).map_err(|error| {
        bad(match error {
            url::ParseError::EmptyHost => "the host is missing",
            url::ParseError::InvalidPort => "the port is not a number from 1 to 65535",
            url::ParseError::InvalidIpv6Address => "the IPv6 address is not valid",
            _ => "the host is not valid",
        })
    })?;
    match parsed.port() {
        None if address.ends_with(':') => Err(bad("the port is not a number from 1 to 65535")),
        None => Err(bad("the port is missing")),
        Some(0) => Err(bad("the port is not a number from 1 to 65535")),
        Some(_) if parsed.host().is_none() => Err(bad("the host is missing")),
        Some(_) => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn etcd(endpoints: &[&str]) -> EtcdUrl {
        EtcdUrl {
            endpoints: endpoints.iter().map(|e| e.to_string()).collect(),
            ..EtcdUrl::default()
        }
    }

    fn etcd_of(url: &str) -> EtcdUrl {
        match StoreUrl::parse(url) {
            Ok(StoreUrl::Etcd(etcd)) => etcd,
            other => panic!("{url}: {other:?}"),
        }
    }

    fn sqlite(path: &str, busy_wait: Option<Duration>) -> StoreUrl {
        StoreUrl::Sqlite(SqliteUrl {
            path: path.into(),
            busy_wait,
            shared_group: false,
        })
    }

    // covers: Url.Parse
    #[test]
    fn every_store_form_parses_and_prints_canonically() {
        for (url, parsed, canonical) in [
            ("memory:", StoreUrl::Memory, "memory:"),
            (
                "sqlite:/var/lib/vvm/leases.db",
                sqlite("/var/lib/vvm/leases.db", None),
                "sqlite:/var/lib/vvm/leases.db",
            ),
            (
                "sqlite:leases.db",
                sqlite("leases.db", None),
                "sqlite:leases.db",
            ),
            (
                "sqlite:///var/x.db?busy-wait-ms=50",
                sqlite("/var/x.db", Some(Duration::from_millis(50))),
                "sqlite:/var/x.db?busy-wait-ms=50",
            ),
            (
                "etcd:127.0.0.1:2379",
                StoreUrl::Etcd(etcd(&["127.0.0.1:2379"])),
                "etcd://127.0.0.1:2379/",
            ),
            (
                "etcd://127.0.0.1:2379",
                StoreUrl::Etcd(etcd(&["127.0.0.1:2379"])),
                "etcd://127.0.0.1:2379/",
            ),
            (
                "etcd:a.example:2379,[::1]:2380,https://b.example:2379",
                StoreUrl::Etcd(etcd(&[
                    "a.example:2379",
                    "[::1]:2380",
                    "https://b.example:2379",
                ])),
                "etcd:a.example:2379,[::1]:2380,https://b.example:2379",
            ),
            ("fdb:", StoreUrl::Fdb(None), "fdb:"),
            (
                "fdb:/etc/foundationdb/fdb.cluster",
                StoreUrl::Fdb(Some("/etc/foundationdb/fdb.cluster".into())),
                "fdb:/etc/foundationdb/fdb.cluster",
            ),
        ] {
            assert_eq!(StoreUrl::parse(url), Ok(parsed.clone()), "{url}");
            assert_eq!(parsed.to_string(), canonical);
            assert_eq!(
                StoreUrl::parse(canonical),
                Ok(parsed.clone()),
                "{canonical}"
            );
            assert_eq!(url.parse::<StoreUrl>(), Ok(parsed));
        }
    }

    // covers: Url.Options
    #[test]
    fn every_etcd_parameter_is_read() {
        let url = etcd_of(
            "etcd://h1:2379,h2:2379/?prefix=prod%2Fvvm%2F&user=alice&password-file=%2Frun%2Fpw\
             &ca=/etc/ca.pem&cert=/etc/c.pem&key=/etc/k.pem&server-name=etcd.local\
             &connect-timeout-ms=1500&request-timeout-ms=700",
        );
        assert_eq!(url.endpoints, ["h1:2379", "h2:2379"]);
        assert_eq!(url.prefix.as_deref(), Some("prod/vvm/"));
        assert_eq!(url.user.as_deref(), Some("alice"));
        assert_eq!(url.password_file, Some("/run/pw".into()));
        assert_eq!(url.ca, Some("/etc/ca.pem".into()));
        assert_eq!(url.cert, Some("/etc/c.pem".into()));
        assert_eq!(url.key, Some("/etc/k.pem".into()));
        assert_eq!(url.server_name.as_deref(), Some("etcd.local"));
        assert_eq!(url.connect_timeout, Some(Duration::from_millis(1500)));
        assert_eq!(url.request_timeout, Some(Duration::from_millis(700)));
        // The short form takes the same parameters.
        assert_eq!(etcd_of("etcd:h:1?prefix=p/").prefix.as_deref(), Some("p/"));
        // Limits: both ends of each range.
        assert_eq!(
            etcd_of("etcd://h:1?connect-timeout-ms=600000").connect_timeout,
            Some(Duration::from_secs(600))
        );
        assert_eq!(
            etcd_of("etcd://h:1?request-timeout-ms=1").request_timeout,
            Some(Duration::from_millis(1))
        );
        assert_eq!(
            StoreUrl::parse("sqlite:x.db?busy-wait-ms=0"),
            Ok(sqlite("x.db", Some(Duration::ZERO)))
        );
    }

    // covers: Url.Options, Url.Unechoed
    #[test]
    fn every_bad_parameter_is_named() {
        let param = |url: &str| StoreUrl::parse(url).unwrap_err();
        for (url, name) in [
            ("etcd://h:1?prefix=", "prefix"),
            ("etcd://h:1?user=&password-file=f", "user"),
            ("etcd://h:1?user=u&password-file=", "password-file"),
            ("etcd://h:1?ca=", "ca"),
            ("etcd://h:1?ca=c&cert=&key=k", "cert"),
            ("etcd://h:1?ca=c&cert=c&key=", "key"),
            ("etcd://h:1?ca=c&server-name=", "server-name"),
            ("etcd://h:1?prefix=a%0Ab", "prefix"),
            ("etcd://h:1?connect-timeout-ms=0", "connect-timeout-ms"),
            ("etcd://h:1?connect-timeout-ms=600001", "connect-timeout-ms"),
            ("etcd://h:1?request-timeout-ms=1.5", "request-timeout-ms"),
            ("etcd://h:1?request-timeout-ms=-1", "request-timeout-ms"),
            ("sqlite:x?busy-wait-ms=10001", "busy-wait-ms"),
            ("sqlite:x?busy-wait-ms=soon", "busy-wait-ms"),
        ] {
            match param(url) {
                UrlError::BadParameter { name: got, .. } => assert_eq!(got, name, "{url}"),
                other => panic!("{url}: {other:?}"),
            }
            assert!(param(url).to_string().contains(name), "{url}");
        }
        for (url, name) in [
            ("etcd://h:1?prefix=a&prefix=b", "prefix"),
            ("etcd://h:1?user=a&user=b&password-file=f", "user"),
            ("sqlite:x?busy-wait-ms=1&busy-wait-ms=2", "busy-wait-ms"),
        ] {
            assert_eq!(param(url), UrlError::RepeatedParameter { name }, "{url}");
        }
        for (url, name, needs) in [
            ("etcd://h:1?user=u", "user", "password-file"),
            ("etcd://h:1?password-file=f", "password-file", "user"),
            ("etcd://h:1?ca=c&cert=c", "cert", "key"),
            ("etcd://h:1?ca=c&key=k", "key", "cert"),
            ("etcd://h:1?cert=c&key=k", "cert", "ca"),
            ("etcd://h:1?server-name=n", "server-name", "ca"),
        ] {
            assert_eq!(
                param(url),
                UrlError::MissingParameter { name, needs },
                "{url}"
            );
        }
        assert_eq!(
            param("etcd://h:1?tls=yes"),
            UrlError::UnknownParameter {
                store: "etcd",
                near_miss: None
            }
        );
        assert_eq!(
            param("sqlite:x?mode=ro"),
            UrlError::UnknownParameter {
                store: "sqlite",
                near_miss: None
            }
        );
        assert_eq!(
            param("etcd://h:1?prefx=a/"),
            UrlError::UnknownParameter {
                store: "etcd",
                near_miss: Some(("prefx".into(), "prefix"))
            }
        );
        assert_eq!(
            param("sqlite:x?busy_wait_ms=5").to_string(),
            "sqlite has no parameter \"busy_wait_ms\"; did you mean busy-wait-ms?"
        );
    }

    // covers: Url.Secrets, Url.Unechoed
    #[test]
    fn passwords_are_refused_and_never_echoed() {
        for (url, error) in [
            ("etcd://vvm:hunter2@h:1", UrlError::CredentialsInUrl),
            ("etcd://vvm@h:1", UrlError::CredentialsInUrl),
            ("etcd:vvm:hunter2@h:1", UrlError::CredentialsInUrl),
            ("etcd://h:1,vvm:hunter2@g:1/", UrlError::CredentialsInUrl),
            (
                "etcd://h:1?user=vvm&password=hunter2",
                UrlError::PasswordInUrl,
            ),
            // A scheme typed wrong: the text could be anything, it is not quoted.
            ("etcd//vvm:hunter2@h:1", UrlError::NoScheme),
            ("hunter2", UrlError::NoScheme),
            // A secret pasted where a parameter goes is not repeated back.
            (
                "etcd://h:1?hunter2",
                UrlError::UnknownParameter {
                    store: "etcd",
                    near_miss: None,
                },
            ),
            (
                "etcd://h:1?user=u&password-file=f&hunter2=",
                UrlError::UnknownParameter {
                    store: "etcd",
                    near_miss: None,
                },
            ),
            (
                "sqlite:x.db?hunter2",
                UrlError::UnknownParameter {
                    store: "sqlite",
                    near_miss: None,
                },
            ),
        ] {
            let refused = StoreUrl::parse(url).unwrap_err();
            assert_eq!(refused, error, "{url}");
            assert!(!refused.to_string().contains("hunter2"), "{refused}");
            assert!(!format!("{refused:?}").contains("hunter2"), "{refused:?}");
        }
    }

    // covers: Url.Secrets
    #[test]
    fn display_and_debug_redact_the_credentials() {
        let url = StoreUrl::parse(
            "etcd://h:1/?user=alice&password-file=/run/alice-pw&ca=/etc/ca.pem&cert=/etc/c.pem&key=/etc/alice.key&prefix=p/",
        )
        .unwrap();
        for shown in [url.to_string(), format!("{url:?}")] {
            for secret in ["alice", "/run/alice-pw", "/etc/alice.key"] {
                assert!(!shown.contains(secret), "{shown} shows {secret}");
            }
            assert!(shown.contains("ca=%2Fetc%2Fca.pem"), "{shown}");
            assert!(shown.contains("prefix=p%2F"), "{shown}");
        }
        let StoreUrl::Etcd(etcd) = &url else {
            panic!("{url}")
        };
        assert!(!format!("{etcd:?}").contains("alice"));
        // The printed form parses to the same options, less the redacted values.
        let again = etcd_of(&url.to_string());
        assert_eq!(again.ca, etcd.ca);
        assert_eq!(again.prefix, etcd.prefix);
    }

    // covers: Url.Parse
    #[test]
    fn every_bad_url_gets_its_own_error() {
        assert_eq!(StoreUrl::parse(""), Err(UrlError::Empty));
        assert!(matches!(
            StoreUrl::parse(&"m".repeat(URL_MAX_BYTES + 1)),
            Err(UrlError::TooLong { .. })
        ));
        assert_eq!(
            StoreUrl::parse("sqlite:a\0b"),
            Err(UrlError::ControlCharacter)
        );
        assert_eq!(StoreUrl::parse("leases.db"), Err(UrlError::NoScheme));
        assert_eq!(
            StoreUrl::parse("redis:x"),
            Err(UrlError::UnknownScheme("redis".into()))
        );
        assert_eq!(
            StoreUrl::parse("memory:x"),
            Err(UrlError::MemoryTakesNothing)
        );
        assert_eq!(StoreUrl::parse("sqlite:"), Err(UrlError::NoPath));
        assert_eq!(StoreUrl::parse("sqlite://"), Err(UrlError::NoPath));
        assert_eq!(
            StoreUrl::parse("sqlite://?shared-group=true"),
            Err(UrlError::NoPath)
        );
        assert_eq!(
            StoreUrl::parse("sqlite:?busy-wait-ms=1"),
            Err(UrlError::NoPath)
        );
        assert_eq!(StoreUrl::parse("etcd:"), Err(UrlError::NoEndpoint));
        assert_eq!(StoreUrl::parse("etcd://"), Err(UrlError::NoEndpoint));
        assert_eq!(StoreUrl::parse("etcd:a:1,"), Err(UrlError::NoEndpoint));
        for bad in [
            "etcd://h:1/x",
            "etcd://h:1//",
            "etcd://h:1#f",
            "etcd://h:1/?prefix=a#f",
        ] {
            assert_eq!(StoreUrl::parse(bad), Err(UrlError::BadPath), "{bad}");
        }
        for bad in [
            "etcd:localhost",
            "etcd::2379",
            "etcd:h:",
            "etcd:h:0",
            "etcd:h:65536",
            "etcd:h:port",
            "etcd:h:1:2",
            "etcd:[::1:2379",
            "etcd:[zz]:2379",
            "etcd:h/x:2379",
            "etcd://h:1,g",
            "etcd:h%20x:1",
        ] {
            assert!(
                matches!(StoreUrl::parse(bad), Err(UrlError::BadEndpoint { .. })),
                "{bad}: {:?}",
                StoreUrl::parse(bad)
            );
        }
        let many = format!("etcd:{}", vec!["h:1"; ETCD_ENDPOINTS_MAX + 1].join(","));
        assert!(matches!(
            StoreUrl::parse(&many),
            Err(UrlError::TooManyEndpoints { .. })
        ));
        let most = format!("etcd:{}", vec!["h:1"; ETCD_ENDPOINTS_MAX].join(","));
        assert!(StoreUrl::parse(&most).is_ok());
    }

    fn postgres_of(url: &str) -> PostgresUrl {
        match StoreUrl::parse(url) {
            Ok(StoreUrl::Postgres(postgres)) => postgres,
            other => panic!("{url}: {other:?}"),
        }
    }

    // covers: Pg.Url
    #[test]
    fn postgres_urls_parse_with_defaults_and_options_and_hide_the_user() {
        let url = postgres_of("postgres://vvm@db.example/app");
        assert_eq!(
            (
                url.host.as_str(),
                url.port,
                url.user.as_str(),
                url.dbname.as_str()
            ),
            ("db.example", 5432, "vvm", "app")
        );
        assert_eq!(
            postgres_of("postgresql://alice@10.0.0.1:6543").dbname,
            "alice"
        );
        assert_eq!(postgres_of("postgres://a@[::1]:5/d").host, "::1");
        let url = postgres_of(
            "postgres://al%40ice@h:1/d?schema=s1&prefix=p%2F&password-file=%2Frun%2Fpw\
             &connect-timeout-ms=250&connections=3&sslmode=verify-full&ca=%2Fca.pem\
             &cert=%2Fc.pem&key=%2Fsecret%2Fc.key",
        );
        assert_eq!(url.user, "al@ice");
        assert_eq!(url.schema.as_deref(), Some("s1"));
        assert_eq!(url.prefix.as_deref(), Some("p/"));
        assert_eq!(
            url.password_file.as_deref(),
            Some(std::path::Path::new("/run/pw"))
        );
        assert_eq!(url.connect_timeout, Some(Duration::from_millis(250)));
        assert_eq!(url.connections, Some(3));
        assert_eq!(url.sslmode, Some(SslMode::VerifyFull));
        assert_eq!(url.ca.as_deref(), Some(std::path::Path::new("/ca.pem")));
        let shown = StoreUrl::Postgres(url.clone()).to_string();
        assert_eq!(
            shown,
            "postgres://<redacted>@h:1/d?schema=s1&prefix=p%2F&password-file=%3Credacted%3E&connect-timeout-ms=250&connections=3\
             &sslmode=verify-full&ca=%2Fca.pem&cert=%2Fc.pem&key=%3Credacted%3E"
        );
        for hidden in ["ice", "/run/pw", "secret"] {
            assert!(!format!("{url:?}").contains(hidden), "{hidden}");
        }
        // The canonical form parses back to the same options (but the hidden ones).
        assert_eq!(
            postgres_of(
                &shown
                    .replacen("%3Credacted%3E", "%2Frun%2Fpw", 1)
                    .replace("%3Credacted%3E", "%2Fsecret%2Fc.key")
                    .replace("<redacted>", "al%40ice")
            ),
            url
        );
    }

    // covers: Pg.Url, Url.Secrets
    #[test]
    fn postgres_urls_refuse_passwords_unusable_tls_parameters_and_pgpass() {
        for (url, expected) in [
            ("postgres://vvm:hunter2@h/d", UrlError::CredentialsInUrl),
            (
                "postgres://vvm@h/d?password=hunter2",
                UrlError::PasswordInUrl,
            ),
            (
                "postgres://h/d",
                UrlError::PostgresForm("the user is missing (USER@ before the host)"),
            ),
            (
                "postgres:h",
                UrlError::PostgresForm("the // after the scheme is missing"),
            ),
            (
                "postgres://vvm@h:0/d",
                UrlError::PostgresForm("the port is not a number from 1 to 65535"),
            ),
            (
                "postgres://vvm@h/d/e",
                UrlError::PostgresForm("the database name holds a /"),
            ),
        ] {
            assert_eq!(StoreUrl::parse(url), Err(expected), "{url}");
        }
        for (url, expected) in [
            (
                "postgres://vvm@h/d?sslmode=verify-ca",
                UrlError::MissingParameter {
                    name: "sslmode",
                    needs: "ca",
                },
            ),
            (
                "postgres://vvm@h/d?sslmode=verify-full&cert=%2Fc",
                UrlError::MissingParameter {
                    name: "sslmode",
                    needs: "ca",
                },
            ),
            (
                "postgres://vvm@h/d?sslmode=require&cert=%2Fc",
                UrlError::MissingParameter {
                    name: "cert",
                    needs: "key",
                },
            ),
            (
                "postgres://vvm@h/d?key=%2Fk",
                UrlError::MissingParameter {
                    name: "key",
                    needs: "cert",
                },
            ),
        ] {
            assert_eq!(StoreUrl::parse(url), Err(expected), "{url}");
        }
        for (url, name, says) in [
            ("postgres://vvm@h/d?sslmode=allow", "sslmode", "prefer"),
            (
                "postgres://vvm@h/d?sslmode=strict",
                "sslmode",
                "verify-full",
            ),
            ("postgres://vvm@h/d?ca=%2Fca", "ca", "require"),
            (
                "postgres://vvm@h/d?sslmode=prefer&ca=%2Fca",
                "ca",
                "require",
            ),
            (
                "postgres://vvm@h/d?sslmode=disable&cert=%2Fc&key=%2Fk",
                "cert",
                "disable",
            ),
        ] {
            let refused = StoreUrl::parse(url).unwrap_err();
            assert!(
                matches!(refused, UrlError::BadParameter { name: n, .. } if n == name),
                "{url}: {refused:?}"
            );
            assert!(refused.to_string().contains(says), "{refused}");
        }
        for mode in ["disable", "prefer", "require"] {
            assert!(StoreUrl::parse(&format!("postgres://vvm@h/d?sslmode={mode}")).is_ok());
        }
        assert!(
            StoreUrl::parse("postgres://vvm@h/d?sslmode=require&ca=%2Fca&cert=%2Fc&key=%2Fk")
                .is_ok()
        );
        let refused = StoreUrl::parse("postgres://vvm@h/d?passfile=%2Froot%2F.pgpass").unwrap_err();
        assert!(refused.to_string().contains("password-file="), "{refused}");
        for (url, name) in [
            ("postgres://vvm@h/d?connections=0", "connections"),
            ("postgres://vvm@h/d?connections=257", "connections"),
            ("postgres://vvm@h/d?schema=", "schema"),
        ] {
            assert!(
                matches!(StoreUrl::parse(url), Err(UrlError::BadParameter { name: n, .. }) if n == name),
                "{url}"
            );
        }
        assert!(matches!(
            StoreUrl::parse("postgres://vvm@h/d?schemas=x"),
            Err(UrlError::UnknownParameter {
                store: "postgres",
                near_miss: Some(_)
            })
        ));
    }

    /// `death=advisory-lock` turns PostgreSQL's session marks on; `death=ttl` is the default; any
    /// other value, a second one, and the parameter on any other store are refused.
    // covers: Pg.Marks
    #[test]
    fn the_death_signal_is_chosen_on_postgres_only() {
        let postgres = |url: &str| match StoreUrl::parse(url) {
            Ok(StoreUrl::Postgres(postgres)) => postgres,
            other => panic!("{url}: {other:?}"),
        };
        let marks = postgres("postgres://vvm@h/d?death=advisory-lock");
        assert!(marks.advisory_lock);
        assert!(
            marks.to_string().ends_with("?death=advisory-lock"),
            "{marks}"
        );
        assert!(!postgres("postgres://vvm@h/d?death=ttl").advisory_lock);
        assert!(!postgres("postgres://vvm@h/d").advisory_lock);
        for url in [
            "postgres://vvm@h/d?death=lock",
            "postgres://vvm@h/d?death=ttl&death=advisory-lock",
        ] {
            assert!(
                matches!(
                    StoreUrl::parse(url),
                    Err(UrlError::BadParameter { name: "death", .. }
                        | UrlError::RepeatedParameter { name: "death" })
                ),
                "{url}: {:?}",
                StoreUrl::parse(url)
            );
        }
        for (url, store) in [
            ("sqlite:/tmp/x.sqlite?death=advisory-lock", "sqlite"),
            ("etcd://127.0.0.1:2379/?death=advisory-lock", "etcd"),
        ] {
            assert!(
                matches!(
                    StoreUrl::parse(url),
                    Err(UrlError::UnknownParameter { store: s, .. }) if s == store
                ),
                "{url}: {:?}",
                StoreUrl::parse(url)
            );
        }
    }
}
