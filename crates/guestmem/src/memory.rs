//! Reading guest RAM by guest physical address (GPA).

use std::ops::Range;
use std::path::Path;

use crate::layout::{Layout, FOUR_GIB};
use crate::maps::MapTarget;
use crate::procmem::{ProcMemError, ProcMemSource};
use crate::source::{FileSource, PageSource, SourceError};

/// Errors reading guest memory.
#[derive(Debug, thiserror::Error)]
pub enum MemoryError {
    /// The guest physical address is in the PCI hole or past the end of RAM.
    #[error("guest physical address {gpa:#x} is not RAM ({why})")]
    NotRam { gpa: u64, why: &'static str },
    /// The layout's RAM size differs from the backing's.
    #[error("layout RAM size {layout:#x} differs from the {backing} size {size:#x}")]
    SizeMismatch {
        layout: u64,
        backing: String,
        size: u64,
    },
    /// The backing failed.
    #[error("reading guest memory failed at guest physical address {gpa:#x}")]
    Source { gpa: u64, source: SourceError },
    /// Listing the backing's data extents failed.
    #[error("cannot list guest memory data ranges")]
    Extents(#[source] SourceError),
    /// Opening the backing failed.
    #[error("cannot open guest RAM")]
    Open(#[source] SourceError),
    /// Locating guest RAM in a process failed.
    #[error("cannot open guest RAM of a process")]
    Process(#[from] ProcMemError),
    /// A device memory block would overlap RAM already present.
    #[error("device memory {start:#x}..{end:#x} overlaps guest RAM")]
    Overlap { start: u64, end: u64 },
}

/// Guest RAM of one VM, read by guest physical address: the boot RAM
/// block placed by a [`Layout`], plus optional device memory blocks
/// (virtio-mem, pc-dimm), each a separate backing mapped 1:1 at its GPA.
///
/// ```no_run
/// use rebound_guestmem::{GuestMemory, Layout, find_vmcoreinfo};
/// let mem = GuestMemory::open_ram_file("/dev/shm/vm/ram", Layout::pc(256 << 20)?)?;
/// let found = find_vmcoreinfo(&mem)?;
/// println!("{} at {:#x}", found.info.osrelease, found.paddr);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug)]
pub struct GuestMemory<S: PageSource = FileSource> {
    layout: Layout,
    source: S,
    /// Device memory blocks, sorted by GPA, disjoint from boot RAM.
    devices: Vec<DeviceBlock<S>>,
}

#[derive(Debug)]
struct DeviceBlock<S> {
    gpa: u64,
    source: S,
}

/// Where a GPA lives: backing, offset in it, bytes left in that piece.
struct Located<'a, S> {
    source: &'a S,
    offset: u64,
    left: u64,
}

impl GuestMemory<FileSource> {
    /// Opens a RAM file (QEMU's `mem-path`, or `/proc/<pid>/fd/N` for a memfd)
    /// read-only. The file must hold at least `layout.ram_size()` bytes.
    pub fn open_ram_file(path: impl AsRef<Path>, layout: Layout) -> Result<Self, MemoryError> {
        let source = FileSource::open(path, layout.ram_size()).map_err(MemoryError::Open)?;
        Self::new(source, layout)
    }

    /// Adds a device memory file (a virtio-mem or pc-dimm `memdev`) of
    /// `size` bytes mapped at `gpa` (e.g. [`Layout::device_memory_base`]).
    pub fn add_device_memory_file(
        &mut self,
        path: impl AsRef<Path>,
        gpa: u64,
        size: u64,
    ) -> Result<(), MemoryError> {
        let source = FileSource::open(path, size).map_err(MemoryError::Open)?;
        self.add_device_memory(gpa, source)
    }
}

impl GuestMemory<ProcMemSource> {
    /// Reads the RAM of QEMU process `pid` through `/proc/<pid>/mem`, finding
    /// the mapping of `target` (the RAM file's path or inode) in its maps.
    pub fn open_process(pid: u32, target: &MapTarget, layout: Layout) -> Result<Self, MemoryError> {
        let source = ProcMemSource::locate(pid, target, layout.ram_size())?;
        Self::new(source, layout)
    }
}

impl<S: PageSource> GuestMemory<S> {
    /// Guest memory over any backing of exactly `layout.ram_size()` bytes.
    pub fn new(source: S, layout: Layout) -> Result<Self, MemoryError> {
        if source.size() != layout.ram_size() {
            return Err(MemoryError::SizeMismatch {
                layout: layout.ram_size(),
                backing: source.describe(),
                size: source.size(),
            });
        }
        Ok(GuestMemory {
            layout,
            source,
            devices: Vec::new(),
        })
    }

    /// Adds a device memory block: all of `source` mapped at `gpa`.
    pub fn add_device_memory(&mut self, gpa: u64, source: S) -> Result<(), MemoryError> {
        let start = gpa;
        let end = gpa.checked_add(source.size()).ok_or(MemoryError::Overlap {
            start,
            end: u64::MAX,
        })?;
        let boot = self.layout.ranges().map(|r| r.gpa_range());
        let devices = self.devices.iter().map(|d| d.gpa..d.gpa + d.source.size());
        if boot.chain(devices).any(|r| r.start < end && start < r.end) {
            return Err(MemoryError::Overlap { start, end });
        }
        let at = self.devices.partition_point(|d| d.gpa < gpa);
        self.devices.insert(at, DeviceBlock { gpa, source });
        Ok(())
    }

    pub fn layout(&self) -> &Layout {
        &self.layout
    }

    /// The boot RAM backing.
    pub fn source(&self) -> &S {
        &self.source
    }

    /// Fills `buf` from guest physical address `gpa`. A read may span the
    /// PCI hole's edges only if every byte is RAM; otherwise the error names
    /// the first address that is not.
    pub fn read(&self, gpa: u64, buf: &mut [u8]) -> Result<(), MemoryError> {
        let mut done = 0usize;
        while done < buf.len() {
            let at = gpa.checked_add(done as u64).ok_or(MemoryError::NotRam {
                gpa: u64::MAX,
                why: "address overflows",
            })?;
            let Located {
                source,
                offset,
                left,
            } = self.locate(at).ok_or_else(|| self.not_ram(at))?;
            let n = (buf.len() - done).min(usize::try_from(left).unwrap_or(usize::MAX));
            source
                .read_exact_at(offset, &mut buf[done..done + n])
                .map_err(|source| MemoryError::Source { gpa: at, source })?;
            done += n;
        }
        Ok(())
    }

    fn locate(&self, gpa: u64) -> Option<Located<'_, S>> {
        if let Some(r) = self.layout.range_of_gpa(gpa) {
            return Some(Located {
                source: &self.source,
                offset: r.offset + (gpa - r.gpa),
                left: r.gpa + r.len - gpa,
            });
        }
        let d = self
            .devices
            .iter()
            .find(|d| (d.gpa..d.gpa + d.source.size()).contains(&gpa))?;
        Some(Located {
            source: &d.source,
            offset: gpa - d.gpa,
            left: d.gpa + d.source.size() - gpa,
        })
    }

    fn not_ram(&self, gpa: u64) -> MemoryError {
        let ends = self.layout.ranges().map(|r| r.gpa + r.len);
        let end = ends
            .chain(self.devices.iter().map(|d| d.gpa + d.source.size()))
            .max();
        let why = match end {
            None => "the guest has no RAM",
            Some(end) if gpa >= end => "past the end of RAM",
            _ if (self.layout.below_4g_size()..FOUR_GIB).contains(&gpa) => "in the PCI hole",
            _ => "between RAM blocks",
        };
        MemoryError::NotRam { gpa, why }
    }

    /// `len` bytes from `gpa`.
    pub fn read_vec(&self, gpa: u64, len: usize) -> Result<Vec<u8>, MemoryError> {
        let mut v = vec![0u8; len];
        self.read(gpa, &mut v)?;
        Ok(v)
    }

    /// A little-endian u64 at `gpa`.
    pub fn read_u64(&self, gpa: u64) -> Result<u64, MemoryError> {
        let mut b = [0u8; 8];
        self.read(gpa, &mut b)?;
        Ok(u64::from_le_bytes(b))
    }

    /// A little-endian u32 at `gpa`.
    pub fn read_u32(&self, gpa: u64) -> Result<u32, MemoryError> {
        let mut b = [0u8; 4];
        self.read(gpa, &mut b)?;
        Ok(u32::from_le_bytes(b))
    }

    /// Every RAM range by GPA, sorted: boot RAM and device memory blocks.
    pub fn ram_ranges(&self) -> Vec<Range<u64>> {
        let mut out: Vec<Range<u64>> = self.layout.ranges().map(|r| r.gpa_range()).collect();
        out.extend(self.devices.iter().map(|d| d.gpa..d.gpa + d.source.size()));
        out.sort_by_key(|r| r.start);
        out
    }

    /// GPA ranges that may hold non-zero bytes (allocated in the backing),
    /// sorted; every other RAM address reads as zero.
    pub fn data_ranges(&self) -> Result<Vec<Range<u64>>, MemoryError> {
        let extents = self.source.data_extents().map_err(MemoryError::Extents)?;
        let mut out: Vec<Range<u64>> = extents
            .into_iter()
            .flat_map(|r| self.layout.offsets_to_gpa_ranges(r))
            .collect();
        for d in &self.devices {
            let extents = d.source.data_extents().map_err(MemoryError::Extents)?;
            out.extend(extents.into_iter().map(|r| d.gpa + r.start..d.gpa + r.end));
        }
        out.sort_by_key(|r| r.start);
        Ok(out)
    }

    /// Bytes of guest RAM that hold data in the backing (sum of [`Self::data_ranges`]).
    pub fn allocated_bytes(&self) -> Result<u64, MemoryError> {
        Ok(self.data_ranges()?.iter().map(|r| r.end - r.start).sum())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::layout::{gib, mib};
    use std::fs::File;
    use std::os::unix::fs::FileExt;

    fn ram_file(size: u64) -> (tempfile::TempDir, std::path::PathBuf) {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("ram");
        File::create(&path).unwrap().set_len(size).unwrap();
        (dir, path)
    }

    #[test]
    fn errors_name_the_address_and_the_reason() {
        let (_d, path) = ram_file(gib(5));
        let mem = GuestMemory::open_ram_file(&path, Layout::pc(gib(5)).unwrap()).unwrap();
        let mut buf = [0u8; 16];
        let e = mem.read(gib(3) + 0x1000, &mut buf).unwrap_err().to_string();
        assert_eq!(
            e,
            "guest physical address 0xc0001000 is not RAM (in the PCI hole)"
        );
        let e = mem.read(gib(6), &mut buf).unwrap_err().to_string();
        assert_eq!(
            e,
            "guest physical address 0x180000000 is not RAM (past the end of RAM)"
        );
        // A read that runs from RAM into the hole names the first hole byte.
        let e = mem.read(gib(3) - 8, &mut buf).unwrap_err().to_string();
        assert!(e.contains("0xc0000000"), "{e}");
        let e = mem.read(u64::MAX - 3, &mut buf).unwrap_err().to_string();
        assert!(e.contains("not RAM"), "{e}");
    }

    #[test]
    fn layout_must_fit_the_file() {
        let (_d, path) = ram_file(mib(1));
        let e = GuestMemory::open_ram_file(&path, Layout::pc(mib(2)).unwrap()).unwrap_err();
        let chain = format!("{e}: {}", std::error::Error::source(&e).unwrap());
        assert!(chain.contains("less than the RAM size 0x200000"), "{chain}");
        let src = FileSource::open(&path, mib(1)).unwrap();
        let e = GuestMemory::new(src, Layout::pc(mib(2)).unwrap()).unwrap_err();
        assert!(e.to_string().contains("differs"), "{e}");
    }

    #[test]
    fn device_memory_blocks_are_read_at_their_gpa() {
        let (_d, path) = ram_file(mib(512));
        let (_d2, vmem) = ram_file(gib(1));
        File::options()
            .write(true)
            .open(&vmem)
            .unwrap()
            .write_at(b"plugged", mib(2) + 5)
            .unwrap();
        let layout = Layout::pc(mib(512)).unwrap();
        let mut mem = GuestMemory::open_ram_file(&path, layout).unwrap();
        let base = layout.device_memory_base();
        mem.add_device_memory_file(&vmem, base, gib(1)).unwrap();
        assert_eq!(mem.read_vec(base + mib(2) + 5, 7).unwrap(), b"plugged");
        let ranges = mem.data_ranges().unwrap();
        assert!(
            ranges.iter().any(|r| r.contains(&(base + mib(2) + 5))),
            "{ranges:x?}"
        );
        let e = mem.read_vec(mib(600), 1).unwrap_err().to_string();
        assert!(e.ends_with("(in the PCI hole)"), "{e}");
        let e = mem.read_vec(base + gib(1), 1).unwrap_err().to_string();
        assert!(e.ends_with("(past the end of RAM)"), "{e}");
        // Overlaps with boot RAM or another block are refused.
        let (_d3, other) = ram_file(mib(4));
        for gpa in [mib(510), base + gib(1) - 1] {
            let e = mem.add_device_memory_file(&other, gpa, mib(4)).unwrap_err();
            assert!(
                e.to_string().contains("overlaps guest RAM"),
                "{gpa:#x}: {e}"
            );
        }
        // A second block after a gap: the gap is "between RAM blocks".
        mem.add_device_memory_file(&other, base + gib(2), mib(4))
            .unwrap();
        let e = mem.read_vec(base + gib(1) + 7, 1).unwrap_err().to_string();
        assert!(e.ends_with("(between RAM blocks)"), "{e}");
        assert!(mem.read_vec(base + gib(2), 16).is_ok());
    }

    #[test]
    fn boxed_sources_mix_backings() {
        let (_d, path) = ram_file(mib(4));
        let (_d2, dev) = ram_file(mib(2));
        File::options()
            .write(true)
            .open(&dev)
            .unwrap()
            .write_at(b"boxed", 0)
            .unwrap();
        let layout = Layout::pc(mib(4)).unwrap();
        let boot: Box<dyn PageSource> = Box::new(FileSource::open(&path, mib(4)).unwrap());
        let mut mem = GuestMemory::new(boot, layout).unwrap();
        let dev: Box<dyn PageSource> = Box::new(FileSource::open(&dev, mib(2)).unwrap());
        mem.add_device_memory(FOUR_GIB, dev).unwrap();
        assert_eq!(mem.read_vec(FOUR_GIB, 5).unwrap(), b"boxed");
        assert!(mem.source().describe().contains("RAM file"));
    }

    #[test]
    fn reads_return_the_bytes_at_their_offsets() {
        let (_d, path) = ram_file(mib(4));
        let f = File::options().write(true).open(&path).unwrap();
        f.write_at(b"low marker", 0x1234).unwrap();
        f.write_at(&0xdead_beef_cafe_f00du64.to_le_bytes(), mib(4) - 8)
            .unwrap();
        let mem = GuestMemory::open_ram_file(&path, Layout::pc(mib(4)).unwrap()).unwrap();
        assert_eq!(mem.read_vec(0x1234, 10).unwrap(), b"low marker");
        assert_eq!(mem.read_u64(mib(4) - 8).unwrap(), 0xdead_beef_cafe_f00d);
        assert_eq!(mem.read_u32(mib(4) - 4).unwrap(), 0xdead_beef);
        assert_eq!(mem.read_vec(0, 0).unwrap(), b"");
    }
}
