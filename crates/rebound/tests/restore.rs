//! Snapshots and restores with real guests: a restored guest continues exactly from
//! the snapshot point (the counter neither skips nor repeats a tick, kv has every
//! key written before the snapshot and none written after, memfill verifies every
//! page), two restores of one snapshot are independent VMs, and a restore held
//! ready starts only when told.

use crate::common;

use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use common::{eventually, kv, kv_on, restore_json, Env};
use serde_json::Value;

/// The counter ticks a VM's serial log holds, in order.
fn ticks(env: &Env, name: &str) -> Vec<u64> {
    common::counter_ticks(env, name)
        .into_iter()
        .map(|(seq, _)| seq)
        .collect()
}

/// The snapshot's device state is QEMU's own stream, as the postcopy path will send
/// it again: guest RAM only named in its block list (shared, left out), the private
/// blocks' pages in it, the devices' sections and their description after them.
fn device_state_reads_apart(dir: &std::path::Path) {
    let bytes = std::fs::read(dir.join("device.state")).unwrap();
    let s = rebound_migstream::SnapshotStream::parse(&bytes).unwrap();
    let m: Value =
        serde_json::from_slice(&std::fs::read(dir.join("manifest.json")).unwrap()).unwrap();
    let ram = &m["ram_blocks"][0];
    assert!(s.machine.starts_with("pc-i440fx-"), "{}", s.machine);
    assert_eq!(s.capabilities, ["x-ignore-shared"]);
    let main = s
        .blocks
        .iter()
        .position(|b| b.name == ram["id"] && b.used_length == ram["size"].as_u64().unwrap())
        .unwrap_or_else(|| panic!("no block {ram} in {:?}", s.blocks));
    assert!(
        s.pages.iter().all(|p| p.block != main),
        "guest RAM was in the stream"
    );
    assert!(!s.pages.is_empty(), "no firmware pages in {:?}", s.blocks);
    let desc: Value = serde_json::from_slice(&bytes[s.vmdesc.clone().unwrap()]).unwrap();
    assert!(desc["devices"].as_array().unwrap().len() > 5, "{desc}");
    assert!(s.devices.len() > 1000, "{:?}", s.devices);
}

#[test]
fn a_restored_counter_continues_with_the_next_tick_in_both_copies() {
    let env = Env::new();
    env.ok(&[
        "vm",
        "start",
        "ctr",
        "--workload",
        "counter",
        "--memory",
        "256M",
    ]);
    eventually(Duration::from_secs(60), "counter ticks", || {
        (ticks(&env, "ctr").len() > 3).then_some(())
    });
    // Paused, the guest prints nothing more: its last tick is the snapshot point, once
    // the daemon has written out what the console had in flight.
    env.ok(&["vm", "pause", "ctr"]);
    let mut seen = ticks(&env, "ctr");
    let last = eventually(Duration::from_secs(10), "the paused log to settle", || {
        std::thread::sleep(Duration::from_millis(200));
        let now = ticks(&env, "ctr");
        let settled = (now == seen).then(|| *now.last().unwrap());
        seen = now;
        settled
    });
    let dir = env.home.path().join("snap-ctr");
    let d = dir.to_str().unwrap();
    let asked = std::time::Instant::now();
    let out: Value =
        serde_json::from_str(&env.ok(&["vm", "snapshot", "ctr", "--out", d, "--json"])).unwrap();
    // The save of an already paused guest is the whole pause: more than nothing, less
    // than the command took.
    let pause_ms = out["pause_ms"].as_f64().unwrap();
    let took_ms = asked.elapsed().as_secs_f64() * 1e3;
    assert!(
        pause_ms > 0.0 && pause_ms < took_ms,
        "{pause_ms} of {took_ms} ms: {out}"
    );
    assert_eq!(
        out["trace_pages"], 0,
        "a paused guest has no post-snapshot trace: {out}"
    );
    assert!(
        out["notes"]
            .to_string()
            .contains("first restore records one"),
        "{out}"
    );
    assert_eq!(env.status("ctr")["state"], "paused");
    device_state_reads_apart(&dir);

    // No trace yet: an elastic restore falls back to lazy, says so, and records one.
    let a = restore_json(&env, &[d, "--name", "ctr-a", "--mode", "elastic"]);
    assert_eq!(a["phase"], "done", "{a}");
    assert!(a["notes"].to_string().contains("restored lazily"), "{a}");
    assert_eq!(a["trace_recorded"], true, "{a}");
    assert!(a["time_to_running_s"].as_f64().unwrap() > 0.0);
    // The page server's requests: the guest's exact first touches.
    let inspect = env.ok(&["snapshot", "inspect", d]);
    assert!(inspect.contains("from requests"), "{inspect}");
    // With the recorded trace, a working-set restore loads it first.
    let b = restore_json(&env, &[d, "--name", "ctr-b", "--mode", "working-set"]);
    assert!(b["pages_loaded_before_start"].as_u64().unwrap() > 0, "{b}");
    assert_eq!(b["trace_source"], "requests", "{b}");

    for name in ["ctr-a", "ctr-b"] {
        let t = eventually(Duration::from_secs(60), "restored ticks", || {
            let t = ticks(&env, name);
            (t.len() >= 5).then_some(t)
        });
        assert_eq!(
            t[0],
            last + 1,
            "{name} did not continue at the next tick: {t:?}"
        );
        assert!(
            t.windows(2).all(|w| w[1] == w[0] + 1),
            "{name} skipped or repeated a tick: {t:?}"
        );
    }
    // The original goes on from the same point.
    env.ok(&["vm", "resume", "ctr"]);
    eventually(
        Duration::from_secs(60),
        "the original to tick again",
        || ticks(&env, "ctr").contains(&(last + 2)).then_some(()),
    );
    let t = ticks(&env, "ctr");
    let i = t.iter().position(|&s| s == last).unwrap();
    assert_eq!(t[i + 1], last + 1, "{t:?}");
}

