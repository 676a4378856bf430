//! The store's files on disk: who may have made them, and creating the database in one step.
//!
//! Every process that opens a store trusts what the file says about leases, so a file that
//! another user could have written is never opened:
//! - the database, its `-wal` and `-shm` companions and the slot lock files are never followed
//!   through a symbolic link (another user could point the name anywhere) and must be regular
//!   files;
//! - they must belong to this user and be readable and writable by nobody else
//!   ([`Sharing::Private`], the default, mode `0600`), or — when a group shares the store on
//!   purpose ([`Sharing::Group`], mode `0660`) — belong to this user or to the group of the
//!   file, a group this user is in, and still be readable and writable by no one outside it.
//!   Reading is enough to stall a store: a reader's `fcntl` read lock on `-shm` blocks SQLite's
//!   write lock, so every renewal would fail;
//! - the directory must exist, must not let every user replace files in it (world-writable
//!   without the sticky bit), and must belong to this user or to root (whose owner can rename
//!   anything in it) unless it has the sticky bit (a shared directory such as `/tmp`, where
//!   nobody else can rename our files) or, for a shared store, belongs to a group of this user.
//!
//! Everything is judged before anything is created: a refusal leaves no file behind.
//!
//! **Creation is one step.** A missing database is built complete under a temporary name next
//! to it (schema, ids, journal mode) and then linked to its name, which fails if the name exists
//! by then: concurrent openers either see no file (and race to link theirs; the losers drop
//! theirs) or a complete store, never a half-made one. The temporary file is created exclusively
//! (`O_EXCL`, no link followed) with the store's mode, so nothing else can have opened it.

use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU32, Ordering};

use rustix::fs::{FileType, Mode, OFlags, Stat};
use rustix::io::Errno;

use super::SqliteStoreError;

/// Who may use a store's files besides the user who made them.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub enum Sharing {
    /// Only this user: files are created `0600`, and a file another user owns or can write is
    /// refused.
    #[default]
    Private,
    /// The members of the file's group too: files are created `0660` (give the directory the
    /// group and its set-group-id bit so that new files get it), and a file of another member is
    /// accepted while it belongs to a group this user is in and nobody outside that group can
    /// write it.
    Group,
}

impl Sharing {
    /// The mode new files get (the umask does not narrow it: it is set after creation).
    pub fn mode(self) -> u32 {
        match self {
            Sharing::Private => 0o600,
            Sharing::Group => 0o660,
        }
    }
}

/// Why a file of the store is not trusted.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum Untrusted {
    /// A symbolic link: the store never follows one.
    #[error("is a symbolic link, which the store never follows (another user could point it anywhere); give the real path")]
    Symlink,
    /// Not a regular file (a directory, a device, a pipe, ...).
    #[error("is not a regular file")]
    NotAFile,
    /// Owned by another user.
    #[error("belongs to uid {owner}, not to this user (uid {user}); remove it, or let a group share the store on purpose (`shared-group=true`, the file in a group of yours, mode 660)")]
    OtherOwner {
        /// The file's owner.
        owner: u32,
        /// This process's effective user.
        user: u32,
    },
    /// Owned by a member of a group this user is not in (shared stores only).
    #[error("belongs to uid {owner} and group {group}, a group this user is not in; add the user to the group or `chgrp` the file")]
    OtherGroup {
        /// The file's owner.
        owner: u32,
        /// The file's group.
        group: u32,
    },
    /// Writable by users the sharing does not include.
    #[error("is writable by other users (mode {mode:03o}); `chmod {wanted:03o}` it")]
    OthersCanWrite {
        /// The file's permission bits.
        mode: u32,
        /// The mode the sharing asks for.
        wanted: u32,
    },
    /// Readable by users the sharing does not include: a read lock of theirs on `-shm` would
    /// block every write of the store.
    #[error("is readable by other users (mode {mode:03o}), whose read lock would stall every write; `chmod {wanted:03o}` it")]
    OthersCanRead {
        /// The file's permission bits.
        mode: u32,
        /// The mode the sharing asks for.
        wanted: u32,
    },
    /// A directory of another user (not root), without the sticky bit: its owner can rename
    /// or replace the store's files.
    #[error("belongs to uid {owner}, not to this user (uid {user}), who can rename or replace the store's files in it; use a directory of your own or of root, one with the sticky bit (as /tmp), or for a store a group shares on purpose a directory of that group with `shared-group=true`")]
    OthersDirectory {
        /// The directory's owner.
        owner: u32,
        /// This process's effective user.
        user: u32,
    },
    /// A directory every user may replace files in.
    #[error("is a directory every user can write without the sticky bit (mode {mode:03o}), so anyone could replace the store; use a directory of your own")]
    OpenDirectory {
        /// The directory's permission bits.
        mode: u32,
    },
}

