//! The RAM image: a paused guest's RAM file (tmpfs) copied into the snapshot,
//! sparse (zero pages stay holes), in big reads, with `O_DIRECT` writes where the
//! file system takes them, flushed once at the end; with an xxh3-64 checksum per
//! chunk of the logical content (holes read as zeros).

use std::fs::{File, OpenOptions};
use std::io;
use std::ops::Range;
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::os::unix::io::AsRawFd;
use std::path::{Path, PathBuf};

use xxhash_rust::xxh3::Xxh3;

use serde::{Deserialize, Serialize};

use crate::PAGE_SIZE;

/// One RAM block's image, as the manifest lists it.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
pub struct RamBlock {
    pub id: String,
    pub size: u64,
    pub file: String,
    pub chunk_bytes: u64,
    /// xxh3-64 (hex) of each chunk's content; holes count as zeros.
    pub checksums: Vec<String>,
    /// Bytes of non-zero pages in the image.
    pub data_bytes: u64,
    /// A checksum per 4 KiB page (`pagesums`): what a page server checks each page
    /// against as it sends it. Snapshots from before it have none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub page_sums: Option<crate::manifest::FileEntry>,
}

/// Errors copying or hashing images.
#[derive(Debug, thiserror::Error)]
pub enum ImageError {
    #[error("cannot read {0}")]
    Read(PathBuf, #[source] io::Error),
    #[error("cannot write {0}")]
    Write(PathBuf, #[source] io::Error),
    #[error("{0} is {1} bytes, expected at least {2}")]
    Short(PathBuf, u64, u64),
    #[error("chunk size {0} must be a power of two between 4 KiB and 1 GiB")]
    Chunk(u64),
}

/// Bytes read at a time.
const BUF: usize = 8 << 20;

/// A page-aligned buffer (what `O_DIRECT` wants).
struct Aligned {
    ptr: *mut u8,
    len: usize,
}

impl Aligned {
    fn new(len: usize) -> Aligned {
        let layout = std::alloc::Layout::from_size_align(len, PAGE_SIZE as usize).expect("layout");
        // SAFETY: `len` is non-zero (a constant) and the layout valid; the memory is
        // zeroed, owned by this value and freed in `drop` with the same layout.
        let ptr = unsafe { std::alloc::alloc_zeroed(layout) };
        assert!(!ptr.is_null(), "out of memory");
        Aligned { ptr, len }
    }

    fn as_mut(&mut self) -> &mut [u8] {
        // SAFETY: `ptr` points at `len` initialised bytes owned by `self`, borrowed
        // exclusively for as long as `self` is.
        unsafe { std::slice::from_raw_parts_mut(self.ptr, self.len) }
    }
}

// SAFETY: `Aligned` owns its allocation outright (no sharing, no thread-bound
// state), like a `Box<[u8]>`; moving it to another thread moves that ownership.
unsafe impl Send for Aligned {}

impl Drop for Aligned {
    fn drop(&mut self) {
        let layout =
            std::alloc::Layout::from_size_align(self.len, PAGE_SIZE as usize).expect("layout");
        // SAFETY: allocated in `new` with this layout and not freed before.
        unsafe { std::alloc::dealloc(self.ptr, layout) }
    }
}

/// The data extents of `file` within `[0, limit)` (`SEEK_DATA`/`SEEK_HOLE`).
pub fn data_extents(file: &File, limit: u64) -> io::Result<Vec<Range<u64>>> {
    let fd = file.as_raw_fd();
    let mut out = Vec::new();
    let mut at = 0u64;
    while at < limit {
        // SAFETY: lseek on an fd this function borrows; no memory is involved.
        let start = unsafe { libc::lseek(fd, at as libc::off_t, libc::SEEK_DATA) };
        if start < 0 {
            let e = io::Error::last_os_error();
            if e.raw_os_error() == Some(libc::ENXIO) {
                break;
            }
            return Err(e);
        }
        let start = start as u64;
        if start >= limit {
            break;
        }
        // SAFETY: as above.
        let end = unsafe { libc::lseek(fd, start as libc::off_t, libc::SEEK_HOLE) };
        if end < 0 {
            return Err(io::Error::last_os_error());
        }
        let end = (end as u64).min(limit);
        out.push(start..end);
        at = end;
    }
    Ok(out)
}

/// Hashes `len` zero bytes into `h` without a buffer the size of `len`.
pub(crate) fn hash_zeros(h: &mut Xxh3, mut len: u64) {
    static ZEROS: [u8; 64 << 10] = [0; 64 << 10];
    while len > 0 {
        let n = len.min(ZEROS.len() as u64) as usize;
        h.update(&ZEROS[..n]);
        len -= n as u64;
    }
}

pub(crate) fn hex(v: u64) -> String {
    format!("{v:016x}")
}

/// Data extents closer than this are read as one range: reading a short tmpfs hole
/// costs less than another system call, and its zero pages are not written anyway.
const READ_GAP: u64 = 256 << 10;

/// The ranges to read: data extents, those separated by small holes merged.
pub(crate) fn read_ranges(file: &File, limit: u64) -> io::Result<Vec<Range<u64>>> {
    let mut out: Vec<Range<u64>> = Vec::new();
    for e in data_extents(file, limit)? {
        match out.last_mut() {
            Some(last) if e.start - last.end <= READ_GAP => last.end = e.end,
            _ => out.push(e),
        }
    }
    Ok(out)
}

/// xxh3-64 of each `chunk`-sized piece of a `size`-byte logical file fed in
/// ascending offsets, whatever is not fed counting as zeros. Whole zero chunks cost
/// one hash, computed once.
pub(crate) struct ChunkHasher {
    chunk: u64,
    size: u64,
    /// Logical bytes hashed so far.
    at: u64,
    h: Xxh3,
    sums: Vec<u64>,
    zero_chunk: Option<u64>,
}

impl ChunkHasher {
    pub(crate) fn new(size: u64, chunk: u64) -> ChunkHasher {
        ChunkHasher {
            chunk,
            size,
            at: 0,
            h: Xxh3::new(),
            sums: Vec::with_capacity(size.div_ceil(chunk) as usize),
            zero_chunk: None,
        }
    }

    fn chunk_end(&self) -> u64 {
        ((self.at / self.chunk + 1) * self.chunk).min(self.size)
    }

    /// `n` more bytes were hashed, not past the end of the current chunk.
    fn advance(&mut self, n: u64) {
        let end = self.chunk_end();
        self.at += n;
        if self.at == end {
            self.sums.push(self.h.digest());
            self.h.reset();
        }
    }

    /// Zeros from where the hash is up to `end`.
    fn zeros_to(&mut self, end: u64) {
        while self.at < end {
            let cend = self.chunk_end();
            if self.at.is_multiple_of(self.chunk) && end >= cend && cend - self.at == self.chunk {
                let chunk = self.chunk;
                let z = *self.zero_chunk.get_or_insert_with(|| {
                    let mut h = Xxh3::new();
                    hash_zeros(&mut h, chunk);
                    h.digest()
                });
                self.sums.push(z);
                self.at = cend;
                continue;
            }
            let n = end.min(cend) - self.at;
            hash_zeros(&mut self.h, n);
            self.advance(n);
        }
    }

    /// `data` is the content at `at` (not before what was fed already).
    pub(crate) fn data(&mut self, at: u64, mut data: &[u8]) {
        debug_assert!(at >= self.at && at + data.len() as u64 <= self.size);
        self.zeros_to(at);
        while !data.is_empty() {
            let n = (data.len() as u64).min(self.chunk_end() - self.at) as usize;
            self.h.update(&data[..n]);
            data = &data[n..];
            self.advance(n as u64);
        }
    }

    /// The checksums of every chunk.
    pub(crate) fn finish(mut self) -> Vec<u64> {
        self.zeros_to(self.size);
        self.sums
    }
}

/// A new file for writing, private to its owner (guest memory and disks).
fn create_new(path: &Path) -> Result<File, ImageError> {
    OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path)
        .map_err(|e| ImageError::Write(path.to_path_buf(), e))
}

/// One slice read from the RAM file, on its way to the writer.
struct Slice {
    buf: Aligned,
    len: usize,
    at: u64,
}

/// Buffers in flight between the reader and the writer: one being read and hashed,
/// one being written, one spare.
const BUFFERS: usize = 3;

/// Copies `size` bytes of guest RAM from `src` to a new `dst` (replaced if it
/// exists); returns the block's checksums and data bytes (`id` and `file` empty,
/// for the caller to fill in). `progress(done, total)` follows the bytes covered.
///
/// This thread reads the data extents in slices of 8 MiB while a second one hashes
/// the previous slice and writes its non-zero pages (with `O_DIRECT` where the file
/// system takes it): the copy out of tmpfs and the hash, the two costs, run on two
/// cores, and nothing of the guest's RAM stays dirty in the page cache. One
/// `fdatasync` at the end.
pub fn copy_ram_image(
    src: &Path,
    dst: &Path,
    size: u64,
    chunk_bytes: u64,
    progress: &mut dyn FnMut(u64, u64),
) -> Result<RamBlock, ImageError> {
    copy_ram(src, dst, size, chunk_bytes, false, progress).map(|(b, _)| b)
}

/// [`copy_ram_image`], with the xxh3-64 of every 4 KiB page too (hashed as the
/// copy goes; a zero page's sum is computed once).
pub fn copy_ram_image_with_pages(
    src: &Path,
    dst: &Path,
    size: u64,
    chunk_bytes: u64,
    progress: &mut dyn FnMut(u64, u64),
) -> Result<(RamBlock, Vec<u64>), ImageError> {
    copy_ram(src, dst, size, chunk_bytes, true, progress).map(|(b, p)| (b, p.unwrap_or_default()))
}

fn copy_ram(
    src: &Path,
    dst: &Path,
    size: u64,
    chunk_bytes: u64,
    pages: bool,
    progress: &mut dyn FnMut(u64, u64),
) -> Result<(RamBlock, Option<Vec<u64>>), ImageError> {
    if !chunk_bytes.is_power_of_two() || !(PAGE_SIZE..=1 << 30).contains(&chunk_bytes) {
        return Err(ImageError::Chunk(chunk_bytes));
    }
    let rerr = |e| ImageError::Read(src.to_path_buf(), e);
    let werr = |e| ImageError::Write(dst.to_path_buf(), e);
    let input = crate::open_nofollow(src).map_err(rerr)?;
    let have = input.metadata().map_err(rerr)?.len();
    if have < size {
        return Err(ImageError::Short(src.to_path_buf(), have, size));
    }
    let _ = std::fs::remove_file(dst);
    let out = create_new(dst)?;
    out.set_len(size).map_err(werr)?;
    // tmpfs and some others refuse O_DIRECT at open: buffered writes then.
    let direct = OpenOptions::new()
        .write(true)
        .custom_flags(libc::O_DIRECT)
        .open(dst)
        .ok();
    let ranges = read_ranges(&input, size).map_err(rerr)?;
    let mut hasher = ChunkHasher::new(size, chunk_bytes);
    let mut page_hasher = pages.then(|| ChunkHasher::new(size, PAGE_SIZE));
    let (to_writer, slices) = std::sync::mpsc::sync_channel::<Slice>(BUFFERS);
    let (to_reader, free) = std::sync::mpsc::channel::<Aligned>();
    for _ in 0..BUFFERS {
        to_reader.send(Aligned::new(BUF)).expect("receiver alive");
    }
    let (data_bytes, hasher, page_hasher) = std::thread::scope(|s| {
        let writer = s.spawn(
            move || -> io::Result<(u64, ChunkHasher, Option<ChunkHasher>)> {
                let mut direct = direct;
                let mut data = 0;
                for mut sl in slices {
                    let b = &sl.buf.as_mut()[..sl.len];
                    hasher.data(sl.at, b);
                    if let Some(p) = page_hasher.as_mut() {
                        p.data(sl.at, b);
                    }
                    data += write_nonzero(&out, &mut direct, b, sl.at)?;
                    // The reader may be gone after an error of its own.
                    let _ = to_reader.send(sl.buf);
                }
                out.sync_data()?;
                Ok((data, hasher, page_hasher))
            },
        );
        let read = (|| {
            for r in &ranges {
                let mut at = r.start;
                while at < r.end {
                    // Only fails when the writer stopped: its error is the one to report.
                    let Ok(mut buf) = free.recv() else {
                        return Ok(());
                    };
                    let len = (r.end - at).min(BUF as u64) as usize;
                    input
                        .read_exact_at(&mut buf.as_mut()[..len], at)
                        .map_err(rerr)?;
                    if to_writer.send(Slice { buf, len, at }).is_err() {
                        return Ok(());
                    }
                    at += len as u64;
                    progress(at, size);
                }
            }
            Ok(())
        })();
        drop(to_writer);
        let written = writer.join().expect("the image writer does not panic");
        read?;
        written.map_err(werr)
    })?;
    progress(size, size);
    let block = RamBlock {
        id: String::new(),
        size,
        file: String::new(),
        chunk_bytes,
        checksums: hasher.finish().into_iter().map(hex).collect(),
        data_bytes,
        page_sums: None,
    };
    Ok((block, page_hasher.map(ChunkHasher::finish)))
}

pub(crate) fn is_zero(p: &[u8]) -> bool {
    let (pre, mid, post) = {
        // SAFETY: u64 has no invalid bit patterns; align_to splits the slice at
        // alignment boundaries and keeps every byte in exactly one part.
        unsafe { p.align_to::<u64>() }
    };
    pre.iter().all(|&b| b == 0) && mid.iter().all(|&w| w == 0) && post.iter().all(|&b| b == 0)
}

/// Writes the runs of non-zero pages of `b` (file offset `at`, page-aligned, as is
/// `b`); zero pages stay holes. Returns the bytes written.
fn write_nonzero(out: &File, direct: &mut Option<File>, b: &[u8], at: u64) -> io::Result<u64> {
    let page = PAGE_SIZE as usize;
    let mut written = 0;
    let mut pages = b.chunks(page).enumerate().peekable();
    while let Some((first, p)) = pages.next() {
        if is_zero(p) {
            continue;
        }
        let mut end = first + 1;
        while pages.next_if(|(_, p)| !is_zero(p)).is_some() {
            end += 1;
        }
        let run = &b[first * page..(end * page).min(b.len())];
        let off = at + (first * page) as u64;
        written += run.len() as u64;
        if let Some(d) = direct.as_ref().filter(|_| run.len().is_multiple_of(page)) {
            match d.write_all_at(run, off) {
                Ok(()) => continue,
                // This file system does not take O_DIRECT writes: the page cache from now on.
                Err(e) if e.raw_os_error() == Some(libc::EINVAL) => *direct = None,
                Err(e) => return Err(e),
            }
        }
        out.write_all_at(run, off)?;
    }
    Ok(written)
}

/// A file's size and xxh3-64 checksum.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FileHash {
    pub size: u64,
    pub checksum: String,
}