/// The page cache's path, for the parts about its own mechanics (the settle onto
/// shared RAM, the snapshot refused until then, the port handed over).
const PC: &str = "page-cache";

#[test]
fn kv_restores_are_independent_and_hold_exactly_what_was_written_before() {
    let env = Env::new();
    env.ok(&["vm", "start", "kv", "--workload", "kv", "--memory", "256M"]);
    let port = env.host_port("kv", 7070);
    for i in 0..20 {
        assert_eq!(kv(port, &format!("SET k{i} v{i}")).unwrap(), "OK");
    }
    let dir = env.home.path().join("snap-kv");
    let d = dir.to_str().unwrap();
    let out: Value = serde_json::from_str(&env.ok(&[
        "vm",
        "snapshot",
        "kv",
        "--out",
        d,
        "--trace-s",
        "2",
        "--json",
    ]))
    .unwrap();
    assert!(out["trace_pages"].as_u64().unwrap() > 0, "{out}");
    assert!(out["ram_data_bytes"].as_u64().unwrap() > 16 << 20, "{out}");
    assert_eq!(kv(port, "SET after yes").unwrap(), "OK");
    let verify = env.ok(&["snapshot", "verify", d]);
    assert!(verify.contains("every checksum matches"), "{verify}");

    let a = restore_json(
        &env,
        &[d, "--name", "kv-a", "--mode", "elastic", "--path", PC],
    );
    assert_eq!(a["phase"], "done", "{a}");
    assert_eq!(a["trace_source"], "post-snapshot", "{a}");
    assert!(a["working_set_pages"].as_u64().unwrap() > 0, "{a}");
    assert!(a["time_to_responsive_s"].as_f64().is_some(), "{a}");
    // A restore may name the host port of a port its snapshot's VM forwarded, and
    // only of such a port.
    let free = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let e = env.fails(&[
        "vm",
        "restore",
        d,
        "--name",
        "kv-x",
        "--forward",
        &format!("{free}:9999"),
    ]);
    assert!(e.contains("forwarded no guest port 9999"), "{e}");
    assert!(env.call("GET", "/v1/vms/kv-x", None).unwrap().0 == 404);
    let fwd = format!("{free}:7070");
    let b = restore_json(
        &env,
        &[
            d,
            "--name",
            "kv-b",
            "--mode",
            "lazy",
            "--forward",
            &fwd,
            "--path",
            PC,
        ],
    );
    assert_eq!(b["pages_loaded_before_start"], 0, "{b}");

    let pa = env.host_port("kv-a", 7070);
    let pb = env.host_port("kv-b", 7070);
    assert_ne!(pa, port);
    assert_eq!(pb, free);
    // Each copy's content, once it runs on shared RAM (a client racing the settle's
    // hand-over of the port is the subject of kv-c below, not of this part).
    for n in ["kv-a", "kv-b"] {
        settled_event(&env, n);
    }
    for p in [pa, pb] {
        for i in 0..20 {
            assert_eq!(kv(p, &format!("GET k{i}")).unwrap(), format!("VALUE v{i}"));
        }
        assert_eq!(kv(p, "GET after").unwrap(), "NOTFOUND");
        assert_eq!(kv(p, "COUNT").unwrap(), "COUNT 20");
    }
    assert_eq!(kv(pa, "SET only-a 1").unwrap(), "OK");
    assert_eq!(kv(pb, "GET only-a").unwrap(), "NOTFOUND");
    assert_eq!(kv(port, "GET only-a").unwrap(), "NOTFOUND");

    // Each restore writes its own disk layer over the snapshot's copy.
    let overlay = |n: &str| env.home.path().join(format!("vms/{n}/disk0.qcow2"));
    for n in ["kv-a", "kv-b"] {
        let info = std::process::Command::new("qemu-img")
            .args(["info", "-U", "--output=json"])
            .arg(overlay(n))
            .output()
            .unwrap();
        let v: Value = serde_json::from_slice(&info.stdout).unwrap();
        let backing = v["backing-filename"].as_str().unwrap_or_default();
        assert!(
            Path::new(backing).starts_with(&dir),
            "{n}'s disk is not over the snapshot's copy: {v}"
        );
    }

    // A held restore does not run until resumed; until it settles onto shared RAM
    // it cannot be snapshotted, and says why.
    let held = restore_json(
        &env,
        &[
            d, "--name", "kv-held", "--mode", "elastic", "--paused", "--path", PC,
        ],
    );
    assert_eq!(held["phase"], "held", "{held}");
    assert_eq!(env.status("kv-held")["state"], "paused");
    let e = env.fails(&[
        "vm",
        "snapshot",
        "kv-held",
        "--out",
        env.home.path().join("snap-held").to_str().unwrap(),
    ]);
    assert!(e.contains("settle"), "{e}");
    // While it waits for its start, the rest of its memory is read in.
    eventually(
        Duration::from_secs(60),
        "the held restore to load all its memory",
        || {
            let (_, r) = env.call("GET", "/v1/vms/kv-held/restore", None).ok()?;
            r["memory_loaded_s"].as_f64()
        },
    );
    assert_eq!(env.status("kv-held")["state"], "paused");
    env.ok(&["vm", "resume", "kv-held"]);
    let ph = env.host_port("kv-held", 7070);
    assert_eq!(kv(ph, "GET k3").unwrap(), "VALUE v3");
    let rep = eventually(Duration::from_secs(60), "the held restore's report", || {
        let (_, r) = env.call("GET", "/v1/vms/kv-held/restore", None).ok()?;
        (r["phase"] == "done").then_some(r)
    });
    assert!(rep["responsive_after_start_s"].as_f64().is_some(), "{rep}");
    assert!(
        rep["bytes_loaded_while_held"].as_u64().unwrap() > 0,
        "{rep}"
    );

    // Once settled (it does so by itself after its watch window), a restored VM
    // runs on shared RAM in a new QEMU, keeps its data and port, and snapshots.
    let settled = settled_event(&env, "kv-b");
    assert_eq!(
        env.status("kv-b")["qemu_pid"],
        settled["detail"]["pid"],
        "{settled}"
    );
    assert_eq!(kv(pb, "GET k7").unwrap(), "VALUE v7");
    let again = env.home.path().join("snap-kv-b");
    env.ok(&[
        "vm",
        "snapshot",
        "kv-b",
        "--out",
        again.to_str().unwrap(),
        "--trace-s",
        "0",
    ]);
    let c = restore_json(
        &env,
        &[
            again.to_str().unwrap(),
            "--name",
            "kv-c",
            "--mode",
            "lazy",
            "--path",
            PC,
        ],
    );
    assert_eq!(c["phase"], "done", "{c}");
    let pc = env.host_port("kv-c", 7070);
    // kv-c settles once its watch window is over (its port moves between two QEMUs).
    // A client asking all the while gets every answer right: a connection is either
    // answered or, in the one monitor command's gap of the hand-over, refused; never
    // accepted and then dropped (one the old QEMU had queued is relayed, not reset).
    let client = Hammer::start(pc, "GET k19", "VALUE v19");
    settled_event(&env, "kv-c");
    let after = client.answered();
    eventually(
        Duration::from_secs(60),
        "answers from the settled kv-c",
        || (client.answered() >= after + 20).then_some(()),
    );
    let seen = client.stop();
    assert!(
        seen.dropped.is_empty(),
        "connections lost across the settle: {seen:?}"
    );
    assert!(seen.refusals <= 1, "refused more than once: {seen:?}");
    // A lazy restore's memory is all in place once it runs on shared RAM: its
    // report says when.
    let (_, rep) = env.call("GET", "/v1/vms/kv-c/restore", None).unwrap();
    assert!(rep["memory_loaded_s"].as_f64().is_some(), "{rep}");
    assert_eq!(kv(pc, "GET k19").unwrap(), "VALUE v19");
    assert_eq!(kv(pc, "GET only-a").unwrap(), "NOTFOUND");
}

