//! The core never touches the outside world: no async runtime, no clock reads, no threads.
//! A textual check over `core/src` and the crate's dependencies.

use std::fs;
use std::path::Path;

/// What must not appear in the core's sources.
const FORBIDDEN: &[&str] = &[
    "tokio",
    "Instant::now",
    "SystemTime",
    "std::thread",
    "std::fs",
    "std::net",
];

fn sources(dir: &Path, out: &mut Vec<(String, String)>) {
    for entry in fs::read_dir(dir).expect("readable source folder") {
        let path = entry.expect("readable entry").path();
        if path.is_dir() {
            sources(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push((
                path.display().to_string(),
                fs::read_to_string(&path).expect("readable source"),
            ));
        }
    }
}

fn violations(files: &[(String, String)]) -> Vec<String> {
    let mut found = Vec::new();
    for (name, text) in files {
        for (number, line) in text.lines().enumerate() {
            for pattern in FORBIDDEN {
                if line.contains(pattern) {
                    found.push(format!("{name}:{}: {pattern}", number + 1));
                }
            }
        }
    }
    found
}

// covers: Core.Pure
#[test]
fn core_sources_read_no_clock_spawn_no_thread_and_use_no_runtime() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut files = Vec::new();
    sources(&root.join("src"), &mut files);
    assert!(files.len() >= 5, "found only {} source files", files.len());
    let found = violations(&files);
    assert!(found.is_empty(), "impure code in the core: {found:?}");

    let manifest = fs::read_to_string(root.join("Cargo.toml")).expect("readable manifest");
    let dependencies = manifest.split("[dependencies]").nth(1).unwrap_or("");
    let dependencies = dependencies.split("\n[").next().unwrap_or("");
    assert!(!dependencies.contains("tokio"), "the core depends on tokio");
}

// covers: Core.Pure
#[test]
fn the_check_sees_a_clock_read() {
    let files = vec![(
        "x.rs".to_owned(),
        "let t = std::time::Instant::now();".to_owned(),
    )];
    assert_eq!(violations(&files), vec!["x.rs:1: Instant::now".to_owned()]);
}
