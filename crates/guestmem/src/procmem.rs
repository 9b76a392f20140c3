//! Guest RAM read through the QEMU process: `/proc/<pid>/mem` at the host
//! virtual address where QEMU mapped the RAM block.
//!
//! This is the only way to see a lazily restored guest: its RAM is a
//! `MAP_PRIVATE` mapping of the snapshot image, so pages the guest wrote since
//! the restore exist only in QEMU's memory, not in any file.
//!
//! Which parts hold data is the union of
//! - pages `/proc/<pid>/pagemap` shows present (bit 63) or swapped (bit 62), and
//! - the data extents (`SEEK_DATA`) of the mapped file, if any: a page not yet
//!   faulted in reads from the file.
//!
//! Caveat: reading a page that is not present makes the kernel fault it into
//! QEMU (from the image for a private mapping). Scans through this source
//! therefore only read the extents above, and a caller tracing a restored
//! guest's first accesses should read before or after the trace, not during.

use std::fs::File;
use std::io;
use std::ops::Range;
use std::path::PathBuf;

use crate::maps::{find_ram_mapping, read_maps, MapEntry, MapTarget, MapsError};
use crate::source::{check_range, file_data_extents, pread_exact, PageSource, SourceError};

/// Errors setting up a process memory source.
#[derive(Debug, thiserror::Error)]
pub enum ProcMemError {
    /// The RAM mapping could not be found in the process.
    #[error("cannot locate guest RAM in the QEMU process")]
    Maps(#[from] MapsError),
    /// A `/proc` file of the process could not be opened.
    #[error("cannot open {path}")]
    Open { path: PathBuf, source: io::Error },
    /// The mapping's base address is not page aligned.
    #[error("RAM mapping base {0:#x} is not page aligned")]
    Unaligned(u64),
}

const PAGE: u64 = 4096;
const PM_PRESENT: u64 = 1 << 63;
const PM_SWAPPED: u64 = 1 << 62;

/// A RAM block inside a live process.
#[derive(Debug)]
pub struct ProcMemSource {
    pid: u32,
    mem: File,
    pagemap: File,
    backing: Option<File>,
    base: u64,
    size: u64,
}

fn open_proc(path: String) -> Result<File, ProcMemError> {
    File::open(&path).map_err(|source| ProcMemError::Open {
        path: path.into(),
        source,
    })
}

impl ProcMemSource {
    /// The RAM block of `size` bytes mapped at host virtual address `base` in
    /// process `pid`. `backing` is the file mapped there (if any), used only to
    /// find data extents.
    pub fn new(
        pid: u32,
        base: u64,
        size: u64,
        backing: Option<File>,
    ) -> Result<ProcMemSource, ProcMemError> {
        if !base.is_multiple_of(PAGE) {
            return Err(ProcMemError::Unaligned(base));
        }
        Ok(ProcMemSource {
            pid,
            mem: open_proc(format!("/proc/{pid}/mem"))?,
            pagemap: open_proc(format!("/proc/{pid}/pagemap"))?,
            backing,
            base,
            size,
        })
    }

    /// Finds the mapping of `target` in `/proc/<pid>/maps` and opens it.
    pub fn locate(pid: u32, target: &MapTarget, size: u64) -> Result<ProcMemSource, ProcMemError> {
        let entry = find_ram_mapping(&read_maps(pid)?, pid, target, size)?;
        let backing = open_backing(pid, &entry);
        Self::new(pid, entry.start, size, backing)
    }

    /// Host virtual address of the RAM block in the process.
    pub fn base(&self) -> u64 {
        self.base
    }

    /// Pages present or swapped in the process, as RAM offset ranges.
    fn resident_extents(&self) -> io::Result<Vec<Range<u64>>> {
        const BATCH: u64 = 64 * 1024; // pagemap entries per read (512 KiB)
        let pages = self.size.div_ceil(PAGE);
        let mut out: Vec<Range<u64>> = Vec::new();
        let mut buf = vec![0u8; (BATCH * 8) as usize];
        let mut page = 0;
        while page < pages {
            let n = BATCH.min(pages - page);
            let bytes = &mut buf[..(n * 8) as usize];
            let pos = (self.base / PAGE + page) * 8;
            pread_exact(&self.pagemap, 0, pos, bytes).map_err(io::Error::other)?;
            for (i, e) in bytes.chunks_exact(8).enumerate() {
                let e = u64::from_le_bytes(e.try_into().expect("8-byte chunk"));
                if e & (PM_PRESENT | PM_SWAPPED) == 0 {
                    continue;
                }
                let off = (page + i as u64) * PAGE;
                let end = (off + PAGE).min(self.size);
                match out.last_mut() {
                    Some(last) if last.end == off => last.end = end,
                    _ => out.push(off..end),
                }
            }
            page += n;
        }
        Ok(out)
    }
}

/// The file behind a mapping: through `map_files` (works for deleted files
/// and memfds), else by its shown path. `None` for anonymous memory.
fn open_backing(pid: u32, e: &MapEntry) -> Option<File> {
    if e.inode == 0 {
        return None;
    }
    File::open(format!("/proc/{pid}/map_files/{:x}-{:x}", e.start, e.end))
        .or_else(|_| File::open(e.file_path()))
        .ok()
}

/// Union of two sorted lists of disjoint ranges.
pub(crate) fn union(a: &[Range<u64>], b: &[Range<u64>]) -> Vec<Range<u64>> {
    let mut all: Vec<Range<u64>> = a.iter().chain(b).cloned().collect();
    all.sort_by_key(|r| r.start);
    let mut out: Vec<Range<u64>> = Vec::with_capacity(all.len());
    for r in all {
        match out.last_mut() {
            Some(last) if r.start <= last.end => last.end = last.end.max(r.end),
            _ => out.push(r),
        }
    }
    out
}

impl PageSource for ProcMemSource {
    fn size(&self) -> u64 {
        self.size
    }

    fn read_exact_at(&self, offset: u64, buf: &mut [u8]) -> Result<(), SourceError> {
        check_range(offset, buf.len(), self.size)?;
        pread_exact(&self.mem, self.base, offset, buf)
    }

    fn data_extents(&self) -> Result<Vec<Range<u64>>, SourceError> {
        let err = |source| SourceError::Extents {
            path: format!("/proc/{}/pagemap", self.pid).into(),
            source,
        };
        let resident = self.resident_extents().map_err(err)?;
        let in_file = match &self.backing {
            Some(f) => file_data_extents(f, self.size).map_err(err)?,
            None => Vec::new(),
        };
        Ok(union(&resident, &in_file))
    }

    fn describe(&self) -> String {
        format!("memory of process {} at {:#x}", self.pid, self.base)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn union_merges_overlaps_and_neighbours() {
        assert_eq!(
            union(&[0..4, 10..12], &[2..6, 12..14, 20..21]),
            vec![0..6, 10..14, 20..21]
        );
        assert_eq!(union(&[], &[1..2]), vec![1..2]);
        assert_eq!(union(&[0..10], &[2..3]), vec![0..10]);
    }

    #[test]
    fn unaligned_base_is_refused() {
        let err = ProcMemSource::new(std::process::id(), 4097, 4096, None).unwrap_err();
        assert!(err.to_string().contains("0x1001"), "{err}");
    }
}
