//! The file set of the guest `io` workload's file-set mode (`rebound.io_files`,
//! `guest/agent/wl_files.c`), written on the host: a test or a benchmark puts it on a
//! data disk with [`crate::mkfs_from_dir`] instead of waiting for a TCG guest to write
//! hundreds of MiB. The agent finds the files valid and keeps them at their version.
//!
//! Block `b` (1 KiB) of file `k` at version `v`, as little-endian 64-bit words:
//! word 0 = `0x5242 << 48 | v`, word `j` (1..128) = `splitmix64((k << 32) + b * 128 + j) ^ v`.

use std::io::Write;
use std::path::{Path, PathBuf};

use crate::datadisk::splitmix64;

/// Bytes per signed block.
pub const BLOCK: usize = 1024;
/// Word 0's top 16 bits.
pub const MAGIC: u64 = 0x5242;
/// Versions are 48-bit (the rest of word 0).
pub const MAX_VERSION: u64 = (1 << 48) - 1;
/// File names go from `f00000` to `f99999`.
pub const MAX_FILES: u64 = 100_000;

/// Errors writing a file set.
#[derive(Debug, thiserror::Error)]
pub enum FilesetError {
    #[error("cannot write {path}: {err}")]
    Io { path: PathBuf, err: std::io::Error },
    #[error(
        "a file set has 1 to {MAX_FILES} files of whole 4 KiB (4 KiB to 1 GiB) at a version \
         below 2^48, not {files} of {file_size} bytes at version {version}"
    )]
    Shape {
        files: u64,
        file_size: u64,
        version: u64,
    },
}

/// The name of file `k` in the set's directory.
pub fn file_name(k: u64) -> String {
    format!("f{k:05}")
}

/// Block `block` of file `file` at `version`, as the agent writes it.
pub fn block_signature(file: u64, block: u64, version: u64) -> [u8; BLOCK] {
    let mut out = [0u8; BLOCK];
    let base = (file << 32).wrapping_add(block * 128);
    for (j, w) in out.chunks_exact_mut(8).enumerate() {
        let v = if j == 0 {
            MAGIC << 48 | version
        } else {
            splitmix64(base + j as u64) ^ version
        };
        w.copy_from_slice(&v.to_le_bytes());
    }
    out
}

/// The version `data` holds when it is exactly block `block` of file `file` at some
/// version, as the agent checks it; `None` for anything else.
pub fn block_version(data: &[u8], file: u64, block: u64) -> Option<u64> {
    let w0 = u64::from_le_bytes(data.get(..8)?.try_into().ok()?);
    let version = w0 & MAX_VERSION;
    (data.len() == BLOCK && w0 >> 48 == MAGIC && data == block_signature(file, block, version))
        .then_some(version)
}

/// Writes `files` files `f00000`.. of `file_size` bytes into `dir` (created if needed),
/// every block at `version`.
pub fn write_fileset(
    dir: &Path,
    files: u64,
    file_size: u64,
    version: u64,
) -> Result<(), FilesetError> {
    if !(1..=MAX_FILES).contains(&files)
        || !(4096..=1 << 30).contains(&file_size)
        || !file_size.is_multiple_of(4096)
        || version > MAX_VERSION
    {
        return Err(FilesetError::Shape {
            files,
            file_size,
            version,
        });
    }
    std::fs::create_dir_all(dir).map_err(|err| FilesetError::Io {
        path: dir.to_path_buf(),
        err,
    })?;
    for k in 0..files {
        let path = dir.join(file_name(k));
        write_file(&path, k, file_size, version).map_err(|err| FilesetError::Io { path, err })?;
    }
    Ok(())
}

fn write_file(path: &Path, k: u64, size: u64, version: u64) -> std::io::Result<()> {
    let mut f = std::io::BufWriter::with_capacity(1 << 16, std::fs::File::create(path)?);
    for b in 0..size / BLOCK as u64 {
        f.write_all(&block_signature(k, b, version))?;
    }
    f.into_inner().map_err(|e| e.into_error())?.sync_all()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn blocks_are_the_agents() {
        // guest/agent/test_files.c checks the same words of the same block.
        let b = block_signature(17, 5, 3);
        let w = |j: usize| u64::from_le_bytes(b[j * 8..j * 8 + 8].try_into().unwrap());
        assert_eq!(w(0), 0x5242_0000_0000_0003);
        assert_eq!(w(1), splitmix64((17 << 32) + 5 * 128 + 1) ^ 3);
        assert_eq!(w(127), splitmix64((17 << 32) + 5 * 128 + 127) ^ 3);
        assert_eq!(block_version(&b, 17, 5), Some(3));
        // Stale, another file's, another block's, damaged, short: none is this block.
        assert_eq!(block_version(&block_signature(17, 5, 2), 17, 5), Some(2));
        assert_eq!(block_version(&block_signature(18, 5, 3), 17, 5), None);
        assert_eq!(block_version(&block_signature(17, 6, 3), 17, 5), None);
        let mut d = b;
        d[600] ^= 1;
        assert_eq!(block_version(&d, 17, 5), None);
        assert_eq!(block_version(&b[..512], 17, 5), None);
    }

    #[test]
    fn a_set_is_written_whole_and_refused_when_odd() {
        let dir = tempfile::tempdir().unwrap();
        let set = dir.path().join("files");
        write_fileset(&set, 3, 8192, 7).unwrap();
        for k in 0..3 {
            let data = std::fs::read(set.join(file_name(k))).unwrap();
            assert_eq!(data.len(), 8192);
            for (b, blk) in data.chunks(BLOCK).enumerate() {
                assert_eq!(block_version(blk, k, b as u64), Some(7));
            }
        }
        assert!(!set.join("f00003").exists());
        for (files, size, version) in [
            (0, 4096, 0),
            (MAX_FILES + 1, 4096, 0),
            (1, 6144, 0),
            (1, 4096, 1 << 48),
        ] {
            assert!(matches!(
                write_fileset(&set, files, size, version),
                Err(FilesetError::Shape { .. })
            ));
        }
    }
}
