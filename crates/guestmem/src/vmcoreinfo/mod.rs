//! VMCOREINFO: the Linux kernel's self-description for crash-dump tools.
//!
//! # Where it lives
//! The kernel keeps an ELF note in its memory (`vmcoreinfo_note`, one
//! page-aligned allocation); the guest's `/sys/kernel/vmcoreinfo` prints its
//! physical address and the note buffer size as `"%pa %x"`, e.g.
//! `0x0000000006c3f000 1024`. [`read_vmcoreinfo`] reads it there;
//! [`find_vmcoreinfo`] finds it by scanning guest RAM when no agent told us.
//!
//! # Note format (little-endian x86-64 guest)
//! ```text
//! u32 namesz = 11        ("VMCOREINFO" + NUL)
//! u32 descsz             (length of the text, no NUL; at most one page in the kernel,
//!                         capped here at MAX_DESC_SIZE)
//! u32 type   = 0
//! [u8; 12] "VMCOREINFO\0\0"   (name padded to 4 bytes with NUL)
//! [u8; descsz] text      (padded to 4 bytes)
//! ```
//!
//! # Text format
//! `KEY=VALUE\n` lines written by `vmcoreinfo_append_str` (kernel
//! `kernel/vmcore_info.c`, formerly `kernel/crash_core.c`; macros in
//! `include/linux/vmcore_info.h`). Value formats per key family:
//!
//! | key               | kernel format | parsed as |
//! |-------------------|---------------|-----------|
//! | `OSRELEASE`       | `%s`          | string (required) |
//! | `PAGESIZE`        | `%ld`         | decimal (required) |
//! | `KERNELOFFSET`    | `%lx` (x86, arm64) | hex, no `0x` |
//! | `SYMBOL(name)`    | `%lx`         | hex, no `0x` |
//! | `SIZE(name)`      | `%lu`         | decimal |
//! | `OFFSET(s.field)` | `%lu`         | decimal |
//! | `LENGTH(name)`    | `%lu`         | decimal |
//! | `NUMBER(name)`    | `%ld`; some arches print `0x%lx` | signed decimal, or hex with `0x` (bits kept as i64) |
//! | anything else (`BUILD-ID`, `CRASHTIME`, `CONFIG_*`, ...) | | kept in `raw` only |
//!
//! Every line also lands in [`VmcoreInfo::raw`] and the verbatim text in
//! [`VmcoreInfo::text`], so a dump writer can re-emit the note unchanged.

mod find;
mod note;

use std::collections::BTreeMap;

pub use find::{
    find_vmcoreinfo, find_vmcoreinfo_all, parse_sysfs_vmcoreinfo, read_vmcoreinfo, Found,
};
pub use note::{encode_note, parse_note, NoteHeader, MAX_DESC_SIZE, NOTE_NAME};

/// Errors reading or parsing VMCOREINFO.
#[derive(Debug, thiserror::Error)]
pub enum VmcoreinfoError {
    /// Fewer bytes than the note claims.
    #[error("VMCOREINFO note truncated: needs {need} bytes, has {have}")]
    Truncated { need: u64, have: u64 },
    /// The name size is not 11.
    #[error("VMCOREINFO note name size is {0}, expected 11")]
    WrongNameSize(u32),
    /// The note type is not 0.
    #[error("VMCOREINFO note type is {0}, expected 0")]
    WrongType(u32),
    /// The name is not `VMCOREINFO\0` padded with NUL.
    #[error("note name is not \"VMCOREINFO\" with NUL padding")]
    WrongName,
    /// The text is larger than any kernel writes.
    #[error("VMCOREINFO text size {0} exceeds the {MAX_DESC_SIZE}-byte limit")]
    TooLarge(u32),
    /// The note text is empty.
    #[error("VMCOREINFO text is empty")]
    Empty,
    /// The text is not UTF-8.
    #[error("VMCOREINFO text is not UTF-8 at byte {0}")]
    NotUtf8(usize),
    /// The text contains a NUL byte before its end.
    #[error("VMCOREINFO text contains a NUL byte at byte {0}")]
    Nul(usize),
    /// A line has no `=`.
    #[error("VMCOREINFO line {line_no} has no '=': {line:?}")]
    NoEquals { line_no: usize, line: String },
    /// A key is empty or a `SYMBOL(...)`-style key is not closed.
    #[error("VMCOREINFO line {line_no} has a malformed key: {key:?}")]
    BadKey { line_no: usize, key: String },
    /// A key appears twice.
    #[error("VMCOREINFO key {key} appears twice (lines {first} and {second})")]
    DuplicateKey {
        key: String,
        first: usize,
        second: usize,
    },
    /// A value does not fit its key's format.
    #[error("VMCOREINFO {key} has a bad value {value:?} (expected {expected})")]
    BadValue {
        key: String,
        value: String,
        expected: &'static str,
    },
    /// A key every kernel writes is absent.
    #[error("VMCOREINFO has no {0} line")]
    Missing(&'static str),
    /// The sysfs text is not `PADDR SIZE`.
    #[error("malformed /sys/kernel/vmcoreinfo contents: {0:?}")]
    BadSysfs(String),
    /// Guest memory could not be read.
    #[error("cannot read VMCOREINFO from guest memory")]
    Memory(#[from] crate::memory::MemoryError),
    /// No valid note was found in guest RAM.
    #[error("no VMCOREINFO note in guest RAM ({candidates} candidates rejected{last})")]
    NotFound { candidates: usize, last: String },
    /// Several different valid notes exist (e.g. one left by a previous boot).
    #[error("{} different VMCOREINFO notes in guest RAM at {addresses:#x?}; ask the guest agent which is live", addresses.len())]
    Ambiguous { addresses: Vec<u64> },
}

/// Parsed VMCOREINFO.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VmcoreInfo {
    /// `OSRELEASE`: the kernel release, as `uname -r` prints it.
    pub osrelease: String,
    /// `PAGESIZE` in bytes.
    pub page_size: u64,
    /// `KERNELOFFSET`: the KASLR virtual offset of the kernel image.
    pub kernel_offset: Option<u64>,
    /// `NUMBER(phys_base)`: physical minus link-time address of the kernel (x86-64).
    pub phys_base: Option<u64>,
    /// `SYMBOL(name)`: kernel virtual addresses.
    pub symbols: BTreeMap<String, u64>,
    /// `SIZE(name)`: `sizeof` in bytes.
    pub sizes: BTreeMap<String, u64>,
    /// `OFFSET(struct.field)`: byte offsets, keyed `struct.field`.
    pub offsets: BTreeMap<String, u64>,
    /// `LENGTH(name)`: array lengths.
    pub lengths: BTreeMap<String, u64>,
    /// `NUMBER(name)`: constants.
    pub numbers: BTreeMap<String, i64>,
    /// Every line as key → value, including the typed ones.
    pub raw: BTreeMap<String, String>,
    /// The text exactly as found in the note.
    pub text: String,
}

impl VmcoreInfo {
    /// `SYMBOL(name)`, e.g. `symbol("init_top_pgt")`.
    pub fn symbol(&self, name: &str) -> Option<u64> {
        self.symbols.get(name).copied()
    }

