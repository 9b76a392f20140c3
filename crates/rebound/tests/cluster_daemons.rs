//! Daemons joining a cluster over authenticated TCP, with real guests: two daemons
//! on 127.0.0.1 (each `--listen 127.0.0.1:PORT --cluster-token FILE`) and a
//! coordinator-only one (`--cluster-token` alone).
//!
//! - The API relay starts a guest on the second daemon and drives it there; a
//!   stranger's token is refused and the guest untouched; `/v1/daemon/shutdown` is
//!   refused through the relay.
//! - A real cluster restore of two kv guests across the two daemons, B depending on
//!   A: both are held, A starts before B (the report's start instants and the VMs'
//!   own `resumed` events), and the restored kv guests serve their keys.
//! - A coordinator killed after LOAD leaves no VM held past the cohort's hold
//!   timeout, and the cohort says why.
//! - A plan naming a missing snapshot fails in one line naming it; nothing is left.

use crate::common;

use std::path::Path;
use std::process::{Child, Stdio};
use std::time::{Duration, Instant};

use common::{eventually, free_port, kv, Env};
use rebound_coord::relay::{self, ApiAnswer, RelayError};
use rebound_coord::wire::WireError;
use rebound_coord::ClusterToken;
use serde_json::{json, Value};

const HOLD_S: &str = "3";

/// A daemon run in the foreground by the test, its log in its home.
struct Daemon {
    child: Child,
    addr: Option<String>,
}

impl Daemon {
    fn log(env: &Env) -> std::path::PathBuf {
        env.home.path().join("daemon-fg.log")
    }

    fn start(env: &Env, token: &Path, listen: bool) -> Daemon {
        let addr = listen.then(|| format!("127.0.0.1:{}", free_port()));
        let mut args = vec!["daemon".to_string()];
        if let Some(a) = &addr {
            args.extend(["--listen".into(), a.clone()]);
            args.extend(["--cluster-hold-timeout".into(), HOLD_S.into()]);
        }
        args.extend([
            "--cluster-token".into(),
            token.to_str().unwrap().to_string(),
        ]);
        let log = std::fs::File::create(Self::log(env)).unwrap();
        let child = env
            .cmd(&args.iter().map(String::as_str).collect::<Vec<_>>())
            .env("RUST_LOG", "info")
            .stdin(Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .unwrap();
        eventually(Duration::from_secs(20), "the daemon to answer", || {
            env.call("GET", "/v1/health", None).ok().map(|_| ())
        });
        Daemon { child, addr }
    }

    fn addr(&self) -> &str {
        self.addr.as_deref().unwrap()
    }
}

/// One relayed call, checked against the spec like every other call of the tests.
fn relayed(
    env: &Env,
    rt: &tokio::runtime::Runtime,
    addr: &str,
    token: &ClusterToken,
    method: &str,
    path: &str,
    body: Option<&Value>,
) -> Result<ApiAnswer, RelayError> {
    env.api.check_request(method, path, body).unwrap();
    let a = rt.block_on(relay::call(addr, token, method, path, body))?;
    let bytes = serde_json::to_vec(&a.body).unwrap();
    env.api
        .check_response(method, path, a.status, "application/json", &bytes)
        .unwrap_or_else(|e| panic!("{method} {path} through the relay: {e:#}"));
    Ok(a)
}

fn kv_spec(name: &str) -> Value {
    json!({"name": name, "workload": "kv", "memory_mib": 192})
}

fn snapshot(env: &Env, name: &str) -> String {
    let dir = env.home.path().join(format!("snap-{name}"));
    let out = env.get_ok(
        "POST",
        &format!("/v1/vms/{name}/snapshot"),
        Some(&json!({"out": dir, "trace_s": 2.0})),
    );
    assert!(out["trace_pages"].as_u64().unwrap() > 0, "{out}");
    dir.to_str().unwrap().to_string()
}

/// A copy of snapshot `dir` in `to`'s snapshot store, as an operator ships a
/// snapshot to the host that restores it.
fn ship(dir: &str, to: &Env, name: &str) -> String {
    let store = to.home.path().join("snapshots");
    std::fs::create_dir_all(&store).unwrap();
    let dst = store.join(name);
    let st = std::process::Command::new("cp")
        .args(["-a", "--sparse=always", dir])
        .arg(&dst)
        .status()
        .unwrap();
    assert!(st.success());
    dst.to_str().unwrap().to_string()
}

/// The `resumed` events' monotonic instants of a VM.
fn resumed_mono(env: &Env, name: &str) -> Vec<u64> {
    env.events(name)
        .iter()
        .filter(|e| e["kind"] == "resumed")
        .map(|e| e["mono_ns"].as_u64().unwrap())
        .collect()
}

fn vm_names(env: &Env) -> Vec<String> {
    env.get_ok("GET", "/v1/vms", None)
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v["name"].as_str().unwrap().to_string())
        .collect()
}