/// Reads a file's data in slices, handing each to `sink`, and hashes the whole
/// content (holes as zeros, never read from the disk).
fn stream_file(
    path: &Path,
    mut sink: impl FnMut(u64, &[u8]) -> Result<(), ImageError>,
) -> Result<FileHash, ImageError> {
    let rerr = |e| ImageError::Read(path.to_path_buf(), e);
    let f = File::open(path).map_err(rerr)?;
    let size = f.metadata().map_err(rerr)?.len();
    let mut h = Xxh3::new();
    let mut buf = vec![0u8; BUF];
    let mut at = 0;
    for e in data_extents(&f, size).map_err(rerr)? {
        hash_zeros(&mut h, e.start - at);
        let mut p = e.start;
        while p < e.end {
            let n = ((e.end - p) as usize).min(BUF);
            f.read_exact_at(&mut buf[..n], p).map_err(rerr)?;
            h.update(&buf[..n]);
            sink(p, &buf[..n])?;
            p += n as u64;
        }
        at = e.end;
    }
    hash_zeros(&mut h, size - at);
    Ok(FileHash {
        size,
        checksum: hex(h.digest()),
    })
}

/// Hashes a whole file (holes read as zeros, never read from disk).
pub fn hash_file(path: &Path) -> Result<FileHash, ImageError> {
    stream_file(path, |_, _| Ok(()))
}

