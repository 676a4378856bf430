//! How to reach etcd: endpoints, key prefix, credentials, TLS and timeouts, and the errors of
//! setting them up.

use std::fmt;
use std::time::Duration;
use vvm_runtime::Cause;

/// Most endpoints one store connects to.
pub const ENDPOINTS_MAX: usize = 64;
/// Longest endpoint, in bytes.
pub const ENDPOINT_MAX_BYTES: usize = 512;
/// Longest key prefix, in bytes.
pub const PREFIX_MAX_BYTES: usize = 256;
/// The key prefix used unless [`EtcdOptions::prefix`] sets another: keys are `vvm/slot/<n>`.
pub const PREFIX_DEFAULT: &str = "vvm/slot/";
/// Default bound of one connection attempt.
pub const CONNECT_TIMEOUT_DEFAULT: Duration = Duration::from_secs(2);
/// Default bound of one request. The runtime puts a shorter one of its own around every call;
/// this one only bounds requests nobody else bounds (background lease revocations).
pub const REQUEST_TIMEOUT_DEFAULT: Duration = Duration::from_secs(5);

/// Something that keeps the etcd store from being set up or used as configured.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum EtcdError {
    /// No endpoint was given.
    #[error("at least one etcd endpoint is needed")]
    NoEndpoints,
    /// More than [`ENDPOINTS_MAX`] endpoints.
    #[error("{count} etcd endpoints is more than the maximum of {max}")]
    TooManyEndpoints {
        /// How many were given.
        count: usize,
        /// [`ENDPOINTS_MAX`].
        max: usize,
    },
    /// An endpoint is empty, too long or contains whitespace or control characters.
    #[error("etcd endpoint {endpoint:?} is not usable: {reason}")]
    BadEndpoint {
        /// The endpoint (shortened when very long).
        endpoint: String,
        /// What is wrong with it.
        reason: &'static str,
    },
    /// The key prefix is longer than [`PREFIX_MAX_BYTES`].
    #[error("key prefix of {len} bytes is longer than the maximum of {max}")]
    PrefixTooLong {
        /// Its length.
        len: usize,
        /// [`PREFIX_MAX_BYTES`].
        max: usize,
    },
    /// The key prefix is empty: the records would mix with every other key of the cluster.
    #[error("the etcd key prefix is empty; give one such as \"vvm/slot/\"")]
    PrefixEmpty,
    /// The key prefix holds a NUL byte, which etcd keys of this store never carry.
    #[error("the etcd key prefix {prefix:?} holds a NUL byte")]
    PrefixHasNul {
        /// The prefix (shortened when very long).
        prefix: String,
    },
    /// The key prefix ends with an ASCII digit: its keys could equal those of another prefix
    /// (`app1` + slot 1 and `app` + slot 11 are both `app11`).
    #[error("the etcd key prefix {prefix:?} ends with a digit, so its keys could be another prefix's (\"app1\" slot 1 and \"app\" slot 11 are both \"app11\"); end it with a separator such as \"/\"")]
    PrefixEndsWithDigit {
        /// The prefix (shortened when very long).
        prefix: String,
    },
    /// The key prefix holds `session/`: its slot keys could equal another prefix's session
    /// records (`a` + `session/<key>` is prefix `asession/<incarnation>-` + a slot number).
    #[error("the etcd key prefix {prefix:?} holds \"session/\", which names session records under a shorter prefix; pick another")]
    PrefixHasSessionPart {
        /// The prefix (shortened when very long).
        prefix: String,
    },
    /// A timeout is zero.
    #[error("the etcd {name} must be above zero")]
    TimeoutZero {
        /// Which timeout.
        name: &'static str,
    },
    /// The lease is shorter than etcd's minimum of [`TTL_MIN`](super::TTL_MIN).
    #[error("a lease of {ttl:?} is shorter than etcd's minimum lease TTL of {min:?}")]
    TtlTooShort {
        /// The lease asked for.
        ttl: Duration,
        /// [`TTL_MIN`](super::TTL_MIN).
        min: Duration,
    },
    /// etcd leases last whole seconds; a fractional lease would be rounded.
    #[error("a lease of {ttl:?} is not a whole number of seconds; etcd leases are granted in whole seconds")]
    TtlNotWholeSeconds {
        /// The lease asked for.
        ttl: Duration,
    },
    /// The lease is longer than etcd accepts.
    #[error("a lease of {ttl:?} is longer than etcd's maximum lease TTL of {max:?}")]
    TtlTooLong {
        /// The lease asked for.
        ttl: Duration,
        /// [`TTL_MAX`](super::TTL_MAX).
        max: Duration,
    },
    /// The server granted a lease of a different length: its own minimum (1.5 × its election
    /// timeout) is above what was asked for, and it would silently keep records alive longer.
    #[error("etcd granted a lease of {granted_secs} s when {asked_secs} s was asked for; its minimum lease TTL (1.5 x election timeout) is higher")]
    TtlNotHonoured {
        /// The TTL asked for, in seconds.
        asked_secs: i64,
        /// The TTL the server granted, in seconds.
        granted_secs: i64,
    },
    /// The client could not be set up, or the server refused it (credentials, TLS, a request
    /// it would not serve): waiting does not mend it.
    #[error("could not reach etcd")]
    Connect {
        /// What the client said (an [`EtcdClientError`](super::EtcdClientError)).
        source: Cause,
    },
    /// The cluster could not serve for now: no member could be reached in time, connections
    /// were refused or broke, or the members have no leader (no quorum). Unlike
    /// [`Connect`](Self::Connect), this passes when the cluster returns
    /// ([`is_unavailable`](Self::is_unavailable)).
    #[error("etcd is unavailable (unreachable, or without a quorum)")]
    Unavailable {
        /// What the client said (an [`EtcdClientError`](super::EtcdClientError)).
        source: Cause,
    },
    /// The credentials may not write the store's keys (read-only rights on the prefix, or
    /// rights on another prefix only): nothing can ever be won, so this is not retried.
    #[error("permission denied: the etcd user may not write the keys under the prefix {prefix:?}; grant its role readwrite on that prefix (`etcdctl role grant-permission ROLE --prefix=true readwrite {prefix}`)")]
    NoWritePermission {
        /// The store's key prefix.
        prefix: String,
    },
    /// etcd refused the user name or password.
    #[error("authentication failed: etcd refused the password of user {user:?}")]
    Authentication {
        /// The user name.
        user: String,
        /// What the client said (an [`EtcdClientError`](super::EtcdClientError)).
        source: Cause,
    },
    /// A lease could not be granted (the cause of a failed insert or swap).
    #[error("etcd did not grant a lease")]
    Grant {
        /// What the client said (an [`EtcdClientError`](super::EtcdClientError)).
        source: Cause,
    },
    /// A write was answered without the revision it created.
    #[error("etcd answered a write without a revision")]
    NoRevision,
    /// etcd answered a revision no record can have (not above zero).
    #[error("etcd answered with revision {revision}")]
    BadRevision {
        /// What it answered.
        revision: i64,
    },
    /// The store already keeps the lease ids of [`SESSIONS_MAX`](super::SESSIONS_MAX) sessions;
    /// nothing was written.
    #[error("the etcd store already knows {max} sessions")]
    SessionsFull {
        /// [`SESSIONS_MAX`](super::SESSIONS_MAX).
        max: usize,
    },
    /// A keepalive asked for another TTL than the one the session's lease was granted with:
    /// etcd renews a lease to its own TTL, which cannot change.
    #[error("the session's etcd lease lasts {lease_secs} s; a keepalive of {asked_secs} s cannot change it")]
    SessionTtlMismatch {
        /// The TTL asked for, in seconds.
        asked_secs: i64,
        /// The TTL of the session's lease, in seconds.
        lease_secs: i64,
    },
    /// The record under a session's key is not bound to an etcd lease: this store did not write
    /// it, and cannot keep it alive or bind holdings to it.
    #[error("the etcd record of session {session} is not bound to a lease")]
    SessionNotLeased {
        /// The session key (`<incarnation, 16 hex digits>-<id>`).
        session: String,
    },
    /// etcd's answer to a transaction contradicts its own comparison.
    #[error("etcd answered inconsistently: {what}")]
    Inconsistent {
        /// What did not fit.
        what: &'static str,
    },
}