#[test]
fn daemons_relay_calls_and_restore_a_cluster_in_dependency_order() {
    let t0 = Instant::now();
    let keys = tempfile::tempdir().unwrap();
    let token_file = keys.path().join("cluster.token");
    let one = Env::new();
    let two = Env::new();
    let coord = Env::new();
    one.ok(&["cluster", "token", token_file.to_str().unwrap()]);
    let token = ClusterToken::from_file(&token_file).unwrap();
    let d1 = Daemon::start(&one, &token_file, true);
    let d2 = Daemon::start(&two, &token_file, true);
    let rt = tokio::runtime::Runtime::new().unwrap();

    // (a) The relay starts a guest on the second daemon; it runs there.
    let a = relayed(
        &two,
        &rt,
        d2.addr(),
        &token,
        "POST",
        "/v1/vms",
        Some(&kv_spec("kb")),
    )
    .unwrap();
    assert_eq!(a.status, 201, "{:?}", a.body);
    one.get_ok("POST", "/v1/vms", Some(&kv_spec("ka")));
    let a = relayed(
        &two,
        &rt,
        d2.addr(),
        &token,
        "POST",
        "/v1/vms/kb/wait?for=ready&timeout_ms=120000",
        None,
    )
    .unwrap();
    assert_eq!(a.status, 200, "{:?}", a.body);
    let st = two.status("kb");
    assert_eq!(st["state"], "running", "{st}");
    let pid = st["qemu_pid"].clone();
    assert!(!vm_names(&one).contains(&"kb".to_string()));
    // A stranger is refused before any call runs; the guest is untouched.
    let stranger = ClusterToken::from_bytes(&[7u8; 40]).unwrap();
    let e = rt
        .block_on(relay::call(
            d2.addr(),
            &stranger,
            "POST",
            "/v1/vms/kb/kill",
            None,
        ))
        .unwrap_err();
    assert!(
        matches!(
            e,
            RelayError::Wire {
                source: WireError::NotAuthenticated,
                ..
            }
        ),
        "{e}"
    );
    // The daemon stops no one through the relay.
    let a = relayed(
        &two,
        &rt,
        d2.addr(),
        &token,
        "POST",
        "/v1/daemon/shutdown",
        None,
    )
    .unwrap();
    assert_eq!(a.status, 403, "{:?}", a.body);
    assert!(
        a.body["error"].as_str().unwrap().contains("not relayed"),
        "{:?}",
        a.body
    );
    let st = two.status("kb");
    assert_eq!((&st["state"], &st["qemu_pid"]), (&json!("running"), &pid));
    let log = std::fs::read_to_string(Daemon::log(&two)).unwrap();
    assert!(
        log.contains("cohort refused a connection"),
        "the stranger is not in the log:\n{log}"
    );

    // (b) Two kv guests with keys, snapshotted, restored across the daemons with B
    // depending on A: A's copy on the second daemon, B's on the first.
    one.get_ok("POST", "/v1/vms/ka/wait?for=ready&timeout_ms=120000", None);
    for (env, name) in [(&one, "ka"), (&two, "kb")] {
        let port = env.host_port(name, 7070);
        for i in 0..10 {
            assert_eq!(kv(port, &format!("SET {name}{i} v{i}")).unwrap(), "OK");
        }
    }
    let snap_a = snapshot(&one, "ka");
    let snap_b = snapshot(&two, "kb");
    // A cohort restores only snapshots in its store or ones it wrote: A's snapshot,
    // written by the first daemon, is refused on the second until it is shipped there.
    let plan = json!({"plan": {"restore_id": "unshipped", "vms": [
        {"vm": "ka3", "cohort": d2.addr(), "ws_pages": 0,
         "args": {"dir": snap_a, "mode": "elastic"}}]}});
    let report = one.get_ok("POST", "/v1/cluster/restore", Some(&plan));
    assert_eq!(report["outcome"]["result"], "aborted", "{report:#}");
    assert!(
        report.to_string().contains("nor one it wrote"),
        "{report:#}"
    );
    assert!(!vm_names(&two).contains(&"ka3".to_string()));
    let (snap_a, snap_b) = (ship(&snap_a, &two, "ka"), ship(&snap_b, &one, "kb"));
    let plan = json!({
        "plan": {"restore_id": "pair", "vms": [
            {"vm": "ka2", "cohort": d2.addr(), "ws_pages": 0,
             "args": {"dir": snap_a, "mode": "elastic", "watch_s": 1.0}},
            {"vm": "kb2", "cohort": d1.addr(), "ws_pages": 0, "depends_on": ["ka2"],
             "args": {"dir": snap_b, "mode": "elastic", "watch_s": 1.0}}]},
        "config": {"restore_s": 120.0}
    });
    let report = one.get_ok("POST", "/v1/cluster/restore", Some(&plan));
    assert_eq!(report["outcome"]["result"], "restored", "{report:#}");
    let vm = |n: &str| {
        report["vms"]
            .as_array()
            .unwrap()
            .iter()
            .find(|v| v["vm"] == n)
            .unwrap()
            .clone()
    };
    let (ra, rb) = (vm("ka2"), vm("kb2"));
    for v in [&ra, &rb] {
        assert_eq!(v["state"], "restored", "{v}");
        assert_eq!(v["held"], true, "{v}");
        assert!(v["pages"].as_u64().unwrap() > 0, "{v}");
    }
    assert!(
        ra["start_unix_ns"].as_i64().unwrap() < rb["start_unix_ns"].as_i64().unwrap(),
        "A did not start before B: {report:#}"
    );
    // The VMs' own clocks say the same (one host: one monotonic clock).
    let (ma, mb) = (resumed_mono(&two, "ka2"), resumed_mono(&one, "kb2"));
    assert!(!ma.is_empty() && !mb.is_empty(), "{ma:?} {mb:?}");
    assert!(
        ma[0] < mb[0],
        "ka2 resumed at {} ns, kb2 at {} ns",
        ma[0],
        mb[0]
    );
    for (env, name, orig) in [(&two, "ka2", "ka"), (&one, "kb2", "kb")] {
        let rep = env.get_ok("GET", &format!("/v1/vms/{name}/restore"), None);
        assert!(rep["memory_loaded_s"].as_f64().is_some(), "{rep}");
        let port = env.host_port(name, 7070);
        for i in 0..10 {
            assert_eq!(
                kv(port, &format!("GET {orig}{i}")).unwrap(),
                format!("VALUE v{i}")
            );
        }
    }
    let status = two.get_ok("GET", "/v1/cluster/restores/pair", None);
    assert_eq!(status["vms"]["ka2"]["state"], "restored", "{status}");

    // (c) A coordinator that dies after LOAD: the held VM is dropped after the
    // cohort's hold timeout, and the cohort says why.
    let dc = Daemon::start(&coord, &token_file, false);
    let plan = json!({"plan": {"restore_id": "orphan", "vms": [
        {"vm": "held1", "cohort": d2.addr(), "ws_pages": 0, "start_at_s": 600.0,
         "args": {"dir": snap_a, "mode": "elastic"}}]}});
    let coord_pid = coord.daemon_pid();
    std::thread::scope(|s| {
        let call = s.spawn(|| coord.call("POST", "/v1/cluster/restore", Some(&plan)));
        eventually(Duration::from_secs(60), "held1 to be held", || {
            let (code, rep) = two.call("GET", "/v1/vms/held1/restore", None).ok()?;
            (code == 200 && rep["phase"] == "held").then_some(())
        });
        assert_eq!(two.status("held1")["state"], "paused");
        nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(coord_pid as i32),
            nix::sys::signal::Signal::SIGKILL,
        )
        .unwrap();
        assert!(call.join().unwrap().is_err(), "the coordinator was killed");
    });
    let killed = Instant::now();
    eventually(Duration::from_secs(30), "held1 to be dropped", || {
        let (code, _) = two.call("GET", "/v1/vms/held1", None).ok()?;
        (code == 404).then_some(())
    });
    assert!(
        killed.elapsed() >= Duration::from_secs(2),
        "dropped before the hold timeout: {:?}",
        killed.elapsed()
    );
    let status = two.get_ok("GET", "/v1/cluster/restores/orphan", None);
    assert!(
        status["aborted"]
            .as_str()
            .unwrap_or_default()
            .contains("hold_timeout"),
        "{status}"
    );
    assert_eq!(status["vms"]["held1"]["state"], "aborted", "{status}");
    let log = std::fs::read_to_string(Daemon::log(&two)).unwrap();
    assert!(
        log.contains("held VM killed and removed") && log.contains("held1"),
        "{log}"
    );
    drop(dc);

    // (d) A plan naming a missing snapshot: one line naming it, nothing left.
    let missing = one.home.path().join("no-such-snapshot");
    let plan = json!({"plan": {"restore_id": "ghostly", "vms": [
        {"vm": "ghost", "cohort": d2.addr(), "ws_pages": 0,
         "args": {"dir": missing, "mode": "elastic"}},
        {"vm": "ghost2", "cohort": d1.addr(), "ws_pages": 0,
         "args": {"dir": snap_b, "mode": "elastic"}}]}});
    let plan_file = one.home.path().join("ghost-plan.json");
    std::fs::write(&plan_file, plan.to_string()).unwrap();
    let e = one.fails(&["cluster", "restore", "--plan", plan_file.to_str().unwrap()]);
    assert!(e.contains(missing.to_str().unwrap()), "{e}");
    assert!(e.contains("ghost"), "{e}");
    let report = one.get_ok(
        "POST",
        "/v1/cluster/restore",
        Some(&json!({"plan": {"restore_id": "ghostly2", "vms": plan["plan"]["vms"]}})),
    );
    assert_eq!(report["outcome"]["result"], "aborted", "{report:#}");
    eventually(
        Duration::from_secs(30),
        "nothing of the ghosts left",
        || {
            let names = [vm_names(&one), vm_names(&two)].concat();
            (!names.iter().any(|n| n.starts_with("ghost"))).then_some(())
        },
    );
    eprintln!("cluster test took {:.1} s", t0.elapsed().as_secs_f64());
    drop((d1, d2));
}

