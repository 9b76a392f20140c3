//! The whole pipeline under faults, for all four engines: a primary process SIGKILLed at
//! random points, takeover from a backup process, invariants and exact replay; and a
//! backup SIGKILLed and restarted under a running primary, once with a heap that fails at
//! once and retries, once with a heap that blocks in `tend` until the backup is back.

use std::process::Command;

use serde_json::Value;

fn bench() -> Command {
    Command::new(env!("CARGO_BIN_EXE_rebound-ha-bench"))
}

#[test]
fn sigkilled_primaries_and_a_restarted_backup_lose_no_acknowledged_transaction() {
    let out = bench()
        .args(["faults", "--trials", "5", "--max-ms", "300", "--json"])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "faults failed:\n{stderr}");
    let doc: Value = serde_json::from_slice(&out.stdout).unwrap();
    let trials = doc["results"].as_array().unwrap();
    // 5 kills + 2 backup restarts (fail-and-retry, block) per engine.
    assert_eq!(trials.len(), 4 * 7, "{stderr}");
    let mut structures = std::collections::BTreeSet::new();
    for t in trials {
        assert_eq!(t["ok"], true, "trial failed: {t}");
        let (acked, replica) = (
            t["acked"].as_u64().unwrap(),
            t["replica_tx"].as_u64().unwrap(),
        );
        assert!(replica == acked || replica == acked + 1, "{t}");
        assert!(acked >= 1, "{t}");
        structures.insert(t["structure"].as_str().unwrap().to_string());
    }
    for e in ["mprotect", "uffd", "scan", "log"] {
        let n = trials.iter().filter(|t| t["engine"] == e).count();
        assert_eq!(n, 7, "engine {e}");
        let restart = trials
            .iter()
            .find(|t| t["engine"] == e && t["scenario"] == "restart-backup")
            .unwrap();
        assert!(
            restart["primary_failures"].as_u64().unwrap() > 0,
            "{restart}"
        );
        assert_blocked(trials, e);
    }
    assert_eq!(
        structures.len(),
        13,
        "every structure ran in some trial: {structures:?}"
    );
    assert!(doc["machine"]["kernel"]
        .as_str()
        .is_some_and(|k| !k.is_empty()));
}

/// The blocking primary reported no failure and one of its transactions spanned the
/// backup's restart (the harness checked the span against the restart instant).
fn assert_blocked(trials: &[Value], engine: &str) {
    let t = trials
        .iter()
        .find(|t| t["engine"] == engine && t["scenario"] == "restart-backup-block")
        .unwrap_or_else(|| panic!("no blocking restart trial for {engine}"));
    assert_eq!(t["ok"], true, "{t}");
    assert_eq!(t["primary_failures"], 0, "{t}");
    assert!(t["down_ms"].as_u64().unwrap() >= 300, "{t}");
    assert!(t["blocked_ms"].as_u64().unwrap() > 0, "{t}");
}

#[test]
fn a_primary_without_its_backup_fails_cleanly() {
    let dir = tempfile::tempdir().unwrap();
    let ep = format!("unix:{}", dir.path().join("none.sock").display());
    let out = bench()
        .args([
            "primary",
            "--engine",
            "scan",
            "--backup",
            &ep,
            "--structure",
            "rb",
            "--seed",
            "1",
        ])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(
        err.trim().lines().count(),
        1,
        "one-line error expected: {err}"
    );
    assert!(err.contains("creating the primary heap"), "{err}");
    assert!(out.stdout.is_empty(), "nothing acknowledged");
}

#[test]
fn asynchronous_replication_loses_at_most_the_lag_and_never_part_of_a_transaction() {
    let out = bench()
        .args([
            "faults",
            "--trials",
            "2",
            "--max-lag",
            "4",
            "--max-ms",
            "200",
            "--json",
        ])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "async faults failed:\n{stderr}");
    let doc: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert!(doc["command"].as_str().unwrap().contains("max lag 4"));
    let trials = doc["results"].as_array().unwrap();
    assert_eq!(trials.len(), 4 * 4);
    for t in trials {
        assert_eq!(t["ok"], true, "trial failed: {t}");
        let (acked, replica) = (
            t["acked"].as_u64().unwrap(),
            t["replica_tx"].as_u64().unwrap(),
        );
        assert!(replica + 4 >= acked && replica <= acked + 1, "{t}");
    }
    for e in ["mprotect", "uffd", "scan", "log"] {
        assert_blocked(trials, e);
    }
}
