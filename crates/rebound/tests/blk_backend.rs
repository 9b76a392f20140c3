//! Guests whose disks Rebound's own vhost-user-blk backend serves
//! (`--disk-backend rebound`): the guest reads its data disk through it, the host
//! cache fills and serves, the backend outlives a crashed QEMU so the recovery VM
//! finds the cache warm, and it stops with the VM.

use crate::common;

use std::path::{Path, PathBuf};

use common::{ext4_file, http_get, Env};
use serde_json::Value;

/// The pids of backend processes (`rebound blk serve`) whose command line names
/// `needle`.
fn pids_naming(needle: &Path) -> Vec<u32> {
    let needle = needle.to_string_lossy().to_string();
    std::fs::read_dir("/proc")
        .unwrap()
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
        .filter(|pid| {
            std::fs::read(format!("/proc/{pid}/cmdline"))
                .map(|c| {
                    let c = String::from_utf8_lossy(&c);
                    c.contains(&needle) && c.contains("blk\0serve")
                })
                .unwrap_or(false)
        })
        .collect()
}

/// A 256 MiB guest running `workload` whose disks the rebound backend serves.
fn start_on_backend(env: &Env, name: &str, workload: &str, extra: &[&str]) {
    let mut args = vec![
        "vm",
        "start",
        name,
        "--workload",
        workload,
        "--memory",
        "256M",
        "--disk-backend",
        "rebound",
    ];
    args.extend_from_slice(extra);
    env.ok(&args);
}

/// The QEMU command line the VM first started with, as JSON text.
fn first_argv(env: &Env, name: &str) -> String {
    env.events(name)
        .iter()
        .find(|e| e["kind"] == "started")
        .map(|e| e["detail"]["argv"].to_string())
        .unwrap()
}

fn stats(env: &Env, control: &Path) -> Value {
    serde_json::from_str(&env.ok(&["blk", "stats", control.to_str().unwrap(), "--json"])).unwrap()
}

#[test]
fn a_guest_reads_through_the_backend_and_its_recovery_vm_finds_the_cache_warm() {
    let env = Env::new();
    let img = rebound_image::open(env.home.path(), "default").unwrap();
    start_on_backend(
        &env,
        "b1",
        "web",
        &["--disk-cache", "32M", "--on-crash", "recover"],
    );
    let blk: PathBuf = env.run.path().join("b1@blk");
    let (socket, control) = (blk.join("disk0.sock"), blk.join("disk0.ctl"));
    let argv = first_argv(&env, "b1");
    assert!(
        argv.contains("vhost-user-blk-pci") && !argv.contains("disk0.qcow2"),
        "{argv}"
    );

    // The guest's web service reads its data disk through the backend.
    let port = env.host_port("b1", 8080);
    let blob = ext4_file(&img.disk, "/blob-1m.bin").unwrap();
    let (code, body) = http_get(port, "/blob-1m.bin").unwrap();
    assert_eq!(code, 200);
    assert!(body == blob, "the blob served differs from the data disk");
    let before = stats(&env, &control);
    // The API lists the disk with what serves it and the same statistics.
    let disks = env.get_ok("GET", "/v1/vms/b1/disks", None);
    assert_eq!(disks[0]["backend"], "rebound", "{disks}");
    assert_eq!(disks[0]["control"], control.to_str().unwrap());
    assert!(
        disks[0]["stats"]["cache"]["misses"].as_u64().unwrap() > 0,
        "{disks}"
    );
    let text = env.ok(&["vm", "disks", "b1"]);
    assert!(
        text.contains("disk0") && text.contains("rebound") && text.contains("hits"),
        "{text}"
    );
    let c = &before["cache"];
    assert!(c["misses"].as_u64().unwrap() > 0, "{before}");
    assert!(c["read_bytes"].as_u64().unwrap() >= 1 << 20, "{before}");
    assert!(c["admissions"].as_u64().unwrap() > 0, "{before}");
    assert_eq!(c["capacity_bytes"], 32u64 << 20);
    let backend = pids_naming(&socket);
    assert_eq!(backend.len(), 1, "{backend:?}");

    // A crash: the recovery VM reconnects to the same backend, whose cache holds what
    // the crashed guest read; the recovered guest's cold page cache reads from it.
    env.ok(&["vm", "crash", "b1"]);
    env.wait_event("b1", "recovered");
    let (code, body) = http_get(port, "/blob-1m.bin").unwrap();
    assert_eq!(code, 200);
    assert!(body == blob, "the recovery VM served another blob");
    assert_eq!(pids_naming(&socket), backend, "the backend was replaced");
    let after = stats(&env, &control);
    let hits = |v: &Value| v["cache"]["hits"].as_u64().unwrap();
    assert!(
        hits(&after) >= hits(&before) + 256,
        "the recovery VM's reads of the 1 MiB blob did not hit the cache: {before} -> {after}"
    );
    assert!(after["connections"].as_u64().unwrap() >= 1, "{after}");

    // The backend stops with the VM; the VM's raw disk copy stays.
    env.ok(&["vm", "stop", "b1"]);
    assert!(pids_naming(&socket).is_empty());
    assert!(!blk.exists());
    assert!(env.home.path().join("vms/b1/disk0.img").exists());
}

