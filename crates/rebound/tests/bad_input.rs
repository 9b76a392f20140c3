//! Bad input: each case ends in one line on stderr starting with `error:`, a
//! non-zero exit, and nothing saved.

use crate::common;

use common::Env;
use serde_json::json;

#[test]
fn unknown_vm() {
    let env = Env::bare();
    for args in [
        &["vm", "status", "nope"][..],
        &["vm", "stop", "nope"],
        &["vm", "kill", "nope"],
        &["vm", "crash", "nope"],
        &["vm", "logs", "nope"],
        &["vm", "marker", "nope", "00"],
        &["vm", "vmcoreinfo", "nope"],
        &["vm", "wait", "nope", "ready"],
    ] {
        let e = env.fails(args);
        assert!(e.contains("unknown VM \"nope\""), "{args:?}: {e}");
    }
    let (code, v) = env.call("GET", "/v1/vms/nope", None).unwrap();
    assert_eq!(code, 404);
    assert!(v["error"].as_str().unwrap().contains("nope"));
}

#[test]
fn malformed_sizes_and_flags() {
    let env = Env::bare();
    let cases: &[(&[&str], &str)] = &[
        (
            &["vm", "start", "a", "--memory", "12X"],
            "malformed size \"12X\"",
        ),
        (&["vm", "start", "a", "--memory", "1.5G"], "malformed size"),
        (&["vm", "start", "a", "--memory", "8M"], "below the minimum"),
        (
            &["vm", "start", "a", "--memfill", "lots"],
            "malformed size \"lots\"",
        ),
        (
            &["vm", "start", "a", "--cpus", "0"],
            "cpus must be between 1 and 64",
        ),
        (&["vm", "start", "a", "--cpus", "many"], "--cpus"),
        (
            &["vm", "start", "a", "--forward", "8080"],
            "malformed forward",
        ),
        (
            &["vm", "start", "a", "--disk", "/tmp/x.raw,colour=red"],
            "unknown option \"colour\"",
        ),
        (
            &["vm", "start", "a", "--disk", "/tmp/x.raw,size=1000"],
            "multiple of 512",
        ),
        (
            &[
                "vm",
                "start",
                "a",
                "--disk",
                "/tmp/x.raw,backend=qemu,cache=host:64M",
            ],
            "needs backend=rebound",
        ),
        (
            &["vm", "start", "a", "--ready", "udp:53"],
            "malformed readiness",
        ),
        (
            &["vm", "start", "a", "--ready", "serial:("],
            "invalid serial regex",
        ),
        (
            &["vm", "start", "a", "--accel", "hvf"],
            "unknown accelerator",
        ),
        (
            &["vm", "start", "a", "--workload", "dance"],
            "unknown workload",
        ),
        (&["vm", "start", "bad/name"], "invalid VM name"),
        (
            &[
                "vm",
                "start",
                "a",
                "--kernel",
                "/bin/true",
                "--ready",
                "tcp:22",
                "--memory",
                "64T",
            ],
            "does not fit in",
        ),
        (&["vm", "start", "a", "--bogus"], "--bogus"),
        (&["vm", "marker", "a", "XYZ"], "lowercase hex"),
        (
            &[
                "vm",
                "start",
                "a",
                "--on-crash",
                "dump-and-recover",
                "--min-memory",
                "128M",
                "--host-memory-budget",
                "64M",
            ],
            "below --min-memory",
        ),
        (
            &["vm", "start", "a", "--on-crash", "sometimes"],
            "expected none, dump, recover",
        ),
        (&["vm", "start", "a", "--compress", "zstd"], "kdump only"),
        (
            &[
                "vm",
                "start",
                "a",
                "--on-crash",
                "recover",
                "--filter",
                "free",
            ],
            "--filter needs",
        ),
        (&["vm", "start", "a", "--io-policy", "fast"], "--io-policy"),
    ];
    for (args, want) in cases {
        let e = env.fails(args);
        assert!(e.contains(want), "{args:?}: {e:?} lacks {want:?}");
    }
    // The daemon refuses a bad spec too (the API's own check), with an Error body.
    env.ok(&["vm", "list"]);
    let client = rebound::client::Client::new(&env.socket());
    let rt = tokio::runtime::Runtime::new().unwrap();
    for body in [
        json!({"name": "a", "memory_mib": 8}),
        json!({"name": "a", "cpus": 0}),
        json!({"name": "a", "colour": 1}),
    ] {
        // Sent unchecked on purpose: the request breaks the spec.
        let a = rt
            .block_on(client.exchange(hyper::Method::POST, "/v1/vms", Some(&body)))
            .unwrap();
        assert_eq!(a.status.as_u16(), 400, "{body}");
        env.api
            .check_response("POST", "/v1/vms", 400, &a.content_type, &a.body)
            .unwrap();
    }
    // An unknown way to crash is refused before anything else.
    let path = "/v1/vms/a/crash?how=melt";
    let a = rt
        .block_on(client.exchange(hyper::Method::POST, path, None))
        .unwrap();
    assert_eq!(a.status.as_u16(), 400);
    assert!(String::from_utf8_lossy(&a.body).contains("expected panic or hang"));
    env.api
        .check_response("POST", path, 400, &a.content_type, &a.body)
        .unwrap();
    // Nothing was saved.
    assert_eq!(env.get_ok("GET", "/v1/vms", None), json!([]));
}

