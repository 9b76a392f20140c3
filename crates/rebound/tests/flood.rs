//! A hostile guest (the agent's `flood` workload) writes its serial console and the
//! agent channel as fast as it can for a minute, beside a quiet neighbour: its logs
//! stay within the daemon's caps and off the tmpfs that holds guest RAM, the daemon's
//! memory and threads stay bounded, and the neighbour keeps answering.

use crate::common;

use std::path::Path;
use std::time::{Duration, Instant};

use common::{kv, Env};
use rebound_vmm::logcap::size_on_disk as on_disk;

const SERIAL_CAP: u64 = 1 << 20;
const QEMU_CAP: u64 = 256 << 10;
const EVENTS_CAP: u64 = 512 << 10;
const FLOOD: Duration = Duration::from_secs(60);

/// A field of /proc/PID/status, as a number (kB for sizes).
fn proc_status(pid: u32, field: &str) -> u64 {
    let s = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    s.lines()
        .find_map(|l| l.strip_prefix(field))
        .and_then(|v| {
            v.trim_start_matches(':')
                .split_whitespace()
                .next()?
                .parse()
                .ok()
        })
        .unwrap_or_else(|| panic!("no {field} in /proc/{pid}/status"))
}

/// Bytes of the files in a VM's run dir on tmpfs, its guest RAM aside.
fn run_dir_bytes(dir: &Path) -> u64 {
    std::fs::read_dir(dir)
        .map(|d| {
            d.flatten()
                .filter(|e| e.file_name() != "ram")
                .filter_map(|e| e.metadata().ok())
                .filter(|m| m.is_file())
                .map(|m| m.len())
                .sum()
        })
        .unwrap_or(0)
}

#[test]
fn a_flooding_guest_stays_within_its_caps() {
    let env = Env::new();
    let mut daemon = env.spawn_daemon(&[
        "--serial-log-max",
        "1M",
        "--qemu-log-max",
        "256K",
        "--event-log-max",
        "512K",
    ]);
    let pid = env.daemon_pid();
    let common_args = ["--memory", "128M", "--no-wait"];
    let mut a = vec!["vm", "start", "calm", "--workload", "kv"];
    a.extend(common_args);
    env.ok(&a);
    let mut a = vec!["vm", "start", "flood1", "--workload", "flood"];
    a.extend(common_args);
    env.ok(&a);
    for n in ["calm", "flood1"] {
        env.ok(&["vm", "wait", n, "ready", "--timeout", "300"]);
    }
    let port = env.host_port("calm", 7070);
    assert_eq!(kv(port, "SET color teal").unwrap(), "OK");

    let dir = env.home.path().join("vms/flood1");
    let run = env.run.path().join("flood1");
    let (serial, events, qemu) = (
        dir.join("serial.log"),
        dir.join("events.jsonl"),
        dir.join("qemu.log"),
    );
    // The flood's first seconds set the daemon's baseline (the owner, the links and
    // the allocator's arenas are all up by then).
    std::thread::sleep(Duration::from_secs(5));
    let (rss0, threads0) = (proc_status(pid, "VmRSS"), proc_status(pid, "Threads"));
    let t0 = Instant::now();
    let (mut rss_max, mut threads_max) = (rss0, threads0);
    while t0.elapsed() < FLOOD {
        std::thread::sleep(Duration::from_secs(3));
        rss_max = rss_max.max(proc_status(pid, "VmRSS"));
        threads_max = threads_max.max(proc_status(pid, "Threads"));
        let s = on_disk(&serial);
        assert!(s > 0 && s <= SERIAL_CAP, "serial log {s} B");
        assert!(
            on_disk(&events) <= EVENTS_CAP,
            "event log {}",
            on_disk(&events)
        );
        assert!(on_disk(&qemu) <= QEMU_CAP, "QEMU log {}", on_disk(&qemu));
        // Nothing the guest writes grows on the tmpfs that holds every VM's RAM.
        assert!(
            run_dir_bytes(&run) < 64 << 10,
            "run dir {}",
            run_dir_bytes(&run)
        );
        assert_eq!(
            kv(port, "GET color").unwrap(),
            "VALUE teal",
            "the neighbour"
        );
    }

    // The guest did write far more than the caps let stay: its console lines are
    // numbered, 200 bytes each.
    let tail = env.get_ok("GET", "/v1/vms/flood1/logs?bytes=4096", None);
    let tail = tail.as_str().unwrap();
    assert!(tail.len() <= 4096);
    let last_line = tail
        .lines()
        .filter_map(|l| {
            l.strip_prefix("flood ")?
                .split_whitespace()
                .next()?
                .parse::<u64>()
                .ok()
        })
        .max()
        .unwrap_or_else(|| panic!("no flood line in the log's tail: {tail:?}"));
    assert!(
        last_line * 200 > SERIAL_CAP,
        "the guest wrote only {last_line} console lines"
    );
    let default_tail = env.get_ok("GET", "/v1/vms/flood1/logs", None);
    assert!(default_tail.as_str().unwrap().len() as u64 <= SERIAL_CAP);
    // Its agent messages were cut to the rate, and the log says how many went.
    let newest = env.get_ok("GET", "/v1/vms/flood1/events?limit=50", None);
    let newest = newest.as_array().unwrap();
    assert_eq!(newest.len(), 50);
    let dropped: u64 = env
        .events("flood1")
        .iter()
        .filter(|e| e["kind"] == "agent_throttled")
        .map(|e| e["detail"]["dropped"].as_u64().unwrap())
        .sum();
    assert!(dropped > 1000, "only {dropped} agent messages dropped");
    // Pages follow one another by sequence number.
    let first = newest[0]["seq"].as_u64().unwrap();
    let page = env.get_ok(
        "GET",
        &format!("/v1/vms/flood1/events?since={first}&limit=10"),
        None,
    );
    let seqs: Vec<u64> = page
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["seq"].as_u64().unwrap())
        .collect();
    assert_eq!(seqs, (first + 1..first + 11).collect::<Vec<_>>());

    eprintln!(
        "flood: {last_line} console lines, {dropped} agent messages dropped; serial log {} B, \
         events {} B; daemon RSS {rss0} -> max {rss_max} kB, threads {threads0} -> max {threads_max}",
        on_disk(&serial),
        on_disk(&events)
    );
    // Bounded: the daemon did not keep what the guest sent, nor start a reader for
    // every ring it announced.
    assert!(
        rss_max < rss0 + 24 * 1024,
        "daemon RSS grew from {rss0} kB to {rss_max} kB"
    );
    assert!(
        threads_max <= threads0 + 4,
        "daemon threads grew from {threads0} to {threads_max}"
    );
    let evict = env.get_ok("GET", "/v1/vms/flood1/evict", None);
    assert!(evict["ring"].is_object(), "{evict}");

    // The flooding guest goes; its neighbour runs on.
    env.ok(&["vm", "kill", "flood1"]);
    assert_eq!(kv(port, "GET color").unwrap(), "VALUE teal");
    assert!(on_disk(&serial) <= SERIAL_CAP);
    env.ok(&["daemon", "stop"]);
    let _ = daemon.wait();
}
