//! Reading a store without writing anything ([`SqliteStoreBuilder::read_only`]): for `vvm
//! status`, for monitoring, and for a user who may only read the file.
//!
//! A read-only SQLite connection to a WAL database still creates the `-wal` and `-shm` files when
//! they are missing, and leaves them behind. So each read opens its own connection and picks
//! how:
//! - the companions exist (a process has the store open): an ordinary read-only connection, which
//!   uses them and creates nothing;
//! - they do not (nobody has it open, so the file alone holds every commit): the file is read as
//!   immutable — no lock, no companion, nothing written. A writer that opens the store during that
//!   read is not seen by it; the next read sees it.
//!
//! The change feed of such a store compares a fingerprint of the files (inode, size and
//! modification time of the database and its `-wal`) instead of `PRAGMA data_version`, which
//! needs a connection kept open.
//!
//! [`SqliteStoreBuilder::read_only`]: super::SqliteStoreBuilder::read_only

use std::hash::{Hash, Hasher};
use std::path::Path;
use std::time::Duration;

use rusqlite::{Connection, OpenFlags};

use super::file::companions;
use super::SqliteStoreError;

/// A connection that reads the store at `path` as it is now and writes nothing (see the module
/// documentation).
pub(crate) fn connect(path: &Path) -> Result<Connection, SqliteStoreError> {
    let in_use = companions(path).iter().any(|companion| companion.exists());
    let flags = OpenFlags::SQLITE_OPEN_READ_ONLY | OpenFlags::SQLITE_OPEN_NO_MUTEX;
    let opened = if in_use {
        Connection::open_with_flags(path, flags)
    } else {
        let uri = format!("file:{}?immutable=1", escape(path));
        Connection::open_with_flags(uri, flags | OpenFlags::SQLITE_OPEN_URI)
    };
    let conn = opened.map_err(|source| SqliteStoreError::Open {
        path: path.to_owned(),
        source,
    })?;
    conn.busy_timeout(Duration::ZERO)
        .map_err(|source| SqliteStoreError::Sqlite {
            what: "clearing the busy handler",
            source,
        })?;
    super::schema::stable_plans(&conn).map_err(|source| SqliteStoreError::Sqlite {
        what: "fixing the query plans",
        source,
    })?;
    Ok(conn)
}

/// `path` for a `file:` URI: `%`, `?` and `#` would otherwise be read as URI syntax.
fn escape(path: &Path) -> String {
    let text = path.to_string_lossy();
    let mut escaped = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '%' => escaped.push_str("%25"),
            '?' => escaped.push_str("%3f"),
            '#' => escaped.push_str("%23"),
            c => escaped.push(c),
        }
    }
    escaped
}

/// Checks, reading only, that `path` is a regular file holding a store of this version that
/// belongs to `machine_id`.
pub(crate) fn check(path: &Path, machine_id: &str) -> Result<(), SqliteStoreError> {
    // Followed: reading through a link writes nothing anywhere.
    let stat = match rustix::fs::stat(path) {
        Ok(stat) => stat,
        Err(rustix::io::Errno::NOENT) => {
            return Err(SqliteStoreError::NoStore {
                path: path.to_owned(),
            })
        }
        Err(error) => {
            return Err(SqliteStoreError::Inspect {
                path: path.to_owned(),
                source: error.into(),
            })
        }
    };
    if rustix::fs::FileType::from_raw_mode(stat.st_mode) != rustix::fs::FileType::RegularFile {
        return Err(SqliteStoreError::Untrusted {
            path: path.to_owned(),
            why: super::Untrusted::NotAFile,
        });
    }
    super::file::check_access(path, false)?;
    let conn = connect(path)?;
    super::schema::check_readable(path, &conn, machine_id)
}

/// A fingerprint of the store's files: changes whenever a commit reaches the database or its
/// log (or either is replaced).
pub(crate) fn fingerprint(path: &Path) -> i64 {
    let mut hasher = std::collections::hash_map::DefaultHasher::new();
    let [wal, _] = companions(path);
    for file in [path, wal.as_path()] {
        match rustix::fs::stat(file) {
            Ok(stat) => {
                (stat.st_dev, stat.st_ino, stat.st_size).hash(&mut hasher);
                (stat.st_mtime, stat.st_mtime_nsec).hash(&mut hasher);
            }
            Err(_) => 0_u8.hash(&mut hasher),
        }
    }
    i64::from_ne_bytes(hasher.finish().to_ne_bytes())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn uri_syntax_in_a_path_is_escaped() {
        assert_eq!(escape(Path::new("/a/b%?#c.db")), "/a/b%25%3f%23c.db");
        assert_eq!(escape(Path::new("leases.sqlite")), "leases.sqlite");
    }
}
