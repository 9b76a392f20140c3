//! ELF notes of a vmcore: per-vCPU registers and VMCOREINFO.
//!
//! Each note is `u32 namesz, u32 descsz, u32 type`, the name (with its NUL,
//! padded to 4 bytes), the descriptor (padded to 4 bytes). The tools look
//! for:
//! - `"CORE"` type 1 (`NT_PRSTATUS`): one per CPU, counted as the CPU count
//!   (makedumpfile `get_pt_note_info`, crash `netdump.c`/`diskdump.c`), in
//!   CPU order: crash takes the n-th note as CPU n's registers (`help -r`;
//!   for kdump-compressed dumps also where `bt` starts on a CPU that did not
//!   panic). Its x86-64 layout is in [`PrStatus`].
//! - `"QEMU"` type 0: QEMU's per-vCPU CPU state (crash reads it for QEMU
//!   dumps, `QEMUCPUState` in QEMU's `dump.c`).
//! - `"VMCOREINFO"` type 0: the kernel's description of itself.
//!
//! QEMU writes ready-made register notes: QMP `dump-guest-memory` with
//! `paging: false, begin: 0, length: 4096` produces a tiny ELF whose PT_NOTE
//! holds them; [`notes_from_qemu_elf`] takes them out of it.

use std::fs::File;
use std::path::Path;

use crate::elf::{le32, le64, read_at, read_elf, ElfError, PT_NOTE};

/// `NT_PRSTATUS`.
pub const NT_PRSTATUS: u32 = 1;
/// `sizeof(struct elf_prstatus)` on x86-64.
pub const PRSTATUS_SIZE: usize = 336;
/// Offset of `pr_pid` in `struct elf_prstatus`.
const PR_PID: usize = 32;
/// Offset of `pr_reg` (a `struct user_regs_struct`) in `struct elf_prstatus`.
const PR_REG: usize = 112;
/// Largest notes segment this reader accepts (QEMU's for 1024 vCPUs is ~1.2 MiB).
pub const MAX_NOTES_BYTES: u64 = 16 << 20;

/// Errors reading notes.
#[derive(Debug, thiserror::Error)]
pub enum NoteError {
    /// The file's ELF headers are unusable.
    #[error("cannot read the notes file {path}")]
    Elf { path: String, source: ElfError },
    /// Opening the file failed.
    #[error("cannot open the notes file {path}")]
    Open {
        path: String,
        source: std::io::Error,
    },
    /// The file has no PT_NOTE.
    #[error("{0} has no PT_NOTE program header")]
    NoNotes(String),
    /// A note runs past the end of its segment.
    #[error("note at byte {at} of the notes segment runs past its end ({len} bytes)")]
    Overrun { at: usize, len: usize },
    /// A notes segment is larger than any vmcore's.
    #[error("notes segment of {0} bytes exceeds the {MAX_NOTES_BYTES}-byte limit")]
    TooLarge(u64),
}

/// The parts of an x86-64 `NT_PRSTATUS` descriptor that say where a CPU
/// was: `struct elf_prstatus` as the kernel's `crash_save_cpu` and QEMU's
/// `x86_64_write_elf64_note` (`dump.c`, `target/i386/arch_dump.c`) write it:
/// ```text
///   0  siginfo, cursig, sigpend, sighold      32 bytes
///  32  u32 pr_pid                             the kernel: the task's pid;
///                                             QEMU: the vCPU's index + 1
///  36  ppid, pgrp, sid, 4 timevals           76 bytes
/// 112  pr_reg: user_regs_struct, 27 u64       r15 r14 r13 r12 rbp rbx r11
///                                             r10 r9 r8 rax rcx rdx rsi rdi
///                                             orig_rax rip cs eflags rsp ss
///                                             fs_base gs_base ds es fs gs
/// 328  pr_fpvalid (+ padding)                 336 bytes in all
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PrStatus {
    pub pid: u32,
    pub rip: u64,
    pub rsp: u64,
    pub rbp: u64,
    pub cs: u64,
    pub eflags: u64,
}

impl PrStatus {
    /// Index of each register in `pr_reg`.
    const RBP: usize = 4;
    const RIP: usize = 16;
    const CS: usize = 17;
    const EFLAGS: usize = 18;
    const RSP: usize = 19;

    /// Decodes an x86-64 descriptor; `None` when it is not 336 bytes.
    pub fn decode(desc: &[u8]) -> Option<PrStatus> {
        if desc.len() != PRSTATUS_SIZE {
            return None;
        }
        let reg = |i: usize| le64(desc, PR_REG + 8 * i);
        Some(PrStatus {
            pid: le32(desc, PR_PID),
            rip: reg(Self::RIP),
            rsp: reg(Self::RSP),
            rbp: reg(Self::RBP),
            cs: reg(Self::CS),
            eflags: reg(Self::EFLAGS),
        })
    }

