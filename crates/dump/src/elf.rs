//! The ELF64 core-file pieces a vmcore needs: the file header, program
//! headers, and a reader for both that checks every field it relies on.
//!
//! Layout written by [`crate::write`] (little-endian, x86-64):
//! ```text
//! 0      Elf64_Ehdr (64 bytes), e_phoff = 64, no section headers
//! 64     Elf64_Phdr[e_phnum] (56 bytes each): one PT_NOTE, then PT_LOADs in GPA order
//! ...    the PT_NOTE's notes (register notes, then VMCOREINFO)
//! 4 KiB-aligned: PT_LOAD data, one segment after another
//! ```
//! Program headers sit right after the ELF header because makedumpfile 1.7.2
//! reads them at `sizeof(Elf64_Ehdr) + i * sizeof(Elf64_Phdr)` whatever
//! `e_phoff` says (`get_elf64_phdr` in `elf_info.c`).

use std::fs::File;
use std::os::unix::fs::FileExt;

/// ELF header size.
pub const EHDR_SIZE: u64 = 64;
/// Program header size.
pub const PHDR_SIZE: u64 = 56;
/// `PT_LOAD`.
pub const PT_LOAD: u32 = 1;
/// `PT_NOTE`.
pub const PT_NOTE: u32 = 4;
/// `ET_CORE`.
pub const ET_CORE: u16 = 4;
/// `EM_X86_64`.
pub const EM_X86_64: u16 = 62;
/// `e_phnum` value meaning "the count is in section header 0's `sh_info`".
const PN_XNUM: u16 = 0xffff;
/// The most program headers this reader accepts (a 64 TiB guest split at
/// every 1 MiB would need 64 Mi; anything near that is not a vmcore we wrote).
pub const MAX_PHNUM: u64 = 1 << 22;

/// Errors reading an ELF core file's headers.
#[derive(Debug, thiserror::Error)]
pub enum ElfError {
    /// Reading the file failed.
    #[error("cannot read the ELF file")]
    Io(#[from] std::io::Error),
    /// The file is shorter than a header that must be there.
    #[error("ELF file truncated: {what} needs bytes up to {need:#x}, the file has {have:#x}")]
    Truncated {
        what: &'static str,
        need: u64,
        have: u64,
    },
    /// Not an ELF file.
    #[error("not an ELF file (magic {0:02x?})")]
    Magic([u8; 4]),
    /// Not a 64-bit little-endian version-1 ELF core file for x86-64.
    #[error("unsupported ELF file: {0}")]
    Unsupported(String),
    /// A header field is out of range.
    #[error("ELF field {field} = {value:#x} is out of range")]
    Field { field: &'static str, value: u64 },
}

/// One program header.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Phdr {
    pub p_type: u32,
    pub p_flags: u32,
    pub p_offset: u64,
    pub p_vaddr: u64,
    pub p_paddr: u64,
    pub p_filesz: u64,
    pub p_memsz: u64,
    pub p_align: u64,
}

impl Phdr {
    /// Appends the 56-byte encoding.
    pub fn encode(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(&self.p_type.to_le_bytes());
        out.extend_from_slice(&self.p_flags.to_le_bytes());
        for v in [
            self.p_offset,
            self.p_vaddr,
            self.p_paddr,
            self.p_filesz,
            self.p_memsz,
            self.p_align,
        ] {
            out.extend_from_slice(&v.to_le_bytes());
        }
    }

