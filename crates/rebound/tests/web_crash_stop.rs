//! One web guest, end to end: boot to agent readiness, the web workload serves the
//! data disk's files, VMCOREINFO and a marker are read from the RAM file, `vm crash`
//! panics the guest with its RAM kept, `vm stop` removes the runtime files.

use crate::common;

use common::{ext4_file, http_get, Env};
use rebound_guestmem::{GuestMemory, Layout};
use serde_json::{json, Value};

fn read_ram(ram: &str, mib: u64, paddr: u64, len: usize) -> Vec<u8> {
    let mem = GuestMemory::open_ram_file(ram, Layout::pc(mib << 20).unwrap()).unwrap();
    mem.read_vec(paddr, len).unwrap()
}

#[test]
fn web_guest_serves_crashes_and_stops() {
    let env = Env::new();
    let img = rebound_image::open(env.home.path(), "default").unwrap();

    // CLI start waits for readiness by default.
    let out = env.ok(&[
        "vm",
        "start",
        "web1",
        "--workload",
        "web",
        "--memory",
        "256M",
        "--json",
    ]);
    let st: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(st["state"], "running", "{st}");
    assert_eq!(st["ready"], true);
    assert!(st["ready_after_ms"].as_u64().unwrap() > 0);
    assert_eq!(st["kernel_release"], img.kernel_release.as_str());
    assert!(st["accel"] == "tcg" || st["accel"] == "kvm");
    assert!(st["accel_reason"].as_str().is_some());
    let pid = st["qemu_pid"].as_u64().unwrap() as i32;
    let ram = st["ram_file"].as_str().unwrap().to_string();
    let run_dir = st["run_dir"].as_str().unwrap().to_string();
    assert!(ram.starts_with(env.run.path().to_str().unwrap()));

    // The API agrees with the CLI, and names the forwarded service.
    let st = env.status("web1");
    let fwd = &st["forwards"][0];
    assert_eq!(
        (fwd["guest"].as_u64(), fwd["service"].as_str()),
        (Some(8080), Some("web"))
    );
    let listed = env.get_ok("GET", "/v1/vms", None);
    assert_eq!(listed.as_array().unwrap().len(), 1);

    // The web workload serves the data disk's files byte for byte.
    let port = env.host_port("web1", 8080);
    let index = ext4_file(&img.disk, "/index.html").unwrap();
    let (code, body) = http_get(port, "/").unwrap();
    assert_eq!(code, 200);
    assert_eq!(
        body, index,
        "index page differs from the data disk's index.html"
    );
    let blob = ext4_file(&img.disk, "/blob-1m.bin").unwrap();
    assert_eq!(blob.len(), 1 << 20);
    let (code, body) = http_get(port, "/blob-1m.bin").unwrap();
    assert_eq!(code, 200);
    assert!(body == blob, "1 MiB blob served differs from the data disk");

    // VMCOREINFO parsed from guest RAM names the kernel the agent reported.
    let vci = env.get_ok("GET", "/v1/vms/web1/vmcoreinfo", None);
    assert_eq!(vci["osrelease"], st["kernel_release"]);
    assert_eq!(vci["source"], "agent");
    assert_eq!(vci["paddr"], st["vmcoreinfo_paddr"]);
    assert_eq!(vci["entries"]["OSRELEASE"], st["kernel_release"]);
    assert!(vci["entries"]["PAGESIZE"] == "4096");
    let cli = env.ok(&["vm", "vmcoreinfo", "web1"]);
    assert!(
        cli.contains(&format!("osrelease {}", img.kernel_release)),
        "{cli}"
    );

    // A marker the guest writes is at the physical address it reports.
    let value = b"REBOUND-MARKER-\x00\x01\xfe\xff";
    let hex: String = value.iter().map(|b| format!("{b:02x}")).collect();
    let m = env.get_ok(
        "POST",
        "/v1/vms/web1/marker",
        Some(&json!({"value_hex": hex})),
    );
    let paddr = m["paddr"].as_u64().unwrap();
    assert_eq!(m["len"].as_u64(), Some(value.len() as u64));
    assert_eq!(paddr % 4096, 0, "marker is at the start of a page");
    assert_eq!(read_ram(&ram, 256, paddr, value.len()), value);

    // Crash: the guest panics, QEMU pauses it, the RAM file keeps its contents.
    let out = env.ok(&["vm", "crash", "web1"]);
    assert!(out.contains("crash requested"));
    let st = env.get_ok(
        "POST",
        "/v1/vms/web1/wait?for=panicked&timeout_ms=60000",
        None,
    );
    assert_eq!(st["state"], "panicked");
    assert_eq!(st["ready"], false);
    let cli: Value = serde_json::from_str(&env.ok(&["vm", "status", "web1", "--json"])).unwrap();
    assert_eq!(cli["state"], "panicked");
    assert_eq!(std::fs::metadata(&ram).unwrap().len(), 256 << 20);
    assert_eq!(
        read_ram(&ram, 256, paddr, value.len()),
        value,
        "marker lost after the panic"
    );
    let vci2 = env.get_ok("GET", "/v1/vms/web1/vmcoreinfo", None);
    assert_eq!(vci2["osrelease"], vci["osrelease"]);
    // A panicked guest cannot be crashed again.
    let (code, _) = env.call("POST", "/v1/vms/web1/crash", None).unwrap();
    assert_eq!(code, 409);

    // Stop: QEMU is gone and so are the runtime files; the record says stopped.
    env.ok(&["vm", "stop", "web1"]);
    assert!(
        !std::path::Path::new(&run_dir).exists(),
        "run dir {run_dir} left behind"
    );
    assert!(
        nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), None).is_err(),
        "QEMU still alive"
    );
    let st = env.status("web1");
    assert_eq!(st["state"], "stopped");
    assert!(st["qemu_pid"].is_null());
    let (code, _) = env.call("GET", "/v1/vms/web1/vmcoreinfo", None).unwrap();
    assert_eq!(code, 409);

    // The event log tells the story in order, with both clocks.
    let evs = env.events("web1");
    let kinds: Vec<&str> = evs.iter().map(|e| e["kind"].as_str().unwrap()).collect();
    let order = [
        "started",
        "agent_ready",
        "ready",
        "marker",
        "crash_requested",
        "panicked",
        "stopped",
    ];
    let mut at = 0;
    for k in order {
        at += kinds[at..]
            .iter()
            .position(|x| *x == k)
            .unwrap_or_else(|| panic!("no {k} after position {at} in {kinds:?}"));
    }
    let monos: Vec<u64> = evs.iter().map(|e| e["mono_ns"].as_u64().unwrap()).collect();
    assert!(
        monos.windows(2).all(|w| w[0] <= w[1]),
        "monotonic stamps go back"
    );
    let log = std::fs::read_to_string(env.home.path().join("vms/web1/events.jsonl")).unwrap();
    assert_eq!(log.lines().count(), evs.len());

    // The serial log outlives the run dir.
    let logs = env.ok(&["vm", "logs", "web1"]);
    assert!(!logs.is_empty());
}
