//! The examples run: the C one built against the header and the static library, the Rust
//! one through cargo, each with every engine.

use crate::common;

use std::path::PathBuf;
use std::process::Command;
use std::sync::Mutex;

use common::{cargo_executable, make_c_example, target_dir};

/// The C tests share one build output: one `make` at a time.
static C_BUILD: Mutex<()> = Mutex::new(());

#[test]
fn c_example_builds_and_runs_with_every_engine() {
    let _one_make = C_BUILD.lock().unwrap_or_else(|e| e.into_inner());
    let out = make_c_example("run");
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

/// Builds the C example (`make all`) and returns its path; hold C_BUILD around it.
fn c_list() -> PathBuf {
    let (target_dir, _) = target_dir();
    let out = make_c_example("all");
    assert!(
        out.status.success(),
        "make all failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    target_dir.join("haheap-c-example/list")
}

/// The C program replicates to a real backup; a second C process takes over from the
/// replica, finds every committed transaction and carries on.
#[test]
fn c_example_replicates_and_takes_over() {
    let _one_make = C_BUILD.lock().unwrap_or_else(|e| e.into_inner());
    let list = c_list();
    for engine in ["mprotect", "uffd", "scan", "log"] {
        let dir = tempfile::tempdir().unwrap();
        let ep = format!("unix:{}", dir.path().join("b.sock").display());
        let cfg = hareplica::BackupConfig::new(ep.parse().unwrap(), &dir.path().join("replica"));
        let backup = hareplica::BackupServer::bind(cfg).unwrap().0.spawn();
        let first = Command::new(&list).args([engine, &ep]).output().unwrap();
        let out = String::from_utf8_lossy(&first.stdout);
        assert!(
            first.status.success(),
            "{engine}: {out}{}",
            String::from_utf8_lossy(&first.stderr)
        );
        assert_eq!(
            backup.state().last_tx,
            22,
            "{engine}: backup missed transactions"
        );
        let second = Command::new(&list)
            .args([engine, &ep, "takeover"])
            .output()
            .unwrap();
        let out = String::from_utf8_lossy(&second.stdout);
        assert!(
            second.status.success(),
            "{engine}: {out}{}",
            String::from_utf8_lossy(&second.stderr)
        );
        assert!(
            out.contains("19 nodes, sum 210") && out.contains("continued at tx 23"),
            "{engine}: {out}"
        );
        assert_eq!(backup.state().last_tx, 23);
        backup.shutdown().unwrap();
    }
}

#[test]
fn rust_list_example_runs_with_every_engine() {
    let list = cargo_executable("haheap", "example", "list");
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
