//! A guest from the user's own kernel, initrd and disk, without our agent link:
//! readiness comes from an HTTP probe through a forwarded port, then from a serial
//! regex.

use crate::common;

use common::{ext4_file, http_get, Env};
use serde_json::Value;

#[test]
fn user_kernel_ready_by_http_and_serial() {
    let env = Env::new();
    let img = rebound_image::open(env.home.path(), "default").unwrap();
    // The user's disk: a private copy of the image's data disk.
    let disk = env.home.path().join("my-data.ext4");
    let st = std::process::Command::new("cp")
        .args(["--sparse=always"])
        .arg(&img.disk)
        .arg(&disk)
        .status()
        .unwrap();
    assert!(st.success());
    let append = format!("{} rebound.workload=web", img.append);
    let out = env.ok(&[
        "vm",
        "start",
        "byo",
        "--kernel",
        img.kernel.to_str().unwrap(),
        "--initrd",
        img.initrd.to_str().unwrap(),
        "--append",
        &append,
        "--disk",
        disk.to_str().unwrap(),
        "--ready",
        "http:8080/index.html",
        "--forward",
        "0:8080",
        "--json",
    ]);
    let st: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(st["ready"], true, "{st}");
    assert!(
        st["kernel_release"].is_null(),
        "no agent facts for a user kernel"
    );
    // Without the agent's address, VMCOREINFO is found by scanning guest RAM.
    let vci = env.get_ok("GET", "/v1/vms/byo/vmcoreinfo", None);
    assert_eq!(vci["source"], "scan");
    assert_eq!(vci["osrelease"], img.kernel_release.as_str());
    let port = env.host_port("byo", 8080);
    let (code, body) = http_get(port, "/").unwrap();
    assert_eq!(code, 200);
    assert_eq!(body, ext4_file(&disk, "/index.html").unwrap());
    let evs = env.events("byo");
    let ready = evs.iter().find(|e| e["kind"] == "ready").unwrap();
    assert_eq!(ready["detail"]["probe"], "http:8080/index.html");
    // (No agent and no ACPI daemon in this guest: `stop` would wait out its grace period.)
    env.ok(&["vm", "kill", "byo"]);

    // Same kernel, readiness by TCP: counts only once slirp reaches the guest's
    // listener (QEMU accepts host connections before the guest is even up).
    let out = env.ok(&[
        "vm",
        "start",
        "byo2",
        "--kernel",
        img.kernel.to_str().unwrap(),
        "--initrd",
        img.initrd.to_str().unwrap(),
        "--append",
        &format!("{} rebound.workload=kv", img.append),
        "--ready",
        "tcp:7070",
        "--json",
    ]);
    let st: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(st["ready"], true);
    // Ready means the service answers right away.
    let kvp = env.host_port("byo2", 7070);
    assert_eq!(common::kv(kvp, "SET a 1").unwrap(), "OK");
    env.ok(&["vm", "kill", "byo2"]);

    // Readiness from a regex over the serial console.
    let out = env.ok(&[
        "vm",
        "start",
        "byo3",
        "--kernel",
        img.kernel.to_str().unwrap(),
        "--initrd",
        img.initrd.to_str().unwrap(),
        "--append",
        &format!("{} rebound.workload=none", img.append),
        "--ready",
        "serial:rebound-agent: ready \\(workload none\\)",
        "--json",
    ]);
    let st: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(st["ready"], true);
    let logs = env.ok(&["vm", "logs", "byo3"]);
    assert!(
        logs.contains("rebound-agent: ready (workload none)"),
        "{logs}"
    );
    // QEMU dying on its own (here: killed behind the daemon's back) is noticed.
    let pid = st["qemu_pid"].as_u64().unwrap() as i32;
    let run_dir = st["run_dir"].as_str().unwrap().to_string();
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(pid),
        nix::sys::signal::Signal::SIGKILL,
    )
    .unwrap();
    let st = env.get_ok(
        "POST",
        "/v1/vms/byo3/wait?for=stopped&timeout_ms=30000",
        None,
    );
    assert!(st["qemu_pid"].is_null());
    let last = env.events("byo3").pop().unwrap();
    assert_eq!(last["kind"], "exited", "{last}");
    assert!(!std::path::Path::new(&run_dir).exists());
}

