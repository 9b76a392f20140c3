//! A guest that panics comes back by its crash policy: a recovery VM on the same disk
//! copy serves on the same host port, the dump is a file `crash` reads, the memory
//! handed over never exceeds the host budget, and the report says what happened.

use crate::common;

use std::process::Command;
use std::time::Duration;

use common::{eventually, http_get, kv, Env};
use serde_json::Value;

fn start(env: &Env, name: &str, extra: &[&str]) -> Value {
    let mut args = vec!["vm", "start", name, "--workload", "web", "--json"];
    args.extend_from_slice(extra);
    serde_json::from_str(&env.ok(&args)).unwrap()
}

/// Crashes the guest and waits until the service is back; returns its host port.
fn crash_until_recovered(env: &Env, name: &str) -> u16 {
    let port = env.host_port(name, 8080);
    env.ok(&["vm", "crash", name]);
    env.wait_event(name, "recovered");
    assert_eq!(http_get(port, "/").unwrap().0, 200);
    port
}

/// The guest kernel's log, as makedumpfile reads it out of a dump.
fn dmesg(env: &Env, dump: &str) -> String {
    let out_file = env.home.path().join("dmesg.txt");
    let _ = std::fs::remove_file(&out_file);
    let out = Command::new("makedumpfile")
        .args(["--dump-dmesg", dump, out_file.to_str().unwrap()])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "makedumpfile --dump-dmesg: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    std::fs::read_to_string(&out_file).unwrap()
}

#[test]
fn recover_brings_the_service_back_on_the_same_port() {
    let env = Env::new();
    let st = start(&env, "r1", &["--memory", "192M", "--on-crash", "recover"]);
    let port = env.host_port("r1", 8080);
    let first_pid = st["qemu_pid"].as_u64().unwrap();
    assert_eq!(http_get(port, "/").unwrap().0, 200);

    env.ok(&["vm", "crash", "r1"]);
    env.wait_event("r1", "recovered");
    let st = env.get_ok("POST", "/v1/vms/r1/wait?for=ready&timeout_ms=120000", None);
    assert_eq!(st["state"], "running");
    assert_ne!(st["qemu_pid"].as_u64().unwrap(), first_pid);
    assert_eq!(env.host_port("r1", 8080), port, "the service moved");
    assert_eq!(http_get(port, "/").unwrap().0, 200);

    let r = env.settled_crash_report("r1");
    assert_eq!(r["phase"], "done", "{r}");
    assert_eq!(r["cause"], "panic");
    assert!(r["downtime_s"].as_f64().unwrap() > 0.0);
    assert_eq!(r["dump_path"], Value::Null);
    let kinds = env.event_kinds("r1");
    for k in [
        "panicked",
        "crash_handling",
        "recovery_started",
        "recovered",
    ] {
        assert!(kinds.contains(&k.to_string()), "{k} missing: {kinds:?}");
    }
    // Both QEMUs used the VM's one disk copy.
    let disks: Vec<String> = env
        .events("r1")
        .iter()
        .filter(|e| e["kind"] == "started")
        .map(|e| {
            let argv = e["detail"]["argv"].as_array().unwrap();
            argv.iter()
                .filter_map(|a| a.as_str())
                .find(|a| a.contains("disk0.qcow2"))
                .unwrap()
                .to_string()
        })
        .collect();
    assert_eq!(disks.len(), 2);
    assert_eq!(disks[0], disks[1]);
    // The crashed RAM is gone: nothing kept it.
    let left: Vec<_> = std::fs::read_dir(env.run.path())
        .unwrap()
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().contains("@crash-"))
        .collect();
    assert!(left.is_empty(), "{left:?}");
}