fn untrusted(path: &Path, why: Untrusted) -> SqliteStoreError {
    SqliteStoreError::Untrusted {
        path: path.to_owned(),
        why,
    }
}

/// Whether a file with `stat` may be used under `sharing` by this process.
pub(crate) fn judge(stat: &Stat, sharing: Sharing) -> Result<(), Untrusted> {
    let kind = FileType::from_raw_mode(stat.st_mode);
    if kind == FileType::Symlink {
        return Err(Untrusted::Symlink);
    }
    if kind != FileType::RegularFile {
        return Err(Untrusted::NotAFile);
    }
    let mode = stat.st_mode & 0o7777;
    let user = rustix::process::geteuid().as_raw();
    let wanted = sharing.mode();
    match sharing {
        Sharing::Private => {
            if stat.st_uid != user {
                return Err(Untrusted::OtherOwner {
                    owner: stat.st_uid,
                    user,
                });
            }
            if mode & 0o022 != 0 {
                return Err(Untrusted::OthersCanWrite { mode, wanted });
            }
            if mode & 0o044 != 0 {
                return Err(Untrusted::OthersCanRead { mode, wanted });
            }
        }
        Sharing::Group => {
            if stat.st_uid != user && !in_group(stat.st_gid) {
                return Err(Untrusted::OtherGroup {
                    owner: stat.st_uid,
                    group: stat.st_gid,
                });
            }
            if mode & 0o002 != 0 {
                return Err(Untrusted::OthersCanWrite { mode, wanted });
            }
            if mode & 0o004 != 0 {
                return Err(Untrusted::OthersCanRead { mode, wanted });
            }
        }
    }
    Ok(())
}

/// Whether this process is in group `gid` (effective or supplementary).
fn in_group(gid: u32) -> bool {
    if rustix::process::getegid().as_raw() == gid {
        return true;
    }
    rustix::process::getgroups()
        .map(|groups| groups.iter().any(|group| group.as_raw() == gid))
        .unwrap_or(false)
}

/// The status of the file at `path` without following a link; `None` when there is none.
fn lstat(path: &Path) -> Result<Option<Stat>, SqliteStoreError> {
    match rustix::fs::lstat(path) {
        Ok(stat) => Ok(Some(stat)),
        Err(Errno::NOENT) => Ok(None),
        Err(error) => Err(SqliteStoreError::Inspect {
            path: path.to_owned(),
            source: error.into(),
        }),
    }
}

/// The directory the store lives in: must exist, and nobody but this user (and root) may be able
/// to replace its files.
fn check_directory(path: &Path, sharing: Sharing) -> Result<PathBuf, SqliteStoreError> {
    let dir = match path.parent() {
        Some(dir) if !dir.as_os_str().is_empty() => dir.to_owned(),
        _ => PathBuf::from("."),
    };
    // Followed on purpose: a directory reached through a link is still one directory.
    let stat = match rustix::fs::stat(&dir) {
        Ok(stat) => stat,
        Err(Errno::NOENT | Errno::NOTDIR) => return Err(SqliteStoreError::NoDirectory { dir }),
        Err(error) => {
            return Err(SqliteStoreError::Inspect {
                path: dir,
                source: error.into(),
            })
        }
    };
    if FileType::from_raw_mode(stat.st_mode) != FileType::Directory {
        return Err(SqliteStoreError::NoDirectory { dir });
    }
    let mode = stat.st_mode & 0o7777;
    let sticky = mode & 0o1000 != 0;
    if mode & 0o002 != 0 && !sticky {
        return Err(untrusted(&dir, Untrusted::OpenDirectory { mode }));
    }
    let user = rustix::process::geteuid().as_raw();
    // The owner of a directory can rename anything in it, unless the sticky bit keeps each
    // file to its own owner. Root can do anything anyway; a group's directory is trusted only
    // for a store that group shares on purpose.
    let trusted_owner = stat.st_uid == user || stat.st_uid == 0;
    let shared = sharing == Sharing::Group && in_group(stat.st_gid);
    if !sticky && !trusted_owner && !shared {
        return Err(untrusted(
            &dir,
            Untrusted::OthersDirectory {
                owner: stat.st_uid,
                user,
            },
        ));
    }
    Ok(dir)
}

