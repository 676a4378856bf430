//! The files a store URL names (password, certificate authority, client certificate and key):
//! read with a size bound, checked for what they must hold, and named in errors without
//! revealing where the secrets live.

use std::fmt;
use std::path::{Path, PathBuf};

use super::{OpenError, FILE_MAX_BYTES};

/// What errors show instead of the path of a secret's file, as the URL's `Display` does.
const REDACTED: &str = "<redacted>";

/// The parameters whose files hold secrets: their paths are never shown.
const SECRET_PARAMETERS: &[&str] = &["password-file", "key"];

/// The path of a file named by a URL parameter, as errors show it: the path itself, or
/// `<redacted>` when the file holds a secret (`password-file=`, `key=`). `Debug` hides it alike.
#[derive(Clone, PartialEq, Eq)]
pub struct ParameterFile {
    path: PathBuf,
    secret: bool,
}

impl ParameterFile {
    /// The file named by `parameter`.
    pub fn new(parameter: &str, path: &Path) -> Self {
        ParameterFile {
            path: path.to_path_buf(),
            secret: SECRET_PARAMETERS.contains(&parameter),
        }
    }

    /// The path as given in the URL (not redacted: for the host's own use, never for output).
    pub fn path(&self) -> &Path {
        &self.path
    }
}

impl fmt::Display for ParameterFile {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.secret {
            f.write_str(REDACTED)
        } else {
            write!(f, "{}", self.path.display())
        }
    }
}

impl fmt::Debug for ParameterFile {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "ParameterFile({self})")
    }
}

/// What a PEM file named by a parameter must hold.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PemKind {
    /// At least one certificate (`ca=`, `cert=`).
    Certificate,
    /// A private key (`key=`): PKCS#8, PKCS#1 (RSA) or SEC1 (EC).
    PrivateKey,
}

impl fmt::Display for PemKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            PemKind::Certificate => "a PEM certificate (-----BEGIN CERTIFICATE-----)",
            PemKind::PrivateKey => {
                "a PEM private key (-----BEGIN PRIVATE KEY----- or its RSA/EC form)"
            }
        })
    }
}

/// Reads a file named by `parameter`, at most [`FILE_MAX_BYTES`].
#[cfg_attr(not(feature = "etcd"), allow(dead_code))]
pub(super) fn read_file(parameter: &'static str, path: &Path) -> Result<Vec<u8>, OpenError> {
    use std::io::Read;

    let failed = |source| OpenError::ReadFile {
        parameter,
        path: ParameterFile::new(parameter, path),
        source,
    };
    // Never waiting in `open`: a FIFO put at the path (by anyone who could write there) would
    // wait for a writer forever, uninterruptibly. The file is judged by its own status, and
    // only a regular file is read (the flag does not change how one is read).
    let flags =
        rustix::fs::OFlags::RDONLY | rustix::fs::OFlags::NONBLOCK | rustix::fs::OFlags::CLOEXEC;
    let fd = rustix::fs::open(path, flags, rustix::fs::Mode::empty())
        .map_err(|error| failed(error.into()))?;
    let stat = rustix::fs::fstat(&fd).map_err(|error| failed(error.into()))?;
    if rustix::fs::FileType::from_raw_mode(stat.st_mode) != rustix::fs::FileType::RegularFile {
        return Err(OpenError::ParameterNotAFile {
            parameter,
            path: ParameterFile::new(parameter, path),
        });
    }
    let file = std::fs::File::from(fd);
    let mut bytes = Vec::new();
    file.take(FILE_MAX_BYTES + 1)
        .read_to_end(&mut bytes)
        .map_err(failed)?;
    if bytes.is_empty() || bytes.len() as u64 > FILE_MAX_BYTES {
        return Err(OpenError::FileSize {
            parameter,
            path: ParameterFile::new(parameter, path),
            max: FILE_MAX_BYTES,
        });
    }
    Ok(bytes)
}