#[test]
fn dump_and_recover_within_a_memory_budget() {
    let env = Env::new();
    // 256 MiB guest with 64 MiB of anonymous memory in use, a budget that does not
    // hold both VMs whole: the recovery VM must start small and grow as the dump
    // gives memory back.
    start(
        &env,
        "d1",
        &[
            "--memory",
            "256M",
            "--on-crash",
            "dump-and-recover",
            "--chunk",
            "32M",
            "--min-memory",
            "128M",
            "--host-memory-budget",
            "320M",
            "--filter",
            "zero,free,cache,user",
        ],
    );
    crash_until_recovered(&env, "d1");
    // The recovery QEMU runs in the VM's memory group, which the kernel holds to the
    // budget (plus that QEMU's own footprint) while the crash is handled.
    let pid = env.status("d1")["qemu_pid"].as_u64().unwrap();
    let cg = std::fs::read_to_string(format!("/proc/{pid}/cgroup")).unwrap();
    let line = cg
        .lines()
        .find(|l| l.contains("memory") || l.starts_with("0::"))
        .unwrap();
    assert!(
        line.contains("/rebound/state-") && line.contains("/d1/qemu-"),
        "{cg}"
    );
    env.get_ok("POST", "/v1/vms/d1/wait?for=ready&timeout_ms=180000", None);

    let r = env.settled_crash_report("d1");
    let m = &r["memory_limit"];
    assert!(
        m["enforced_by"].as_str().unwrap().starts_with("cgroup"),
        "the budget was not enforced: {m}"
    );
    assert_eq!(m["budget_bytes"].as_u64().unwrap(), 320 << 20);
    let limit = m["limit_bytes"].as_u64().unwrap();
    let peak = m["peak_bytes"].as_u64().unwrap();
    assert!(peak > 128 << 20 && peak <= limit, "{m}");
    for s in r["timeline"].as_array().unwrap() {
        assert!(s["charged_bytes"].as_u64().unwrap() <= limit, "{s}");
    }
    // Lifted once the crash is handled.
    let group = std::path::Path::new(m["group"].as_str().unwrap());
    let now = ["memory.limit_in_bytes", "memory.max"]
        .iter()
        .find_map(|f| std::fs::read_to_string(group.join(f)).ok())
        .unwrap();
    assert!(
        now.trim() == "max" || now.trim().parse::<u64>().unwrap() > 1 << 50,
        "still limited: {now}"
    );
    assert_eq!(r["phase"], "done", "{r}");
    let dump = r["dump_path"].as_str().unwrap();
    assert!(std::fs::metadata(dump).unwrap().len() > 0);
    assert!(!std::path::Path::new(&format!("{dump}.partial")).exists());
    // The standard tool reads it.
    let out = Command::new("crash")
        .args(["--osrelease", dump])
        .output()
        .unwrap();
    let rel = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success() && rel.trim().contains("amd64"),
        "crash --osrelease: {rel}"
    );
    // The classes were left out and counted, from the guest's own struct pages.
    for class in ["zero", "free"] {
        assert!(
            r["pages_skipped"][class].as_u64().unwrap_or(0) > 0,
            "{class}: {r}"
        );
    }
    // Nothing went wrong to note; what the default I/O policy (auto) did is said.
    let notes = r["notes"].as_array().unwrap();
    assert!(
        notes.len() == 1
            && notes[0]
                .as_str()
                .unwrap()
                .starts_with("I/O policy auto chose "),
        "{r}"
    );
    // The evidence is there: makedumpfile reads the panic out of the kernel's log.
    let log = dmesg(&env, dump);
    assert!(
        log.contains("sysrq") && log.contains("Kernel panic"),
        "{}",
        &log[log.len().saturating_sub(2000)..]
    );

    // Host memory held by both VMs never exceeded the budget.
    let budget = 320u64 << 20;
    let timeline = r["timeline"].as_array().unwrap();
    assert!(timeline.len() >= 3, "{r}");
    for s in timeline {
        let held = s["crashed_bytes"].as_u64().unwrap() + s["recovery_bytes"].as_u64().unwrap();
        assert!(held <= budget + (1 << 20), "over the budget: {s}");
    }
    // The recovery VM started below the guest's size and grew to it.
    let rec: Vec<u64> = timeline
        .iter()
        .map(|s| s["recovery_bytes"].as_u64().unwrap())
        .filter(|b| *b > 0)
        .collect();
    assert!(rec[0] < 256 << 20, "{rec:?}");
    assert_eq!(*rec.last().unwrap(), 256 << 20, "{rec:?}");
    let kinds = env.event_kinds("d1");
    for k in [
        "dump_started",
        "chunk_reclaimed",
        "dump_finished",
        "recovered",
    ] {
        assert!(kinds.contains(&k.to_string()), "{k} missing: {kinds:?}");
    }
    // The guest sees the plugged memory.
    let st = env.status("d1");
    assert_eq!(st["state"], "running");

    // The report, as a user reads it, and its figure.
    let svg = env.home.path().join("d1.svg");
    let text = env.ok(&["crash", "report", "d1", "--plot", svg.to_str().unwrap()]);
    assert!(text.contains("downtime"), "{text}");
    let fig = std::fs::read_to_string(&svg).unwrap();
    assert!(
        fig.starts_with("<svg") && fig.contains("recovery VM"),
        "{}",
        &fig[..200.min(fig.len())]
    );
    let list = env.ok(&["crash", "list"]);
    assert!(list.contains("dump-and-recover"), "{list}");

    // A dump damaged afterwards: the report says so.
    let f = std::fs::OpenOptions::new().write(true).open(dump).unwrap();
    f.set_len(std::fs::metadata(dump).unwrap().len() / 2)
        .unwrap();
    let text = env.ok(&["crash", "report", "d1"]);
    assert!(text.contains("is damaged now"), "{text}");
}

