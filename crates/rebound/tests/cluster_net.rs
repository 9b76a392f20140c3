//! VMs on a bridge of a simulated host (a network namespace whose daemon runs in it):
//! each `nics` entry gets a tap on the bridge, guests reach each other at their
//! cluster addresses with the `peer` workload, a peer that goes away is declared dead,
//! and the taps go with their VMs.

use std::io::{BufRead, BufReader, Write};
use std::process::{Command, Stdio};
use std::time::Duration;

use serde_json::Value;

use crate::common::{self, Env};

/// A network namespace with a bridge `br0`; removed (with its taps) when dropped.
pub(crate) struct Netns(pub(crate) String);

impl Netns {
    pub(crate) fn new(tag: &str) -> Netns {
        let name = format!("rbt{tag}{}", std::process::id());
        let ip = |args: &[&str]| {
            let o = Command::new("ip").args(args).output().expect("run ip");
            assert!(
                o.status.success(),
                "ip {args:?}: {}",
                String::from_utf8_lossy(&o.stderr)
            );
        };
        ip(&["netns", "add", &name]);
        let ns = Netns(name);
        ip(&["-n", &ns.0, "link", "set", "lo", "up"]);
        ip(&["-n", &ns.0, "link", "add", "br0", "type", "bridge"]);
        ip(&["-n", &ns.0, "link", "set", "br0", "up"]);
        ns
    }

    /// Runs `f` on a thread inside the namespace (where the VMs' forwards listen).
    pub(crate) fn run<T: Send + 'static>(&self, f: impl FnOnce() -> T + Send + 'static) -> T {
        let ns = self.0.clone();
        std::thread::spawn(move || {
            rebound_vmm::net::enter_netns(&ns).expect("enter the namespace");
            f()
        })
        .join()
        .expect("the thread in the namespace")
    }

    /// The tap devices in it.
    fn taps(&self) -> Vec<String> {
        let o = Command::new("ip")
            .args(["-n", &self.0, "-o", "link", "show"])
            .output()
            .unwrap();
        String::from_utf8_lossy(&o.stdout)
            .lines()
            .filter_map(|l| l.split(':').nth(1).map(|n| n.trim().to_string()))
            .filter(|n| n.starts_with("rbt"))
            .collect()
    }
}

impl Drop for Netns {
    fn drop(&mut self) {
        let _ = Command::new("ip").args(["netns", "del", &self.0]).output();
    }
}

/// Sends `line` to the guest's forwarded peer port and returns its first answer line.
fn ask(port: u16, line: &str) -> Option<String> {
    ask_addr(([127, 0, 0, 1], port).into(), line)
}

/// Sends `line` to `addr` and returns the first answer line.
fn ask_addr(addr: std::net::SocketAddr, line: &str) -> Option<String> {
    let mut s = std::net::TcpStream::connect_timeout(&addr, Duration::from_secs(3)).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
    s.write_all(format!("{line}\n").as_bytes()).ok()?;
    let mut r = BufReader::new(s);
    let mut out = String::new();
    r.read_line(&mut out).ok()?;
    Some(out.trim().to_string())
}

/// A daemon in the namespace, for `env`; it serves before this returns.
pub(crate) fn daemon_in(env: &Env, ns: &Netns) {
    let mut child = env
        .cmd(&["daemon", "--netns", &ns.0])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("start the daemon");
    // Reaped when the test's Env stops it.
    std::thread::spawn(move || child.wait());
    common::eventually(Duration::from_secs(10), "the daemon to serve", || {
        env.call("GET", "/v1/health", None)
            .ok()
            .filter(|(c, _)| *c == 200)
    });
}

pub(crate) fn stopped(env: &Env, name: &str) {
    env.get_ok(
        "POST",
        &format!("/v1/vms/{name}/wait?for=stopped&timeout_ms=20000"),
        None,
    );
}

fn start_peer(env: &Env, name: &str, ip: &str, peer: &str) {
    env.ok(&[
        "vm",
        "start",
        name,
        "--memory",
        "192M",
        "--workload",
        "peer",
        "--workload-arg",
        &format!("peers={peer}:7400"),
        "--nic",
        &format!("bridge=br0,ip={ip}/24"),
    ]);
}

