//! Page contents out of a dump file, ELF or kdump-compressed, complete or cut short:
//! what a dump that stopped (a killed daemon) already holds, so a new dump can take
//! those pages from it while the rest comes from the guest's RAM file.
//!
//! A page is "in the dump" only when the file holds its bytes: a kdump page whose
//! descriptor was never written, or an ELF page past the end of a short file, is
//! not, and neither is a page the writer's filter left out.

use std::fs::File;
use std::ops::Range;
use std::os::unix::fs::FileExt;
use std::path::Path;

use crate::elf::{read_elf, PT_LOAD};
use crate::inspect::InspectError;
use crate::kdump::{self, read_kdump, PageDesc, PAGE_DESC_SIZE};
use crate::PAGE_SIZE;

/// Errors reading a page out of a dump.
#[derive(Debug, thiserror::Error)]
pub enum ReadError {
    #[error(transparent)]
    Open(#[from] InspectError),
    #[error("cannot read page {pfn:#x}")]
    Io { pfn: u64, source: std::io::Error },
    #[error("page {pfn:#x} does not decompress ({what})")]
    Decompress { pfn: u64, what: String },
}

/// A dump opened for reading pages.
pub struct DumpPages {
    file: File,
    kind: Kind,
}

enum Kind {
    /// PT_LOAD file parts: (paddr range whose bytes are in the file, file offset).
    Elf(Vec<(Range<u64>, u64)>),
    Kdump {
        /// The 2nd bitmap (dumped pages).
        dumped: Vec<u8>,
        /// Dumped pages before each 64-page word of the bitmap.
        rank: Vec<u64>,
        desc_offset: u64,
        file_len: u64,
    },
}

fn bit(bitmap: &[u8], pfn: u64) -> bool {
    bitmap
        .get((pfn / 8) as usize)
        .is_some_and(|b| b & (1 << (pfn % 8)) != 0)
}

impl DumpPages {
    /// Opens `path`, checking its headers as [`crate::inspect()`] does.
    pub fn open(path: &Path) -> Result<DumpPages, ReadError> {
        let shown = path.display().to_string();
        let (file, elf) = crate::inspect::open_dump(path)?;
        let kind = match elf {
            true => {
                let core = read_elf(&file).map_err(|source| InspectError::Elf {
                    path: shown.clone(),
                    source,
                })?;
                let mut parts: Vec<_> = core
                    .phdrs
                    .iter()
                    .filter(|p| p.p_type == PT_LOAD)
                    .map(|p| {
                        let have = core.file_len.saturating_sub(p.p_offset).min(p.p_filesz);
                        (p.p_paddr..p.p_paddr + have, p.p_offset)
                    })
                    .filter(|(r, _)| !r.is_empty())
                    .collect();
                parts.sort_by_key(|(r, _)| r.start);
                Kind::Elf(parts)
            }
            false => {
                let k = read_kdump(&file).map_err(|source| InspectError::Kdump {
                    path: shown.clone(),
                    source,
                })?;
                let l = k.layout;
                let dumped = kdump::read_exact(
                    &file,
                    k.file_len,
                    l.bitmap2_offset(),
                    l.bitmap_len(),
                    "the 2nd bitmap",
                )
                .map_err(|source| InspectError::Kdump {
                    path: shown.clone(),
                    source,
                })?;
                let mut rank = Vec::with_capacity(dumped.len() / 8 + 1);
                let mut n = 0u64;
                for w in dumped.chunks(8) {
                    rank.push(n);
                    n += w.iter().map(|b| u64::from(b.count_ones())).sum::<u64>();
                }
                Kind::Kdump {
                    dumped,
                    rank,
                    desc_offset: l.desc_offset(),
                    file_len: k.file_len,
                }
            }
        };
        Ok(DumpPages { file, kind })
    }

