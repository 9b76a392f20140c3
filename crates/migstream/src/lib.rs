//! QEMU 7.2's migration stream (`docs/design/qemu-postcopy-stream.md` describes it).
//!
//! [`SnapshotStream::parse`] reads the stream a snapshot's `device.state` holds: QEMU
//! wrote it with `x-ignore-shared` on, so guest RAM (a shared file) is only named in
//! the RAM section's block list, while the small private blocks (firmware, option
//! ROMs, video memory) come as page records. What it returns is what a postcopy
//! source needs to send the same machine again: the configuration, the block list,
//! the private blocks' pages, and the devices' sections as one opaque run of bytes
//! (they are not self-delimiting without each device's description, and nothing
//! here needs to look inside them).
//!
//! The bytes come from a snapshot file, so every length and offset is checked
//! before use; anything this reader does not expect is refused with the offset
//! and a reason.
//!
//! [`write::Writer`] writes the postcopy stream a restore sends to its destination
//! QEMU, and [`rp::next`] reads what the destination sends back (page requests).

pub mod example;
mod parse;
mod put;
pub mod rp;
pub mod write;

pub use parse::{Page, PageRecord, RamBlock, SnapshotStream, StreamError};

/// `QEVM`.
pub const MAGIC: u32 = 0x5145_564d;
/// The only stream version QEMU 7.2 loads.
pub const VERSION: u32 = 3;
/// x86's target page.
pub const PAGE_SIZE: u64 = 4096;

/// Section and record type bytes (QEMU's `QEMU_VM_*`).
pub mod kind {
    pub const EOF: u8 = 0x00;
    pub const SECTION_START: u8 = 0x01;
    pub const SECTION_PART: u8 = 0x02;
    pub const SECTION_END: u8 = 0x03;
    pub const SECTION_FULL: u8 = 0x04;
    pub const SUBSECTION: u8 = 0x05;
    pub const VMDESCRIPTION: u8 = 0x06;
    pub const CONFIGURATION: u8 = 0x07;
    pub const COMMAND: u8 = 0x08;
    pub const FOOTER: u8 = 0x7e;
}

/// The RAM section's record flags (the low 12 bits of a record's first word).
pub mod ram_flag {
    pub const ZERO: u64 = 0x02;
    pub const MEM_SIZE: u64 = 0x04;
    pub const PAGE: u64 = 0x08;
    pub const EOS: u64 = 0x10;
    pub const CONTINUE: u64 = 0x20;
    /// Every flag bit.
    pub const MASK: u64 = 0xfff;
}