#[test]
fn vms_on_a_bridge_of_a_simulated_host_talk_at_their_cluster_addresses() {
    let ns = Netns::new("n");
    let env = Env::new();
    daemon_in(&env, &ns);
    // The bridge must exist in the daemon's namespace: this one has no br7.
    let e = env.fails(&["vm", "start", "x", "--nic", "bridge=br7"]);
    assert!(e.contains("no bridge \"br7\""), "{e}");
    let e = env.fails(&["vm", "start", "x", "--nic", "bridge=br0,ip=10.77.0.0/24"]);
    assert!(e.contains("broadcast address"), "{e}");

    start_peer(&env, "n1", "10.77.0.11", "10.77.0.12");
    start_peer(&env, "n2", "10.77.0.12", "10.77.0.11");
    assert_eq!(ns.taps().len(), 2, "{:?}", ns.taps());
    // Each NIC got the MAC derived from its VM's name, and the guest was told it.
    let started = env
        .events("n1")
        .into_iter()
        .find(|e| e["kind"] == "started")
        .expect("a started event");
    let argv = started["detail"]["argv"].to_string();
    let mac = rebound_api::nic::Mac::for_vm("n1", 0).to_string();
    assert!(argv.contains(&format!("mac={mac}")), "{argv}");
    assert!(
        argv.contains(&format!("rebound.net={mac}@10.77.0.11/24")),
        "{argv}"
    );

    // n1's requests reach n2 at 10.77.0.12 and are answered, and the other way.
    for (name, other) in [("n1", "10.77.0.12:7400"), ("n2", "10.77.0.11:7400")] {
        let port = env.host_port(name, 7400);
        let stats = common::eventually(
            Duration::from_secs(60),
            &format!("{name} to exchange requests with {other}"),
            || {
                let s = ns.run(move || ask(port, "STATS"))?;
                let v: Value = serde_json::from_str(&s).ok()?;
                (v["connected"] == 1 && v["req_answered"].as_u64()? > 5).then_some(v)
            },
        );
        assert_eq!(stats["req_bad"], 0, "{stats}");
        assert_eq!(stats["dead"], serde_json::json!([]), "{stats}");
    }
    // A host client's QUERY fans out to the peer and comes back with its answer.
    let port = env.host_port("n1", 7400);
    let r = ns.run(move || ask(port, "QUERY q1")).expect("RESULT");
    assert!(r.starts_with("RESULT q1 1 "), "{r}");

    // n2 goes away: n1 declares it dead, and says so to the host.
    env.ok(&["vm", "kill", "n2"]);
    common::eventually(Duration::from_secs(30), "n1 to declare n2 dead", || {
        env.events("n1")
            .into_iter()
            .find(|e| {
                e["kind"] == "peer"
                    && e["detail"]["event"] == "dead"
                    && e["detail"]["peer"] == "10.77.0.12:7400"
            })
            .map(|_| ())
    });
    let r = ns.run(move || ask(port, "QUERY q2")).expect("RESULT");
    assert!(r.starts_with("RESULT q2 0 "), "{r}");

    // n2's tap goes with it; n1 keeps its own.
    stopped(&env, "n2");
    env.ok(&["vm", "rm", "n2"]);
    assert_eq!(ns.taps().len(), 1, "{:?}", ns.taps());
    env.ok(&["vm", "kill", "n1"]);
    stopped(&env, "n1");
    env.ok(&["vm", "rm", "n1"]);
    assert!(ns.taps().is_empty(), "{:?}", ns.taps());
}

/// Snapshot request of a coordinated cluster snapshot: held, with packet dumps.
fn held_snapshot(env: &Env, name: &str, out: &std::path::Path) -> (u16, Value) {
    env.call(
        "POST",
        &format!("/v1/vms/{name}/snapshot"),
        Some(&serde_json::json!({
            "out": out.display().to_string(),
            "trace_s": 3.0,
            "hold": true,
            "netdump": true,
        })),
    )
    .expect("snapshot call")
}

