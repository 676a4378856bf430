//! The declared minimum Rust version (`rust-version` of the workspace) is not below what any
//! dependency declares: every package the workspace's crates build with, whatever their
//! features (`cargo metadata --all-features`, normal and build dependencies, this host's
//! platform), as locked in Cargo.lock.
//!
//! This compares declared versions only; it does not build with an old compiler.

use std::process::Command;

use serde_json::Value;

/// `1.80` or `1.80.1` as a comparable triple.
fn version(text: &str) -> (u64, u64, u64) {
    let mut parts = text.split('.').map(|part| {
        part.parse::<u64>()
            .unwrap_or_else(|_| panic!("bad version {text:?}"))
    });
    let major = parts.next().unwrap_or(0);
    let minor = parts.next().unwrap_or(0);
    let patch = parts.next().unwrap_or(0);
    (major, minor, patch)
}

fn cargo() -> Command {
    Command::new(option_env!("CARGO").unwrap_or("cargo"))
}

fn host() -> String {
    let output = Command::new("rustc")
        .arg("-vV")
        .output()
        .expect("rustc runs");
    String::from_utf8_lossy(&output.stdout)
        .lines()
        .find_map(|line| line.strip_prefix("host: "))
        .expect("rustc -vV names the host")
        .to_owned()
}

#[test]
fn no_dependency_needs_a_newer_rust_than_the_workspace_declares() {
    let root = env!("CARGO_MANIFEST_DIR");
    let output = cargo()
        .current_dir(root)
        .args([
            "metadata",
            "--format-version",
            "1",
            "--all-features",
            "--locked",
        ])
        .args(["--filter-platform", &host()])
        .output()
        .expect("cargo metadata runs");
    assert!(
        output.status.success(),
        "cargo metadata failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    let metadata: Value = serde_json::from_slice(&output.stdout).expect("metadata is JSON");

    let packages = metadata["packages"].as_array().expect("packages");
    let by_id = |id: &str| {
        packages
            .iter()
            .find(|package| package["id"] == id)
            .unwrap_or_else(|| panic!("no package {id}"))
    };
    let members: Vec<&str> = metadata["workspace_members"]
        .as_array()
        .expect("workspace members")
        .iter()
        .filter_map(Value::as_str)
        .collect();
    let declared = by_id(members[0])["rust_version"]
        .as_str()
        .expect("the workspace declares a rust-version");
    for member in &members {
        assert_eq!(
            by_id(member)["rust_version"].as_str(),
            Some(declared),
            "every crate of the workspace inherits the workspace's rust-version"
        );
    }

    // Everything reachable from the workspace's crates through normal and build dependencies.
    let nodes = metadata["resolve"]["nodes"].as_array().expect("resolve");
    let node = |id: &str| {
        nodes
            .iter()
            .find(|node| node["id"] == id)
            .unwrap_or_else(|| panic!("no node {id}"))
    };
    let mut seen: Vec<String> = Vec::new();
    let mut stack: Vec<String> = members.iter().map(|id| id.to_string()).collect();
    while let Some(id) = stack.pop() {
        if seen.contains(&id) {
            continue;
        }
        for dep in node(&id)["deps"].as_array().expect("deps") {
            let built = dep["dep_kinds"]
                .as_array()
                .expect("dep kinds")
                .iter()
                .any(|kind| kind["kind"].is_null() || kind["kind"] == "build");
            if built {
                stack.push(dep["pkg"].as_str().expect("pkg").to_owned());
            }
        }
        seen.push(id);
    }
    assert!(seen.len() > members.len(), "no dependency found");

    let mut newer: Vec<String> = seen
        .iter()
        .map(|id| by_id(id))
        .filter_map(|package| {
            let needs = package["rust_version"].as_str()?;
            (version(needs) > version(declared)).then(|| {
                format!(
                    "{} {} needs Rust {needs}",
                    package["name"].as_str().unwrap_or("?"),
                    package["version"].as_str().unwrap_or("?")
                )
            })
        })
        .collect();
    newer.sort();
    assert!(
        newer.is_empty(),
        "the workspace declares rust-version {declared}, below what these dependencies declare:\n{}",
        newer.join("\n")
    );
}
