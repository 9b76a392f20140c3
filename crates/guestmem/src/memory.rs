//! Reading guest RAM by guest physical address (GPA).

use std::ops::Range;
use std::path::Path;

use crate::layout::Layout;
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
}

/// Guest RAM of one VM, read by guest physical address.
///
/// ```no_run
/// use rebound_guestmem::{GuestMemory, Layout, find_vmcoreinfo};
/// let mem = GuestMemory::open_ram_file("/dev/shm/vm/ram", Layout::pc(256 << 20))?;
/// let found = find_vmcoreinfo(&mem)?;
/// println!("{} at {:#x}", found.info.osrelease, found.paddr);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug)]
pub struct GuestMemory<S: PageSource = FileSource> {
    layout: Layout,
    source: S,
}

impl GuestMemory<FileSource> {
    /// Opens a RAM file (QEMU's `mem-path`, or `/proc/<pid>/fd/N` for a memfd)
    /// read-only. The file must hold at least `layout.ram_size()` bytes.
    pub fn open_ram_file(path: impl AsRef<Path>, layout: Layout) -> Result<Self, MemoryError> {
        let source = FileSource::open(path, layout.ram_size()).map_err(MemoryError::Open)?;
        Ok(GuestMemory { layout, source })
    }
}

impl GuestMemory<ProcMemSource> {
    /// Reads the RAM of QEMU process `pid` through `/proc/<pid>/mem`, finding
    /// the mapping of `target` (the RAM file's path or inode) in its maps.
    pub fn open_process(pid: u32, target: &MapTarget, layout: Layout) -> Result<Self, MemoryError> {
        let source = ProcMemSource::locate(pid, target, layout.ram_size())?;
        Ok(GuestMemory { layout, source })
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
        Ok(GuestMemory { layout, source })
    }

    pub fn layout(&self) -> &Layout {
        &self.layout
    }

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
            let range = self
                .layout
                .range_of_gpa(at)
                .ok_or_else(|| self.not_ram(at))?;
            let in_range = range.gpa + range.len - at;
            let n = (buf.len() - done).min(usize::try_from(in_range).unwrap_or(usize::MAX));
            let offset = range.offset + (at - range.gpa);
            self.source
                .read_exact_at(offset, &mut buf[done..done + n])
                .map_err(|source| MemoryError::Source { gpa: at, source })?;
            done += n;
        }
        Ok(())
    }

    fn not_ram(&self, gpa: u64) -> MemoryError {
        let last = self.layout.ranges().last();
        let why = match last {
            Some(r) if gpa >= r.gpa + r.len => "past the end of RAM",
            None => "the guest has no RAM",
            _ => "in the PCI hole",
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

    /// GPA ranges that may hold non-zero bytes (allocated in the backing),
    /// sorted; every other RAM address reads as zero.
    pub fn data_ranges(&self) -> Result<Vec<Range<u64>>, MemoryError> {
        let extents = self.source.data_extents().map_err(MemoryError::Extents)?;
        Ok(extents
            .into_iter()
            .flat_map(|r| self.layout.offsets_to_gpa_ranges(r))
            .collect())
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
        let mem = GuestMemory::open_ram_file(&path, Layout::pc(gib(5))).unwrap();
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
        let e = GuestMemory::open_ram_file(&path, Layout::pc(mib(2))).unwrap_err();
        let chain = format!("{e}: {}", std::error::Error::source(&e).unwrap());
        assert!(chain.contains("less than the RAM size 0x200000"), "{chain}");
        let src = FileSource::open(&path, mib(1)).unwrap();
        let e = GuestMemory::new(src, Layout::pc(mib(2))).unwrap_err();
        assert!(e.to_string().contains("differs"), "{e}");
    }

    #[test]
    fn reads_return_the_bytes_at_their_offsets() {
        let (_d, path) = ram_file(mib(4));
        let f = File::options().write(true).open(&path).unwrap();
        f.write_at(b"low marker", 0x1234).unwrap();
        f.write_at(&0xdead_beef_cafe_f00du64.to_le_bytes(), mib(4) - 8)
            .unwrap();
        let mem = GuestMemory::open_ram_file(&path, Layout::pc(mib(4))).unwrap();
        assert_eq!(mem.read_vec(0x1234, 10).unwrap(), b"low marker");
        assert_eq!(mem.read_u64(mib(4) - 8).unwrap(), 0xdead_beef_cafe_f00d);
        assert_eq!(mem.read_u32(mib(4) - 4).unwrap(), 0xdead_beef);
        assert_eq!(mem.read_vec(0, 0).unwrap(), b"");
    }
}
