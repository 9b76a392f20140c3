//! The kdump-compressed ("diskdump") format that `makedumpfile -c/-l/-p/-z`
//! writes and crash reads, header version 6, x86-64 (little-endian, LP64).
//!
//! Structures as in makedumpfile 1.7.2 `diskdump_mod.h` and crash 8.0.2
//! `diskdump.h` (identical layouts):
//! ```text
//! block 0                 struct disk_dump_header (464 bytes used)
//!   0   char signature[8]        "KDUMP   "
//!   8   int header_version        6
//!  12   struct new_utsname        6 x char[65]: sysname, nodename, release,
//!                                 version, machine, domainname
//! 408   struct timeval timestamp  (after 6 bytes of padding)
//! 424   u32 status                DUMP_DH_COMPRESSED_* | DUMP_DH_COMPRESSED_INCOMPLETE
//! 428   int block_size            the page size
//! 432   int sub_hdr_size          in blocks: sub header + notes
//! 436   u32 bitmap_blocks         both bitmaps, in blocks
//! 440   u32 max_mapnr             32-bit copy; the real one is max_mapnr_64
//! 444   u32 total_ram_blocks, device_blocks, written_blocks, current_cpu
//! 460   int nr_cpus
//! block 1                 struct kdump_sub_header (104 bytes), then the ELF
//!                         notes (offset_note = block_size + 104), VMCOREINFO's
//!                         text inside them (offset_vmcoreinfo points at the
//!                         note's descriptor, as makedumpfile's write_kdump_header)
//! block 1+sub_hdr_size    1st bitmap: pfns that are RAM; then the 2nd bitmap:
//!                         pfns whose page is in the dump. Each is
//!                         ceil(ceil(max_mapnr/8)/block_size) blocks, bit pfn%8
//!                         of byte pfn/8.
//! block 1+sub+bitmaps     page_desc_t per dumped page in pfn order
//!                         {off_t offset; u32 size; u32 flags; u64 page_flags}
//! then                    page data: one shared all-zero page first (as
//!                         makedumpfile), then each stored page
//! ```
//! A descriptor with `size == block_size` and no compression flag is a raw
//! page. A descriptor whose `offset` is 0 has not been written: crash reports
//! such a page as incomplete (`cache_page` in `diskdump.c`), and the header's
//! `DUMP_DH_COMPRESSED_INCOMPLETE` status says the whole file is unfinished.
//!
//! There is no LZ4 flag: neither reader defines one.

use std::fs::File;

use crate::elf::{le32, le64};

/// The signature makedumpfile writes.
pub const SIGNATURE: &[u8; 8] = b"KDUMP   ";
/// The header version written and read here.
pub const HEADER_VERSION: u32 = 6;
/// `sizeof(struct disk_dump_header)` on x86-64.
pub const HEADER_SIZE: usize = 464;
/// `sizeof(struct kdump_sub_header)` on x86-64.
pub const SUB_HEADER_SIZE: u64 = 104;
/// `sizeof(page_desc_t)`.
pub const PAGE_DESC_SIZE: u64 = 24;
/// Page compressed with zlib (`compress2`, zlib stream format).
pub const DUMP_DH_COMPRESSED_ZLIB: u32 = 0x1;
/// Page compressed with LZO1X.
pub const DUMP_DH_COMPRESSED_LZO: u32 = 0x2;
/// Page compressed with snappy.
pub const DUMP_DH_COMPRESSED_SNAPPY: u32 = 0x4;
/// Header status: the dump is unfinished.
pub const DUMP_DH_COMPRESSED_INCOMPLETE: u32 = 0x8;
/// Page compressed with zstd (one frame).
pub const DUMP_DH_COMPRESSED_ZSTD: u32 = 0x20;
/// Largest block size accepted (arm64 and ppc64 use 64 KiB pages).
pub const MAX_BLOCK_SIZE: u32 = 64 << 10;
/// Most page frames accepted: 52-bit physical addresses with 4 KiB pages.
pub const MAX_MAPNR: u64 = 1 << 40;
/// Largest notes area accepted, in bytes.
pub const MAX_NOTES: u64 = 16 << 20;