#[test]
fn the_backend_refuses_what_it_cannot_serve_in_one_line() {
    let env = Env::new();
    let q = env.home.path().join("q.qcow2");
    let out = std::process::Command::new("qemu-img")
        .args(["create", "-q", "-f", "qcow2"])
        .arg(&q)
        .arg("16M")
        .output()
        .unwrap();
    assert!(out.status.success());
    let e = env.fails(&[
        "vm",
        "start",
        "x",
        "--disk-backend",
        "rebound",
        "--disk",
        q.to_str().unwrap(),
    ]);
    assert!(e.contains("is qcow2") && e.contains("raw"), "{e}");
    let e = env.fails(&["vm", "start", "x", "--disk-cache", "16M"]);
    assert!(
        e.contains("--disk-cache needs --disk-backend rebound"),
        "{e}"
    );
    let e = env.fails(&[
        "vm",
        "start",
        "x",
        "--disk-backend",
        "rebound",
        "--disk-direct",
    ]);
    assert!(e.contains("--disk-direct is for QEMU's own disks"), "{e}");
    let e = env.fails(&["vm", "start", "x", "--disk-backend", "nvme"]);
    assert!(e.contains("unknown disk backend"), "{e}");
    // Nothing was left running.
    assert!(pids_naming(&env.run.path().join("x@blk")).is_empty());
}

#[test]
fn a_killed_backend_is_replaced_and_the_guest_sees_no_error() {
    let env = Env::new();
    let img = rebound_image::open(env.home.path(), "default").unwrap();
    start_on_backend(&env, "f1", "web", &[]);
    let socket = env.run.path().join("f1@blk/disk0.sock");
    let old = pids_naming(&socket);
    assert_eq!(old.len(), 1);
    // SIGKILL, as a crash of the backend would: nothing of it gets to clean up.
    assert!(std::process::Command::new("kill")
        .args(["-9", &old[0].to_string()])
        .status()
        .unwrap()
        .success());
    // The blob was never read yet: the guest must read it from the disk, through
    // whatever serves the disk now.
    let port = env.host_port("f1", 8080);
    let (code, body) = http_get(port, "/blob-1m.bin").unwrap();
    assert_eq!(code, 200);
    assert!(body == ext4_file(&img.disk, "/blob-1m.bin").unwrap());
    env.wait_event("f1", "disk_backend_restarted");
    let new = pids_naming(&socket);
    assert_eq!(new.len(), 1);
    assert_ne!(new, old);
    let serial = std::fs::read_to_string(env.home.path().join("vms/f1/serial.log")).unwrap();
    for bad in ["I/O error", "EXT4-fs error", "Buffer I/O"] {
        assert!(!serial.contains(bad), "the guest saw {bad:?}:\n{serial}");
    }
    env.ok(&["vm", "stop", "f1"]);
    assert!(
        pids_naming(&socket).is_empty(),
        "the new backend outlived the VM"
    );
}

/// Every 4 KiB block the `io` workload left in `data` holds the pattern of its first
/// fill (version 1: seqwrite rewrote it all) or of its random writes (version 2):
/// nothing was lost or torn on the way. Returns how many hold the random writes.
fn check_io_pattern(data: &[u8]) -> usize {
    let mut rewritten = 0;
    for (b, block) in data.chunks(4096).enumerate() {
        let word = |j: usize| u64::from_le_bytes(block[j * 8..j * 8 + 8].try_into().unwrap());
        let version = word(0) ^ rebound_image::splitmix64((b * 512) as u64);
        assert!(version == 1 || version == 2, "block {b}: version {version}");
        for j in 0..512 {
            assert_eq!(
                word(j),
                rebound_image::splitmix64((b * 512 + j) as u64) ^ version,
                "block {b} word {j}"
            );
        }
        rewritten += usize::from(version == 2);
    }
    rewritten
}