/// Copies a file sparsely (its holes stay holes) and durably to a new `dst`;
/// returns the copy's size and checksum.
pub fn copy_file(src: &Path, dst: &Path) -> Result<FileHash, ImageError> {
    let werr = |e| ImageError::Write(dst.to_path_buf(), e);
    let out = create_new(dst)?;
    let h = stream_file(src, |at, b| out.write_all_at(b, at).map_err(werr))?;
    out.set_len(h.size).map_err(werr)?;
    out.sync_data().map_err(werr)?;
    Ok(h)
}

/// Makes the next read of `path` come from the disk: its dirty pages are written,
/// then the kernel is told to drop its cached ones.
pub fn drop_page_cache(path: &Path) -> Result<(), ImageError> {
    let rerr = |e| ImageError::Read(path.to_path_buf(), e);
    let f = File::open(path).map_err(rerr)?;
    f.sync_data().map_err(rerr)?;
    // SAFETY: posix_fadvise on an fd borrowed for the call; no memory is involved.
    let r = unsafe { libc::posix_fadvise(f.as_raw_fd(), 0, 0, libc::POSIX_FADV_DONTNEED) };
    if r != 0 {
        return Err(rerr(io::Error::from_raw_os_error(r)));
    }
    Ok(())
}

/// Bytes of `path` in the page cache now.
pub fn cached_bytes(path: &Path) -> Result<u64, ImageError> {
    Ok(resident_pages(path)?.iter().filter(|b| **b).count() as u64 * crate::PAGE_SIZE)
}

