//! Runs the guest agent's own unit tests (`make -C guest/agent check`: its JSON reader,
//! size and command-line parsers, web paths and kv protocol, under ASan/UBSan), so
//! `cargo test` covers the C side too.

use std::path::Path;
use std::process::Command;

#[test]
fn agent_unit_tests_pass() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../guest/agent");
    let out = Command::new("make")
        .arg("-s")
        .arg("-C")
        .arg(&dir)
        .arg("check")
        .output();
    let out = match out {
        Ok(o) => o,
        Err(e) => {
            eprintln!("SKIPPED: cannot run make: {e}");
            return;
        }
    };
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "make check failed:\n{text}");
    assert!(text.contains("agent unit tests passed"), "{text}");
}
