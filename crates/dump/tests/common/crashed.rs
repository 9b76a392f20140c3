//! A crashed guest, shared by the end-to-end test and the benchmark example:
//! the `default` image (built as the other crates' tests build it) boots
//! under QEMU/TCG with 2 vCPUs and its RAM in /dev/shm, the agent crashes
//! it, QEMU pauses it on the panic, and QEMU's register notes, the guest's
//! memory and its VMCOREINFO are ready for a dump.
#![allow(dead_code)] // each user takes a subset

#[path = "../../../vmm/tests/common/mod.rs"]
pub mod vmm;

use std::path::Path;
use std::time::{Duration, Instant};

use rebound_dump::{notes_from_qemu_elf, Note};
use rebound_guestmem::{read_vmcoreinfo, GuestMemory, Layout, VmcoreInfo};
pub use vmm::{ensure_image, image_home, is_type, Guest, Qmp, Result};

pub struct Crashed {
    pub guest: Guest,
    pub qmp: Qmp,
    pub release: String,
    pub mem: GuestMemory,
    pub info: VmcoreInfo,
    /// QEMU's per-vCPU register notes.
    pub notes: Vec<Note>,
    /// How long QEMU took to write them, in seconds.
    pub notes_secs: f64,
}

/// Boots a guest of `ram_mib` with `extra` on its command line, waits for
/// the agent (and, with `memfill`, one full memfill round), crashes it and
/// takes QEMU's register notes into `regs` (a file path).
pub fn crashed_guest(ram_mib: u64, extra: &str, memfill: bool, regs: &Path) -> Result<Crashed> {
    let img = ensure_image(&image_home());
    let mut g = Guest::boot_with(&img, extra, ram_mib, |q| q.cpus = 2)?;
    let mut agent = g.agent(Instant::now() + Duration::from_secs(60))?;
    agent.send(r#"{"cmd":"hello"}"#)?;
    let ready = agent
        .wait_for(Duration::from_secs(120), "ready", |v| is_type(v, "ready"))
        .map_err(|e| format!("{e}\n{}", g.serial()))?;
    if memfill {
        agent.wait_for(Duration::from_secs(300), "memfill round", |v| {
            is_type(v, "memfill") && v["rounds"].as_u64().unwrap_or(0) >= 1
        })?;
    }
    let mut qmp = g.qmp(Instant::now() + Duration::from_secs(10))?;
    agent.send(r#"{"cmd":"crash"}"#)?;
    qmp.wait_event("GUEST_PANICKED", Instant::now() + Duration::from_secs(60))?;
    let serial = g.serial();
    if !serial.contains("Kernel panic") {
        return Err(format!("no panic on the console:\n{serial}").into());
    }
    let t = Instant::now();
    qmp.execute_args(
        "dump-guest-memory",
        serde_json::json!({"paging": false, "protocol": format!("file:{}", regs.display()),
                           "begin": 0, "length": 4096}),
        Instant::now() + Duration::from_secs(30),
    )?;
    let notes = notes_from_qemu_elf(regs)?;
    let notes_secs = t.elapsed().as_secs_f64();
    let mem = GuestMemory::open_ram_file(&g.ram, Layout::pc(ram_mib << 20)?)?;
    let paddr = ready["vmcoreinfo"]["paddr"].as_u64().ok_or("paddr")?;
    let size = ready["vmcoreinfo"]["size"].as_u64().ok_or("size")?;
    let info = read_vmcoreinfo(&mem, paddr, size)?;
    Ok(Crashed {
        guest: g,
        qmp,
        release: img.kernel_release.clone(),
        mem,
        info,
        notes,
        notes_secs,
    })
}
