//! Finding the command of `vvm run -- CMD` before campaigning: a command that cannot be started
//! must not take a slot first. The search is the one `execvp` does (a name with a `/` is a path;
//! otherwise each directory of `PATH` in turn, the current directory for an empty entry), and the
//! answers are the shell's: 127 when nothing is found, 126 when what is found cannot be run.

use std::ffi::{OsStr, OsString};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

/// Exit code for a command that is not found, as a shell's.
pub const EXIT_NOT_FOUND: u8 = 127;
/// Exit code for a command that is found but cannot be run, as a shell's.
pub const EXIT_CANNOT_RUN: u8 = 126;

/// Why a command cannot be started.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[non_exhaustive]
pub enum ProgramError {
    /// Nothing of that name on `PATH`, or no file at that path.
    #[error("cannot start {0}: command not found")]
    NotFound(String),
    /// Found, but a directory or not executable by this user.
    #[error("cannot start {name}: {path} is {why}")]
    CannotRun {
        /// The name as given.
        name: String,
        /// What was found.
        path: String,
        /// What is wrong with it.
        why: &'static str,
    },
}

impl ProgramError {
    /// The shell's exit code for this error.
    pub fn exit_code(&self) -> u8 {
        match self {
            ProgramError::NotFound(_) => EXIT_NOT_FOUND,
            ProgramError::CannotRun { .. } => EXIT_CANNOT_RUN,
        }
    }
}

/// What is wrong with `path` as a program, if anything (`None`: missing).
fn judge(path: &Path) -> Option<Result<(), &'static str>> {
    let meta = std::fs::metadata(path).ok()?;
    if meta.is_dir() {
        return Some(Err("a directory"));
    }
    if !meta.is_file() {
        return Some(Err("not a regular file"));
    }
    if meta.permissions().mode() & 0o111 == 0
        || rustix::fs::access(path, rustix::fs::Access::EXEC_OK).is_err()
    {
        return Some(Err("not executable"));
    }
    Some(Ok(()))
}

/// Checks that `name` can be started as `execvp` would start it, with `path_var` as `PATH`.
pub fn check(name: &OsStr, path_var: Option<OsString>) -> Result<PathBuf, ProgramError> {
    let shown = name.to_string_lossy().into_owned();
    if name.is_empty() {
        return Err(ProgramError::NotFound(shown));
    }
    let candidates: Vec<PathBuf> = if name.as_bytes().contains(&b'/') {
        vec![PathBuf::from(name)]
    } else {
        // POSIX leaves an unset PATH to the implementation; glibc's default.
        let path_var = path_var.unwrap_or_else(|| OsString::from("/bin:/usr/bin"));
        path_var
            .as_bytes()
            .split(|b| *b == b':')
            .map(|dir| {
                let dir = if dir.is_empty() { b".".as_slice() } else { dir };
                Path::new(OsStr::from_bytes(dir)).join(name)
            })
            .collect()
    };
    // The first one that exists decides, unless it cannot be run and a later one can (execvp
    // goes on after EACCES).
    let mut refused = None;
    for candidate in candidates {
        match judge(&candidate) {
            None => {}
            Some(Ok(())) => return Ok(candidate),
            Some(Err(why)) => {
                refused.get_or_insert((candidate, why));
            }
        }
    }
    match refused {
        Some((path, why)) => Err(ProgramError::CannotRun {
            name: shown,
            path: path.display().to_string(),
            why,
        }),
        None => Err(ProgramError::NotFound(shown)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn programs_are_found_as_execvp_finds_them() {
        let path = Some(OsString::from("/nonexistent:/bin:/usr/bin"));
        assert!(check(OsStr::new("sh"), path.clone()).is_ok());
        assert!(check(OsStr::new("/bin/sh"), None).is_ok());
        let missing = check(OsStr::new("no-such-program-vvm"), path.clone()).unwrap_err();
        assert_eq!(missing.exit_code(), 127);
        assert_eq!(
            missing.to_string(),
            "cannot start no-such-program-vvm: command not found"
        );
        assert_eq!(
            check(OsStr::new("/no/such/cmd"), None)
                .unwrap_err()
                .exit_code(),
            127
        );
        let dir = check(OsStr::new("/tmp"), None).unwrap_err();
        assert_eq!(dir.exit_code(), 126, "{dir}");
        assert!(dir.to_string().contains("a directory"), "{dir}");
        assert_eq!(check(OsStr::new(""), path).unwrap_err().exit_code(), 127);
    }

    #[test]
    fn a_file_without_execute_permission_cannot_be_run() {
        let file = std::env::temp_dir().join(format!("vvm-program-{}", std::process::id()));
        std::fs::write(&file, b"#!/bin/sh\n").unwrap();
        std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o644)).unwrap();
        let refused = check(file.as_os_str(), None).unwrap_err();
        let _ = std::fs::remove_file(&file);
        assert_eq!(refused.exit_code(), 126, "{refused}");
        assert!(refused.to_string().contains("not executable"), "{refused}");
    }
}
