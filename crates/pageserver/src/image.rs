//! The RAM image as the page server reads it: with `O_DIRECT` (no readahead
//! decides what else is read, and nothing is left in the page cache), a page or a
//! run of pages at a time, each page's chunk checked against the manifest's
//! checksum before any of its pages leaves.

use std::fs::{File, OpenOptions};
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

use rebound_snapshot::ChunkChecker;

use crate::{Check, ServeError};

pub const PAGE: u64 = 4096;
/// The longest run read at once.
pub const RUN_PAGES: usize = 32;

/// A page-aligned buffer (`O_DIRECT` wants the memory aligned too).
struct Aligned {
    buf: Vec<u8>,
    at: usize,
}

impl Aligned {
    fn new(len: usize) -> Aligned {
        let buf = vec![0u8; len + PAGE as usize];
        let at = buf.as_ptr().align_offset(PAGE as usize);
        Aligned { buf, at }
    }
    fn get(&mut self, len: usize) -> &mut [u8] {
        &mut self.buf[self.at..self.at + len]
    }
}

/// One RAM image being served.
pub struct Image {
    path: PathBuf,
    file: File,
    /// Opened with `O_DIRECT` (a file system without it, such as tmpfs, is read
    /// through the page cache with readahead off).
    pub direct: bool,
    /// Per page: it holds data (else it is a hole, which reads as zeros).
    pub data: Vec<bool>,
    checker: Option<ChunkChecker>,
    /// Each page's checksum, when the snapshot has them.
    page_sums: Option<Vec<u64>>,
    buf: Aligned,
    /// Bytes read from the image (checks included).
    pub bytes_read: u64,
    pub reads: u64,
}

impl Image {
    /// Opens `path`, `size` bytes, to be checked as `check` says.
    pub fn open(path: &Path, size: u64, check: Option<&Check>) -> Result<Image, ServeError> {
        let rerr = |e| ServeError::Image(path.to_path_buf(), e);
        let plain = rebound_snapshot::open_nofollow(path).map_err(rerr)?;
        let len = plain.metadata().map_err(rerr)?.len();
        if len != size || !size.is_multiple_of(PAGE) {
            return Err(ServeError::ImageSize(path.to_path_buf(), len, size));
        }
        let mut data = vec![false; (size / PAGE) as usize];
        for e in rebound_snapshot::image::data_extents(&plain, size).map_err(rerr)? {
            for p in e.start / PAGE..e.end.div_ceil(PAGE) {
                data[p as usize] = true;
            }
        }
        let direct = OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_DIRECT | libc::O_NOFOLLOW)
            .open(path);
        let (file, direct) = match direct {
            Ok(f) => (f, true),
            Err(e) if e.raw_os_error() == Some(libc::EINVAL) => {
                use std::os::unix::io::AsRawFd;
                // SAFETY: posix_fadvise on an fd we own; no memory is involved.
                unsafe { libc::posix_fadvise(plain.as_raw_fd(), 0, 0, libc::POSIX_FADV_RANDOM) };
                (plain, false)
            }
            Err(e) => return Err(rerr(e)),
        };
        let (checker, page_sums) = match check {
            Some(Check::Chunks { chunk, sums }) => {
                (Some(ChunkChecker::new(path, size, *chunk, sums)?), None)
            }
            Some(Check::Pages { file, entry }) => {
                let sums = rebound_snapshot::pagesums::read(file, entry, size / PAGE)?;
                // A hole must be a page that was all zeros.
                let zero = rebound_snapshot::pagesums::sum(&[0u8; PAGE as usize]);
                if let Some(p) = (0..data.len()).find(|&p| !data[p] && sums[p] != zero) {
                    return Err(ServeError::PageMismatch(path.to_path_buf(), p as u64));
                }
                (None, Some(sums))
            }
            None => (None, None),
        };
        Ok(Image {
            path: path.to_path_buf(),
            file,
            direct,
            data,
            checker,
            page_sums,
            buf: Aligned::new(RUN_PAGES * PAGE as usize),
            bytes_read: 0,
            reads: 0,
        })
    }

    pub fn pages(&self) -> u64 {
        self.data.len() as u64
    }

    /// Chunks checked so far (whole, or every page of them when each page is
    /// checked on its own: those are counted once the server ends).
    pub fn chunks_checked(&self) -> u64 {
        self.checker.as_ref().map_or(0, |c| c.checked())
    }

    /// Each page is checked against its own checksum.
    pub fn checks_pages(&self) -> bool {
        self.page_sums.is_some()
    }

    /// Checks the chunks of pages `first..first + n` (once each).
    fn check(&mut self, first: u64, n: u64) -> Result<(), ServeError> {
        let Some(c) = self.checker.as_mut() else {
            return Ok(());
        };
        let per = c.chunk_bytes() / PAGE;
        for i in first / per..=(first + n - 1) / per {
            if !c.is_checked(i) {
                c.check(i)?;
                // The check read the chunk's data pages (never its holes).
                let pages = &self.data
                    [(i * per) as usize..((i + 1) * per).min(self.data.len() as u64) as usize];
                self.bytes_read += pages.iter().filter(|d| **d).count() as u64 * PAGE;
            }
        }
        Ok(())
    }

    /// Reads the `n` pages (at most [`RUN_PAGES`]) from `first`, all data pages,
    /// after checking their chunks.
    pub fn read_run(&mut self, first: u64, n: usize) -> Result<&[u8], ServeError> {
        debug_assert!(n > 0 && n <= RUN_PAGES);
        self.check(first, n as u64)?;
        let len = n * PAGE as usize;
        let buf = self.buf.get(len);
        self.file
            .read_exact_at(buf, first * PAGE)
            .map_err(|e| ServeError::Image(self.path.clone(), e))?;
        self.bytes_read += len as u64;
        self.reads += 1;
        if let Some(sums) = &self.page_sums {
            let buf = self.buf.get(len);
            for (k, page) in buf.chunks(PAGE as usize).enumerate() {
                let p = first + k as u64;
                if rebound_snapshot::pagesums::sum(page) != sums[p as usize] {
                    return Err(ServeError::PageMismatch(self.path.clone(), p));
                }
            }
        }
        Ok(&self.buf.get(len)[..])
    }
}
