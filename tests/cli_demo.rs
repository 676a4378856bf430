//! `vvm demo` through the real binary, on SQLite: four processes, a crash, a hang and a
//! graceful stop, each checked by the demo against its bound; the demo's exit code says whether
//! every bound held.

use std::process::Command;

// covers: Cli.Demo, Cli.DemoFigures
#[test]
fn the_demo_passes_its_own_checks() {
    let output = Command::new(env!("CARGO_BIN_EXE_vvm"))
        .arg("demo")
        .output()
        .expect("the vvm binary runs");
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(
        output.status.code(),
        Some(0),
        "the demo failed:\n{stdout}\n{stderr}"
    );
    for figure in [
        "failover after SIGKILL",
        "after the expiry",
        "graceful hand-off",
        "done:",
    ] {
        assert!(stdout.contains(figure), "no {figure:?} line:\n{stdout}");
    }
    // A share of the lease is shown with the digits it needs.
    assert!(
        !stdout.contains(" 0.00·L"),
        "a figure reads as nothing:\n{stdout}"
    );
}
