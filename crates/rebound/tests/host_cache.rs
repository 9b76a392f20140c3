//! `vm memory --host-cache` (Hcache): memory moves from a running guest to exclusive
//! host caches of its Rebound-served disks and back, and a guest is never asked for
//! more than it can give.

use crate::common;

use std::time::Duration;

use common::{eventually, http_get, Env};
use serde_json::Value;

fn disk0(env: &Env, name: &str) -> Value {
    let disks = env.get_ok("GET", &format!("/v1/vms/{name}/disks"), None);
    disks[0]["stats"].clone()
}

fn balloon_events(env: &Env, name: &str) -> usize {
    env.events(name)
        .iter()
        .filter(|e| e["kind"] == "host_cache")
        .count()
}

#[test]
fn memory_moves_to_an_exclusive_host_cache_and_back_and_a_guest_keeps_what_it_needs() {
    let env = Env::new();
    env.ok(&[
        "vm",
        "start",
        "h1",
        "--workload",
        "web",
        "--memory",
        "256M",
        "--disk-backend",
        "rebound",
    ]);
    let port = env.host_port("h1", 8080);

    // 64 MiB to the host: the guest's balloon gives them, the disk's cache becomes
    // exclusive with room for them, and the guest still serves.
    let r: Value =
        serde_json::from_str(&env.ok(&["vm", "memory", "h1", "--host-cache", "64M", "--json"]))
            .unwrap();
    assert_eq!(
        (
            &r["guest_mib_before"],
            &r["guest_mib"],
            &r["host_cache_bytes"],
            &r["exclusive"]
        ),
        (
            &Value::from(256),
            &Value::from(192),
            &Value::from(64u64 << 20),
            &Value::Bool(true)
        ),
        "{r}"
    );
    // The guest's own statistics checked that it could give them.
    assert_eq!(r["notes"], serde_json::json!([]), "{r}");
    let s = disk0(&env, "h1");
    assert_eq!(s["exclusive"], true, "{s}");
    assert_eq!(s["cache"]["capacity_bytes"], 64u64 << 20, "{s}");
    assert_eq!(http_get(port, "/").unwrap().0, 200);
    assert_eq!(balloon_events(&env, "h1"), 1);

    // More than the guest may give: refused, nothing moved.
    let e = env.fails(&["vm", "memory", "h1", "--host-cache", "240M"]);
    assert!(e.contains("at least 64 MiB") && !e.contains('\n'), "{e}");
    let s = disk0(&env, "h1");
    assert_eq!(s["cache"]["capacity_bytes"], 64u64 << 20, "{s}");

    // All back: the guest has its 256 MiB, the cache is the spec's (none), inclusive.
    let r: Value =
        serde_json::from_str(&env.ok(&["vm", "memory", "h1", "--host-cache", "0", "--json"]))
            .unwrap();
    assert_eq!(
        (&r["guest_mib"], &r["exclusive"]),
        (&Value::from(256), &Value::Bool(false)),
        "{r}"
    );
    let s = disk0(&env, "h1");
    assert_eq!(
        (&s["exclusive"], &s["cache"]["capacity_bytes"]),
        (&Value::Bool(false), &Value::from(0)),
        "{s}"
    );

    // A guest whose memory is in use cannot give it: 150 MiB filled in 256 MiB, so
    // leaving it 128 MiB is refused and it goes on filling.
    env.ok(&[
        "vm",
        "start",
        "h2",
        "--workload",
        "memfill",
        "--memfill",
        "150M",
        "--memory",
        "256M",
        "--disk-backend",
        "rebound",
    ]);
    let rounds = |env: &Env| {
        env.events("h2")
            .iter()
            .filter(|e| e["kind"] == "memfill")
            .filter_map(|e| e["detail"]["rounds"].as_u64())
            .max()
            .unwrap_or(0)
    };
    eventually(Duration::from_secs(120), "a memfill round", || {
        (rounds(&env) >= 1).then_some(())
    });
    let e = env.fails(&["vm", "memory", "h2", "--host-cache", "128M"]);
    assert!(
        e.contains("cannot give") && e.contains("nothing was moved"),
        "{e}"
    );
    let seen = rounds(&env);
    eventually(Duration::from_secs(60), "memfill going on", || {
        (rounds(&env) > seen).then_some(())
    });
    let errors: u64 = env
        .events("h2")
        .iter()
        .filter(|e| e["kind"] == "memfill")
        .filter_map(|e| e["detail"]["errors"].as_u64())
        .max()
        .unwrap_or(0);
    assert_eq!(errors, 0);
    assert_eq!(env.status("h2")["state"], "running");
    assert_eq!(balloon_events(&env, "h2"), 0);

    // A VM whose disks QEMU serves has no host cache to move memory to.
    env.ok(&[
        "vm",
        "start",
        "h3",
        "--workload",
        "none",
        "--memory",
        "128M",
    ]);
    let e = env.fails(&["vm", "memory", "h3", "--host-cache", "16M"]);
    assert!(e.contains("no disk served by Rebound's backend"), "{e}");
    for n in ["h1", "h2", "h3"] {
        env.ok(&["vm", "kill", n]);
    }
}
