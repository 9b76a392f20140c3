//! Reading guest RAM through a real QEMU process (`-S`: the guest never
//! runs, so the only writes to its RAM are the test's).

use crate::common;

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use common::*;
use rebound_guestmem::maps::{read_maps, MapTarget};
use rebound_guestmem::{GuestMemory, Layout, PageSource};
use rebound_vmm::api::Accel;
use rebound_vmm::qemu::{Device, MemoryBackend, QemuCommand};

const RAM: u64 = 64 * MIB;

/// A QEMU whose vCPUs never start, with `RAM` from `backend` and nothing else.
fn paused(backend: MemoryBackend) -> QemuCommand {
    let mut q = QemuCommand::new(Accel::Tcg, RAM / MIB, backend);
    q.paused = true;
    q
}

/// [`paused`] started, its log in `dir`.
fn qemu(backend: MemoryBackend, dir: &Path) -> Qemu {
    spawn_qemu(&paused(backend), &dir.join("qemu.log"))
}

/// Waits until QEMU has mapped a file matching `pred`; returns its path.
fn wait_for_mapping(q: &mut Qemu, pred: impl Fn(&str) -> bool) -> String {
    let t0 = Instant::now();
    loop {
        q.assert_running();
        if let Ok(maps) = read_maps(q.id()) {
            if let Some(e) = maps.iter().find(|e| pred(&e.path) && e.len() >= RAM) {
                return e.path.clone();
            }
        }
        assert!(
            t0.elapsed() < Duration::from_secs(20),
            "qemu did not map its RAM"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn shared_file_reads_the_same_through_the_process_and_the_file() {
    let (dir, path) = sparse_ram(Some("/dev/shm"), RAM);
    write_at(&path, 0x123000, b"before qemu");
    let mut q = qemu(MemoryBackend::SharedFile(path.clone()), dir.path());
    wait_for_mapping(&mut q, |p| Path::new(p) == path);
    let pid = q.id();

    let target = MapTarget::Path(path.clone());
    let via_proc = GuestMemory::open_process(pid, &target, Layout::pc(RAM).unwrap()).unwrap();
    let via_file = GuestMemory::open_ram_file(&path, Layout::pc(RAM).unwrap()).unwrap();
    assert_eq!(via_proc.read_vec(0x123000, 11).unwrap(), b"before qemu");
    // share=on: a write to the file is what the guest sees.
    write_at(&path, 0x3ff0000, b"after start");
    assert_eq!(via_proc.read_vec(0x3ff0000, 11).unwrap(), b"after start");
    assert_eq!(via_file.read_vec(0x3ff0000, 11).unwrap(), b"after start");
    let ranges = via_proc.data_ranges().unwrap();
    assert!(ranges.iter().any(|r| r.contains(&0x123000)), "{ranges:x?}");
    assert!(ranges.iter().any(|r| r.contains(&0x3ff0000)), "{ranges:x?}");
    let by_inode = MapTarget::inode_of(&path).unwrap();
    let again = GuestMemory::open_process(pid, &by_inode, Layout::pc(RAM).unwrap()).unwrap();
    assert_eq!(again.source().base(), via_proc.source().base());
}

#[test]
fn private_image_mapping_is_read_without_disturbing_the_process() {
    // A lazily restored guest: RAM is a MAP_PRIVATE mapping of an image on tmpfs.
    let (dir, image) = sparse_ram(Some("/dev/shm"), RAM);
    write_at(&image, 0x200000, b"from the image");
    let mut q = qemu(MemoryBackend::PrivateImage(image.clone()), dir.path());
    wait_for_mapping(&mut q, |p| Path::new(p) == image);
    let pid = q.id();
    let target = MapTarget::Path(image.clone());
    let mem = GuestMemory::open_process(pid, &target, Layout::pc(RAM).unwrap()).unwrap();
    let base = mem.source().base();
    let image_blocks = allocated(&image);

    // Not faulted in: its data range comes from the image's extents, and
    // reading it neither maps it into QEMU nor allocates the image's holes.
    let ranges = mem.data_ranges().unwrap();
    assert!(ranges.iter().any(|r| r.contains(&0x200000)), "{ranges:x?}");
    assert!(mem.allocated_bytes().unwrap() < 16 * MIB);
    assert!(!present(pid, base + 0x200000));
    assert_eq!(mem.read_vec(0x200000, 14).unwrap(), b"from the image");
    assert_eq!(mem.read_vec(0x400000, 4 << 20).unwrap(), vec![0; 4 << 20]);
    assert!(
        !present(pid, base + 0x200000),
        "the read faulted the page into QEMU"
    );
    assert!(
        !present(pid, base + 0x400000),
        "the read faulted a hole into QEMU"
    );
    assert_eq!(
        allocated(&image),
        image_blocks,
        "the read allocated image holes"
    );

    // What the guest writes after the restore lives only in QEMU (a private
    // copy-on-write page); here the kernel makes one through /proc/<pid>/mem.
    let mem_file = std::fs::File::options()
        .write(true)
        .open(format!("/proc/{pid}/mem"))
        .unwrap();
    std::os::unix::fs::FileExt::write_all_at(&mem_file, b"guest wrote", base + 0x300000).unwrap();
    assert!(present(pid, base + 0x300000));
    assert_eq!(mem.read_vec(0x300000, 11).unwrap(), b"guest wrote");
    // A read spanning the written page and an untouched image page.
    let both = mem.read_vec(0x300000 - 0x1000, 0x2000).unwrap();
    assert_eq!(&both[0x1000..0x1000 + 11], b"guest wrote");
    let image_view = GuestMemory::open_ram_file(&image, Layout::pc(RAM).unwrap()).unwrap();
    assert_eq!(image_view.read_vec(0x300000, 11).unwrap(), vec![0; 11]);
    let ranges = mem.data_ranges().unwrap();
    assert!(ranges.iter().any(|r| r.contains(&0x300000)), "{ranges:x?}");
    assert!(mem.source().describe().contains(&pid.to_string()));
}

/// Whether QEMU has the page at host address `vaddr` mapped (pagemap bit 63).
fn present(pid: u32, vaddr: u64) -> bool {
    use std::os::unix::fs::FileExt;
    let f = std::fs::File::open(format!("/proc/{pid}/pagemap")).unwrap();
    let mut e = [0u8; 8];
    f.read_exact_at(&mut e, vaddr / 4096 * 8).unwrap();
    u64::from_le_bytes(e) & (1 << 63) != 0
}

#[test]
fn memfd_ram_is_reachable_through_proc_fd() {
    let dir = tempfile::tempdir().unwrap();
    let mut q = qemu(MemoryBackend::Memfd { share: true }, dir.path());
    wait_for_mapping(&mut q, |p| p.starts_with("/memfd:"));
    let pid = q.id();
    let fd_path = memfd_of(pid).expect("qemu holds a memfd");
    // Plant a marker through the memfd, as the guest would have written it.
    write_at(&fd_path, 0x1000, b"memfd marker");
    let via_file = GuestMemory::open_ram_file(&fd_path, Layout::pc(RAM).unwrap()).unwrap();
    assert_eq!(via_file.read_vec(0x1000, 12).unwrap(), b"memfd marker");
    assert!(via_file
        .data_ranges()
        .unwrap()
        .iter()
        .any(|r| r.contains(&0x1000)));
    let target = MapTarget::inode_of(&fd_path).unwrap();
    let via_proc = GuestMemory::open_process(pid, &target, Layout::pc(RAM).unwrap()).unwrap();
    assert_eq!(via_proc.read_vec(0x1000, 12).unwrap(), b"memfd marker");
}

fn memfd_of(pid: u32) -> Option<PathBuf> {
    std::fs::read_dir(format!("/proc/{pid}/fd"))
        .ok()?
        .filter_map(|e| e.ok())
        .map(|e| e.path())
        .find(|p| {
            std::fs::read_link(p)
                .map(|l| l.to_string_lossy().starts_with("/memfd:"))
                .unwrap_or(false)
        })
}

#[test]
fn missing_mapping_is_a_clear_error() {
    let (dir, path) = sparse_ram(Some("/dev/shm"), RAM);
    let mut q = qemu(MemoryBackend::SharedFile(path.clone()), dir.path());
    wait_for_mapping(&mut q, |p| Path::new(p) == path);
    let other = MapTarget::Path("/dev/shm/not-this-one".into());
    let err = GuestMemory::open_process(q.id(), &other, Layout::pc(RAM).unwrap()).unwrap_err();
    let chain = format!("{:#}", anyhow::Error::from(err));
    assert!(
        chain.contains("no mapping of /dev/shm/not-this-one"),
        "{chain}"
    );
}

#[test]
fn virtio_mem_device_memory_is_read_at_the_address_qemu_gives_it() {
    let (dir, path) = sparse_ram(Some("/dev/shm"), RAM);
    let vmem = dir.path().join("vmem");
    std::fs::File::create(&vmem)
        .unwrap()
        .set_len(256 * MIB)
        .unwrap();
    let mon = dir.path().join("mon.sock");
    let mut cmd = paused(MemoryBackend::SharedFile(path.clone()));
    cmd.memory.max_mib = Some(1024);
    cmd.control.hmp = Some(mon.clone());
    cmd.devices.push(Device::VirtioMem {
        backend: MemoryBackend::SharedFile(vmem.clone()),
        size_mib: 256,
        requested_mib: 0,
        block_mib: 2,
    });
    let mut q = spawn_qemu(&cmd, &dir.path().join("qemu.log"));
    wait_for_mapping(&mut q, |p| Path::new(p) == vmem);
    let layout = Layout::pc(RAM).unwrap();
    // QEMU's own answer for where the device memory sits.
    let info = hmp(&mon, "info memory-devices");
    let memaddr = info
        .lines()
        .find_map(|l| l.trim().strip_prefix("memaddr: 0x"))
        .map(|h| u64::from_str_radix(h.trim(), 16).unwrap())
        .unwrap_or_else(|| panic!("no memaddr in {info:?}"));
    assert_eq!(memaddr, layout.device_memory_base());
    // virtio-mem discards (punches) all unplugged memory when QEMU starts, so
    // the marker goes in afterwards; the device's file is shared with QEMU.
    write_at(&vmem, 6 * MIB + 3, b"device memory");

    let mut via_file = GuestMemory::open_ram_file(&path, layout).unwrap();
    via_file
        .add_device_memory_file(&vmem, memaddr, 256 * MIB)
        .unwrap();
    assert_eq!(
        via_file.read_vec(memaddr + 6 * MIB + 3, 13).unwrap(),
        b"device memory"
    );
    let pid = q.id();
    let mut via_proc =
        GuestMemory::open_process(pid, &MapTarget::Path(path.clone()), layout).unwrap();
    let dev =
        rebound_guestmem::ProcMemSource::locate(pid, &MapTarget::Path(vmem.clone()), 256 * MIB)
            .unwrap();
    via_proc.add_device_memory(memaddr, dev).unwrap();
    assert_eq!(
        via_proc.read_vec(memaddr + 6 * MIB + 3, 13).unwrap(),
        b"device memory"
    );
    let ranges = via_proc.data_ranges().unwrap();
    assert!(
        ranges.iter().any(|r| r.contains(&(memaddr + 6 * MIB))),
        "{ranges:x?}"
    );
}