/// A disk chosen per entry: the image's disk stays QEMU's, the extra one is made by
/// `size=` and served by the backend with the cache its `cache=host:SIZE` asks for.
#[test]
fn a_disk_entry_chooses_its_backend_and_cache_and_every_written_block_reaches_the_file() {
    let env = Env::new();
    let disk = env.home.path().join("scratch,1.raw");
    let entry = format!(
        "{},size=8M,cache=host:16M",
        disk.to_str().unwrap().replace(',', ",,")
    );
    env.ok(&[
        "vm",
        "start",
        "io1",
        "--workload",
        "io",
        "--memory",
        "256M",
        "--disk",
        &entry,
        "--workload-arg",
        "io_target=/dev/vdb",
        "--workload-arg",
        "io_size=8M",
        "--workload-arg",
        "io_seconds=2",
    ]);
    assert_eq!(std::fs::metadata(&disk).unwrap().len(), 8 << 20);
    let argv = first_argv(&env, "io1");
    assert!(
        argv.contains("disk0.qcow2") && argv.contains("vhost-user-blk-pci"),
        "{argv}"
    );
    let phases = common::eventually(
        std::time::Duration::from_secs(180),
        "the io workload's four phases",
        || {
            let io: Vec<Value> = env
                .events("io1")
                .into_iter()
                .filter(|e| e["kind"] == "io")
                .collect();
            (io.len() >= 4).then_some(io)
        },
    );
    let names: Vec<&str> = phases
        .iter()
        .map(|e| e["detail"]["phase"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["seqwrite", "seqread", "randread", "randwrite"]);
    for p in &phases {
        let d = &p["detail"];
        assert!(d["ops"].as_u64().unwrap() > 0, "{p}");
        assert_eq!(d["bytes"], d["ops"].as_u64().unwrap() * 4096, "{p}");
        assert!(
            d["p99_us"].as_u64().unwrap() >= d["p50_us"].as_u64().unwrap(),
            "{p}"
        );
    }
    let s = stats(&env, &env.run.path().join("io1@blk/disk1.ctl"));
    assert_eq!(s["cache"]["capacity_bytes"], 16 << 20, "{s}");
    assert!(
        s["cache"]["written_bytes"].as_u64().unwrap() >= 8 << 20,
        "{s}"
    );
    assert!(
        !env.run.path().join("io1@blk/disk0.sock").exists(),
        "the image's disk is QEMU's"
    );
    env.ok(&["vm", "stop", "io1"]);
    let data = std::fs::read(&disk).unwrap();
    assert_eq!(data.len(), 8 << 20);
    assert!(
        check_io_pattern(&data) > 0,
        "no block holds the random writes"
    );

    // The same entry again finds the disk as it is; another size is refused in one
    // line and the disk is left alone.
    let other = format!(
        "{},size=16M,cache=host:16M",
        disk.to_str().unwrap().replace(',', ",,")
    );
    let err = env.fails(&["vm", "start", "io2", "--disk", &other, "--no-wait"]);
    assert!(err.contains("not the 16777216"), "{err}");
    assert_eq!(std::fs::read(&disk).unwrap(), data);
}

#[test]
fn a_full_backing_filesystem_fails_those_writes_and_nothing_else() {
    let env = Env::new();
    let fs = common::Tmpfs::mount(2);
    let disk = fs.0.path().join("user.img");
    std::fs::File::create(&disk)
        .unwrap()
        .set_len(16 << 20)
        .unwrap();
    start_on_backend(
        &env,
        "full1",
        "io",
        &[
            "--disk",
            disk.to_str().unwrap(),
            "--workload-arg",
            "io_target=/dev/vdb",
            "--workload-arg",
            "io_size=8M",
            "--no-wait",
        ],
    );
    // The fill runs out of space after about 2 MiB: the guest's write fails with an
    // I/O error, which the io workload reports.
    let err = common::eventually(
        std::time::Duration::from_secs(180),
        "the io workload's error",
        || {
            env.events("full1")
                .iter()
                .find(|e| e["kind"] == "agent_error")
                .map(|e| e["detail"].to_string())
        },
    );
    assert!(err.contains("Input/output error"), "{err}");
    let socket = env.run.path().join("full1@blk/disk1.sock");
    let pids = pids_naming(&socket);
    assert_eq!(pids.len(), 1, "the backend went away");
    // The guest lives on: its agent answers and its data disk (another backend) reads.
    let st = env.status("full1");
    assert_eq!(st["state"], "running", "{st}");
    let s = stats(&env, &env.run.path().join("full1@blk/disk1.ctl"));
    assert!(
        s["cache"]["written_bytes"].as_u64().unwrap() < 4 << 20,
        "{s}"
    );
    env.ok(&["vm", "stop", "full1"]);
    assert!(pids_naming(&socket).is_empty());
}

#[test]
fn a_restarted_daemon_keeps_the_backends_and_still_replaces_one_that_dies() {
    let env = Env::new();
    let img = rebound_image::open(env.home.path(), "default").unwrap();
    start_on_backend(&env, "d1", "web", &[]);
    let socket = env.run.path().join("d1@blk/disk0.sock");
    let before = pids_naming(&socket);
    env.kill_daemon();
    // The guest and its backend run on without a daemon; a new one adopts both.
    env.ok(&["vm", "list"]);
    assert_eq!(env.status("d1")["state"], "running");
    assert_eq!(pids_naming(&socket), before, "the backend did not survive");
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(before[0] as i32),
        nix::sys::signal::Signal::SIGKILL,
    )
    .unwrap();
    env.wait_event("d1", "disk_backend_restarted");
    let after = pids_naming(&socket);
    assert!(after.len() == 1 && after != before, "{after:?}");
    let port = env.host_port("d1", 8080);
    let (code, body) = http_get(port, "/blob-1m.bin").unwrap();
    assert_eq!(code, 200);
    assert!(body == ext4_file(&img.disk, "/blob-1m.bin").unwrap());
    env.ok(&["vm", "stop", "d1"]);
    assert!(pids_naming(&socket).is_empty());
}

