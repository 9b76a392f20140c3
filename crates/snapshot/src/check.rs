//! Checking a RAM image against its manifest's chunk checksums while a restore runs
//! from it, and choosing how (a snapshot is a file from elsewhere: `docs/security.md`).
//!
//! A lazy restore maps the image private: the host kernel, not Rebound, hands the
//! guest each page from the page cache on its first touch, so on this path no page
//! can be checked *between* the disk and the guest. What can be done:
//! - `Full`: every chunk is read and checked before the guest's first instruction
//!   (the reads also warm the page cache; the restore loses its head start);
//! - `Background`: chunks are checked from the page cache once all their data is
//!   there (the loader's reads, or in a lazy restore the guest's own faults and
//!   their readahead), so the check adds no disk reads to what the restore reads
//!   anyway; a chunk nothing loads is read by the checker. A mismatch stops the
//!   guest, which may already have read the damaged page;
//! - `Off`: nothing is checked, and the restore says so.
//!
//! [`decide`] picks one from what was asked and how far the snapshot is to be
//! trusted ([`Trust`]): a snapshot this daemon wrote into a directory only its user
//! can change is checked in the background, any other one in full before the start,
//! and one that another user can still write is not mapped at all (restored by a
//! checked copy instead), since it could change after any check.

use std::fs::File;
use std::io;
use std::ops::Range;
use std::os::unix::fs::{FileExt, MetadataExt};
use std::os::unix::io::AsRawFd;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};

use xxhash_rust::xxh3::Xxh3;

use crate::image::hash_zeros;
use crate::PAGE_SIZE;

/// Errors checking an image.
#[derive(Debug, thiserror::Error)]
pub enum CheckError {
    #[error("cannot read {0}")]
    Read(PathBuf, #[source] io::Error),
    #[error("{file}: checksum mismatch in chunk {chunk} (bytes {start}..{end}): the snapshot's RAM image is damaged")]
    Mismatch {
        file: PathBuf,
        chunk: u64,
        start: u64,
        end: u64,
    },
    #[error("{0}: {1} checksums for {2} chunks of {3} bytes")]
    Count(PathBuf, usize, u64, u64),
    #[error("{0}: checksum {1:?} is not 16 hex digits")]
    Digits(PathBuf, String),
}

/// How a restore checks the RAM image it runs from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RamCheck {
    Full,
    Background,
    Off,
}

/// How far a snapshot's files can be trusted not to change or lie.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Trust {
    /// Written by this daemon (its catalog lists it), and only its user (or root)
    /// can change the directory and the image.
    Own,
    /// Only the daemon's user (or root) can change it, but this daemon did not
    /// write it: copied from another host, from a backup, by hand.
    Stable,
    /// Another user can write the image or replace it in its directory.
    Mutable,
}

/// What a restore does about its RAM image.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Decision {
    pub check: RamCheck,
    /// Copy the image (checked as it is copied) instead of mapping it.
    pub copy_instead: bool,
    /// What the restore's report says about it, if anything.
    pub note: Option<String>,
}

/// The check for a restore that maps the image (`maps`: lazy, working-set,
/// elastic) or copies it (eager, checked as copied), given what was asked (`None`:
/// the default) and the snapshot's trust.
pub fn decide(asked: Option<RamCheck>, trust: Trust, maps: bool) -> Decision {
    let d = |check, copy_instead, note: Option<&str>| Decision {
        check,
        copy_instead,
        note: note.map(str::to_string),
    };
    if !maps {
        return d(RamCheck::Full, false, None);
    }
    match (asked, trust) {
        (Some(RamCheck::Off), _) => d(
            RamCheck::Off,
            false,
            Some("RAM unchecked (--ram-check off): the guest runs on the image's bytes as they are"),
        ),
        (_, Trust::Mutable) => d(
            RamCheck::Full,
            true,
            Some("the RAM image or its directory can be written by a user other than the daemon's, so it could change after any check: restored by a checked copy instead of mapping it"),
        ),
        (Some(RamCheck::Full), _) => d(RamCheck::Full, false, None),
        (Some(RamCheck::Background), _) => d(
            RamCheck::Background,
            false,
            Some("RAM checked in the background (--ram-check background): the guest may read a page before its chunk is checked; a damaged chunk stops it"),
        ),
        (None, Trust::Own) => d(
            RamCheck::Background,
            false,
            Some("RAM checked in the background (the snapshot is this daemon's own): the guest may read a page before its chunk is checked; a damaged chunk stops it"),
        ),
        (None, Trust::Stable) => d(
            RamCheck::Full,
            false,
            Some("the snapshot is not one this daemon wrote: every RAM chunk was checked before the guest ran (--ram-check background skips the wait)"),
        ),
    }
}