/// The companions SQLite keeps next to a WAL database.
pub(crate) fn companions(path: &Path) -> [PathBuf; 2] {
    ["-wal", "-shm"].map(|suffix| {
        let mut name = path.as_os_str().to_owned();
        name.push(suffix);
        PathBuf::from(name)
    })
}

/// Checks the directory, the database at `path` and its companions, those that exist — also
/// when the database does not (a companion planted before it would be used by it), so that a
/// refusal comes before anything is created. Returns the database's status, or `None` when it
/// does not exist.
pub(crate) fn check(path: &Path, sharing: Sharing) -> Result<Option<Stat>, SqliteStoreError> {
    check_directory(path, sharing)?;
    let database = lstat(path)?;
    if let Some(stat) = &database {
        judge(stat, sharing).map_err(|why| untrusted(path, why))?;
    }
    for companion in companions(path) {
        if let Some(stat) = lstat(&companion)? {
            judge(&stat, sharing).map_err(|why| untrusted(&companion, why))?;
        }
    }
    Ok(database)
}

/// Checks that the file at `path` is still the one `before` described (a link or file put in
/// its place meanwhile is refused) and that the companions SQLite opened are trusted.
pub(crate) fn check_unchanged(
    path: &Path,
    before: &Stat,
    sharing: Sharing,
) -> Result<(), SqliteStoreError> {
    let Some(now) = check(path, sharing)? else {
        return Err(SqliteStoreError::Replaced {
            path: path.to_owned(),
        });
    };
    if (now.st_dev, now.st_ino) != (before.st_dev, before.st_ino) {
        return Err(SqliteStoreError::Replaced {
            path: path.to_owned(),
        });
    }
    Ok(())
}

/// Opens the file at `path` once as the store will, without waiting, so that a file this user
/// may not open is refused in the system's words before SQLite opens it (SQLite says only
/// "unable to open database file"). `write`: for reading and writing, never through a link (a
/// writer's files are checked by [`check`]); else for reading, following one (a reader writes
/// nothing anywhere).
pub(crate) fn check_access(path: &Path, write: bool) -> Result<(), SqliteStoreError> {
    let (access, flags) = match write {
        true => ("reading and writing", OFlags::RDWR | OFlags::NOFOLLOW),
        false => ("reading", OFlags::RDONLY),
    };
    let flags = flags | OFlags::NONBLOCK | OFlags::CLOEXEC;
    match rustix::fs::open(path, flags, Mode::empty()) {
        Ok(fd) => {
            drop(fd);
            Ok(())
        }
        Err(error) => Err(SqliteStoreError::Access {
            path: path.to_owned(),
            access,
            source: error.into(),
        }),
    }
}

/// Makes sure a complete store exists at `path`: checks an existing one, or builds one under a
/// temporary name with `build` and links it into place. Returns whether this call created it
/// and the status of the file now at `path`.
pub(crate) fn ensure(
    path: &Path,
    sharing: Sharing,
    build: impl FnOnce(&Path) -> Result<(), SqliteStoreError>,
) -> Result<(bool, Stat), SqliteStoreError> {
    if let Some(stat) = check(path, sharing)? {
        return Ok((false, stat));
    }
    let temporary = temporary_name(path);
    let result = create_exclusive(&temporary, sharing)
        .and_then(|fd| {
            drop(fd);
            build(&temporary)
        })
        .and_then(|()| match rustix::fs::link(&temporary, path) {
            Ok(()) => Ok(true),
            // Another opener linked its store first: use that one.
            Err(Errno::EXIST) => Ok(false),
            Err(error) => Err(SqliteStoreError::Create {
                path: path.to_owned(),
                source: error.into(),
            }),
        });
    remove_quietly(&temporary);
    let created = result?;
    match check(path, sharing)? {
        Some(stat) => Ok((created, stat)),
        // Removed right after it was linked: nothing to open.
        None => Err(SqliteStoreError::Replaced {
            path: path.to_owned(),
        }),
    }
}