/// What a token holder cannot make a daemon do through the relay: dump to, create,
/// map or restore from host paths of its choosing. Each call is refused with its
/// reason and nothing is written.
#[test]
fn the_relay_refuses_host_paths_and_everything_not_on_its_list() {
    let keys = tempfile::tempdir().unwrap();
    let token_file = keys.path().join("cluster.token");
    let env = Env::bare();
    env.ok(&["cluster", "token", token_file.to_str().unwrap()]);
    let token = ClusterToken::from_file(&token_file).unwrap();
    let d = Daemon::start(&env, &token_file, true);
    let rt = tokio::runtime::Runtime::new().unwrap();
    let victim = tempfile::tempdir().unwrap();
    let target = |n: &str| victim.path().join(n);
    // A directory that looks like a snapshot, outside the daemon's store.
    let fake = target("fake-snapshot");
    std::fs::create_dir(&fake).unwrap();
    std::fs::write(fake.join("manifest.json"), "{}").unwrap();
    let cases: Vec<(&str, String, Option<Value>, &str)> = vec![
        (
            "POST",
            "/v1/vms/kb/dump".into(),
            Some(json!({"out": target("x"), "mode": 420})),
            "not relayed",
        ),
        (
            "POST",
            "/v1/vms".into(),
            Some(json!({"name": "p", "pmem": [target("other-vm-disk.img")]})),
            "pmem",
        ),
        (
            "POST",
            "/v1/vms".into(),
            Some(
                json!({"name": "p", "disks": [format!("{},size=1M", target("new.img").display())]}),
            ),
            "disks",
        ),
        (
            "POST",
            "/v1/restore".into(),
            Some(json!({"dir": fake, "name": "r"})),
            "not relayed",
        ),
        (
            "POST",
            "/v1/vms/kb/snapshot".into(),
            Some(json!({"out": target("snap")})),
            "snapshot store",
        ),
        (
            "POST",
            "/v1/memory/plan".into(),
            Some(json!({})),
            "not relayed",
        ),
    ];
    for (method, path, body, why) in &cases {
        let a = rt
            .block_on(relay::call(d.addr(), &token, method, path, body.as_ref()))
            .unwrap();
        assert_eq!(a.status, 403, "{method} {path}: {:?}", a.body);
        let e = a.body["error"].as_str().unwrap();
        assert!(e.contains(why), "{method} {path}: {e}");
        assert_eq!(e.lines().count(), 1, "{e}");
    }
    // A cohort asked to restore from the fake directory refuses it by name.
    let coord = Env::bare();
    let _dc = Daemon::start(&coord, &token_file, false);
    let plan = json!({"plan": {"restore_id": "stray", "vms": [
        {"vm": "stray", "cohort": d.addr(), "ws_pages": 0,
         "args": {"dir": fake, "mode": "lazy"}}]}});
    let report = coord.get_ok("POST", "/v1/cluster/restore", Some(&plan));
    assert_eq!(report["outcome"]["result"], "aborted", "{report:#}");
    assert!(
        report.to_string().contains("nor one it wrote"),
        "{report:#}"
    );
    let mut left: Vec<_> = std::fs::read_dir(victim.path())
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    left.sort();
    assert_eq!(left, ["fake-snapshot"], "something was written");
    assert_eq!(vm_names(&env), Vec::<String>::new());
    assert!(!env.home.path().join("snapshots").join("snap").exists());
}

impl Drop for Daemon {
    fn drop(&mut self) {
        // The Env stops the daemon; reap it if it has exited by then.
        let _ = self.child.try_wait();
    }
}
