//! The daemon dies at the worst moments (`REBOUND_FAULT` makes it SIGKILL itself at
//! a named step) and the next daemon finds everything as a user expects: a crash
//! dump that is whole and never overwritten, no QEMU that `vm list` does not show,
//! and the disk of a stopped VM whose name a dying start or restore reused intact.

use crate::common;

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use common::{eventually, Env};
use serde_json::Value;

/// Restarts the daemon with the fault `step` armed; returns its pid.
fn arm(env: &mut Env, step: &str) -> u32 {
    env.kill_daemon();
    env.set_env("REBOUND_FAULT", step);
    env.ok(&["vm", "list"]);
    env.daemon_pid()
}

/// Waits for the armed daemon `pid` to have killed itself.
fn wait_dead(pid: u32, step: &str) {
    eventually(
        Duration::from_secs(120),
        &format!("the daemon to die at {step}"),
        || {
            let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
            let zombie = stat
                .rsplit(')')
                .next()
                .unwrap_or("")
                .trim_start()
                .starts_with('Z');
            (stat.is_empty() || zombie).then_some(())
        },
    );
}

/// Starts a daemon without the fault.
fn restart(env: &mut Env) {
    env.unset_env("REBOUND_FAULT");
    env.ok(&["vm", "list"]);
}

/// Waits for the armed daemon `pid` to have killed itself, then starts a plain one.
fn died(env: &mut Env, pid: u32, step: &str) {
    wait_dead(pid, step);
    restart(env);
}

/// Every QEMU running on this test's run dir is one `vm list` shows.
fn no_hidden_qemu(env: &Env) {
    let (_, vms) = env.call("GET", "/v1/vms", None).unwrap();
    let listed: Vec<u64> = vms
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|v| v["qemu_pid"].as_u64())
        .collect();
    let run = env.run.path().to_string_lossy().to_string();
    for e in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(pid) = e.file_name().to_string_lossy().parse::<u64>() else {
            continue;
        };
        let cmd = std::fs::read(e.path().join("cmdline")).unwrap_or_default();
        let cmd = String::from_utf8_lossy(&cmd);
        let qemu = cmd.starts_with("qemu-system") || cmd.contains("/qemu-system");
        if qemu && cmd.contains(&run) {
            assert!(
                listed.contains(&pid),
                "QEMU {pid} runs but vm list shows only {listed:?}: {vms}"
            );
        }
    }
}

fn osrelease(dump: &str, step: &str) -> String {
    let out = Command::new("crash")
        .args(["--osrelease", dump])
        .output()
        .expect("run crash (Debian package crash)");
    let rel = String::from_utf8_lossy(&out.stdout).trim().to_string();
    assert!(
        out.status.success() && rel.contains("amd64"),
        "{step}: crash --osrelease {dump}: {rel} {}",
        String::from_utf8_lossy(&out.stderr)
    );
    rel
}

#[test]
fn a_crash_dump_is_whole_and_kept_whatever_step_the_daemon_dies_at() {
    let mut env = Env::new();
    env.ok(&[
        "vm",
        "start",
        "c1",
        "--memory",
        "192M",
        "--on-crash",
        "dump-then-recover",
        "--filter",
        "zero,free",
    ]);
    let ready = "/v1/vms/c1/wait?for=ready&timeout_ms=120000";
    env.get_ok("POST", ready, None);
    let mut ids = Vec::new();
    for step in [
        "crash:before-rename",
        "crash:after-rename",
        "crash:after-report",
    ] {
        let daemon = arm(&mut env, step);
        env.get_ok("POST", ready, None);
        env.ok(&["vm", "crash", "c1"]);
        wait_dead(daemon, step);
        // What the dead daemon had renamed into place, if anything, is never
        // written again (read before a new daemon can touch it).
        let crashes = env.home.path().join("vms/c1/crashes");
        let mut dirs: Vec<_> = std::fs::read_dir(&crashes)
            .unwrap()
            .flatten()
            .map(|e| e.path())
            .collect();
        dirs.sort();
        let r: Value = serde_json::from_slice(
            &std::fs::read(dirs.last().unwrap().join("report.json")).unwrap(),
        )
        .unwrap();
        let dump = r["dump_path"].as_str().unwrap().to_string();
        let before = std::fs::read(&dump).ok();
        assert_eq!(
            before.is_some(),
            step != "crash:before-rename",
            "{step}: {r}"
        );
        restart(&mut env);

        let r = env.settled_crash_report("c1");
        assert_eq!(r["phase"], "done", "{step}: {r}");
        assert!(!ids.contains(&r["id"]), "{step}: a new crash: {r}");
        ids.push(r["id"].clone());
        if let Some(b) = &before {
            assert!(
                std::fs::read(&dump).unwrap() == *b,
                "{step}: the dump changed"
            );
        }
        osrelease(&dump, step);
        let text = env.ok(&["crash", "report", "c1"]);
        assert!(!text.contains("damaged"), "{step}: {text}");
        env.no_crash_leftovers(&dump, step);
        // The recovery VM serves again (and is the guest of the next step).
        env.get_ok("POST", ready, None);
        no_hidden_qemu(&env);
    }
}

