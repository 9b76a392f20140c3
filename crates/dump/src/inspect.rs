//! What a vmcore holds: format, RAM covered, VMCOREINFO, kernel release,
//! CPUs, and whether it is complete (and if not, which guest ranges are
//! missing). Reads ELF core files and kdump-compressed files, ours or the
//! tools'; every header field is checked against the file before use.

use std::fs::File;
use std::ops::Range;
use std::path::Path;

use crate::elf::{self, read_elf, ElfError, PT_LOAD, PT_NOTE};
use crate::kdump::{self, read_exact, read_kdump, KdumpError, PageDesc, PAGE_DESC_SIZE};
use crate::notes::{parse_notes, Note, NoteError, MAX_NOTES_BYTES};

/// Errors inspecting a dump.
#[derive(Debug, thiserror::Error)]
pub enum InspectError {
    /// The file cannot be opened or read.
    #[error("cannot read {path}")]
    Io {
        path: String,
        source: std::io::Error,
    },
    /// Neither an ELF nor a kdump-compressed file.
    #[error("{path} is not a vmcore: it starts with {magic:02x?}, neither ELF nor \"KDUMP   \"")]
    Magic { path: String, magic: Vec<u8> },
    /// The ELF headers are malformed.
    #[error("{path}: malformed ELF vmcore")]
    Elf { path: String, source: ElfError },
    /// The kdump headers are malformed.
    #[error("{path}: malformed kdump-compressed vmcore")]
    Kdump { path: String, source: KdumpError },
    /// The notes are malformed.
    #[error("{path}: malformed notes")]
    Notes { path: String, source: NoteError },
}

/// The kind of dump file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DumpKind {
    /// ELF64 core file.
    Elf,
    /// kdump-compressed; the compression named by the header
    /// (`none`, `zlib`, `lzo`, `snappy`, `zstd`).
    Kdump { compression: &'static str },
}

/// What a dump file holds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DumpInfo {
    pub kind: DumpKind,
    /// Guest physical ranges the dump describes (merged).
    pub ram: Vec<Range<u64>>,
    /// Pages in those ranges.
    pub pages_covered: u64,
    /// Pages whose contents are in the dump (the rest were filtered out).
    pub pages_dumped: u64,
    /// Whether there is a VMCOREINFO note.
    pub vmcoreinfo: bool,
    /// `OSRELEASE` from VMCOREINFO.
    pub osrelease: Option<String>,
    /// `NT_PRSTATUS` notes.
    pub cpus: usize,
    /// Whether every dumped page is in the file and the writer finished.
    pub complete: bool,
    /// Guest physical ranges whose dumped contents are not in the file.
    pub missing: Vec<Range<u64>>,
    /// Why the dump is not complete, one sentence each.
    pub problems: Vec<String>,
    /// The file's size.
    pub file_bytes: u64,
}

fn push_merged(v: &mut Vec<Range<u64>>, r: Range<u64>) {
    if r.is_empty() {
        return;
    }
    match v.last_mut() {
        Some(last) if last.end >= r.start => last.end = last.end.max(r.end),
        _ => v.push(r),
    }
}

fn osrelease(notes: &[Note]) -> (bool, Option<String>) {
    let Some(n) = notes.iter().find(|n| n.is_vmcoreinfo()) else {
        return (false, None);
    };
    let text = String::from_utf8_lossy(&n.desc);
    let rel = text
        .lines()
        .find_map(|l| l.strip_prefix("OSRELEASE="))
        .map(str::to_string);
    (true, rel)
}

/// Opens a dump: the file, and whether it is ELF (`true`) or kdump-compressed.
pub(crate) fn open_dump(path: &Path) -> Result<(File, bool), InspectError> {
    let io = |source| InspectError::Io {
        path: path.display().to_string(),
        source,
    };
    let file = File::open(path).map_err(io)?;
    let mut magic = [0u8; 8];
    let n = std::os::unix::fs::FileExt::read_at(&file, &mut magic, 0).map_err(io)?;
    if magic[..n].starts_with(b"\x7fELF") {
        Ok((file, true))
    } else if magic[..n] == *kdump::SIGNATURE {
        Ok((file, false))
    } else {
        Err(InspectError::Magic {
            path: path.display().to_string(),
            magic: magic[..n].to_vec(),
        })
    }
}

