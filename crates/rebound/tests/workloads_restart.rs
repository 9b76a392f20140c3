//! kv, counter and memfill guests side by side; then the daemon is killed and a new
//! one re-attaches: the guests never notice (kv keeps its in-RAM data, the counter
//! keeps counting, the agent link comes back).

mod common;

use std::time::Duration;

use common::{eventually, kv, Env};
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

    // Kill the daemon outright; the guests run on.
    let old = env.daemon_pid();
    let kv_pid = env.status("kv1")["qemu_pid"].clone();
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(old as i32),
        nix::sys::signal::Signal::SIGKILL,
    )
    .unwrap();
    eventually(Duration::from_secs(10), "the old daemon to die", || {
        nix::sys::signal::kill(nix::unistd::Pid::from_raw(old as i32), None)
            .is_err()
            .then_some(())
    });

    // Any command starts a new daemon, which re-attaches.
    let st: Value = serde_json::from_str(&env.ok(&["vm", "status", "kv1", "--json"])).unwrap();
    assert_ne!(env.daemon_pid(), old);
    assert_eq!(st["state"], "running");
    assert_eq!(st["qemu_pid"], kv_pid, "same QEMU, not a new one");
    for n in ["kv1", "ctr1", "mf1"] {
        assert!(
            env.event_kinds(n).contains(&"reattached".to_string()),
            "{n} not re-attached"
        );
        assert_eq!(env.status(n)["state"], "running");
    }
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
}
