//! kv, counter and memfill guests side by side; then the daemon is killed and a new
//! one re-attaches: the guests never notice (kv keeps its in-RAM data, the counter
//! keeps counting, the agent link comes back).

use crate::common;

use std::time::Duration;

use common::{eventually, kv, sigkill_and_wait, Env};
use serde_json::{json, Value};

fn counter_seq(env: &Env, name: &str) -> Option<u64> {
    let (_, logs) = env
        .call("GET", &format!("/v1/vms/{name}/logs"), None)
        .ok()?;
    logs.as_str()?
        .lines()
        .filter_map(|l| l.split("counter seq=").nth(1))
        .filter_map(|r| r.split_whitespace().next()?.parse().ok())
        .max()
}

#[test]
fn workloads_answer_and_survive_a_daemon_restart() {
    let env = Env::new();
    env.ok(&["vm", "start", "kv1", "--workload", "kv", "--no-wait"]);
    env.ok(&["vm", "start", "ctr1", "--workload", "counter", "--no-wait"]);
    env.ok(&[
        "vm",
        "start",
        "mf1",
        "--workload",
        "memfill",
        "--memfill",
        "32M",
        "--no-wait",
    ]);
    for n in ["kv1", "ctr1", "mf1"] {
        env.ok(&["vm", "wait", n, "ready", "--timeout", "300"]);
    }
    let table = env.ok(&["vm", "list"]);
    assert_eq!(
        table.lines().filter(|l| l.contains("running")).count(),
        3,
        "{table}"
    );

    // kv: state lives only in guest RAM.
    let kvp = env.host_port("kv1", 7070);
    assert_eq!(kv(kvp, "SET color teal").unwrap(), "OK");
    assert_eq!(kv(kvp, "GET color").unwrap(), "VALUE teal");
    assert_eq!(kv(kvp, "GET missing").unwrap(), "NOTFOUND");

    // counter: ticks advance in the serial log.
    let first = eventually(Duration::from_secs(60), "a counter tick", || {
        counter_seq(&env, "ctr1")
    });
    eventually(Duration::from_secs(60), "the counter to advance", || {
        counter_seq(&env, "ctr1").filter(|s| *s > first + 5)
    });

    // memfill: verification rounds complete without errors.
    let mf = eventually(Duration::from_secs(120), "a memfill round", || {
        env.events("mf1")
            .into_iter()
            .filter(|e| e["kind"] == "memfill")
            .map(|e| e["detail"].clone())
            .find(|d| d["rounds"].as_u64() >= Some(1))
    });
    assert_eq!(mf["errors"], 0, "{mf}");
    assert!(mf["filled_kib"].as_u64().unwrap() >= 32 * 1024, "{mf}");

    // Kill the daemon outright; the guests run on. While it is down, one QEMU dies.
    let old = env.daemon_pid();
    let kv_pid = env.status("kv1")["qemu_pid"].clone();
    let mf_pid = env.status("mf1")["qemu_pid"].as_u64().unwrap() as u32;
    let mf_run = env.status("mf1")["run_dir"].as_str().unwrap().to_string();
    sigkill_and_wait(old);
    sigkill_and_wait(mf_pid);

    // Any command starts a new daemon, which re-attaches.
    let st: Value = serde_json::from_str(&env.ok(&["vm", "status", "kv1", "--json"])).unwrap();
    assert_ne!(env.daemon_pid(), old);
    assert_eq!(st["state"], "running");
    assert_eq!(st["qemu_pid"], kv_pid, "same QEMU, not a new one");
    for n in ["kv1", "ctr1"] {
        assert!(
            env.event_kinds(n).contains(&"reattached".to_string()),
            "{n} not re-attached"
        );
        assert_eq!(env.status(n)["state"], "running");
    }
    // The QEMU that died meanwhile is recorded as stopped, its runtime files gone.
    assert_eq!(env.status("mf1")["state"], "stopped");
    let last = env.events("mf1").pop().unwrap();
    assert_eq!(last["kind"], "stopped", "{last}");
    assert!(!std::path::Path::new(&mf_run).exists());
    assert_eq!(
        kv(kvp, "GET color").unwrap(),
        "VALUE teal",
        "kv lost its RAM state"
    );
    let before = counter_seq(&env, "ctr1").unwrap();
    eventually(Duration::from_secs(60), "the counter to go on", || {
        counter_seq(&env, "ctr1").filter(|s| *s > before)
    });
    // The agent link is back: the guest answers a marker request.
    let m = eventually(Duration::from_secs(60), "the agent to reconnect", || {
        env.call(
            "POST",
            "/v1/vms/kv1/marker",
            Some(&json!({"value_hex": "c0ffee"})),
        )
        .ok()
        .filter(|(c, _)| *c == 200)
    });
    assert!(m.1["paddr"].as_u64().unwrap() > 0);

    // The serial console shows the counter ticking; Ctrl-] detaches.
    console_shows(&env, "ctr1", "counter seq=");

    // kill: at once, runtime files gone.
    let run_dir = env.status("ctr1")["run_dir"].as_str().unwrap().to_string();
    env.ok(&["vm", "kill", "ctr1"]);
    assert!(!std::path::Path::new(&run_dir).exists());
    assert_eq!(env.status("ctr1")["state"], "stopped");
    assert!(env.event_kinds("ctr1").contains(&"killed".to_string()));

    // Stopping the daemon leaves VMs running.
    env.ok(&["daemon", "stop"]);
    let pid = kv_pid.as_u64().unwrap() as i32;
    assert!(nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), None).is_ok());
    assert_eq!(kv(kvp, "COUNT").unwrap(), "COUNT 1");

    // A graceful stop of a re-attached guest: the agent powers it off.
    env.ok(&["vm", "stop", "kv1"]);
    let last = env.events("kv1").pop().unwrap();
    assert_eq!(last["kind"], "stopped");
    assert_eq!(last["detail"]["how"], "guest poweroff", "{last}");
    // Its parent was the killed daemon: whoever adopted it reaps it, so allow a zombie.
    assert!(gone(pid as u32), "QEMU still running after stop");
}

fn gone(pid: u32) -> bool {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    stat.is_empty()
        || stat
            .rsplit(')')
            .next()
            .unwrap_or("")
            .trim_start()
            .starts_with('Z')
}

/// Attaches `rebound vm console` (stdin a pipe, not a terminal), waits for `needle`
/// in what the guest prints, then detaches with Ctrl-].
fn console_shows(env: &Env, name: &str, needle: &str) {
    use std::io::{Read, Write};
    let mut child = env
        .cmd(&["vm", "console", name])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let mut out = child.stdout.take().unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let mut buf = [0u8; 4096];
        while let Ok(n) = out.read(&mut buf) {
            if n == 0 || tx.send(buf[..n].to_vec()).is_err() {
                break;
            }
        }
    });
    let mut seen = Vec::new();
    let t0 = std::time::Instant::now();
    while !String::from_utf8_lossy(&seen).contains(needle) {
        assert!(
            t0.elapsed() < Duration::from_secs(30),
            "console never showed {needle:?}"
        );
        if let Ok(b) = rx.recv_timeout(Duration::from_millis(200)) {
            seen.extend(b);
        }
    }
    child.stdin.as_mut().unwrap().write_all(&[0x1d]).unwrap();
    let st = eventually(Duration::from_secs(10), "the console to detach", || {
        child.try_wait().unwrap()
    });
    assert!(st.success());
}