#[test]
fn a_coordinated_snapshot_holds_every_guest_until_all_are_saved_and_records_who_talks_to_whom() {
    let ns = Netns::new("s");
    let env = std::sync::Arc::new(Env::new());
    daemon_in(&env, &ns);
    start_peer(&env, "s1", "10.77.0.21", "10.77.0.22");
    start_peer(&env, "s2", "10.77.0.22", "10.77.0.21");
    let port = env.host_port("s1", 7400);
    common::eventually(Duration::from_secs(60), "s1 and s2 to talk", || {
        let s = ns.run(move || ask(port, "STATS"))?;
        let v: Value = serde_json::from_str(&s).ok()?;
        (v["req_answered"].as_u64()? > 5).then_some(())
    });

    let snaps = tempfile::tempdir().unwrap();
    let out = |n: &str| snaps.path().join(n);
    let calls: Vec<_> = ["s1", "s2"]
        .into_iter()
        .map(|n| {
            let (env, o) = (env.clone(), out(n));
            std::thread::spawn(move || held_snapshot(&env, n, &o))
        })
        .collect();
    // Both saved and held: paused, and neither runs on before the other is saved.
    for n in ["s1", "s2"] {
        env.wait_event(n, "snapshot_held");
    }
    for n in ["s1", "s2"] {
        assert_eq!(env.status(n)["state"], "paused", "{n}");
    }
    std::thread::sleep(Duration::from_millis(500));
    for n in ["s1", "s2"] {
        assert_eq!(env.status(n)["state"], "paused", "{n} must stay held");
    }
    for n in ["s1", "s2"] {
        env.get_ok("POST", &format!("/v1/vms/{n}/resume"), None);
    }
    for c in calls {
        let (code, r) = c.join().unwrap();
        assert_eq!(code, 201, "{r}");
        assert!(r["notes"].to_string().contains("until resumed"), "{r}");
        assert!(r["trace_pages"].as_u64().unwrap() > 0, "{r}");
    }
    for n in ["s1", "s2"] {
        assert_eq!(env.status(n)["state"], "running", "{n}");
    }

    // The dumps (from the snapshot point to the trace's end) show both directions
    // of traffic, counted once each at the sender.
    let mut ep = rebound_cluster::Endpoints::new();
    ep.add_ipv4("10.77.0.21".parse().unwrap(), "s1").unwrap();
    ep.add_ipv4("10.77.0.22".parse().unwrap(), "s2").unwrap();
    let mut b = rebound_cluster::TrafficBuilder::new(ep);
    for n in ["s1", "s2"] {
        for q in ["rx", "tx"] {
            let f = out(n).join(format!("net1-{q}.pcap"));
            assert!(f.is_file(), "{}", f.display());
            b.add_dump_file(n, &f, Default::default())
                .unwrap_or_else(|e| panic!("{}: {e}", f.display()));
        }
    }
    let (m, _) = b.finish();
    assert!(m.count("s1", "s2") > 5, "{m:?}");
    assert!(m.count("s2", "s1") > 5, "{m:?}");
    // Each file holds the direction its name says, from the guest's side: the
    // guest's own MAC is the source of every frame it sent and of none it received.
    for n in ["s1", "s2"] {
        let mac = rebound_api::nic::Mac::for_vm(n, 0).0;
        for (q, own) in [("rx", false), ("tx", true)] {
            let f = out(n).join(format!("net1-{q}.pcap"));
            let frames: Vec<_> = rebound_cluster::pcap::PcapReader::open(&f, Default::default())
                .unwrap()
                .map(|r| r.unwrap().data)
                .collect();
            assert!(!frames.is_empty(), "{}", f.display());
            for d in &frames {
                assert_eq!(d[6..12] == mac, own, "{}: {d:02x?}", f.display());
            }
        }
    }
    // Each snapshot is whole: the offline checker agrees.
    for n in ["s1", "s2"] {
        env.ok(&["snapshot", "verify", out(n).to_str().unwrap()]);
    }
}