impl EtcdError {
    /// Whether the cluster was only unavailable for now ([`EtcdError::Unavailable`]): a host
    /// may wait for it and try again, where every other error is a setup to mend.
    pub fn is_unavailable(&self) -> bool {
        matches!(self, EtcdError::Unavailable { .. })
    }
}

/// A user name and password for etcd's authentication. The password is never shown by
/// `Debug` or in any log line.
#[derive(Clone, PartialEq, Eq)]
pub struct Credentials {
    user: String,
    password: String,
}

impl Credentials {
    /// Credentials of `user`.
    pub fn new(user: impl Into<String>, password: impl Into<String>) -> Self {
        Credentials {
            user: user.into(),
            password: password.into(),
        }
    }

    /// The user name.
    pub fn user(&self) -> &str {
        &self.user
    }

    pub(super) fn password(&self) -> &str {
        &self.password
    }
}

impl fmt::Debug for Credentials {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Credentials")
            .field("user", &self.user)
            .field("password", &"<redacted>")
            .finish()
    }
}

/// TLS towards etcd (feature `etcd-tls`): the CA that signed the servers' certificates, an
/// optional client certificate and an optional server name to verify instead of the host.
/// The private key is never shown by `Debug`.
#[cfg(feature = "etcd-tls")]
#[derive(Clone, Default, PartialEq, Eq)]
pub struct EtcdTls {
    /// PEM of the certificate authority; the platform's roots are not used.
    pub ca_pem: Option<Vec<u8>>,
    /// PEM of the client certificate and of its private key.
    pub identity_pem: Option<(Vec<u8>, Vec<u8>)>,
    /// The name the servers' certificates must carry, when not the endpoint's host.
    pub domain: Option<String>,
}

