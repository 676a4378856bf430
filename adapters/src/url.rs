//! Store URLs: how a host names the store its VVMs lease slots in (feature `url`).
//!
//! | URL | store |
//! |---|---|
//! | `memory:` | the in-process memory store |
//! | `sqlite:PATH` | the SQLite file at `PATH` |
//! | `etcd:HOST:PORT[,HOST:PORT…]` | the etcd cluster with these members (`[v6]:PORT` for IPv6; `http://` or `https://` may precede each) |
//! | `fdb:` or `fdb:CLUSTER-FILE` | FoundationDB, with the default cluster file or the one given |
//!
//! ```
//! use vvm_adapters::url::StoreUrl;
//!
//! let url = StoreUrl::parse("etcd:10.0.0.1:2379,10.0.0.2:2379").unwrap();
//! assert_eq!(url, StoreUrl::Etcd(vec!["10.0.0.1:2379".into(), "10.0.0.2:2379".into()]));
//! assert_eq!(url.to_string(), "etcd:10.0.0.1:2379,10.0.0.2:2379");
//! assert_eq!(StoreUrl::parse("fdb:").unwrap(), StoreUrl::Fdb(None));
//! assert!(StoreUrl::parse("etcd:10.0.0.1").is_err());
//! ```

use std::fmt;
use std::path::PathBuf;

/// Longest URL accepted, in bytes.
pub const URL_MAX_BYTES: usize = 4096;
/// Most etcd endpoints in one URL.
pub const ETCD_ENDPOINTS_MAX: usize = 64;

/// A parsed store URL.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum StoreUrl {
    /// `memory:`.
    Memory,
    /// `sqlite:PATH`.
    Sqlite(PathBuf),
    /// `etcd:HOST:PORT[,HOST:PORT…]`: the endpoints, as written.
    Etcd(Vec<String>),
    /// `fdb:[CLUSTER-FILE]`: the cluster file, or `None` for FoundationDB's default.
    Fdb(Option<PathBuf>),
}

/// Why a store URL was refused.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum UrlError {
    /// Nothing was given.
    #[error("the store URL is empty (use memory:, sqlite:PATH, etcd:HOST:PORT[,HOST:PORT...] or fdb:[CLUSTER-FILE])")]
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
    /// No `scheme:` in front.
    #[error("store URL {0:?} has no scheme (use memory:, sqlite:PATH, etcd:HOST:PORT[,HOST:PORT...] or fdb:[CLUSTER-FILE])")]
    NoScheme(String),
    /// A scheme no store has.
    #[error("unknown store {0:?} (use memory:, sqlite:PATH, etcd:HOST:PORT[,HOST:PORT...] or fdb:[CLUSTER-FILE])")]
    UnknownScheme(String),
    /// `memory:` followed by something.
    #[error("memory: takes nothing after the colon, got {0:?}")]
    MemoryTakesNothing(String),
    /// `sqlite:` without a path.
    #[error("sqlite: needs a file path, as in sqlite:/var/lib/vvm/leases.db")]
    NoPath,
    /// `etcd:` without endpoints, or with an empty one.
    #[error("etcd: needs HOST:PORT endpoints separated by commas, as in etcd:127.0.0.1:2379")]
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
}

impl StoreUrl {
    /// Parses `url`; see the [module documentation](self) for the forms.
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
        let (scheme, rest) = url
            .split_once(':')
            .ok_or_else(|| UrlError::NoScheme(url.to_owned()))?;
        match scheme {
            "memory" if rest.is_empty() => Ok(StoreUrl::Memory),
            "memory" => Err(UrlError::MemoryTakesNothing(rest.to_owned())),
            "sqlite" if rest.is_empty() => Err(UrlError::NoPath),
            "sqlite" => Ok(StoreUrl::Sqlite(PathBuf::from(rest))),
            "etcd" => parse_endpoints(rest).map(StoreUrl::Etcd),
            "fdb" if rest.is_empty() => Ok(StoreUrl::Fdb(None)),
            "fdb" => Ok(StoreUrl::Fdb(Some(PathBuf::from(rest)))),
            other => Err(UrlError::UnknownScheme(other.to_owned())),
        }
    }
}

impl std::str::FromStr for StoreUrl {
    type Err = UrlError;

    fn from_str(url: &str) -> Result<Self, Self::Err> {
        StoreUrl::parse(url)
    }
}