    /// Guest physical ranges whose bytes the file may hold (a kdump's dumped pages
    /// with a written descriptor are known only page by page: its dumped pages).
    pub fn extents(&self) -> Vec<Range<u64>> {
        match &self.kind {
            Kind::Elf(parts) => parts.iter().map(|(r, _)| r.clone()).collect(),
            Kind::Kdump { dumped, .. } => {
                let mut v: Vec<Range<u64>> = Vec::new();
                for pfn in 0..dumped.len() as u64 * 8 {
                    if !bit(dumped, pfn) {
                        continue;
                    }
                    let r = pfn * PAGE_SIZE..(pfn + 1) * PAGE_SIZE;
                    match v.last_mut() {
                        Some(l) if l.end == r.start => l.end = r.end,
                        _ => v.push(r),
                    }
                }
                v
            }
        }
    }

    /// Reads page `pfn` into `buf`; `false` when the dump does not hold it.
    pub fn read_page(&self, pfn: u64, buf: &mut [u8]) -> Result<bool, ReadError> {
        let buf = &mut buf[..PAGE_SIZE as usize];
        let io = |source| ReadError::Io { pfn, source };
        match &self.kind {
            Kind::Elf(parts) => {
                let gpa = pfn * PAGE_SIZE;
                let i = parts.partition_point(|(r, _)| r.end <= gpa);
                let Some((r, off)) = parts.get(i).filter(|(r, _)| r.start <= gpa) else {
                    return Ok(false);
                };
                if gpa + PAGE_SIZE > r.end {
                    return Ok(false);
                }
                // Within the segment's bytes, which the header check kept inside u64.
                self.file
                    .read_exact_at(buf, off + (gpa - r.start))
                    .map_err(io)?;
                Ok(true)
            }
            Kind::Kdump {
                dumped,
                rank,
                desc_offset,
                file_len,
            } => {
                if !bit(dumped, pfn) {
                    return Ok(false);
                }
                let word = (pfn / 64) as usize;
                let before: u64 = dumped[word * 8..(pfn / 8) as usize]
                    .iter()
                    .map(|b| u64::from(b.count_ones()))
                    .sum::<u64>()
                    + u64::from(
                        (dumped[(pfn / 8) as usize] & ((1u8 << (pfn % 8)) - 1)).count_ones(),
                    );
                let idx = rank[word] + before;
                let mut d = [0u8; PAGE_DESC_SIZE as usize];
                // Offsets come from the file: past the end of u64 is past the end of it.
                let inside =
                    |at: u64, len: u64| at.checked_add(len).is_some_and(|e| e <= *file_len);
                let at = idx
                    .checked_mul(PAGE_DESC_SIZE)
                    .and_then(|o| desc_offset.checked_add(o))
                    .unwrap_or(u64::MAX);
                if !inside(at, PAGE_DESC_SIZE) {
                    return Ok(false);
                }
                self.file.read_exact_at(&mut d, at).map_err(io)?;
                let d = PageDesc::decode(&d);
                if d.offset == 0 || d.size == 0 || !inside(d.offset, u64::from(d.size)) {
                    // Never written: the writer stopped before this page.
                    return Ok(false);
                }
                if d.size > crate::kdump::MAX_BLOCK_SIZE {
                    return Err(ReadError::Decompress {
                        pfn,
                        what: format!("a stored size of {} bytes", d.size),
                    });
                }
                let mut raw = vec![0u8; d.size as usize];
                self.file.read_exact_at(&mut raw, d.offset).map_err(io)?;
                decompress(pfn, d.flags, &raw, buf)?;
                Ok(true)
            }
        }
    }
}

fn decompress(pfn: u64, flags: u32, raw: &[u8], out: &mut [u8]) -> Result<(), ReadError> {
    let bad = |what: String| ReadError::Decompress { pfn, what };
    let n = if flags & kdump::DUMP_DH_COMPRESSED_ZLIB != 0 {
        let mut z = flate2::Decompress::new(true);
        z.decompress(raw, out, flate2::FlushDecompress::Finish)
            .map_err(|e| bad(format!("zlib: {e}")))?;
        z.total_out() as usize
    } else if flags & kdump::DUMP_DH_COMPRESSED_ZSTD != 0 {
        zstd::bulk::decompress_to_buffer(raw, out).map_err(|e| bad(format!("zstd: {e}")))?
    } else if flags & kdump::DUMP_DH_COMPRESSED_LZO != 0 {
        lzo1x::decompress(raw, out).map_err(|e| bad(format!("lzo: {e:?}")))?;
        out.len()
    } else if flags & kdump::DUMP_DH_COMPRESSED_SNAPPY != 0 {
        return Err(bad("snappy pages are not supported".into()));
    } else {
        if raw.len() != out.len() {
            return Err(bad(format!("an uncompressed page of {} bytes", raw.len())));
        }
        out.copy_from_slice(raw);
        out.len()
    };
    if n != out.len() {
        return Err(bad(format!("{n} bytes out, not {}", out.len())));
    }
    Ok(())
}

/// The RAM of a crashed guest whose earlier dumps stopped part way: what the RAM
/// file still holds comes from it, and what it no longer holds (punched once an
/// earlier dump had it durably, or left out by its filter) from the earlier dumps,
/// newest first. A page in none reads as zero, as a hole in the RAM file always did.
/// With no earlier dump it is the RAM file alone.
pub struct ResumeSource {
    ram: rebound_guestmem::FileSource,
    earlier: Vec<DumpPages>,
    layout: rebound_guestmem::Layout,
}

impl ResumeSource {
    pub fn new(
        ram: rebound_guestmem::FileSource,
        earlier: Vec<DumpPages>,
        layout: rebound_guestmem::Layout,
    ) -> ResumeSource {
        ResumeSource {
            ram,
            earlier,
            layout,
        }
    }
}

impl rebound_guestmem::PageSource for ResumeSource {
    fn size(&self) -> u64 {
        self.ram.size()
    }

