//! A cluster across three simulated hosts as `rebound cluster create/start` make it:
//! a network namespace per host with its own daemon and its own member of a
//! three-member etcd (mutual TLS, one certificate per host), real guests. The restore
//! protocol runs through the store, and each of its failure rules is produced for
//! real, not faked:
//! - restored on the line while the etcd leader's member is SIGKILLed;
//! - malformed records written by hand with `etcdctl`: refused, nothing started;
//! - the coordinator's daemon SIGKILLed after some VMs started: another host's
//!   daemon finishes the restore, no VM starts twice, the running ones keep their QEMU;
//! - a host cut off (its veth down): the restore aborts naming it and the VMs held
//!   on the other hosts are released;
//! - a cohort host's daemon killed: the same, named by its expired lease.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

use rebound_coord::layout;

use crate::cluster_net::ask_at;
use crate::common::etcd::{etcdctl, etcdctl_cmd};
use crate::common::{self, Env};

/// The cluster network; the hosts take .201-.203 (the spec's default).
const NET: &str = "10.79.4";
/// Each VM's host.
const VMS: [(&str, &str); 3] = [("client", "h1"), ("s1", "h2"), ("s2", "h3")];

fn host_of(vm: &str) -> &'static str {
    VMS.iter().find(|(v, _)| *v == vm).unwrap().1
}

/// One cluster of this test, seen from the machine (as its operator).
struct Sim<'a> {
    env: &'a Env,
    name: String,
    rt: tokio::runtime::Runtime,
}