/// `<name>.creating-<pid>-<n>` next to `path`.
fn temporary_name(path: &Path) -> PathBuf {
    static COUNTER: AtomicU32 = AtomicU32::new(0);
    let mut name = path.as_os_str().to_owned();
    name.push(format!(
        ".creating-{}-{}",
        std::process::id(),
        COUNTER.fetch_add(1, Ordering::Relaxed)
    ));
    PathBuf::from(name)
}

/// Creates `path` exclusively, without following a link, with exactly `sharing`'s mode.
pub(crate) fn create_exclusive(path: &Path, sharing: Sharing) -> Result<OwnedFd, SqliteStoreError> {
    let flags = OFlags::RDWR | OFlags::CREATE | OFlags::EXCL | OFlags::NOFOLLOW | OFlags::CLOEXEC;
    let mode = Mode::from_raw_mode(sharing.mode());
    let create = |source: Errno| SqliteStoreError::Create {
        path: path.to_owned(),
        source: source.into(),
    };
    let fd = rustix::fs::open(path, flags, mode).map_err(create)?;
    // The umask may have narrowed a shared mode.
    rustix::fs::fchmod(&fd, mode).map_err(create)?;
    Ok(fd)
}

/// Removes `path` and what SQLite may have left next to it, ignoring errors: a temporary file
/// that cannot be removed is only litter.
fn remove_quietly(path: &Path) {
    let _ = rustix::fs::unlink(path);
    for companion in companions(path) {
        let _ = rustix::fs::unlink(companion);
    }
    let mut journal = path.as_os_str().to_owned();
    journal.push("-journal");
    let _ = rustix::fs::unlink(PathBuf::from(journal));
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stat_of(mode: u32, uid: u32, gid: u32, kind: u32) -> Stat {
        let mut stat = rustix::fs::stat("/").expect("the root directory has a status");
        stat.st_mode = kind | mode;
        stat.st_uid = uid;
        stat.st_gid = gid;
        stat
    }

    // covers: Sq.Trusted
    #[test]
    fn only_files_of_this_user_that_nobody_else_can_write_are_trusted() {
        let me = rustix::process::geteuid().as_raw();
        let group = rustix::process::getegid().as_raw();
        let file = 0o100000;
        assert_eq!(
            judge(&stat_of(0o600, me, group, file), Sharing::Private),
            Ok(())
        );
        assert_eq!(
            judge(&stat_of(0o644, me, group, file), Sharing::Private),
            Err(Untrusted::OthersCanRead {
                mode: 0o644,
                wanted: 0o600
            })
        );
        assert_eq!(
            judge(&stat_of(0o400, me, group, file), Sharing::Private),
            Ok(())
        );
        assert!(matches!(
            judge(&stat_of(0o664, me, group, file), Sharing::Group),
            Err(Untrusted::OthersCanRead { .. })
        ));
        assert_eq!(
            judge(&stat_of(0o664, me, group, file), Sharing::Private),
            Err(Untrusted::OthersCanWrite {
                mode: 0o664,
                wanted: 0o600
            })
        );
        let other = me.wrapping_add(1);
        assert!(matches!(
            judge(&stat_of(0o600, other, group, file), Sharing::Private),
            Err(Untrusted::OtherOwner { .. })
        ));
        assert_eq!(
            judge(&stat_of(0o660, other, group, file), Sharing::Group),
            Ok(())
        );
        assert!(matches!(
            judge(&stat_of(0o666, other, group, file), Sharing::Group),
            Err(Untrusted::OthersCanWrite { .. })
        ));
        assert_eq!(
            judge(&stat_of(0o600, me, group, 0o120000), Sharing::Private),
            Err(Untrusted::Symlink)
        );
        assert_eq!(
            judge(&stat_of(0o600, me, group, 0o040000), Sharing::Private),
            Err(Untrusted::NotAFile)
        );
    }
}
