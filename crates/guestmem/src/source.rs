//! Backings of a RAM block, addressed by RAM block offset (not GPA).
//!
//! [`PageSource`] is the small interface the rest of the crate reads through:
//! positional reads plus "which parts hold data". [`FileSource`] reads the
//! shared RAM file (`mem-path` or a memfd reopened through `/proc/<pid>/fd/N`)
//! with `pread` and finds data with `lseek(SEEK_DATA/SEEK_HOLE)`; it never maps
//! the file, because touching a tmpfs hole through a mapping allocates it.
//! [`crate::procmem::ProcMemSource`] reads through the QEMU process instead.

use std::fs::File;
use std::io;
use std::ops::Range;
use std::os::fd::AsRawFd;
use std::os::unix::fs::{FileExt, MetadataExt};
use std::path::{Path, PathBuf};

/// Errors of a page source.
#[derive(Debug, thiserror::Error)]
pub enum SourceError {
    /// Opening the backing failed.
    #[error("cannot open {path}")]
    Open { path: PathBuf, source: io::Error },
    /// The backing is smaller than the RAM block it should hold.
    #[error("{path} holds {actual:#x} bytes, less than the RAM size {expected:#x}")]
    TooSmall {
        path: PathBuf,
        actual: u64,
        expected: u64,
    },
    /// A read failed.
    #[error("read of {len:#x} bytes at RAM offset {offset:#x} failed")]
    Read {
        offset: u64,
        len: usize,
        source: io::Error,
    },
    /// A read ended early (the backing shrank or the process exited).
    #[error("read at RAM offset {offset:#x} ended after {got:#x} of {len:#x} bytes")]
    ShortRead { offset: u64, got: usize, len: usize },
    /// A read reached past the end of the RAM block.
    #[error("RAM offsets {start:#x}..{end:#x} reach past the RAM size {size:#x}")]
    OutOfRange { start: u64, end: u64, size: u64 },
    /// Finding data extents failed.
    #[error("cannot list data extents of {path}")]
    Extents { path: PathBuf, source: io::Error },
}

/// A readable RAM block.
///
/// Implementations must not change the guest-visible state of the memory
/// they read, and must not allocate host memory for holes they read.
pub trait PageSource {
    /// Size of the RAM block in bytes.
    fn size(&self) -> u64;

    /// Fills `buf` with the bytes at RAM block offset `offset`.
    fn read_exact_at(&self, offset: u64, buf: &mut [u8]) -> Result<(), SourceError>;

    /// The offset ranges that may hold non-zero bytes, sorted and disjoint,
    /// within `0..size()`. Everything outside reads as zero.
    fn data_extents(&self) -> Result<Vec<Range<u64>>, SourceError>;

    /// A short description for error messages and logs.
    fn describe(&self) -> String;
}

/// Boxed sources, so one [`crate::GuestMemory`] can mix backings (boot RAM
/// from a file, device memory through the process, ...).
impl<T: PageSource + ?Sized> PageSource for Box<T> {
    fn size(&self) -> u64 {
        (**self).size()
    }

    fn read_exact_at(&self, offset: u64, buf: &mut [u8]) -> Result<(), SourceError> {
        (**self).read_exact_at(offset, buf)
    }

    fn data_extents(&self) -> Result<Vec<Range<u64>>, SourceError> {
        (**self).data_extents()
    }

    fn describe(&self) -> String {
        (**self).describe()
    }
}

/// Checks that `offset..offset+len` lies inside a block of `size` bytes.
pub(crate) fn check_range(offset: u64, len: usize, size: u64) -> Result<(), SourceError> {
    let end = offset.checked_add(len as u64);
    match end {
        Some(end) if end <= size => Ok(()),
        _ => Err(SourceError::OutOfRange {
            start: offset,
            end: end.unwrap_or(u64::MAX),
            size,
        }),
    }
}

/// `pread` until `buf` is full; a zero-length read is reported as short.
pub(crate) fn pread_exact(
    file: &File,
    base: u64,
    offset: u64,
    buf: &mut [u8],
) -> Result<(), SourceError> {
    let mut done = 0;
    while done < buf.len() {
        let pos = base + offset + done as u64;
        match file.read_at(&mut buf[done..], pos) {
            Ok(0) => {
                return Err(SourceError::ShortRead {
                    offset,
                    got: done,
                    len: buf.len(),
                })
            }
            Ok(n) => done += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(source) => {
                return Err(SourceError::Read {
                    offset,
                    len: buf.len(),
                    source,
                })
            }
        }
    }
    Ok(())
}

/// The shared RAM file of a VM, read with `pread`.
#[derive(Debug)]
pub struct FileSource {
    file: File,
    path: PathBuf,
    size: u64,
}

impl FileSource {
    /// Opens `path` read-only for a RAM block of `ram_size` bytes. Bytes past
    /// `ram_size` (a larger file) are not RAM and are ignored.
    pub fn open(path: impl AsRef<Path>, ram_size: u64) -> Result<FileSource, SourceError> {
        let path = path.as_ref().to_path_buf();
        let file = File::open(&path).map_err(|source| SourceError::Open {
            path: path.clone(),
            source,
        })?;
        let actual = file
            .metadata()
            .map_err(|source| SourceError::Open {
                path: path.clone(),
                source,
            })?
            .len();
        if actual < ram_size {
            return Err(SourceError::TooSmall {
                path,
                actual,
                expected: ram_size,
            });
        }
        Ok(FileSource {
            file,
            path,
            size: ram_size,
        })
    }