/// Errors reading a kdump-compressed header.
#[derive(Debug, thiserror::Error)]
pub enum KdumpError {
    /// Reading failed.
    #[error("cannot read the kdump file")]
    Io(#[from] std::io::Error),
    /// The file is shorter than a part that must be there.
    #[error("kdump file truncated: {what} needs bytes up to {need:#x}, the file has {have:#x}")]
    Truncated {
        what: &'static str,
        need: u64,
        have: u64,
    },
    /// Not a kdump-compressed file.
    #[error("not a kdump-compressed file (signature {0:?})")]
    Signature(String),
    /// A header version this reader does not know.
    #[error(
        "kdump header version {0} is not supported (this reader knows version {HEADER_VERSION})"
    )]
    Version(u32),
    /// A header field is out of range.
    #[error("kdump header field {field} = {value:#x} is out of range")]
    Field { field: &'static str, value: u64 },
}

/// The fields of `struct new_utsname` the tools look at.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Utsname {
    pub sysname: String,
    pub nodename: String,
    pub release: String,
    pub version: String,
    pub machine: String,
}

/// The common header (block 0).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Header {
    pub header_version: u32,
    pub utsname: Utsname,
    pub timestamp_sec: u64,
    pub timestamp_usec: u64,
    pub status: u32,
    pub block_size: u32,
    pub sub_hdr_size: u32,
    pub bitmap_blocks: u32,
    pub max_mapnr: u32,
    pub nr_cpus: u32,
}

/// `struct kdump_sub_header` (block 1).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SubHeader {
    pub phys_base: u64,
    pub dump_level: u32,
    pub split: u32,
    pub offset_vmcoreinfo: u64,
    pub size_vmcoreinfo: u64,
    pub offset_note: u64,
    pub size_note: u64,
    pub start_pfn_64: u64,
    pub end_pfn_64: u64,
    pub max_mapnr_64: u64,
}

/// `page_desc_t`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PageDesc {
    pub offset: u64,
    pub size: u32,
    pub flags: u32,
    pub page_flags: u64,
}

impl PageDesc {
    /// Appends the 24-byte encoding.
    pub fn encode(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(&self.offset.to_le_bytes());
        out.extend_from_slice(&self.size.to_le_bytes());
        out.extend_from_slice(&self.flags.to_le_bytes());
        out.extend_from_slice(&self.page_flags.to_le_bytes());
    }

    /// Decodes 24 bytes.
    pub fn decode(b: &[u8]) -> PageDesc {
        PageDesc {
            offset: le64(b, 0),
            size: le32(b, 8),
            flags: le32(b, 12),
            page_flags: le64(b, 16),
        }
    }
}

fn put_str(out: &mut Vec<u8>, s: &str, len: usize) {
    let b = s.as_bytes();
    let n = b.len().min(len - 1);
    out.extend_from_slice(&b[..n]);
    out.resize(out.len() + len - n, 0);
}

fn get_str(b: &[u8]) -> String {
    let end = b.iter().position(|&c| c == 0).unwrap_or(b.len());
    String::from_utf8_lossy(&b[..end]).into_owned()
}

impl Header {
    /// The 464-byte encoding.
    pub fn encode(&self) -> Vec<u8> {
        let mut h = Vec::with_capacity(HEADER_SIZE);
        h.extend_from_slice(SIGNATURE);
        h.extend_from_slice(&self.header_version.to_le_bytes());
        let u = &self.utsname;
        for s in [&u.sysname, &u.nodename, &u.release, &u.version, &u.machine] {
            put_str(&mut h, s, 65);
        }
        put_str(&mut h, "(none)", 65); // domainname
        h.resize(408, 0);
        h.extend_from_slice(&self.timestamp_sec.to_le_bytes());
        h.extend_from_slice(&self.timestamp_usec.to_le_bytes());
        for v in [
            self.status,
            self.block_size,
            self.sub_hdr_size,
            self.bitmap_blocks,
            self.max_mapnr,
            0, // total_ram_blocks
            0, // device_blocks
            0, // written_blocks
            0, // current_cpu
            self.nr_cpus,
        ] {
            h.extend_from_slice(&v.to_le_bytes());
        }
        debug_assert_eq!(h.len(), HEADER_SIZE);
        h
    }

