//! Why a dump failed, with the cause kept.

use std::path::PathBuf;

/// Why a dump failed.
#[derive(Debug, thiserror::Error)]
pub enum DumpError {
    #[error(transparent)]
    Layout(#[from] rebound_guestmem::LayoutError),
    #[error(transparent)]
    Earlier(#[from] rebound_dump::ReadError),
    #[error(transparent)]
    Ram(#[from] rebound_guestmem::SourceError),
    #[error(transparent)]
    Memory(#[from] rebound_guestmem::MemoryError),
    #[error("cannot open {}", .0.display())]
    Open(PathBuf, #[source] std::io::Error),
    #[error(transparent)]
    Level(#[from] rebound_guestmem::ClassifyError),
    #[error("cannot create {}", .0.display())]
    CreateDir(PathBuf, #[source] std::io::Error),
    #[error(transparent)]
    Write(#[from] rebound_dump::DumpError),
    #[error("QEMU's dump-guest-memory ended as {0}")]
    Qemu(String),
}
