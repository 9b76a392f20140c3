//! The ELF note wrapping VMCOREINFO (format in the parent module's docs).

use super::VmcoreinfoError;

/// The note name with its NUL and padding, as it appears in memory.
pub const NOTE_NAME: &[u8; 12] = b"VMCOREINFO\0\0";
/// `namesz`: "VMCOREINFO" plus NUL.
const NAMESZ: u32 = 11;
/// Largest text accepted. The kernel's buffer is one page
/// (`VMCOREINFO_BYTES`); the cap leaves room for 64 KiB pages.
pub const MAX_DESC_SIZE: u32 = 64 * 1024;
/// Bytes before the text: header plus padded name.
pub(crate) const PREFIX: usize = NoteHeader::SIZE + NOTE_NAME.len();

/// `Elf64_Nhdr` (same layout as `Elf32_Nhdr`).
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NoteHeader {
    pub namesz: u32,
    pub descsz: u32,
    pub n_type: u32,
}

const _: () = assert!(std::mem::size_of::<NoteHeader>() == 12);

impl NoteHeader {
    pub const SIZE: usize = 12;

    /// Decodes a little-endian header from the first 12 bytes.
    pub fn decode(b: &[u8]) -> Option<NoteHeader> {
        let word = |i: usize| Some(u32::from_le_bytes(b.get(i..i + 4)?.try_into().ok()?));
        Some(NoteHeader {
            namesz: word(0)?,
            descsz: word(4)?,
            n_type: word(8)?,
        })
    }

    /// Checks the header and the padded name that follows it in `prefix`
    /// (at least [`PREFIX`] bytes). Returns the text size.
    pub(crate) fn validate(prefix: &[u8]) -> Result<u32, VmcoreinfoError> {
        let h = NoteHeader::decode(prefix).ok_or(VmcoreinfoError::Truncated {
            need: PREFIX as u64,
            have: prefix.len() as u64,
        })?;
        if h.namesz != NAMESZ {
            return Err(VmcoreinfoError::WrongNameSize(h.namesz));
        }
        if h.n_type != 0 {
            return Err(VmcoreinfoError::WrongType(h.n_type));
        }
        let name = prefix
            .get(NoteHeader::SIZE..PREFIX)
            .ok_or(VmcoreinfoError::Truncated {
                need: PREFIX as u64,
                have: prefix.len() as u64,
            })?;
        // The padding byte tells the note from the kernel's rodata string
        // "VMCOREINFO\0OSRELEASE=%s\n".
        if name != NOTE_NAME {
            return Err(VmcoreinfoError::WrongName);
        }
        if h.descsz > MAX_DESC_SIZE {
            return Err(VmcoreinfoError::TooLarge(h.descsz));
        }
        if h.descsz == 0 {
            return Err(VmcoreinfoError::Empty);
        }
        Ok(h.descsz)
    }
}

/// Validates a whole note in `bytes` and returns its text bytes.
pub fn parse_note(bytes: &[u8]) -> Result<&[u8], VmcoreinfoError> {
    let descsz = NoteHeader::validate(bytes)? as usize;
    bytes
        .get(PREFIX..PREFIX + descsz)
        .ok_or(VmcoreinfoError::Truncated {
            need: (PREFIX + descsz) as u64,
            have: bytes.len() as u64,
        })
}

/// Builds a VMCOREINFO note around `text`, as the kernel lays it out
/// (text padded to 4 bytes). Used to write notes into dumps, and by tests.
pub fn encode_note(text: &[u8]) -> Vec<u8> {
    let mut v = Vec::with_capacity(PREFIX + text.len() + 3);
    v.extend_from_slice(&NAMESZ.to_le_bytes());
    v.extend_from_slice(&(text.len() as u32).to_le_bytes());
    v.extend_from_slice(&0u32.to_le_bytes());
    v.extend_from_slice(NOTE_NAME);
    v.extend_from_slice(text);
    v.resize(v.len().next_multiple_of(4), 0);
    v
}