/// Waits until VM `name` has settled onto shared RAM: its `settled` event.
fn settled_event(env: &Env, name: &str) -> Value {
    eventually(
        Duration::from_secs(120),
        &format!("{name} to settle"),
        || {
            env.events(name)
                .into_iter()
                .find(|e| e["kind"] == "settled")
        },
    )
}

/// A kv client asking one question over and over, a new connection each time, as
/// a service's users would while the VM behind the port changes.
struct Hammer {
    stop: Arc<AtomicBool>,
    answered: Arc<AtomicU64>,
    thread: std::thread::JoinHandle<Seen>,
}

/// What the client met.
#[derive(Debug, Default)]
struct Seen {
    answered: u64,
    /// Runs of refused connection attempts (one per gap in which nothing listened).
    refusals: u64,
    /// Connections accepted and then closed, reset or answered wrongly, with what came.
    dropped: Vec<String>,
}

impl Hammer {
    fn start(port: u16, ask: &'static str, want: &'static str) -> Hammer {
        let stop = Arc::new(AtomicBool::new(false));
        let answered = Arc::new(AtomicU64::new(0));
        let (s, a) = (stop.clone(), answered.clone());
        let thread = std::thread::spawn(move || {
            let mut seen = Seen::default();
            let mut refused = false;
            while !s.load(Ordering::Relaxed) {
                let conn = std::net::TcpStream::connect(("127.0.0.1", port));
                if let Err(e) = &conn {
                    if e.kind() == std::io::ErrorKind::ConnectionRefused {
                        seen.refusals += u64::from(!refused);
                        refused = true;
                        continue;
                    }
                }
                refused = false;
                match conn
                    .map_err(anyhow::Error::from)
                    .and_then(|c| kv_on(c, ask))
                {
                    Ok(got) if got == want => {
                        seen.answered += 1;
                        a.fetch_add(1, Ordering::Relaxed);
                    }
                    Ok(got) => seen.dropped.push(format!("answer {got:?}")),
                    Err(e) => seen.dropped.push(format!("{e:#}")),
                }
            }
            seen
        });
        Hammer {
            stop,
            answered,
            thread,
        }
    }

