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
pub(crate) fn ask_addr(addr: std::net::SocketAddr, line: &str) -> Option<String> {
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

/// Sends `line` to a guest's peer port at its cluster address.
pub(crate) fn ask_at(ip: &str, line: &str) -> Option<String> {
    ask_addr(format!("{ip}:7400").parse().ok()?, line)
}