#[test]
fn two_crashes_at_once_and_a_recovery_vm_that_crashes_too() {
    let env = Env::new();
    for n in ["a1", "a2"] {
        start(&env, n, &["--memory", "128M", "--on-crash", "recover"]);
    }
    // Both at once.
    for n in ["a1", "a2"] {
        env.get_ok("POST", &format!("/v1/vms/{n}/crash"), None);
    }
    for n in ["a1", "a2"] {
        env.wait_event(n, "recovered");
        assert_eq!(http_get(env.host_port(n, 8080), "/").unwrap().0, 200);
    }
    // The recovery VM gets the same policy.
    env.get_ok("POST", "/v1/vms/a1/crash", None);
    eventually(Duration::from_secs(180), "a second recovery", || {
        let n = env
            .event_kinds("a1")
            .iter()
            .filter(|k| *k == "recovered")
            .count();
        (n == 2).then_some(())
    });
    let crashes = env.get_ok("GET", "/v1/vms/a1/crashes", None);
    assert_eq!(crashes.as_array().unwrap().len(), 2, "{crashes}");
    assert!(crashes
        .as_array()
        .unwrap()
        .iter()
        .all(|r| r["phase"] == "done"));
    assert_eq!(http_get(env.host_port("a1", 8080), "/").unwrap().0, 200);
}

#[test]
fn a_full_dump_disk_loses_nothing_and_the_service_still_comes_back() {
    assert!(
        nix::unistd::geteuid().is_root(),
        "this test mounts a small tmpfs and must run as root (as `make test` does)"
    );
    let env = Env::new();
    let full = tempfile::tempdir().unwrap();
    let st = Command::new("mount")
        .args(["-t", "tmpfs", "-o", "size=8m,mode=0700", "tmpfs"])
        .arg(full.path())
        .status()
        .unwrap();
    assert!(st.success(), "mount tmpfs");
    struct Umount(std::path::PathBuf);
    impl Drop for Umount {
        fn drop(&mut self) {
            let _ = Command::new("umount").arg(&self.0).status();
        }
    }
    let _u = Umount(full.path().to_path_buf());
    start(
        &env,
        "f1",
        &[
            "--memory",
            "192M",
            "--on-crash",
            "dump-and-recover",
            "--chunk",
            "16M",
            "--dump-dir",
            full.path().to_str().unwrap(),
        ],
    );
    let port = env.host_port("f1", 8080);
    env.ok(&["vm", "crash", "f1"]);
    let r = env.settled_crash_report("f1");
    assert_eq!(r["phase"], "failed", "{r}");
    let notes = r["notes"].to_string();
    assert!(
        notes.contains("dump failed") && notes.contains("No space left"),
        "{r}"
    );
    // Nothing looks complete, and what was not dumped is still held.
    let dump = r["dump_path"].as_str().unwrap();
    assert!(
        !std::path::Path::new(dump).exists(),
        "{dump} looks complete"
    );
    let kept: Vec<_> = std::fs::read_dir(env.run.path())
        .unwrap()
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().contains("@crash-"))
        .collect();
    assert_eq!(kept.len(), 1, "the crashed memory was dropped");
    use std::os::unix::fs::MetadataExt;
    assert!(kept[0].metadata().unwrap().blocks() > 0);
    // The service came back all the same.
    env.wait_event("f1", "recovered");
    assert_eq!(http_get(port, "/").unwrap().0, 200);
}