#[test]
fn missing_kernel_file() {
    let env = Env::bare();
    let e = env.fails(&[
        "vm",
        "start",
        "k",
        "--kernel",
        "/nonexistent/vmlinuz",
        "--ready",
        "tcp:22",
    ]);
    assert!(
        e.contains("kernel file /nonexistent/vmlinuz not found"),
        "{e}"
    );
    // The daemon checks as well, before spawning anything.
    env.ok(&["vm", "list"]);
    let (code, v) = env
        .call(
            "POST",
            "/v1/vms",
            Some(&json!({"name": "k", "kernel": "/nonexistent/vmlinuz", "ready": "tcp:22"})),
        )
        .unwrap();
    assert_eq!(code, 400);
    assert!(v["error"].as_str().unwrap().contains("not found"), "{v}");
    assert_eq!(env.get_ok("GET", "/v1/vms", None), json!([]));
    assert!(
        std::fs::read_dir(env.run.path()).unwrap().next().is_none(),
        "run dir created"
    );
    // An image that was never built.
    let e = env.fails(&["vm", "start", "i"]);
    assert!(e.contains("rebound image build"), "{e}");
}

#[test]
fn qemu_missing() {
    let args = [
        "vm",
        "start",
        "q",
        "--kernel",
        "/bin/true",
        "--ready",
        "tcp:22",
    ];
    for (var, value, want) in [
        (
            "REBOUND_QEMU",
            "/nonexistent/qemu-system-x86_64",
            "QEMU not found at /nonexistent/qemu-system-x86_64",
        ),
        ("PATH", "/nonexistent", "qemu-system-x86_64 is not on PATH"),
    ] {
        let mut env = Env::bare();
        env.set_env(var, value);
        let e = env.fails(&args);
        assert!(e.contains(want), "{var}={value}: {e}");
    }
}

#[test]
fn second_daemon_and_stale_socket() {
    let env = Env::bare();
    env.ok(&["vm", "list"]); // starts the daemon
    let pid = env.daemon_pid();
    let e = env.fails(&["daemon"]);
    assert!(e.contains("already serving"), "{e}");
    let sock = env.socket();
    let e = env.fails(&["daemon", "--socket", sock.to_str().unwrap()]);
    assert!(e.contains("already serving"), "{e}");
    assert_eq!(env.daemon_pid(), pid, "the first daemon must be untouched");

    // A daemon that died leaves its socket file; the next one removes it.
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(pid as i32),
        nix::sys::signal::Signal::SIGKILL,
    )
    .unwrap();
    common::eventually(
        std::time::Duration::from_secs(10),
        "the daemon to die",
        || {
            nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid as i32), None)
                .is_err()
                .then_some(())
        },
    );
    assert!(sock.exists());
    env.ok(&["vm", "list"]);
    assert_ne!(env.daemon_pid(), pid);
    env.ok(&["daemon", "stop"]);
    assert!(!sock.exists());
}

