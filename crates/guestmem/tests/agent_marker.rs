//! End to end with the project's guest image and agent: bytes the guest
//! writes are found at the guest physical address the agent reports, and
//! VMCOREINFO read at the agent's address matches the agent's kernel release.
//!
//! Needs the image `make image` builds (`$REBOUND_HOME/images/default`, with
//! `vmlinuz`, `initrd.cpio.gz` and `manifest.json`); fails, saying so, without it.

use crate::common;

use std::io::{BufRead, BufReader, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use common::*;
use rebound_guestmem::{find_vmcoreinfo, read_vmcoreinfo, GuestMemory, Layout};
use rebound_vmm::qemu::{Boot, Machine, MemoryBackend};

fn image_dir() -> PathBuf {
    let home = rebound_home();
    let dir = home.join("images/default");
    assert!(
        dir.join("manifest.json").exists(),
        "no guest image at {}: run `make image` or set REBOUND_HOME",
        dir.display()
    );
    dir
}

/// A string field of a flat JSON object (enough for the manifest and agent lines).
fn json_str(text: &str, key: &str) -> Option<String> {
    let rest = &text[text.find(&format!("\"{key}\""))? + key.len() + 2..];
    let rest = rest
        .trim_start()
        .strip_prefix(':')?
        .trim_start()
        .strip_prefix('"')?;
    Some(rest[..rest.find('"')?].to_string())
}

/// An integer field; the first occurrence after `after` (a key that must precede it).
fn json_u64(text: &str, after: &str, key: &str) -> Option<u64> {
    let text = &text[text.find(&format!("\"{after}\""))?..];
    let rest = &text[text.find(&format!("\"{key}\""))? + key.len() + 2..];
    let rest = rest.trim_start().strip_prefix(':')?.trim_start();
    let end = rest
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(rest.len());
    rest[..end].parse().ok()
}

struct Vm {
    /// Held so QEMU dies with the test.
    _qemu: Qemu,
    ram: PathBuf,
    sock: PathBuf,
    serial: PathBuf,
}

fn boot(dir: &Path, image: &Path, size_mib: u64) -> Vm {
    let manifest = std::fs::read_to_string(image.join("manifest.json")).unwrap();
    let append = json_str(&manifest, "append").expect("manifest append");
    let ram = dir.join(format!("ram-{size_mib}"));
    let sock = dir.join(format!("agent-{size_mib}.sock"));
    let serial = dir.join(format!("serial-{size_mib}"));
    let boot = Boot {
        kernel: image.join("vmlinuz"),
        initrd: Some(image.join("initrd.cpio.gz")),
        append: format!("{append} rebound.workload=none"),
    };
    let backend = MemoryBackend::SharedFile(ram.clone());
    let mut q = guest_command(Machine::Pc, size_mib, backend, boot, &serial);
    q.control.agent = Some(sock.clone());
    Vm {
        _qemu: spawn_qemu(&q, &dir.join(format!("qemu-{size_mib}.log"))),
        ram,
        sock,
        serial,
    }
}

/// Talks to the agent until a line of `kind` arrives; sends `cmd` first.
fn agent_line(r: &mut BufReader<UnixStream>, cmd: &str, kind: &str, serial: &Path) -> String {
    r.get_mut()
        .write_all(format!("{cmd}\n").as_bytes())
        .unwrap();
    let t0 = Instant::now();
    let want = format!("\"type\":\"{kind}\"");
    loop {
        let mut line = String::new();
        match r.read_line(&mut line) {
            Ok(0) => panic!("agent closed the port"),
            Ok(_) if line.contains(&want) => return line,
            Ok(_) => {}
            // Read timeout: the agent may not be up yet; say hello again.
            Err(_) => r
                .get_mut()
                .write_all(format!("{cmd}\n").as_bytes())
                .unwrap(),
        }
        let log = std::fs::read_to_string(serial).unwrap_or_default();
        assert!(
            t0.elapsed() < Duration::from_secs(180),
            "no {kind} from the agent: {log}"
        );
    }
}

fn connect(sock: &Path) -> BufReader<UnixStream> {
    let t0 = Instant::now();
    loop {
        if let Ok(s) = UnixStream::connect(sock) {
            s.set_read_timeout(Some(Duration::from_secs(2))).unwrap();
            return BufReader::new(s);
        }
        assert!(t0.elapsed() < Duration::from_secs(30), "no agent socket");
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn marker_written_by_the_guest_is_at_the_address_the_agent_reports() {
    let image = image_dir();
    let dir = tempfile::Builder::new()
        .prefix("guestmem-agent")
        .tempdir_in("/dev/shm")
        .unwrap();
    let cases = [("256M", 256 * MIB), ("5G", 5 * GIB)];
    let mut vms: Vec<Vm> = cases
        .iter()
        .map(|(_, bytes)| boot(dir.path(), &image, bytes / MIB))
        .collect();
    let mut rng = fastrand::Rng::with_seed(0x6d61_726b);
    for ((size, bytes), vm) in cases.iter().zip(vms.iter_mut()) {
        let mut agent = connect(&vm.sock);
        let ready = agent_line(&mut agent, r#"{"cmd":"hello"}"#, "ready", &vm.serial);
        let release = json_str(&ready, "kernel_release").unwrap();
        let note_paddr = json_u64(&ready, "vmcoreinfo", "paddr").expect("vmcoreinfo in ready");
        let note_size = json_u64(&ready, "vmcoreinfo", "size").unwrap();

        let marker: Vec<u8> = (0..256).map(|_| rng.u8(..)).collect();
        let hex: String = marker.iter().map(|b| format!("{b:02x}")).collect();
        let cmd = format!(r#"{{"cmd":"marker","id":7,"value_hex":"{hex}"}}"#);
        let reply = agent_line(&mut agent, &cmd, "marker", &vm.serial);
        let paddr = json_u64(&reply, "type", "paddr").unwrap();

        let mem = GuestMemory::open_ram_file(&vm.ram, Layout::pc(*bytes).unwrap()).unwrap();
        assert_eq!(
            mem.read_vec(paddr, marker.len()).unwrap(),
            marker,
            "{size}: marker at {paddr:#x}"
        );
        let info = read_vmcoreinfo(&mem, note_paddr, note_size).unwrap();
        assert_eq!(info.osrelease, release, "{size}");
        assert_eq!(find_vmcoreinfo(&mem).unwrap().paddr, note_paddr, "{size}");
        eprintln!("{size}: marker at {paddr:#x}, VMCOREINFO at {note_paddr:#x} ({release})");
    }
}