#[test]
fn a_recovery_vm_that_cannot_start_is_reported_and_the_dump_still_finishes() {
    let env = Env::new();
    start(
        &env,
        "b1",
        &[
            "--memory",
            "192M",
            "--on-crash",
            "dump-then-recover",
            "--chunk",
            "16M",
            "--io-policy",
            "20:100",
        ],
    );
    let port = env.host_port("b1", 8080);
    env.ok(&["vm", "crash", "b1"]);
    env.wait_event("b1", "dump_started");
    // While the dump runs, another program takes the service's host port (the
    // crashed QEMU let it go): the recovery VM cannot forward it and QEMU refuses to
    // start.
    let squatter = std::net::TcpListener::bind(("127.0.0.1", port)).unwrap();
    let r = env.settled_crash_report("b1");
    assert_eq!(r["phase"], "failed", "{r}");
    let notes = r["notes"].to_string();
    assert!(
        notes.contains("the recovery VM failed to start") && notes.contains("forward"),
        "{r}"
    );
    // The evidence is whole all the same.
    let dump = r["dump_path"].as_str().unwrap();
    assert!(r["dump_bytes"].as_u64().unwrap() > 0, "{r}");
    let info = env.ok(&["crash", "report", "b1"]);
    assert!(!info.contains("damaged"), "{info}");
    assert!(dmesg(&env, dump).contains("Kernel panic"));
    assert_eq!(env.status("b1")["state"], "stopped");
    drop(squatter);
    // The operator can start the VM again once the port is free.
    env.ok(&["vm", "start", "b1", "--workload", "web", "--memory", "192M"]);
    assert_eq!(http_get(env.host_port("b1", 8080), "/").unwrap().0, 200);
}

#[test]
fn auto_io_policy_holds_the_dump_while_the_recovery_vm_boots() {
    let env = Env::new();
    let policy = ["--memory", "192M", "--on-crash", "dump-and-recover"];
    // A disk-bound service: it reads 256 MiB of its data disk before it is ready.
    let mut bound = policy.to_vec();
    bound.extend(["--disk-io", "256M"]);
    start(&env, "io1", &bound);
    // `auto` is the default: no --io-policy.
    start(&env, "io2", &policy);
    // Whether the budget starts the recovery VM short of memory does not change the
    // choice: rebound-crash's unit tests cover that without a guest.
    for name in ["io1", "io2"] {
        crash_until_recovered(&env, name);
        let r = env.settled_crash_report(name);
        assert_eq!(r["phase"], "done", "{r}");
        let recovery_s = r["recovery_s"].as_f64().unwrap();
        // The disk-bound service is held for without bound; the other for at most
        // 10 s, after which the dump goes first (a loaded host may boot it slower).
        let (chose, why) = match name {
            "io1" => ("recovery-first", "disks moved"),
            _ if recovery_s < 10.0 => ("recovery-first", "service answered"),
            _ => ("dump-first", "not ready 10 s after it started"),
        };
        assert_eq!(r["io_policy"], format!("auto: {chose}"), "{r}");
        let notes = r["notes"].to_string();
        assert!(
            notes.contains(&format!("I/O policy auto chose {chose}")) && notes.contains(why),
            "{r}"
        );
    }
}

#[test]
fn the_service_answers_while_a_rate_limited_dump_still_runs() {
    let env = Env::new();
    // The dump is held to 5 MB/s, as on a slow disk: the recovery VM must serve
    // long before the dump ends (at 10 MB/s a loaded 2-vCPU TCG host once booted
    // the recovery VM in about as long as the dump took).
    start(
        &env,
        "s1",
        &[
            "--memory",
            "256M",
            "--on-crash",
            "dump-and-recover",
            "--chunk",
            "16M",
            "--io-policy",
            "5:50",
        ],
    );
    crash_until_recovered(&env, "s1");
    let kinds = env.event_kinds("s1");
    assert!(
        !kinds.contains(&"dump_finished".to_string()),
        "the dump ended before the service came back: {kinds:?}"
    );
    assert_eq!(env.status("s1")["job"], "dump");
    let r = env.settled_crash_report("s1");
    assert_eq!(r["phase"], "done", "{r}");
    // The rate held: the dump took at least its bytes at 5 MB/s (less one chunk,
    // which goes out before the first wait).
    let bytes = r["dump_io_bytes"].as_u64().unwrap();
    assert!(bytes > 32 << 20, "{r}");
    let floor = bytes.saturating_sub(16 << 20) as f64 / 5e6;
    assert!(r["dump_s"].as_f64().unwrap() >= floor * 0.95, "{r}");
    assert!(
        r["downtime_s"].as_f64().unwrap() < r["dump_s"].as_f64().unwrap(),
        "{r}"
    );
    assert_eq!(r["io_policy"], "5:50");
}

