//! A small stream in the shape QEMU 7.2 writes for a snapshot's device state, for
//! tests and the fuzzing corpus: main RAM (`pc.ram`, 128 MiB) shared and only
//! listed, a private BIOS block with a data page and a zero page, two devices.

use crate::put::Put;
use crate::{kind, ram_flag, MAGIC, VERSION};

pub const RAM_ID: u32 = 2;
pub const BIOS: u64 = 256 << 10;
pub const MAIN: u64 = 128 << 20;

/// A stream: main RAM shared (listed only), a private BIOS block with two pages.
pub fn snapshot_stream() -> Vec<u8> {
    let mut w = Vec::new();
    w.be32(MAGIC).be32(VERSION).u8(kind::CONFIGURATION);
    w.be32(13);
    w.bytes(b"pc-i440fx-7.2");
    w.u8(kind::SUBSECTION)
        .cstr("configuration/capabilities")
        .be32(1)
        .be32(1)
        .cstr("x-ignore-shared");
    w.u8(kind::SECTION_START)
        .be32(RAM_ID)
        .cstr("ram")
        .be32(0)
        .be32(4);
    w.be64((MAIN + BIOS) | ram_flag::MEM_SIZE);
    w.cstr("pc.ram").be64(MAIN).be64(0);
    w.cstr("pc.bios").be64(BIOS).be64(0xfffc0000);
    w.be64(ram_flag::EOS).footer(RAM_ID);
    // A part with a data page, then the end with a zero page continuing the block.
    w.u8(kind::SECTION_PART).be32(RAM_ID);
    w.be64(0x1000 | ram_flag::PAGE).cstr("pc.bios");
    w.bytes(&[0xab; 4096]);
    w.be64(ram_flag::EOS).footer(RAM_ID);
    w.u8(kind::SECTION_END).be32(RAM_ID);
    w.be64(0x2000 | ram_flag::ZERO | ram_flag::CONTINUE).u8(0);
    w.be64(ram_flag::EOS).footer(RAM_ID);
    // Two devices, opaque here.
    w.u8(kind::SECTION_FULL)
        .be32(3)
        .cstr("timer")
        .be32(0)
        .be32(2)
        .be64(7)
        .footer(3);
    w.u8(kind::SECTION_FULL)
        .be32(4)
        .cstr("cpu")
        .be32(0)
        .be32(12)
        .be32(0x0600_0000)
        .footer(4);
    w.u8(kind::EOF);
    let json = br#"{"page_size":4096,"devices":[]}"#;
    w.u8(kind::VMDESCRIPTION).be32(json.len() as u32);
    w.bytes(json);
    w
}
