//! Writing a postcopy migration stream for QEMU 7.2 as its source, from what
//! [`SnapshotStream`] read out of a snapshot (`docs/design/qemu-postcopy-stream.md`,
//! sections 4 and 9): the header and configuration (without `x-ignore-shared`, which
//! a postcopy destination refuses), the return path opened, postcopy advised, the
//! RAM section's block list, pages, the devices packaged between LISTEN and RUN, and
//! the end. Each function appends one piece to a buffer; the caller decides the order
//! of pages and when to send what.

use crate::put::Put;
use crate::{kind, ram_flag, SnapshotStream, MAGIC, PAGE_SIZE, VERSION};

/// The postcopy commands (QEMU 7.2's `MIG_CMD_*`).
pub mod cmd {
    pub const OPEN_RETURN_PATH: u16 = 1;
    pub const PING: u16 = 2;
    pub const POSTCOPY_ADVISE: u16 = 3;
    pub const POSTCOPY_LISTEN: u16 = 4;
    pub const POSTCOPY_RUN: u16 = 5;
    pub const POSTCOPY_RAM_DISCARD: u16 = 6;
    pub const PACKAGED: u16 = 7;
}

/// The RAM section's id in the streams written here: not 0, which the destination
/// could match against a section never loaded.
pub const RAM_SECTION: u32 = 2;

/// One page to send: its block (an index into the stream's blocks), its offset and
/// its bytes (`None` for a page of zeros).
pub struct OutPage<'a> {
    pub block: usize,
    pub offset: u64,
    pub data: Option<&'a [u8]>,
}

/// A stream being written. It remembers the block of the last page record, so a
/// record of the same block leaves the name out, as QEMU's own source does.
pub struct Writer<'s> {
    stream: &'s SnapshotStream,
    last_block: Option<usize>,
}

fn command(out: &mut Vec<u8>, c: u16, payload: &[u8]) {
    out.u8(kind::COMMAND)
        .be16(c)
        .be16(payload.len() as u16)
        .bytes(payload);
}

impl<'s> Writer<'s> {
    pub fn new(stream: &'s SnapshotStream) -> Writer<'s> {
        Writer {
            stream,
            last_block: None,
        }
    }

    /// Header, configuration, return path opened, postcopy advised (4 KiB pages),
    /// and the RAM section's start with the snapshot's block list. Advise goes
    /// before the block list: the destination reads the list differently after it.
    pub fn start(&mut self, out: &mut Vec<u8>) {
        let s = self.stream;
        out.be32(MAGIC).be32(VERSION).u8(kind::CONFIGURATION);
        out.be32(s.machine.len() as u32).bytes(s.machine.as_bytes());
        if let Some(bits) = s.target_page_bits {
            out.u8(kind::SUBSECTION)
                .cstr("configuration/target-page-bits")
                .be32(1)
                .be32(bits);
        }
        if let Some(uuid) = s.uuid {
            out.u8(kind::SUBSECTION)
                .cstr("configuration/uuid")
                .be32(1)
                .bytes(&uuid);
        }
        command(out, cmd::OPEN_RETURN_PATH, &[]);
        let mut advise = Vec::new();
        advise.be64(PAGE_SIZE).be64(PAGE_SIZE);
        command(out, cmd::POSTCOPY_ADVISE, &advise);
        out.u8(kind::SECTION_START)
            .be32(RAM_SECTION)
            .cstr("ram")
            .be32(0)
            .be32(4);
        let total: u64 = s.blocks.iter().map(|b| b.used_length).sum();
        out.be64(total | ram_flag::MEM_SIZE);
        for b in &s.blocks {
            out.cstr(&b.name).be64(b.used_length);
        }
        out.be64(ram_flag::EOS).footer(RAM_SECTION);
    }

    /// One part of the RAM section holding `pages`.
    pub fn part<'p>(&mut self, out: &mut Vec<u8>, pages: impl IntoIterator<Item = OutPage<'p>>) {
        self.section(out, kind::SECTION_PART, pages);
    }

