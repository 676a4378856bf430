//! Every requirement ID written in `specs/*.md` (as `` `~Some.Id~` ``) must be covered by at least
//! one test that says so with a `// covers: Some.Id` line, and every `covers:` line must name an
//! ID that exists. The check fails naming what is missing.

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::path::{Path, PathBuf};

/// Folders whose `.rs` files may carry `covers:` lines.
const CODE_ROOTS: &[&str] = &[
    "core",
    "runtime",
    "adapters",
    "sim",
    "sequencer",
    "conformance",
    "test-support",
    "src",
    "tests",
    "benches",
    "examples",
];
/// The marker that opens a coverage line.
const COVERS: &str = "covers:";
/// Deepest folder nesting walked; a bound against link loops.
const DEPTH_MAX: usize = 12;

/// IDs of one spec text: every `` `~ID~` ``.
fn spec_ids(text: &str) -> BTreeSet<String> {
    let mut ids = BTreeSet::new();
    let mut rest = text;
    while let Some(start) = rest.find("`~") {
        let after = &rest[start + 2..];
        match after.find("~`") {
            Some(end)
                if !after[..end].is_empty() && !after[..end].contains(char::is_whitespace) =>
            {
                ids.insert(after[..end].to_owned());
                rest = &after[end + 2..];
            }
            _ => rest = after,
        }
    }
    ids
}

/// IDs named by the `covers:` lines of one source text.
fn covered_ids(text: &str) -> BTreeSet<String> {
    let mut ids = BTreeSet::new();
    for line in text.lines() {
        let line = line.trim_start();
        if !line.starts_with("//") {
            continue;
        }
        // Only a comment whose text starts with the marker counts, so that prose that merely
        // mentions the convention is not mistaken for a coverage claim.
        let comment = line
            .trim_start_matches('/')
            .trim_start_matches('!')
            .trim_start();
        let Some(rest) = comment.strip_prefix(COVERS) else {
            continue;
        };
        for id in rest.split(',') {
            let id = id.trim().trim_end_matches('.');
            if !id.is_empty() {
                ids.insert(id.to_owned());
            }
        }
    }
    ids
}

/// IDs of `specs` that no source covers, and covered IDs that no spec defines.
fn check(specs: &BTreeSet<String>, covered: &BTreeSet<String>) -> (Vec<String>, Vec<String>) {
    let uncovered = specs.difference(covered).cloned().collect();
    let unknown = covered.difference(specs).cloned().collect();
    (uncovered, unknown)
}

fn rust_files(dir: &Path, depth: usize, out: &mut Vec<PathBuf>) {
    assert!(
        depth <= DEPTH_MAX,
        "folders nested deeper than {DEPTH_MAX} under {dir:?}"
    );
    let Ok(entries) = fs::read_dir(dir) else {
        return;
    };
    for entry in entries.flatten() {
        let path = entry.path();
        let name = entry.file_name();
        let name = name.to_string_lossy();
        if name.starts_with("target") || name.starts_with('.') {
            continue;
        }
        if path.is_dir() {
            rust_files(&path, depth + 1, out);
        } else if name.ends_with(".rs") {
            out.push(path);
        }
    }
}

// covers: Trace.Check
#[test]
fn every_spec_id_is_covered_by_a_test() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut specs = BTreeMap::new();
    for entry in fs::read_dir(root.join("specs")).expect("specs/ exists") {
        let path = entry.expect("readable specs/").path();
        if path.extension().is_some_and(|e| e == "md") {
            let text = fs::read_to_string(&path).expect("readable spec");
            for id in spec_ids(&text) {
                specs.insert(id, path.file_name().unwrap().to_string_lossy().into_owned());
            }
        }
    }
    assert!(!specs.is_empty(), "no requirement IDs found in specs/");

    let mut files = Vec::new();
    for dir in CODE_ROOTS {
        rust_files(&root.join(dir), 0, &mut files);
    }
    let mut covered = BTreeSet::new();
    for file in &files {
        covered.extend(covered_ids(&fs::read_to_string(file).unwrap_or_default()));
    }

    let spec_set: BTreeSet<String> = specs.keys().cloned().collect();
    let (uncovered, unknown) = check(&spec_set, &covered);
    let uncovered: Vec<String> = uncovered
        .iter()
        .map(|id| format!("{id} ({})", specs[id]))
        .collect();
    assert!(
        uncovered.is_empty() && unknown.is_empty(),
        "requirements without a test: {uncovered:?}; `covers:` lines naming no spec ID: {unknown:?}"
    );
}

// covers: Trace.Check
#[test]
fn the_check_itself_reports_what_is_missing() {
    let specs = spec_ids("a `~A.One~` b `~A.Two~` c `~ not an id ~` `~`");
    assert_eq!(specs, BTreeSet::from(["A.One".into(), "A.Two".into()]));
    let covered = covered_ids(
        "// covers: A.One, B.Three.\nlet x = 1; // covers: A.Two\n  /// covers: A.One\n//! a `// covers: A.Two` line",
    );
    assert_eq!(covered, BTreeSet::from(["A.One".into(), "B.Three".into()]));
    let (uncovered, unknown) = check(&specs, &covered);
    assert_eq!(uncovered, vec!["A.Two".to_owned()]);
    assert_eq!(unknown, vec!["B.Three".to_owned()]);
}