/// The trust of a snapshot directory and its RAM image: `Mutable` unless both are
/// owned by this process's user or root and writable by their owner alone;
/// `listed`: the daemon's catalog names the directory.
pub fn trust(dir: &Path, image: &Path, listed: bool) -> io::Result<Trust> {
    // SAFETY: geteuid has no preconditions and cannot fail.
    let me = unsafe { libc::geteuid() };
    // The directory as its path resolves (a link to it is how some keep snapshots);
    // the image itself, never a link (opening it refuses links anyway).
    for m in [std::fs::metadata(dir)?, std::fs::symlink_metadata(image)?] {
        if (m.uid() != me && m.uid() != 0) || m.mode() & 0o022 != 0 {
            return Ok(Trust::Mutable);
        }
    }
    Ok(if listed { Trust::Own } else { Trust::Stable })
}

/// Bytes read at a time: small, so that a guest's fault on the same disk waits
/// behind at most one such read.
const PIECE: usize = 256 << 10;

/// Checks chunks of one RAM image.
pub struct ChunkChecker {
    path: PathBuf,
    file: File,
    size: u64,
    chunk: u64,
    sums: Vec<u64>,
    checked: Vec<bool>,
    count: u64,
    /// Each chunk's data, in whole pages (a page's hole part reads as zeros), found
    /// once: the image does not change under a restore (the image stamp sees to it).
    data: Vec<Vec<Range<u64>>>,
    buf: Vec<u8>,
    zero_chunk: Option<u64>,
}

impl ChunkChecker {
    /// Opens `path` (`size` bytes, checksums `sums` of `chunk`-byte pieces, as the
    /// manifest records them).
    pub fn new(
        path: &Path,
        size: u64,
        chunk: u64,
        sums: &[String],
    ) -> Result<ChunkChecker, CheckError> {
        let rerr = |e| CheckError::Read(path.to_path_buf(), e);
        let chunks = size.div_ceil(chunk.max(1));
        if sums.len() as u64 != chunks || !chunk.is_multiple_of(PAGE_SIZE) || chunk == 0 {
            return Err(CheckError::Count(
                path.to_path_buf(),
                sums.len(),
                chunks,
                chunk,
            ));
        }
        let sums = sums
            .iter()
            .map(|s| match u64::from_str_radix(s, 16) {
                Ok(v) if s.len() == 16 => Ok(v),
                _ => Err(CheckError::Digits(path.to_path_buf(), s.clone())),
            })
            .collect::<Result<Vec<u64>, _>>()?;
        let file = crate::open_nofollow(path).map_err(rerr)?;
        // Exactly the pages asked for: readahead would read what nobody asked for.
        // SAFETY: posix_fadvise on an fd this checker owns; no memory is involved.
        unsafe { libc::posix_fadvise(file.as_raw_fd(), 0, 0, libc::POSIX_FADV_RANDOM) };
        let mut data = vec![Vec::new(); chunks as usize];
        for e in crate::image::data_extents(&file, size).map_err(rerr)? {
            let mut at = e.start / PAGE_SIZE * PAGE_SIZE;
            let end = e.end.div_ceil(PAGE_SIZE) * PAGE_SIZE;
            while at < end {
                let i = at / chunk;
                let cut = ((i + 1) * chunk).min(end);
                let runs: &mut Vec<Range<u64>> = &mut data[i as usize];
                match runs.last_mut() {
                    // Extents rounded out to pages may touch or overlap.
                    Some(r) if r.end >= at => r.end = r.end.max(cut),
                    _ => runs.push(at..cut),
                }
                at = cut;
            }
        }
        Ok(ChunkChecker {
            path: path.to_path_buf(),
            file,
            size,
            chunk,
            sums,
            checked: vec![false; chunks as usize],
            count: 0,
            data,
            buf: vec![0; PIECE],
            zero_chunk: None,
        })
    }

    pub fn chunks(&self) -> u64 {
        self.sums.len() as u64
    }

    pub fn chunk_bytes(&self) -> u64 {
        self.chunk
    }

    /// Chunks checked so far.
    pub fn checked(&self) -> u64 {
        self.count
    }

    pub fn is_checked(&self, i: u64) -> bool {
        self.checked[i as usize]
    }