    /// The path this source was opened from.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The parts of `range` that may hold non-zero bytes (see [`PageSource::data_extents`]).
    pub fn data_extents_in(&self, range: Range<u64>) -> Result<Vec<Range<u64>>, SourceError> {
        file_data_extents_in(&self.file, range).map_err(|source| SourceError::Extents {
            path: self.path.clone(),
            source,
        })
    }

    /// Host bytes allocated to the file (`st_blocks * 512`).
    pub fn allocated_host_bytes(&self) -> io::Result<u64> {
        Ok(self.file.metadata()?.blocks() * 512)
    }
}

impl PageSource for FileSource {
    fn size(&self) -> u64 {
        self.size
    }

    fn read_exact_at(&self, offset: u64, buf: &mut [u8]) -> Result<(), SourceError> {
        check_range(offset, buf.len(), self.size)?;
        pread_exact(&self.file, 0, offset, buf)
    }

    fn data_extents(&self) -> Result<Vec<Range<u64>>, SourceError> {
        file_data_extents(&self.file, self.size).map_err(|source| SourceError::Extents {
            path: self.path.clone(),
            source,
        })
    }

    fn describe(&self) -> String {
        format!("RAM file {}", self.path.display())
    }
}

/// One `lseek` with `SEEK_DATA` or `SEEK_HOLE`; `None` when there is no
/// data at or after `pos` (`ENXIO`).
fn seek(file: &File, pos: u64, whence: libc::c_int) -> io::Result<Option<u64>> {
    let pos =
        libc::off_t::try_from(pos).map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))?;
    // SAFETY: lseek only reads its integer arguments; the descriptor is owned by
    // `file`, which outlives the call. Moving the file position is harmless:
    // every read in this crate is positional (pread).
    let r = unsafe { libc::lseek(file.as_raw_fd(), pos, whence) };
    if r < 0 {
        let e = io::Error::last_os_error();
        return if e.raw_os_error() == Some(libc::ENXIO) {
            Ok(None)
        } else {
            Err(e)
        };
    }
    Ok(Some(r as u64))
}

/// The data extents of `file` within `0..limit`, via `SEEK_DATA`/`SEEK_HOLE`.
/// File systems without hole support report the whole file as data, which
/// is correct, only slower to scan.
pub fn file_data_extents(file: &File, limit: u64) -> io::Result<Vec<Range<u64>>> {
    file_data_extents_in(file, 0..limit)
}

/// [`file_data_extents`] within `range` only (clipped to it).
pub fn file_data_extents_in(file: &File, range: Range<u64>) -> io::Result<Vec<Range<u64>>> {
    let limit = range.end;
    let mut out: Vec<Range<u64>> = Vec::new();
    let mut pos = range.start;
    while pos < limit {
        let Some(start) = seek(file, pos, libc::SEEK_DATA)? else {
            break;
        };
        if start >= limit {
            break;
        }
        // A file always ends in an implicit hole, so SEEK_HOLE after data succeeds;
        // ENXIO here means the file shrank in between: stop.
        let Some(end) = seek(file, start, libc::SEEK_HOLE)? else {
            break;
        };
        let end = end.min(limit);
        if end <= start {
            break;
        }
        match out.last_mut() {
            Some(last) if last.end == start => last.end = end,
            _ => out.push(start..end),
        }
        pos = end;
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    #[test]
    fn extents_of_a_sparse_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("ram");
        let f = File::create(&path).unwrap();
        f.set_len(64 << 20).unwrap();
        f.write_at(&[1u8; 4096], 8 << 20).unwrap();
        f.write_at(&[2u8; 8192], 32 << 20).unwrap();
        drop(f);
        let src = FileSource::open(&path, 64 << 20).unwrap();
        let ext = src.data_extents().unwrap();
        // File systems may round extents up to their block size, never down.
        assert!(ext.iter().any(|r| r.contains(&(8 << 20))), "{ext:x?}");
        assert!(
            ext.iter().any(|r| r.contains(&((32 << 20) + 8191))),
            "{ext:x?}"
        );
        assert!(!ext.iter().any(|r| r.contains(&(16 << 20))), "{ext:x?}");
        let total: u64 = ext.iter().map(|r| r.end - r.start).sum();
        assert!(total < 4 << 20, "{ext:x?}");
    }

    #[test]
    fn extents_are_clipped_to_the_ram_size() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("ram");
        let mut f = File::create(&path).unwrap();
        f.write_all(&vec![7u8; 1 << 20]).unwrap();
        drop(f);
        let src = FileSource::open(&path, 4096).unwrap();
        assert_eq!(src.data_extents().unwrap(), vec![0..4096]);
    }

    #[test]
    fn reads_are_bounded_and_short_files_refused() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("ram");
        File::create(&path).unwrap().set_len(8192).unwrap();
        let src = FileSource::open(&path, 8192).unwrap();
        let mut buf = [0u8; 16];
        src.read_exact_at(8192 - 16, &mut buf).unwrap();
        let err = src.read_exact_at(8192 - 8, &mut buf).unwrap_err();
        assert!(matches!(err, SourceError::OutOfRange { .. }), "{err}");
        let err = src.read_exact_at(u64::MAX - 4, &mut buf).unwrap_err();
        assert!(matches!(err, SourceError::OutOfRange { .. }), "{err}");
        let err = FileSource::open(&path, 8193).unwrap_err();
        assert!(err.to_string().contains("less than the RAM size"), "{err}");
        let err = FileSource::open(dir.path().join("missing"), 1).unwrap_err();
        assert!(err.to_string().contains("missing"), "{err}");
    }
}
