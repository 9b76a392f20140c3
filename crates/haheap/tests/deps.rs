//! The C library's build compiles only what the library uses: the `rebound-ha` command's
//! dependencies (argument parsing, JSON, log output, scratch directories) stay behind
//! hareplica's `cli` feature, which haheap does not enable.

use std::process::Command;

#[test]
fn the_library_does_not_depend_on_the_command_line_crates() {
    let out = Command::new(env!("CARGO"))
        .args(["tree", "-p", "haheap", "-e", "normal", "--prefix", "none"])
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .expect("cargo tree");
    let tree = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success() && tree.contains("hareplica"), "{tree}");
    for name in [
        "clap",
        "anyhow",
        "serde",
        "serde_json",
        "tracing-subscriber",
        "tempfile",
        "fastrand",
    ] {
        assert!(
            !tree.lines().any(|l| l.split(' ').next() == Some(name)),
            "haheap's library pulls in {name}:\n{tree}"
        );
    }
}