    fn answered(&self) -> u64 {
        self.answered.load(Ordering::Relaxed)
    }

    fn stop(self) -> Seen {
        self.stop.store(true, Ordering::Relaxed);
        self.thread.join().unwrap()
    }
}

#[test]
fn a_memfill_guest_restored_verifies_every_page() {
    let env = Env::new();
    env.ok(&[
        "vm",
        "start",
        "mf",
        "--workload",
        "memfill",
        "--memfill",
        "96M",
        "--memory",
        "256M",
    ]);
    eventually(Duration::from_secs(120), "a memfill round", || {
        env.events("mf")
            .into_iter()
            .any(|e| e["kind"] == "memfill" && e["detail"]["rounds"].as_u64() >= Some(1))
            .then_some(())
    });
    let dir = env.home.path().join("snap-mf");
    let d = dir.to_str().unwrap();
    let rounds = |name: &str| {
        env.events(name)
            .into_iter()
            .filter(|e| e["kind"] == "memfill")
            .filter_map(|e| e["detail"]["rounds"].as_u64())
            .max()
            .unwrap_or(0)
    };
    env.ok(&["vm", "snapshot", "mf", "--out", d, "--trace-s", "2"]);
    // Rounds the guest had finished by the end of the snapshot (and its trace): a
    // restored guest must finish whole rounds beyond that, each page checked.
    let before = rounds("mf");
    // Every mode on the page server (lazy first: its requests become the trace the
    // others send ahead), and the page cache path beside it.
    for (name, mode, path) in [
        ("mf-l", "lazy", "page-server"),
        ("mf-ws", "working-set", "page-server"),
        ("mf-el", "elastic", "page-server"),
        ("mf-e", "eager", "page-server"),
        ("mf-cl", "lazy", "page-cache"),
        ("mf-cel", "elastic", "page-cache"),
    ] {
        let r = restore_json(&env, &[d, "--name", name, "--mode", mode, "--path", path]);
        assert_eq!(r["phase"], "done", "{r}");
        assert_eq!(
            (r["mode"].as_str(), r["path"].as_str()),
            (Some(mode), Some(path)),
            "{r}"
        );
        if path == "page-server" {
            // The page server checked every chunk before its pages left, and the
            // guest never ran on a private mapping (nothing to settle).
            assert_eq!(r["ram_chunks_checked"], r["ram_chunks"], "{r}");
            assert!(
                !env.events(name).iter().any(|e| e["kind"] == "settled"),
                "{name}"
            );
        }
        if mode == "lazy" && path == "page-server" {
            // Nothing went ahead: every page the guest touched was one request, and
            // those requests are now the snapshot's trace.
            let req = eventually(Duration::from_secs(60), "the page server's end", || {
                env.get_ok("GET", &format!("/v1/vms/{name}/restore"), None)
                    ["page_requests_after_start"]
                    .as_u64()
            });
            assert!(req > 1000, "{name}: {req} requests");
            let m: Value =
                serde_json::from_slice(&std::fs::read(dir.join("manifest.json")).unwrap()).unwrap();
            assert_eq!(m["trace"]["source"], "requests", "{m}");
        }
        let ev = eventually(
            Duration::from_secs(180),
            "memfill rounds after the restore",
            || {
                env.events(name)
                    .into_iter()
                    .filter(|e| e["kind"] == "memfill")
                    .map(|e| e["detail"].clone())
                    .find(|d| d["rounds"].as_u64() >= Some(before + 2))
            },
        );
        assert_eq!(ev["errors"], 0, "{name}: {ev}");
        env.ok(&["vm", "kill", name]);
    }
}

