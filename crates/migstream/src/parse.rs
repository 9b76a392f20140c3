//! Reading a snapshot's device-state stream apart; see the crate doc.

use std::ops::Range;

use crate::{kind, ram_flag, MAGIC, PAGE_SIZE, VERSION};

/// A device state larger than this is not one QEMU wrote for a snapshot of ours
/// (the private RAM blocks of a pc machine are tens of MiB at most).
pub const MAX_STREAM: usize = 512 << 20;
/// More RAM blocks than this is not a pc machine.
const MAX_BLOCKS: usize = 1024;
/// More validated capabilities than this is not QEMU 7.2 (it has one).
const MAX_CAPABILITIES: u32 = 64;
/// A machine type's name is a few dozen bytes.
const MAX_MACHINE_NAME: u32 = 256;

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum StreamError {
    #[error("the stream ends at byte {at}, inside {what}")]
    Truncated { at: usize, what: &'static str },
    #[error("not a QEMU migration stream (magic {0:#010x}, expected 0x5145564d)")]
    Magic(u32),
    #[error("migration stream version {0}: only version 3 (QEMU 7.2) is read")]
    Version(u32),
    #[error("the stream is {0} bytes: a device state over {MAX_STREAM} bytes is refused")]
    TooLarge(usize),
    #[error("at byte {at}: {why}")]
    Bad { at: usize, why: String },
}

/// One RAM block as the RAM section lists it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RamBlock {
    pub name: String,
    pub used_length: u64,
    /// Its address in its memory region, listed only with `x-ignore-shared`.
    pub addr: Option<u64>,
}

/// What one page record carries.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Page {
    /// A page filled with this byte.
    Fill(u8),
    /// The page's bytes, as a range of the stream.
    Data(Range<usize>),
}

/// One page of a block that the stream carries (a private block: firmware, ROMs,
/// video memory).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PageRecord {
    /// Index into [`SnapshotStream::blocks`].
    pub block: usize,
    /// Byte offset in the block.
    pub offset: u64,
    pub page: Page,
}

/// A device-state stream read apart.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SnapshotStream {
    /// The machine type the stream is for (`pc-i440fx-7.2`).
    pub machine: String,
    /// Validated capabilities the source had on (`x-ignore-shared`).
    pub capabilities: Vec<String>,
    pub target_page_bits: Option<u32>,
    pub uuid: Option<[u8; 16]>,
    /// The RAM section's id in this stream.
    pub ram_section: u32,
    pub blocks: Vec<RamBlock>,
    /// Pages in stream order; a page sent twice appears twice (the later wins).
    pub pages: Vec<PageRecord>,
    /// The devices' full sections, one run of bytes, without the end-of-stream byte.
    pub devices: Range<usize>,
    /// The stream's JSON description of the devices.
    pub vmdesc: Option<Range<usize>>,
}

/// A cursor over untrusted bytes: every read is bounded.
struct Cur<'a> {
    b: &'a [u8],
    at: usize,
}

impl<'a> Cur<'a> {
    fn bad<T>(&self, why: impl Into<String>) -> Result<T, StreamError> {
        Err(StreamError::Bad {
            at: self.at,
            why: why.into(),
        })
    }

    fn take(&mut self, n: usize, what: &'static str) -> Result<Range<usize>, StreamError> {
        let end = self
            .at
            .checked_add(n)
            .filter(|&e| e <= self.b.len())
            .ok_or(StreamError::Truncated {
                at: self.b.len(),
                what,
            })?;
        let r = self.at..end;
        self.at = end;
        Ok(r)
    }

    fn bytes<const N: usize>(&mut self, what: &'static str) -> Result<[u8; N], StreamError> {
        let r = self.take(N, what)?;
        Ok(self.b[r].try_into().expect("N bytes"))
    }

    fn u8(&mut self, what: &'static str) -> Result<u8, StreamError> {
        Ok(self.bytes::<1>(what)?[0])
    }

    fn be32(&mut self, what: &'static str) -> Result<u32, StreamError> {
        Ok(u32::from_be_bytes(self.bytes(what)?))
    }

    fn be64(&mut self, what: &'static str) -> Result<u64, StreamError> {
        Ok(u64::from_be_bytes(self.bytes(what)?))
    }

    fn peek(&self) -> Option<u8> {
        self.b.get(self.at).copied()
    }

    /// A name: printable ASCII, as QEMU's ids and block names are.
    fn name(&mut self, len: usize, what: &'static str) -> Result<String, StreamError> {
        let start = self.at;
        let r = self.take(len, what)?;
        let s = &self.b[r];
        if s.is_empty() || !s.iter().all(|c| c.is_ascii_graphic()) {
            return Err(StreamError::Bad {
                at: start,
                why: format!("{what} is not a printable name"),
            });
        }
        Ok(String::from_utf8(s.to_vec()).expect("ASCII"))
    }

