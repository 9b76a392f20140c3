//! The `io` workload's file-set mode (the exclusive-cache paper's microbenchmarks) in a
//! real guest, over a file set the host generated (`rebound_image::write_fileset`) on
//! its data disk: the agent keeps the files at their version, runs the requests, checks
//! every 1 KiB block it reads, and reports `files` events; a block the host set back to
//! an older version (stale, but a valid signature) is caught and named.

use crate::common;

use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use common::{eventually, Env};
use serde_json::Value;

/// More than a third of the guest's 256 MiB: the set fits in its page cache, so the
/// footprint grows as the requests touch files.
const FILES: u64 = 96;
const FILE_BYTES: u64 = 1 << 20;

/// An ext4 image holding `files/f00000`.. at `version`, each block what the agent
/// writes; with `stale`, block `.1` of file `.0` holds the version before.
fn make_disk(dir: &Path, version: u64, stale: Option<(u64, u64)>) -> PathBuf {
    let src = dir.join("set");
    let set = src.join("files");
    rebound_image::write_fileset(&set, FILES, FILE_BYTES, version).unwrap();
    if let Some((file, block)) = stale {
        let old = rebound_image::block_signature(file, block, version - 1);
        let f = std::fs::OpenOptions::new()
            .write(true)
            .open(set.join(rebound_image::fileset::file_name(file)))
            .unwrap();
        f.write_all_at(&old, block * 1024).unwrap();
    }
    let img = dir.join("set.ext4");
    let tools = rebound_image::Tools::check().unwrap();
    rebound_image::mkfs_from_dir(&tools, "files-set", &src, &img, "160M").unwrap();
    std::fs::remove_dir_all(&src).unwrap();
    img
}

/// Starts the io workload in file-set mode on `disk` with these extra `KEY=VALUE`s.
fn start(env: &Env, name: &str, disk: &Path, args: &[&str]) {
    let mut argv = vec![
        "vm",
        "start",
        name,
        "--workload",
        "io",
        "--memory",
        "256M",
        "--disk",
        disk.to_str().unwrap(),
        "--workload-arg",
        "data_disk=vdb",
        "--workload-arg",
        "io_files=96",
        "--workload-arg",
        "io_file_size=1M",
    ];
    for a in args {
        argv.extend_from_slice(&["--workload-arg", a]);
    }
    env.ok(&argv);
}

/// The `files` events' details so far.
fn reports(env: &Env, name: &str) -> Vec<Value> {
    env.events(name)
        .into_iter()
        .filter(|e| e["kind"] == "files")
        .map(|e| e["detail"].clone())
        .collect()
}

/// Waits for the report with `requests` requests done.
fn wait_report(env: &Env, name: &str, requests: u64) -> Vec<Value> {
    eventually(
        Duration::from_secs(600),
        &format!("a files report after {requests} requests"),
        || {
            let r = reports(env, name);
            r.iter().any(|d| d["requests"] == requests).then_some(r)
        },
    )
}

/// The agent's console lines: the file set must be the host's, kept, not rewritten.
fn assert_kept(env: &Env, name: &str) {
    let serial =
        std::fs::read_to_string(env.home.path().join("vms").join(name).join("serial.log")).unwrap();
    assert!(
        serial.contains("files: 96 files of 1024 KiB in /data/files: 0 created, 96 kept"),
        "the agent did not keep the host's file set:\n{serial}"
    );
    for bad in ["I/O error", "EXT4-fs error", "BUG", "Oops"] {
        assert!(!serial.contains(bad), "the guest saw {bad:?}:\n{serial}");
    }
}

#[test]
fn zipf_reads_and_writes_check_every_block_of_a_host_made_set() {
    let env = Env::new();
    let disk = make_disk(env.home.path(), 1, None);
    let t0 = Instant::now();
    start(
        &env,
        "fz",
        &disk,
        &[
            "io_pattern=zipf",
            "io_write_ratio=0.1",
            "io_requests=300",
            "io_rounds=2",
        ],
    );
    let ready = t0.elapsed();
    let r = wait_report(&env, "fz", 600);
    eprintln!("ready after {ready:?}, done after {:?}", t0.elapsed());
    for d in &r {
        eprintln!("files: {d}");
    }
    // The early report after 200 requests, then one per round.
    let done: Vec<u64> = r.iter().map(|d| d["requests"].as_u64().unwrap()).collect();
    assert_eq!(done, [200, 300, 600], "{r:?}");
    let rounds: Vec<u64> = r.iter().map(|d| d["round"].as_u64().unwrap()).collect();
    assert_eq!(rounds, [1, 1, 2]);
    for d in &r {
        assert_eq!(d["errors"], 0, "{d}");
        assert!(d["first_error"].is_null(), "{d}");
        assert_eq!(d["pattern"], "zipf");
        let (reads, writes) = (d["reads"].as_u64().unwrap(), d["writes"].as_u64().unwrap());
        assert_eq!(reads + writes, d["requests"].as_u64().unwrap(), "{d}");
        assert_eq!(d["bytes_read"].as_u64().unwrap(), reads * FILE_BYTES, "{d}");
        assert_eq!(
            d["bytes_written"].as_u64().unwrap(),
            writes * FILE_BYTES,
            "{d}"
        );
        let fp = d["footprint_kib"].as_u64().unwrap();
        assert!(fp > 0 && fp <= FILES * FILE_BYTES / 1024, "{d}");
        assert!(d["cached_kib"].as_u64().unwrap() >= fp, "{d}");
        assert!(d["mem_total_kib"].as_u64().unwrap() > 128 << 10, "{d}");
    }
    let last = &r[2];
    // 10% of 600: far from 0 for any seed (the sequence is fixed by the default seed).
    let writes = last["writes"].as_u64().unwrap();
    assert!((20..=100).contains(&writes), "{last}");
    assert_kept(&env, "fz");
    env.ok(&["vm", "stop", "fz"]);
}

#[test]
fn a_block_set_back_one_version_is_reported_with_its_file() {
    let env = Env::new();
    // Version 3 everywhere but block 300 of f00017, at version 2: a whole, valid block
    // of that file, only older (what a cache serving stale data would return). Its
    // first and last blocks are current, so the agent keeps the file at version 3.
    let disk = make_disk(env.home.path(), 3, Some((17, 300)));
    let t0 = Instant::now();
    // seq reads every file once in 96 requests.
    start(
        &env,
        "fs",
        &disk,
        &["io_pattern=seq", "io_requests=96", "io_rounds=1"],
    );
    let r = wait_report(&env, "fs", 96);
    eprintln!("done after {:?}: {r:?}", t0.elapsed());
    let d = &r[0];
    assert_eq!(
        (d["reads"].as_u64(), d["writes"].as_u64()),
        (Some(96), Some(0))
    );
    assert_eq!(d["errors"], 1, "one block is stale: {d}");
    let first = d["first_error"].as_str().unwrap();
    assert!(
        first.starts_with("f00017 offset 307200:")
            && first.contains("expected version word 5242000000000003")
            && first.contains("found 5242000000000002")
            && first.contains("stale"),
        "{first}"
    );
    assert_kept(&env, "fs");
    env.ok(&["vm", "stop", "fs"]);
}