#[cfg(feature = "etcd-tls")]
impl fmt::Debug for EtcdTls {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("EtcdTls")
            .field("ca_pem", &self.ca_pem.as_ref().map(|pem| pem.len()))
            .field("client_certificate", &self.identity_pem.is_some())
            .field("domain", &self.domain)
            .finish()
    }
}

/// Where and how the etcd store connects.
///
/// ```
/// use std::time::Duration;
/// use vvm_adapters::etcd::{Credentials, EtcdOptions};
///
/// let options = EtcdOptions::new(["127.0.0.1:2379", "127.0.0.1:22379"])
///     .unwrap()
///     .prefix("prod/vvm/")
///     .unwrap()
///     .credentials(Credentials::new("vvm", "s3cret"));
/// assert!(!format!("{options:?}").contains("s3cret"));
/// ```
#[derive(Clone, Debug)]
pub struct EtcdOptions {
    pub(super) endpoints: Vec<String>,
    pub(super) prefix: String,
    pub(super) credentials: Option<Credentials>,
    #[cfg(feature = "etcd-tls")]
    pub(super) tls: Option<EtcdTls>,
    pub(super) connect_timeout: Duration,
    pub(super) request_timeout: Duration,
}

impl EtcdOptions {
    /// Options for the members at `endpoints` (`host:port`, or `http://host:port`; with the
    /// `etcd-tls` feature also `https://host:port`).
    pub fn new<E: Into<String>>(endpoints: impl IntoIterator<Item = E>) -> Result<Self, EtcdError> {
        let mut checked = Vec::new();
        for endpoint in endpoints {
            let endpoint = endpoint.into();
            if checked.len() == ENDPOINTS_MAX {
                return Err(EtcdError::TooManyEndpoints {
                    count: ENDPOINTS_MAX + 1,
                    max: ENDPOINTS_MAX,
                });
            }
            check_endpoint(&endpoint)?;
            checked.push(endpoint);
        }
        if checked.is_empty() {
            return Err(EtcdError::NoEndpoints);
        }
        Ok(EtcdOptions {
            endpoints: checked,
            prefix: PREFIX_DEFAULT.to_owned(),
            credentials: None,
            #[cfg(feature = "etcd-tls")]
            tls: None,
            connect_timeout: CONNECT_TIMEOUT_DEFAULT,
            request_timeout: REQUEST_TIMEOUT_DEFAULT,
        })
    }

