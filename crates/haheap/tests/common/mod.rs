//! Helpers shared by the integration tests.
#![allow(dead_code)] // each test file uses a different subset

use std::path::PathBuf;
use std::process::Command;

/// Cargo's output directory for this profile (this test binary lives in <it>/deps) and
/// the profile's name.
pub fn target_dir() -> (PathBuf, &'static str) {
    let exe = std::env::current_exe().unwrap();
    let dir = exe.parent().and_then(|d| d.parent()).unwrap().to_path_buf();
    let profile = if dir.ends_with("release") {
        "release"
    } else {
        "debug"
    };
    (dir, profile)
}

/// Builds `name` (`kind` "bin" or "example") of `package` in this test's profile and
/// returns the path cargo reports for it: a filtered `cargo test` does not build it, and
/// a fresh build does not always refresh the un-hashed copy in the target directory.
pub fn cargo_executable(package: &str, kind: &str, name: &str) -> PathBuf {
    let (_, profile) = target_dir();
    let mut build = Command::new(env!("CARGO"));
    build
        .args(["build", "--quiet", "-p", package])
        .arg(format!("--{kind}"))
        .args([name, "--message-format=json"]);
    if profile == "release" {
        build.arg("--release");
    }
    let out = build.output().unwrap();
    assert!(
        out.status.success(),
        "building {kind} {name} of {package} failed"
    );
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter(|l| {
            l.contains(&format!("\"name\":\"{name}\"")) && l.contains(&format!("\"{kind}\""))
        })
        .find_map(|l| {
            l.split("\"executable\":\"")
                .nth(1)?
                .split('"')
                .next()
                .map(PathBuf::from)
        })
        .unwrap_or_else(|| panic!("cargo reported no executable for {kind} {name}"))
}

/// Runs `make TARGET` in the C example's directory against this build's library (one
/// `make` at a time per test binary: they share the output directory).
pub fn make_c_example(target: &str) -> std::process::Output {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/c");
    let (target_dir, profile) = target_dir();
    Command::new("make")
        .arg("-C")
        .arg(&dir)
        .arg(target)
        .arg(format!("PROFILE={profile}"))
        .arg(format!("TARGET_DIR={}", target_dir.display()))
        .output()
        .expect("make")
}