/// Which pages of `path` are in the page cache now (`mincore` over a mapping that is
/// never touched, so nothing is read in by asking).
pub fn resident_pages(path: &Path) -> Result<Vec<bool>, ImageError> {
    let rerr = |e| ImageError::Read(path.to_path_buf(), e);
    let f = File::open(path).map_err(rerr)?;
    let len = f.metadata().map_err(rerr)?.len() as usize;
    if len == 0 {
        return Ok(Vec::new());
    }
    // SAFETY: a new read-only shared mapping of a file we hold open, of its length;
    // only mincore looks at it (nothing is accessed) and it is unmapped below.
    let p = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            len,
            libc::PROT_READ,
            libc::MAP_SHARED,
            f.as_raw_fd(),
            0,
        )
    };
    if p == libc::MAP_FAILED {
        return Err(rerr(io::Error::last_os_error()));
    }
    let page = crate::PAGE_SIZE as usize;
    let mut v = vec![0u8; len.div_ceil(page)];
    // SAFETY: `p` maps `len` bytes (above); `v` has one byte per page of them.
    let r = unsafe { libc::mincore(p, len, v.as_mut_ptr()) };
    let err = io::Error::last_os_error();
    // SAFETY: unmaps exactly the mapping made above, which nothing else refers to.
    unsafe { libc::munmap(p, len) };
    if r != 0 {
        return Err(rerr(err));
    }
    Ok(v.into_iter().map(|b| b & 1 != 0).collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chunk_hashes_match_the_content_however_it_is_fed() {
        // 2.5 chunks of 64 KiB: data across the first boundary, a whole zero chunk,
        // a short last chunk with data at its end.
        let (chunk, size) = (64u64 << 10, 160u64 << 10);
        let mut content = vec![0u8; size as usize];
        for (i, b) in content[60 << 10..70 << 10].iter_mut().enumerate() {
            *b = (i % 7) as u8 + 1;
        }
        content[size as usize - 1] = 9;
        let want: Vec<u64> = content
            .chunks(chunk as usize)
            .map(xxhash_rust::xxh3::xxh3_64)
            .collect();
        let mut h = ChunkHasher::new(size, chunk);
        h.data(60 << 10, &content[60 << 10..70 << 10]);
        h.data(size - 4096, &content[size as usize - 4096..]);
        assert_eq!(h.finish(), want);
        // Everything fed, in uneven pieces.
        let mut h = ChunkHasher::new(size, chunk);
        let mut at = 0;
        for piece in content.chunks(3000) {
            h.data(at, piece);
            at += piece.len() as u64;
        }
        assert_eq!(h.finish(), want);
        // Nothing fed: all zeros.
        let zeros: Vec<u64> = vec![0u8; size as usize]
            .chunks(chunk as usize)
            .map(xxhash_rust::xxh3::xxh3_64)
            .collect();
        assert_eq!(ChunkHasher::new(size, chunk).finish(), zeros);
    }

    #[test]
    fn a_sparse_ram_file_copies_with_holes_and_checksums_of_its_content() {
        let d = tempfile::tempdir().unwrap();
        let src = d.path().join("ram");
        let size = 3 << 20;
        let f = File::create(&src).unwrap();
        f.set_len(size).unwrap();
        // Data at 0..8K (one zero page inside an extent), and at 2 MiB.
        let mut page = vec![0u8; 4096];
        page[7] = 1;
        f.write_all_at(&page, 0).unwrap();
        f.write_all_at(&vec![0u8; 4096], 4096).unwrap();
        page[9] = 2;
        f.write_all_at(&page, 2 << 20).unwrap();
        drop(f);
        let dst = d.path().join("img");
        let mut seen = 0;
        let b = copy_ram_image(&src, &dst, size, 1 << 20, &mut |done, total| {
            assert!(done <= total);
            seen = done;
        })
        .unwrap();
        assert_eq!(seen, size);
        assert_eq!(b.checksums.len(), 3);
        assert_eq!(b.data_bytes, 2 * 4096);
        assert_eq!(std::fs::read(&src).unwrap(), std::fs::read(&dst).unwrap());
        // The zero chunk's checksum is that of 1 MiB of zeros.
        assert_eq!(
            b.checksums[1],
            hex(xxhash_rust::xxh3::xxh3_64(&vec![0u8; 1 << 20]))
        );
        let mut h = Xxh3::new();
        h.update(&std::fs::read(&src).unwrap()[..1 << 20]);
        assert_eq!(b.checksums[0], hex(h.digest()));
        // Only the two data pages take room.
        use std::os::unix::fs::MetadataExt;
        assert!(std::fs::metadata(&dst).unwrap().blocks() * 512 <= 64 << 10);
        // Whole-file hashes agree with the content.
        let fh = hash_file(&dst).unwrap();
        assert_eq!(
            fh.checksum,
            hex(xxhash_rust::xxh3::xxh3_64(&std::fs::read(&src).unwrap()))
        );
        let c = copy_file(&dst, &d.path().join("copy")).unwrap();
        assert_eq!(c, fh);
        assert!(matches!(
            copy_ram_image(
                &src,
                &d.path().join("x"),
                size + 4096,
                1 << 20,
                &mut |_, _| {}
            ),
            Err(ImageError::Short(..))
        ));
        assert!(matches!(
            copy_ram_image(&src, &d.path().join("y"), size, 3000, &mut |_, _| {}),
            Err(ImageError::Chunk(3000))
        ));
        drop_page_cache(&dst).unwrap();
    }
}