    /// `OFFSET(strukt.field)`, e.g. `offset("page", "flags")`.
    pub fn offset(&self, strukt: &str, field: &str) -> Option<u64> {
        self.offsets.get(&format!("{strukt}.{field}")).copied()
    }

    /// `SIZE(name)`, e.g. `size("page")`.
    pub fn size(&self, name: &str) -> Option<u64> {
        self.sizes.get(name).copied()
    }

    /// `LENGTH(name)`.
    pub fn length(&self, name: &str) -> Option<u64> {
        self.lengths.get(name).copied()
    }

    /// `NUMBER(name)`, e.g. `number("PAGE_BUDDY_MAPCOUNT_VALUE")`.
    pub fn number(&self, name: &str) -> Option<i64> {
        self.numbers.get(name).copied()
    }

    /// Parses the note's text (the descriptor bytes).
    pub fn parse(desc: &[u8]) -> Result<VmcoreInfo, VmcoreinfoError> {
        // Tolerate NUL padding after the text (as in a padded descriptor), not inside it.
        let end = desc.iter().rposition(|&b| b != 0).map_or(0, |i| i + 1);
        let desc = &desc[..end];
        if desc.is_empty() {
            return Err(VmcoreinfoError::Empty);
        }
        if let Some(i) = desc.iter().position(|&b| b == 0) {
            return Err(VmcoreinfoError::Nul(i));
        }
        let text =
            std::str::from_utf8(desc).map_err(|e| VmcoreinfoError::NotUtf8(e.valid_up_to()))?;
        let mut info = VmcoreInfo {
            osrelease: String::new(),
            page_size: 0,
            kernel_offset: None,
            phys_base: None,
            symbols: BTreeMap::new(),
            sizes: BTreeMap::new(),
            offsets: BTreeMap::new(),
            lengths: BTreeMap::new(),
            numbers: BTreeMap::new(),
            raw: BTreeMap::new(),
            text: text.to_string(),
        };
        let mut seen: BTreeMap<&str, usize> = BTreeMap::new();
        let mut osrelease = None;
        let mut page_size = None;
        for (i, line) in text.split('\n').enumerate() {
            let line_no = i + 1;
            if line.is_empty() {
                continue;
            }
            let (key, value) = line
                .split_once('=')
                .ok_or_else(|| VmcoreinfoError::NoEquals {
                    line_no,
                    line: line.chars().take(100).collect(),
                })?;
            if let Some(first) = seen.insert(key, line_no) {
                return Err(VmcoreinfoError::DuplicateKey {
                    key: key.to_string(),
                    first,
                    second: line_no,
                });
            }
            let bad_key = || VmcoreinfoError::BadKey {
                line_no,
                key: key.chars().take(100).collect(),
            };
            if key.is_empty() || key.contains(char::is_whitespace) {
                return Err(bad_key());
            }
            match classify(key).ok_or_else(bad_key)? {
                Key::OsRelease => osrelease = Some(value.to_string()),
                Key::PageSize => page_size = Some(page_size_value(key, value)?),
                Key::KernelOffset => info.kernel_offset = Some(hex_value(key, value)?),
                Key::Symbol(n) => {
                    info.symbols.insert(n.into(), hex_value(key, value)?);
                }
                Key::Size(n) => {
                    info.sizes.insert(n.into(), dec_value(key, value)?);
                }
                Key::Offset(n) => {
                    info.offsets.insert(n.into(), dec_value(key, value)?);
                }
                Key::Length(n) => {
                    info.lengths.insert(n.into(), dec_value(key, value)?);
                }
                Key::Number(n) => {
                    info.numbers.insert(n.into(), number_value(key, value)?);
                }
                Key::Other => {}
            }
            info.raw.insert(key.to_string(), value.to_string());
        }
        info.osrelease = osrelease.ok_or(VmcoreinfoError::Missing("OSRELEASE"))?;
        info.page_size = page_size.ok_or(VmcoreinfoError::Missing("PAGESIZE"))?;
        info.phys_base = info.numbers.get("phys_base").map(|&v| v as u64);
        Ok(info)
    }
}

enum Key<'a> {
    OsRelease,
    PageSize,
    KernelOffset,
    Symbol(&'a str),
    Size(&'a str),
    Offset(&'a str),
    Length(&'a str),
    Number(&'a str),
    Other,
}

/// Sorts a key into its family; `None` if a `FAMILY(...)` key is malformed.
fn classify(key: &str) -> Option<Key<'_>> {
    let inner = |prefix: &str| -> Option<Option<&str>> {
        let rest = key.strip_prefix(prefix)?.strip_prefix('(')?;
        let name = rest.strip_suffix(')');
        Some(name.filter(|n| !n.is_empty() && !n.contains(['(', ')'])))
    };
    Some(match key {
        "OSRELEASE" => Key::OsRelease,
        "PAGESIZE" => Key::PageSize,
        "KERNELOFFSET" => Key::KernelOffset,
        _ => {
            if let Some(n) = inner("SYMBOL") {
                Key::Symbol(n?)
            } else if let Some(n) = inner("SIZE") {
                Key::Size(n?)
            } else if let Some(n) = inner("OFFSET") {
                let n = n?;
                let (s, f) = n.split_once('.')?;
                if s.is_empty() || f.is_empty() {
                    return None;
                }
                Key::Offset(n)
            } else if let Some(n) = inner("LENGTH") {
                Key::Length(n?)
            } else if let Some(n) = inner("NUMBER") {
                Key::Number(n?)
            } else {
                Key::Other
            }
        }
    })
}

fn bad(key: &str, value: &str, expected: &'static str) -> VmcoreinfoError {
    VmcoreinfoError::BadValue {
        key: key.to_string(),
        value: value.chars().take(100).collect(),
        expected,
    }
}

fn is_digits(s: &str, radix: u32) -> bool {
    !s.is_empty() && s.chars().all(|c| c.is_digit(radix))
}

/// `%lx`: hex digits without prefix; a `0x` prefix is accepted too.
fn hex_value(key: &str, value: &str) -> Result<u64, VmcoreinfoError> {
    let digits = value.strip_prefix("0x").unwrap_or(value);
    if !is_digits(digits, 16) {
        return Err(bad(key, value, "hex"));
    }
    u64::from_str_radix(digits, 16).map_err(|_| bad(key, value, "hex that fits 64 bits"))
}

/// `%lu`: unsigned decimal.
fn dec_value(key: &str, value: &str) -> Result<u64, VmcoreinfoError> {
    if !is_digits(value, 10) {
        return Err(bad(key, value, "unsigned decimal"));
    }
    value
        .parse()
        .map_err(|_| bad(key, value, "decimal that fits 64 bits"))
}

/// `%ld`, or `0x%lx` as some architectures print NUMBER() lines.
fn number_value(key: &str, value: &str) -> Result<i64, VmcoreinfoError> {
    if let Some(hex) = value.strip_prefix("0x") {
        if !is_digits(hex, 16) {
            return Err(bad(key, value, "decimal or 0x-prefixed hex"));
        }
        // The kernel printed an unsigned long: keep its bits.
        return u64::from_str_radix(hex, 16)
            .map(|v| v as i64)
            .map_err(|_| bad(key, value, "hex that fits 64 bits"));
    }
    let digits = value.strip_prefix('-').unwrap_or(value);
    if !is_digits(digits, 10) {
        return Err(bad(key, value, "decimal or 0x-prefixed hex"));
    }
    value
        .parse()
        .map_err(|_| bad(key, value, "decimal that fits 64 bits"))
}

fn page_size_value(key: &str, value: &str) -> Result<u64, VmcoreinfoError> {
    let v = dec_value(key, value)?;
    if !v.is_power_of_two() || v < 512 {
        return Err(bad(key, value, "a power of two of at least 512"));
    }
    Ok(v)
}

#[cfg(test)]
mod tests;