impl fmt::Display for StoreUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            StoreUrl::Memory => write!(f, "memory:"),
            StoreUrl::Sqlite(path) => write!(f, "sqlite:{}", path.display()),
            StoreUrl::Etcd(endpoints) => write!(f, "etcd:{}", endpoints.join(",")),
            StoreUrl::Fdb(None) => write!(f, "fdb:"),
            StoreUrl::Fdb(Some(path)) => write!(f, "fdb:{}", path.display()),
        }
    }
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

fn check_endpoint(endpoint: &str) -> Result<(), UrlError> {
    let bad = |reason| UrlError::BadEndpoint {
        endpoint: endpoint.to_owned(),
        reason,
    };
    if endpoint.chars().any(char::is_whitespace) {
        return Err(bad("it contains whitespace"));
    }
    let address = endpoint
        .strip_prefix("http://")
        .or_else(|| endpoint.strip_prefix("https://"))
        .unwrap_or(endpoint);
    let (host, port) = if let Some(v6) = address.strip_prefix('[') {
        let (host, port) = v6
            .split_once("]:")
            .ok_or_else(|| bad("an IPv6 host is written [ADDRESS]:PORT"))?;
        if host.parse::<std::net::Ipv6Addr>().is_err() {
            return Err(bad("the IPv6 address is not valid"));
        }
        (host, port)
    } else {
        address
            .rsplit_once(':')
            .ok_or_else(|| bad("the port is missing"))?
    };
    if host.is_empty() {
        return Err(bad("the host is missing"));
    }
    if host.contains(['/', '@', '?', '#', '[', ']'])
        || (!address.starts_with('[') && host.contains(':'))
    {
        return Err(bad("the host contains a character hosts do not have"));
    }
    match port.parse::<u16>() {
        Ok(0) | Err(_) => Err(bad("the port is not a number from 1 to 65535")),
        Ok(_) => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // covers: Url.Parse
    #[test]
    fn every_store_form_parses_and_prints_back() {
        for (url, parsed) in [
            ("memory:", StoreUrl::Memory),
            (
                "sqlite:/var/lib/vvm/leases.db",
                StoreUrl::Sqlite("/var/lib/vvm/leases.db".into()),
            ),
            ("sqlite:leases.db", StoreUrl::Sqlite("leases.db".into())),
            (
                "etcd:127.0.0.1:2379",
                StoreUrl::Etcd(vec!["127.0.0.1:2379".into()]),
            ),
            (
                "etcd:a.example:2379,[::1]:2380,https://b.example:2379",
                StoreUrl::Etcd(vec![
                    "a.example:2379".into(),
                    "[::1]:2380".into(),
                    "https://b.example:2379".into(),
                ]),
            ),
            ("fdb:", StoreUrl::Fdb(None)),
            (
                "fdb:/etc/foundationdb/fdb.cluster",
                StoreUrl::Fdb(Some("/etc/foundationdb/fdb.cluster".into())),
            ),
        ] {
            assert_eq!(StoreUrl::parse(url), Ok(parsed.clone()), "{url}");
            assert_eq!(parsed.to_string(), url);
            assert_eq!(url.parse::<StoreUrl>(), Ok(parsed));
        }
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
        assert_eq!(
            StoreUrl::parse("leases.db"),
            Err(UrlError::NoScheme("leases.db".into()))
        );
        assert_eq!(
            StoreUrl::parse("redis:x"),
            Err(UrlError::UnknownScheme("redis".into()))
        );
        assert_eq!(
            StoreUrl::parse("memory:x"),
            Err(UrlError::MemoryTakesNothing("x".into()))
        );
        assert_eq!(StoreUrl::parse("sqlite:"), Err(UrlError::NoPath));
        assert_eq!(StoreUrl::parse("etcd:"), Err(UrlError::NoEndpoint));
        assert_eq!(StoreUrl::parse("etcd:a:1,"), Err(UrlError::NoEndpoint));
        for bad in [
            "etcd:localhost",
            "etcd::2379",
            "etcd:h:0",
            "etcd:h:65536",
            "etcd:h:port",
            "etcd:h:1:2",
            "etcd:[::1:2379",
            "etcd:[zz]:2379",
            "etcd:user@h:2379",
            "etcd:h/x:2379",
        ] {
            assert!(
                matches!(StoreUrl::parse(bad), Err(UrlError::BadEndpoint { .. })),
                "{bad}"
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
}
