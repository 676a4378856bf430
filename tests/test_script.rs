//! `scripts/test.sh`, the one test command, on a fresh machine: it must recognise the libclang
//! that bindgen loads and install `libclang-dev` when there is none. Its `find_libclang` runs
//! here against fake directory trees.

use std::path::{Path, PathBuf};
use std::process::Command;

/// A directory tree that is removed when dropped.
struct FakeRoot(PathBuf);

impl FakeRoot {
    fn new(name: &str) -> Self {
        let stamp = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_nanos();
        let dir = std::env::temp_dir().join(format!(
            "vvm-libclang-{name}-{}-{stamp}",
            std::process::id()
        ));
        std::fs::create_dir_all(&dir).unwrap();
        FakeRoot(dir)
    }

    /// Creates the empty file `path` (relative to the root) and its folders.
    fn touch(&self, path: &str) -> &Self {
        let file = self.0.join(path);
        std::fs::create_dir_all(file.parent().unwrap()).unwrap();
        std::fs::write(file, b"").unwrap();
        self
    }

    /// What `find_libclang` says about this tree: the library it found, or `None`.
    fn find_libclang(&self) -> Option<String> {
        let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("scripts/test.sh");
        let output = Command::new("bash")
            .args(["-c", r#"source "$1" && find_libclang "$2""#, "test-script"])
            .arg(&script)
            .arg(&self.0)
            .env_remove("LIBCLANG_PATH")
            .output()
            .expect("bash runs");
        let stdout = String::from_utf8(output.stdout).unwrap();
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(stderr.is_empty(), "{stderr}");
        match output.status.success() {
            true => Some(
                stdout
                    .trim()
                    .strip_prefix(self.0.to_str().unwrap())
                    .unwrap()
                    .to_owned(),
            ),
            false => {
                assert!(stdout.is_empty(), "failed but printed {stdout:?}");
                None
            }
        }
    }
}

impl Drop for FakeRoot {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

// covers: Cli.FreshMachine
/// A fresh machine had `libclang-cpp.so.14` (pulled in by other packages)
/// and no libclang; the script took the former for the latter and skipped installing it.
#[test]
fn libclang_cpp_alone_is_not_libclang() {
    let root = FakeRoot::new("cpp-only");
    root.touch("usr/lib/x86_64-linux-gnu/libclang-cpp.so.14")
        .touch("usr/lib/llvm-14/lib/libclang-cpp.so.14")
        .touch("usr/lib/llvm-14/lib/libclangAST.a");
    assert_eq!(root.find_libclang(), None);
}

// covers: Cli.FreshMachine
#[test]
fn every_name_bindgen_loads_is_found() {
    for path in [
        "usr/lib/x86_64-linux-gnu/libclang-14.so.1",
        "usr/lib/x86_64-linux-gnu/libclang-14.so",
        "usr/lib/llvm-14/lib/libclang.so",
        "usr/lib/llvm-14/lib/libclang.so.1",
        "usr/lib/aarch64-linux-gnu/libclang.so.18",
        "usr/lib64/libclang.so",
    ] {
        let root = FakeRoot::new("found");
        root.touch("usr/lib/x86_64-linux-gnu/libclang-cpp.so.14")
            .touch(path);
        assert_eq!(
            root.find_libclang().as_deref(),
            Some(&*format!("/{path}")),
            "{path}"
        );
    }
}

// covers: Cli.FreshMachine
#[test]
fn an_empty_tree_has_no_libclang() {
    assert_eq!(FakeRoot::new("empty").find_libclang(), None);
}
