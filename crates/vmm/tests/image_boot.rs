//! Boots the `default` image (built as the image crate's tests build it) under QEMU/TCG
//! with its command line from [`rebound_vmm::qemu::QemuCommand`], with every workload
//! running, checking what a user would see: the agent's `ready`, the web pages, kv
//! answers, counter lines whose checksums the host recomputes, memfill rounds without
//! errors, a marker's bytes at the reported physical address in the RAM file, the
//! VMCOREINFO note at its reported address, and a crash that QEMU reports as
//! GUEST_PANICKED.

mod common;

use std::io::{BufRead, BufReader, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

use common::{ensure_image, http_get, image_home, is_type, Guest, Result};
use rebound_image::counter_checksum;
use rebound_vmm::qemu::{Device, MemoryBackend};

fn kv(stream: &mut TcpStream, reader: &mut BufReader<TcpStream>, cmd: &str) -> Result<String> {
    stream.write_all(format!("{cmd}\r\n").as_bytes())?;
    let mut line = String::new();
    reader.read_line(&mut line)?;
    Ok(line.trim_end().to_string())
}

#[test]
fn guest_boots_serves_and_crashes() -> Result<()> {
    let img = ensure_image(&image_home());
    let mut g = Guest::boot(
        &img,
        "rebound.workload=web,kv,counter,memfill rebound.memfill=16M rebound.counter_hz=20",
        256,
    )?;
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut agent = g.agent(deadline)?;
    agent.send(r#"{"cmd":"hello"}"#)?;
    let ready = agent
        .wait_for(Duration::from_secs(60), "ready", |v| is_type(v, "ready"))
        .map_err(|e| format!("{e}\n{}", g.serial()))?;
    let boot_s = g.spawned.elapsed().as_secs_f64();
    eprintln!(
        "boot -> ready: {boot_s:.2} s wall, guest uptime {} ms",
        ready["uptime_ms"]
    );

    // ready: facts the host relies on.
    assert_eq!(ready["agent_version"], 1);
    assert_eq!(ready["kernel_release"], img.kernel_release.as_str());
    assert_eq!(ready["workload"], "web,kv,counter,memfill");
    assert_eq!(ready["service_port"], 8080);
    let mem = ready["mem_total_kib"].as_u64().ok_or("mem_total_kib")?;
    assert!(
        mem > 150_000 && mem < 262_144,
        "MemTotal {mem} KiB for a 256 MiB guest"
    );
    let note_addr = ready["vmcoreinfo"]["paddr"]
        .as_u64()
        .ok_or("vmcoreinfo.paddr")?;
    let note_size = ready["vmcoreinfo"]["size"]
        .as_u64()
        .ok_or("vmcoreinfo.size")? as usize;
    let note = g.read_ram(note_addr, note_size)?;
    assert_eq!(&note[..4], &11u32.to_le_bytes(), "VMCOREINFO note namesz");
    assert_eq!(&note[12..23], b"VMCOREINFO\0");
    let text = String::from_utf8_lossy(&note[24..]);
    assert!(
        text.contains(&format!("OSRELEASE={}\n", img.kernel_release)),
        "note text: {text}"
    );

    // web
    let (st, body) = http_get(g.web_port, "/")?;
    assert_eq!(st, 200);
    let page = String::from_utf8_lossy(&body);
    assert!(
        page.contains("Rebound guest")
            && page.contains(&img.kernel_release)
            && page.contains("default"),
        "{page}"
    );
    let (st, body) = http_get(g.web_port, "/blob-1m.bin")?;
    assert_eq!(st, 200);
    assert!(
        body == rebound_image::blob(),
        "blob-1m.bin differs from the deterministic pattern"
    );
    assert_eq!(
        http_get(g.web_port, "/dir/nested.txt")?,
        (200, b"nested file\n".to_vec())
    );
    assert_eq!(http_get(g.web_port, "/missing.html")?.0, 404);
    assert_eq!(http_get(g.web_port, "/../data/index.html")?.0, 403);
    assert_eq!(http_get(g.web_port, "/dir/%2e%2e/index.html")?.0, 403);

    // kv
    let mut s = TcpStream::connect(("127.0.0.1", g.kv_port))?;
    s.set_read_timeout(Some(Duration::from_secs(10)))?;
    let mut r = BufReader::new(s.try_clone()?);
    assert_eq!(kv(&mut s, &mut r, "SET greeting hello world")?, "OK");
    assert_eq!(kv(&mut s, &mut r, "SET k2 v2")?, "OK");
    assert_eq!(kv(&mut s, &mut r, "GET greeting")?, "VALUE hello world");
    assert_eq!(kv(&mut s, &mut r, "COUNT")?, "COUNT 2");
    assert_eq!(kv(&mut s, &mut r, "DEL k2")?, "OK");
    assert_eq!(kv(&mut s, &mut r, "GET k2")?, "NOTFOUND");
    assert_eq!(kv(&mut s, &mut r, "DEL k2")?, "NOTFOUND");
    assert!(kv(&mut s, &mut r, "FROB x")?.starts_with("ERR"));

    // marker: the bytes are at the reported guest physical address in the RAM file.
    let bytes: Vec<u8> = (0..64u8).map(|i| i.wrapping_mul(37) ^ 0xa5).collect();
    let hex: String = bytes.iter().map(|b| format!("{b:02x}")).collect();
    agent.send(&format!(
        r#"{{"cmd":"marker","id":42,"value_hex":"{hex}"}}"#
    ))?;
    let m = agent.wait_for(Duration::from_secs(10), "marker reply", |v| {
        is_type(v, "marker")
    })?;
    assert_eq!(m["id"], 42);
    assert_eq!(m["len"], 64);
    let paddr = m["paddr"].as_u64().ok_or("paddr")?;
    assert_eq!(paddr % 4096, 0);
    assert_eq!(g.read_ram(paddr, 64)?, bytes);

    // malformed commands get an error, and the agent keeps working.
    for bad in [
        "{\"cmd\":",
        "not json",
        "{\"cmd\":\"marker\",\"id\":-1,\"value_hex\":\"00\"}",
        "{\"cmd\":\"frobnicate\"}",
    ] {
        agent.send(bad)?;
        let e = agent.wait_for(Duration::from_secs(10), "error reply", |v| {
            is_type(v, "error")
        })?;
        eprintln!("{bad:?} -> {}", e["message"]);
    }
    agent.send(r#"{"cmd":"hello"}"#)?;
    agent.wait_for(Duration::from_secs(10), "ready after errors", |v| {
        is_type(v, "ready")
    })?;

    // memfill: at least one full verification round without errors.
    let mf = agent.wait_for(Duration::from_secs(30), "memfill round", |v| {
        is_type(v, "memfill") && v["rounds"].as_u64().unwrap_or(0) >= 1
    })?;
    assert_eq!(mf["filled_kib"], 16384);
    assert_eq!(mf["errors"], 0);

    // counter: agent messages and serial lines agree with the host's own computation.
    let c = agent.wait_for(Duration::from_secs(10), "counter tick", |v| {
        is_type(v, "counter") && v["seq"].as_u64().unwrap_or(0) >= 5
    })?;
    let seq = c["seq"].as_u64().ok_or("seq")?;
    assert_eq!(c["checksum"], format!("{:016x}", counter_checksum(seq)));
    let heartbeats = agent
        .seen
        .iter()
        .filter(|v| is_type(v, "heartbeat"))
        .count();
    assert!(
        heartbeats >= 1,
        "no heartbeat among {} messages",
        agent.seen.len()
    );
    let serial = g.serial();
    assert!(
        serial.contains("rebound-agent: feeding /dev/watchdog"),
        "agent did not open the i6300esb watchdog"
    );
    let line = format!("counter seq={seq} checksum={:016x}", counter_checksum(seq));
    assert!(serial.contains(&line), "serial log lacks {line:?}");

    // A host that goes away and comes back gets `ready` again.
    drop(agent);
    std::thread::sleep(Duration::from_secs(2));
    let mut agent = g.agent(Instant::now() + Duration::from_secs(5))?;
    agent.send(r#"{"cmd":"hello"}"#)?;
    agent.wait_for(Duration::from_secs(10), "ready after reconnect", |v| {
        is_type(v, "ready")
    })?;

    // crash -> pvpanic -> GUEST_PANICKED, VM paused with its RAM intact.
    let mut q = g.qmp(Instant::now() + Duration::from_secs(10))?;
    let t = Instant::now();
    agent.send(r#"{"cmd":"crash"}"#)?;
    let ev = q.wait_event("GUEST_PANICKED", Instant::now() + Duration::from_secs(20))?;
    eprintln!(
        "crash -> GUEST_PANICKED: {:.3} s",
        t.elapsed().as_secs_f64()
    );
    assert_eq!(ev["data"]["action"], "pause");
    let status = q.execute("query-status", Instant::now() + Duration::from_secs(5))?;
    assert_eq!(status["status"], "guest-panicked");
    assert_eq!(
        g.read_ram(paddr, 64)?,
        bytes,
        "marker bytes changed after the panic"
    );
    Ok(())
}

/// The agent must keep running while no host is connected (its writes would block
/// forever on a blocking port), answer `hello` once one connects, and power the guest off.
/// The guest has room for hotplug (`maxmem`) and a virtio-mem device: memory plugged by the
/// host must show in the guest's MemTotal (our kernel parameters once broke virtio there).
#[test]
fn agent_without_host_then_poweroff() -> Result<()> {
    let img = ensure_image(&image_home());
    let mut g = Guest::boot_with(
        &img,
        "rebound.workload=counter rebound.counter_hz=50",
        256,
        |q| {
            q.memory.max_mib = Some(1024);
            q.devices.push(Device::VirtioMem {
                backend: MemoryBackend::Anonymous,
                size_mib: 512,
                requested_mib: 0,
                block_mib: 2,
            });
        },
    )?;
    g.wait_serial("rebound-agent: ready", Duration::from_secs(60))?;
    let ready_seen = Instant::now();
    // Ticks keep reaching the console with nobody on the agent socket.
    g.wait_serial("counter seq=150 ", Duration::from_secs(30))?;
    let away = ready_seen.elapsed().as_secs();
    let mut agent = g.agent(Instant::now() + Duration::from_secs(5))?;
    agent.send(r#"{"cmd":"hello"}"#)?;
    let ready = agent.wait_for(Duration::from_secs(10), "ready after hello", |v| {
        is_type(v, "ready")
    })?;
    assert_eq!(ready["workload"], "counter");
    assert!(ready["service_port"].is_null());
    // The heartbeat counter kept advancing while we were away. An agent blocked on its
    // first write would have stopped at 1 or 2; a starved vCPU skips ticks, hence the slack.
    let hb = agent.wait_for(Duration::from_secs(5), "heartbeat", |v| {
        is_type(v, "heartbeat")
    })?;
    let seq = hb["seq"].as_u64().ok_or("seq")?;
    assert!(
        seq >= 3 && seq * 2 >= away,
        "heartbeat seq {seq} after {away} s away from the agent"
    );
    let c = agent.wait_for(Duration::from_secs(5), "counter", |v| is_type(v, "counter"))?;
    assert!(c["seq"].as_u64().unwrap_or(0) > 150, "counter {c}");

    // virtio-mem: plug 128 MiB and watch MemTotal grow by it.
    let before = ready["mem_total_kib"].as_u64().ok_or("mem_total_kib")?;
    let mut q = g.qmp(Instant::now() + Duration::from_secs(10))?;
    q.execute_args(
        "qom-set",
        serde_json::json!({"path": "/machine/peripheral/vmem0", "property": "requested-size", "value": 128u64 << 20}),
        Instant::now() + Duration::from_secs(5),
    )?;
    let deadline = Instant::now() + Duration::from_secs(20);
    let mut after = before;
    while after < before + (120 << 10) && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(500));
        agent.send(r#"{"cmd":"hello"}"#)?;
        let r = agent.wait_for(Duration::from_secs(5), "ready", |v| is_type(v, "ready"))?;
        after = r["mem_total_kib"].as_u64().unwrap_or(0);
    }
    assert!(
        after >= before + (120 << 10),
        "MemTotal {before} -> {after} KiB after plugging 128 MiB"
    );

    agent.send(r#"{"cmd":"poweroff"}"#)?;
    let st = g
        .wait_exit(Duration::from_secs(30))
        .map_err(|e| format!("{e}\n{}", g.serial()))?;
    assert!(st.success(), "qemu exit status {st}");
    Ok(())
}
