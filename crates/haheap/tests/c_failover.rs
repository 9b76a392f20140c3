//! Failover through the C ABI, from a C89 program (`tests/c/failover.c`) on every engine:
//! a new primary learns the replica's transaction id with `haheap_committed_tx_id` and
//! continues after it; a fenced primary gets `HAHEAP_ERR_FENCED`, for good.

use crate::common;

use std::io::{BufRead, BufReader, Write};
use std::path::PathBuf;
use std::process::{Child, ChildStdout, Command, Stdio};
use std::sync::Mutex;
use std::time::Duration;

use common::{make_c_example, target_dir};

const ENGINES: [&str; 4] = ["mprotect", "uffd", "scan", "log"];

/// The tests share one build output: one `make` at a time.
static C_BUILD: Mutex<()> = Mutex::new(());

fn failover_program() -> PathBuf {
    let _one_make = C_BUILD.lock().unwrap_or_else(|e| e.into_inner());
    let out = make_c_example("tests");
    assert!(
        out.status.success(),
        "make tests failed (the header must compile as C89): {}",
        String::from_utf8_lossy(&out.stderr)
    );
    target_dir().0.join("haheap-c-example/failover")
}

/// A backup on a unix socket in `dir`, served on a thread of this test.
fn backup(dir: &tempfile::TempDir) -> (hareplica::BackupHandle, String) {
    let ep = format!("unix:{}", dir.path().join("b.sock").display());
    let cfg = hareplica::BackupConfig::new(ep.parse().unwrap(), &dir.path().join("replica"));
    (hareplica::BackupServer::bind(cfg).unwrap().0.spawn(), ep)
}

/// Starts the C primary and waits until it committed its two transactions.
fn primary(prog: &PathBuf, engine: &str, ep: &str) -> (Child, BufReader<ChildStdout>) {
    let mut child = Command::new(prog)
        .args([engine, ep, "primary"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .expect("start the C primary");
    let mut out = BufReader::new(child.stdout.take().unwrap());
    let mut line = String::new();
    out.read_line(&mut line).unwrap();
    assert_eq!(line, "committed 2\n", "{engine}");
    (child, out)
}

/// Runs the C takeover; returns its output.
fn takeover(prog: &PathBuf, engine: &str, ep: &str) -> String {
    let out = Command::new(prog)
        .args([engine, ep, "takeover"])
        .output()
        .expect("run the C takeover");
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(out.status.success(), "{engine}: {stdout}");
    stdout
}

#[test]
fn c_takeover_reads_the_replica_tx_id_and_continues_after_it() {
    let prog = failover_program();
    for engine in ENGINES {
        let dir = tempfile::tempdir().unwrap();
        let (backup, ep) = backup(&dir);
        let (mut child, _) = primary(&prog, engine, &ep);
        child.kill().unwrap();
        child.wait().unwrap();
        let out = takeover(&prog, engine, &ep);
        assert_eq!(out, "took over at tx 2\ncommitted 3\n", "{engine}");
        assert_eq!(backup.state().last_tx, 3, "{engine}");
    }
}

#[test]
fn c_fenced_primary_gets_haheap_err_fenced_for_good() {
    let prog = failover_program();
    for engine in ENGINES {
        let dir = tempfile::tempdir().unwrap();
        let (backup, ep) = backup(&dir);
        let (mut child, mut out) = primary(&prog, engine, &ep);
        let (epoch, last) =
            hareplica::promote(&ep.parse().unwrap(), Duration::from_secs(5)).expect("promote");
        assert_eq!((epoch, last), (2, 2), "{engine}");
        assert!(takeover(&prog, engine, &ep).ends_with("committed 3\n"));
        child.stdin.take().unwrap().write_all(b"go\n").unwrap();
        let mut rest = String::new();
        std::io::Read::read_to_string(&mut out, &mut rest).unwrap();
        let status = child.wait().unwrap();
        assert!(status.success(), "{engine}: {rest}");
        assert!(
            rest.starts_with("fenced: this primary was fenced"),
            "{engine}: {rest}"
        );
        assert_eq!(
            backup.state().last_tx,
            3,
            "{engine}: the fenced commit stayed out"
        );
    }
}
