//! Errors of every structure operation and of `check()`.

/// What can go wrong on a structure region.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum DsError {
    #[error("region of {len} bytes is too small: the layout needs at least {need}")]
    TooSmall { len: usize, need: usize },
    #[error("region header has magic {0:#018x}, not a haheap-ds region")]
    BadMagic(u64),
    #[error("region header has layout version {0}, this build reads only version 1")]
    BadVersion(u64),
    #[error("region holds structure id {found}, expected {expected}")]
    WrongStructure { found: u64, expected: u64 },
    #[error("region header is inconsistent: {0}")]
    BadHeader(String),
    #[error("the region is full: no free node or table cell left")]
    Full,
    #[error("key {0:#x} is reserved as a sentinel and cannot be stored")]
    ReservedKey(u64),
    #[error("{structure}: {detail}")]
    Corrupt {
        structure: &'static str,
        detail: String,
    },
}