#[test]
fn name_in_use() {
    let env = Env::new();
    env.ok(&["vm", "start", "dup", "--no-wait"]);
    let e = env.fails(&["vm", "start", "dup", "--no-wait"]);
    assert!(e.contains("VM name \"dup\" is already in use"), "{e}");
    let (code, _) = env
        .call("POST", "/v1/vms", Some(&json!({"name": "dup"})))
        .unwrap();
    assert_eq!(code, 409);
    let e = env.fails(&["vm", "rm", "dup"]);
    assert!(e.contains("stop or kill it before removing it"), "{e}");
    env.ok(&["vm", "kill", "dup"]);
    assert_eq!(env.status("dup")["state"], "stopped");
    // A stopped VM can be forgotten; then the name is free and nothing is left.
    env.get_ok("DELETE", "/v1/vms/dup", None);
    assert!(env.fails(&["vm", "status", "dup"]).contains("unknown VM"));
    assert!(!env.home.path().join("vms/dup").exists());
}

#[test]
fn concurrent_clients_start_one_daemon() {
    let env = Env::bare();
    let procs: Vec<_> = (0..4)
        .map(|_| {
            env.cmd(&["vm", "list", "--json"])
                .stdout(std::process::Stdio::piped())
                .stderr(std::process::Stdio::piped())
                .spawn()
                .unwrap()
        })
        .collect();
    for p in procs {
        let o = p.wait_with_output().unwrap();
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        assert_eq!(String::from_utf8_lossy(&o.stdout).trim(), "[]");
    }
    env.daemon_pid();
}

#[test]
fn qemu_failing_at_start_leaves_nothing() {
    let env = Env::new();
    // A host port someone else holds: QEMU refuses the forward and exits.
    let busy = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let fwd = format!("{}:8080", busy.local_addr().unwrap().port());
    let e = env.fails(&["vm", "start", "busy", "--forward", &fwd, "--no-wait"]);
    assert!(e.contains("QEMU failed to start"), "{e}");
    assert!(e.contains("forward"), "{e}");
    assert_eq!(env.get_ok("GET", "/v1/vms", None), json!([]));
    assert!(!env.home.path().join("vms/busy").exists());
    assert!(!env.run.path().join("busy").exists());
}

#[test]
fn kvm_requested_where_unusable() {
    let host = rebound_vmm::accel::HostFacts::probe();
    let env = Env::bare();
    let args = [
        "vm",
        "start",
        "k",
        "--kernel",
        "/bin/true",
        "--ready",
        "tcp:22",
        "--accel",
        "kvm",
    ];
    let Some(reason) = host.kvm_unusable_reason() else {
        // Where KVM works, the request passes the accelerator check (whatever the
        // fake kernel then does).
        let out = env.rebound(&args);
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!err.contains("KVM is unusable"), "{err}");
        return;
    };
    let e = env.fails(&args);
    assert!(
        e.contains("--accel kvm requested but KVM is unusable here"),
        "{e}"
    );
    assert!(e.contains(&reason), "{e}");
    assert_eq!(env.get_ok("GET", "/v1/vms", None), json!([]));
}

/// A runtime directory (guest RAM, QEMU sockets) that is a link, or that another
/// user made first at the predictable default path, is refused in one line, and
/// nothing is created through it.
#[test]
fn a_runtime_directory_that_is_a_link_or_someone_elses_is_refused() {
    let target = tempfile::tempdir_in("/dev/shm").unwrap();
    let mut env = Env::bare();
    let link = env.home.path().join("run-link");
    std::os::unix::fs::symlink(target.path(), &link).unwrap();
    env.set_env("REBOUND_RUN", link.to_str().unwrap());
    let e = env.fails(&["daemon"]);
    assert!(e.contains("is a symbolic link"), "{e}");
    assert_eq!(std::fs::read_dir(target.path()).unwrap().count(), 0);

    let theirs = tempfile::tempdir_in("/dev/shm").unwrap();
    std::os::unix::fs::chown(theirs.path(), Some(65534), Some(65534)).unwrap();
    let mut env = Env::bare();
    env.set_env("REBOUND_RUN", theirs.path().to_str().unwrap());
    let e = env.fails(&["daemon"]);
    assert!(e.contains("belongs to uid 65534"), "{e}");
    assert_eq!(std::fs::read_dir(theirs.path()).unwrap().count(), 0);
}
