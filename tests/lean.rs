//! The library is lean by default: with its default features, and with none, `vvm` builds
//! without the command line, the logging subscriber, the etcd client or its test harness. The
//! binary's dependencies come only with the `cli` feature.

use std::process::Command;

/// The packages of `vvm`'s normal build graph with `features`, as `cargo tree` lists them.
fn graph(features: &[&str]) -> Vec<String> {
    let output = Command::new(option_env!("CARGO").unwrap_or("cargo"))
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .args([
            "tree", "--locked", "-p", "vvm", "-e", "normal", "--prefix", "none",
        ])
        .args(features)
        .output()
        .expect("cargo tree runs");
    assert!(
        output.status.success(),
        "cargo tree failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8_lossy(&output.stdout)
        .lines()
        .filter_map(|line| line.split_whitespace().next())
        .map(str::to_owned)
        .collect()
}

const CLI_ONLY: [&str; 5] = [
    "clap",
    "tracing-subscriber",
    "sd-notify",
    "etcd-client",
    "humantime",
];

#[test]
fn the_default_library_has_no_cli_and_no_etcd() {
    for features in [&[][..], &["--no-default-features"][..]] {
        let packages = graph(features);
        assert!(packages.iter().any(|p| p == "vvm-runtime"), "{packages:?}");
        for heavy in CLI_ONLY {
            assert!(
                !packages.iter().any(|p| p == heavy),
                "`vvm` with {features:?} pulls {heavy}"
            );
        }
    }
}

#[test]
fn the_cli_feature_brings_what_the_binary_needs() {
    let packages = graph(&["--features", "cli"]);
    for needed in CLI_ONLY {
        assert!(packages.iter().any(|p| p == needed), "cli lacks {needed}");
    }
}