#[test]
fn a_daemon_killed_mid_dump_finishes_it_after_a_restart() {
    let env = Env::new();
    start(
        &env,
        "k1",
        &[
            "--memory",
            "256M",
            "--on-crash",
            "dump-then-recover",
            "--chunk",
            "8M",
            "--io-policy",
            "8:100",
        ],
    );
    let port = env.host_port("k1", 8080);
    let daemon = env.daemon_pid();
    env.ok(&["vm", "crash", "k1"]);
    // Killed after some memory was dumped and punched out of the RAM file.
    eventually(Duration::from_secs(60), "two chunks dumped", || {
        let n = env
            .events("k1")
            .iter()
            .filter(|e| e["kind"] == "chunk_reclaimed")
            .count();
        (n >= 2).then_some(())
    });
    let r = env.get_ok("GET", "/v1/vms/k1/crashes/latest", None);
    let dump = r["dump_path"].as_str().unwrap().to_string();
    common::sigkill_and_wait(daemon);
    assert!(
        std::path::Path::new(&format!("{dump}.partial")).exists(),
        "{dump}"
    );

    // A new daemon (the CLI starts it) finishes the dump, then recovers.
    env.ok(&["vm", "list"]);
    let r = env.settled_crash_report("k1");
    assert_eq!(r["phase"], "done", "{r}");
    assert!(r["notes"].to_string().contains("resumed the dump"), "{r}");
    env.wait_event("k1", "recovered");
    assert_eq!(http_get(port, "/").unwrap().0, 200);
    // The dump is whole: complete by our reader, and the tools read the panic out
    // of the kernel's log, whichever daemon wrote its pages.
    let text = env.ok(&["crash", "report", "k1"]);
    assert!(!text.contains("damaged"), "{text}");
    let log = dmesg(&env, &dump);
    assert!(
        log.contains("Kernel panic"),
        "{}",
        &log[log.len().saturating_sub(2000)..]
    );
    let filtered = env.home.path().join("k1-d31");
    let out = Command::new("makedumpfile")
        .args(["-d", "31", "-c", &dump, filtered.to_str().unwrap()])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "makedumpfile -d 31: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    env.no_crash_leftovers(&dump, "the resumed dump");
}

#[test]
fn without_vmcoreinfo_the_dump_is_whole_and_says_so() {
    let env = Env::new();
    let st = start(
        &env,
        "v1",
        &[
            "--memory",
            "192M",
            "--on-crash",
            "dump-and-recover",
            "--filter",
            "zero,free",
        ],
    );
    // Wipe the guest's VMCOREINFO note in its RAM (a damaged kernel): the kernel
    // does not need it to run, the dump needs it to classify pages.
    let paddr = st["vmcoreinfo_paddr"]
        .as_u64()
        .expect("the agent reported VMCOREINFO");
    {
        use std::os::unix::fs::FileExt;
        let ram = std::fs::OpenOptions::new()
            .write(true)
            .open(st["ram_file"].as_str().unwrap())
            .unwrap();
        ram.write_all_at(&[0u8; 4096], paddr).unwrap();
    }
    crash_until_recovered(&env, "v1");
    let r = env.settled_crash_report("v1");
    assert_eq!(r["phase"], "done", "{r}");
    let notes = r["notes"].to_string();
    assert!(
        notes.contains("VMCOREINFO not found") && notes.contains("unfiltered"),
        "{r}"
    );
    assert_eq!(r["pages_skipped"], serde_json::json!({}), "{r}");
    // Whole: every page of the guest's RAM is in the dump.
    assert_eq!(
        r["pages_written"].as_u64().unwrap(),
        (192u64 << 20) / 4096,
        "{r}"
    );
}

