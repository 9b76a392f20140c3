//! `vm memory --size` and `memory plan`: two guests, each with half its allocation
//! as an exclusive host cache, run different access patterns over their own file sets;
//! their disks' backends trace their curves, and the plan divides the memory they
//! hold between them without predicting any more misses than the bound allows; applied,
//! it changes their allocations (the guests keep running).

use crate::common;

use std::path::{Path, PathBuf};
use std::time::Duration;

use common::{eventually, Env};
use serde_json::Value;

const MIB: u64 = 1 << 20;

fn make_disk(dir: &Path, name: &str) -> PathBuf {
    let src = dir.join(format!("{name}-set"));
    rebound_image::write_fileset(&src.join("files"), 128, MIB, 1).unwrap();
    let img = dir.join(format!("{name}.ext4"));
    let tools = rebound_image::Tools::check().unwrap();
    rebound_image::mkfs_from_dir(&tools, name, &src, &img, "192M").unwrap();
    std::fs::remove_dir_all(&src).unwrap();
    img
}

/// Boots with 320 MiB, so that the balloon can grow the guest past its 256 MiB
/// allocation later; the workload waits for the host cache to be in place.
fn start(env: &Env, name: &str, disk: &Path, pattern: &str) {
    let entry = format!(
        "{},cache=host:64M",
        disk.to_str().unwrap().replace(',', ",,")
    );
    let pattern = format!("io_pattern={pattern}");
    let mut argv = vec![
        "vm",
        "start",
        name,
        "--workload",
        "io",
        "--memory",
        "320M",
        "--disk",
        &entry,
    ];
    for a in [
        "data_disk=vdb",
        "io_files=128",
        "io_file_size=1M",
        &pattern,
        "io_requests=200",
        "io_rounds=0",
        "io_delay_s=8",
    ] {
        argv.extend_from_slice(&["--workload-arg", a]);
    }
    env.ok(&argv);
}

fn json(env: &Env, args: &[&str]) -> Value {
    serde_json::from_str(&env.ok(args)).unwrap()
}

#[test]
fn plans_divide_what_the_vms_hold_by_their_curves_and_apply_moves_it() {
    let env = Env::new();
    for (name, pattern) in [("pz", "zipf"), ("ps", "seq")] {
        let disk = make_disk(env.home.path(), name);
        start(&env, name, &disk, pattern);
        // 256 MiB allocated, half of it the host cache: the guest keeps 128 MiB.
        let r = json(
            &env,
            &[
                "vm",
                "memory",
                name,
                "--size",
                "256M",
                "--host-cache",
                "128M",
                "--json",
            ],
        );
        assert_eq!(
            (r["allocation_mib"].as_u64(), r["guest_mib"].as_u64()),
            (Some(256), Some(128)),
            "{r}"
        );
    }
    // More than the balloon can give back is refused, and nothing moves.
    let e = env.fails(&["vm", "memory", "pz", "--size", "400M"]);
    assert!(e.contains("booted with"), "{e}");
    // Curves need reads that missed the guests: a few hundred requests each.
    for name in ["pz", "ps"] {
        eventually(Duration::from_secs(300), "requests past the guest", || {
            let r = json(&env, &["vm", "mrc", name, "--json"]);
            (r["disks"][0]["misses"].as_u64().unwrap() > 20_000).then_some(())
        });
    }
    let plan = json(&env, &["memory", "plan", "--bound", "5%", "--json"]);
    eprintln!("plan: {plan}");
    assert_eq!(plan["total_bytes"], 512 * MIB, "{plan}");
    assert_eq!(plan["margin"], 0.03, "{plan}");
    let vms = plan["vms"].as_array().unwrap();
    assert_eq!(vms.len(), 2, "{plan}");
    let planned: u64 = vms
        .iter()
        .map(|v| v["planned_bytes"].as_u64().unwrap())
        .sum();
    assert_eq!(planned, 512 * MIB, "{plan}");
    for v in vms {
        assert_eq!(v["within_bound"], true, "{v}");
        // Planned the default margin under the bound, for the curves' error.
        assert_eq!(v["within_margin"], true, "{v}");
        assert!(v["relative"].as_f64().unwrap() <= 1.02 + 1e-9, "{v}");
        assert!(
            v["planned_bytes"].as_u64() >= v["curve_from_bytes"].as_u64(),
            "{v}"
        );
        assert!(v["planned_bytes"].as_u64().unwrap() <= 320 * MIB, "{v}");
        assert!(v["applied"].is_null(), "{v}");
    }
    // The allocation now is one of the candidates: the best is never worse.
    assert!(
        plan["geo_mean_relative"].as_f64().unwrap() <= 1.0 + 1e-9,
        "{plan}"
    );
    let esx = json(
        &env,
        &["memory", "plan", "--policy", "esx-idle-tax", "--json"],
    );
    let esx_sum: u64 = esx["vms"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v["planned_bytes"].as_u64().unwrap())
        .sum();
    assert_eq!(esx_sum, 512 * MIB, "{esx}");

    let applied = json(
        &env,
        &["memory", "plan", "--bound", "5%", "--apply", "--json"],
    );
    eprintln!("applied: {applied}");
    for v in applied["vms"].as_array().unwrap() {
        let name = v["name"].as_str().unwrap();
        assert!(v["applied"]["error"].is_null(), "{v}");
        assert_eq!(v["applied"]["allocation_bytes"], v["planned_bytes"], "{v}");
        let m = json(&env, &["vm", "mrc", name, "--json"]);
        assert_eq!(m["allocation_bytes"], v["planned_bytes"], "{m}");
        // A VM that shrank gave host cache first; one that grew grew its guest.
        assert!(m["guest_bytes"].as_u64().unwrap() >= 128 * MIB, "{m}");
        let st = json(&env, &["vm", "status", name, "--json"]);
        assert_eq!(st["state"], "running", "{st}");
        let serial =
            std::fs::read_to_string(env.home.path().join("vms").join(name).join("serial.log"))
                .unwrap();
        for bad in ["Out of memory", "I/O error", "EXT4-fs error", "BUG", "Oops"] {
            assert!(!serial.contains(bad), "{name} saw {bad:?}:\n{serial}");
        }
    }
}