#[test]
fn a_cluster_on_two_simulated_hosts_starts_snapshots_and_draws_its_graph_then_goes_away() {
    let env = Env::new();
    let name = format!("t{}", std::process::id());
    let file = env.home.path().join("cluster.toml");
    std::fs::write(
        &file,
        r#"
[network]
subnet = "10.79.3.0/24"
topology = "client-server"
[defaults]
memory = "160M"
workload = "peer"
[[host]]
name = "h1"
simulated = true
[[host]]
name = "h2"
simulated = true
[[vm]]
name = "client"
host = "h1"
[[vm]]
name = "s1"
host = "h2"
[[vm]]
name = "s2"
host = "h2"
"#,
    )
    .unwrap();
    // A bad file changes nothing: one line naming the problem.
    let bad = env.home.path().join("bad.toml");
    std::fs::write(&bad, "[network]\nsubnet = \"10.79.3.1/24\"\n").unwrap();
    let e = env.fails(&["cluster", "create", &name, "--file", bad.to_str().unwrap()]);
    assert!(e.contains("host bits"), "{e}");

    env.ok(&["cluster", "create", &name, "--file", file.to_str().unwrap()]);
    let _cleanup = ClusterRm(&env, name.clone());
    let netns = |h: &str| format!("rb-{name}-{h}");
    let namespaces = || {
        String::from_utf8(
            Command::new("ip")
                .args(["netns", "list"])
                .output()
                .unwrap()
                .stdout,
        )
        .unwrap()
    };
    assert!(namespaces().contains(&netns("h1")) && namespaces().contains(&netns("h2")));
    env.ok(&["cluster", "start", &name]);
    // The hosts' daemons publish their VMs in the cluster store, which the status
    // reads (within a second of a change).
    common::eventually(
        Duration::from_secs(10),
        "the store to show every VM running and ready",
        || {
            let vms = store_vms(&env, &name);
            (vms.len() == 3
                && vms
                    .iter()
                    .all(|v| v["state"] == "running" && v["ready"] == true))
            .then_some(())
        },
    );
    let st: Value = serde_json::from_str(&env.ok(&["cluster", "status", &name, "--json"])).unwrap();
    let hosts: Vec<&str> = st["hosts"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|h| h["live"] == true)
        .map(|h| h["host"].as_str().unwrap())
        .collect();
    assert_eq!(hosts, ["h1", "h2"], "{st}");
    // From this machine, across the backbone, the client's QUERY reaches both servers
    // on the other host.
    common::eventually(
        Duration::from_secs(60),
        "the client to reach both servers",
        || {
            let r = ask_at("10.79.3.11", "QUERY q")?;
            r.starts_with("RESULT q 2 ").then_some(())
        },
    );

    let snap = env.home.path().join("snap");
    env.ok(&[
        "cluster",
        "snapshot",
        &name,
        "--out",
        snap.to_str().unwrap(),
        "--trace-s",
        "3",
    ]);
    for v in ["client", "s1", "s2"] {
        env.ok(&["snapshot", "verify", snap.join(v).to_str().unwrap()]);
    }
    // One coordinated pause: every VM ran on to the instant the cluster snapshot
    // chose, and they stopped close together (not one by one as their samples ended).
    let m: Value =
        serde_json::from_str(&std::fs::read_to_string(snap.join("cluster.json")).unwrap()).unwrap();
    let stop_at = m["stop_at_unix_ns"].as_i64().unwrap();
    let stops: Vec<i64> = m["vms"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v["snapshot"]["paused_unix_ns"].as_i64().unwrap())
        .collect();
    assert!(stops.iter().all(|&t| t >= stop_at), "{m}");
    assert!(m["pause_spread_s"].as_f64().unwrap() < 0.5, "{m}");
    // The client sends to both servers over its own connections: it depends on them,
    // their replies do not make them depend on it.
    let g: Value =
        serde_json::from_str(&env.ok(&["cluster", "graph", snap.to_str().unwrap(), "--json"]))
            .unwrap();
    let edges: Vec<(String, String)> = g["rdg"]["edges"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| {
            (
                e["sender"].as_str().unwrap().to_string(),
                e["receiver"].as_str().unwrap().to_string(),
            )
        })
        .collect();
    assert_eq!(
        edges,
        vec![
            ("client".into(), "s1".into()),
            ("client".into(), "s2".into())
        ],
        "{g}"
    );
    let svg = env.home.path().join("g.svg");
    env.ok(&[
        "cluster",
        "graph",
        snap.to_str().unwrap(),
        "--svg",
        svg.to_str().unwrap(),
    ]);
    let svg = std::fs::read_to_string(svg).unwrap();
    assert!(svg.contains("<svg") && svg.contains("client"), "{svg}");

    restore_faults_before_anything_is_touched(&env, &name, &snap);
    // Restored on the restore line: the servers start before the client that sends to
    // them, and the client reaches both again.
    let snap_s = snap.to_str().unwrap();
    let e = env.fails(&["cluster", "restore", &name, "--from", snap_s]);
    assert!(e.contains("--replace"), "{e}");
    let out: Value = serde_json::from_str(&env.ok(&[
        "cluster",
        "restore",
        &name,
        "--from",
        snap_s,
        "--variant",
        "line",
        "--replace",
        "--json",
    ]))
    .unwrap();
    assert_eq!(out["report"]["outcome"]["result"], "restored", "{out}");
    let start = |vm: &str| report_vm(&out, vm)["start_s"].as_f64().unwrap();
    assert!(
        start("s1") <= start("client") && start("s2") <= start("client"),
        "{out}"
    );
    assert_eq!(
        out["disruption"]["vms"].as_array().unwrap().len(),
        3,
        "{out}"
    );
    common::eventually(
        Duration::from_secs(60),
        "the restored client to reach both servers",
        || {
            let r = ask_at("10.79.3.11", "QUERY r")?;
            r.starts_with("RESULT r 2 ").then_some(())
        },
    );

    a_cohort_host_dying_mid_restore_aborts_its_peers(&env, &name, &snap);

    env.ok(&["cluster", "rm", &name]);
    assert!(!namespaces().contains(&netns("h1")), "{}", namespaces());
    let e = env.fails(&["cluster", "status", &name]);
    assert!(e.contains("no cluster"), "{e}");
}