    fn decode(b: &[u8]) -> Phdr {
        Phdr {
            p_type: le32(b, 0),
            p_flags: le32(b, 4),
            p_offset: le64(b, 8),
            p_vaddr: le64(b, 16),
            p_paddr: le64(b, 24),
            p_filesz: le64(b, 32),
            p_memsz: le64(b, 40),
            p_align: le64(b, 48),
        }
    }
}

pub(crate) fn le16(b: &[u8], at: usize) -> u16 {
    u16::from_le_bytes([b[at], b[at + 1]])
}

pub(crate) fn le32(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes(b[at..at + 4].try_into().expect("4 bytes"))
}

pub(crate) fn le64(b: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(b[at..at + 8].try_into().expect("8 bytes"))
}

/// The ELF header of an x86-64 core file with `phnum` program headers at 64.
pub fn encode_header(phnum: u16) -> Vec<u8> {
    let mut h = Vec::with_capacity(EHDR_SIZE as usize);
    h.extend_from_slice(b"\x7fELF");
    h.extend_from_slice(&[2, 1, 1, 0]); // ELFCLASS64, ELFDATA2LSB, EV_CURRENT, ELFOSABI_NONE
    h.extend_from_slice(&[0; 8]);
    h.extend_from_slice(&ET_CORE.to_le_bytes());
    h.extend_from_slice(&EM_X86_64.to_le_bytes());
    h.extend_from_slice(&1u32.to_le_bytes()); // e_version
    h.extend_from_slice(&0u64.to_le_bytes()); // e_entry
    h.extend_from_slice(&EHDR_SIZE.to_le_bytes()); // e_phoff
    h.extend_from_slice(&0u64.to_le_bytes()); // e_shoff
    h.extend_from_slice(&0u32.to_le_bytes()); // e_flags
    h.extend_from_slice(&(EHDR_SIZE as u16).to_le_bytes());
    h.extend_from_slice(&(PHDR_SIZE as u16).to_le_bytes());
    h.extend_from_slice(&phnum.to_le_bytes());
    h.extend_from_slice(&[0; 6]); // e_shentsize, e_shnum, e_shstrndx
    h
}

/// The headers of an ELF core file.
#[derive(Debug, Clone)]
pub struct ElfCore {
    /// Program headers in file order.
    pub phdrs: Vec<Phdr>,
    /// The file's length when read.
    pub file_len: u64,
}

/// Reads `n` bytes at `at` of a file of `file_len` bytes: `Ok(Err(need))`
/// when the file ends before `need` (`u64::MAX` if `at + n` overflows).
pub(crate) fn read_span(
    file: &File,
    file_len: u64,
    at: u64,
    n: u64,
) -> std::io::Result<Result<Vec<u8>, u64>> {
    match at.checked_add(n) {
        Some(need) if need <= file_len => {
            let mut buf = vec![0u8; n as usize];
            file.read_exact_at(&mut buf, at)?;
            Ok(Ok(buf))
        }
        need => Ok(Err(need.unwrap_or(u64::MAX))),
    }
}

/// Reads `n` bytes at `at`, failing with [`ElfError::Truncated`] past the end.
pub(crate) fn read_at(
    file: &File,
    file_len: u64,
    at: u64,
    n: u64,
    what: &'static str,
) -> Result<Vec<u8>, ElfError> {
    read_span(file, file_len, at, n)?.map_err(|need| ElfError::Truncated {
        what,
        need,
        have: file_len,
    })
}

/// Reads and checks the ELF header and program headers of an x86-64 core
/// file (ours, QEMU's, makedumpfile's or the kernel's `/proc/vmcore` copy).
pub fn read_elf(file: &File) -> Result<ElfCore, ElfError> {
    let file_len = file.metadata()?.len();
    let h = read_at(file, file_len, 0, EHDR_SIZE, "the ELF header")?;
    if h[..4] != *b"\x7fELF" {
        return Err(ElfError::Magic(h[..4].try_into().expect("4 bytes")));
    }
    if h[4] != 2 || h[5] != 1 {
        return Err(ElfError::Unsupported(format!(
            "class {} data {} (need 64-bit little-endian)",
            h[4], h[5]
        )));
    }
    if h[6] != 1 || le32(&h, 20) != 1 {
        return Err(ElfError::Unsupported(format!(
            "version {}/{} (need 1)",
            h[6],
            le32(&h, 20)
        )));
    }
    let (e_type, e_machine) = (le16(&h, 16), le16(&h, 18));
    if e_type != ET_CORE || e_machine != EM_X86_64 {
        return Err(ElfError::Unsupported(format!(
            "type {e_type} machine {e_machine} (need a core file, 4, for x86-64, 62)"
        )));
    }
    let phoff = le64(&h, 32);
    let phentsize = le16(&h, 54);
    if u64::from(phentsize) != PHDR_SIZE {
        return Err(ElfError::Field {
            field: "e_phentsize",
            value: phentsize.into(),
        });
    }
    let mut phnum = u64::from(le16(&h, 56));
    if phnum == u64::from(PN_XNUM) {
        // The real count is section header 0's sh_info.
        let shoff = le64(&h, 40);
        let sh = read_at(file, file_len, shoff, 64, "section header 0 (PN_XNUM)")?;
        phnum = u64::from(le32(&sh, 44));
    }
    if phnum > MAX_PHNUM {
        return Err(ElfError::Field {
            field: "e_phnum",
            value: phnum,
        });
    }
    let table = read_at(
        file,
        file_len,
        phoff,
        phnum * PHDR_SIZE,
        "the program headers",
    )?;
    let phdrs = table
        .chunks_exact(PHDR_SIZE as usize)
        .map(Phdr::decode)
        .collect::<Vec<_>>();
    for p in &phdrs {
        if p.p_offset.checked_add(p.p_filesz).is_none() {
            return Err(ElfError::Field {
                field: "p_offset + p_filesz",
                value: p.p_offset,
            });
        }
        if p.p_type == PT_LOAD
            && (p.p_filesz > p.p_memsz || p.p_paddr.checked_add(p.p_memsz).is_none())
        {
            return Err(ElfError::Field {
                field: "PT_LOAD p_filesz/p_memsz",
                value: p.p_filesz,
            });
        }
    }
    Ok(ElfCore { phdrs, file_len })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    fn file_with(bytes: &[u8]) -> (tempfile::NamedTempFile, File) {
        let mut f = tempfile::NamedTempFile::new().unwrap();
        f.write_all(bytes).unwrap();
        let r = File::open(f.path()).unwrap();
        (f, r)
    }

    fn core(phdrs: &[Phdr]) -> Vec<u8> {
        let mut v = encode_header(phdrs.len() as u16);
        for p in phdrs {
            p.encode(&mut v);
        }
        v
    }

    #[test]
    fn round_trip() {
        let load = Phdr {
            p_type: PT_LOAD,
            p_offset: 4096,
            p_paddr: 0x1000,
            p_filesz: 8192,
            p_memsz: 16384,
            ..Phdr::default()
        };
        let (_t, f) = file_with(&core(&[load]));
        let e = read_elf(&f).unwrap();
        assert_eq!(e.phdrs, vec![load]);
    }

    #[test]
    fn malformed_headers_are_refused_with_the_reason() {
        let good = core(&[Phdr {
            p_type: PT_NOTE,
            ..Phdr::default()
        }]);
        let cases: Vec<(Vec<u8>, &str)> = vec![
            (good[..40].to_vec(), "truncated: the ELF header"),
            (good[..100].to_vec(), "truncated: the program headers"),
            (
                [b"\x7fELG".as_slice(), &good[4..]].concat(),
                "not an ELF file",
            ),
            (
                {
                    let mut b = good.clone();
                    b[6] = 2;
                    b
                },
                "version 2/1",
            ),
            (
                {
                    let mut b = good.clone();
                    b[4] = 1;
                    b
                },
                "64-bit",
            ),
            (
                {
                    let mut b = good.clone();
                    b[16] = 2;
                    b
                },
                "core file",
            ),
            (
                {
                    let mut b = good.clone();
                    b[56..58].copy_from_slice(&0xfff0u16.to_le_bytes());
                    b
                },
                "the program headers needs",
            ),
            (
                {
                    // PN_XNUM with a section header claiming 2^30 headers.
                    let mut b = good.clone();
                    b[56..58].copy_from_slice(&0xffffu16.to_le_bytes());
                    b[40..48].copy_from_slice(&64u64.to_le_bytes());
                    b.resize(200, 0);
                    b[64 + 44..64 + 48].copy_from_slice(&(1u32 << 30).to_le_bytes());
                    b
                },
                "e_phnum = 0x40000000",
            ),
            (
                {
                    let mut b = core(&[Phdr {
                        p_type: PT_LOAD,
                        p_offset: u64::MAX - 4,
                        p_filesz: 16,
                        p_memsz: 16,
                        ..Phdr::default()
                    }]);
                    b.truncate(120);
                    b
                },
                "p_offset + p_filesz",
            ),
            (
                {
                    let mut b = good.clone();
                    b[54..56].copy_from_slice(&64u16.to_le_bytes());
                    b
                },
                "e_phentsize",
            ),
        ];
        for (bytes, want) in cases {
            let (_t, f) = file_with(&bytes);
            let e = read_elf(&f).unwrap_err().to_string();
            assert!(e.contains(want), "{want:?} not in {e:?}");
        }
    }
}