    fn read_exact_at(
        &self,
        offset: u64,
        buf: &mut [u8],
    ) -> Result<(), rebound_guestmem::SourceError> {
        use rebound_guestmem::SourceError;
        self.ram.read_exact_at(offset, buf)?;
        if self.earlier.is_empty() {
            return Ok(());
        }
        let end = offset + buf.len() as u64;
        let data = self.ram.data_extents_in(offset..end)?;
        // The holes of [offset, end): every page there comes from the earlier dump.
        let mut holes = Vec::new();
        let mut at = offset;
        for d in &data {
            if d.start > at {
                holes.push(at..d.start);
            }
            at = at.max(d.end);
        }
        if at < end {
            holes.push(at..end);
        }
        let mut page = vec![0u8; PAGE_SIZE as usize];
        for hole in holes {
            let first = hole.start / PAGE_SIZE * PAGE_SIZE;
            for off in (first..hole.end).step_by(PAGE_SIZE as usize) {
                let Some(gpa) = self.layout.offset_to_gpa(off) else {
                    continue;
                };
                let mut got = false;
                for d in &self.earlier {
                    got =
                        d.read_page(gpa / PAGE_SIZE, &mut page)
                            .map_err(|e| SourceError::Read {
                                offset: off,
                                len: PAGE_SIZE as usize,
                                source: std::io::Error::other(e),
                            })?;
                    if got {
                        break;
                    }
                }
                if !got {
                    continue;
                }
                // Copy the part of the page inside both the hole and the buffer.
                let s = off.max(hole.start);
                let e = (off + PAGE_SIZE).min(hole.end);
                if s < e {
                    buf[(s - offset) as usize..(e - offset) as usize]
                        .copy_from_slice(&page[(s - off) as usize..(e - off) as usize]);
                }
            }
        }
        Ok(())
    }

    fn data_extents(&self) -> Result<Vec<Range<u64>>, rebound_guestmem::SourceError> {
        let mut all = self.ram.data_extents()?;
        for r in self.earlier.iter().flat_map(DumpPages::extents) {
            all.extend(self.layout.ranges().filter_map(|rr| {
                let g = rr.gpa_range();
                let (s, e) = (r.start.max(g.start), r.end.min(g.end));
                (s < e).then(|| {
                    let o = self.layout.gpa_to_offset(s).expect("inside a RAM range");
                    o..o + (e - s)
                })
            }));
        }
        all.sort_by_key(|r| r.start);
        let mut merged: Vec<Range<u64>> = Vec::new();
        for r in all {
            match merged.last_mut() {
                Some(l) if l.end >= r.start => l.end = l.end.max(r.end),
                _ => merged.push(r),
            }
        }
        Ok(merged)
    }

    fn describe(&self) -> String {
        format!(
            "{} with the pages an earlier dump holds",
            self.ram.describe()
        )
    }
}