    fn decode(b: &[u8]) -> Header {
        let s = |i: usize| get_str(&b[12 + 65 * i..12 + 65 * (i + 1)]);
        Header {
            header_version: le32(b, 8),
            utsname: Utsname {
                sysname: s(0),
                nodename: s(1),
                release: s(2),
                version: s(3),
                machine: s(4),
            },
            timestamp_sec: le64(b, 408),
            timestamp_usec: le64(b, 416),
            status: le32(b, 424),
            block_size: le32(b, 428),
            sub_hdr_size: le32(b, 432),
            bitmap_blocks: le32(b, 436),
            max_mapnr: le32(b, 440),
            nr_cpus: le32(b, 460),
        }
    }
}

impl SubHeader {
    /// The 104-byte encoding.
    pub fn encode(&self) -> Vec<u8> {
        let mut h = Vec::with_capacity(SUB_HEADER_SIZE as usize);
        h.extend_from_slice(&self.phys_base.to_le_bytes());
        h.extend_from_slice(&self.dump_level.to_le_bytes());
        h.extend_from_slice(&self.split.to_le_bytes());
        for v in [
            self.start_pfn_64.min(u32::MAX.into()), // start_pfn (32-bit copy)
            self.end_pfn_64.min(u32::MAX.into()),   // end_pfn
            self.offset_vmcoreinfo,
            self.size_vmcoreinfo,
            self.offset_note,
            self.size_note,
            0, // offset_eraseinfo
            0, // size_eraseinfo
            self.start_pfn_64,
            self.end_pfn_64,
            self.max_mapnr_64,
        ] {
            h.extend_from_slice(&v.to_le_bytes());
        }
        debug_assert_eq!(h.len() as u64, SUB_HEADER_SIZE);
        h
    }

    fn decode(b: &[u8]) -> SubHeader {
        SubHeader {
            phys_base: le64(b, 0),
            dump_level: le32(b, 8),
            split: le32(b, 12),
            offset_vmcoreinfo: le64(b, 32),
            size_vmcoreinfo: le64(b, 40),
            offset_note: le64(b, 48),
            size_note: le64(b, 56),
            start_pfn_64: le64(b, 80),
            end_pfn_64: le64(b, 88),
            max_mapnr_64: le64(b, 96),
        }
    }
}

/// Where the parts of a kdump file are.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Layout {
    pub block_size: u64,
    pub sub_hdr_blocks: u64,
    pub bitmap_blocks: u64,
    pub max_mapnr: u64,
}

impl Layout {
    /// The layout for `max_mapnr` page frames and `notes_len` bytes of notes.
    pub fn new(block_size: u64, max_mapnr: u64, notes_len: u64) -> Layout {
        let half = max_mapnr.div_ceil(8).div_ceil(block_size);
        Layout {
            block_size,
            sub_hdr_blocks: (SUB_HEADER_SIZE + notes_len).div_ceil(block_size),
            bitmap_blocks: 2 * half,
            max_mapnr,
        }
    }

    /// Offset of the notes (right after the sub header).
    pub fn notes_offset(&self) -> u64 {
        self.block_size + SUB_HEADER_SIZE
    }

    /// Offset of the 1st bitmap.
    pub fn bitmap1_offset(&self) -> u64 {
        self.block_size * (1 + self.sub_hdr_blocks)
    }

    /// Bytes of one bitmap.
    pub fn bitmap_len(&self) -> u64 {
        self.bitmap_blocks * self.block_size / 2
    }

    /// Offset of the 2nd bitmap.
    pub fn bitmap2_offset(&self) -> u64 {
        self.bitmap1_offset() + self.bitmap_len()
    }

    /// Offset of the page descriptors.
    pub fn desc_offset(&self) -> u64 {
        self.block_size * (1 + self.sub_hdr_blocks + self.bitmap_blocks)
    }
}

/// The checked headers of a kdump file.
#[derive(Debug, Clone)]
pub struct KdumpFile {
    pub header: Header,
    pub sub: SubHeader,
    pub layout: Layout,
    pub file_len: u64,
}

fn field(field: &'static str, value: u64) -> KdumpError {
    KdumpError::Field { field, value }
}

pub(crate) fn read_exact(
    file: &File,
    file_len: u64,
    at: u64,
    n: u64,
    what: &'static str,
) -> Result<Vec<u8>, KdumpError> {
    crate::elf::read_span(file, file_len, at, n)?.map_err(|need| KdumpError::Truncated {
        what,
        need,
        have: file_len,
    })
}

