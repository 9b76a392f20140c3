//! The examples run: the C one built against the header and the static library, the Rust
//! one through cargo, each with every engine.

use std::process::Command;

#[test]
fn c_example_builds_and_runs_with_every_engine() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/c");
    // This test binary lives in <target>/debug/deps; the Makefile wants <target>/debug.
    let exe = std::env::current_exe().unwrap();
    let target_dir = exe.parent().and_then(|d| d.parent()).unwrap();
    let out = Command::new("make")
        .arg("-C")
        .arg(&dir)
        .arg("run")
        .arg(format!("TARGET_DIR={}", target_dir.display()))
        .output()
        .expect("make");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "make run failed: {stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    for engine in ["mprotect", "uffd", "scan", "log"] {
        assert!(
            stdout.contains(&format!("engine={engine} ")),
            "{engine} did not run: {stdout}"
        );
    }
    assert_eq!(stdout.matches("list ok").count(), 5, "{stdout}");
}

#[test]
fn rust_list_example_runs_with_every_engine() {
    // Examples are built next to the test binaries: <target>/debug/examples/list.
    let exe = std::env::current_exe().unwrap();
    let list = exe
        .parent()
        .and_then(|d| d.parent())
        .unwrap()
        .join("examples/list");
    for engine in ["mprotect", "uffd", "scan", "log", "auto"] {
        let out = Command::new(&list)
            .arg(engine)
            .output()
            .expect("run examples/list");
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success(),
            "{engine}: {stdout}{}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(
            stdout.contains("aborted update left 9 nodes"),
            "{engine}: {stdout}"
        );
    }
}
