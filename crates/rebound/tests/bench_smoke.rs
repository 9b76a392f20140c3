//! `rebound bench` at its smallest, so a benchmark that no longer runs fails here
//! rather than 30 minutes into a measurement (as `bench restore` did once snapshots
//! stopped opening a user kernel's path on their own say-so). The figures are not
//! checked: only that each cell measured what a user would read.

use crate::common::*;

#[test]
fn bench_restore_runs_a_user_kernel_workload_through_every_step() {
    let env = Env::new();
    let out = env.ok(&[
        "bench",
        "restore",
        "--workloads",
        "mixed",
        "--modes",
        "lazy,elastic",
        "--disks",
        "real",
        "--runs",
        "1",
        "--memory",
        "256M",
        "--touch",
        "32M",
        "--watch-s",
        "2",
        "--trace-s",
        "2",
        "--json",
    ]);
    let v: serde_json::Value = serde_json::from_str(&out).expect("bench restore --json");
    let cells = v["medians"].as_array().expect("medians");
    assert_eq!(cells.len(), 2, "{v}");
    for c in cells {
        assert_eq!(c["workload"], "mixed", "{c}");
        // The restored guest answered its HTTP readiness check.
        assert!(c["time_to_responsive_s"].as_f64().unwrap() > 0.0, "{c}");
    }
    assert_eq!(v["snapshots"][0]["workload"], "mixed");
    assert!(
        v["snapshots"][0]["trace_pages"].as_u64().unwrap() > 0,
        "{v}"
    );
}