    /// A counted string: one length byte, then the bytes.
    fn cstr(&mut self, what: &'static str) -> Result<String, StreamError> {
        let n = self.u8(what)? as usize;
        self.name(n, what)
    }

    fn footer(&mut self, id: u32) -> Result<(), StreamError> {
        if self.u8("a section footer")? != kind::FOOTER {
            self.at -= 1;
            return self.bad(format!("section {id} has no footer"));
        }
        let got = self.be32("a section footer")?;
        if got != id {
            return self.bad(format!("section {id}'s footer names section {got}"));
        }
        Ok(())
    }
}

impl SnapshotStream {
    /// Reads `b`, the whole stream. See the crate doc for what is refused.
    pub fn parse(b: &[u8]) -> Result<SnapshotStream, StreamError> {
        if b.len() > MAX_STREAM {
            return Err(StreamError::TooLarge(b.len()));
        }
        let mut c = Cur { b, at: 0 };
        let magic = c.be32("the header")?;
        if magic != MAGIC {
            return Err(StreamError::Magic(magic));
        }
        let version = c.be32("the header")?;
        if version != VERSION {
            return Err(StreamError::Version(version));
        }
        let mut s = SnapshotStream {
            machine: String::new(),
            capabilities: Vec::new(),
            target_page_bits: None,
            uuid: None,
            ram_section: 0,
            blocks: Vec::new(),
            pages: Vec::new(),
            devices: 0..0,
            vmdesc: None,
        };
        s.configuration(&mut c)?;
        s.ram(&mut c)?;
        s.tail(&mut c)?;
        Ok(s)
    }

    fn configuration(&mut self, c: &mut Cur<'_>) -> Result<(), StreamError> {
        if c.u8("the configuration")? != kind::CONFIGURATION {
            c.at -= 1;
            return c.bad("no configuration section after the header");
        }
        let len = c.be32("the machine's name")?;
        if len > MAX_MACHINE_NAME {
            c.at -= 4;
            return c.bad(format!("a machine name of {len} bytes"));
        }
        self.machine = c.name(len as usize, "the machine's name")?;
        while c.peek() == Some(kind::SUBSECTION) {
            c.at += 1;
            let name = c.cstr("a configuration subsection's name")?;
            let v = c.be32("a configuration subsection's version")?;
            if v != 1 {
                return c.bad(format!("{name} version {v}"));
            }
            match name.as_str() {
                "configuration/target-page-bits" => {
                    self.target_page_bits = Some(c.be32("the target page bits")?)
                }
                "configuration/capabilities" => {
                    let n = c.be32("the capabilities' count")?;
                    if n > MAX_CAPABILITIES {
                        return c.bad(format!("{n} capabilities"));
                    }
                    for _ in 0..n {
                        self.capabilities.push(c.cstr("a capability")?);
                    }
                }
                "configuration/uuid" => self.uuid = Some(c.bytes("the VM's UUID")?),
                _ => return c.bad(format!("unknown configuration subsection {name}")),
            }
        }
        Ok(())
    }

    fn ignore_shared(&self) -> bool {
        self.capabilities.iter().any(|x| x == "x-ignore-shared")
    }

    /// The RAM section, from its start to its end (its pages collected).
    fn ram(&mut self, c: &mut Cur<'_>) -> Result<(), StreamError> {
        if c.u8("the RAM section")? != kind::SECTION_START {
            c.at -= 1;
            return c.bad("the first section is not the start of the RAM section");
        }
        let id = c.be32("the RAM section's id")?;
        let idstr = c.cstr("the RAM section's name")?;
        let _instance = c.be32("the RAM section's instance")?;
        let version = c.be32("the RAM section's version")?;
        if idstr != "ram" {
            return c.bad(format!(
                "iterable section {idstr:?}: only the RAM section is read (no block migration, no dirty bitmaps)"
            ));
        }
        if version != 4 {
            return c.bad(format!("RAM section version {version}, expected 4"));
        }
        self.ram_section = id;
        let word = c.be64("the RAM block list")?;
        if word & ram_flag::MASK != ram_flag::MEM_SIZE {
            c.at -= 8;
            return c.bad("the RAM section does not start with its block list");
        }
        let total = word & !ram_flag::MASK;
        let mut left = total;
        while left > 0 {
            if self.blocks.len() == MAX_BLOCKS {
                return c.bad(format!("over {MAX_BLOCKS} RAM blocks"));
            }
            let name = c.cstr("a RAM block's name")?;
            let used_length = c.be64("a RAM block's length")?;
            if used_length == 0 || used_length > left {
                c.at -= 8;
                return c.bad(format!(
                    "block {name} of {used_length} bytes: the list says {total} in all, {left} left"
                ));
            }
            let addr = if self.ignore_shared() {
                Some(c.be64("a RAM block's address")?)
            } else {
                None
            };
            if self.blocks.iter().any(|b| b.name == name) {
                return c.bad(format!("block {name} listed twice"));
            }
            left -= used_length;
            self.blocks.push(RamBlock {
                name,
                used_length,
                addr,
            });
        }
        if c.be64("the end of the RAM block list")? != ram_flag::EOS {
            c.at -= 8;
            return c.bad("the RAM block list does not end where its total says");
        }
        c.footer(id)?;
        let max_pages: u64 = self.blocks.iter().map(|b| b.used_length / PAGE_SIZE).sum();
        // A record may continue the block of the previous section's last record.
        let mut last = None;
        loop {
            let at = c.at;
            let t = c.u8("a RAM section")?;
            let sid = c.be32("a RAM section's id")?;
            if !matches!(t, kind::SECTION_PART | kind::SECTION_END) || sid != id {
                c.at = at;
                return c.bad(format!(
                    "expected the RAM section ({id}) to go on or end, found type {t:#04x} for section {sid}"
                ));
            }
            self.pages(c, max_pages, &mut last)?;
            c.footer(id)?;
            if t == kind::SECTION_END {
                return Ok(());
            }
        }
    }