    /// Reads chunk `i` (its holes as zeros, never read) and checks it; checking a
    /// chunk again reads nothing.
    pub fn check(&mut self, i: u64) -> Result<(), CheckError> {
        if self.checked[i as usize] {
            return Ok(());
        }
        let start = i * self.chunk;
        let end = (start + self.chunk).min(self.size);
        let sum = if self.data[i as usize].is_empty() {
            let len = self.chunk;
            let full = end - start == len;
            match self.zero_chunk {
                Some(z) if full => z,
                _ => {
                    let mut h = Xxh3::new();
                    hash_zeros(&mut h, end - start);
                    let z = h.digest();
                    if full {
                        self.zero_chunk = Some(z);
                    }
                    z
                }
            }
        } else {
            let mut h = Xxh3::new();
            let mut at = start;
            for r in &self.data[i as usize] {
                let (s, t) = (r.start, r.end);
                hash_zeros(&mut h, s - at);
                let mut p = s;
                while p < t {
                    let n = ((t - p) as usize).min(PIECE);
                    self.file
                        .read_exact_at(&mut self.buf[..n], p)
                        .map_err(|e| CheckError::Read(self.path.clone(), e))?;
                    h.update(&self.buf[..n]);
                    p += n as u64;
                }
                at = t;
            }
            hash_zeros(&mut h, end - at);
            h.digest()
        };
        if sum != self.sums[i as usize] {
            return Err(CheckError::Mismatch {
                file: self.path.clone(),
                chunk: i,
                start,
                end,
            });
        }
        self.checked[i as usize] = true;
        self.count += 1;
        Ok(())
    }

    /// Checks the chunks not checked yet whose data pages are all in the page cache
    /// now (`resident`, one flag per page of the image, as `mincore` gives them):
    /// hashing them reads nothing from the disk. Returns how many it checked.
    pub fn check_resident(&mut self, resident: &[bool]) -> Result<u64, CheckError> {
        let before = self.count;
        for i in 0..self.chunks() {
            if self.checked[i as usize] {
                continue;
            }
            let cached = self.data[i as usize].iter().all(|r| {
                (r.start / PAGE_SIZE..r.end / PAGE_SIZE)
                    .all(|p| resident.get(p as usize).copied().unwrap_or(false))
            });
            if cached {
                self.check(i)?;
            }
        }
        Ok(self.count - before)
    }

    /// The first chunk not checked yet.
    pub fn next_unchecked(&self) -> Option<u64> {
        self.checked.iter().position(|c| !c).map(|i| i as u64)
    }