#[test]
fn a_vm_on_the_backend_snapshots_its_raw_disk_and_comes_back_on_a_copy_the_backend_serves() {
    let env = Env::new();
    let img = rebound_image::open(env.home.path(), "default").unwrap();
    start_on_backend(&env, "s1", "web", &["--disk-cache", "16M"]);
    // QEMU migrates a vhost-user device only with the backend's dirty log
    // (LOG_SHMFD): the snapshot's device state save is a migration.
    let snap = env.home.path().join("snap");
    env.ok(&[
        "vm",
        "snapshot",
        "s1",
        "--out",
        snap.to_str().unwrap(),
        "--trace-s",
        "0",
    ]);
    let m: Value =
        serde_json::from_slice(&std::fs::read(snap.join("manifest.json")).unwrap()).unwrap();
    assert_eq!(m["disks"][0]["format"], "raw", "{m}");
    assert!(m["disks"][0]["file"].as_str().is_some());
    let verify = env.ok(&["snapshot", "verify", snap.to_str().unwrap()]);
    assert!(verify.contains("every checksum matches"), "{verify}");
    env.ok(&["vm", "stop", "s1"]);
    // The source VM's own disk is wiped: the restore must read the snapshot's copy.
    let own = env.home.path().join("vms/s1/disk0.img");
    let len = std::fs::metadata(&own).unwrap().len();
    let f = std::fs::OpenOptions::new().write(true).open(&own).unwrap();
    f.set_len(0).unwrap();
    f.set_len(len).unwrap();

    // The default (elastic) restore needs private RAM, which the backend cannot
    // reach: it is eager instead, and says so.
    let r = common::restore_json(&env, &[snap.to_str().unwrap(), "--name", "s2"]);
    assert_eq!(r["mode"], "eager", "{r}");
    assert!(r["notes"].to_string().contains("Rebound's backend"), "{r}");
    let disks = env.get_ok("GET", "/v1/vms/s2/disks", None);
    assert_eq!(disks[0]["backend"], "rebound", "{disks}");
    let copy = env.home.path().join("vms/s2/disk0.img");
    assert_eq!(disks[0]["file"], copy.to_str().unwrap(), "{disks}");
    let port = env.host_port("s2", 8080);
    let (code, body) = http_get(port, "/blob-1m.bin").unwrap();
    assert_eq!(code, 200);
    assert!(
        body == ext4_file(&img.disk, "/blob-1m.bin").unwrap(),
        "the restored guest served another blob"
    );
    let disks = env.get_ok("GET", "/v1/vms/s2/disks", None);
    let c = &disks[0]["stats"]["cache"];
    assert!(c["read_bytes"].as_u64().unwrap() >= 1 << 20, "{disks}");
    env.ok(&["vm", "stop", "s2"]);
    let verify = env.ok(&["snapshot", "verify", snap.to_str().unwrap()]);
    assert!(verify.contains("every checksum matches"), "{verify}");
}