    /// Whether the CPU was in the kernel (ring 0 code segment).
    pub fn in_kernel(&self) -> bool {
        self.cs & 3 == 0
    }
}

/// One ELF note.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Note {
    /// The name without its NUL (`CORE`, `QEMU`, `VMCOREINFO`).
    pub name: Vec<u8>,
    /// `n_type`.
    pub kind: u32,
    /// The descriptor.
    pub desc: Vec<u8>,
}

fn pad4(n: usize) -> usize {
    n.next_multiple_of(4)
}

impl Note {
    /// The VMCOREINFO note around the kernel's text.
    pub fn vmcoreinfo(text: &str) -> Note {
        Note {
            name: b"VMCOREINFO".to_vec(),
            kind: 0,
            desc: text.as_bytes().to_vec(),
        }
    }

    /// An `NT_PRSTATUS` register note (`CORE`, type 1).
    pub fn is_prstatus(&self) -> bool {
        self.name == b"CORE" && self.kind == NT_PRSTATUS
    }

    /// The registers of an x86-64 `NT_PRSTATUS` note; `None` for any other note.
    pub fn prstatus(&self) -> Option<PrStatus> {
        self.is_prstatus()
            .then(|| PrStatus::decode(&self.desc))
            .flatten()
    }

    /// A VMCOREINFO note.
    pub fn is_vmcoreinfo(&self) -> bool {
        self.name == b"VMCOREINFO" && self.kind == 0
    }

    /// Bytes the note takes in a notes segment.
    pub fn encoded_len(&self) -> usize {
        12 + pad4(self.name.len() + 1) + pad4(self.desc.len())
    }

    /// Offset of the descriptor from the start of the note.
    pub fn desc_offset(&self) -> usize {
        12 + pad4(self.name.len() + 1)
    }

    /// Appends the encoded note.
    pub fn encode(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(&(self.name.len() as u32 + 1).to_le_bytes());
        out.extend_from_slice(&(self.desc.len() as u32).to_le_bytes());
        out.extend_from_slice(&self.kind.to_le_bytes());
        out.extend_from_slice(&self.name);
        out.resize(out.len() + pad4(self.name.len() + 1) - self.name.len(), 0);
        out.extend_from_slice(&self.desc);
        out.resize(out.len() + pad4(self.desc.len()) - self.desc.len(), 0);
    }
}

/// Parses a notes segment. Zero padding at the end (a segment rounded up) is
/// allowed; a note that runs past the end is not.
pub fn parse_notes(buf: &[u8]) -> Result<Vec<Note>, NoteError> {
    let mut out = Vec::new();
    let mut at = 0usize;
    while at + 12 <= buf.len() {
        let (namesz, descsz, kind) = (
            le32(buf, at) as usize,
            le32(buf, at + 4) as usize,
            le32(buf, at + 8),
        );
        if namesz == 0 && descsz == 0 && kind == 0 {
            break; // padding
        }
        let name_at = at + 12;
        let desc_at = name_at.checked_add(pad4(namesz));
        let end = desc_at.and_then(|d| d.checked_add(pad4(descsz)));
        let (Some(desc_at), Some(end)) = (desc_at, end) else {
            return Err(NoteError::Overrun { at, len: buf.len() });
        };
        if end > buf.len() {
            return Err(NoteError::Overrun { at, len: buf.len() });
        }
        let name = &buf[name_at..name_at + namesz];
        let name = name.strip_suffix(b"\0").unwrap_or(name);
        out.push(Note {
            name: name.to_vec(),
            kind,
            desc: buf[desc_at..desc_at + descsz].to_vec(),
        });
        at = end;
    }
    Ok(out)
}

/// Reads every PT_NOTE of an ELF core file.
pub fn read_elf_notes(path: &Path) -> Result<Vec<Note>, NoteError> {
    let shown = path.display().to_string();
    let file = File::open(path).map_err(|source| NoteError::Open {
        path: shown.clone(),
        source,
    })?;
    let elf_err = |source| NoteError::Elf {
        path: shown.clone(),
        source,
    };
    let core = read_elf(&file).map_err(elf_err)?;
    let mut notes = Vec::new();
    let mut found = false;
    for p in core.phdrs.iter().filter(|p| p.p_type == PT_NOTE) {
        found = true;
        if p.p_filesz > MAX_NOTES_BYTES {
            return Err(NoteError::TooLarge(p.p_filesz));
        }
        let buf =
            read_at(&file, core.file_len, p.p_offset, p.p_filesz, "PT_NOTE").map_err(elf_err)?;
        notes.extend(parse_notes(&buf)?);
    }
    if !found {
        return Err(NoteError::NoNotes(shown));
    }
    Ok(notes)
}