/// Every VM of every host, as `cluster status` reads them from the cluster store.
fn store_vms(env: &Env, name: &str) -> Vec<Value> {
    let st: Value = serde_json::from_str(&env.ok(&["cluster", "status", name, "--json"])).unwrap();
    st["hosts"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|h| h["vms"].as_array().unwrap().clone())
        .collect()
}

/// One VM's entry in a `cluster restore --json` report.
fn report_vm<'a>(out: &'a Value, vm: &str) -> &'a Value {
    out["report"]["vms"]
        .as_array()
        .unwrap()
        .iter()
        .find(|v| v["vm"] == vm)
        .unwrap_or_else(|| panic!("no VM {vm} in {out}"))
}

/// A cluster snapshot that does not match the cluster, or whose constraints cannot be
/// met, is refused in one line before any VM is touched.
fn restore_faults_before_anything_is_touched(env: &Env, name: &str, snap: &std::path::Path) {
    let manifest = snap.join("cluster.json");
    let original = std::fs::read_to_string(&manifest).unwrap();
    let snap_s = snap.to_str().unwrap();
    let restore = || env.fails(&["cluster", "restore", name, "--from", snap_s, "--replace"]);
    let mut m: Value = serde_json::from_str(&original).unwrap();
    // s1's entry points at s2's snapshot.
    for v in m["vms"].as_array_mut().unwrap() {
        if v["vm"] == "s1" {
            v["dir"] = "s2".into();
        }
    }
    std::fs::write(&manifest, m.to_string()).unwrap();
    let e = restore();
    assert!(e.contains("not of VM \"s1\""), "{e}");
    // A snapshot directory that is not there.
    let mut m: Value = serde_json::from_str(&original).unwrap();
    m["vms"][1]["dir"] = "gone".into();
    std::fs::write(&manifest, m.to_string()).unwrap();
    let e = restore();
    assert!(
        e.contains("the snapshot of VM") && e.contains("gone"),
        "{e}"
    );
    // A VM the cluster does not have.
    let mut m: Value = serde_json::from_str(&original).unwrap();
    let mut ghost = m["vms"][0].clone();
    ghost["vm"] = "ghost".into();
    m["vms"].as_array_mut().unwrap().push(ghost);
    std::fs::write(&manifest, m.to_string()).unwrap();
    let e = restore();
    assert!(e.contains("\"ghost\""), "{e}");
    for bad in [
        "",
        "{",
        "{\"format\": \"rebound-cluster-snapshot\", \"version\": 9}",
    ] {
        std::fs::write(&manifest, bad).unwrap();
        let e = restore();
        assert_eq!(e.trim().lines().count(), 1, "{e}");
    }
    std::fs::write(&manifest, &original).unwrap();
    // Loading every page would take microseconds at this rate, yet a server must be up
    // a whole margin before the client: with no VM waiting after its load (the paper's
    // model), no restore line exists.
    let e = env.fails(&[
        "cluster",
        "restore",
        name,
        "--from",
        snap_s,
        "--replace",
        "--load-rate",
        "1e9",
        "--margin-s",
        "0.5",
        "--no-wait",
    ]);
    assert!(
        e.contains("No restore line exists") && e.contains("client"),
        "{e}"
    );
    // Nothing was touched: every VM still runs, as the hosts' daemons published in
    // the cluster store.
    let vms = store_vms(env, name);
    assert_eq!(vms.len(), 3, "{vms:?}");
    for v in vms {
        assert_eq!(v["state"], "running", "{v}");
    }
}

