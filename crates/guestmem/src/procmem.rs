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
//! Reads never fault pages into QEMU: each page's pagemap entry decides
//! whether it is read through `/proc/<pid>/mem` (mapped or swapped), from the
//! mapped file at the same offset (not mapped: exactly what a fault would
//! load), or as zeros (anonymous and never touched). So reading a lazily
//! restored guest neither pollutes its first-access trace nor allocates the
//! image's holes. The mapping must map its file from offset 0, as QEMU does.

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

    /// Appends the pagemap entries of `count` pages from RAM page `first`.
    fn pagemap_entries(
        &self,
        first: u64,
        count: u64,
        out: &mut Vec<u64>,
    ) -> Result<(), SourceError> {
        const BATCH: u64 = 64 * 1024; // entries per read (512 KiB)
        let mut buf = vec![0u8; (BATCH.min(count) * 8) as usize];
        let mut page = first;
        while page < first + count {
            let n = BATCH.min(first + count - page);
            let bytes = &mut buf[..(n * 8) as usize];
            pread_exact(&self.pagemap, 0, (self.base / PAGE + page) * 8, bytes)?;
            out.extend(
                bytes
                    .chunks_exact(8)
                    .map(|e| u64::from_le_bytes(e.try_into().expect("8-byte chunk"))),
            );
            page += n;
        }
        Ok(())
    }

    /// Pages present or swapped in the process, as RAM offset ranges.
    fn resident_extents(&self) -> Result<Vec<Range<u64>>, SourceError> {
        let mut entries = Vec::new();
        self.pagemap_entries(0, self.size.div_ceil(PAGE), &mut entries)?;
        let mut out: Vec<Range<u64>> = Vec::new();
        for (i, e) in entries.into_iter().enumerate() {
            if e & (PM_PRESENT | PM_SWAPPED) == 0 {
                continue;
            }
            let off = i as u64 * PAGE;
            let end = (off + PAGE).min(self.size);
            match out.last_mut() {
                Some(last) if last.end == off => last.end = end,
                _ => out.push(off..end),
            }
        }
        Ok(out)
    }

    /// Where the bytes of a page with this pagemap entry are read from.
    fn route(&self, entry: u64) -> Route {
        if entry & (PM_PRESENT | PM_SWAPPED) != 0 {
            Route::Process
        } else if self.backing.is_some() {
            Route::Backing
        } else {
            Route::Zero
        }
    }
}

/// A page mapped in the process is read there; one that is not is read
/// from the mapped file (what a fault would load) or is zero (anonymous).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Route {
    Process,
    Backing,
    Zero,
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

    /// Reads without faulting pages into the process: pages it has not
    /// mapped come from the file (or are zero), so a restored guest's
    /// page-access trace and the image's holes stay as they were.
    fn read_exact_at(&self, offset: u64, buf: &mut [u8]) -> Result<(), SourceError> {
        check_range(offset, buf.len(), self.size)?;
        if buf.is_empty() {
            return Ok(());
        }
        let end = offset + buf.len() as u64;
        let first = offset / PAGE;
        let mut entries = Vec::new();
        self.pagemap_entries(first, (end - 1) / PAGE - first + 1, &mut entries)?;
        let route_at = |pos: u64| self.route(entries[(pos / PAGE - first) as usize]);
        let mut pos = offset;
        while pos < end {
            let route = route_at(pos);
            let mut run_end = (pos / PAGE + 1) * PAGE;
            while run_end < end && route_at(run_end) == route {
                run_end += PAGE;
            }
            let run_end = run_end.min(end);
            let dst = &mut buf[(pos - offset) as usize..(run_end - offset) as usize];
            match (route, &self.backing) {
                (Route::Process, _) => pread_exact(&self.mem, self.base, pos, dst)?,
                (Route::Backing, Some(file)) => pread_exact(file, 0, pos, dst)?,
                _ => dst.fill(0),
            }
            pos = run_end;
        }
        Ok(())
    }

    fn data_extents(&self) -> Result<Vec<Range<u64>>, SourceError> {
        let resident = self.resident_extents()?;
        let in_file = match &self.backing {
            Some(f) => file_data_extents(f, self.size).map_err(|source| SourceError::Extents {
                path: format!("/proc/{}/map_files (backing of {:#x})", self.pid, self.base).into(),
                source,
            })?,
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