/// Inspects the dump at `path`.
pub fn inspect(path: impl AsRef<Path>) -> Result<DumpInfo, InspectError> {
    let path = path.as_ref();
    let shown = path.display().to_string();
    let mut info = match open_dump(path)? {
        (file, true) => inspect_elf(&file, &shown)?,
        (file, false) => inspect_kdump(&file, &shown)?,
    };
    if path.extension().is_some_and(|e| e == "partial") {
        info.problems
            .push("the file is still named .partial: its writer did not finish".into());
    }
    if !info.missing.is_empty() {
        let bytes: u64 = info.missing.iter().map(|r| r.end - r.start).sum();
        info.problems.push(format!(
            "{bytes:#x} bytes of dumped guest RAM are not in the file, from GPA {:#x}",
            info.missing[0].start
        ));
    }
    info.complete = info.problems.is_empty();
    Ok(info)
}

fn inspect_elf(file: &File, shown: &str) -> Result<DumpInfo, InspectError> {
    let elf_err = |source| InspectError::Elf {
        path: shown.to_string(),
        source,
    };
    let core = read_elf(file).map_err(elf_err)?;
    let mut notes = Vec::new();
    for p in core.phdrs.iter().filter(|p| p.p_type == PT_NOTE) {
        if p.p_filesz > MAX_NOTES_BYTES {
            return Err(InspectError::Notes {
                path: shown.to_string(),
                source: NoteError::TooLarge(p.p_filesz),
            });
        }
        let buf = elf::read_at(file, core.file_len, p.p_offset, p.p_filesz, "PT_NOTE")
            .map_err(elf_err)?;
        notes.extend(parse_notes(&buf).map_err(|source| InspectError::Notes {
            path: shown.to_string(),
            source,
        })?);
    }
    let mut loads: Vec<_> = core.phdrs.iter().filter(|p| p.p_type == PT_LOAD).collect();
    loads.sort_by_key(|p| p.p_paddr);
    let mut ram = Vec::new();
    let mut missing = Vec::new();
    let (mut covered, mut dumped) = (0, 0);
    for p in loads {
        push_merged(&mut ram, p.p_paddr..p.p_paddr + p.p_memsz);
        covered += p.p_memsz.div_ceil(crate::PAGE_SIZE);
        dumped += p.p_filesz.div_ceil(crate::PAGE_SIZE);
        let have = core.file_len.saturating_sub(p.p_offset).min(p.p_filesz);
        if p.p_filesz > 0 && have < p.p_filesz {
            push_merged(&mut missing, p.p_paddr + have..p.p_paddr + p.p_filesz);
        }
    }
    let (vmcoreinfo, osrelease) = osrelease(&notes);
    let mut problems = Vec::new();
    if ram.is_empty() {
        problems.push("the file has no PT_LOAD: no guest RAM".into());
    }
    Ok(DumpInfo {
        kind: DumpKind::Elf,
        ram,
        pages_covered: covered,
        pages_dumped: dumped,
        vmcoreinfo,
        osrelease,
        cpus: notes.iter().filter(|n| n.is_prstatus()).count(),
        complete: false,
        missing,
        problems,
        file_bytes: core.file_len,
    })
}

fn bit(bitmap: &[u8], pfn: u64) -> bool {
    bitmap
        .get((pfn / 8) as usize)
        .is_some_and(|b| b & (1 << (pfn % 8)) != 0)
}

