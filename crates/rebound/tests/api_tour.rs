//! Every operation of `api/openapi.yaml`, called and checked against the spec, in
//! one VM life and a few short ones; the test fails when an operation of the spec is
//! never exercised, and when a metric the daemon serves never moved.

use crate::common;

use std::collections::BTreeMap;
use std::time::Duration;

use common::{eventually, Env};
use serde_json::{json, Value};

fn start(env: &Env, name: &str) -> Value {
    let spec = json!({"name": name, "workload": "web", "memory_mib": 128,
                      "workload_args": {"watchdog_s": "2"}});
    let (code, st) = env.call("POST", "/v1/vms", Some(&spec)).unwrap();
    assert_eq!(code, 201, "{st}");
    st
}

fn wait(env: &Env, name: &str, what: &str) -> Value {
    env.get_ok(
        "POST",
        &format!("/v1/vms/{name}/wait?for={what}&timeout_ms=120000"),
        None,
    )
}

/// `name value` lines of the metrics text, for samples without labels.
fn samples(text: &str) -> BTreeMap<String, f64> {
    text.lines()
        .filter(|l| !l.starts_with('#') && !l.contains('{'))
        .filter_map(|l| {
            let (k, v) = l.split_once(' ')?;
            Some((k.to_string(), v.parse().ok()?))
        })
        .collect()
}

