//! Rebound's dump writer: a crashed guest's RAM as a vmcore that crash and
//! makedumpfile read, written fast, chunk by chunk, with each chunk reported
//! durable so its RAM can be released while the rest is still being written
//! (the Vicover scheme: dump overlapped with recovery).
//!
//! - [`Dumper`]: guest memory ([`rebound_guestmem::GuestMemory`]) + VMCOREINFO
//!   text + register notes + an optional [`PageFilter`] → [`Format::Elf`] or
//!   [`Format::Kdump`] file, via `<out>.partial`, with [`Progress`] reports.
//! - [`notes_from_qemu_elf`]: the per-vCPU register notes out of the tiny ELF
//!   QMP `dump-guest-memory` writes for `begin: 0, length: 4096`.
//! - [`inspect()`]: what a dump file holds and whether it is complete.
//! - [`DumpPages`]: the pages a dump (even one cut short) holds, to resume it.
//!
//! Formats, and the tool sources they were checked against, are described in
//! [`elf`] and [`kdump`] and in the crate's README.

#![allow(clippy::single_range_in_vec_init)] // ranges of addresses, not one-element vectors

pub mod elf;
pub mod filter;
pub mod inspect;
pub mod kdump;
pub mod notes;
pub mod read;
pub mod write;

pub use filter::{PageFilter, PfnBitmap};
pub use inspect::{inspect, DumpInfo, InspectError};
pub use notes::{notes_from_qemu_elf, Note, NoteError};
pub use read::{DumpPages, ReadError};
pub use write::{Compress, DumpError, DumpOptions, DumpReport, Dumper, Format, Progress};

/// The guest page size (x86-64).
pub const PAGE_SIZE: u64 = 4096;
