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
        .output()
        .unwrap_or_else(|e| {
            panic!("cannot run make: {e}; scripts/install-deps.sh installs make and gcc")
        });
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        out.status.success(),
        "make check failed (it needs gcc with ASan/UBSan, make and libc6-dev: \
         scripts/install-deps.sh):\n{text}"
    );
    assert!(text.contains("agent unit tests passed"), "{text}");
}