#[test]
fn no_qemu_outlives_its_record_and_no_stopped_disk_is_lost() {
    let mut env = Env::new();
    // The guest writes io.bin on its disk (O_DIRECT, synced): a disk deleted and made
    // anew over the same base would lack it.
    env.ok(&[
        "vm",
        "start",
        "old",
        "--workload",
        "kv,io",
        "--memory",
        "192M",
        "--workload-arg",
        "io=seqwrite",
        "--workload-arg",
        "io_size=1M",
        "--workload-arg",
        "io_seconds=1",
    ]);
    env.get_ok("POST", "/v1/vms/old/wait?for=ready&timeout_ms=120000", None);
    eventually(Duration::from_secs(120), "the guest's disk write", || {
        env.events("old")
            .iter()
            .any(|e| e["kind"] == "io")
            .then_some(())
    });
    let snap = env.home.path().join("snap-old");
    let d = snap.to_str().unwrap().to_string();
    env.ok(&["vm", "snapshot", "old", "--out", &d, "--trace-s", "0"]);
    env.ok(&["vm", "stop", "old"]);
    let disk = env.home.path().join("vms/old/disk0.qcow2");
    guest_wrote(&disk, "after the stop");
    let bytes = std::fs::read(&disk).unwrap();
    let intact = |env: &Env, what: &str| {
        assert_eq!(env.status("old")["state"], "stopped", "{what}");
        assert!(
            std::fs::read(&disk).ok().as_ref() == Some(&bytes),
            "{what}: the stopped VM's disk changed"
        );
        no_hidden_qemu(env);
    };

    // A start and a restore over the stopped VM's name, the daemon killed at each
    // step: the stopped VM is back as it was, and no QEMU runs unseen.
    let start = ["vm", "start", "old", "--workload", "kv", "--memory", "192M"];
    let restore = ["vm", "restore", &d, "--name", "old", "--mode", "lazy"];
    for (step, cmd) in [
        ("start:spawned", &start[..]),
        ("start:recorded", &start[..]),
        ("restore:spawned", &restore[..]),
        ("restore:recorded", &restore[..]),
        ("restore:loading", &restore[..]),
    ] {
        let daemon = arm(&mut env, step);
        let o = env.rebound(cmd);
        assert!(!o.status.success(), "{step}: the start answered");
        died(&mut env, daemon, step);
        intact(&env, step);
    }
    // A restore that fails by itself over that name leaves it too.
    let bad = env.home.path().join("snap-bad");
    let st = Command::new("cp")
        .args(["-a", &d])
        .arg(&bad)
        .status()
        .unwrap();
    assert!(st.success());
    // Made on another machine type: found out once its QEMU is up.
    let manifest = bad.join("manifest.json");
    let mut m: Value = serde_json::from_slice(&std::fs::read(&manifest).unwrap()).unwrap();
    m["machine"] = "pc-i440fx-2.0".into();
    std::fs::write(&manifest, serde_json::to_vec_pretty(&m).unwrap()).unwrap();
    env.fails(&["vm", "restore", bad.to_str().unwrap(), "--name", "old"]);
    intact(&env, "a failed restore");

    // Settling onto shared RAM (the page cache's lazy restore) starts a second QEMU:
    // killed with the daemon before the record names it, it does not run on unseen;
    // ports handed to it come back.
    for (name, step) in [
        ("s1", "settle:spawned"),
        ("s3", "settle:ports"),
        ("s2", "settle:migrated"),
    ] {
        let daemon = arm(&mut env, step);
        // The settle begins once the watch window is over, which may be before the
        // CLI has its answer: whether it does is not the point.
        let _ = env.rebound(&[
            "vm",
            "restore",
            &d,
            "--name",
            name,
            "--mode",
            "lazy",
            "--path",
            "page-cache",
            "--watch-s",
            "1",
        ]);
        died(&mut env, daemon, step);
        no_hidden_qemu(&env);
        assert!(!env.run.path().join(name).join("settle").exists(), "{step}");
        let st = env.status(name);
        match step {
            // The restored QEMU still holds the guest, which answers on its port.
            "settle:spawned" | "settle:ports" => {
                assert_eq!(st["state"], "running", "{step}: {st}");
                let port = env.host_port(name, 7070);
                assert_eq!(common::kv(port, "GET nothing").unwrap(), "NOTFOUND");
            }
            // The guest had moved into the QEMU nobody recorded: it is stopped,
            // not left running where nothing shows it.
            _ => assert_eq!(st["state"], "stopped", "{step}: {st}"),
        }
    }

    // A cluster restore's host daemon dies while it holds the VM it loaded: after
    // the restart the held QEMU is either listed or gone.
    env.kill_daemon();
    env.set_env("REBOUND_FAULT", "cohort:held");
    let mut cohort = env.spawn_daemon(&["--host", "t1"]);
    let plan = serde_json::json!({"plan": {"restore_id": "dies", "vms": [
        {"vm": "held", "host": "t1", "ws_pages": 0,
         "args": {"dir": d, "mode": "lazy"}}]}});
    // The daemon coordinates its own restore (its in-memory store): the call ends
    // with it.
    let _ = env.call("POST", "/v1/cluster/restore", Some(&plan));
    died(&mut env, cohort.id(), "cohort:held");
    let _ = cohort.wait();
    let log = std::fs::read_to_string(env.home.path().join("daemon-fg.log")).unwrap();
    assert!(
        log.contains("REBOUND_FAULT=cohort:held: killing the daemon"),
        "the cohort died elsewhere:\n{log}"
    );
    no_hidden_qemu(&env);
    intact(&env, "the end");
    guest_wrote(&disk, "at the end");
}