    /// Keys are `<prefix><slot number>`; several deployments can share one cluster under
    /// different prefixes. Default [`PREFIX_DEFAULT`].
    ///
    /// The prefix must not be empty, hold a NUL byte, or end with an ASCII digit: then the
    /// slot number is exactly the key's trailing run of digits, so no two (prefix, slot) pairs
    /// share a key, and keys of other prefixes are never touched.
    ///
    /// ```
    /// use vvm_adapters::etcd::{EtcdError, EtcdOptions};
    ///
    /// let options = EtcdOptions::new(["127.0.0.1:2379"]).unwrap();
    /// assert!(options.clone().prefix("app/").is_ok());
    /// // "app1" slot 1 would be "app11", the key of "app" slot 11.
    /// assert!(matches!(options.clone().prefix("app1"), Err(EtcdError::PrefixEndsWithDigit { .. })));
    /// assert_eq!(options.prefix("").unwrap_err(), EtcdError::PrefixEmpty);
    /// ```
    pub fn prefix(mut self, prefix: impl Into<String>) -> Result<Self, EtcdError> {
        let prefix = prefix.into();
        check_prefix(&prefix)?;
        self.prefix = prefix;
        Ok(self)
    }

    /// Authenticates as this user; expired tokens are refreshed automatically.
    pub fn credentials(mut self, credentials: Credentials) -> Self {
        self.credentials = Some(credentials);
        self
    }

    /// Speaks TLS to every endpoint.
    #[cfg(feature = "etcd-tls")]
    pub fn tls(mut self, tls: EtcdTls) -> Self {
        self.tls = Some(tls);
        self
    }

    /// Bound of one connection attempt (default [`CONNECT_TIMEOUT_DEFAULT`]).
    pub fn connect_timeout(mut self, timeout: Duration) -> Result<Self, EtcdError> {
        if timeout.is_zero() {
            return Err(EtcdError::TimeoutZero {
                name: "connect timeout",
            });
        }
        self.connect_timeout = timeout;
        Ok(self)
    }

    /// Bound of one request (default [`REQUEST_TIMEOUT_DEFAULT`]).
    pub fn request_timeout(mut self, timeout: Duration) -> Result<Self, EtcdError> {
        if timeout.is_zero() {
            return Err(EtcdError::TimeoutZero {
                name: "request timeout",
            });
        }
        self.request_timeout = timeout;
        Ok(self)
    }

    /// The endpoints.
    pub fn endpoints(&self) -> &[String] {
        &self.endpoints
    }

    /// The key prefix.
    pub fn key_prefix(&self) -> &str {
        &self.prefix
    }
}

/// Why `prefix` cannot be a key prefix, if it cannot. Existing keys under every accepted prefix
/// (the default among them) keep their spelling: only the prefixes whose keys could collide
/// are refused, so that processes of older and newer versions on one cluster agree on each key.
/// What follows the prefix in the key of a session record.
pub(super) const SESSION_PART: &str = "session/";

fn check_prefix(prefix: &str) -> Result<(), EtcdError> {
    let shown = || prefix.chars().take(64).collect::<String>();
    if prefix.len() > PREFIX_MAX_BYTES {
        return Err(EtcdError::PrefixTooLong {
            len: prefix.len(),
            max: PREFIX_MAX_BYTES,
        });
    }
    if prefix.is_empty() {
        return Err(EtcdError::PrefixEmpty);
    }
    if prefix.contains('\0') {
        return Err(EtcdError::PrefixHasNul { prefix: shown() });
    }
    if prefix.ends_with(|c: char| c.is_ascii_digit()) {
        return Err(EtcdError::PrefixEndsWithDigit { prefix: shown() });
    }
    if prefix.contains(SESSION_PART) {
        return Err(EtcdError::PrefixHasSessionPart { prefix: shown() });
    }
    Ok(())
}

