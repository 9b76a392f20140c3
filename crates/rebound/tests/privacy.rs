//! Guest memory, disks, consoles and logs are the daemon user's alone: another local
//! user (`nobody`) can neither read nor connect to anything Rebound keeps for a
//! running VM or for a crashed one, and state an older version left readable is
//! tightened when the daemon starts; the same holds for a crash's dump and report.
//! Forwarded ports listen on loopback only.

use crate::common;

use std::os::unix::fs::{FileTypeExt, MetadataExt, PermissionsExt};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};

use common::Env;

/// What `nobody` tries on each path: list a directory, read a file, connect to a socket.
const PROBE: &str = r#"
import json, os, socket, stat, sys
got = []
for p in sys.argv[1:]:
    try:
        st = os.lstat(p)
        if stat.S_ISDIR(st.st_mode):
            os.listdir(p); got.append(p)
        elif stat.S_ISSOCK(st.st_mode):
            s = socket.socket(socket.AF_UNIX); s.settimeout(2); s.connect(p); got.append(p)
        elif stat.S_ISREG(st.st_mode):
            open(p, "rb").read(1); got.append(p)
    except OSError:
        pass
print(json.dumps(got))
"#;

/// The paths of `paths` that `nobody` could list, read or connect to.
fn reachable_by_nobody(paths: &[PathBuf]) -> Vec<String> {
    assert!(
        nix::unistd::geteuid().is_root(),
        "this test switches to the user nobody and must run as root (as `make test` does)"
    );
    let nobody = nix::unistd::User::from_name("nobody")
        .unwrap()
        .expect("user nobody exists");
    let mut cmd = std::process::Command::new("python3");
    cmd.arg("-c").arg(PROBE).args(paths);
    let (uid, gid) = (nobody.uid, nobody.gid);
    // SAFETY: runs in the forked child before exec; setgroups/setgid/setuid are
    // async-signal-safe and touch no memory of the parent.
    unsafe {
        cmd.pre_exec(move || {
            nix::unistd::setgroups(&[]).map_err(std::io::Error::from)?;
            nix::unistd::setgid(gid).map_err(std::io::Error::from)?;
            nix::unistd::setuid(uid).map_err(std::io::Error::from)?;
            Ok(())
        });
    }
    let out = cmd.output().expect("python3 runs (make test installs it)");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

/// Every entry below `root` (not following links), with the root itself.
fn walk(root: &Path) -> Vec<PathBuf> {
    let mut out = vec![root.to_path_buf()];
    let mut i = 0;
    while i < out.len() {
        let p = out[i].clone();
        if std::fs::symlink_metadata(&p).unwrap().is_dir() {
            for e in std::fs::read_dir(&p).unwrap().flatten() {
                out.push(e.path());
            }
        }
        i += 1;
    }
    out
}

/// Entries below the roots whose mode lets group or others in (links aside),
/// and what `nobody` reached. Both must be empty.
fn leaks(env: &Env) -> (Vec<String>, Vec<String>) {
    let mut paths = walk(env.home.path());
    paths.extend(walk(env.run.path()));
    let mut open = Vec::new();
    for p in &paths {
        let m = std::fs::symlink_metadata(p).unwrap();
        if m.file_type().is_symlink() {
            continue;
        }
        if m.mode() & 0o077 != 0 {
            let kind = if m.file_type().is_socket() {
                "socket"
            } else {
                ""
            };
            open.push(format!("{} {:o} {kind}", p.display(), m.mode() & 0o7777));
        }
    }
    (open, reachable_by_nobody(&paths))
}

/// Fails naming what is open to others, or what `nobody` reached, `when`.
fn assert_private(env: &Env, when: &str) {
    let (open, reached) = leaks(env);
    assert!(open.is_empty(), "open to others {when}: {open:#?}");
    assert!(reached.is_empty(), "nobody reached {when}: {reached:#?}");
}

#[test]
fn another_user_reaches_nothing_of_a_running_or_crashed_vm() {
    let env = Env::new();
    // State an older version left open: the daemon must tighten it on start.
    let old = env.home.path().join("vms/old");
    std::fs::create_dir_all(&old).unwrap();
    std::fs::write(old.join("events.jsonl"), b"").unwrap();
    for (p, m) in [
        (env.home.path(), 0o755),
        (env.run.path(), 0o755),
        (&env.home.path().join("vms"), 0o755),
        (&old, 0o755),
        (&old.join("events.jsonl"), 0o644),
    ] {
        std::fs::set_permissions(p, std::fs::Permissions::from_mode(m)).unwrap();
    }

    // The probe can reach what is open: a world-readable file in an open directory.
    let control = tempfile::tempdir().unwrap();
    std::fs::set_permissions(control.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let f = control.path().join("open");
    std::fs::write(&f, b"x").unwrap();
    std::fs::set_permissions(&f, std::fs::Permissions::from_mode(0o644)).unwrap();
    assert_eq!(
        reachable_by_nobody(std::slice::from_ref(&f)),
        vec![f.display().to_string()]
    );

    // A running VM, started by a CLI whose own umask is lax.
    let out = env
        .cmd(&["vm", "start", "p1", "--workload", "web", "--memory", "128M"])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let st = env.status("p1");
    let run_dir = PathBuf::from(st["run_dir"].as_str().unwrap());
    for f in [
        "ram",
        "qmp.sock",
        "agent.sock",
        "serial.sock",
        "console.sock",
    ] {
        assert!(
            run_dir.join(f).exists(),
            "{f} missing in {}",
            run_dir.display()
        );
    }
    // The logs a guest fills live with the record, off the RAM tmpfs.
    for f in ["serial.log", "qemu.log"] {
        let p = env.home.path().join("vms/p1").join(f);
        assert!(p.exists(), "{f} missing in {}", p.display());
    }
    assert!(env.home.path().join("vms/p1/disk0.qcow2").exists());
    assert_private(&env, "while running");
    // The daemon said once that it tightened the old state.
    let log = std::fs::read_to_string(env.home.path().join("reboundd.log")).unwrap();
    assert_eq!(
        log.matches("removed group and other permissions").count(),
        1,
        "{log}"
    );

    // Forwarded ports listen on loopback only.
    let port = env.host_port("p1", 8080);
    let tcp = std::fs::read_to_string("/proc/net/tcp").unwrap();
    let listening: Vec<&str> = tcp
        .lines()
        .filter(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            f.len() > 3 && f[3] == "0A" && f[1].ends_with(&format!(":{port:04X}"))
        })
        .collect();
    assert!(!listening.is_empty(), "no listener on {port}");
    for l in listening {
        assert!(
            l.split_whitespace()
                .nth(1)
                .unwrap()
                .starts_with("0100007F:"),
            "{l}"
        );
    }

    // The same VM crashed: its RAM is kept, and still private.
    env.get_ok("POST", "/v1/vms/p1/crash", None);
    env.get_ok(
        "POST",
        "/v1/vms/p1/wait?for=panicked&timeout_ms=60000",
        None,
    );
    assert!(run_dir.join("ram").exists());
    assert_private(&env, "after the crash");

    // A dump, its crash report and the recovery VM's files, as they are written.
    let out = env
        .cmd(&[
            "vm",
            "start",
            "p2",
            "--workload",
            "web",
            "--memory",
            "128M",
            "--on-crash",
            "dump-and-recover",
            "--io-policy",
            "5:100",
        ])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    env.get_ok("POST", "/v1/vms/p2/crash", None);
    env.wait_event("p2", "chunk_reclaimed");
    assert_private(&env, "while dumping");
    env.wait_event("p2", "dump_finished");
    let dumps: Vec<PathBuf> = walk(env.home.path())
        .into_iter()
        .filter(|p| p.file_name().is_some_and(|n| n == "vmcore"))
        .collect();
    assert_eq!(dumps.len(), 1, "{dumps:?}");
    assert_private(&env, "after the dump");

    // And stopped: the serial log kept with the record is private too.
    env.get_ok("POST", "/v1/vms/p1/stop", None);
    assert!(env.home.path().join("vms/p1/serial.log").exists());
    assert_private(&env, "after stop");
}