    /// Page records up to the end-of-section word; `last` is the block of the
    /// record before.
    fn pages(
        &mut self,
        c: &mut Cur<'_>,
        max_pages: u64,
        last: &mut Option<usize>,
    ) -> Result<(), StreamError> {
        loop {
            let at = c.at;
            let word = c.be64("a RAM page record")?;
            let (flags, offset) = (word & ram_flag::MASK, word & !ram_flag::MASK);
            if flags == ram_flag::EOS {
                return Ok(());
            }
            let what = flags & !ram_flag::CONTINUE;
            if what != ram_flag::ZERO && what != ram_flag::PAGE {
                c.at = at;
                return c.bad(format!(
                    "RAM record flags {flags:#x}: only whole and zero pages are read"
                ));
            }
            let block = if flags & ram_flag::CONTINUE != 0 {
                match *last {
                    Some(b) => b,
                    None => {
                        c.at = at;
                        return c.bad("a page continues a block no record named");
                    }
                }
            } else {
                let name = c.cstr("a page's block name")?;
                match self.blocks.iter().position(|b| b.name == name) {
                    Some(b) => b,
                    None => return c.bad(format!("a page of unlisted block {name}")),
                }
            };
            *last = Some(block);
            let b = &self.blocks[block];
            if offset
                .checked_add(PAGE_SIZE)
                .is_none_or(|e| e > b.used_length)
            {
                c.at = at;
                return c.bad(format!(
                    "a page at {offset:#x} of block {} ({} bytes)",
                    b.name, b.used_length
                ));
            }
            if self.pages.len() as u64 >= max_pages.saturating_mul(2) {
                c.at = at;
                return c.bad("more page records than twice the blocks' pages");
            }
            let page = if what == ram_flag::ZERO {
                Page::Fill(c.u8("a zero page's fill byte")?)
            } else {
                Page::Data(c.take(PAGE_SIZE as usize, "a page's bytes")?)
            };
            self.pages.push(PageRecord {
                block,
                offset,
                page,
            });
        }
    }

    /// The devices' sections, the end-of-stream byte and the description after it.
    fn tail(&mut self, c: &mut Cur<'_>) -> Result<(), StreamError> {
        let b = c.b;
        let start = c.at;
        // From the end: `00 06 <be32 n> <n bytes of JSON>`. JSON holds no 0x06 byte,
        // so only the real description can match both the marker and the length.
        let described = (start + 1..b.len().saturating_sub(4)).rev().find(|&p| {
            b[p] == kind::VMDESCRIPTION
                && b[p - 1] == kind::EOF
                && u32::from_be_bytes(b[p + 1..p + 5].try_into().expect("4 bytes")) as usize
                    == b.len() - (p + 5)
        });
        // QEMU 7.2 describes the devices after the end byte for every pc machine
        // since 2.3; a stream without the description is cut short.
        let Some(p) = described else {
            return Err(StreamError::Truncated {
                at: b.len(),
                what: "the stream's end (no device description after it)",
            });
        };
        if b.get(p + 5) != Some(&b'{') {
            return Err(StreamError::Bad {
                at: p + 5,
                why: "the device description is not a JSON object".into(),
            });
        }
        self.vmdesc = Some(p + 5..b.len());
        let eof = p - 1;
        if eof > start && b[start] != kind::SECTION_FULL {
            c.at = start;
            return c.bad(format!(
                "expected the devices' sections after the RAM section, found type {:#04x}",
                b[start]
            ));
        }
        // Each full section ends with its footer, so the run does too.
        if eof > start && (eof - start < 5 || b[eof - 5] != kind::FOOTER) {
            c.at = eof;
            return c.bad("the devices' sections do not end with a section footer");
        }
        self.devices = start..eof;
        Ok(())
    }
}

#[cfg(test)]
mod tests;
