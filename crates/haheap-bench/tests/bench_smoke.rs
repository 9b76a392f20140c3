//! Small runs of the benchmarks: every engine finds exactly the pages written, ships
//! bytes to a real backup, and the data-structure suite runs on every engine.

use std::process::Command;

use serde_json::Value;

fn bench(args: &[&str]) -> (Value, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_rebound-ha-bench"))
        .args(args)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr).to_string();
    assert!(out.status.success(), "{args:?} failed:\n{stderr}");
    (serde_json::from_slice(&out.stdout).unwrap(), stderr)
}

#[test]
fn micro_every_engine_reports_the_pages_written_and_ships_them() {
    let dir = tempfile::tempdir().unwrap();
    let svg = dir.path().join("micro.svg");
    let (doc, _) = bench(&[
        "micro",
        "--svg",
        svg.to_str().unwrap(),
        "--txs",
        "100",
        "--heap-mb",
        "1",
        "--ppt",
        "1,8",
        "--wpp",
        "4",
        "--json",
    ]);
    let cells = doc["results"].as_array().unwrap();
    assert_eq!(cells.len(), 2 * 2 * 4);
    for c in cells {
        let ppt = c["ppt"].as_f64().unwrap();
        assert_eq!(c["pages_per_tx"].as_f64().unwrap(), ppt, "{c}");
        assert_eq!(
            c["written_bytes_per_tx"].as_f64().unwrap(),
            ppt * 4.0 * 8.0,
            "{c}"
        );
        // Every store changes its 8 bytes (odd values), so at least that much is shipped.
        assert!(
            c["shipped_bytes_per_tx"].as_f64().unwrap() >= ppt * 4.0 * 8.0 * 0.9,
            "{c}"
        );
        assert!(c["us_per_tx"].as_f64().unwrap() > 0.0);
    }
    let goals = doc["goals"].as_array().unwrap();
    assert!(goals.iter().all(
        |g| g.as_str().unwrap().starts_with("PASS") || g.as_str().unwrap().starts_with("FAIL")
    ));
    // The run's figure, and the same figure drawn again from the saved JSON.
    let drawn = std::fs::read_to_string(&svg).unwrap();
    assert!(drawn.starts_with("<svg") && drawn.contains("scan") && drawn.contains("uffd"));
    let json = dir.path().join("micro.json");
    std::fs::write(&json, serde_json::to_vec(&doc).unwrap()).unwrap();
    let again = dir.path().join("again.svg");
    let out = Command::new(env!("CARGO_BIN_EXE_rebound-ha-bench"))
        .args([
            "plot",
            json.to_str().unwrap(),
            "-o",
            again.to_str().unwrap(),
        ])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(std::fs::read_to_string(&again).unwrap(), drawn);
}

#[test]
fn plot_refuses_a_file_that_is_not_a_result_in_one_line() {
    let dir = tempfile::tempdir().unwrap();
    let json = dir.path().join("ds-writes.json");
    std::fs::write(
        &json,
        br#"{"command": "ds-writes: 10 inserts", "results": []}"#,
    )
    .unwrap();
    let svg = dir.path().join("out.svg");
    let out = Command::new(env!("CARGO_BIN_EXE_rebound-ha-bench"))
        .args(["plot", json.to_str().unwrap(), "-o", svg.to_str().unwrap()])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(
        err.contains("ds-writes.json is not a rebound-ha-bench result"),
        "{err}"
    );
    assert!(!svg.exists());
}

#[test]
fn ds_suite_runs_on_every_engine_with_a_backup_process() {
    let (doc, _) = bench(&[
        "ds",
        "--ops",
        "150",
        "--heap-mb",
        "1",
        "--backup",
        "yes",
        "--backup-process",
        "--json",
    ]);
    assert!(doc["backup"].as_str().unwrap().contains("separate process"));
    let cells = doc["results"].as_array().unwrap();
    assert_eq!(cells.len(), 13 * 2 * 2 * 4);
    for c in cells {
        assert!(c["shipped_bytes_per_tx"].as_f64().unwrap() > 0.0, "{c}");
        assert!(c["writes_per_tx"].as_f64().unwrap() > 0.0, "{c}");
    }
}

#[test]
fn bad_arguments_are_one_line_errors() {
    for args in [
        &["micro", "--engines", "mprotect,bogus"][..],
        &["ds", "--structures", "btree"][..],
        &["micro", "--engines", "auto"][..],
    ] {
        let out = Command::new(env!("CARGO_BIN_EXE_rebound-ha-bench"))
            .args(args)
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(2), "{args:?}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(err.trim().lines().count(), 1, "{args:?}: {err}");
        assert!(out.stdout.is_empty());
    }
}
