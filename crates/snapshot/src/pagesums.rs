//! A RAM image's page checksums (`ram-<id>.pagesums`): the xxh3-64 of every 4 KiB
//! page, holes as zeros, so a page server checks each page it sends, and only it,
//! before the guest can see it.
//!
//! Format, little-endian: magic `RBPGSUMS`, version u32 (1), page size u32 (4096),
//! page count u64, then one u64 per page. The manifest lists the file with its size
//! and whole-file checksum, both checked when it is read back; the count must be the
//! image's page count. The file comes from a snapshot directory: every field is
//! checked before use.

use std::io::{self, Read};
use std::path::{Path, PathBuf};

use xxhash_rust::xxh3::xxh3_64;

use crate::manifest::FileEntry;
use crate::PAGE_SIZE;

pub const MAGIC: &[u8; 8] = b"RBPGSUMS";
pub const VERSION: u32 = 1;
const HEADER: usize = 24;
/// Images past this many pages (64 TiB) are not Rebound's.
const MAX_PAGES: u64 = 1 << 34;

/// Why a page-sum file cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum PageSumsError {
    #[error("cannot read {0}")]
    Read(PathBuf, #[source] io::Error),
    #[error("cannot write {0}")]
    Write(PathBuf, #[source] io::Error),
    #[error("{0} is {1} bytes, the manifest says {2}: truncated or replaced")]
    Size(PathBuf, u64, u64),
    #[error("{0} is not a page-sum file (bad magic)")]
    Magic(PathBuf),
    #[error("{0} is page-sum version {1}; this rebound reads version {VERSION}")]
    Version(PathBuf, u32),
    #[error("{0} is for {1}-byte pages, not {PAGE_SIZE}")]
    PageSize(PathBuf, u32),
    #[error("{0} holds {1} pages, the image has {2}")]
    Count(PathBuf, u64, u64),
    #[error("{0}: checksum mismatch: the snapshot is damaged")]
    Checksum(PathBuf),
}

/// Writes `sums` to a new `path`; returns its manifest entry (`file`: its name).
pub fn write(path: &Path, sums: &[u64]) -> Result<FileEntry, PageSumsError> {
    let mut b = Vec::with_capacity(HEADER + 8 * sums.len());
    b.extend_from_slice(MAGIC);
    b.extend_from_slice(&VERSION.to_le_bytes());
    b.extend_from_slice(&(PAGE_SIZE as u32).to_le_bytes());
    b.extend_from_slice(&(sums.len() as u64).to_le_bytes());
    for s in sums {
        b.extend_from_slice(&s.to_le_bytes());
    }
    let werr = |e| PageSumsError::Write(path.to_path_buf(), e);
    {
        use std::io::Write;
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(path)
            .map_err(werr)?;
        f.write_all(&b).map_err(werr)?;
        f.sync_data().map_err(werr)?;
    }
    Ok(FileEntry {
        file: path
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default(),
        size: b.len() as u64,
        checksum: crate::image::hex(xxh3_64(&b)),
    })
}

/// Reads the page sums of an image of `pages` pages from `path`, as `entry` lists it.
pub fn read(path: &Path, entry: &FileEntry, pages: u64) -> Result<Vec<u64>, PageSumsError> {
    let rerr = |e| PageSumsError::Read(path.to_path_buf(), e);
    let want = HEADER as u64 + 8 * pages.min(MAX_PAGES);
    if entry.size != want {
        return Err(PageSumsError::Size(path.to_path_buf(), entry.size, want));
    }
    let f = crate::open_nofollow(path).map_err(rerr)?;
    let have = f.metadata().map_err(rerr)?.len();
    if have != entry.size {
        return Err(PageSumsError::Size(path.to_path_buf(), have, entry.size));
    }
    let mut b = Vec::with_capacity(want as usize);
    f.take(want + 1).read_to_end(&mut b).map_err(rerr)?;
    if b.len() as u64 != want {
        return Err(PageSumsError::Size(
            path.to_path_buf(),
            b.len() as u64,
            want,
        ));
    }
    if &b[..8] != MAGIC {
        return Err(PageSumsError::Magic(path.to_path_buf()));
    }
    let u32_at = |i: usize| u32::from_le_bytes(b[i..i + 4].try_into().expect("4 bytes"));
    let version = u32_at(8);
    if version != VERSION {
        return Err(PageSumsError::Version(path.to_path_buf(), version));
    }
    if u32_at(12) as u64 != PAGE_SIZE {
        return Err(PageSumsError::PageSize(path.to_path_buf(), u32_at(12)));
    }
    let n = u64::from_le_bytes(b[16..24].try_into().expect("8 bytes"));
    if n != pages {
        return Err(PageSumsError::Count(path.to_path_buf(), n, pages));
    }
    if crate::image::hex(xxh3_64(&b)) != entry.checksum {
        return Err(PageSumsError::Checksum(path.to_path_buf()));
    }
    Ok(b[HEADER..]
        .chunks_exact(8)
        .map(|c| u64::from_le_bytes(c.try_into().expect("8 bytes")))
        .collect())
}

/// The sum of a page of `data` (4 KiB).
pub fn sum(data: &[u8]) -> u64 {
    xxh3_64(data)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn page_sums_round_trip_and_malformed_files_are_refused() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("s");
        let sums: Vec<u64> = (0..10).map(|i| i * 77).collect();
        let e = write(&p, &sums).unwrap();
        assert_eq!(read(&p, &e, 10).unwrap(), sums);
        // The image's page count must match.
        assert!(matches!(read(&p, &e, 11), Err(PageSumsError::Size(..))));
        let good = std::fs::read(&p).unwrap();
        let bad = |f: &dyn Fn(&mut Vec<u8>)| {
            let q = d.path().join("bad");
            let _ = std::fs::remove_file(&q);
            let mut b = good.clone();
            f(&mut b);
            std::fs::write(&q, &b).unwrap();
            // The manifest entry as if it had been written for these bytes, so each
            // field's own check is what refuses it.
            let e = FileEntry {
                file: "bad".into(),
                size: b.len() as u64,
                checksum: crate::image::hex(xxh3_64(&b)),
            };
            read(&q, &e, 10).unwrap_err()
        };
        assert!(matches!(bad(&|b| b.truncate(100)), PageSumsError::Size(..)));
        assert!(matches!(bad(&|b| b[0] = b'X'), PageSumsError::Magic(_)));
        assert!(matches!(bad(&|b| b[8] = 9), PageSumsError::Version(_, 9)));
        assert!(matches!(bad(&|b| b[12] = 1), PageSumsError::PageSize(..)));
        assert!(matches!(
            bad(&|b| b[16] = 200),
            PageSumsError::Count(_, 200, 10)
        ));
        // Right shape, wrong bytes: the manifest's checksum catches it.
        let q = d.path().join("flipped");
        let mut b = good.clone();
        b[30] ^= 1;
        std::fs::write(&q, &b).unwrap();
        assert!(matches!(read(&q, &e, 10), Err(PageSumsError::Checksum(_))));
        // Oversized: the size the manifest names is checked before anything is read.
        let big = FileEntry {
            size: 1 << 40,
            ..e.clone()
        };
        assert!(matches!(read(&p, &big, 10), Err(PageSumsError::Size(..))));
        // A link in its place is not followed.
        let l = d.path().join("link");
        std::os::unix::fs::symlink(&p, &l).unwrap();
        assert!(matches!(read(&l, &e, 10), Err(PageSumsError::Read(..))));
    }
}