impl Sim<'_> {
    fn dir(&self) -> PathBuf {
        self.env.home.path().join("clusters").join(&self.name)
    }

    fn host_home(&self, h: &str) -> PathBuf {
        self.dir().join("hosts").join(h)
    }

    /// A GET of host `h`'s daemon on its unix socket (`None` unless it answers 2xx).
    fn get(&self, h: &str, path: &str) -> Option<Value> {
        let c = rebound::client::Client::new(&self.host_home(h).join("reboundd.sock"));
        self.rt
            .block_on(c.call(hyper::Method::GET, path, None))
            .ok()
    }

    fn qemu_pid(&self, vm: &str) -> Option<u64> {
        self.get(host_of(vm), &format!("/v1/vms/{vm}"))?["qemu_pid"].as_u64()
    }

    /// How many times VM `vm`'s guest was resumed (started) by its daemon.
    fn resumes(&self, vm: &str) -> usize {
        let evs = self
            .get(
                host_of(vm),
                &format!("/v1/vms/{vm}/events?since=0&limit=10000"),
            )
            .unwrap_or_else(|| panic!("no events of {vm}"));
        evs.as_array()
            .unwrap()
            .iter()
            .filter(|e| e["kind"] == "resumed")
            .count()
    }

    fn endpoints(&self) -> Vec<String> {
        (1..=3)
            .map(|i| format!("https://{NET}.20{i}:2379"))
            .collect()
    }

    /// `etcdctl` as the operator (`root`), on every member, arguments to follow.
    fn etcdctl_cmd(&self) -> Command {
        let pki = self.dir().join("pki");
        etcdctl_cmd(
            &self.endpoints(),
            &pki.join("ca.crt"),
            &pki.join("root.crt"),
            &pki.join("root.key"),
        )
    }

    fn etcdctl(&self, args: &[&str]) -> Output {
        self.etcdctl_cmd().args(args).output().expect("run etcdctl")
    }

    fn etcdctl_ok(&self, args: &[&str]) -> String {
        let o = self.etcdctl(args);
        assert!(o.status.success(), "etcdctl {args:?}: {}", text(&o));
        String::from_utf8_lossy(&o.stdout).into_owned()
    }

    /// Every key under `prefix` with its value (our records are one line each).
    fn records(&self, prefix: &str) -> BTreeMap<String, String> {
        let o = self.etcdctl(&["get", prefix, "--prefix"]);
        if !o.status.success() {
            return BTreeMap::new();
        }
        let out = String::from_utf8_lossy(&o.stdout).into_owned();
        let lines: Vec<&str> = out.lines().collect();
        lines
            .chunks(2)
            .filter(|c| c.len() == 2)
            .map(|c| (c[0].to_string(), c[1].to_string()))
            .collect()
    }

    /// Each VM's phase in restore `id`.
    fn phases(&self, id: &str) -> BTreeMap<String, String> {
        self.records(&layout::phases(id))
            .into_values()
            .filter_map(|v| serde_json::from_str::<Value>(&v).ok())
            .map(|r| {
                (
                    r["vm"].as_str().unwrap().to_string(),
                    r["phase"].as_str().unwrap().to_string(),
                )
            })
            .collect()
    }

    fn state(&self, id: &str) -> Option<Value> {
        let v = self.records(&layout::state(id));
        serde_json::from_str(v.values().next()?).ok()
    }

    fn status(&self) -> Value {
        serde_json::from_str(&self.env.ok(&["cluster", "status", &self.name, "--json"])).unwrap()
    }

    /// Whether host `h` is live, as `cluster status` says (false while the store
    /// does not answer).
    fn live(&self, h: &str) -> bool {
        let o = self
            .env
            .cmd(&["cluster", "status", &self.name, "--json"])
            .output()
            .unwrap();
        let st: Value = serde_json::from_slice(&o.stdout).unwrap_or_default();
        st["hosts"]
            .as_array()
            .is_some_and(|hs| hs.iter().any(|x| x["host"] == h && x["live"] == true))
    }

    /// `cluster restore` from `snap` on the line, running (its JSON comes from `finish`).
    fn spawn_restore(&self, snap: &Path, margin_s: &str) -> Child {
        self.spawn_restore_on(snap, margin_s, "page-cache")
    }

    /// The same, each VM's pages reaching its guest on `path` (`--path`).
    fn spawn_restore_on(&self, snap: &Path, margin_s: &str, path: &str) -> Child {
        self.env
            .cmd(&[
                "cluster",
                "restore",
                &self.name,
                "--from",
                snap.to_str().unwrap(),
                "--variant",
                "line",
                "--margin-s",
                margin_s,
                "--path",
                path,
                "--replace",
                "--json",
            ])
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap()
    }

    /// The restore that is active now (the one `child` submitted).
    fn active_restore(&self, child: &mut Child) -> String {
        let t0 = Instant::now();
        loop {
            let st = self.records(&layout::restores());
            let active = st.iter().find_map(|(k, v)| {
                let id = k
                    .strip_prefix(&layout::restores())?
                    .strip_suffix("/state")?;
                let s: Value = serde_json::from_str(v).ok()?;
                (s["status"] == "active").then(|| id.to_string())
            });
            if let Some(id) = active {
                return id;
            }
            if let Some(st) = child.try_wait().unwrap() {
                panic!(
                    "the restore ended ({st}) before it was seen active: {}",
                    finish_text(child)
                );
            }
            assert!(
                t0.elapsed() < Duration::from_secs(90),
                "no restore became active within 90 s"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// The leader of the store's members, as the members that answer see it.
    fn etcd_leader(&self) -> String {
        common::eventually(Duration::from_secs(30), "an etcd leader", || {
            let o = self.etcdctl(&["endpoint", "status", "-w", "json"]);
            let v: Value = serde_json::from_slice(&o.stdout).ok()?;
            let s = v.as_array()?.iter().find(|e| {
                e["Status"]["leader"].as_u64().is_some()
                    && e["Status"]["leader"] == e["Status"]["header"]["member_id"]
            })?;
            let ep = s["Endpoint"].as_str()?;
            let i = self.endpoints().iter().position(|e| e == ep)?;
            Some(format!("h{}", i + 1))
        })
    }

    /// The veth joining host `h` to the backbone (down: the host is cut off).
    fn link(&self, h: &str, state: &str) {
        let l = format!(
            "rbv{:08x}",
            rebound_api::nic::short_hash(&format!("{}/{h}", self.name))
        );
        let o = Command::new("ip")
            .args(["link", "set", &l, state])
            .output()
            .unwrap();
        assert!(o.status.success(), "ip link set {l} {state}: {}", text(&o));
    }
}

/// Waits until the client's QUERY (tagged `tag`) is answered by both servers,
/// across the hosts.
fn client_reaches_both_servers(what: &str, tag: &str) {
    common::eventually(Duration::from_secs(60), what, || {
        let r = ask_at(&format!("{NET}.11"), &format!("QUERY {tag}"))?;
        r.starts_with(&format!("RESULT {tag} 2 ")).then_some(())
    });
}

fn kill9(pid: u64) {
    let k = Command::new("kill")
        .args(["-KILL", &pid.to_string()])
        .status()
        .unwrap();
    assert!(k.success(), "kill {pid}");
}

fn text(o: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

fn finish_text(child: &mut Child) -> String {
    let mut s = String::new();
    if let Some(mut o) = child.stdout.take() {
        let _ = std::io::Read::read_to_string(&mut o, &mut s);
    }
    if let Some(mut e) = child.stderr.take() {
        let _ = std::io::Read::read_to_string(&mut e, &mut s);
    }
    s
}

/// Waits for a `cluster restore --json` and returns its JSON (which it prints
/// whether the restore completed or not) and whether it exited 0.
fn finish(child: Child) -> (Value, bool) {
    let o = child.wait_with_output().unwrap();
    let v = serde_json::from_slice(&o.stdout)
        .unwrap_or_else(|e| panic!("{e}: the restore said: {}", text(&o)));
    (v, o.status.success())
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

fn restored(out: &Value, ok: bool) {
    assert!(ok, "{out}");
    assert_eq!(out["report"]["outcome"]["result"], "restored", "{out}");
}

#[test]
fn a_cluster_on_three_hosts_restores_through_its_store_and_survives_each_failure_rule() {
    let env = Env::new();
    let name = format!("s{}", std::process::id());
    let file = env.home.path().join("cluster.toml");
    std::fs::write(
        &file,
        format!(
            r#"
[network]
subnet = "{NET}.0/24"
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
[[host]]
name = "h3"
simulated = true
[[vm]]
name = "client"
host = "h1"
[[vm]]
name = "s1"
host = "h2"
[[vm]]
name = "s2"
host = "h3"
"#
        ),
    )
    .unwrap();
    env.ok(&["cluster", "create", &name, "--file", file.to_str().unwrap()]);
    let _cleanup = ClusterRm(&env, name.clone());
    let sim = Sim {
        env: &env,
        name: name.clone(),
        rt: tokio::runtime::Runtime::new().unwrap(),
    };
    env.ok(&["cluster", "start", &name]);
    client_reaches_both_servers("the client to reach both servers", "q");
    // One etcd member per host, each in its namespace; each host's daemon is live.
    let members = sim.etcdctl_ok(&["member", "list"]);
    for h in ["h1", "h2", "h3"] {
        assert!(members.contains(&format!(", {h}, ")), "{members}");
        assert!(sim.live(h), "{h}: {}", sim.status());
    }
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

    let first = the_line_restores_with_the_etcd_leader_killed(&sim, &snap);
    the_line_restores_on_the_page_server(&sim, &snap);
    malformed_records_are_refused_and_start_nothing(&sim, &first);
    the_coordinators_daemon_killed_after_some_vms_started(&sim, &snap);
    a_host_cut_off_aborts_the_restore_and_releases_held_vms(&sim, &snap);
    a_cohort_hosts_daemon_dying_aborts_its_peers(&sim, &snap);

    env.ok(&["cluster", "rm", &name]);
    let ns = Command::new("ip").args(["netns", "list"]).output().unwrap();
    assert!(
        !String::from_utf8_lossy(&ns.stdout).contains(&format!("rb-{name}-")),
        "{}",
        text(&ns)
    );
}

/// Restored on the line (the servers before the client that sends to them) while
/// the store's leader member is SIGKILLed: the other two elect a leader and the
/// restore completes; `cluster start` brings the member back on its data.
fn the_line_restores_with_the_etcd_leader_killed(sim: &Sim<'_>, snap: &Path) -> String {
    let mut child = sim.spawn_restore(snap, "2");
    let id = sim.active_restore(&mut child);
    let leader = sim.etcd_leader();
    let pidfile = sim.host_home(&leader).join("etcd.pid");
    let pid: u64 = std::fs::read_to_string(&pidfile)
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    kill9(pid);
    let (out, ok) = finish(child);
    restored(&out, ok);
    assert_eq!(out["report"]["restore_id"], id.as_str(), "{out}");
    let start = |vm: &str| report_vm(&out, vm)["start_s"].as_f64().unwrap();
    assert!(
        start("s1") <= start("client") && start("s2") <= start("client"),
        "{out}"
    );
    // The member was really gone for the restore: it is back only once started again.
    let o = etcdctl(
        &[format!("https://{NET}.20{}:2379", &leader[1..])],
        &sim.dir().join("pki/ca.crt"),
        &sim.dir().join("pki/root.crt"),
        &sim.dir().join("pki/root.key"),
        &["endpoint", "health"],
    );
    assert!(
        !o.status.success(),
        "{leader}'s member answers: {}",
        text(&o)
    );
    sim.env.ok(&["cluster", "start", &sim.name]);
    common::eventually(
        Duration::from_secs(30),
        "every member healthy again",
        || {
            sim.etcdctl(&["endpoint", "health"])
                .status
                .success()
                .then_some(())
        },
    );
    client_reaches_both_servers("the restored client to reach both servers", "r");
    id
}

/// The line with every VM's pages served through postcopy by its host's page server:
/// each VM's report names that path and has every page in place (the server's end),
/// and the restored client reaches both servers.
fn the_line_restores_on_the_page_server(sim: &Sim<'_>, snap: &Path) {
    let (out, ok) = finish(sim.spawn_restore_on(snap, "0.05", "page-server"));
    restored(&out, ok);
    for vm in ["client", "s1", "s2"] {
        let r = sim
            .get(host_of(vm), &format!("/v1/vms/{vm}/restore"))
            .unwrap_or_else(|| panic!("no restore report of {vm}"));
        assert_eq!(r["path"], "page-server", "{vm}: {r}");
        assert!(r["memory_loaded_s"].as_f64().is_some(), "{vm}: {r}");
    }
    client_reaches_both_servers(
        "the client restored on the page server to reach both servers",
        "p",
    );
}

/// Plans written by hand into the store, each a real plan (the first restore's) with
/// one defect, and granted to the hosts as a real submit would: every daemon refuses
/// them with a reason, `cluster status` shows each refused and why, and nothing is
/// started or written for them.
fn malformed_records_are_refused_and_start_nothing(sim: &Sim<'_>, first: &str) {
    let plans = sim.records(&layout::plan(first));
    let plan = plans
        .values()
        .next()
        .expect("the first restore's plan")
        .clone();
    assert!(plan.contains("\"format\":1"), "{plan}");
    let pids: Vec<Option<u64>> = VMS.iter().map(|(v, _)| sim.qemu_pid(v)).collect();
    // (restore, records in the order written): the state goes first, so no daemon
    // ever sees that restore's good plan without it.
    let plan_of = layout::plan;
    // Each a good plan filed under its own restore, but for its one defect.
    let good = |id: &str| plan.replace(first, id);
    let bad: Vec<(&str, Vec<(String, String)>)> = vec![
        (
            "bad-trunc",
            vec![(plan_of("bad-trunc"), {
                let p = good("bad-trunc");
                p[..p.len() / 2].to_string()
            })],
        ),
        (
            "bad-version",
            vec![(
                plan_of("bad-version"),
                good("bad-version").replacen("\"format\":1", "\"format\":9", 1),
            )],
        ),
        (
            "bad-field",
            vec![(
                plan_of("bad-field"),
                good("bad-field").replacen('{', "{\"extra\":1,", 1),
            )],
        ),
        (
            "bad-vm",
            vec![(
                plan_of("bad-vm"),
                good("bad-vm").replacen("\"vm\":\"client\"", "\"vm\":\"../client\"", 1),
            )],
        ),
        // Whole and valid, but the first restore's plan filed under another key.
        ("bad-key", vec![(plan_of("bad-key"), plan.clone())]),
        // A good plan whose state is over its size cap.
        (
            "bad-state",
            vec![
                (
                    layout::state("bad-state"),
                    format!("{{\"format\":1,\"pad\":\"{}\"}}", "x".repeat(100_000)),
                ),
                (plan_of("bad-state"), good("bad-state")),
            ],
        ),
    ];
    let hosts: Vec<String> = ["h1", "h2", "h3"].iter().map(|h| h.to_string()).collect();
    let pki = sim.dir().join("pki");
    let tls = rebound_store::access::TlsFiles {
        ca: pki.join("ca.crt"),
        cert: pki.join("root.crt"),
        key: pki.join("root.key"),
    };
    sim.rt.block_on(async {
        let mut a = rebound_store::access::connect(&sim.endpoints(), &tls)
            .await
            .unwrap();
        for (id, _) in &bad {
            rebound_store::access::grant_restore(&mut a, id, &hosts)
                .await
                .unwrap();
        }
    });
    for (key, value) in bad.iter().flat_map(|(_, recs)| recs) {
        // etcdctl reads the value from stdin when none is given.
        let mut c = sim.etcdctl_cmd();
        c.args(["put", key])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        let mut p = c.spawn().unwrap();
        std::io::Write::write_all(p.stdin.as_mut().unwrap(), value.as_bytes()).unwrap();
        drop(p.stdin.take());
        let o = p.wait_with_output().unwrap();
        assert!(o.status.success(), "put {key}: {}", text(&o));
    }
    let refused = common::eventually(
        Duration::from_secs(20),
        "cluster status to show every bad plan refused",
        || {
            let st = sim.status();
            let rs = st["restores"].as_array()?.clone();
            let mine: Vec<Value> = rs
                .into_iter()
                .filter(|r| {
                    r["restore_id"]
                        .as_str()
                        .is_some_and(|i| i.starts_with("bad-"))
                })
                .collect();
            (mine.len() == bad.len() && mine.iter().all(|r| r["status"] == "refused"))
                .then_some(mine)
        },
    );
    for r in &refused {
        let id = r["restore_id"].as_str().unwrap();
        let reason = r["reason"].as_str().unwrap_or_default();
        assert!(reason.contains(&layout::restore(id)), "{id}: {r}");
        let why = match id {
            "bad-trunc" => "EOF",
            "bad-version" => "format 9",
            "bad-field" => "extra",
            "bad-vm" => "../client",
            "bad-key" => first,
            _ => "over its 65536-byte cap",
        };
        assert!(reason.contains(why), "{id}: {reason}");
    }
    // Every daemon saw them and said why it will not act (a coordinator would have
    // written a state within milliseconds of the plan).
    std::thread::sleep(Duration::from_secs(3));
    for h in ["h1", "h2", "h3"] {
        let log = std::fs::read_to_string(sim.host_home(h).join("reboundd.log")).unwrap();
        for (id, _) in &bad {
            assert!(
                log.lines()
                    .any(|l| l.contains("refused a restore's record") && l.contains(id)),
                "{h} did not log refusing {id}"
            );
        }
    }
    for (id, recs) in &bad {
        let keys: Vec<String> = sim.records(&layout::restore(id)).into_keys().collect();
        let mut written: Vec<String> = recs.iter().map(|(k, _)| k.clone()).collect();
        written.sort();
        assert_eq!(keys, written, "{id}: something was written for it");
        assert!(
            sim.records(&layout::phases(id)).is_empty(),
            "{id}: a phase was written for it"
        );
    }
    let now: Vec<Option<u64>> = VMS.iter().map(|(v, _)| sim.qemu_pid(v)).collect();
    assert_eq!(pids, now, "a VM was replaced");
    sim.rt.block_on(async {
        let mut a = rebound_store::access::connect(&sim.endpoints(), &tls)
            .await
            .unwrap();
        for (id, _) in &bad {
            rebound_store::access::revoke_restore(&mut a, id)
                .await
                .unwrap();
        }
    });
    sim.etcdctl_ok(&["del", "--prefix", &format!("{}bad-", layout::restores())]);
}

/// The coordinator's daemon is SIGKILLed once a server has started and while the
/// client waits for its instant on the line, and is started again at once (its
/// host stays in the cluster). The coordinator's lease expires, another host's
/// daemon wins the election, reads the recorded phases and finishes the restore: a
/// VM that started before keeps its QEMU, and no guest is started twice.
fn the_coordinators_daemon_killed_after_some_vms_started(sim: &Sim<'_>, snap: &Path) {
    let t0 = Instant::now();
    let mut child = sim.spawn_restore(snap, "5");
    let id = sim.active_restore(&mut child);
    let (started, coordinator) = loop {
        let ph = sim.phases(&id);
        let up: Vec<String> = ph
            .iter()
            .filter(|(_, p)| matches!(p.as_str(), "started" | "restored"))
            .map(|(v, _)| v.clone())
            .collect();
        assert!(
            !up.contains(&"client".to_string()),
            "the client started before a server was seen started: {ph:?}"
        );
        if !up.is_empty() {
            let st = sim.state(&id).expect("the restore's state");
            let c = st["coordinators"].as_array().unwrap();
            break (up, c.last().unwrap().as_str().unwrap().to_string());
        }
        if let Some(st) = child.try_wait().unwrap() {
            panic!("the restore ended ({st}): {}", finish_text(&mut child));
        }
        assert!(
            t0.elapsed() < Duration::from_secs(90),
            "no VM started: {ph:?}"
        );
        std::thread::sleep(Duration::from_millis(20));
    };
    let before: Vec<(String, u64)> = started
        .iter()
        .map(|v| (v.clone(), sim.qemu_pid(v).expect("a started VM's QEMU")))
        .collect();
    let daemon = sim.get(&coordinator, "/v1/health").unwrap()["pid"]
        .as_u64()
        .unwrap();
    kill9(daemon);
    eprintln!("killed coordinator {coordinator}'s daemon with {started:?} started");
    sim.env.ok(&["cluster", "start", &sim.name]);
    let (out, ok) = finish(child);
    restored(&out, ok);
    let coords: Vec<&str> = out["report"]["coordinators"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c.as_str().unwrap())
        .collect();
    assert!(
        coords.len() >= 2 && coords[0] == coordinator && *coords.last().unwrap() != coordinator,
        "{out}"
    );
    for (vm, pid) in &before {
        assert_eq!(sim.qemu_pid(vm), Some(*pid), "{vm} was started again");
    }
    for (vm, _) in VMS {
        let st = sim.get(host_of(vm), &format!("/v1/vms/{vm}")).unwrap();
        assert_eq!(st["state"], "running", "{vm}: {st}");
        assert_eq!(sim.resumes(vm), 1, "{vm}");
    }
    client_reaches_both_servers("the client to reach both servers after the failover", "f");
}

/// Host h3 is cut off (its veth down) once the restore is in the store: h3 cannot
/// report s2, its host's lease expires, the restore aborts naming h3, and the
/// client, held on h1 for the servers, is released (its QEMU gone). Joined
/// again, h3 is live again. (Cut before the plan is in the store, the submit
/// itself is refused, rightly, for a host with no live lease.)
fn a_host_cut_off_aborts_the_restore_and_releases_held_vms(sim: &Sim<'_>, snap: &Path) {
    let mut child = sim.spawn_restore(snap, "2");
    sim.active_restore(&mut child);
    sim.link("h3", "down");
    let (out, ok) = finish(child);
    sim.link("h3", "up");
    assert!(!ok, "{out}");
    assert_eq!(out["report"]["outcome"]["result"], "aborted", "{out}");
    let reason = out["report"]["outcome"]["reason"].as_str().unwrap();
    assert!(reason.contains("host h3's lease expired"), "{out}");
    assert_eq!(report_vm(&out, "client")["state"], "aborted", "{out}");
    assert!(
        sim.get("h1", "/v1/vms/client").is_none(),
        "the held client is still on h1"
    );
    // s1 was either started before the abort (a started VM is never stopped) or
    // released like the client.
    match report_vm(&out, "s1")["state"].as_str().unwrap() {
        "aborted" => assert!(sim.get("h2", "/v1/vms/s1").is_none()),
        _ => assert_eq!(sim.get("h2", "/v1/vms/s1").unwrap()["state"], "running"),
    }
    common::eventually(Duration::from_secs(60), "h3 to be live again", || {
        sim.live("h3").then_some(())
    });
    // Whatever h3 held for the aborted restore, it lets go once it sees the abort.
    common::eventually(Duration::from_secs(60), "h3 to release s2", || {
        sim.get("h3", "/v1/vms/s2").is_none().then_some(())
    });
}

/// The daemon of a server's host is killed while the cluster restores: its lease
/// expires, the coordinator (elected again if it was that host's) aborts the restore
/// naming the host, reports its VM as unknown, and the client, which waits for it,
/// is dropped by its host.
fn a_cohort_hosts_daemon_dying_aborts_its_peers(sim: &Sim<'_>, snap: &Path) {
    let pid = sim.get("h2", "/v1/health").unwrap()["pid"]
        .as_u64()
        .unwrap();
    let old_s1 = sim.qemu_pid("s1");
    let mut child = sim.spawn_restore(snap, "2");
    // Once h2 is loading a new s1 (a new QEMU: --replace removed the old one), its
    // daemon dies. Polled fast: the servers load in well under a second.
    let t0 = Instant::now();
    while sim.qemu_pid("s1").is_none_or(|p| Some(p) == old_s1) {
        if let Some(st) = child.try_wait().unwrap() {
            panic!(
                "the restore ended ({st}) before h2 loaded a new s1: {}",
                finish_text(&mut child)
            );
        }
        assert!(
            t0.elapsed() < Duration::from_secs(90),
            "h2 did not load a new s1"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    kill9(pid);
    let (out, ok) = finish(child);
    assert!(!ok, "{out}");
    assert_eq!(out["report"]["outcome"]["result"], "aborted", "{out}");
    let reason = out["report"]["outcome"]["reason"].as_str().unwrap();
    assert!(reason.contains("host h2's lease expired"), "{out}");
    assert_eq!(report_vm(&out, "client")["state"], "aborted", "{out}");
    assert_eq!(report_vm(&out, "s1")["state"], "unknown", "{out}");
    assert!(sim.get("h1", "/v1/vms/client").is_none());
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

/// Removes a cluster (its VMs, daemons, store and namespaces) even when a test fails.
struct ClusterRm<'a>(&'a Env, String);

impl Drop for ClusterRm<'_> {
    fn drop(&mut self) {
        let _ = self.0.cmd(&["cluster", "rm", &self.1]).output();
    }
}