#[test]
fn every_operation_and_every_metric() {
    let env = Env::new();
    env.ok(&["vm", "list"]); // starts the daemon
    let first_daemon = env.daemon_pid();
    assert!(env
        .get_ok("GET", "/v1/vms", None)
        .as_array()
        .unwrap()
        .is_empty());

    start(&env, "t1");
    let st = wait(&env, "t1", "ready");
    assert_eq!(st["state"], "running");
    assert_eq!(st["job"], Value::Null);

    // A restarted daemon takes the running VM back.
    env.get_ok("POST", "/v1/daemon/shutdown", None);
    eventually(Duration::from_secs(10), "the daemon to exit", || {
        env.call("GET", "/v1/health", None).is_err().then_some(())
    });
    env.ok(&["vm", "list"]);
    assert_ne!(env.daemon_pid(), first_daemon);
    let st = env.status("t1");
    assert_eq!(
        (st["state"].as_str(), st["ready"].as_bool()),
        (Some("running"), Some(true))
    );
    assert!(env.event_kinds("t1").contains(&"reattached".to_string()));

    // A start accepted and then refused by the host counts as a failed start.
    let (code, err) = env
        .call(
            "POST",
            "/v1/vms",
            Some(&json!({"name": "bad", "image": "nosuch"})),
        )
        .unwrap();
    assert_eq!(code, 400, "{err}");
    assert!(err["error"].as_str().unwrap().contains("nosuch"), "{err}");

    // The guest, read from the host.
    let m = env.get_ok(
        "POST",
        "/v1/vms/t1/marker",
        Some(&json!({"value_hex": "c0ffee"})),
    );
    assert!(m["paddr"].as_u64().unwrap() > 0);
    // A warm reboot in the same QEMU: the agent lists its cache (a file the service
    // just read), comes back, reads it again.
    let port = env.host_port("t1", 8080);
    let (code, body) = common::http_get(port, "/blob-1m.bin").unwrap();
    assert_eq!((code, body.len()), (200, 1 << 20));
    let r = env.get_ok("POST", "/v1/vms/t1/reboot", Some(&json!({"warm": true})));
    assert_eq!(
        (r["how"].as_str(), r["warm"].as_bool()),
        (Some("agent"), Some(true)),
        "{r}"
    );
    assert!(r["reboot_ms"].as_u64().unwrap() > 0, "{r}");
    assert!(r["cached_pages"].as_u64().unwrap() >= 256, "{r}");
    assert_eq!(r["prefetch"]["pages"], r["cached_pages"], "{r}");
    assert!(r["cold_reason"].is_null(), "{r}");
    assert_eq!(env.status("t1")["ready"], true);
    // Its one disk, the image's data disk, is QEMU's.
    let disks = env.get_ok("GET", "/v1/vms/t1/disks", None);
    assert_eq!(disks.as_array().unwrap().len(), 1, "{disks}");
    assert_eq!(disks[0]["backend"], "qemu");
    assert!(
        disks[0]["file"].as_str().unwrap().ends_with("disk0.qcow2"),
        "{disks}"
    );
    // So there is no host cache to move its memory to (tests/host_cache.rs moves some).
    let cache = json!({"host_cache_bytes": 16 << 20});
    env.refused(
        "POST",
        "/v1/vms/t1/memory",
        Some(&cache),
        "no disk served by Rebound",
    );
    // Our image's guest has the eviction-notice module: the daemon reads its ring, with
    // no exclusive cache to give the notices to (tests/evict.rs gives them one).
    let ev = env.get_ok("GET", "/v1/vms/t1/evict", None);
    assert_eq!(ev["state"], "forwarding", "{ev}");
    assert_eq!(ev["forwarded"], 0, "{ev}");
    // Nor a plan, which needs curves (tests/memory_plan.rs makes and applies one).
    let plan = json!({"bound": 0.05});
    env.refused(
        "POST",
        "/v1/memory/plan",
        Some(&plan),
        "no VM has a miss-ratio curve",
    );
    // Nor a curve, which only an exclusive cache traces (tests/evict.rs has one).
    let restart = json!({"rate": 0.5});
    env.refused("GET", "/v1/vms/t1/mrc", None, "no exclusive host cache");
    env.refused(
        "POST",
        "/v1/vms/t1/mrc",
        Some(&restart),
        "no exclusive host cache",
    );
    let vi = env.get_ok("GET", "/v1/vms/t1/vmcoreinfo", None);
    assert!(vi["osrelease"].as_str().unwrap().contains('.'));
    // A dump of the running guest, now: paused for it, resumed after, private.
    let out = env.home.path().join("t1.vmcore");
    let d = env.get_ok(
        "POST",
        "/v1/vms/t1/dump",
        Some(&json!({"out": out.to_str().unwrap(), "filter": ["free"]})),
    );
    assert!(d["paused_s"].as_f64().unwrap() > 0.0, "{d}");
    assert!(d["pages_written"].as_u64().unwrap() > 0, "{d}");
    {
        use std::os::unix::fs::MetadataExt;
        assert_eq!(std::fs::metadata(&out).unwrap().mode() & 0o777, 0o600);
    }
    let osrel = std::process::Command::new("crash")
        .args(["--osrelease", out.to_str().unwrap()])
        .output()
        .unwrap();
    assert!(
        String::from_utf8_lossy(&osrel.stdout).contains("amd64"),
        "{osrel:?}"
    );
    assert_eq!(wait(&env, "t1", "ready")["state"], "running");
    // The stock baseline: QEMU's own dump, made durable the same way.
    let stock = env.home.path().join("t1.qemu.vmcore");
    let d = env.get_ok(
        "POST",
        "/v1/vms/t1/dump",
        Some(&json!({"out": stock.to_str().unwrap(), "engine": "qemu"})),
    );
    assert_eq!(d["engine"], "qemu");
    assert_eq!(
        d["bytes"].as_u64().unwrap(),
        std::fs::metadata(&stock).unwrap().len()
    );
    assert!(d["bytes"].as_u64().unwrap() >= 128 << 20, "{d}");
    assert_eq!(wait(&env, "t1", "ready")["state"], "running");
    let logs = env.get_ok("GET", "/v1/vms/t1/logs", None);
    assert!(!logs.as_str().unwrap().is_empty());

    // Pause and resume; a snapshot, and a restore of it held ready, then started.
    assert_eq!(
        env.get_ok("POST", "/v1/vms/t1/pause", None)["state"],
        "paused"
    );
    assert_eq!(
        env.get_ok("POST", "/v1/vms/t1/resume", None)["state"],
        "running"
    );
    let snap = env.home.path().join("t1.snap");
    let (code, s) = env
        .call(
            "POST",
            "/v1/vms/t1/snapshot",
            Some(&json!({"out": snap.to_str().unwrap(), "trace_s": 0.5})),
        )
        .unwrap();
    assert_eq!(code, 201, "{s}");
    assert!(snap.join("manifest.json").is_file());
    let (code, r) = env
        .call(
            "POST",
            "/v1/restore",
            Some(&json!({"dir": snap.to_str().unwrap(), "name": "t1r", "paused": true, "watch_s": 1})),
        )
        .unwrap();
    assert_eq!(code, 201, "{r}");
    assert_eq!(r["phase"], "held");
    assert_eq!(env.status("t1r")["state"], "paused");
    assert_eq!(
        env.get_ok("POST", "/v1/vms/t1r/resume", None)["state"],
        "running"
    );
    let rep = eventually(Duration::from_secs(60), "the restore report", || {
        let r = env.get_ok("GET", "/v1/vms/t1r/restore", None);
        (r["phase"] == "done").then_some(r)
    });
    assert!(rep["time_to_running_s"].as_f64().is_some(), "{rep}");
    // Onto shared RAM now (if it has not moved there by itself yet).
    let st = env.get_ok("POST", "/v1/vms/t1r/settle", None);
    assert_eq!(st["state"], "running");
    assert!(
        !st["ram_file"]
            .as_str()
            .unwrap()
            .starts_with(snap.to_str().unwrap()),
        "{st}"
    );
    env.get_ok("POST", "/v1/vms/t1r/kill", None);
    env.get_ok("DELETE", "/v1/vms/t1r", None);

    // No crash policy: no crash reports.
    assert_eq!(env.get_ok("GET", "/v1/vms/t1/crashes", None), json!([]));
    let (code, _) = env.call("GET", "/v1/vms/t1/crashes/latest", None).unwrap();
    assert_eq!(code, 404);
    env.get_ok("POST", "/v1/vms/t1/crash", None);
    let st = wait(&env, "t1", "panicked");
    assert_eq!(st["ready"], false);
    let st = env.get_ok("POST", "/v1/vms/t1/stop", None);
    assert_eq!(st["state"], "stopped");
    let st = env.get_ok("DELETE", "/v1/vms/t1", None);
    assert_eq!(st["name"], "t1");

    // One more boot to readiness (this daemon's histogram), a hang the watchdog
    // catches, then a kill.
    start(&env, "t2");
    wait(&env, "t2", "ready");
    env.get_ok("POST", "/v1/vms/t2/crash?how=hang", None);
    let st = wait(&env, "t2", "panicked");
    assert_eq!(st["ready"], false);
    let kinds = env.event_kinds("t2");
    assert!(kinds.contains(&"watchdog".to_string()), "{kinds:?}");
    let st = env.get_ok("POST", "/v1/vms/t2/kill", None);
    assert_eq!(st["state"], "stopped");

    // A QEMU that dies on its own is seen as exited.
    let st = start(&env, "t3");
    let pid = st["qemu_pid"].as_u64().unwrap() as i32;
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(pid),
        nix::sys::signal::Signal::SIGKILL,
    )
    .unwrap();
    wait(&env, "t3", "stopped");
    let evs = env.events("t3");
    assert_eq!(evs.last().unwrap()["kind"], "exited", "{evs:?}");
    assert!(evs.iter().all(|e| e["v"] == 1), "{evs:?}");

    let text = env.get_ok("GET", "/metrics", None);
    let text = text.as_str().unwrap();
    let s = samples(text);
    let counters: Vec<(&String, &f64)> = s.iter().filter(|(k, _)| k.ends_with("_total")).collect();
    assert!(counters.len() >= 7, "{text}");
    for (k, v) in counters {
        assert!(*v > 0.0, "metric {k} never moved:\n{text}");
    }
    assert!(s["rebound_vm_ready_seconds_count"] >= 1.0, "{text}");
    assert!(text.contains("rebound_vms{state=\"stopped\"} 2"), "{text}");

    // Every daemon takes part in cluster restores (on its in-memory store without
    // --etcd): a plan naming a host that is not in the cluster is refused, in one
    // line naming it, and nothing is restored (`cluster_store.rs` runs them for real).
    let plan = json!({"plan": {"restore_id": "r", "vms": [
        {"vm": "a", "host": "elsewhere", "ws_pages": 0}]}});
    let (code, r) = env
        .call("POST", "/v1/cluster/restore", Some(&plan))
        .unwrap();
    assert_eq!(code, 200, "{r}");
    assert_eq!(r["outcome"]["result"], "aborted", "{r}");
    assert_eq!(
        r["outcome"]["reason"], "host elsewhere is not in the cluster (no live lease)",
        "{r}"
    );
    assert_eq!(r["vms"][0]["state"], "unknown", "{r}");
    let (code, again) = env.call("GET", "/v1/cluster/restores/r", None).unwrap();
    assert_eq!(code, 200, "{again}");
    assert_eq!(again["outcome"], r["outcome"]);
    let (code, e) = env
        .call("GET", "/v1/cluster/restores/nothing", None)
        .unwrap();
    assert_eq!(code, 404, "{e}");
    // The same id again is refused: a new restore needs a new id.
    let (code, e) = env
        .call("POST", "/v1/cluster/restore", Some(&plan))
        .unwrap();
    assert_eq!(code, 400, "{e}");
    assert!(
        e["error"].as_str().unwrap().contains("exists already"),
        "{e}"
    );

    let missing = env.api.unexercised();
    assert!(
        missing.is_empty(),
        "operations of the spec never exercised: {missing:?}"
    );
}