    /// Checks every chunk not checked yet, in file order, until `stop` is set;
    /// `between(done, total)` runs after each chunk (progress, giving way).
    pub fn check_all(
        &mut self,
        stop: &AtomicBool,
        between: &mut dyn FnMut(u64, u64),
    ) -> Result<(), CheckError> {
        for i in 0..self.chunks() {
            if stop.load(Ordering::Relaxed) {
                return Ok(());
            }
            self.check(i)?;
            between(self.count, self.chunks());
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A 4-chunk image of 64 KiB chunks: data, a hole, data with a hole inside, data.
    fn image(dir: &Path) -> (PathBuf, Vec<String>) {
        let p = dir.join("ram");
        let f = File::create(&p).unwrap();
        f.set_len(256 << 10).unwrap();
        let fill = |at: u64, len: usize, b: u8| f.write_all_at(&vec![b; len], at).unwrap();
        fill(0, 64 << 10, 1);
        fill(128 << 10, 4096, 2);
        fill(128 << 10 | 32 << 10, 4096, 3);
        fill(192 << 10, 64 << 10, 4);
        let data = std::fs::read(&p).unwrap();
        let sums = data
            .chunks(64 << 10)
            .map(|c| crate::image::hex(xxhash_rust::xxh3::xxh3_64(c)))
            .collect();
        (p, sums)
    }

    #[test]
    fn every_chunk_of_a_sound_image_checks() {
        let d = tempfile::tempdir().unwrap();
        let (p, sums) = image(d.path());
        let mut c = ChunkChecker::new(&p, 256 << 10, 64 << 10, &sums).unwrap();
        c.check_all(&AtomicBool::new(false), &mut |_, _| {})
            .unwrap();
        assert_eq!((c.checked(), c.chunks()), (4, 4));
    }

    #[test]
    fn a_flipped_byte_names_its_chunk_and_a_punched_hole_too() {
        let d = tempfile::tempdir().unwrap();
        let (p, sums) = image(d.path());
        let f = std::fs::OpenOptions::new().write(true).open(&p).unwrap();
        f.write_all_at(&[9], (192 << 10) + 77).unwrap();
        let mut c = ChunkChecker::new(&p, 256 << 10, 64 << 10, &sums).unwrap();
        c.check(0).unwrap();
        let e = c.check(3).unwrap_err().to_string();
        assert!(
            e.contains("checksum mismatch in chunk 3 (bytes 196608..262144)"),
            "{e}"
        );
        assert!(!c.is_checked(3));
        // A hole where data was: chunk 0's bytes now read as zeros.
        // SAFETY: fallocate on a file this test owns; no memory is involved.
        let r = unsafe {
            libc::fallocate(
                std::os::unix::io::AsRawFd::as_raw_fd(&f),
                libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE,
                0,
                64 << 10,
            )
        };
        assert_eq!(r, 0);
        let mut c = ChunkChecker::new(&p, 256 << 10, 64 << 10, &sums).unwrap();
        let e = c
            .check_all(&AtomicBool::new(false), &mut |_, _| {})
            .unwrap_err();
        assert!(e.to_string().contains("chunk 0 "), "{e}");
    }

    #[test]
    fn chunks_whose_data_is_cached_check_without_waiting_for_the_rest() {
        let d = tempfile::tempdir().unwrap();
        let (p, sums) = image(d.path());
        let mut c = ChunkChecker::new(&p, 256 << 10, 64 << 10, &sums).unwrap();
        // Pages 0..16 (chunk 0), the hole of chunk 1 and the two data pages of chunk 2
        // cached; chunk 3 only in part.
        let mut resident = vec![false; 64];
        resident[..16].fill(true);
        resident[32] = true;
        resident[40] = true;
        resident[48..50].fill(true);
        assert_eq!(c.check_resident(&resident).unwrap(), 3);
        assert_eq!(c.next_unchecked(), Some(3));
        resident[48..].fill(true);
        assert_eq!(c.check_resident(&resident).unwrap(), 1);
        assert_eq!(c.next_unchecked(), None);
    }

    #[test]
    fn checksums_that_do_not_fit_the_image_are_refused() {
        let d = tempfile::tempdir().unwrap();
        let (p, sums) = image(d.path());
        let e = |r: Result<ChunkChecker, CheckError>| r.err().unwrap().to_string();
        assert!(e(ChunkChecker::new(&p, 256 << 10, 64 << 10, &sums[..3]))
            .contains("3 checksums for 4 chunks"));
        assert!(e(ChunkChecker::new(&p, 256 << 10, 0, &sums)).contains("checksums for"));
        let mut bad = sums.clone();
        bad[1] = "xyz".into();
        assert!(e(ChunkChecker::new(&p, 256 << 10, 64 << 10, &bad))
            .contains("\"xyz\" is not 16 hex digits"));
    }

    #[test]
    fn the_default_checks_own_snapshots_in_the_background_and_others_in_full() {
        use RamCheck::*;
        let c = |asked, trust, maps| {
            let d = decide(asked, trust, maps);
            (d.check, d.copy_instead)
        };
        assert_eq!(c(None, Trust::Own, true), (Background, false));
        assert_eq!(c(None, Trust::Stable, true), (Full, false));
        assert_eq!(c(None, Trust::Mutable, true), (Full, true));
        assert_eq!(
            c(Some(Background), Trust::Stable, true),
            (Background, false)
        );
        assert_eq!(c(Some(Full), Trust::Own, true), (Full, false));
        assert_eq!(c(Some(Background), Trust::Mutable, true), (Full, true));
        assert_eq!(c(Some(Off), Trust::Mutable, true), (Off, false));
        // A copy is checked as it is made, whatever was asked.
        assert_eq!(c(Some(Off), Trust::Mutable, false), (Full, false));
        assert!(decide(Some(Off), Trust::Own, true)
            .note
            .unwrap()
            .contains("unchecked"));
    }

    #[test]
    fn only_files_nobody_else_can_write_are_trusted() {
        use std::os::unix::fs::PermissionsExt;
        let d = tempfile::tempdir().unwrap();
        let (p, _) = image(d.path());
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o600)).unwrap();
        std::fs::set_permissions(d.path(), std::fs::Permissions::from_mode(0o700)).unwrap();
        assert_eq!(trust(d.path(), &p, true).unwrap(), Trust::Own);
        assert_eq!(trust(d.path(), &p, false).unwrap(), Trust::Stable);
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o620)).unwrap();
        assert_eq!(trust(d.path(), &p, true).unwrap(), Trust::Mutable);
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o600)).unwrap();
        std::fs::set_permissions(d.path(), std::fs::Permissions::from_mode(0o777)).unwrap();
        assert_eq!(trust(d.path(), &p, true).unwrap(), Trust::Mutable);
    }
}