fn inspect_kdump(file: &File, shown: &str) -> Result<DumpInfo, InspectError> {
    let kd_err = |source| InspectError::Kdump {
        path: shown.to_string(),
        source,
    };
    let k = read_kdump(file).map_err(kd_err)?;
    let l = k.layout;
    let notes = if k.sub.size_note > 0 {
        let buf = read_exact(
            file,
            k.file_len,
            k.sub.offset_note,
            k.sub.size_note,
            "the notes",
        )
        .map_err(kd_err)?;
        parse_notes(&buf).map_err(|source| InspectError::Notes {
            path: shown.to_string(),
            source,
        })?
    } else {
        Vec::new()
    };
    let mut vmcoreinfo = false;
    let mut osrelease_v = None;
    if k.sub.size_vmcoreinfo > 0 {
        let text = read_exact(
            file,
            k.file_len,
            k.sub.offset_vmcoreinfo,
            k.sub.size_vmcoreinfo,
            "VMCOREINFO",
        )
        .map_err(kd_err)?;
        vmcoreinfo = true;
        osrelease_v = osrelease(&[Note::vmcoreinfo(&String::from_utf8_lossy(&text))]).1;
    }
    let ram_map = read_exact(
        file,
        k.file_len,
        l.bitmap1_offset(),
        l.bitmap_len(),
        "the 1st bitmap",
    )
    .map_err(kd_err)?;
    let dump_map = read_exact(
        file,
        k.file_len,
        l.bitmap2_offset(),
        l.bitmap_len(),
        "the 2nd bitmap",
    )
    .map_err(kd_err)?;
    let mut ram = Vec::new();
    let mut missing = Vec::new();
    let mut problems = Vec::new();
    let (mut covered, mut dumped) = (0u64, 0u64);
    let mut flags_seen = 0u32;
    let mut bad_descs = 0u64;
    // Descriptors are read a block at a time, in pfn order of the 2nd bitmap.
    let per_read = 4096u64;
    let mut descs: Vec<u8> = Vec::new();
    let mut descs_from = 0u64;
    let page = crate::PAGE_SIZE;
    for pfn in 0..l.max_mapnr {
        if bit(&ram_map, pfn) {
            covered += 1;
            push_merged(&mut ram, pfn * page..(pfn + 1) * page);
        }
        if !bit(&dump_map, pfn) {
            continue;
        }
        let idx = dumped;
        dumped += 1;
        if idx >= descs_from + (descs.len() as u64 / PAGE_DESC_SIZE) {
            descs_from = idx;
            let at = l.desc_offset() + idx * PAGE_DESC_SIZE;
            let n = (per_read * PAGE_DESC_SIZE).min(k.file_len.saturating_sub(at));
            descs = read_exact(file, k.file_len, at.min(k.file_len), n, "page descriptors")
                .map_err(kd_err)?;
            descs.truncate((descs.len() as u64 / PAGE_DESC_SIZE * PAGE_DESC_SIZE) as usize);
        }
        let rel = ((idx - descs_from) * PAGE_DESC_SIZE) as usize;
        let Some(b) = descs.get(rel..rel + PAGE_DESC_SIZE as usize) else {
            push_merged(&mut missing, pfn * page..(pfn + 1) * page);
            continue;
        };
        let d = PageDesc::decode(b);
        if d.offset == 0 || d.offset.saturating_add(d.size.into()) > k.file_len {
            push_merged(&mut missing, pfn * page..(pfn + 1) * page);
        } else if d.size == 0 || u64::from(d.size) > l.block_size {
            bad_descs += 1;
        } else {
            flags_seen |= d.flags;
        }
    }
    if bad_descs > 0 {
        problems.push(format!(
            "{bad_descs} page descriptors have an impossible size"
        ));
    }
    if k.header.status & kdump::DUMP_DH_COMPRESSED_INCOMPLETE != 0 {
        problems
            .push("the header says the dump is incomplete (DUMP_DH_COMPRESSED_INCOMPLETE)".into());
    }
    let status = k.header.status | flags_seen;
    let compression = if status & kdump::DUMP_DH_COMPRESSED_ZSTD != 0 {
        "zstd"
    } else if status & kdump::DUMP_DH_COMPRESSED_ZLIB != 0 {
        "zlib"
    } else if status & kdump::DUMP_DH_COMPRESSED_LZO != 0 {
        "lzo"
    } else if status & kdump::DUMP_DH_COMPRESSED_SNAPPY != 0 {
        "snappy"
    } else {
        "none"
    };
    Ok(DumpInfo {
        kind: DumpKind::Kdump { compression },
        ram,
        pages_covered: covered,
        pages_dumped: dumped,
        vmcoreinfo,
        osrelease: osrelease_v.or_else(|| {
            let r = &k.header.utsname.release;
            (!r.is_empty()).then(|| r.clone())
        }),
        cpus: notes.iter().filter(|n| n.is_prstatus()).count(),
        complete: false,
        missing,
        problems,
        file_bytes: k.file_len,
    })
}
