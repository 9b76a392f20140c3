//! Reading the note at a known address, or finding it by scanning guest RAM.

use std::collections::BTreeMap;

use super::note::{NoteHeader, NOTE_NAME, PREFIX};
use super::{VmcoreInfo, VmcoreinfoError};
use crate::buddy::free_pages;
use crate::memory::GuestMemory;
use crate::pagetable::KernelPageTables;
use crate::source::PageSource;

/// Scan chunk: large reads keep the syscall count low.
const CHUNK: u64 = 4 << 20;

/// A note found in guest RAM.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Found {
    /// Guest physical address of the note header.
    pub paddr: u64,
    pub info: VmcoreInfo,
}

/// Parses the guest's `/sys/kernel/vmcoreinfo` (`"%pa %x"`: the note's
/// physical address and the note buffer size, both hex) into `(paddr, size)`.
pub fn parse_sysfs_vmcoreinfo(text: &str) -> Result<(u64, u64), VmcoreinfoError> {
    let bad = || VmcoreinfoError::BadSysfs(text.chars().take(100).collect());
    let mut it = text.split_ascii_whitespace();
    let (Some(a), Some(s), None) = (it.next(), it.next(), it.next()) else {
        return Err(bad());
    };
    let hex = |v: &str| {
        let d = v.strip_prefix("0x").unwrap_or(v);
        if d.is_empty() || !d.bytes().all(|b| b.is_ascii_hexdigit()) {
            return None;
        }
        u64::from_str_radix(d, 16).ok()
    };
    Ok((hex(a).ok_or_else(bad)?, hex(s).ok_or_else(bad)?))
}

/// Reads and parses the note at guest physical address `paddr`; `size` is
/// the note buffer size the guest reported (the note must fit in it).
pub fn read_vmcoreinfo<S: PageSource>(
    mem: &GuestMemory<S>,
    paddr: u64,
    size: u64,
) -> Result<VmcoreInfo, VmcoreinfoError> {
    if size < PREFIX as u64 {
        return Err(VmcoreinfoError::Truncated {
            need: PREFIX as u64,
            have: size,
        });
    }
    let mut prefix = [0u8; PREFIX];
    mem.read(paddr, &mut prefix)?;
    let descsz = NoteHeader::validate(&prefix)?;
    let need = PREFIX as u64 + u64::from(descsz);
    if need > size {
        return Err(VmcoreinfoError::Truncated { need, have: size });
    }
    let desc = mem.read_vec(paddr + PREFIX as u64, descsz as usize)?;
    VmcoreInfo::parse(&desc)
}

/// Every valid VMCOREINFO note in guest RAM, by address. Only data ranges
/// are read (holes are never touched), in 4 MiB `pread`s. A candidate must
/// be 4-byte aligned, have namesz 11, type 0, the NUL-padded name, and text
/// that parses.
pub fn find_vmcoreinfo_all<S: PageSource>(
    mem: &GuestMemory<S>,
) -> Result<(Vec<Found>, Rejected), VmcoreinfoError> {
    let finder = memchr::memmem::Finder::new(&NOTE_NAME[..]);
    let mut found: BTreeMap<u64, VmcoreInfo> = BTreeMap::new();
    let mut rejected = Rejected::default();
    let mut buf = vec![0u8; CHUNK as usize];
    for range in mem.data_ranges()? {
        let mut start = range.start;
        while start < range.end {
            let len = CHUNK.min(range.end - start);
            let chunk = &mut buf[..len as usize];
            mem.read(start, chunk)?;
            for hit in finder.find_iter(chunk) {
                let Some(at) = hit.checked_sub(NoteHeader::SIZE) else {
                    continue; // header before the range: a hole, zeros, not a note
                };
                let paddr = start + at as u64;
                if !paddr.is_multiple_of(4) || found.contains_key(&paddr) {
                    continue;
                }
                match candidate(mem, chunk, at, paddr) {
                    Ok(info) => {
                        found.insert(paddr, info);
                    }
                    Err(e) => rejected.note(paddr, e),
                }
            }
            if start + len >= range.end {
                break;
            }
            // Overlap so a header+name straddling chunks is seen whole.
            start += len - PREFIX as u64;
        }
    }
    let found = found
        .into_iter()
        .map(|(paddr, info)| Found { paddr, info })
        .collect();
    Ok((found, rejected))
}

/// Candidates that looked like a note but were not (for diagnostics).
#[derive(Debug, Default)]
pub struct Rejected {
    pub count: usize,
    /// The last rejection: address and reason.
    pub last: Option<(u64, String)>,
}

impl Rejected {
    fn note(&mut self, paddr: u64, e: VmcoreinfoError) {
        self.count += 1;
        self.last = Some((paddr, e.to_string()));
    }
}

fn candidate<S: PageSource>(
    mem: &GuestMemory<S>,
    chunk: &[u8],
    at: usize,
    paddr: u64,
) -> Result<VmcoreInfo, VmcoreinfoError> {
    let descsz = NoteHeader::validate(&chunk[at..])? as usize;
    let text_at = at + PREFIX;
    match chunk.get(text_at..text_at + descsz) {
        Some(desc) => VmcoreInfo::parse(desc),
        // The text runs past this chunk: read it directly.
        None => VmcoreInfo::parse(&mem.read_vec(paddr + PREFIX as u64, descsz)?),
    }
}

/// The live VMCOREINFO note, found by scanning guest RAM.
///
/// RAM survives a guest reset, so a note from a previous boot may remain.
/// Copies with identical text are equivalent and the lowest address is
/// returned. Of differing notes, the one whose kernel holds every other
/// note's page as free memory is live; if no single note qualifies (the old
/// page was reused but not overwritten) the result is an
/// [`VmcoreinfoError::Ambiguous`] error. Prefer the address the guest
/// reports (`/sys/kernel/vmcoreinfo`) when there is one.
pub fn find_vmcoreinfo<S: PageSource>(mem: &GuestMemory<S>) -> Result<Found, VmcoreinfoError> {
    let (mut found, rejected) = find_vmcoreinfo_all(mem)?;
    if found.is_empty() {
        return Err(VmcoreinfoError::NotFound {
            candidates: rejected.count,
            last: rejected
                .last
                .map(|(a, e)| format!("; last at {a:#x}: {e}"))
                .unwrap_or_default(),
        });
    }
    if found.iter().any(|f| f.info.text != found[0].info.text) {
        return match pick_live(mem, &found) {
            Some(i) => Ok(found.swap_remove(i)),
            None => Err(VmcoreinfoError::Ambiguous {
                addresses: found.iter().map(|f| f.paddr).collect(),
            }),
        };
    }
    Ok(found.swap_remove(0))
}

/// Among differing notes, the live one: the only note whose own kernel
/// (its page tables and `struct page`s) reads as consistent, keeps its note
/// page in use, and has every other note's page on its free lists, as a
/// note left by a previous boot is once the new kernel owns the memory.
fn pick_live<S: PageSource>(mem: &GuestMemory<S>, found: &[Found]) -> Option<usize> {
    let mut live = None;
    for (i, c) in found.iter().enumerate() {
        let Ok(pt) = KernelPageTables::from_vmcoreinfo(&c.info) else {
            continue;
        };
        let Ok(free) = free_pages(mem, &c.info, &pt) else {
            continue;
        };
        let others_free = found
            .iter()
            .enumerate()
            .all(|(j, o)| j == i || free.contains(o.paddr));
        if others_free && !free.contains(c.paddr) {
            if live.is_some() {
                return None;
            }
            live = Some(i);
        }
    }
    live
}