/// The register notes of the tiny ELF QEMU writes for QMP
/// `{"execute":"dump-guest-memory","arguments":{"paging":false,"protocol":"file:PATH","begin":0,"length":4096}}`:
/// every note except VMCOREINFO (the dump writer adds its own), in order:
/// per vCPU an `NT_PRSTATUS` (`CORE`) and QEMU's CPU state (`QEMU`).
pub fn notes_from_qemu_elf(path: impl AsRef<Path>) -> Result<Vec<Note>, NoteError> {
    let mut notes = read_elf_notes(path.as_ref())?;
    notes.retain(|n| !n.is_vmcoreinfo());
    Ok(notes)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::elf::{encode_header, Phdr};

    fn sample() -> Vec<Note> {
        vec![
            Note {
                name: b"CORE".to_vec(),
                kind: NT_PRSTATUS,
                desc: vec![7; 336],
            },
            Note {
                name: b"QEMU".to_vec(),
                kind: 0,
                desc: vec![9; 473],
            },
            Note::vmcoreinfo("OSRELEASE=6.1.0\nPAGESIZE=4096\n"),
        ]
    }

    fn elf_with_notes(notes: &[u8]) -> Vec<u8> {
        let mut v = encode_header(1);
        Phdr {
            p_type: PT_NOTE,
            p_offset: 120,
            p_filesz: notes.len() as u64,
            ..Phdr::default()
        }
        .encode(&mut v);
        v.extend_from_slice(notes);
        v
    }

    #[test]
    fn notes_round_trip_and_qemu_extraction_drops_vmcoreinfo() {
        let mut buf = Vec::new();
        for n in sample() {
            n.encode(&mut buf);
            assert_eq!(buf.len() % 4, 0);
        }
        assert_eq!(
            buf.len(),
            sample().iter().map(Note::encoded_len).sum::<usize>()
        );
        buf.extend_from_slice(&[0; 16]); // padding is fine
        assert_eq!(parse_notes(&buf).unwrap(), sample());
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("regs.elf");
        std::fs::write(&p, elf_with_notes(&buf)).unwrap();
        let got = notes_from_qemu_elf(&p).unwrap();
        assert_eq!(got, sample()[..2].to_vec());
        assert!(got[0].is_prstatus());
    }

    #[test]
    fn prstatus_registers_are_decoded_from_the_kernels_layout() {
        let mut desc = vec![0u8; PRSTATUS_SIZE];
        desc[PR_PID..PR_PID + 4].copy_from_slice(&2u32.to_le_bytes());
        // pr_reg[i] = 0x1000 + i, so each register names its own index.
        for i in 0..27u64 {
            let at = PR_REG + 8 * i as usize;
            desc[at..at + 8].copy_from_slice(&(0x1000 + i).to_le_bytes());
        }
        let mut n = Note {
            name: b"CORE".to_vec(),
            kind: NT_PRSTATUS,
            desc,
        };
        let r = n.prstatus().unwrap();
        assert_eq!(
            (r.pid, r.rbp, r.rip, r.cs, r.eflags, r.rsp),
            (2, 0x1004, 0x1010, 0x1011, 0x1012, 0x1013)
        );
        assert!(!r.in_kernel()); // 0x1011 & 3 == 1
        n.desc[PR_REG + 8 * 17] = 0x10; // __KERNEL_CS
        assert!(n.prstatus().unwrap().in_kernel());
        n.desc.pop();
        assert_eq!(n.prstatus(), None, "not x86-64's size");
        assert_eq!(sample()[1].prstatus(), None, "QEMU's note");
    }

    #[test]
    fn malformed_notes_files_are_refused() {
        let mut buf = Vec::new();
        sample()[0].encode(&mut buf);
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("bad.elf");
        let check = |bytes: Vec<u8>, want: &str| {
            std::fs::write(&p, bytes).unwrap();
            let e = notes_from_qemu_elf(&p).unwrap_err();
            let mut chain = e.to_string();
            if let Some(s) = std::error::Error::source(&e) {
                chain.push_str(&format!(": {s}"));
            }
            assert!(chain.contains(want), "{want:?} not in {chain:?}");
        };
        // Truncated: the PT_NOTE claims more than the file has.
        let whole = elf_with_notes(&buf);
        check(whole[..whole.len() - 8].to_vec(), "PT_NOTE needs");
        // A note whose descsz runs past its segment.
        let mut over = buf.clone();
        over[4..8].copy_from_slice(&4000u32.to_le_bytes());
        check(elf_with_notes(&over), "runs past its end");
        let mut huge = buf.clone();
        huge[0..4].copy_from_slice(&u32::MAX.to_le_bytes());
        check(elf_with_notes(&huge), "runs past its end");
        // Wrong magic, no notes, oversized segment.
        let mut magic = whole.clone();
        magic[1] = b'X';
        check(magic, "not an ELF file");
        let mut none = encode_header(0);
        none.resize(64, 0);
        check(none, "has no PT_NOTE");
        let mut big = encode_header(1);
        Phdr {
            p_type: PT_NOTE,
            p_offset: 120,
            p_filesz: MAX_NOTES_BYTES + 1,
            ..Phdr::default()
        }
        .encode(&mut big);
        check(big, "exceeds");
    }
}