/// A disk's bytes as a guest sees them (through any qcow2 layers).
fn disk_bytes(env: &Env, file: &Path) -> Vec<u8> {
    let out = env.home.path().join("disk.raw");
    let st = std::process::Command::new("qemu-img")
        .args(["convert", "-U", "-O", "raw"])
        .arg(file)
        .arg(&out)
        .status()
        .unwrap();
    assert!(st.success(), "qemu-img convert {}", file.display());
    std::fs::read(&out).unwrap()
}

#[test]
fn a_snapshot_of_a_restored_vm_holds_the_disk_it_runs_on_not_its_specs_file() {
    let env = Env::new();
    let user = env.home.path().join("user.img");
    std::fs::write(&user, vec![0xa5u8; 8 << 20]).unwrap();
    let u = user.to_str().unwrap();
    env.ok(&["vm", "start", "s1", "--memory", "192M", "--disk", u]);
    let d1 = env.home.path().join("snap-1");
    env.ok(&[
        "vm",
        "snapshot",
        "s1",
        "--out",
        d1.to_str().unwrap(),
        "--trace-s",
        "0",
    ]);
    env.ok(&["vm", "stop", "s1"]);
    let m1: Value =
        serde_json::from_slice(&std::fs::read(d1.join("manifest.json")).unwrap()).unwrap();
    assert_eq!(m1["disks"][1]["format"], "raw", "{m1}");

    // The restored VM runs on its own layer over the snapshot's copy: the user's file
    // changing afterwards is nothing to it, nor to a snapshot of it.
    restore_json(
        &env,
        &[d1.to_str().unwrap(), "--name", "s2", "--mode", "lazy"],
    );
    std::fs::write(&user, vec![0x5au8; 8 << 20]).unwrap();
    let d2 = env.home.path().join("snap-2");
    env.ok(&[
        "vm",
        "snapshot",
        "s2",
        "--out",
        d2.to_str().unwrap(),
        "--trace-s",
        "0",
    ]);
    let m2: Value =
        serde_json::from_slice(&std::fs::read(d2.join("manifest.json")).unwrap()).unwrap();
    let file = d2.join(m2["disks"][1]["file"].as_str().unwrap());
    let bytes = disk_bytes(&env, &file);
    assert_eq!(bytes.len(), 8 << 20);
    assert!(
        bytes.iter().all(|b| *b == 0xa5),
        "the snapshot took the user's file"
    );
}