/// The stopped VM's disk holds the guest's io.bin: 1 MiB of 4 KiB blocks, each
/// `splitmix64(offset / 8 + j) ^ version` (guest/agent/wl_io.c).
fn guest_wrote(disk: &Path, what: &str) {
    let t = tempfile::tempdir().unwrap();
    let raw = t.path().join("disk.raw");
    let st = Command::new("qemu-img")
        .args(["convert", "-O", "raw"])
        .arg(disk)
        .arg(&raw)
        .status()
        .expect("run qemu-img");
    assert!(st.success(), "{what}: qemu-img convert {}", disk.display());
    let io = common::ext4_file(&raw, "/io.bin").unwrap();
    assert_eq!(io.len(), 1 << 20, "{what}");
    for (b, block) in io.chunks(4096).enumerate() {
        let word = |j: usize| u64::from_le_bytes(block[j * 8..j * 8 + 8].try_into().unwrap());
        let k = (b * 512) as u64;
        let version = word(0) ^ rebound_image::splitmix64(k);
        assert!(
            version < 16
                && (0..512).all(|j| word(j) == rebound_image::splitmix64(k + j as u64) ^ version),
            "{what}: block {b} of io.bin is not what the guest wrote"
        );
    }
}

/// A snapshot of a kv guest holding k0..k19 (its VM killed after it).
fn kv_snapshot(env: &Env) -> std::path::PathBuf {
    env.ok(&["vm", "start", "kv", "--workload", "kv", "--memory", "192M"]);
    let port = env.host_port("kv", 7070);
    for i in 0..20 {
        assert_eq!(common::kv(port, &format!("SET k{i} v{i}")).unwrap(), "OK");
    }
    let dir = env.home.path().join("snap-kv");
    env.ok(&[
        "vm",
        "snapshot",
        "kv",
        "--out",
        dir.to_str().unwrap(),
        "--trace-s",
        "2",
    ]);
    env.ok(&["vm", "kill", "kv"]);
    dir
}