#[test]
fn a_recovery_vm_restored_from_a_post_boot_snapshot_serves_its_state() {
    let env = Env::new();
    // The post-boot snapshot: a kv guest with ten keys, traced for its working set.
    env.ok(&["vm", "start", "tpl", "--workload", "kv", "--memory", "256M"]);
    let tport = env.host_port("tpl", 7070);
    for i in 0..10 {
        assert_eq!(kv(tport, &format!("SET k{i} v{i}")).unwrap(), "OK");
    }
    let snap = env.home.path().join("post-boot");
    let s = snap.to_str().unwrap();
    env.ok(&["vm", "snapshot", "tpl", "--out", s, "--trace-s", "2"]);
    env.ok(&["vm", "stop", "tpl"]);

    // A policy that cannot use the snapshot is refused at start, in one line.
    for (workload, memory, on_crash, want) in [
        ("kv", "192M", "recover", "memory 256 MiB, this VM 192 MiB"),
        ("web", "256M", "recover", "workload kv, this VM web"),
        ("kv", "256M", "dump", "--recover-from needs --on-crash"),
        ("kv", "256M", "recover", "No such file"),
    ] {
        let dir = if want == "No such file" {
            format!("{s}-missing")
        } else {
            s.to_string()
        };
        let e = env.fails(&[
            "vm",
            "start",
            "bad",
            "--workload",
            workload,
            "--memory",
            memory,
            "--on-crash",
            on_crash,
            "--recover-from",
            &dir,
        ]);
        assert!(e.contains(want), "{e}");
        assert!(e.contains("--recover-from"), "{e}");
    }

    // The production VM, its dump held to 5 MB/s so the restored VM serves while the
    // dump still runs.
    env.ok(&[
        "vm",
        "start",
        "kr",
        "--workload",
        "kv",
        "--memory",
        "256M",
        "--on-crash",
        "dump-and-recover",
        "--recover-from",
        s,
        "--chunk",
        "16M",
        "--io-policy",
        "5:50",
    ]);
    let port = env.host_port("kr", 7070);
    assert_eq!(kv(port, "SET lost yes").unwrap(), "OK");
    env.ok(&["vm", "crash", "kr"]);
    env.wait_event("kr", "recovered");
    assert_eq!(env.host_port("kr", 7070), port, "the service moved");
    // It serves the snapshot's state: its keys, not what the crashed guest wrote later.
    for i in 0..10 {
        assert_eq!(
            kv(port, &format!("GET k{i}")).unwrap(),
            format!("VALUE v{i}")
        );
    }
    assert_eq!(kv(port, "GET lost").unwrap(), "NOTFOUND");
    assert_eq!(kv(port, "COUNT").unwrap(), "COUNT 10");
    let restore = env.get_ok("GET", "/v1/vms/kr/restore", None);
    assert_eq!(restore["mode"], "elastic", "{restore}");
    assert!(
        restore["pages_loaded_before_start"].as_u64().unwrap() > 0,
        "{restore}"
    );

    let r = env.settled_crash_report("kr");
    assert_eq!(r["phase"], "done", "{r}");
    assert_eq!(r["recovered_from"], s, "{r}");
    assert!(
        r["downtime_s"].as_f64().unwrap() < r["dump_s"].as_f64().unwrap(),
        "{r}"
    );
    // The crashed guest's disk is kept with the crash, a disk qemu-img reads.
    let kept = env
        .home
        .path()
        .join("vms/kr/crashes")
        .join(r["id"].as_str().unwrap())
        .join("disk0.qcow2");
    let info = Command::new("qemu-img")
        .args(["info", "--output=json", kept.to_str().unwrap()])
        .output()
        .unwrap();
    assert!(
        info.status.success(),
        "{}",
        String::from_utf8_lossy(&info.stderr)
    );
    // The rest of the image was loaded only after the dump gave the memory back;
    // then the guest moved onto shared RAM, where a later crash can dump it.
    env.wait_event("kr", "settled");
    let kinds = env.event_kinds("kr");
    let at = |k: &str| kinds.iter().position(|x| x == k).unwrap();
    assert!(at("dump_finished") < at("settled"), "{kinds:?}");
    assert_eq!(kv(port, "GET k9").unwrap(), "VALUE v9");
    let st = env.status("kr");
    assert_eq!(st["state"], "running", "{st}");
}