/// A snapshot of a VM on the user's own kernel, initrd and pmem file restores only
/// when the user names each file again: the snapshot's word for them is never
/// taken. Named again, the guest comes back with its state.
#[test]
fn a_user_kernel_snapshot_restores_only_with_its_files_named_again() {
    let env = Env::new();
    let img = rebound_image::open(env.home.path(), "default").unwrap();
    // The user's files, in a directory of their own.
    let mine = tempfile::tempdir().unwrap();
    let (kernel, initrd) = (mine.path().join("vmlinuz"), mine.path().join("initrd"));
    std::fs::copy(&img.kernel, &kernel).unwrap();
    std::fs::copy(&img.initrd, &initrd).unwrap();
    let pmem = mine.path().join("pmem.img");
    std::fs::write(&pmem, vec![0x3cu8; 4 << 20]).unwrap();
    let (k, i, p) = (
        kernel.to_str().unwrap(),
        initrd.to_str().unwrap(),
        pmem.to_str().unwrap(),
    );
    env.ok(&[
        "vm",
        "start",
        "own",
        "--kernel",
        k,
        "--initrd",
        i,
        "--append",
        &format!("{} rebound.workload=kv", img.append),
        "--pmem",
        p,
        "--ready",
        "tcp:7070",
    ]);
    let port = env.host_port("own", 7070);
    assert_eq!(common::kv(port, "SET mine kept").unwrap(), "OK");
    let snap = env.home.path().join("snap-own");
    let s = snap.to_str().unwrap();
    env.ok(&["vm", "snapshot", "own", "--out", s, "--trace-s", "0"]);
    assert_eq!(common::kv(port, "SET mine later").unwrap(), "OK");
    env.ok(&["vm", "kill", "own"]);
    // The user moves the files: the snapshot's record of them names nothing now,
    // and the restore can only run on the files named again.
    let moved = mine.path().join("moved");
    std::fs::create_dir(&moved).unwrap();
    let (kernel, initrd, pmem) = (
        moved.join("vmlinuz"),
        moved.join("initrd"),
        moved.join("pmem.img"),
    );
    for (from, to) in [(k, &kernel), (i, &initrd), (p, &pmem)] {
        std::fs::rename(from, to).unwrap();
    }
    let (k, i, p) = (
        kernel.to_str().unwrap(),
        initrd.to_str().unwrap(),
        pmem.to_str().unwrap(),
    );

    // Each file not named again is refused in one line that says which flag to
    // pass; so is a pmem file that cannot be one, or one too many.
    let bad = mine.path().join("odd.img");
    std::fs::write(&bad, vec![0u8; 3 << 20]).unwrap();
    let b = bad.to_str().unwrap();
    let small = mine.path().join("small.img");
    std::fs::write(&small, vec![0u8; 2 << 20]).unwrap();
    let sm = small.to_str().unwrap();
    let base = ["vm", "restore", s, "--name", "back", "--mode", "lazy"];
    for (flags, want) in [
        (vec![], "pass --kernel FILE"),
        (vec!["--kernel", k], "pass --initrd FILE"),
        (vec!["--kernel", k, "--initrd", i], "pass --pmem FILE"),
        (
            vec!["--kernel", k, "--initrd", i, "--pmem", p, "--pmem", p],
            "--pmem names 2 file(s) but the snapshot's VM had 1",
        ),
        (
            vec!["--kernel", k, "--initrd", i, "--pmem", b],
            "is 3145728 bytes: a virtio-pmem device needs",
        ),
        // A valid pmem file of another size than the snapshot's VM had: its guest
        // would find a device larger than the file.
        (
            vec!["--kernel", k, "--initrd", i, "--pmem", sm],
            "is 2097152 bytes but the snapshot's VM had 4194304 bytes on pmem0",
        ),
    ] {
        let args: Vec<&str> = base.iter().copied().chain(flags).collect();
        let e = env.fails(&args);
        assert!(e.contains(want), "{args:?}: {e}");
        assert_eq!(env.status("own")["state"], "stopped", "{e}");
        let names = env.get_ok("GET", "/v1/vms", None);
        assert_eq!(
            names.as_array().unwrap().len(),
            1,
            "{args:?} left a VM: {names}"
        );
    }
    // The pmem file was neither written nor replaced by the refusals.
    assert!(std::fs::read(&pmem).unwrap().iter().all(|&x| x == 0x3c));

    // Named again: it runs and holds what it held at the snapshot point.
    let r = common::restore_json(
        &env,
        &[
            s, "--name", "back", "--mode", "lazy", "--kernel", k, "--initrd", i, "--pmem", p,
        ],
    );
    assert_eq!(r["phase"], "done", "{r}");
    let port = env.host_port("back", 7070);
    assert_eq!(common::kv(port, "GET mine").unwrap(), "VALUE kept");
    // QEMU was given the files the user named.
    let argv = env
        .events("back")
        .iter()
        .find(|e| e["kind"] == "started")
        .map(|e| e["detail"]["argv"].to_string())
        .unwrap();
    assert!(
        argv.contains(k) && argv.contains(i) && argv.contains(p),
        "{argv}"
    );
    env.ok(&["vm", "kill", "back"]);
}