    /// A part or the end of the RAM section: its records, then end-of-section.
    fn section<'p>(
        &mut self,
        out: &mut Vec<u8>,
        kind: u8,
        pages: impl IntoIterator<Item = OutPage<'p>>,
    ) {
        out.u8(kind).be32(RAM_SECTION);
        self.records(out, pages);
        out.be64(ram_flag::EOS).footer(RAM_SECTION);
    }

    fn records<'p>(&mut self, out: &mut Vec<u8>, pages: impl IntoIterator<Item = OutPage<'p>>) {
        for p in pages {
            debug_assert!(p.offset % PAGE_SIZE == 0);
            let mut word = p.offset;
            word |= if p.data.is_some() {
                ram_flag::PAGE
            } else {
                ram_flag::ZERO
            };
            let same = self.last_block == Some(p.block);
            if same {
                word |= ram_flag::CONTINUE;
            }
            out.be64(word);
            if !same {
                out.cstr(&self.stream.blocks[p.block].name);
                self.last_block = Some(p.block);
            }
            match p.data {
                Some(d) => {
                    assert_eq!(d.len() as u64, PAGE_SIZE, "a page of {} bytes", d.len());
                    out.bytes(d);
                }
                None => {
                    out.u8(0);
                }
            }
        }
    }

    /// Discards `len` bytes at `start` of a block on the destination (whole pages).
    ///
    /// A stream must carry at least one before its package: QEMU 7.2, handling a
    /// LISTEN that no discard preceded, sets its postcopy state to listening and
    /// then, preparing the discards itself, back to "discard"; every page sent after
    /// that is then copied in as in precopy, into memory already registered for
    /// faults, and the destination hangs on its own write. One discard of a page
    /// not sent yet (the whole of RAM was discarded at advise anyway) avoids it.
    pub fn discard(&mut self, out: &mut Vec<u8>, block: usize, start: u64, len: u64) {
        let name = &self.stream.blocks[block].name;
        let mut p = Vec::new();
        p.u8(0).cstr(name).u8(0).be64(start).be64(len);
        command(out, cmd::POSTCOPY_RAM_DISCARD, &p);
    }

    /// The devices, packaged: LISTEN, the snapshot's device sections, RUN. Once the
    /// destination has read it, it runs the guest and asks for missing pages.
    pub fn package(&mut self, out: &mut Vec<u8>, devices: &[u8]) {
        let mut blob = Vec::with_capacity(devices.len() + 10);
        command(&mut blob, cmd::POSTCOPY_LISTEN, &[]);
        blob.extend(devices);
        command(&mut blob, cmd::POSTCOPY_RUN, &[]);
        command(out, cmd::PACKAGED, &(blob.len() as u32).to_be_bytes());
        out.bytes(&blob);
    }

    /// The RAM section's end with its last `pages`, and the end of the stream.
    pub fn end<'p>(&mut self, out: &mut Vec<u8>, pages: impl IntoIterator<Item = OutPage<'p>>) {
        self.section(out, kind::SECTION_END, pages);
        out.u8(kind::EOF);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::example::snapshot_stream;

    #[test]
    fn a_postcopy_stream_starts_advised_and_packages_the_devices_between_listen_and_run() {
        let b = snapshot_stream();
        let s = SnapshotStream::parse(&b).unwrap();
        let mut w = Writer::new(&s);
        let mut out = Vec::new();
        w.start(&mut out);
        // Header, configuration with no capabilities (the snapshot's x-ignore-shared
        // left out), the return path, advise: exact bytes.
        let mut want = b"QEVM\0\0\0\x03\x07\0\0\0\x0dpc-i440fx-7.2".to_vec();
        want.extend(b"\x08\0\x01\0\0");
        want.extend(b"\x08\0\x03\0\x10\0\0\0\0\0\0\x10\0\0\0\0\0\0\0\x10\0");
        assert_eq!(&out[..want.len()], &want[..]);
        // The block list: the snapshot's, without the addresses.
        let list = &out[want.len()..];
        assert_eq!(&list[..13], b"\x01\0\0\0\x02\x03ram\0\0\0\0");
        assert!(!out.windows(15).any(|x| x == b"x-ignore-shared"));
        let n = out.len();
        let page = [7u8; 4096];
        w.part(
            &mut out,
            [
                OutPage {
                    block: 1,
                    offset: 0x1000,
                    data: Some(&page),
                },
                OutPage {
                    block: 1,
                    offset: 0x2000,
                    data: None,
                },
            ],
        );
        // The second record continues the first's block: no name.
        let part = &out[n..];
        assert_eq!(&part[5..13], &(0x1000 | ram_flag::PAGE).to_be_bytes());
        assert_eq!(&part[13..21], b"\x07pc.bios");
        let second = 21 + 4096;
        assert_eq!(
            &part[second..second + 8],
            &(0x2000 | ram_flag::ZERO | ram_flag::CONTINUE).to_be_bytes()
        );
        let n = out.len();
        w.discard(&mut out, 0, 0, PAGE_SIZE);
        assert_eq!(
            &out[n..],
            b"\x08\0\x06\0\x19\0\x06pc.ram\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\x10\0"
        );
        let n = out.len();
        let dev = &b[s.devices.clone()];
        w.package(&mut out, dev);
        let pkg = &out[n..];
        let blob_len = u32::from_be_bytes(pkg[5..9].try_into().unwrap()) as usize;
        assert_eq!(blob_len, 5 + dev.len() + 5);
        assert_eq!(&pkg[9..14], b"\x08\0\x04\0\0");
        assert_eq!(&pkg[14..14 + dev.len()], dev);
        assert_eq!(&pkg[14 + dev.len()..], b"\x08\0\x05\0\0");
        // The package holds no end byte before RUN: the devices' run ends in a footer.
        assert_eq!(dev[dev.len() - 5], kind::FOOTER);
        let n = out.len();
        w.end(&mut out, []);
        assert_eq!(
            &out[n..],
            b"\x03\0\0\0\x02\0\0\0\0\0\0\0\x10\x7e\0\0\0\x02\0"
        );
    }
}