fn check_endpoint(endpoint: &str) -> Result<(), EtcdError> {
    let bad = |reason| EtcdError::BadEndpoint {
        endpoint: endpoint.chars().take(64).collect(),
        reason,
    };
    if endpoint.is_empty() {
        return Err(bad("it is empty"));
    }
    if endpoint.len() > ENDPOINT_MAX_BYTES {
        return Err(bad("it is longer than 512 bytes"));
    }
    if endpoint
        .chars()
        .any(|c| c.is_whitespace() || c.is_control())
    {
        return Err(bad("it contains whitespace or control characters"));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    // covers: Et.Options
    #[test]
    fn bad_options_are_refused_with_their_reason() {
        let none: [&str; 0] = [];
        assert_eq!(EtcdOptions::new(none).unwrap_err(), EtcdError::NoEndpoints);
        assert!(matches!(
            EtcdOptions::new([""]).unwrap_err(),
            EtcdError::BadEndpoint {
                reason: "it is empty",
                ..
            }
        ));
        assert!(matches!(
            EtcdOptions::new(["a b:1"]).unwrap_err(),
            EtcdError::BadEndpoint { .. }
        ));
        let many = (0..=ENDPOINTS_MAX).map(|i| format!("h{i}:2379"));
        assert!(matches!(
            EtcdOptions::new(many).unwrap_err(),
            EtcdError::TooManyEndpoints { .. }
        ));
        let options = EtcdOptions::new(["h:1"]).unwrap();
        assert!(matches!(
            options.clone().prefix("p".repeat(PREFIX_MAX_BYTES + 1)),
            Err(EtcdError::PrefixTooLong { .. })
        ));
        assert!(matches!(
            options.clone().request_timeout(Duration::ZERO),
            Err(EtcdError::TimeoutZero { .. })
        ));
        assert!(matches!(
            options.connect_timeout(Duration::ZERO),
            Err(EtcdError::TimeoutZero { .. })
        ));
    }

    /// The key of `slot` under `prefix`, as the store spells it.
    fn key(prefix: &str, slot: u32) -> Vec<u8> {
        format!("{prefix}{slot}").into_bytes()
    }

    // covers: Et.KeysDistinct
    #[test]
    fn no_two_accepted_prefix_and_slot_pairs_share_a_key() {
        let options = EtcdOptions::new(["h:1"]).unwrap();
        // Every prefix of up to 3 characters over letters, digits and separators.
        let alphabet = ["a", "p", "1", "0", "/", "-"];
        let mut prefixes = vec![String::new()];
        for _ in 0..3 {
            let longer: Vec<String> = prefixes
                .iter()
                .flat_map(|p| alphabet.iter().map(move |c| format!("{p}{c}")))
                .collect();
            prefixes.extend(longer);
        }
        prefixes.sort();
        prefixes.dedup();
        let accepted: Vec<&String> = prefixes
            .iter()
            .filter(|p| options.clone().prefix(p.as_str()).is_ok())
            .collect();
        assert!(accepted.len() > 50, "{} prefixes accepted", accepted.len());
        let mut owners: std::collections::HashMap<Vec<u8>, (&str, u32)> = Default::default();
        for prefix in &accepted {
            for slot in (1..=120).chain([1_000, 4_294_967_295]) {
                if let Some(other) = owners.insert(key(prefix, slot), (prefix, slot)) {
                    panic!(
                        "prefix {prefix:?} slot {slot} and prefix {:?} slot {} share a key",
                        other.0, other.1
                    );
                }
            }
        }
        // No slot key of an accepted prefix is a session record's key under another: a prefix
        // that ends where a session key's number begins holds "session/" and is refused.
        for prefix in &accepted {
            let colliding = format!("{prefix}{SESSION_PART}00000000000000ff-");
            assert!(matches!(
                options.clone().prefix(colliding.as_str()),
                Err(EtcdError::PrefixHasSessionPart { .. })
            ));
        }
    }

    // covers: Et.KeysDistinct
    #[test]
    fn an_empty_prefix_one_with_nul_or_a_trailing_digit_is_refused() {
        let options = EtcdOptions::new(["h:1"]).unwrap();
        assert_eq!(
            options.clone().prefix("").unwrap_err(),
            EtcdError::PrefixEmpty
        );
        assert!(matches!(
            options.clone().prefix("a\0b/"),
            Err(EtcdError::PrefixHasNul { .. })
        ));
        for prefix in ["app1", "0", "team/7", "vvm/slot/9"] {
            assert!(
                matches!(
                    options.clone().prefix(prefix),
                    Err(EtcdError::PrefixEndsWithDigit { .. })
                ),
                "{prefix:?} accepted"
            );
        }
        for prefix in ["app", "app1/", "vvm/slot/", "a", "x\u{663}"] {
            let set = options.clone().prefix(prefix).expect("accepted");
            assert_eq!(set.key_prefix(), prefix);
        }
        let message = options.prefix("app1").unwrap_err().to_string();
        assert!(
            message.contains("app1") && message.contains("separator"),
            "{message}"
        );
    }

    // covers: Et.Options
    #[test]
    fn debug_output_never_shows_the_password() {
        let options = EtcdOptions::new(["h:1"])
            .unwrap()
            .credentials(Credentials::new("alice", "hunter2"));
        let shown = format!("{options:?} {:?}", options.credentials);
        assert!(shown.contains("alice"));
        assert!(!shown.contains("hunter2"));
    }
}