/// The daemon of the servers' host is killed while the cluster restores: its lease
/// expires, the coordinator (elected again if it was that host's) aborts the restore
/// naming the host, reports its VMs as unknown and the client, which waits for them,
/// is dropped by its host; the cluster can still be removed.
fn a_cohort_host_dying_mid_restore_aborts_its_peers(env: &Env, name: &str, snap: &std::path::Path) {
    let host = |h: &str| {
        rebound::client::Client::new(
            &env.home
                .path()
                .join("clusters")
                .join(name)
                .join("hosts")
                .join(h)
                .join("reboundd.sock"),
        )
    };
    let rt = tokio::runtime::Runtime::new().unwrap();
    let get = |h: &str, path: &str| -> Option<Value> {
        rt.block_on(host(h).call(hyper::Method::GET, path, None))
            .ok()
    };
    let pid = get("h2", "/v1/health").unwrap()["pid"].as_u64().unwrap();
    let old_s1 = get("h2", "/v1/vms/s1").unwrap()["qemu_pid"]
        .as_u64()
        .unwrap();
    let mut child = env
        .cmd(&[
            "cluster",
            "restore",
            name,
            "--from",
            snap.to_str().unwrap(),
            "--variant",
            "line",
            "--replace",
            "--json",
        ])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // Once the servers' host is loading a new s1 (a new QEMU: --replace removed the old
    // one), its daemon dies. Polled fast: the client cannot start before the servers,
    // but the servers load in well under a second.
    let t0 = std::time::Instant::now();
    loop {
        let new_s1 = get("h2", "/v1/vms/s1")
            .and_then(|v| v["qemu_pid"].as_u64())
            .is_some_and(|p| p != old_s1);
        if new_s1 {
            break;
        }
        if child.try_wait().unwrap().is_some() {
            let o = child.wait_with_output().unwrap();
            panic!(
                "the restore ended before h2 loaded a new s1: {}{}",
                String::from_utf8_lossy(&o.stdout),
                String::from_utf8_lossy(&o.stderr)
            );
        }
        if t0.elapsed() > Duration::from_secs(90) {
            let _ = child.kill();
            let o = child.wait_with_output().unwrap();
            panic!(
                "h2 did not load a new s1 within 90 s; the restore said: {}{}",
                String::from_utf8_lossy(&o.stdout),
                String::from_utf8_lossy(&o.stderr)
            );
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    let k = Command::new("kill")
        .args(["-KILL", &pid.to_string()])
        .status()
        .unwrap();
    assert!(k.success());
    let o = child.wait_with_output().unwrap();
    assert!(
        !o.status.success(),
        "{}",
        String::from_utf8_lossy(&o.stdout)
    );
    let out: Value = serde_json::from_slice(&o.stdout).unwrap_or_else(|e| {
        panic!(
            "{e}: {}{}",
            String::from_utf8_lossy(&o.stdout),
            String::from_utf8_lossy(&o.stderr)
        )
    });
    assert_eq!(out["report"]["outcome"]["result"], "aborted", "{out}");
    let reason = out["report"]["outcome"]["reason"].as_str().unwrap();
    assert!(reason.contains("host h2's lease expired"), "{out}");
    let state = |vm: &str| report_vm(&out, vm)["state"].as_str().unwrap().to_string();
    assert_eq!(state("client"), "aborted", "{out}");
    assert_eq!(state("s1"), "unknown", "{out}");
    assert_eq!(state("s2"), "unknown", "{out}");
    let r = get("h1", "/v1/vms/client");
    assert!(r.is_none(), "the aborted client is still on h1: {r:?}");
}

/// Sends `line` to a guest's peer port at its cluster address.
fn ask_at(ip: &str, line: &str) -> Option<String> {
    ask_addr(format!("{ip}:7400").parse().ok()?, line)
}

/// Removes a cluster (its VMs, daemons and namespaces) even when a test fails.
struct ClusterRm<'a>(&'a Env, String);

impl Drop for ClusterRm<'_> {
    fn drop(&mut self) {
        let _ = self.0.cmd(&["cluster", "rm", &self.1]).output();
    }
}