/// A restore held paused for its start (as a cluster restore holds its VMs) outlives
/// its daemon, on either path: the next daemon re-attaches it still paused in the
/// same QEMU, takes its restore report back, has its memory whole (on the page
/// cache reading the rest of the image again if the old daemon had not finished; on
/// the page server following the server, which outlives the daemon, to its end),
/// and starts it on `vm resume` with every key it held.
#[test]
fn a_held_restore_outlives_its_daemon_and_starts_with_what_it_held() {
    let env = Env::new();
    let dir = kv_snapshot(&env);
    let d = dir.to_str().unwrap();
    for path in ["page-cache", "page-server"] {
        let name = format!("held-{path}");
        let held = common::restore_json(
            &env,
            &[
                d, "--name", &name, "--mode", "elastic", "--paused", "--path", path,
            ],
        );
        assert_eq!(held["phase"], "held", "{held}");
        assert_eq!(held["path"], path, "{held}");
        let qemu = env.status(&name)["qemu_pid"].clone();

        env.kill_daemon();
        // The next command starts a daemon, which re-attaches the VM.
        env.ok(&["vm", "list"]);
        let st = env.status(&name);
        assert_eq!(st["state"], "paused", "{path}: {st}");
        assert_eq!(st["qemu_pid"], qemu, "{path}: {st}");
        let report = format!("/v1/vms/{name}/restore");
        let rep = eventually(
            Duration::from_secs(60),
            "the held restore's memory to be whole after the restart",
            || {
                let (_, r) = env.call("GET", &report, None).ok()?;
                r["memory_loaded_s"].as_f64().map(|_| r)
            },
        );
        assert_eq!(rep["phase"], "held", "{path}: {rep}");
        assert!(rep["background_error"].is_null(), "{path}: {rep}");
        assert!(rep["error"].is_null(), "{path}: {rep}");

        env.ok(&["vm", "resume", &name]);
        let ph = env.host_port(&name, 7070);
        for i in 0..20 {
            assert_eq!(
                common::kv(ph, &format!("GET k{i}")).unwrap(),
                format!("VALUE v{i}"),
                "{path}"
            );
        }
        let (_, rep) = env.call("GET", &report, None).unwrap();
        assert_eq!(rep["phase"], "done", "{path}: {rep}");
        assert!(rep["started_unix_ns"].as_i64().is_some(), "{path}: {rep}");
        let resumed = env
            .events(&name)
            .into_iter()
            .filter(|e| e["kind"] == "resumed")
            .count();
        assert_eq!(resumed, 1, "{path}");
        env.ok(&["vm", "kill", &name]);
    }
}

/// A lazy restore on the page server whose daemon dies while the guest runs on
/// pages it requests one by one: the server serves on, the next daemon re-attaches
/// the running guest and follows the server to its end (the report's memory in
/// place, the requests saved as the snapshot's trace), and the guest has every key.
#[test]
fn a_page_server_restore_outlives_its_daemon_while_the_guest_runs() {
    let env = Env::new();
    let dir = kv_snapshot(&env);
    let d = dir.to_str().unwrap();
    // Nothing is pushed for the watch's 20 s: the guest's pages come on request.
    // The command waits for the server's end, so it runs beside the test.
    let mut restore = env.spawn_quiet(&[
        "vm",
        "restore",
        d,
        "--name",
        "lz",
        "--mode",
        "lazy",
        "--path",
        "page-server",
        "--watch-s",
        "20",
    ]);
    let ph = eventually(
        Duration::from_secs(60),
        "the restored guest to answer",
        || {
            let (_, r) = env.call("GET", "/v1/vms/lz/restore", None).ok()?;
            (r["phase"] == "watching").then_some(())?;
            let p = env.host_port("lz", 7070);
            (common::kv(p, "GET k0").ok()? == "VALUE v0").then_some(p)
        },
    );
    let (_, r) = env.call("GET", "/v1/vms/lz/restore", None).unwrap();
    assert_eq!(r["path"], "page-server", "{r}");
    assert!(
        r["memory_loaded_s"].is_null(),
        "the server ended already: {r}"
    );
    let qemu = env.status("lz")["qemu_pid"].clone();

    env.kill_daemon();
    let _ = restore.wait();
    env.ok(&["vm", "list"]);
    let st = env.status("lz");
    assert_eq!(st["state"], "running", "{st}");
    assert_eq!(st["qemu_pid"], qemu, "{st}");
    assert_eq!(env.host_port("lz", 7070), ph);
    for i in 0..20 {
        assert_eq!(
            common::kv(ph, &format!("GET k{i}")).unwrap(),
            format!("VALUE v{i}")
        );
    }
    let rep = eventually(
        Duration::from_secs(90),
        "the page server's end, followed after the restart",
        || {
            let (_, r) = env.call("GET", "/v1/vms/lz/restore", None).ok()?;
            r["memory_loaded_s"].as_f64().map(|_| r)
        },
    );
    assert!(rep["error"].is_null(), "{rep}");
    assert!(
        rep["notes"]
            .as_array()
            .unwrap()
            .iter()
            .any(|n| n.as_str().unwrap().contains("followed its page server")),
        "{rep}"
    );
    assert_eq!(rep["trace_recorded"], true, "{rep}");
    let m: Value =
        serde_json::from_slice(&std::fs::read(dir.join("manifest.json")).unwrap()).unwrap();
    assert_eq!(m["trace"]["source"], "requests", "{m}");
    assert_eq!(env.status("lz")["state"], "running");
    assert_eq!(common::kv(ph, "GET k7").unwrap(), "VALUE v7");
}
