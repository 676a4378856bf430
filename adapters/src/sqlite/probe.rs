//! Whether some connection holds a database's write lock right now.

use std::path::Path;
use std::time::Duration;

use rusqlite::{Connection, OpenFlags};

use super::busy::is_busy;
use super::SqliteStoreError;

/// Whether another connection holds the write lock of the lease store at `path` at this moment.
///
/// A holder stopped (SIGSTOP, a debugger) inside one of its write transactions keeps this lock,
/// and no process can take over, renew or release a slot until it resumes (see the SQLite
/// section of `specs/stores.md`); this tells such a wedge from an ordinary wait. Briefly
/// takes the lock itself when it is free (an empty write transaction, rolled back), never waits
/// for it, and never creates the file.
///
/// ```
/// # fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let dir = std::env::temp_dir().join(format!("vvm-probe-doc-{}", std::process::id()));
/// std::fs::create_dir_all(&dir)?;
/// let path = dir.join("leases.db");
/// let store = vvm_adapters::SqliteStore::open(&path)?;
/// assert!(!vvm_adapters::sqlite::write_locked(&path)?);
/// drop(store);
/// std::fs::remove_dir_all(&dir)?;
/// # Ok(())
/// # }
/// ```
///
/// # Errors
/// When the file cannot be opened (it is missing, or not a database) or SQLite fails otherwise.
pub fn write_locked(path: &Path) -> Result<bool, SqliteStoreError> {
    let flags = OpenFlags::SQLITE_OPEN_READ_WRITE | OpenFlags::SQLITE_OPEN_NO_MUTEX;
    let conn =
        Connection::open_with_flags(path, flags).map_err(|source| SqliteStoreError::Open {
            path: path.to_owned(),
            source,
        })?;
    let sqlite = |what| move |source| SqliteStoreError::Sqlite { what, source };
    // Busy is the answer here, not something to wait out.
    conn.busy_timeout(Duration::ZERO)
        .map_err(sqlite("setting the busy timeout"))?;
    match conn.execute_batch("BEGIN IMMEDIATE") {
        Ok(()) => {
            conn.execute_batch("ROLLBACK")
                .map_err(sqlite("ending the probe transaction"))?;
            Ok(false)
        }
        Err(error) if is_busy(&error) => Ok(true),
        Err(source) => Err(SqliteStoreError::Sqlite {
            what: "taking the write lock",
            source,
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_held_write_lock_is_seen_and_a_free_one_is_left_free() {
        let dir = std::env::temp_dir().join(format!("vvm-probe-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("leases.db");
        let holder = Connection::open(&path).unwrap();
        holder
            .execute_batch("PRAGMA journal_mode=WAL; CREATE TABLE t(x);")
            .unwrap();
        assert!(!write_locked(&path).unwrap());
        holder.execute_batch("BEGIN IMMEDIATE").unwrap();
        assert!(write_locked(&path).unwrap());
        holder.execute_batch("ROLLBACK").unwrap();
        // The probe left nothing open: the lock is free again, for the probe and for others.
        assert!(!write_locked(&path).unwrap());
        holder.execute_batch("BEGIN IMMEDIATE; ROLLBACK;").unwrap();
        let missing = dir.join("missing.db");
        assert!(matches!(
            write_locked(&missing),
            Err(SqliteStoreError::Open { .. })
        ));
        assert!(!missing.exists(), "the probe never creates a file");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