/// Reads the PEM file named by `parameter` and checks that it holds a complete block of `kind`,
/// so that a wrong file is refused when the store is opened rather than at the first TLS
/// handshake, where it would look like a network failure.
#[cfg_attr(
    not(any(feature = "etcd-tls", feature = "postgres-tls")),
    allow(dead_code)
)]
pub(super) fn read_pem(
    parameter: &'static str,
    path: &Path,
    kind: PemKind,
) -> Result<Vec<u8>, OpenError> {
    let bytes = read_file(parameter, path)?;
    if has_pem_block(&bytes, kind) {
        return Ok(bytes);
    }
    Err(OpenError::NotPem {
        parameter,
        path: ParameterFile::new(parameter, path),
        expected: kind,
    })
}

/// Whether `bytes` hold a `-----BEGIN …-----` line of `kind` followed later by its matching
/// `-----END …-----` line.
fn has_pem_block(bytes: &[u8], kind: PemKind) -> bool {
    let labels: &[&str] = match kind {
        PemKind::Certificate => &["CERTIFICATE"],
        PemKind::PrivateKey => &["PRIVATE KEY", "RSA PRIVATE KEY", "EC PRIVATE KEY"],
    };
    let Ok(text) = std::str::from_utf8(bytes) else {
        return false;
    };
    labels.iter().any(|label| {
        let begin = format!("-----BEGIN {label}-----");
        let end = format!("-----END {label}-----");
        let mut lines = text.lines().map(str::trim);
        lines.any(|line| line == begin) && lines.any(|line| line == end)
    })
}

/// Warns, once per process, that a user name and password are about to go to etcd without TLS,
/// where anyone on the path can read them. Returns whether this call warned.
#[cfg_attr(not(feature = "etcd"), allow(dead_code))]
pub(super) fn warn_plain_credentials() -> bool {
    use std::sync::atomic::{AtomicBool, Ordering};

    static WARNED: AtomicBool = AtomicBool::new(false);
    if WARNED.swap(true, Ordering::Relaxed) {
        return false;
    }
    #[cfg(feature = "etcd")]
    tracing::warn!(
        "etcd credentials (user=, password-file=) are sent over plain http without ca=: anyone on the network path can read the password"
    );
    true
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_complete_blocks_of_the_right_kind_count() {
        let cert = b"junk\n-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n";
        assert!(has_pem_block(cert, PemKind::Certificate));
        assert!(!has_pem_block(cert, PemKind::PrivateKey));
        let key = b"-----BEGIN EC PRIVATE KEY-----\r\nMHcC\r\n-----END EC PRIVATE KEY-----\r\n";
        assert!(has_pem_block(key, PemKind::PrivateKey));
        assert!(!has_pem_block(key, PemKind::Certificate));
        for bad in [
            &b"not a certificate\n"[..],
            b"-----BEGIN CERTIFICATE-----\nMIIB\n",
            b"-----END CERTIFICATE-----\n-----BEGIN CERTIFICATE-----\n",
            b"\xff\xfe-----BEGIN CERTIFICATE-----\n-----END CERTIFICATE-----\n",
        ] {
            assert!(!has_pem_block(bad, PemKind::Certificate), "{bad:?}");
        }
    }

    #[test]
    fn secret_files_are_redacted_in_display_and_debug() {
        let key = ParameterFile::new("key", Path::new("/etc/vvm/client.key"));
        let password = ParameterFile::new("password-file", Path::new("/run/pw"));
        let ca = ParameterFile::new("ca", Path::new("/etc/vvm/ca.pem"));
        assert_eq!(key.to_string(), REDACTED);
        assert_eq!(password.to_string(), REDACTED);
        assert!(!format!("{key:?}{password:?}").contains('/'));
        assert_eq!(ca.to_string(), "/etc/vvm/ca.pem");
        assert_eq!(key.path(), Path::new("/etc/vvm/client.key"));
    }

    #[test]
    fn the_plain_http_warning_is_given_once() {
        assert!(warn_plain_credentials());
        assert!(!warn_plain_credentials());
    }
}