/// Reads and checks the headers; every size and offset is checked against
/// the file's length and the format's limits before anything uses it.
pub fn read_kdump(file: &File) -> Result<KdumpFile, KdumpError> {
    let file_len = file.metadata()?.len();
    let b = read_exact(file, file_len, 0, HEADER_SIZE as u64, "the header")?;
    if b[..8] != *SIGNATURE {
        return Err(KdumpError::Signature(
            String::from_utf8_lossy(&b[..8]).into_owned(),
        ));
    }
    let header = Header::decode(&b);
    if header.header_version != HEADER_VERSION {
        return Err(KdumpError::Version(header.header_version));
    }
    let bs = header.block_size;
    if !bs.is_power_of_two() || !(4096..=MAX_BLOCK_SIZE).contains(&bs) {
        return Err(field("block_size", bs.into()));
    }
    let bs = u64::from(bs);
    let s = read_exact(file, file_len, bs, SUB_HEADER_SIZE, "the sub header")?;
    let sub = SubHeader::decode(&s);
    if sub.max_mapnr_64 == 0 || sub.max_mapnr_64 > MAX_MAPNR {
        return Err(field("max_mapnr_64", sub.max_mapnr_64));
    }
    if sub.split != 0 {
        return Err(field("split", sub.split.into()));
    }
    let sub_blocks = u64::from(header.sub_hdr_size);
    if sub_blocks == 0 || sub_blocks * bs > SUB_HEADER_SIZE + MAX_NOTES + bs {
        return Err(field("sub_hdr_size", sub_blocks));
    }
    let layout = Layout {
        block_size: bs,
        sub_hdr_blocks: sub_blocks,
        bitmap_blocks: header.bitmap_blocks.into(),
        max_mapnr: sub.max_mapnr_64,
    };
    if !layout.bitmap_blocks.is_multiple_of(2) || layout.bitmap_len() * 8 < layout.max_mapnr {
        return Err(field("bitmap_blocks", layout.bitmap_blocks));
    }
    if layout.bitmap_len() > MAX_MAPNR.div_ceil(8) + bs {
        return Err(field("bitmap_blocks", layout.bitmap_blocks));
    }
    let sub_end = bs * (1 + sub_blocks);
    let notes = sub.offset_note..sub.offset_note.saturating_add(sub.size_note);
    if sub.size_note > 0 && (notes.start < bs + SUB_HEADER_SIZE || notes.end > sub_end) {
        return Err(field("offset_note", sub.offset_note));
    }
    let vmci = sub.offset_vmcoreinfo..sub.offset_vmcoreinfo.saturating_add(sub.size_vmcoreinfo);
    if sub.size_vmcoreinfo > 0 && (vmci.start < bs + SUB_HEADER_SIZE || vmci.end > sub_end) {
        return Err(field("offset_vmcoreinfo", sub.offset_vmcoreinfo));
    }
    if layout.desc_offset() > file_len {
        return Err(KdumpError::Truncated {
            what: "the bitmaps",
            need: layout.desc_offset(),
            have: file_len,
        });
    }
    Ok(KdumpFile {
        header,
        sub,
        layout,
        file_len,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn header_layout_matches_the_c_structures() {
        let h = Header {
            header_version: 6,
            utsname: Utsname {
                release: "6.1.0-99-amd64".into(),
                machine: "x86_64".into(),
                ..Utsname::default()
            },
            status: 0x21,
            block_size: 4096,
            sub_hdr_size: 2,
            bitmap_blocks: 4,
            max_mapnr: 65536,
            nr_cpus: 2,
            ..Header::default()
        };
        let b = h.encode();
        assert_eq!(b.len(), HEADER_SIZE);
        assert_eq!(&b[12 + 130..12 + 144], b"6.1.0-99-amd64");
        assert_eq!(&b[12 + 260..12 + 266], b"x86_64");
        assert_eq!(le32(&b, 428), 4096);
        assert_eq!(le32(&b, 460), 2);
        assert_eq!(Header::decode(&b), h);
        let s = SubHeader {
            phys_base: 0x400_0000,
            max_mapnr_64: 65536,
            offset_note: 4096 + 104,
            ..SubHeader::default()
        };
        let e = s.encode();
        assert_eq!(le64(&e, 96), 65536);
        assert_eq!(SubHeader::decode(&e), s);
        let l = Layout::new(4096, 65536, 2000);
        assert_eq!((l.sub_hdr_blocks, l.bitmap_blocks), (1, 4));
        assert_eq!(l.desc_offset(), 4096 * 6);
    }
}
